//! `dedupe bench pipeline`: the worker against a pass-through copy with the same consumer,
//! producer and transaction settings and no ledger, on the real broker, in one run.
//!
//! For each mode it (1) measures throughput on a preloaded backlog: the input holds N messages
//! before the worker starts, and the clock runs from readiness until every output transaction is
//! committed; then (2), after a pause of [`SETTLE`], measures latency at a steady rate below both
//! throughputs for [`LATENCY_PHASE`]: input append time to output append time, both stamped by
//! the broker (the bench's topics use `message.timestamp.type=LogAppendTime`).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use dedupe::config::Config;
use rdkafka::message::Message;
use serde::Serialize;

const PARTITIONS: i32 = 4;
/// Pause between the backlog and the latency phase.
const SETTLE: Duration = Duration::from_secs(5);
/// How long the latency phase produces at its steady rate.
const LATENCY_PHASE: Duration = Duration::from_secs(20);

/// What one mode measured.
#[derive(Debug, Serialize)]
pub struct ModeResult {
    pub mode: &'static str,
    pub messages: u64,
    pub output_records: u64,
    pub seconds: f64,
    pub msgs_per_sec: f64,
    pub latency_messages: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// The bench's last line.
#[derive(Debug, Serialize)]
pub struct PipelineBench {
    pub messages: u64,
    pub dup_ratio: f64,
    pub partitions: i32,
    pub dedupe_msgs_per_sec: f64,
    pub passthrough_msgs_per_sec: f64,
    pub ratio: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub passthrough_p50_ms: f64,
    pub passthrough_p99_ms: f64,
}

pub fn run(config: &Config, messages: u64, dup_ratio: f64, value_bytes: usize, work_dir: &Path) -> anyhow::Result<PipelineBench> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let input = format!("bench-in-{id}");
    let out_pass = format!("bench-out-pass-{id}");
    let out_dedupe = format!("bench-out-dedupe-{id}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    for topic in [&input, &out_pass, &out_dedupe] {
        rt.block_on(dedupe::kafka::create_topic(
            &config.kafka,
            topic,
            PARTITIONS,
            1,
            &[("message.timestamp.type", "LogAppendTime")],
        ))
        .with_context(|| format!("creating {topic}"))?;
    }
    eprintln!("bench: producing {messages} messages of ~{value_bytes} bytes ({:.1}% re-sent) to {input}", dup_ratio * 100.0);
    let load = crate::cli::tools::loadgen(
        config,
        crate::cli::tools::Load { topic: &input, count: messages, dup_ratio, dup_delay: Duration::ZERO, value_bytes, rate_per_sec: None, show_progress: true, spread_timestamps: None },
    )?;
    eprintln!("bench: produced at {:.0} msgs/s", load.records_per_sec);

    let pass = run_mode(config, "passthrough", &input, &out_pass, messages, messages, value_bytes, work_dir)?;
    eprintln!("bench: {}", serde_json::to_string(&pass)?);
    let dedupe = run_mode(config, "dedupe", &input, &out_dedupe, messages, load.distinct_ids, value_bytes, work_dir)?;
    eprintln!("bench: {}", serde_json::to_string(&dedupe)?);

    let rt_cleanup: Result<(), rdkafka::error::KafkaError> = rt.block_on(async {
        let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
            dedupe::kafka::client_config(&config.kafka).create()?;
        admin.delete_topics(&[&input, &out_pass, &out_dedupe], &rdkafka::admin::AdminOptions::new()).await?;
        Ok(())
    });
    if let Err(e) = rt_cleanup {
        eprintln!("bench: could not delete the bench topics: {e}");
    }
    Ok(PipelineBench {
        messages,
        dup_ratio,
        partitions: PARTITIONS,
        dedupe_msgs_per_sec: dedupe.msgs_per_sec,
        passthrough_msgs_per_sec: pass.msgs_per_sec,
        ratio: dedupe.msgs_per_sec / pass.msgs_per_sec,
        p50_ms: dedupe.p50_ms,
        p99_ms: dedupe.p99_ms,
        passthrough_p50_ms: pass.p50_ms,
        passthrough_p99_ms: pass.p99_ms,
    })
}

struct Child2(Child);
impl Drop for Child2 {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[allow(clippy::too_many_arguments)]
fn run_mode(
    config: &Config,
    mode: &'static str,
    input: &str,
    output: &str,
    messages: u64,
    expected_out: u64,
    value_bytes: usize,
    work_dir: &Path,
) -> anyhow::Result<ModeResult> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let data_dir = work_dir.join(format!("ledger-{mode}-{}", uuid::Uuid::new_v4().simple()));
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["run", "--brokers", &config.kafka.brokers, "--input-topic", input, "--output-topic", output])
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("DEDUPE_WORKER_GROUP_ID", format!("bench-{mode}-{}", uuid::Uuid::new_v4().simple()))
        .env("DEDUPE_LOG_LEVEL", "warn")
        .stdout(Stdio::null());
    if mode == "passthrough" {
        cmd.arg("--passthrough");
    }
    let child = Child2(cmd.spawn().context("starting the worker")?);
    let started = Instant::now();
    while http_get(port, "/readyz").map(|(s, _)| s) != Some(200) {
        if started.elapsed() > Duration::from_secs(120) {
            bail!("the {mode} worker was not ready within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Throughput on the backlog.
    let t0 = Instant::now();
    let counter = |name: &str| -> f64 {
        http_get(port, "/metrics").map(|(_, body)| sum_metric(&body, name, &[])).unwrap_or(0.0)
    };
    let out_counter = || counter(dedupe::metrics::RECORDS_OUT);
    loop {
        if counter(dedupe::metrics::RECORDS_IN) >= messages as f64 && out_counter() >= expected_out as f64 {
            break;
        }
        if t0.elapsed() > Duration::from_secs(1800) {
            bail!("the {mode} worker did not finish the backlog within 30 minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let seconds = t0.elapsed().as_secs_f64();
    let msgs_per_sec = messages as f64 / seconds;

    // Latency at a steady rate: half the measured throughput, capped, for LATENCY_PHASE, after
    // SETTLE. Started at once after the backlog, the worker's first second of new input waited
    // 0.6-1.5 s in three runs of three (the pass-through's did not): a catch-up transient, not the
    // steady state this phase measures.
    std::thread::sleep(SETTLE);
    let rate = (msgs_per_sec * 0.5).min(20_000.0);
    let latency_messages = (rate * LATENCY_PHASE.as_secs_f64()) as u64;
    let in_start = dedupe::kafka::high_watermarks(&config.kafka, input)?;
    let out_start = dedupe::kafka::high_watermarks(&config.kafka, output)?;
    let before_out = out_counter();
    let load = crate::cli::tools::loadgen(
        config,
        crate::cli::tools::Load {
            topic: input,
            count: latency_messages,
            dup_ratio: 0.0,
            dup_delay: Duration::ZERO,
            value_bytes,
            rate_per_sec: Some(rate),
            show_progress: false,
            spread_timestamps: None,
        },
    )?;
    let t1 = Instant::now();
    while out_counter() < before_out + load.distinct_ids as f64 {
        if t1.elapsed() > Duration::from_secs(300) {
            bail!("the {mode} worker did not publish the latency phase within 300 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some((_, page)) = http_get(port, "/metrics") {
        eprintln!(
            "bench: {mode} stages per batch over the whole run: {}; lost wakeups recovered: {}",
            stage_summary(&page),
            sum_metric(&page, dedupe::metrics::INPUT_WAKEUPS_RECOVERED, &[])
        );
    }
    drop(child);

    let mut appended: HashMap<Vec<u8>, i64> = HashMap::new();
    dedupe::kafka::read_from(&config.kafka, input, true, &in_start, Duration::from_secs(300), &mut |m| {
        if let (Some(k), Some(ts)) = (m.key(), m.timestamp().to_millis()) {
            appended.entry(k.to_vec()).or_insert(ts);
        }
    })?;
    let mut latencies = Vec::new();
    // (input append time, latency) of every message, for the per-second breakdown.
    let mut timeline: Vec<(i64, f64)> = Vec::new();
    dedupe::kafka::read_from(&config.kafka, output, true, &out_start, Duration::from_secs(300), &mut |m| {
        if let (Some(k), Some(ts)) = (m.key(), m.timestamp().to_millis()) {
            if let Some(&t_in) = appended.get(k) {
                latencies.push((ts - t_in) as f64);
                timeline.push((t_in, (ts - t_in) as f64));
            }
        }
    })?;
    eprintln!("bench: {mode} latency by second of input (p50/p99/max ms): {}", by_second(&mut timeline));
    latencies.sort_by(|a, b| a.total_cmp(b));
    let pct = |q: f64| latencies.get(((latencies.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN);
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(ModeResult {
        mode,
        messages,
        output_records: expected_out,
        seconds,
        msgs_per_sec,
        latency_messages: latencies.len() as u64,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
    })
}

/// Latency quantiles per second of input append time, in order: where a p99 comes from (a burst
/// at the start, or stalls spread over the run).
fn by_second(timeline: &mut [(i64, f64)]) -> String {
    timeline.sort_by_key(|&(t, _)| t);
    let Some(&(start, _)) = timeline.first() else { return String::new() };
    let mut parts = Vec::new();
    for second in timeline.chunk_by(|a, b| (a.0 - start) / 1000 == (b.0 - start) / 1000) {
        let mut l: Vec<f64> = second.iter().map(|&(_, l)| l).collect();
        l.sort_by(|a, b| a.total_cmp(b));
        let q = |q: f64| l[((l.len() as f64 - 1.0) * q).round() as usize];
        parts.push(format!("{:.0}/{:.0}/{:.0}", q(0.5), q(0.99), l[l.len() - 1]));
    }
    parts.join(" ")
}

/// Per stage of `dedupe_stage_seconds`: batches, mean, and the bucket bound under which 99% fall.
fn stage_summary(page: &str) -> String {
    use prometheus_parse::{Scrape, Value};
    let Ok(scrape) = Scrape::parse(page.lines().map(|l| Ok(l.to_owned()))) else { return String::new() };
    let mut parts = Vec::new();
    for s in scrape.samples.iter().filter(|s| s.metric == dedupe::metrics::STAGE_SECONDS) {
        let Value::Histogram(buckets) = &s.value else { continue };
        let Some(total) = buckets.last().map(|b| b.count) else { continue };
        let sum = scrape
            .samples
            .iter()
            .find(|x| x.metric == format!("{}_sum", dedupe::metrics::STAGE_SECONDS) && x.labels.get("stage") == s.labels.get("stage"))
            .and_then(|x| match x.value {
                Value::Untyped(v) | Value::Counter(v) | Value::Gauge(v) => Some(v),
                _ => None,
            });
        let p99 = buckets.iter().find(|b| b.count >= total * 0.99).map(|b| b.less_than).unwrap_or(f64::NAN);
        let mean = sum.map(|s| s / total.max(1.0) * 1000.0).unwrap_or(f64::NAN);
        parts.push(format!("{}: {total:.0} batches, mean {mean:.1} ms, p99 <= {:.0} ms", s.labels.get("stage").unwrap_or("?"), p99 * 1000.0));
    }
    parts.join("; ")
}

/// The sum of a counter's or gauge's series named `name` whose labels include `labels`, on a
/// metrics page; 0 when none matches or the page does not parse.
pub(crate) fn sum_metric(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    use prometheus_parse::{Scrape, Value};
    let Ok(scrape) = Scrape::parse(page.lines().map(|l| Ok(l.to_owned()))) else { return 0.0 };
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .filter_map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
            _ => None,
        })
        .sum()
}

/// GET http://127.0.0.1:port/path: (status, body), or None when nothing answers.
pub(crate) fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let url = format!("http://127.0.0.1:{port}{path}");
    let response = match ureq::get(&url).timeout(Duration::from_secs(5)).call() {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(ureq::Error::Transport(_)) => return None,
    };
    let status = response.status();
    Some((status, response.into_string().ok()?))
}

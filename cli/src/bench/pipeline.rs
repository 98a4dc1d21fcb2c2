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

use super::topics::BenchTopics;

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

pub fn run(
    config: &Config,
    messages: u64,
    dup_ratio: f64,
    value_bytes: usize,
    work_dir: &Path,
) -> anyhow::Result<PipelineBench> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let input = format!("bench-in-{id}");
    let out_pass = format!("bench-out-pass-{id}");
    let out_dedupe = format!("bench-out-dedupe-{id}");
    let topics = BenchTopics::create(
        config,
        &[&input, &out_pass, &out_dedupe],
        PARTITIONS,
        &[("message.timestamp.type", "LogAppendTime")],
    )?;
    eprintln!(
        "bench: producing {messages} messages of ~{value_bytes} bytes ({:.1}% re-sent) to {input}",
        dup_ratio * 100.0
    );
    let load = crate::loadgen::loadgen(
        config,
        crate::loadgen::Load {
            topic: &input,
            count: messages,
            dup_ratio,
            reused_ratio: 0.0,
            dup_delay: Duration::ZERO,
            value_bytes,
            rate_per_sec: None,
            show_progress: true,
            spread_timestamps: None,
            sample_every: 0,
        },
    )?;
    eprintln!("bench: produced at {:.0} msgs/s", load.records_per_sec);

    let mode = |name, output, expected_out| Mode {
        config,
        name,
        input: &input,
        output,
        messages,
        expected_out,
        value_bytes,
        work_dir,
    };
    let pass = run_mode(&mode("passthrough", &out_pass, messages))?;
    eprintln!("bench: {}", serde_json::to_string(&pass)?);
    let dedupe = run_mode(&mode("dedupe", &out_dedupe, load.distinct_ids))?;
    eprintln!("bench: {}", serde_json::to_string(&dedupe)?);

    topics.delete(&[]);
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

/// One mode of the bench: which worker runs, on which topics, and what it should publish.
struct Mode<'a> {
    config: &'a Config,
    name: &'static str,
    input: &'a str,
    output: &'a str,
    messages: u64,
    expected_out: u64,
    value_bytes: usize,
    work_dir: &'a Path,
}

/// A worker the bench started; killed when dropped.
struct BenchWorker {
    child: Child,
    port: u16,
    data_dir: std::path::PathBuf,
}

impl Drop for BenchWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

impl BenchWorker {
    /// Starts `dedupe run` for the mode and waits until it is ready.
    fn start(mode: &Mode<'_>) -> anyhow::Result<Self> {
        let name = mode.name;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let data_dir = mode
            .work_dir
            .join(format!("ledger-{name}-{}", uuid::Uuid::new_v4().simple()));
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args([
            "run",
            "--brokers",
            &mode.config.kafka.brokers,
            "--input-topic",
            mode.input,
            "--output-topic",
            mode.output,
        ])
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env(
            "DEDUPE_WORKER_GROUP_ID",
            format!("bench-{name}-{}", uuid::Uuid::new_v4().simple()),
        )
        .env("DEDUPE_LOG_LEVEL", "warn")
        .stdout(Stdio::null());
        if name == "passthrough" {
            cmd.arg("--passthrough");
        }
        let child = cmd.spawn().context("starting the worker")?;
        let worker = BenchWorker {
            child,
            port,
            data_dir,
        };
        let started = Instant::now();
        while http_get(port, "/readyz").map(|(s, _)| s) != Some(200) {
            if started.elapsed() > Duration::from_secs(120) {
                bail!("the {name} worker was not ready within 120 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(worker)
    }

    /// The sum of a counter's series on the worker's metrics page (0 when it does not answer).
    fn counter(&self, name: &str) -> f64 {
        http_get(self.port, "/metrics")
            .map(|(_, body)| sum_metric(&body, name, &[]))
            .unwrap_or(0.0)
    }

    /// Waits until the worker has published `records` output records in all.
    fn wait_for_output(&self, records: f64, timeout: Duration, what: &str) -> anyhow::Result<()> {
        let started = Instant::now();
        while self.counter(dedupe::metrics::RECORDS_OUT) < records {
            if started.elapsed() > timeout {
                bail!(
                    "the worker did not publish {what} within {} s",
                    timeout.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

fn run_mode(mode: &Mode<'_>) -> anyhow::Result<ModeResult> {
    let name = mode.name;
    let worker = BenchWorker::start(mode)?;
    let seconds = backlog_seconds(&worker, mode)?;
    let msgs_per_sec = mode.messages as f64 / seconds;
    let (in_start, out_start) = latency_phase(&worker, mode, msgs_per_sec)?;
    if let Some((_, page)) = http_get(worker.port, "/metrics") {
        eprintln!(
            "bench: {name} stages per batch over the whole run: {}; lost wakeups recovered: {}",
            stage_summary(&page),
            sum_metric(&page, dedupe::metrics::INPUT_WAKEUPS_RECOVERED, &[])
        );
    }
    drop(worker);
    let (mut latencies, mut timeline) = latencies(mode, &in_start, &out_start)?;
    eprintln!(
        "bench: {name} latency by second of input (p50/p99/max ms): {}",
        by_second(&mut timeline)
    );
    latencies.sort_by(|a, b| a.total_cmp(b));
    let pct = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    Ok(ModeResult {
        mode: name,
        messages: mode.messages,
        output_records: mode.expected_out,
        seconds,
        msgs_per_sec,
        latency_messages: latencies.len() as u64,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
    })
}

/// Throughput on the backlog: seconds from readiness until every input record is read and every
/// expected output record published.
fn backlog_seconds(worker: &BenchWorker, mode: &Mode<'_>) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    loop {
        if worker.counter(dedupe::metrics::RECORDS_IN) >= mode.messages as f64
            && worker.counter(dedupe::metrics::RECORDS_OUT) >= mode.expected_out as f64
        {
            return Ok(t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > Duration::from_secs(1800) {
            bail!(
                "the {} worker did not finish the backlog within 30 minutes",
                mode.name
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where each partition of a topic ended before a phase.
type Watermarks = HashMap<i32, i64>;

/// Latency at a steady rate: half the measured throughput, capped, for LATENCY_PHASE, after
/// SETTLE: started at once after the backlog, the worker's first second of new input waits on a
/// catch-up transient (the pass-through's does not), not the steady state this phase measures.
/// Returns where the input and output stood before it.
fn latency_phase(
    worker: &BenchWorker,
    mode: &Mode<'_>,
    msgs_per_sec: f64,
) -> anyhow::Result<(Watermarks, Watermarks)> {
    std::thread::sleep(SETTLE);
    let rate = (msgs_per_sec * 0.5).min(20_000.0);
    let latency_messages = (rate * LATENCY_PHASE.as_secs_f64()) as u64;
    let in_start = dedupe::kafka::high_watermarks(&mode.config.kafka, mode.input)?;
    let out_start = dedupe::kafka::high_watermarks(&mode.config.kafka, mode.output)?;
    let before_out = worker.counter(dedupe::metrics::RECORDS_OUT);
    let load = crate::loadgen::loadgen(
        mode.config,
        crate::loadgen::Load {
            topic: mode.input,
            count: latency_messages,
            dup_ratio: 0.0,
            reused_ratio: 0.0,
            dup_delay: Duration::ZERO,
            value_bytes: mode.value_bytes,
            rate_per_sec: Some(rate),
            show_progress: false,
            spread_timestamps: None,
            sample_every: 0,
        },
    )?;
    let what = format!("the {} latency phase", mode.name);
    worker.wait_for_output(
        before_out + load.distinct_ids as f64,
        Duration::from_secs(300),
        &what,
    )?;
    Ok((in_start, out_start))
}

/// (input append time in ms, latency in ms) of each message of the latency phase.
type Timeline = Vec<(i64, f64)>;

/// The latency of every message of the latency phase, input append time to output append time,
/// and (input append time, latency) of each for the per-second breakdown.
fn latencies(
    mode: &Mode<'_>,
    in_start: &Watermarks,
    out_start: &Watermarks,
) -> anyhow::Result<(Vec<f64>, Timeline)> {
    let kafka = &mode.config.kafka;
    let mut appended: HashMap<Vec<u8>, i64> = HashMap::new();
    dedupe::kafka::read_from(
        kafka,
        mode.input,
        true,
        in_start,
        Duration::from_secs(300),
        &mut |m| {
            if let (Some(k), Some(ts)) = (m.key(), m.timestamp().to_millis()) {
                appended.entry(k.to_vec()).or_insert(ts);
            }
        },
    )?;
    let mut latencies = Vec::new();
    let mut timeline: Vec<(i64, f64)> = Vec::new();
    dedupe::kafka::read_from(
        kafka,
        mode.output,
        true,
        out_start,
        Duration::from_secs(300),
        &mut |m| {
            if let (Some(k), Some(ts)) = (m.key(), m.timestamp().to_millis()) {
                if let Some(&t_in) = appended.get(k) {
                    latencies.push((ts - t_in) as f64);
                    timeline.push((t_in, (ts - t_in) as f64));
                }
            }
        },
    )?;
    Ok((latencies, timeline))
}

/// Latency quantiles per second of input append time, in order: where a p99 comes from (a burst
/// at the start, or stalls spread over the run).
fn by_second(timeline: &mut [(i64, f64)]) -> String {
    timeline.sort_by_key(|&(t, _)| t);
    let Some(&(start, _)) = timeline.first() else {
        return String::new();
    };
    let mut parts = Vec::new();
    for second in timeline.chunk_by(|a, b| (a.0 - start) / 1000 == (b.0 - start) / 1000) {
        let mut l: Vec<f64> = second.iter().map(|&(_, l)| l).collect();
        l.sort_by(|a, b| a.total_cmp(b));
        let q = |q: f64| l[((l.len() as f64 - 1.0) * q).round() as usize];
        parts.push(format!(
            "{:.0}/{:.0}/{:.0}",
            q(0.5),
            q(0.99),
            l[l.len() - 1]
        ));
    }
    parts.join(" ")
}

/// Per stage of `dedupe_stage_seconds`: batches, mean, and the bucket bound under which 99% fall.
fn stage_summary(page: &str) -> String {
    use prometheus_parse::{Scrape, Value};
    let Ok(scrape) = Scrape::parse(page.lines().map(|l| Ok(l.to_owned()))) else {
        return String::new();
    };
    let mut parts = Vec::new();
    for s in scrape
        .samples
        .iter()
        .filter(|s| s.metric == dedupe::metrics::STAGE_SECONDS)
    {
        let Value::Histogram(buckets) = &s.value else {
            continue;
        };
        let Some(total) = buckets.last().map(|b| b.count) else {
            continue;
        };
        let sum = scrape
            .samples
            .iter()
            .find(|x| {
                x.metric == format!("{}_sum", dedupe::metrics::STAGE_SECONDS)
                    && x.labels.get(dedupe::metrics::LABEL_STAGE)
                        == s.labels.get(dedupe::metrics::LABEL_STAGE)
            })
            .and_then(|x| match x.value {
                Value::Untyped(v) | Value::Counter(v) | Value::Gauge(v) => Some(v),
                _ => None,
            });
        let p99 = buckets
            .iter()
            .find(|b| b.count >= total * 0.99)
            .map(|b| b.less_than)
            .unwrap_or(f64::NAN);
        let mean = sum.map(|s| s / total.max(1.0) * 1000.0).unwrap_or(f64::NAN);
        parts.push(format!(
            "{}: {total:.0} batches, mean {mean:.1} ms, p99 <= {:.0} ms",
            s.labels.get(dedupe::metrics::LABEL_STAGE).unwrap_or("?"),
            p99 * 1000.0
        ));
    }
    parts.join("; ")
}

/// The sum of a counter's or gauge's series named `name` whose labels include `labels`, on a
/// metrics page; 0 when none matches or the page does not parse.
pub(crate) fn sum_metric(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    use prometheus_parse::{Scrape, Value};
    let Ok(scrape) = Scrape::parse(page.lines().map(|l| Ok(l.to_owned()))) else {
        return 0.0;
    };
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

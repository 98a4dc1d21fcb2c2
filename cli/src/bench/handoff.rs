//! `dedupe bench handoff`: how long a partition takes to move between workers with its window.
//!
//! On the real broker, with the configuration given (the defaults unless told otherwise):
//! 1. `--ids` fresh ids are produced to a one-partition input topic, stamped with times spread
//!    over the last `--span-secs` (by default the promised window, 24 hours: a partition that has
//!    been running that long, so that the window is a real span and not the seconds it took to
//!    produce the ids);
//! 2. worker A (`--assignment group`) publishes them all, and the window it reports is noted;
//! 3. worker B, on an empty data directory, joins the group and A stops (SIGTERM), so the group
//!    moves the partition to B while a trickle of new ids keeps arriving, and with it copies of
//!    old ids (2,000 of A's, first seen all through the span), as a client's late retries would;
//! 4. from B's assignment the bench times the first publish (`handover_ready_secs`) and the moment
//!    B's window for the partition is back within 5% of A's, aged by the time since
//!    (`window_restored_secs`);
//! 5. once B has read the input to its end, the output B wrote is read: every copy of an old id
//!    found there is a duplicate the move let through (`old_duplicates_published`).
//!
//! The figures come from B's own metrics, polled every 20 ms, and its take-over's breakdown from
//! `dedupe_handover_load_seconds`; the phase table (stderr and `phases`) adds the time to the
//! assignment and to the first publish, and the changelog's read rate beside the broker's own
//! for the same partition, read right after the move. The workers log at `warn` (`DEDUPE_BENCH_WORKER_LOG=info` shows
//! the take-over's phases).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use dedupe::config::Config;
use dedupe::metrics as m;
use serde::Serialize;

use super::pipeline::{http_get, sum_metric};

/// The bench's last line.
#[derive(Debug, Serialize)]
pub struct HandoffBench {
    pub ids: u64,
    /// From B's assignment to B's first publish.
    pub handover_ready_secs: f64,
    /// From B's assignment until B's window is within 5% of what A's was (aged since).
    pub window_restored_secs: f64,
    pub window_before_secs: f64,
    pub window_after_secs: f64,
    /// B's own measure: assignment to processing (fenced, every id loaded).
    pub handover_duration_secs: f64,
    /// Ids B loaded from the changelog.
    pub ids_loaded: f64,
    /// A's throughput while it built the partition.
    pub build_ids_per_sec: f64,
    /// The span the ids' first-seen times were spread over.
    pub span_secs: u64,
    /// Bytes of each input record's value.
    pub value_bytes: usize,
    /// How much of the window B loads before it resumes (`worker.handover_min_window_secs`, by
    /// default the promised window).
    pub handover_window_secs: u64,
    /// Copies of old ids (first seen across the span) sent while the partition moved...
    pub old_duplicates_sent: u64,
    /// ...and how many of them B published: each one a duplicate the move let through.
    pub old_duplicates_published: u64,
    /// Where B's take-over spent its time before it resumed, in seconds, by phase (see
    /// `dedupe_handover_load_seconds`).
    pub load_breakdown_secs: BTreeMap<String, f64>,
    /// The move from A's stop to B's first publish, phase by phase, in order (see [`Phase`]).
    pub phases: Vec<Phase>,
    /// Bytes of the id changelog B read (its whole partition: every id of the window).
    pub changelog_bytes: u64,
    /// B's read of the changelog: its bytes over its fetch and decode phases.
    pub changelog_mb_per_sec: f64,
    /// The broker's own rate for the same bytes, measured in the same run right after the move:
    /// a plain consumer reading the changelog partition from its start, `read_committed`.
    pub broker_changelog_read_mb_per_sec: f64,
    /// B's window from its assignment until it was back.
    pub window_samples: Vec<WindowSample>,
}

/// One phase of the move. `from_assignment_secs` is when it ended, counted from B's assignment
/// (negative before it); the load's phases overlap (the index is built on a thread of its own
/// while the changelog is read), so their lengths add up to more than the whole.
#[derive(Debug, Serialize)]
pub struct Phase {
    pub name: &'static str,
    pub secs: f64,
    pub what: &'static str,
}

/// A worker child, killed if the bench ends early.
struct Worker {
    child: Child,
    port: u16,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Worker {
    fn start(
        config: &Config,
        input: &str,
        output: &str,
        group: &str,
        member: &str,
        dir: &Path,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Worker> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args([
            "run",
            "--brokers",
            &config.kafka.brokers,
            "--input-topic",
            input,
            "--output-topic",
            output,
        ])
        .args(["--assignment", "group", "--member-id", member])
        .arg("--data-dir")
        .arg(dir)
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("DEDUPE_WORKER_GROUP_ID", group)
        .env(
            "DEDUPE_LOG_LEVEL",
            std::env::var("DEDUPE_BENCH_WORKER_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .envs(env.iter().copied())
        .stdout(Stdio::null());
        Ok(Worker {
            child: cmd.spawn().context("starting a worker")?,
            port,
        })
    }

    /// The sum of a metric's series whose labels contain `labels`; 0 when absent or unreachable.
    fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        http_get(self.port, "/metrics")
            .map(|(_, page)| sum_metric(&page, name, labels))
            .unwrap_or(0.0)
    }

    /// Polls until `done` holds, failing after `timeout` or if the worker exits.
    fn wait_until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Worker) -> bool,
    ) -> anyhow::Result<Instant> {
        let started = Instant::now();
        loop {
            if done(self) {
                return Ok(Instant::now());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("a worker exited ({status}) while the bench waited for {what}");
            }
            if started.elapsed() > timeout {
                bail!("{what} did not happen within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn terminate(mut self, timeout: Duration) -> anyhow::Result<Option<i32>> {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let started = Instant::now();
        while started.elapsed() < timeout {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.code());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("a worker did not stop within {timeout:?} of SIGTERM")
    }
}

pub fn run(
    config: &Config,
    ids: u64,
    span: Duration,
    value_bytes: usize,
    work_dir: &Path,
) -> anyhow::Result<HandoffBench> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (input, output, group) = (
        format!("handoff-in-{id}"),
        format!("handoff-out-{id}"),
        format!("handoff-{id}"),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for topic in [&input, &output] {
        rt.block_on(dedupe::kafka::create_topic(&config.kafka, topic, 1, 1, &[]))
            .with_context(|| format!("creating {topic}"))?;
    }
    let dir = work_dir.join(format!("handoff-{id}"));
    let result = measure(
        config,
        ids,
        span,
        value_bytes,
        &dir,
        &input,
        &output,
        &group,
    );
    let _ = std::fs::remove_dir_all(&dir);
    let changelog = dedupe::changelog::default_topic(&output);
    let audit = dedupe::audit::default_topic(&output);
    let cleanup: Result<(), rdkafka::error::KafkaError> = rt.block_on(async {
        let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
            dedupe::kafka::client_config(&config.kafka).create()?;
        admin
            .delete_topics(
                &[&input, &output, &changelog, &audit],
                &rdkafka::admin::AdminOptions::new(),
            )
            .await?;
        Ok(())
    });
    if let Err(e) = cleanup {
        eprintln!("bench: could not delete the bench topics: {e}");
    }
    result
}

#[allow(clippy::too_many_arguments)]
fn measure(
    config: &Config,
    ids: u64,
    span: Duration,
    value_bytes: usize,
    work_dir: &Path,
    input: &str,
    output: &str,
    group: &str,
) -> anyhow::Result<HandoffBench> {
    let built = build_on_a(
        config,
        ids,
        span,
        value_bytes,
        work_dir,
        input,
        output,
        group,
    )?;
    let a = built.worker;
    let mut b = Worker::start(
        config,
        input,
        output,
        group,
        "handoff-b",
        &work_dir.join("b"),
        &[],
    )?;
    b.wait_until("worker B joining", Duration::from_secs(600), |w| {
        w.metric(m::PARTITIONS_OWNED, &[]) == 0.0
            && w.metric("dedupe_ledger_budget_bytes", &[]) > 0.0
    })?;
    let trickler = trickle(config, input);
    let stopping = Instant::now();
    let a_exit = a.terminate(Duration::from_secs(120))?;
    if a_exit != Some(0) {
        bail!("worker A exited with {a_exit:?} on SIGTERM");
    }
    // What B writes starts where A's output ends; the old ids' copies go in after A stopped.
    let b_output_from = output_end(config, output)?;
    let old_copies = send_again(
        config,
        input,
        built.samples.iter().map(|(id, _)| id.clone()).collect(),
    );
    let assigned = b.wait_until(
        "the partition's assignment to worker B",
        Duration::from_secs(300),
        |w| w.metric(m::PARTITION_ASSIGNMENTS, &[]) >= 1.0,
    )?;
    let mut samples = WindowSamples {
        assigned,
        window_before: built.window_before,
        noted_at: built.noted_at,
        taken: Vec::new(),
    };
    let published = b.wait_until("worker B's first publish", Duration::from_secs(600), |w| {
        samples.take(w);
        w.metric(m::RECORDS_OUT, &[]) >= 1.0
    })?;
    let mut window_after = 0.0;
    let restored = b.wait_until(
        "worker B's window coming back",
        Duration::from_secs(600),
        |w| {
            let target;
            (window_after, target) = samples.take(w);
            window_after >= 0.95 * target
        },
    )?;
    let handover_duration_secs = b.metric(m::HANDOVER_SECONDS, &[("partition", "0")]);
    let ids_loaded = b.metric(m::HANDOVER_IDS_LOADED, &[]);
    let load_breakdown_secs = load_breakdown(&b);
    let _ = trickler.join();
    let old_duplicates_sent = old_copies
        .join()
        .map_err(|_| anyhow::anyhow!("the thread sending old ids again panicked"))??;
    let old: HashSet<String> = built.samples.into_iter().map(|(id, _)| id).collect();
    let old_duplicates_published = published_again(config, input, output, b_output_from, &old)?;
    let b_exit = b.terminate(Duration::from_secs(120))?;
    if b_exit != Some(0) {
        bail!("worker B exited with {b_exit:?} on SIGTERM");
    }
    let handover_ready_secs = published.duration_since(assigned).as_secs_f64();
    let phase = |name: &str| load_breakdown_secs.get(name).copied().unwrap_or(0.0);
    let phases = phase_table(
        assigned.duration_since(stopping).as_secs_f64(),
        &load_breakdown_secs,
        handover_ready_secs - handover_duration_secs,
    );
    let changelog = dedupe::changelog::default_topic(output);
    let (changelog_bytes, broker_read_secs) = read_whole(config, &changelog)?;
    let mb = changelog_bytes as f64 / 1e6;
    let read_secs = phase(m::PHASE_FETCH) + phase(m::PHASE_DECODE);
    let result = HandoffBench {
        ids,
        handover_ready_secs,
        window_restored_secs: restored.duration_since(assigned).as_secs_f64(),
        window_before_secs: built.window_before,
        window_after_secs: window_after,
        handover_duration_secs,
        ids_loaded,
        build_ids_per_sec: built.ids_per_sec,
        span_secs: span.as_secs(),
        value_bytes,
        handover_window_secs: config.worker.handover_window().as_secs(),
        old_duplicates_sent,
        old_duplicates_published,
        load_breakdown_secs,
        phases,
        changelog_bytes,
        changelog_mb_per_sec: mb / read_secs.max(1e-9),
        broker_changelog_read_mb_per_sec: mb / broker_read_secs.max(1e-9),
        window_samples: samples.taken,
    };
    print_phases(&result);
    Ok(result)
}

/// The move's phases in order: the assignment, the load's phases (`load`, by name), the first
/// publish.
fn phase_table(
    assignment_secs: f64,
    load: &BTreeMap<String, f64>,
    first_publish_secs: f64,
) -> Vec<Phase> {
    let phase = |name: &str| load.get(name).copied().unwrap_or(0.0);
    vec![
        Phase {
            name: "assignment",
            secs: assignment_secs,
            what: "from A's SIGTERM to B's assignment: A's last batch and leaving the group, the rebalance",
        },
        Phase {
            name: m::PHASE_FENCE,
            secs: phase(m::PHASE_FENCE),
            what: "B's init_transactions (fencing A's producer) and reading the committed offset",
        },
        Phase {
            name: m::PHASE_PREPARE,
            secs: phase(m::PHASE_PREPARE),
            what: "making room in the id index for the ids the load expects",
        },
        Phase {
            name: m::PHASE_FETCH,
            secs: phase(m::PHASE_FETCH),
            what: "waiting for changelog records from the broker",
        },
        Phase {
            name: m::PHASE_DECODE,
            secs: phase(m::PHASE_DECODE),
            what: "decoding changelog records into ids",
        },
        Phase {
            name: m::PHASE_INDEX,
            secs: phase(m::PHASE_INDEX),
            what: "fingerprints into the id index (its own thread, beside fetch and decode)",
        },
        Phase {
            name: m::PHASE_RUN_WAIT,
            secs: phase(m::PHASE_RUN_WAIT),
            what: "waiting for sorted runs of ids to be written",
        },
        Phase {
            name: m::PHASE_COMMIT,
            secs: phase(m::PHASE_COMMIT),
            what: "the last runs, the index's last chunks, the ledger's ingestion and seal",
        },
        Phase {
            name: "first_publish",
            secs: first_publish_secs.max(0.0),
            what: "from processable to the first output transaction: the input's first fetch and batch",
        },
    ]
}

/// The phase table, on stderr: a slow run names its slow phase.
fn print_phases(r: &HandoffBench) {
    eprintln!(
        "bench: {} ids moved; B first published {:.2} s after its assignment",
        r.ids, r.handover_ready_secs
    );
    for p in &r.phases {
        eprintln!("bench:   {:<14} {:>7.2} s  {}", p.name, p.secs, p.what);
    }
    eprintln!(
        "bench: changelog {:.0} MB: B read it at {:.0} MB/s (fetch + decode); a plain consumer at {:.0} MB/s",
        r.changelog_bytes as f64 / 1e6,
        r.changelog_mb_per_sec,
        r.broker_changelog_read_mb_per_sec
    );
}

/// Reads every record of `topic` (`read_committed`) with a plain consumer: its bytes (keys and
/// values) and the seconds it took.
fn read_whole(config: &Config, topic: &str) -> anyhow::Result<(u64, f64)> {
    let mut bytes = 0u64;
    let started = Instant::now();
    dedupe::kafka::read_to_end(
        &config.kafka,
        topic,
        true,
        Duration::from_secs(600),
        &mut |m| {
            bytes += (m.key_len() + m.payload_len()) as u64;
        },
    )
    .with_context(|| format!("reading {topic}"))?;
    Ok((bytes, started.elapsed().as_secs_f64()))
}

/// B's take-over of partition 0, phase by phase.
fn load_breakdown(b: &Worker) -> BTreeMap<String, f64> {
    [
        m::PHASE_FENCE,
        m::PHASE_PREPARE,
        m::PHASE_FETCH,
        m::PHASE_DECODE,
        m::PHASE_INDEX,
        m::PHASE_RUN_WAIT,
        m::PHASE_COMMIT,
    ]
    .into_iter()
    .map(|phase| {
        (
            phase.to_string(),
            b.metric(
                m::HANDOVER_LOAD_SECONDS,
                &[("partition", "0"), ("phase", phase)],
            ),
        )
    })
    .collect()
}

/// The end (high watermark) of the output's only partition.
fn output_end(config: &Config, output: &str) -> anyhow::Result<i64> {
    let reader: dedupe::kafka::Reader = dedupe::kafka::client_config(&config.kafka)
        .set(
            "group.id",
            format!("dedupe-reader-{}", uuid::Uuid::new_v4().simple()),
        )
        .create_with_context(dedupe::kafka::ReaderContext)?;
    let (_, high) =
        rdkafka::consumer::Consumer::fetch_watermarks(&reader, output, 0, Duration::from_secs(30))?;
    Ok(high)
}

/// Sends each of `ids` again, 200 a second, on a thread; returns how many were sent.
fn send_again(
    config: &Config,
    input: &str,
    ids: Vec<String>,
) -> std::thread::JoinHandle<anyhow::Result<u64>> {
    let (config, input) = (config.clone(), input.to_string());
    std::thread::spawn(move || {
        let started = Instant::now();
        let producer = bench_producer(&config)?;
        for (i, id) in ids.iter().enumerate() {
            produce_one(&producer, &input, id)?;
            let due = started + Duration::from_millis(5 * (i as u64 + 1));
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        rdkafka::producer::Producer::flush(&producer, Duration::from_secs(60))?;
        Ok(ids.len() as u64)
    })
}

fn bench_producer(config: &Config) -> anyhow::Result<rdkafka::producer::BaseProducer> {
    Ok(dedupe::kafka::client_config(&config.kafka)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()?)
}

fn produce_one(
    producer: &rdkafka::producer::BaseProducer,
    topic: &str,
    id: &str,
) -> anyhow::Result<()> {
    let value = format!(r#"{{"messageId":"{id}","type":"track"}}"#);
    producer
        .send(
            rdkafka::producer::BaseRecord::to(topic)
                .key(id)
                .payload(&value),
        )
        .map_err(|(e, _)| e)?;
    producer.poll(Duration::ZERO);
    Ok(())
}

/// How many records B wrote (the output from `from` on) carry one of the `old` ids, once B has
/// processed the whole input: a last new id is sent, and B's output is read until it holds it.
fn published_again(
    config: &Config,
    input: &str,
    output: &str,
    from: i64,
    old: &HashSet<String>,
) -> anyhow::Result<u64> {
    let last = uuid::Uuid::new_v4().to_string();
    let producer = bench_producer(config)?;
    produce_one(&producer, input, &last)?;
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(60))?;
    let started = Instant::now();
    loop {
        let (mut found, mut again) = (false, 0u64);
        let start = std::collections::HashMap::from([(0, from)]);
        dedupe::kafka::read_from(
            &config.kafka,
            output,
            true,
            &start,
            Duration::from_secs(120),
            &mut |m| {
                let key = rdkafka::Message::key(m)
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default();
                found |= key == last;
                again += u64::from(old.contains(key.as_ref()));
            },
        )?;
        if found {
            return Ok(again);
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("worker B did not publish the bench's last id within 300 s");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Worker A once it has published every id and reported its window.
struct Built {
    worker: Worker,
    ids_per_sec: f64,
    window_before: f64,
    noted_at: Instant,
    /// Ids A published, with their first-seen times, spread over the span.
    samples: Vec<(String, i64)>,
}

/// Produces `ids` ids stamped over `span` and lets worker A publish them all.
#[allow(clippy::too_many_arguments)]
fn build_on_a(
    config: &Config,
    ids: u64,
    span: Duration,
    value_bytes: usize,
    work_dir: &Path,
    input: &str,
    output: &str,
    group: &str,
) -> anyhow::Result<Built> {
    eprintln!(
        "bench: producing {ids} ids to {input}, stamped over the last {} s",
        span.as_secs()
    );
    let load = crate::loadgen::Load {
        topic: input,
        count: ids,
        dup_ratio: 0.0,
        reused_ratio: 0.0,
        dup_delay: Duration::ZERO,
        value_bytes,
        rate_per_sec: None,
        show_progress: true,
        spread_timestamps: Some(span),
        // About 2,000 ids, spread over the span, to send again while the partition moves.
        sample_every: (ids / 2000).max(1),
    };
    let load = crate::loadgen::loadgen(config, load)?;
    // A builds the partition with larger batches (fewer transactions: 4 a second at most on one
    // partition here); B, whose take-over is measured, runs the configuration as given.
    let mut a = Worker::start(
        config,
        input,
        output,
        group,
        "handoff-a",
        &work_dir.join("a"),
        &[("DEDUPE_WORKER_BATCH_MAX_RECORDS", "16384")],
    )?;
    let started = Instant::now();
    a.wait_until(
        "worker A publishing every id",
        Duration::from_secs(7200),
        |w| w.metric(m::RECORDS_OUT, &[]) >= load.distinct_ids as f64,
    )?;
    let ids_per_sec = ids as f64 / started.elapsed().as_secs_f64();
    eprintln!("bench: worker A published {ids} ids at {ids_per_sec:.0} ids/s");
    let mut window_before = 0.0;
    a.wait_until(
        "worker A reporting its window",
        Duration::from_secs(60),
        |w| {
            window_before = w.metric(m::WINDOW_SECONDS, &[("partition", "0")]);
            window_before > 0.0
        },
    )?;
    Ok(Built {
        worker: a,
        ids_per_sec,
        window_before,
        noted_at: Instant::now(),
        samples: load.samples,
    })
}

/// A trickle of new ids during the take-over, 200 a second, so B has something to publish.
fn trickle(config: &Config, input: &str) -> std::thread::JoinHandle<anyhow::Result<u64>> {
    let config = config.clone();
    let input = input.to_string();
    std::thread::spawn(move || {
        let load = crate::loadgen::Load {
            topic: &input,
            count: 6000,
            dup_ratio: 0.0,
            reused_ratio: 0.0,
            dup_delay: Duration::ZERO,
            value_bytes: 64,
            rate_per_sec: Some(200.0),
            show_progress: false,
            spread_timestamps: None,
            sample_every: 0,
        };
        crate::loadgen::loadgen(&config, load).map(|s| s.distinct_ids)
    })
}

/// B's window for the partition from its assignment until it is back, a reading at most every
/// [`WindowSamples::EVERY`]: what docs/performance.md plots.
struct WindowSamples {
    assigned: Instant,
    /// A's window when it was noted, at `noted_at`.
    window_before: f64,
    noted_at: Instant,
    taken: Vec<WindowSample>,
}

impl WindowSamples {
    const EVERY: Duration = Duration::from_millis(250);

    /// B's window now and what it must come back to (A's window, aged since it was noted); kept
    /// as a sample when one is due or the window changed, so the reading that ends the wait is
    /// the last sample.
    fn take(&mut self, worker: &Worker) -> (f64, f64) {
        let window = worker.metric(m::WINDOW_SECONDS, &[("partition", "0")]);
        let target = self.window_before + self.noted_at.elapsed().as_secs_f64();
        let at_secs = self.assigned.elapsed().as_secs_f64();
        let keep = self.taken.last().is_none_or(|last| {
            at_secs - last.at_secs >= Self::EVERY.as_secs_f64() || last.window_secs != window
        });
        if keep {
            self.taken.push(WindowSample {
                at_secs,
                window_secs: window,
                target_secs: target,
            });
        }
        (window, target)
    }
}

/// One reading of B's window.
#[derive(Debug, Serialize)]
pub struct WindowSample {
    /// Seconds since B's assignment.
    pub at_secs: f64,
    pub window_secs: f64,
    /// A's window, aged since it was noted: what B's must come back to.
    pub target_secs: f64,
}

//! `dedupe bench handoff`: how long a partition takes to move between workers with its window.
//!
//! On the real broker, with the configuration given (the defaults unless told otherwise):
//! 1. `--ids` fresh ids are produced to a one-partition input topic, stamped with times spread
//!    over the last `--span-secs` (by default the promised window, 24 hours: a partition that has
//!    been running that long, so that the window is a real span and not the seconds it took to
//!    produce the ids);
//! 2. worker A (`--assignment group`) publishes them all, and the window it reports is noted;
//! 3. worker B, on an empty data directory, joins the group and A stops (SIGTERM; SIGKILL with
//!    `--kill`), so the group moves the partition to B while a trickle of new ids keeps arriving,
//!    and with it copies of old ids (2,000 of A's, first seen all through the span), as a
//!    client's late retries would. Both are dynamic members of the group (the default), or static
//!    ones with `--static-members`;
//! 4. from A's signal the bench times B's assignment (`assignment_secs`) and first publish
//!    (`stop_to_first_publish_secs`: the user's figure, how long the partition was silent); from
//!    B's assignment, the first publish (`handover_ready_secs`) and the moment B's window for the
//!    partition is back within 5% of A's, aged by the time since (`window_restored_secs`);
//! 5. once B has read the input to its end, the output B wrote is read: every copy of an old id
//!    found there is a duplicate the move let through (`old_duplicates_published`).
//!
//! The figures come from B's own metrics, polled every 20 ms, and its take-over's breakdown from
//! `dedupe_handover_load_seconds`; the phase table (stderr and `phases`) adds the time to the
//! assignment and to the first publish, and the changelog's read rate beside the broker's own
//! for the same partition, read right after the move. The workers log at `warn` (`DEDUPE_BENCH_WORKER_LOG=info` shows
//! the take-over's phases).

mod traffic;
mod worker;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::bail;
use dedupe::config::Config;
use dedupe::metrics as m;
use serde::Serialize;

use super::topics::BenchTopics;
use traffic::{output_end, published_again, read_whole, send_again, trickle};
use worker::{WindowSamples, Worker};

/// What is moved, and how the old owner stops.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub ids: u64,
    /// The span the ids' first-seen times are spread over.
    pub span: Duration,
    pub value_bytes: usize,
    /// A is SIGKILLed instead of SIGTERMed: the group gives its partition away once the session
    /// timeout passes.
    pub kill: bool,
    /// A and B are static members (`--member-id`): a stopped A keeps its partition until the
    /// session timeout passes.
    pub static_members: bool,
}

/// The bench's last line.
#[derive(Debug, Serialize)]
pub struct HandoffBench {
    pub ids: u64,
    /// How A was stopped: `sigterm` or `sigkill`.
    pub stop: &'static str,
    /// A and B were static members of the group (`--member-id`), not dynamic ones.
    pub static_members: bool,
    /// From A's signal to B's first publish: how long the partition published nothing.
    pub stop_to_first_publish_secs: f64,
    /// From A's signal to B's assignment.
    pub assignment_secs: f64,
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

pub fn run(config: &Config, shape: Shape, work_dir: &Path) -> anyhow::Result<HandoffBench> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (input, output, group) = (
        format!("handoff-in-{id}"),
        format!("handoff-out-{id}"),
        format!("handoff-{id}"),
    );
    let topics = BenchTopics::create(config, &[&input, &output], 1, &[])?;
    let dir = work_dir.join(format!("handoff-{id}"));
    let result = measure(config, shape, &dir, (&input, &output, &group));
    let _ = std::fs::remove_dir_all(&dir);
    let changelog = dedupe::changelog::default_topic(&output);
    let audit = dedupe::audit::default_topic(&output);
    topics.delete(&[&changelog, &audit]);
    result
}

fn measure(
    config: &Config,
    shape: Shape,
    work_dir: &Path,
    (input, output, group): (&str, &str, &str),
) -> anyhow::Result<HandoffBench> {
    let built = build_on_a(config, shape, work_dir, (input, output, group))?;
    let old: HashSet<String> = built.samples.iter().map(|(id, _)| id.clone()).collect();
    let window_before = built.window_before;
    let build_ids_per_sec = built.ids_per_sec;
    let moved = hand_over(config, shape, built, work_dir, (input, output, group))?;
    let b = moved.b;
    let handover_duration_secs = b.metric(m::HANDOVER_SECONDS, &[("partition", "0")]);
    let ids_loaded = b.metric(m::HANDOVER_IDS_LOADED, &[]);
    let load_breakdown_secs = load_breakdown(&b);
    let _ = moved.trickler.join();
    let old_duplicates_sent = moved
        .old_copies
        .join()
        .map_err(|_| anyhow::anyhow!("the thread sending old ids again panicked"))??;
    let old_duplicates_published =
        published_again(config, input, output, moved.b_output_from, &old)?;
    let b_exit = b.terminate(Duration::from_secs(120))?;
    if b_exit != Some(0) {
        bail!("worker B exited with {b_exit:?} on SIGTERM");
    }
    let handover_ready_secs = moved.published.duration_since(moved.assigned).as_secs_f64();
    let assignment_secs = moved.assigned.duration_since(moved.stopping).as_secs_f64();
    let phase = |name: &str| load_breakdown_secs.get(name).copied().unwrap_or(0.0);
    let phases = phase_table(
        assignment_secs,
        &load_breakdown_secs,
        handover_ready_secs - handover_duration_secs,
    );
    let changelog = dedupe::changelog::default_topic(output);
    let (changelog_bytes, broker_read_secs) = read_whole(config, &changelog)?;
    let mb = changelog_bytes as f64 / 1e6;
    let read_secs = phase(m::PHASE_FETCH) + phase(m::PHASE_DECODE);
    let result = HandoffBench {
        ids: shape.ids,
        stop: if shape.kill { "sigkill" } else { "sigterm" },
        static_members: shape.static_members,
        stop_to_first_publish_secs: moved.published.duration_since(moved.stopping).as_secs_f64(),
        assignment_secs,
        handover_ready_secs,
        window_restored_secs: moved.restored.duration_since(moved.assigned).as_secs_f64(),
        window_before_secs: window_before,
        window_after_secs: moved.window_after,
        handover_duration_secs,
        ids_loaded,
        build_ids_per_sec,
        span_secs: shape.span.as_secs(),
        value_bytes: shape.value_bytes,
        handover_window_secs: config.worker.handover_window().as_secs(),
        old_duplicates_sent,
        old_duplicates_published,
        load_breakdown_secs,
        phases,
        changelog_bytes,
        changelog_mb_per_sec: mb / read_secs.max(1e-9),
        broker_changelog_read_mb_per_sec: mb / broker_read_secs.max(1e-9),
        window_samples: moved.window_samples,
    };
    print_phases(&result);
    Ok(result)
}

/// The partition moved from A to B, with B's window back: B still running, and what the move's
/// figures are made of.
struct Moved {
    b: Worker,
    /// When A was asked to stop.
    stopping: Instant,
    /// B's assignment, its first publish, and its window back.
    assigned: Instant,
    published: Instant,
    restored: Instant,
    window_after: f64,
    window_samples: Vec<WindowSample>,
    /// Where B's output starts: the end of A's.
    b_output_from: i64,
    /// The threads sending new ids and copies of old ones (each returns how many it sent).
    trickler: JoinHandle<anyhow::Result<u64>>,
    old_copies: JoinHandle<anyhow::Result<u64>>,
}

/// Starts worker B, stops A so the partition moves to B while new ids trickle in and old ones
/// are sent again, and waits for B's first publish and for its window to come back.
fn hand_over(
    config: &Config,
    shape: Shape,
    built: Built,
    work_dir: &Path,
    (input, output, group): (&str, &str, &str),
) -> anyhow::Result<Moved> {
    let a = built.worker;
    let mut b = Worker::start(
        config,
        input,
        output,
        group,
        shape.static_members.then_some("handoff-b"),
        &work_dir.join("b"),
        &[],
    )?;
    b.wait_until("worker B joining", Duration::from_secs(600), |w| {
        w.metric(m::PARTITIONS_OWNED, &[]) == 0.0
            && w.metric("dedupe_ledger_budget_bytes", &[]) > 0.0
    })?;
    let trickler = trickle(config, input);
    let stopping = Instant::now();
    if shape.kill {
        a.signal(libc::SIGKILL, Duration::from_secs(30))?;
    } else {
        let a_exit = a.terminate(Duration::from_secs(120))?;
        if a_exit != Some(0) {
            bail!("worker A exited with {a_exit:?} on SIGTERM");
        }
    }
    // What B writes starts where A's output ends; the old ids' copies go in after A stopped.
    let b_output_from = output_end(config, output)?;
    let old_copies = send_again(
        config,
        input,
        built.samples.into_iter().map(|(id, _)| id).collect(),
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
    Ok(Moved {
        b,
        stopping,
        assigned,
        published,
        restored,
        window_after,
        window_samples: samples.taken,
        b_output_from,
        trickler,
        old_copies,
    })
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
            what: "from A's signal to B's assignment: A's last batch and leaving the group (or its session timing out), B's next heartbeat",
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
        "bench: {} ids moved; B first published {:.2} s after A's {} ({} members): assignment {:.2} s, then {:.2} s",
        r.ids,
        r.stop_to_first_publish_secs,
        r.stop.to_uppercase(),
        if r.static_members { "static" } else { "dynamic" },
        r.assignment_secs,
        r.handover_ready_secs
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

/// Worker A once it has published every id and reported its window.
struct Built {
    worker: Worker,
    ids_per_sec: f64,
    window_before: f64,
    noted_at: Instant,
    /// Ids A published, with their first-seen times, spread over the span.
    samples: Vec<(String, i64)>,
}

/// Produces `shape.ids` ids stamped over its span and lets worker A publish them all.
fn build_on_a(
    config: &Config,
    shape: Shape,
    work_dir: &Path,
    (input, output, group): (&str, &str, &str),
) -> anyhow::Result<Built> {
    let Shape {
        ids,
        span,
        value_bytes,
        ..
    } = shape;
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
        shape.static_members.then_some("handoff-a"),
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

/// One reading of B's window.
#[derive(Debug, Serialize)]
pub struct WindowSample {
    /// Seconds since B's assignment.
    pub at_secs: f64,
    pub window_secs: f64,
    /// A's window, aged since it was noted: what B's must come back to.
    pub target_secs: f64,
}

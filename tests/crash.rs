//! Crash tests against the real broker, in the shape: produce, process, crash, restart, and
//! assert on what the output topic holds (read_committed), and that the duplicate audit holds
//! exactly the dropped copies, once each.
//!
//! - A crash matrix with failpoints (the binary is built with the `failpoints` feature): in the
//!   middle of a transaction, after the publish and before the ledger write, after the ledger
//!   write, and in the middle of recovery.
//! - Process chaos: SIGKILL at random moments, many times (DEDUPE_CHAOS_KILLS, default 20, and
//!   DEDUPE_CHAOS_MESSAGES, default 200000, raise them for soak runs).

use std::time::{Duration, Instant};

use kit::load::produce_with_repeats;
use kit::*;
use rand::Rng;

/// The binary under test, built by cargo for this test run.
const DEDUPE: Dedupe = Dedupe::at(env!("CARGO_BIN_EXE_dedupe"));

/// Starts the worker again (ready within two minutes), lets it publish `distinct` ids within
/// `publish_within`, stops it (exit 0), and checks that the output, now final, holds every input
/// id exactly once, in its partition, as its first copy, in input order.
fn restart_and_check_exactly_once(
    spec: &WorkerSpec,
    input: &str,
    output: &str,
    distinct: usize,
    publish_within: Duration,
    what: &str,
) {
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(120));
    wait_for_records(output, distinct, publish_within);
    assert_eq!(
        worker.terminate(Duration::from_secs(60)),
        Some(0),
        "{what}:\n{}",
        worker.log_text()
    );
    exactly_once::assert_exactly_once(DEDUPE, input, output, distinct, what);
    exactly_once::assert_audit_holds_the_drops(input, output, what);
}

/// A worker whose every drop is audited, however fast a restart works through a backlog.
fn audit_uncapped(spec: WorkerSpec) -> WorkerSpec {
    spec.env("DEDUPE_WORKER_AUDIT_MAX_PER_SEC", "100000000")
}

/// Crashes the worker at a failpoint, restarts it clean, and checks the output.
fn crash_at(failpoints: &str, durability: &str) {
    let input = TestTopic::create("crash-in", 2);
    let output = TestTopic::create("crash-out", 2);
    let dir = tempfile::tempdir().unwrap();
    let distinct = produce_with_repeats(&input.name, 3000, 600);
    let spec = audit_uncapped(DEDUPE.worker(&input.name, &output.name, &dir.path().join("ledger")))
        .env("DEDUPE_LEDGER_DURABILITY", durability)
        .env("DEDUPE_WORKER_BATCH_MAX_RECORDS", "200");

    // The failpoint fires and the process dies there (exit 86), mid-stream.
    let mut crashing = spec.clone().env("FAILPOINTS", failpoints).start();
    let code = crashing.wait(Duration::from_secs(90));
    assert_eq!(
        code,
        Some(86),
        "the failpoint {failpoints} did not fire:\n{}",
        crashing.log_text()
    );
    let partial = consume_all(&output.name, true).len();
    assert!(
        partial < distinct,
        "the crash happened before the end ({partial} of {distinct})"
    );

    let what = format!("after a crash at {failpoints}");
    restart_and_check_exactly_once(
        &spec,
        &input.name,
        &output.name,
        distinct,
        Duration::from_secs(90),
        &what,
    );
}

#[test]
fn crash_in_the_middle_of_a_transaction() {
    crash_at("output-before-commit=3*off->return", "no-wal");
}

#[test]
fn crash_after_publish_before_the_ledger_write() {
    // With the WAL on, the ledger keeps everything it wrote: the gap is exactly the last batch.
    crash_at("worker-after-publish=3*off->return", "wal");
}

#[test]
fn crash_after_publish_without_wal_loses_the_unflushed_tail_and_recovers_it() {
    crash_at("ledger-before-record=5*off->return", "no-wal");
}

#[test]
fn crash_after_the_ledger_write_before_the_next_batch() {
    crash_at("worker-after-record=4*off->return", "sync-wal");
}

#[test]
fn crash_in_the_middle_of_recovery() {
    let input = TestTopic::create("crash-rec-in", 2);
    let output = TestTopic::create("crash-rec-out", 2);
    let dir = tempfile::tempdir().unwrap();
    let distinct = produce_with_repeats(&input.name, 3000, 600);
    let spec = audit_uncapped(DEDUPE.worker(&input.name, &output.name, &dir.path().join("ledger")))
        .env("DEDUPE_LEDGER_DURABILITY", "no-wal")
        .env("DEDUPE_WORKER_BATCH_MAX_RECORDS", "200");
    // First crash: after several publishes, leaving an output tail the ledger lacks.
    let mut first = spec
        .clone()
        .env("FAILPOINTS", "worker-after-publish=6*off->return")
        .start();
    assert_eq!(
        first.wait(Duration::from_secs(90)),
        Some(86),
        "{}",
        first.log_text()
    );
    // Second crash: while that tail is being replayed into the ledger.
    let mut second = spec
        .clone()
        .env("FAILPOINTS", "recovery-mid-replay=return")
        .start();
    assert_eq!(
        second.wait(Duration::from_secs(90)),
        Some(86),
        "{}",
        second.log_text()
    );
    // Third start: clean.
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(90));
    wait_for_records(&output.name, distinct, Duration::from_secs(90));
    let page = worker.metrics().unwrap();
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
    assert!(
        metric_value(&page, "dedupe_recovery_replayed_records_total", &[]).unwrap_or(0.0) > 0.0,
        "recovery replayed the tail"
    );
    exactly_once::assert_exactly_once(
        DEDUPE,
        &input.name,
        &output.name,
        distinct,
        "after a crash in the middle of recovery",
    );
    exactly_once::assert_audit_holds_the_drops(
        &input.name,
        &output.name,
        "after a crash in the middle of recovery",
    );
}

#[test]
fn chaos_sigkill_at_random_moments() {
    let kills: usize = std::env::var("DEDUPE_CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let messages: u64 = std::env::var("DEDUPE_CHAOS_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let input = TestTopic::create("chaos-in", 4);
    let output = TestTopic::create("chaos-out", 4);
    let dir = tempfile::tempdir().unwrap();
    let spec = audit_uncapped(DEDUPE.worker(&input.name, &output.name, &dir.path().join("ledger")))
        .env("DEDUPE_WORKER_BATCH_MAX_RECORDS", "2000");

    // The load: real clients' retries, 5% of ids re-sent (many of them seconds after their first
    // copy), produced while the worker is killed: paced to last about as long as the kills.
    let pace = (messages as f64 / (kills as f64 * 1.4)).max(1000.0);
    let mut loadgen = DEDUPE
        .command()
        .args(["loadgen", "--brokers", &brokers(), "--topic", &input.name])
        .args([
            "--count",
            &messages.to_string(),
            "--dup-ratio",
            "0.05",
            "--dup-delay-ms",
            "3000",
            "--value-bytes",
            "200",
        ])
        .args(["--rate", &format!("{pace:.0}")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("dedupe loadgen");

    let mut rng = rand::rng();
    let started = Instant::now();
    let mut kills_while_producing = 0;
    for kill in 0..kills {
        let mut w = spec.start();
        // Some kills land during recovery, most while batches are in flight.
        std::thread::sleep(Duration::from_millis(rng.random_range(300..2500)));
        if let Ok(Some(status)) = w.child.try_wait() {
            panic!(
                "kill {kill}: the worker exited by itself with {status}:\n{}",
                w.log_text()
            );
        }
        kills_while_producing += usize::from(matches!(loadgen.try_wait(), Ok(None)));
        w.kill();
    }
    let produced = loadgen.wait_with_output().expect("loadgen's summary");
    assert!(produced.status.success(), "loadgen failed");
    assert!(
        kills_while_producing >= kills / 2,
        "only {kills_while_producing} of {kills} kills landed while input was produced"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&produced.stdout).expect("loadgen JSON");
    let distinct = summary["distinct_ids"].as_u64().unwrap() as usize;
    let what = format!("after {kills} SIGKILLs");
    restart_and_check_exactly_once(
        &spec,
        &input.name,
        &output.name,
        distinct,
        Duration::from_secs(300),
        &what,
    );
    eprintln!("chaos: {kills} kills ({kills_while_producing} while producing), {messages} messages, {distinct} distinct ids, {:?}", started.elapsed());
}

/// An orchestrator kills a worker during its first start on an empty volume, with the default
/// ledger budget (whose 3.4 GiB id index takes the longest to set up), at moments from the very
/// first to well into processing. Every time, the next start opens the ledger, becomes ready,
/// publishes every id exactly once, and stops cleanly.
#[test]
fn a_kill_at_any_moment_of_the_first_start_never_bricks_the_worker() {
    let root = tempfile::tempdir().unwrap();
    let mut opened = 0;
    for (n, delay_ms) in [0u64, 20, 100, 250, 400, 600, 800, 1100, 1500, 2000, 3000]
        .into_iter()
        .enumerate()
    {
        let input = TestTopic::create("first-start-in", 2);
        let output = TestTopic::create("first-start-out", 2);
        let distinct = produce_with_repeats(&input.name, 500, 25);
        let data_dir = root.path().join(format!("volume-{n}/ledger"));
        std::fs::create_dir_all(data_dir.parent().unwrap()).unwrap();
        let spec = DEDUPE
            .worker(&input.name, &output.name, &data_dir)
            .without("DEDUPE_LEDGER_BUDGET_BYTES")
            .without("DEDUPE_LEDGER_WRITE_BUFFER_BYTES");
        let mut first = spec.start();
        std::thread::sleep(Duration::from_millis(delay_ms));
        if let Ok(Some(status)) = first.child.try_wait() {
            panic!(
                "killed at {delay_ms} ms: the first start exited by itself with {status}:\n{}",
                first.log_text()
            );
        }
        first.kill();
        opened += usize::from(data_dir.join("CURRENT").exists());

        let what = format!("killed at {delay_ms} ms of its first start");
        restart_and_check_exactly_once(
            &spec,
            &input.name,
            &output.name,
            distinct,
            Duration::from_secs(60),
            &what,
        );
    }
    assert!(
        opened > 0,
        "no kill landed after the ledger existed; the test proves nothing"
    );
}

//! Signals at any moment of a start, against the real broker and binary with the default
//! configuration: SIGTERM ends `dedupe run`, `dedupe ingest` and `dedupe rekey` with exit 0 and a
//! line saying so whatever phase of their start it lands in (the C++ and Rust initializers, reading
//! the configuration, the brokers' metadata, opening the ledger, taking partitions over); SIGHUP
//! never ends them (the worker applies it once it runs, the others log it), and a later SIGTERM
//! exits 0. A hundred SIGHUPs under load change nothing the output holds.
//!
//! When each signal is sent ([`When`]): right after the spawn, and 0, 10, 100 and 300 ms after the
//! process has its handlers (`SigCgt` in `/proc/PID/status`: from its `.preinit_array`, its first
//! code; the initializers and `main` come after). Right after the spawn the kernel and the dynamic
//! loader may still be loading the program, which on this loaded machine takes several ms, and a
//! signal then takes its default action, which no program can prevent: the case accepts that end
//! only when the process had no handler when the signal was sent. Started by a launcher that holds
//! the signals blocked across `exec` ([`kit::hold_signals`]), the worker must take even that signal
//! with its handlers. Each case prints what it met.

use std::process::ExitStatus;
use std::time::Duration;

use kit::*;

/// The binary under test, built by cargo for this test run.
const DEDUPE: Dedupe = Dedupe::at(env!("CARGO_BIN_EXE_dedupe"));

/// When a signal is sent.
#[derive(Debug, Clone, Copy)]
enum When {
    /// Right after the spawn; `held`: by a launcher that blocks the signals across `exec`.
    Spawn { held: bool },
    /// This many ms after the process has its handlers.
    AfterHandlers(u64),
}

/// Every moment, for the worker (whose launcher can hold signals); the last two land in its
/// ledger's opening and its partitions' take-over, which its topic checks (a few hundred ms on
/// this machine) come before.
const MOMENTS: [When; 8] = [
    When::Spawn { held: false },
    When::Spawn { held: true },
    When::AfterHandlers(0),
    When::AfterHandlers(10),
    When::AfterHandlers(100),
    When::AfterHandlers(300),
    When::AfterHandlers(700),
    When::AfterHandlers(1200),
];

/// The moments for the others.
const UNHELD_MOMENTS: [When; 5] = [
    When::Spawn { held: false },
    When::AfterHandlers(0),
    When::AfterHandlers(10),
    When::AfterHandlers(100),
    When::AfterHandlers(300),
];

/// Sends `signal` to `pid` at `when`; whether the process could take it with its handlers (false
/// only when it was sent right after the spawn, unheld, before the process had any).
fn send_at(pid: u32, when: When, signal: i32) -> bool {
    match when {
        When::Spawn { held } => {
            let handled = held || catches(pid, signal);
            send_signal(pid, signal);
            handled
        }
        When::AfterHandlers(ms) => {
            wait_until(
                "the process installs its signal handlers",
                Duration::from_secs(30),
                Duration::from_millis(1),
                || {
                    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP]
                        .iter()
                        .all(|&s| catches(pid, s))
                        .then_some(())
                },
                || {
                    format!(
                        "/proc/{pid}/status: {:?}",
                        std::fs::read_to_string(format!("/proc/{pid}/status"))
                    )
                },
            );
            std::thread::sleep(Duration::from_millis(ms));
            send_signal(pid, signal);
            true
        }
    }
}

/// A worker with the default configuration (its own consumer group only, so cases do not share
/// committed offsets).
fn default_worker(input: &str, output: &str, dir: &std::path::Path) -> WorkerSpec {
    DEDUPE
        .worker(input, output, dir)
        .without("DEDUPE_WORKER_BATCH_MAX_RECORDS")
        .without("DEDUPE_WORKER_BATCH_LINGER_MS")
        .without("DEDUPE_LEDGER_BUDGET_BYTES")
        .without("DEDUPE_LEDGER_WRITE_BUFFER_BYTES")
}

/// Whether `status` is the end of a process that `signal` ended by its default action.
fn ended_by(status: ExitStatus, signal: i32) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(signal)
}

/// Checks the end of a process sent SIGTERM at `when`: exit 0 with a line saying it stopped, or,
/// when it had no handler yet (`handled` false), the signal's default action.
fn assert_clean_stop(
    what: &str,
    when: When,
    handled: bool,
    status: ExitStatus,
    log: &str,
    stopped_line: &str,
) {
    if !handled && ended_by(status, libc::SIGTERM) {
        eprintln!("{what}: SIGTERM at {when:?} arrived while the program was still being loaded");
        return;
    }
    assert_eq!(
        status.code(),
        Some(0),
        "{what}: SIGTERM at {when:?} ends in a clean stop, not {status}:\n{log}"
    );
    assert!(
        log.contains(stopped_line),
        "{what}: SIGTERM at {when:?}: no line saying it stopped ({stopped_line:?}):\n{log}"
    );
    let said = log
        .lines()
        .rfind(|l| l.contains("stop"))
        .unwrap_or_default();
    eprintln!("{what}: SIGTERM at {when:?}: exit 0; {said}");
}

/// A process sent SIGHUP at `when`, unhandled (`handled` false), that has ended: it must have
/// ended by the signal's default action.
fn assert_loader_window(what: &str, when: When, status: ExitStatus, log: &str) {
    assert!(
        ended_by(status, libc::SIGHUP),
        "{what}: SIGHUP at {when:?} ended it with {status}:\n{log}"
    );
    eprintln!("{what}: SIGHUP at {when:?} arrived while the program was still being loaded");
}

#[test]
fn sigterm_at_any_moment_of_the_workers_start_stops_it_with_exit_0() {
    let input = TestTopic::create("sig-term-in", 2);
    let output = TestTopic::create("sig-term-out", 2);
    let root = tempfile::tempdir().unwrap();
    for (i, when) in MOMENTS.into_iter().enumerate() {
        let mut spec = default_worker(&input.name, &output.name, &root.path().join(i.to_string()));
        spec.hold_signals = matches!(when, When::Spawn { held: true });
        let mut worker = spec.start();
        let handled = send_at(worker.pid(), when, libc::SIGTERM);
        let status = worker.wait_status(Duration::from_secs(90));
        assert_clean_stop(
            "dedupe run",
            when,
            handled,
            status,
            &worker.log_text(),
            "Received a stop signal",
        );
    }
}

#[test]
fn sighup_at_any_moment_of_the_workers_start_is_applied_once_it_runs() {
    let input = TestTopic::create("sig-hup-in", 2);
    let output = TestTopic::create("sig-hup-out", 2);
    let root = tempfile::tempdir().unwrap();
    produce_full(&input.name, &keyed(&ids(100).iter().collect::<Vec<_>>()));
    for (i, when) in MOMENTS.into_iter().enumerate() {
        let mut spec = default_worker(&input.name, &output.name, &root.path().join(i.to_string()));
        spec.hold_signals = matches!(when, When::Spawn { held: true });
        let mut worker = spec.start();
        if !send_at(worker.pid(), when, libc::SIGHUP) {
            if let Some(status) = wait_for_exit(&mut worker.child, Duration::from_millis(500)) {
                assert_loader_window("dedupe run", when, status, &worker.log_text());
                continue;
            }
        }
        // It runs on: ready, it processes the input, and it took the SIGHUP as a reload, once.
        worker.wait_ready(Duration::from_secs(90));
        worker.wait_settled(100, Duration::from_secs(60));
        wait_until(
            "the worker applies the SIGHUP it got while starting",
            Duration::from_secs(30),
            Duration::from_millis(50),
            || {
                let applied =
                    worker.metric("dedupe_config_reloads_total", &[("outcome", "applied")]);
                (applied >= 1.0).then_some(applied)
            },
            || worker.log_text(),
        );
        assert_eq!(
            worker.metric("dedupe_config_reloads_total", &[("outcome", "applied")]),
            1.0,
            "one SIGHUP, one reload:\n{}",
            worker.log_text()
        );
        let status = worker.terminate(Duration::from_secs(60));
        assert_eq!(
            status,
            Some(0),
            "SIGHUP at {when:?}, then SIGTERM:\n{}",
            worker.log_text()
        );
        eprintln!("dedupe run: SIGHUP at {when:?}: reloaded once it ran; SIGTERM then exit 0");
    }
}

#[test]
fn a_hundred_sighups_under_load_change_nothing_the_output_holds() {
    let input = TestTopic::create("sig-load-in", 2);
    let output = TestTopic::create("sig-load-out", 2);
    let root = tempfile::tempdir().unwrap();
    let mut worker = default_worker(&input.name, &output.name, &root.path().join("ledger")).start();
    worker.wait_ready(Duration::from_secs(90));
    let load = Load::start(
        &input.name,
        LoadSpec {
            rate_per_sec: 1000,
            resend_share: 0.1,
            old_share: 0.0,
            old_after: Duration::ZERO,
        },
    );
    // One every 20 ms while records flow: inside batches, between them, during commits.
    for _ in 0..100 {
        send_signal(worker.pid(), libc::SIGHUP);
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            worker.exited().is_none(),
            "a SIGHUP ended the worker:\n{}",
            worker.log_text()
        );
    }
    let sent = load.finish();
    worker.wait_settled(sent.sent as usize, Duration::from_secs(120));
    let applied = worker.metric("dedupe_config_reloads_total", &[("outcome", "applied")]);
    assert!(
        (1.0..=100.0).contains(&applied),
        "SIGHUPs that arrive together are one reload, and each is taken: {applied}"
    );
    assert_eq!(
        worker.terminate(Duration::from_secs(60)),
        Some(0),
        "{}",
        worker.log_text()
    );
    exactly_once::assert_exactly_once(
        DEDUPE,
        &input.name,
        &output.name,
        sent.distinct as usize,
        "a hundred SIGHUPs under load",
    );
}

#[test]
fn sigterm_and_sighup_at_any_moment_of_the_front_doors_start() {
    let topic = TestTopic::create("sig-ingest", 2);
    let spec = DEDUPE
        .ingest(&topic.name)
        .brokers(&brokers())
        .write_key("sig-key", "web");
    for when in UNHELD_MOMENTS {
        let mut ingest = spec.spawn();
        let handled = send_at(ingest.child.id(), when, libc::SIGTERM);
        let status = ingest.wait_status(Duration::from_secs(60));
        assert_clean_stop(
            "dedupe ingest",
            when,
            handled,
            status,
            &ingest.log_text(),
            "The tracking API stopped",
        );
    }
    for (i, when) in UNHELD_MOMENTS.into_iter().enumerate() {
        let mut ingest = spec.spawn();
        if !send_at(ingest.child.id(), when, libc::SIGHUP) {
            if let Some(status) = wait_for_exit(&mut ingest.child, Duration::from_millis(500)) {
                assert_loader_window("dedupe ingest", when, status, &ingest.log_text());
                continue;
            }
        }
        wait_until(
            "the front door serves after a SIGHUP in its start",
            Duration::from_secs(60),
            Duration::from_millis(50),
            || ingest.healthy().then_some(()),
            || ingest.log_text(),
        );
        let accepted = ingest.post_json(
            "/v1/track",
            Some("sig-key"),
            &serde_json::json!({"messageId": format!("m-{i}"), "event": "e", "userId": "u"}),
        );
        assert_eq!(accepted.status, 200, "{}", ingest.log_text());
        send_signal(ingest.child.id(), libc::SIGTERM);
        let status = ingest.wait_status(Duration::from_secs(60));
        assert_eq!(
            status.code(),
            Some(0),
            "SIGHUP at {when:?}, then SIGTERM:\n{}",
            ingest.log_text()
        );
        eprintln!("dedupe ingest: SIGHUP at {when:?}: served; SIGTERM then exit 0");
    }
}

#[test]
fn sigterm_and_sighup_at_any_moment_of_the_rekey_stages_start() {
    let source = TestTopic::create("sig-rekey-src", 2);
    let input = TestTopic::create("sig-rekey-in", 2);
    let output = TestTopic::create("sig-rekey-out", 2);
    let dir = tempfile::tempdir().unwrap();
    let spec = DEDUPE.rekey(&source.name, &input.name, &output.name, dir.path());
    for when in UNHELD_MOMENTS {
        let mut rekey = spec.start();
        let handled = send_at(rekey.child.id(), when, libc::SIGTERM);
        let status = rekey.wait_status(Duration::from_secs(90));
        assert_clean_stop(
            "dedupe rekey",
            when,
            handled,
            status,
            &rekey.log_text(),
            "Received a stop signal",
        );
    }
    produce_full(&source.name, &keyed(&ids(50).iter().collect::<Vec<_>>()));
    for when in UNHELD_MOMENTS {
        let mut rekey = spec.start();
        if !send_at(rekey.child.id(), when, libc::SIGHUP) {
            if let Some(status) = wait_for_exit(&mut rekey.child, Duration::from_millis(500)) {
                assert_loader_window("dedupe rekey", when, status, &rekey.log_text());
                continue;
            }
        }
        // It runs on: the first start to run copies the 50 records, the later ones find them
        // committed.
        wait_until(
            "the stage runs after a SIGHUP in its start",
            Duration::from_secs(60),
            Duration::from_millis(50),
            || {
                rekey
                    .log_text()
                    .contains("Re-keying the source topic")
                    .then_some(())
            },
            || rekey.log_text(),
        );
        wait_for_records(&input.name, 50, Duration::from_secs(60));
        assert!(
            rekey.child.try_wait().unwrap().is_none(),
            "{}",
            rekey.log_text()
        );
        send_signal(rekey.child.id(), libc::SIGTERM);
        let status = rekey.wait_status(Duration::from_secs(60));
        assert_eq!(
            status.code(),
            Some(0),
            "SIGHUP at {when:?}, then SIGTERM:\n{}",
            rekey.log_text()
        );
        eprintln!("dedupe rekey: SIGHUP at {when:?}: ran; SIGTERM then exit 0");
    }
    assert_eq!(
        consume_all(&input.name, true).len(),
        50,
        "each record copied once"
    );
}

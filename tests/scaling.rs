//! Elastic workers against the real broker (`worker.assignment = "group"`, KIP-848): partitions
//! move between workers while load is produced, and every id still reaches the output exactly
//! once; a frozen old owner is fenced; a worker whose membership expired exits as it says; bad
//! group settings are refused naming the key.
//!
//! The local broker (deploy/local/kafka.sh) runs the group protocol with a 6 s session timeout.

use std::time::{Duration, Instant};

use kit::*;

/// The binary under test, built by cargo for this test run.
const DEDUPE: Dedupe = Dedupe::at(env!("CARGO_BIN_EXE_dedupe"));

/// A worker spec in group mode with its own member id.
fn group_worker(
    input: &str,
    output: &str,
    dir: &std::path::Path,
    group: &str,
    member: &str,
) -> WorkerSpec {
    let mut spec = DEDUPE
        .worker(input, output, dir)
        .env("DEDUPE_WORKER_GROUP_ID", group);
    spec.extra_args = vec![
        "--assignment".into(),
        "group".into(),
        "--member-id".into(),
        member.into(),
    ];
    spec
}

/// The load while workers come and go: 5% of ids re-sent, half of those right away, half long
/// after their first copy (an id produced at least `old_after` earlier), so that a copy and its
/// duplicate often land on different owners.
fn load(topic: &str, old_after: Duration) -> Load {
    Load::start(
        topic,
        LoadSpec {
            rate_per_sec: 800,
            resend_share: 0.05,
            old_share: 0.5,
            old_after,
        },
    )
}

/// Waits until the live workers together own and process every partition, none loading, and
/// each of them owns at least one.
fn wait_settled(workers: &[&Worker], partitions: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let each: Vec<f64> = workers
            .iter()
            .map(|w| w.metric("dedupe_partitions_owned", &[]))
            .collect();
        let owned: f64 = each.iter().sum();
        let ready: f64 = workers
            .iter()
            .map(|w| w.metric("dedupe_partitions_ready", &[]))
            .sum();
        if owned as usize == partitions
            && ready as usize == partitions
            && each.iter().all(|&n| n >= 1.0)
        {
            return;
        }
        let logs: Vec<String> = workers.iter().map(|w| w.log_text()).collect();
        assert!(
            Instant::now() < deadline,
            "partitions did not settle (owned {owned}, ready {ready}):\n{}",
            logs.join("\n-----\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn workers_come_and_go_under_load_and_every_id_is_published_exactly_once() {
    let input = TestTopic::create("scale-in", 6);
    let output = TestTopic::create("scale-out", 6);
    let group = format!("scale-{}", uuid::Uuid::new_v4().simple());
    let root = tempfile::tempdir().unwrap();
    let spec = |n: &str, dir: &str| {
        group_worker(&input.name, &output.name, &root.path().join(dir), &group, n)
    };

    let load = load(&input.name, Duration::from_secs(4));
    // One worker.
    let mut w1 = spec("w1", "d1").start();
    wait_settled(&[&w1], 6, Duration::from_secs(90));
    wait_for_records(&output.name, 200, Duration::from_secs(60));

    // Three: w2 and w3 join; w3 is killed while the group rebalances, and restarts on an empty
    // data directory (same member id: the group hands its partitions back, or to the others
    // once its session expires).
    let mut w2 = spec("w2", "d2").start();
    let mut w3 = spec("w3", "d3").start();
    // Killed once the group has handed it partitions: the others are giving theirs up then.
    wait_until(
        "w3 owning a partition",
        Duration::from_secs(90),
        Duration::from_millis(50),
        || (w3.metric("dedupe_partitions_owned", &[]) >= 1.0).then_some(()),
        || w3.log_text(),
    );
    w3.kill();
    let mut w3 = spec("w3", "d3-empty").start();
    wait_settled(&[&w1, &w2, &w3], 6, Duration::from_secs(120));
    let before = load.distinct();
    wait_for_records(&output.name, before, Duration::from_secs(90));

    // Two: w3 leaves cleanly.
    assert_eq!(
        w3.terminate(Duration::from_secs(60)),
        Some(0),
        "SIGTERM exits 0:\n{}",
        w3.log_text()
    );
    wait_settled(&[&w1, &w2], 6, Duration::from_secs(120));
    let before = load.distinct();
    wait_for_records(&output.name, before, Duration::from_secs(90));

    // One: w2 leaves cleanly.
    assert_eq!(
        w2.terminate(Duration::from_secs(60)),
        Some(0),
        "SIGTERM exits 0:\n{}",
        w2.log_text()
    );
    wait_settled(&[&w1], 6, Duration::from_secs(120));
    // w1 publishes what was produced while it owned every partition again.
    let before = load.distinct();
    wait_for_records(&output.name, before, Duration::from_secs(90));

    let summary = load.finish();
    let (distinct, resent) = (summary.distinct as usize, summary.resent);
    assert!(resent > 20, "the load re-sent ids ({resent})");
    wait_for_records(&output.name, distinct, Duration::from_secs(120));
    let loaded = w1.metric("dedupe_handover_ids_loaded_total", &[]);
    assert!(
        loaded > 0.0,
        "partitions that came back to w1 loaded ids from the changelog:\n{}",
        w1.log_text()
    );
    assert_eq!(
        w1.terminate(Duration::from_secs(60)),
        Some(0),
        "SIGTERM exits 0:\n{}",
        w1.log_text()
    );
    exactly_once::assert_exactly_once(
        DEDUPE,
        &input.name,
        &output.name,
        distinct,
        "workers coming and going",
    );
}

#[test]
fn a_partition_taken_away_while_it_loads_and_given_back_at_once_is_not_fenced_by_its_first_take_over(
) {
    // w1 owns both partitions, and its first two take-overs stall 15 s before they fence (as a
    // slow init_transactions would). w2 joins meanwhile and gets one of them, then is killed:
    // after w2's 6 s session the group gives the partition back to w1 while w1's first take-over
    // of it still stalls. The second take-over waits for the first, which stops without fencing:
    // w1 is never fenced, never exits, and every id is published once.
    let input = TestTopic::create("reassign-in", 2);
    let output = TestTopic::create("reassign-out", 2);
    let group = format!("reassign-{}", uuid::Uuid::new_v4().simple());
    let root = tempfile::tempdir().unwrap();
    let spec = |n: &str| group_worker(&input.name, &output.name, &root.path().join(n), &group, n);
    let load = load(&input.name, Duration::from_secs(2));
    let mut w1 = spec("w1")
        .env("FAILPOINTS", "takeover-before-fence=2*sleep(15000)->off")
        .start();
    wait_until(
        "w1 taking both partitions over",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || (w1.metric("dedupe_partitions_loading", &[]) >= 2.0).then_some(()),
        || w1.log_text(),
    );
    let mut w2 = spec("w2").start();
    wait_until(
        "w2 owning a partition",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || (w2.metric("dedupe_partitions_owned", &[]) >= 1.0).then_some(()),
        || w2.log_text(),
    );
    w2.kill();
    wait_settled(&[&w1], 2, Duration::from_secs(120));
    let summary = load.finish();
    wait_for_records(
        &output.name,
        summary.distinct as usize,
        Duration::from_secs(120),
    );
    let page = w1.metrics().unwrap();
    assert!(
        w1.metric("dedupe_partition_assignments_total", &[]) >= 3.0,
        "the partition came back to w1:\n{page}"
    );
    assert_eq!(
        metric_value(&page, "dedupe_errors_total", &[("kind", "fenced")]),
        None,
        "w1 was fenced:\n{}",
        w1.log_text()
    );
    assert_eq!(
        metric_value(&page, "dedupe_partition_retakes_total", &[]),
        None,
        "{page}"
    );
    assert_eq!(
        w1.terminate(Duration::from_secs(60)),
        Some(0),
        "SIGTERM exits 0:\n{}",
        w1.log_text()
    );
    exactly_once::assert_exactly_once(
        DEDUPE,
        &input.name,
        &output.name,
        summary.distinct as usize,
        "a partition given back while it loaded",
    );
}

#[test]
fn a_frozen_old_owner_is_fenced_and_publishes_nothing_more() {
    let input = TestTopic::create("freeze-in", 2);
    let output = TestTopic::create("freeze-out", 2);
    let group = format!("freeze-{}", uuid::Uuid::new_v4().simple());
    let root = tempfile::tempdir().unwrap();
    let spec = |n: &str| group_worker(&input.name, &output.name, &root.path().join(n), &group, n);

    let first = ids(300);
    produce_full(&input.name, &keyed(&first.iter().collect::<Vec<_>>()));
    let mut old = spec("old").start();
    wait_settled(&[&old], 2, Duration::from_secs(90));
    wait_for_records(&output.name, 300, Duration::from_secs(60));

    // Freeze the owner; a new worker joins. Once the old member's session expires the group
    // gives the partitions to the new one, which fences the old producers.
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    unsafe { libc::kill(old.child.id() as i32, libc::SIGSTOP) };
    let mut new = spec("new").start();
    wait_settled(&[&new], 2, Duration::from_secs(120));
    let second = ids(300);
    // Duplicates of the first load, sent while the old owner is frozen.
    let mut batch: Vec<&String> = second.iter().collect();
    batch.extend(first.iter().take(100));
    produce_full(&input.name, &keyed(&batch));
    wait_for_records(&output.name, 600, Duration::from_secs(60));

    // Resumed, the old owner finds itself fenced (or its partitions lost) and exits with 3.
    // SAFETY: as above.
    unsafe { libc::kill(old.child.id() as i32, libc::SIGCONT) };
    let code = old.wait(Duration::from_secs(60));
    assert_eq!(
        code,
        Some(3),
        "the old owner exits with its fenced status:\n{}",
        old.log_text()
    );

    let third = ids(100);
    produce_full(&input.name, &keyed(&third.iter().collect::<Vec<_>>()));
    wait_for_records(&output.name, 700, Duration::from_secs(60));
    assert_eq!(
        new.terminate(Duration::from_secs(60)),
        Some(0),
        "{}",
        new.log_text()
    );
    exactly_once::assert_exactly_once(DEDUPE, &input.name, &output.name, 700, "a frozen old owner");
}

#[test]
fn a_worker_whose_membership_expired_exits_3_as_it_says_and_its_restart_takes_over() {
    let input = TestTopic::create("expire-in", 1);
    let output = TestTopic::create("expire-out", 1);
    let group = format!("expire-{}", uuid::Uuid::new_v4().simple());
    let root = tempfile::tempdir().unwrap();
    let spec = group_worker(
        &input.name,
        &output.name,
        &root.path().join("w"),
        &group,
        "w",
    );
    // The first batch's commit hangs 15 s, so that a batch is in flight when the worker finds its
    // partition lost; the rebalance waits 2 s for it (worker.shutdown_timeout_ms), then goes on
    // and offers the partition back before the stopping batch has ended. (A worker that took it
    // then ran on and answered a later SIGTERM with 3.)
    let mut worker = spec
        .clone()
        .env("DEDUPE_WORKER_SHUTDOWN_TIMEOUT_MS", "2000")
        .env("FAILPOINTS", "output-commit-hangs=1*sleep(15000)->off")
        .start();
    wait_settled(&[&worker], 1, Duration::from_secs(90));
    let first = ids(200);
    produce_full(&input.name, &keyed(&first.iter().collect::<Vec<_>>()));
    wait_until(
        "the first batch is read (its commit then hangs)",
        Duration::from_secs(30),
        Duration::from_millis(20),
        || (worker.metric("dedupe_records_in_total", &[]) > 0.0).then_some(()),
        || worker.log_text(),
    );

    // Frozen past its session timeout (the local broker's is 6 s: the freeze is 8 s) with no
    // other member: the group expires it, and on waking it finds its partition lost and is
    // offered it again.
    send_signal(worker.pid(), libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(8));
    send_signal(worker.pid(), libc::SIGCONT);

    // It said it exits; it does, with 3, without taking the partition again.
    let status = worker.wait_status(Duration::from_secs(60));
    let log = worker.log_text();
    assert_eq!(status.code(), Some(3), "the expired worker exits 3:\n{log}");
    assert!(
        log.contains("its membership expired") && log.contains("exiting with status 3"),
        "it says why it exits:\n{log}"
    );
    let lost_at = log.find("its membership expired").unwrap();
    assert!(
        !log[lost_at..].contains("The group assigned partitions; taking them over."),
        "once lost, it takes no partition:\n{log}"
    );

    // Its restart (as an orchestrator would) takes the partition over, and an ordinary SIGTERM
    // is a clean stop.
    let mut restarted = spec.start();
    wait_settled(&[&restarted], 1, Duration::from_secs(90));
    let second = ids(100);
    let mut batch: Vec<&String> = second.iter().collect();
    batch.extend(first.iter().take(50));
    produce_full(&input.name, &keyed(&batch));
    wait_for_records(&output.name, 300, Duration::from_secs(60));
    assert_eq!(
        restarted.terminate(Duration::from_secs(60)),
        Some(0),
        "{}",
        restarted.log_text()
    );
    exactly_once::assert_exactly_once(
        DEDUPE,
        &input.name,
        &output.name,
        300,
        "a worker whose membership expired",
    );
}

#[test]
fn bad_group_settings_are_refused_naming_the_key() {
    let input = TestTopic::create("badgroup-in", 1);
    let output = TestTopic::create("badgroup-out", 1);
    let root = tempfile::tempdir().unwrap();
    let base = group_worker(
        &input.name,
        &output.name,
        &root.path().join("l"),
        "badgroup",
        "m1",
    );
    let run = |spec: WorkerSpec| -> (Option<i32>, String) {
        let mut w = spec.start();
        let code = w.wait(Duration::from_secs(60));
        (code, w.log_text())
    };
    let mut cases: Vec<(WorkerSpec, &str)> = Vec::new();
    let mut unknown = base.clone();
    unknown.extra_args = vec!["--member-id".into(), "m1".into()];
    cases.push((
        unknown.env("DEDUPE_WORKER_ASSIGNMENT", "elastic"),
        "worker.assignment",
    ));
    cases.push((
        base.clone()
            .env("DEDUPE_WORKER_CHANGELOG_RETENTION_SECS", "3600"),
        "worker.changelog_retention_secs",
    ));
    cases.push((
        base.clone()
            .env("DEDUPE_WORKER_CHANGELOG_TOPIC", "not a topic name!"),
        "worker.changelog_topic",
    ));
    // An existing changelog that keeps ids only a minute.
    let short = TestTopic::create("badgroup-ids", 1);
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        client_config().create().unwrap();
    let alter =
        rdkafka::admin::AlterConfig::new(rdkafka::admin::ResourceSpecifier::Topic(&short.name))
            .set("retention.ms", "60000");
    futures::executor::block_on(
        admin.alter_configs([&alter], &rdkafka::admin::AdminOptions::new()),
    )
    .unwrap();
    cases.push((
        base.clone()
            .env("DEDUPE_WORKER_CHANGELOG_TOPIC", &short.name),
        "worker.promised_window_secs",
    ));
    let mut partitions = base.clone();
    partitions.partitions = Some("0".into());
    cases.push((partitions, "worker.partitions"));
    for (spec, key) in cases {
        let (code, log) = run(spec);
        assert_ne!(code, Some(0), "refused ({key})");
        let line = log
            .lines()
            .find(|l| l.contains(key))
            .unwrap_or_else(|| panic!("no line names {key}:\n{log}"));
        assert!(line.len() < 600, "one line: {line}");
    }
}

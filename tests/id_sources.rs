//! Any topic, any key, against the real broker: a topic keyed by user id with the id in the JSON
//! value (the worker counts the ids that are on a partition they do not belong in, and copies on
//! other partitions pass: looked up in the same round as their first copies here, and never seen
//! at all once the partitions are on two workers, whose ledgers do not see each other); the same
//! topic through `dedupe rekey`, with kills; a producer that draws a new id for every retry,
//! deduplicated by a composite id and by a fingerprint; and per-source modes switched by a reload.

use std::collections::BTreeMap;
use std::time::Duration;

use dedupe::config::IdSource;
use dedupe::identity::{message_id, RecordView};
use kit::*;

/// The binary under test, built by cargo for this test run.
const DEDUPE: Dedupe = Dedupe::at(env!("CARGO_BIN_EXE_dedupe"));

/// The `messageId` of an output record's JSON value.
fn message_id_of(r: &Record) -> String {
    let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
    v["messageId"].as_str().unwrap().to_string()
}

#[test]
fn a_topic_keyed_by_user_id_counts_misrouted_ids_and_lets_copies_on_other_partitions_through() {
    let input = TestTopic::create("misrouted-in", 4);
    let output = TestTopic::create("misrouted-out", 4);
    let dir = tempfile::tempdir().unwrap();
    let ids = ids(400);
    let event = |i: usize| -> Outgoing {
        let user = format!("user-{}", i % 20);
        let value =
            serde_json::json!({"messageId": ids[i], "userId": user, "event": "click", "n": i});
        (
            Some(user.into_bytes()),
            Some(serde_json::to_vec(&value).unwrap()),
            Vec::new(),
        )
    };
    let originals: Vec<Outgoing> = (0..ids.len()).map(event).collect();
    let placed = produce_full(&input.name, &originals);
    // 5% re-sent by a job that keys the records otherwise: each copy on the next partition; and
    // 10 copies on their first copy's partition, which the worker sees as duplicates.
    let mut records: Vec<(i32, String)> = placed
        .iter()
        .zip(&ids)
        .map(|((p, _), id)| (*p, id.clone()))
        .collect();
    for i in (0..ids.len()).step_by(20) {
        let elsewhere = (placed[i].0 + 1) % 4;
        produce_full_to(&input.name, Some(elsewhere), &[event(i)]);
        records.push((elsewhere, ids[i].clone()));
    }
    for i in (10..ids.len()).step_by(40) {
        produce_full_to(&input.name, Some(placed[i].0), &[event(i)]);
        records.push((placed[i].0, ids[i].clone()));
    }
    // What the worker must count: each record whose id neither partitioner would put there.
    let misrouted_expected = records
        .iter()
        .filter(|(p, id)| !dedupe::kafka::is_home(id.as_bytes(), *p, 4))
        .count();
    assert!(misrouted_expected > 100, "{misrouted_expected}");

    let mut worker = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_WORKER_ID_SOURCE", "json:/messageId")
        .start();
    worker.wait_ready(Duration::from_secs(60));
    // 400 first copies, and the 20 copies on other partitions: each a first copy there.
    wait_for_records(&output.name, 420, Duration::from_secs(60));
    worker.wait_settled(records.len(), Duration::from_secs(30));
    let out = consume_all(&output.name, true);
    assert_eq!(
        out.len(),
        420,
        "the 10 copies on their own partition are dropped"
    );
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for r in &out {
        *copies.entry(message_id_of(r)).or_default() += 1;
    }
    assert_eq!(copies.len(), 400, "every event is published");
    assert_eq!(
        copies.values().filter(|&&n| n == 2).count(),
        20,
        "the copies on other partitions pass: each partition's input is one first batch, all \
         looked up before any is recorded (a worker's partitions share its one ledger)"
    );
    assert_eq!(
        worker.metric("dedupe_duplicates_dropped_total", &[]) as usize,
        10
    );
    assert_eq!(
        worker.metric("dedupe_misrouted_ids_total", &[]) as usize,
        misrouted_expected,
        "every record on a partition its id does not belong in is counted"
    );
    assert!(
        worker
            .log_text()
            .contains("Records arrive on a partition their id does not belong in"),
        "the worker warns"
    );
    // Each of the 20 ids published on two partitions is found held by the second record of it:
    // the race is counted, and warned about.
    assert_eq!(
        worker.metric("dedupe_published_twice_ids_total", &[]) as usize,
        20
    );
    assert!(
        worker
            .log_text()
            .contains("were published by another of the worker's partitions at the same time"),
        "the worker warns"
    );
    worker.terminate(Duration::from_secs(30));
}

/// 200 events from a producer that draws a fresh `messageId` (and `sentAt`) for each send, every
/// fifth sent twice, keyed by the id `source` reads (so the topic is partitioned by it): the
/// worker publishes each event once and drops each retry.
fn retries_with_new_ids_are_dropped(source: &str, id_source: IdSource) {
    let input = TestTopic::create("new-id-retries-in", 2);
    let output = TestTopic::create("new-id-retries-out", 2);
    let dir = tempfile::tempdir().unwrap();
    let send = |i: usize, attempt: usize| -> Outgoing {
        let value = serde_json::json!({
            "messageId": uuid::Uuid::new_v4().to_string(),
            "sentAt": format!("2026-12-06T10:00:{:02}.{attempt:03}Z", i % 60),
            "userId": format!("user-{}", i % 10),
            "event": format!("event-{}", i % 3),
            "timestamp": 1_765_000_000_000_i64 + i as i64,
            "properties": {"n": i, "plan": "pro"},
        });
        let value = serde_json::to_vec(&value).unwrap();
        let view = RecordView {
            key: None,
            header: |_: &str| None,
            value: Some(value.as_slice()),
        };
        let key = message_id(&view, &id_source).unwrap().into_owned();
        (Some(key), Some(value), Vec::new())
    };
    let mut sends = Vec::new();
    for i in 0..200 {
        sends.push(send(i, 0));
        if i % 5 == 0 {
            sends.push(send(i, 1));
        }
    }
    produce_full(&input.name, &sends);

    let mut worker = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_WORKER_ID_SOURCE", source)
        .start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 200, Duration::from_secs(60));
    worker.wait_settled(sends.len(), Duration::from_secs(30));
    let out = consume_all(&output.name, true);
    let mut events: BTreeMap<i64, usize> = BTreeMap::new();
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        *events.entry(v["timestamp"].as_i64().unwrap()).or_default() += 1;
    }
    assert_eq!(
        events.len(),
        200,
        "{source}: every distinct event is published"
    );
    assert!(
        events.values().all(|&n| n == 1),
        "{source}: no retry is published"
    );
    assert_eq!(
        worker.metric("dedupe_duplicates_dropped_total", &[]) as usize,
        40,
        "{source}: each retry is dropped"
    );
    assert_eq!(
        worker.metric("dedupe_misrouted_ids_total", &[]),
        0.0,
        "{source}: keyed by the id, no record is misrouted"
    );
    worker.terminate(Duration::from_secs(30));
}

#[test]
fn a_producer_that_draws_a_new_id_per_retry_is_deduplicated_by_a_composite_id() {
    let parts = r#"["json:/userId","json:/event","json:/timestamp"]"#;
    retries_with_new_ids_are_dropped(parts, serde_json::from_str(parts).unwrap());
}

#[test]
fn a_producer_that_draws_a_new_id_per_retry_is_deduplicated_by_a_fingerprint() {
    let source = "fingerprint:without:/messageId,/sentAt";
    retries_with_new_ids_are_dropped(
        source,
        serde_json::from_value(serde_json::json!(source)).unwrap(),
    );
}

#[test]
fn through_rekey_a_topic_keyed_by_user_id_is_deduplicated_exactly_once_across_kills() {
    let source = TestTopic::create("rekey-source", 4);
    let input = TestTopic::create("rekey-in", 4);
    let output = TestTopic::create("rekey-out", 4);
    let dir = tempfile::tempdir().unwrap();
    let ids = ids(12_000);
    // Keyed by user id; 5% re-sent later, keyed by another user (so on another partition).
    let event = |i: usize, user: usize| -> Outgoing {
        let value =
            serde_json::json!({"messageId": ids[i], "userId": format!("user-{}", i % 50), "n": i});
        (
            Some(format!("user-{user}").into_bytes()),
            Some(serde_json::to_vec(&value).unwrap()),
            Vec::new(),
        )
    };
    let mut sends: Vec<Outgoing> = Vec::new();
    for i in 0..ids.len() {
        sends.push(event(i, i % 50));
        if i >= 300 && (i - 300) % 20 == 0 {
            sends.push(event(i - 300, (i - 300) % 50 + 1));
        }
    }
    let source_name = source.name.clone();
    let total = sends.len();
    let producer = std::thread::spawn(move || {
        for chunk in sends.chunks(525) {
            produce_full(&source_name, chunk);
            std::thread::sleep(Duration::from_millis(400));
        }
    });

    let spec = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_WORKER_ID_SOURCE", "json:/messageId");
    let rekey_spec = DEDUPE
        .rekey(&source.name, &input.name, &output.name, dir.path())
        .env("DEDUPE_WORKER_ID_SOURCE", "json:/messageId")
        .env("DEDUPE_REKEY_BATCH_MAX_RECORDS", "500");
    let mut rekey = rekey_spec.start();
    let mut worker = spec.start();
    // Each killed twice while the load flows, alternately, each restarted at once.
    for n in 0..4 {
        std::thread::sleep(Duration::from_secs(2));
        if n % 2 == 0 {
            rekey.kill();
            rekey = rekey_spec.start();
        } else {
            worker.kill();
            worker = spec.start();
        }
    }
    producer.join().unwrap();
    worker.wait_ready(Duration::from_secs(120));

    // The rekeyed input holds each source record once: the kills added no copy and lost none.
    let copies = |topic: &str| -> BTreeMap<String, usize> {
        let mut by_id = BTreeMap::new();
        for r in consume_all(topic, true) {
            *by_id.entry(message_id_of(&r)).or_insert(0) += 1;
        }
        by_id
    };
    wait_until(
        "the rekeyed input holds every source record",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || (consume_all(&input.name, true).len() >= total).then_some(()),
        || format!("{} of {total}", consume_all(&input.name, true).len()),
    );
    assert_eq!(
        copies(&input.name),
        copies(&source.name),
        "the input is the source, once"
    );
    let rekeyed = consume_all(&input.name, true);
    assert!(
        rekeyed
            .iter()
            .all(|r| r.key.as_deref() == Some(message_id_of(r).as_bytes())),
        "every record is keyed by its messageId"
    );

    wait_for_records(&output.name, ids.len(), Duration::from_secs(120));
    worker.wait_settled(0, Duration::from_secs(30));
    kit::exactly_once::assert_exactly_once(
        DEDUPE,
        &input.name,
        &output.name,
        ids.len(),
        "through rekey, with the stage and the worker each killed twice",
    );
    assert_eq!(
        worker.metric("dedupe_misrouted_ids_total", &[]),
        0.0,
        "the rekeyed input is partitioned by the id"
    );
    assert!(
        rekey.metric(
            "dedupe_rekey_transactions_total",
            &[("outcome", "committed")]
        ) > 0.0,
        "the stage counts its transactions: {}",
        rekey.log_text()
    );
    worker.terminate(Duration::from_secs(30));
}

#[test]
fn one_source_flagged_then_unchecked_while_another_keeps_dropping_switched_without_a_restart() {
    let input = TestTopic::create("modes-in", 1);
    let output = TestTopic::create("modes-out", 1);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("dedupe.toml");
    let write_modes = |modes: &str| {
        std::fs::write(&config, format!("[worker]\nsource_modes = {modes}\n")).unwrap();
    };
    write_modes(r#"{ import = "flag" }"#);
    let ids = ids(40);
    // Each id sent twice by its source: "web" for the first 20 ids, "import" for the others.
    let sends = |range: std::ops::Range<usize>| -> Vec<Outgoing> {
        let mut out = Vec::new();
        for _ in 0..2 {
            for i in range.clone() {
                let source = if i % 40 < 20 { "web" } else { "import" };
                out.push((
                    Some(ids[i].as_bytes().to_vec()),
                    Some(format!(r#"{{"n":{i}}}"#).into_bytes()),
                    vec![("dedupe-source".to_string(), source.as_bytes().to_vec())],
                ));
            }
        }
        out
    };
    let mut worker = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_WORKER_SOURCES", "web,import")
        .extra(&["--config", config.to_str().unwrap()])
        .start();
    worker.wait_ready(Duration::from_secs(60));
    let first: Vec<Outgoing> = sends(0..10).into_iter().chain(sends(20..30)).collect();
    produce_full(&input.name, &first);
    // web: 10 published, 10 dropped; import: 10 published, 10 flagged copies published.
    wait_for_records(&output.name, 30, Duration::from_secs(60));
    let flag = |r: &Record| {
        r.headers
            .iter()
            .find(|(k, _)| k == "dedupe-duplicate")
            .map(|(_, v)| String::from_utf8(v.clone().unwrap()).unwrap())
    };
    let source = |r: &Record| {
        r.headers
            .iter()
            .find(|(k, _)| k == "dedupe-source")
            .map(|(_, v)| String::from_utf8(v.clone().unwrap()).unwrap())
            .unwrap()
    };
    let out = consume_all(&output.name, true);
    assert_eq!(out.len(), 30);
    let flagged: Vec<&Record> = out.iter().filter(|r| flag(r).is_some()).collect();
    assert_eq!(flagged.len(), 10, "each import copy is published, flagged");
    assert!(flagged
        .iter()
        .all(|r| source(r) == "import" && flag(r).as_deref() == Some("retry")));
    assert_eq!(
        worker.metric(
            "dedupe_source_records_total",
            &[("source", "import"), ("outcome", "flagged")]
        ),
        10.0
    );

    // Switched to `off` for import by a reload; web keeps dropping. Same process.
    write_modes(r#"{ import = "off", web = "drop" }"#);
    let pid = worker.pid();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    wait_until(
        "the worker reloads its configuration",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || {
            (worker.metric("dedupe_config_reloads_total", &[("outcome", "applied")]) >= 1.0)
                .then_some(())
        },
        || worker.log_text(),
    );
    let second: Vec<Outgoing> = sends(10..20).into_iter().chain(sends(30..40)).collect();
    produce_full(&input.name, &second);
    wait_for_records(&output.name, 60, Duration::from_secs(60));
    worker.wait_settled(80, Duration::from_secs(30));
    let out = consume_all(&output.name, true);
    assert_eq!(
        out.len(),
        60,
        "web: 20 published; import: 20 published, 10 flagged, 10 passed"
    );
    let late_import: Vec<&Record> = out[30..].iter().filter(|r| source(r) == "import").collect();
    assert_eq!(late_import.len(), 20, "every import copy published");
    assert!(
        late_import.iter().all(|r| flag(r).is_none()),
        "off: published as they are"
    );
    assert_eq!(out[30..].iter().filter(|r| source(r) == "web").count(), 10);
    assert_eq!(
        worker.metric(
            "dedupe_source_records_total",
            &[("source", "import"), ("outcome", "passed")]
        ),
        10.0
    );
    assert_eq!(
        worker.metric(
            "dedupe_source_records_total",
            &[("source", "web"), ("outcome", "duplicate")]
        ),
        20.0
    );
    assert_eq!(worker.pid(), pid, "no restart");

    // A configuration that does not load changes nothing, and says why.
    std::fs::write(&config, "[worker]\nsource_modes = { import = \"maybe\" }\n").unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    wait_until(
        "the worker refuses the bad configuration",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || {
            (worker.metric("dedupe_config_reloads_total", &[("outcome", "refused")]) >= 1.0)
                .then_some(())
        },
        || worker.log_text(),
    );
    assert!(worker.exited().is_none(), "the worker goes on");
    worker.terminate(Duration::from_secs(30));
}

/// `dedupe rekey` from `source` into `input` with ids read from `messageId` in the JSON value.
fn rekey_by_message_id(source: &str, input: &str, dir: &std::path::Path) -> RekeySpec {
    DEDUPE
        .rekey(source, input, &format!("{input}-out"), dir)
        .env("DEDUPE_WORKER_ID_SOURCE", "json:/messageId")
}

/// The transactions a rekey instance has committed.
fn committed(rekey: &Rekey) -> f64 {
    rekey.metric(
        "dedupe_rekey_transactions_total",
        &[("outcome", "committed")],
    )
}

/// Waits until `rekey` has committed a transaction; returns how long that took.
fn wait_committing(rekey: &Rekey, timeout: Duration) -> Duration {
    let started = std::time::Instant::now();
    wait_until(
        "the rekey instance commits a transaction",
        timeout,
        Duration::from_millis(50),
        || (committed(rekey) > 0.0).then_some(()),
        || tail(&rekey.log_text(), 30),
    );
    started.elapsed()
}

#[test]
fn rekey_instances_started_one_after_another_under_load_copy_each_record_once() {
    let source = TestTopic::create("rekey-overlap-src", 4);
    let input = TestTopic::create("rekey-overlap-in", 4);
    let dir = tempfile::tempdir().unwrap();
    // Some thousands of records a second through every handover.
    let load = SourceLoad::start(&source.name, 50_000, 2_000, Duration::from_millis(300));
    // Ten handovers, each to an instance with the same settings (so the same transactional id)
    // but its own batch size: one record a transaction up to the default 16,384.
    let sizes = [1, 16_384, 7, 500, 2, 5_000, 50, 16_384, 3, 1_000, 16_384];
    let spec = |size: usize| {
        rekey_by_message_id(&source.name, &input.name, dir.path())
            .env("DEDUPE_REKEY_BATCH_MAX_RECORDS", &size.to_string())
    };
    let mut current = spec(sizes[0]).start();
    wait_committing(&current, Duration::from_secs(60));
    let mut slowest = Duration::ZERO;
    for (n, &size) in sizes[1..].iter().enumerate() {
        // The running instance copies for a while, then the next one starts beside it.
        std::thread::sleep(Duration::from_millis(500));
        let next = spec(size).start();
        // It fences the running one before it reads the committed offsets, then copies at
        // once: no group or transaction timeout stands between them.
        slowest = slowest.max(wait_committing(&next, Duration::from_secs(30)));
        if n % 3 == 2 {
            // Stopped by its orchestrator: it exits 0, or 3 if its next transaction found it
            // fenced first.
            let code = current.terminate(Duration::from_secs(30));
            assert!(
                matches!(code, Some(0) | Some(3)),
                "handover {n}: the stopped instance exited {code:?}:\n{}",
                tail(&current.log_text(), 20)
            );
        } else {
            // Left running: its next transaction finds it fenced, and it exits 3.
            let code = current.wait(Duration::from_secs(30));
            assert_eq!(
                code,
                Some(3),
                "handover {n}: the fenced instance exits 3:\n{}",
                tail(&current.log_text(), 20)
            );
            assert!(current
                .log_text()
                .contains("exiting without committing anything more"));
        }
        current = next;
    }
    let total = load.finish();
    kit::rekey::assert_copied_once(
        &source.name,
        &input.name,
        Duration::from_secs(60),
        "ten handovers under load",
    );
    assert!(
        slowest < Duration::from_secs(10),
        "a new instance took {slowest:?} to commit its first transaction"
    );
    assert_eq!(current.terminate(Duration::from_secs(30)), Some(0));
    assert!(
        current
            .log_text()
            .contains("Received a stop signal; every record read is committed."),
        "{}",
        tail(&current.log_text(), 10)
    );
    eprintln!("{total} records through ten handovers; the slowest new instance committed after {slowest:?}");
}

#[test]
fn rekey_in_group_mode_copies_each_record_once_with_a_member_frozen_and_one_added() {
    let source = TestTopic::create("rekey-group-src", 6);
    let input = TestTopic::create("rekey-group-in", 4);
    let dir = tempfile::tempdir().unwrap();
    let load = SourceLoad::start(&source.name, 40_000, 2_000, Duration::from_millis(400));
    let member = |id: &str| {
        rekey_by_message_id(&source.name, &input.name, dir.path())
            .env("DEDUPE_WORKER_ASSIGNMENT", "group")
            .env("DEDUPE_WORKER_MEMBER_ID", id)
            .env("DEDUPE_REKEY_BATCH_MAX_RECORDS", "300")
    };
    let mut a = member("rekey-a").start();
    let mut b = member("rekey-b").start();
    wait_committing(&a, Duration::from_secs(60));
    wait_committing(&b, Duration::from_secs(60));
    // a freezes for longer than the group waits for a silent member (6 s on the test broker), possibly in the
    // middle of a transaction; c joins meanwhile; then a wakes up, a member the group dropped.
    a.signal(libc::SIGSTOP);
    let mut c = member("rekey-c").start();
    wait_committing(&c, Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(8));
    a.signal(libc::SIGCONT);
    load.finish();
    kit::rekey::assert_copied_once(
        &source.name,
        &input.name,
        Duration::from_secs(90),
        "group mode with a member frozen and one added",
    );
    for (name, member) in [("a", &mut a), ("b", &mut b), ("c", &mut c)] {
        let code = match member.exited() {
            Some(code) => code,
            None => member.terminate(Duration::from_secs(30)),
        };
        assert!(
            matches!(code, Some(0) | Some(3)),
            "member {name} exited {code:?}:\n{}",
            tail(&member.log_text(), 20)
        );
    }
}

/// 21 records on one partition of a source that takes large records: ten small, one with a
/// 2 MB value at offset 10, ten small. Returns them and the large one's size (key and value).
fn source_with_a_2mb_record(source: &str) -> (Vec<Outgoing>, usize) {
    let record = |n: usize, blob: usize| -> Outgoing {
        let value = serde_json::json!({
            "messageId": format!("big-test-{n}"),
            "blob": "x".repeat(blob),
        });
        (
            Some(format!("user-{n}").into_bytes()),
            Some(serde_json::to_vec(&value).unwrap()),
            Vec::new(),
        )
    };
    let records: Vec<Outgoing> = (0..21)
        .map(|n| record(n, if n == 10 { 2_000_000 } else { 10 }))
        .collect();
    let big = records[10].0.as_ref().unwrap().len() + records[10].1.as_ref().unwrap().len();
    produce_full_with(
        source,
        Some(0),
        &records,
        &[("message.max.bytes", "4000000")],
    );
    (records, big)
}

#[test]
fn a_record_larger_than_the_input_accepts_stops_rekey_after_its_neighbours_without_a_dead_letter_topic(
) {
    let source = TestTopic::create_with("rekey-big-src", 1, &[("max.message.bytes", "4000000")]);
    let input = TestTopic::create("rekey-big-in", 1);
    let dir = tempfile::tempdir().unwrap();
    let (records, big) = source_with_a_2mb_record(&source.name);
    let spec = rekey_by_message_id(&source.name, &input.name, dir.path());
    let line = format!("{}/0 at offset 10 is {big} bytes", source.name);
    let values = |topic: &str| -> Vec<Vec<u8>> {
        consume_all(topic, true)
            .into_iter()
            .map(|r| r.value.unwrap())
            .collect()
    };
    let before: Vec<Vec<u8>> = records[..10].iter().map(|r| r.1.clone().unwrap()).collect();
    // Twice: the second run starts at the committed offset, which points at the large record.
    for run in 0..2 {
        let mut rekey = spec.start();
        let code = rekey.wait(Duration::from_secs(60));
        let log = rekey.log_text();
        assert_eq!(code, Some(2), "run {run}:\n{}", tail(&log, 20));
        assert_eq!(
            log.lines()
                .filter(|l| l.contains("more than the input topic"))
                .count(),
            1,
            "run {run}: one line says why:\n{}",
            tail(&log, 20)
        );
        assert!(
            log.contains(&line),
            "run {run}: it names the record ({line}):\n{}",
            tail(&log, 20)
        );
        assert!(
            log.lines().filter(|l| l.contains("aborting")).count() == 0,
            "run {run}: nothing is retried:\n{}",
            tail(&log, 20)
        );
        assert_eq!(
            values(&input.name),
            before,
            "run {run}: the ten records before it are copied, once, and nothing after it"
        );
    }
}

#[test]
fn a_record_larger_than_the_input_accepts_goes_to_the_dead_letter_topic_and_its_neighbours_are_copied(
) {
    let source = TestTopic::create_with("rekey-dlq-src", 1, &[("max.message.bytes", "4000000")]);
    let input = TestTopic::create("rekey-dlq-in", 1);
    let dead_letters = TestTopic::create("rekey-dlq", 1);
    let dir = tempfile::tempdir().unwrap();
    let (records, big) = source_with_a_2mb_record(&source.name);
    let mut rekey = rekey_by_message_id(&source.name, &input.name, dir.path())
        .env("DEDUPE_WORKER_DEAD_LETTER_TOPIC", &dead_letters.name)
        .start();
    let copied = wait_for_records(&input.name, 20, Duration::from_secs(60));
    let dead = wait_for_records(&dead_letters.name, 1, Duration::from_secs(30));
    assert_eq!(rekey.terminate(Duration::from_secs(30)), Some(0));
    let log = rekey.log_text();
    // Its neighbours on both sides are copied, each once, in order.
    let expected: Vec<Vec<u8>> = records
        .iter()
        .enumerate()
        .filter(|(n, _)| *n != 10)
        .map(|(_, r)| r.1.clone().unwrap())
        .collect();
    assert_eq!(
        copied
            .into_iter()
            .map(|r| r.value.unwrap())
            .collect::<Vec<_>>(),
        expected
    );
    assert_eq!(consume_all(&input.name, true).len(), 20);
    // The dead letter: its key and where it is and how large, not its value.
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(d.key.as_deref(), Some(b"user-10".as_slice()));
    assert_eq!(d.value, None);
    let header = |name: &str| -> Option<String> {
        d.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.clone())
            .map(|v| String::from_utf8(v).unwrap())
    };
    assert_eq!(
        header(dedupe::wire::HEADER_REKEY_REASON).as_deref(),
        Some("too_large")
    );
    assert_eq!(
        header(dedupe::wire::HEADER_REKEY_SOURCE),
        Some(format!("{}:0:10", source.name))
    );
    assert_eq!(
        header(dedupe::wire::HEADER_REKEY_BYTES),
        Some(big.to_string())
    );
    assert!(
        log.contains(&format!("{}/0 at offset 10 is {big} bytes", source.name)),
        "{}",
        tail(&log, 20)
    );
    assert!(
        !log.contains("aborting"),
        "nothing is retried:\n{}",
        tail(&log, 20)
    );
}

#[test]
fn rekey_keeps_the_own_key_of_records_with_an_empty_or_over_long_id_and_counts_them_unkeyed() {
    let source = TestTopic::create("rekey-unkeyed-src", 1);
    let input = TestTopic::create("rekey-unkeyed-in", 1);
    let dir = tempfile::tempdir().unwrap();
    let record = |key: &str, id: &str| -> Outgoing {
        let value = serde_json::json!({ "messageId": id, "userId": key });
        (
            Some(key.as_bytes().to_vec()),
            Some(serde_json::to_vec(&value).unwrap()),
            Vec::new(),
        )
    };
    let long = "i".repeat(2_048);
    let at_limit = "j".repeat(dedupe::identity::MAX_ID_BYTES);
    produce_full(
        &source.name,
        &[
            record("user-empty", ""),
            record("user-long", &long),
            record("user-limit", &at_limit),
            record("user-ok", "id-ok"),
        ],
    );
    let mut rekey = rekey_by_message_id(&source.name, &input.name, dir.path()).start();
    let copied = wait_for_records(&input.name, 4, Duration::from_secs(60));
    wait_until(
        "the stage counts the records",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || {
            (rekey.metric("dedupe_rekey_records_total", &[("outcome", "unkeyed")]) == 2.0)
                .then_some(())
        },
        || rekey.log_text(),
    );
    assert_eq!(
        rekey.metric("dedupe_rekey_records_total", &[("outcome", "rekeyed")]),
        2.0
    );
    assert_eq!(rekey.terminate(Duration::from_secs(30)), Some(0));
    let keys: Vec<Vec<u8>> = copied.into_iter().map(|r| r.key.unwrap()).collect();
    assert_eq!(
        keys,
        vec![
            b"user-empty".to_vec(),
            b"user-long".to_vec(),
            at_limit.into_bytes(),
            b"id-ok".to_vec(),
        ],
        "the empty and the 2 KB id keep their own key; the 1 KiB id and the short one key theirs"
    );
}

#[test]
fn rekey_against_unreachable_brokers_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let unreachable = format!("127.0.0.1:{}", free_port());
    let mut rekey = rekey_by_message_id("rekey-nowhere-src", "rekey-nowhere-in", dir.path())
        .brokers(&unreachable)
        .start();
    let code = rekey.wait(Duration::from_secs(90));
    let log = rekey.log_text();
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.lines()
            .any(|l| l.starts_with("error:") && l.contains(&unreachable)),
        "the error names the brokers it was given ({unreachable}):\n{log}"
    );
}

/// Values of `id` that a reading through a double, or one that takes a string for a number, made
/// one id: each pair two ids.
const DISTINCT_IDS: [(&str, &str); 12] = [
    ("12345678901234567890123", "12345678901234567890124"),
    ("-99999999999999999999", "-99999999999999999998"),
    ("4004.1234567890123456", "4004.1234567890123457"),
    ("18446744073709551616", "18446744073709551617"),
    ("-9223372036854775809", "-9223372036854775810"),
    ("0.1", "0.1000000000000000055511151231257827"),
    ("1700000000.123456789", "1700000000.123456788"),
    ("1.0", "1e0"),
    ("1", "1.0"),
    ("0", "-0"),
    (r#""1001""#, "1001"),
    (r#""5""#, "5"),
];

/// A value's retry as another producer (or a later run of the same one) may write it: keys in
/// another order, white space, and every string's characters escaped.
fn rewritten(id: &str, sent_at: &str) -> String {
    let id = match id.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        Some(text) => {
            let escaped: String = text
                .chars()
                .map(|c| format!("\\u{:04x}", c as u32))
                .collect();
            format!("\"{escaped}\"")
        }
        None => id.to_string(),
    };
    format!("{{ \"sentAt\" : \"{sent_at}\",\n\t\"u\" : \"\\u0061\" , \"id\" :  {id} }}")
}

/// How many records of one run the worker finds without an id, by reason.
struct Unkeyed {
    repeated_key: f64,
    unreadable: f64,
    empty: f64,
    too_long: f64,
    missing: f64,
}

/// Under `source`, with the configuration's defaults otherwise (`content_digest =
/// "header-or-value"`, `on_reused_id = "drop"`, `unkeyed_policy = "forward"`): every distinct
/// value of [`DISTINCT_IDS`] is published, every retry of one (rewritten, see [`rewritten`]) is
/// dropped as a `retry`, never a `reused_id`; what the exact reader refuses follows the unkeyed
/// policy for the reason `unkeyed` says; a 900 KB value is deduplicated.
fn exact_ids_and_retries(source: &str, unkeyed: Unkeyed) {
    let input = TestTopic::create("exact-in", 1);
    let output = TestTopic::create("exact-out", 1);
    let dir = tempfile::tempdir().unwrap();
    // A fingerprint that leaves `sentAt` out sees a retry sent later as the same event.
    let retry_sent_at = if source.contains("without:/sentAt") {
        "s2"
    } else {
        "s1"
    };
    let mut texts: Vec<&str> = DISTINCT_IDS.iter().flat_map(|(a, b)| [*a, *b]).collect();
    texts.sort_unstable();
    texts.dedup();
    let record = |key: String, value: Vec<u8>| -> Outgoing {
        (Some(key.into_bytes()), Some(value), Vec::new())
    };
    let mut sends: Vec<Outgoing> = Vec::new();
    for (i, id) in texts.iter().enumerate() {
        let value = format!(r#"{{"id":{id},"u":"a","sentAt":"s1"}}"#);
        sends.push(record(format!("k-{i}"), value.into_bytes()));
    }
    let pad = "x".repeat(900 * 1024);
    let big = format!(r#"{{"id":"big","u":"a","sentAt":"s1","pad":"{pad}"}}"#);
    sends.push(record("k-big".into(), big.into_bytes()));
    // Each once: what the exact reader refuses, and the ids at the edges.
    let once: Vec<Vec<u8>> = vec![
        br#"{"id":"r1","u":"a","id":"r2","sentAt":"s1"}"#.to_vec(),
        br#"{"id":"r1","u":"a","sentAt":"s1","p":{"q":1,"q":1}}"#.to_vec(),
        b"{\"id\":\"\xff\",\"u\":\"a\"}".to_vec(),
        b"\xef\xbb\xbf{\"id\":\"bom\",\"u\":\"a\"}".to_vec(),
        b"id=1, u=a".to_vec(),
        br#"{"id":1e400,"u":"a"}"#.to_vec(),
        br#"{"id":"\ud800","u":"a"}"#.to_vec(),
        br#"{"id":"","u":"a"}"#.to_vec(),
        format!(r#"{{"id":"{}","u":"a"}}"#, "x".repeat(2048)).into_bytes(),
        br#"{"id":null,"u":"a","sentAt":"s1"}"#.to_vec(),
        br#"{"u":"a","sentAt":"s1"}"#.to_vec(),
    ];
    for (i, value) in once.iter().enumerate() {
        sends.push(record(format!("once-{i}"), value.clone()));
    }
    let first = sends.len();
    // The retries, each rewritten, after every first copy.
    for (i, id) in texts.iter().enumerate() {
        sends.push(record(
            format!("k-{i}"),
            rewritten(id, retry_sent_at).into_bytes(),
        ));
    }
    let big_retry = format!(
        "{{\"pad\":\"{pad}\", \"sentAt\":\"{retry_sent_at}\", \"u\":\"\\u0061\", \"id\":\"big\"}}"
    );
    sends.push(record("k-big".into(), big_retry.into_bytes()));
    let retries = sends.len() - first;
    produce_full(&input.name, &sends);

    let mut worker = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_WORKER_ID_SOURCE", source)
        .start();
    worker.wait_ready(Duration::from_secs(60));
    worker.wait_settled(sends.len(), Duration::from_secs(60));
    let out = wait_for_records(&output.name, first, Duration::from_secs(60));
    let published: Vec<&[u8]> = out.iter().map(|r| r.value.as_deref().unwrap()).collect();
    let expected: Vec<&[u8]> = sends[..first]
        .iter()
        .map(|s| s.1.as_deref().unwrap())
        .collect();
    assert_eq!(
        published.len(),
        expected.len(),
        "{source}: every distinct value published once, no retry"
    );
    assert!(
        published == expected,
        "{source}: the first copies, in order"
    );
    let dropped = |verdict: &str| {
        worker.metric("dedupe_duplicates_dropped_total", &[("verdict", verdict)]) as usize
    };
    assert_eq!(
        dropped("retry"),
        retries,
        "{source}: every retry dropped as a retry"
    );
    assert_eq!(
        dropped("reused_id"),
        0,
        "{source}: no retry taken for a reused id"
    );
    let unkeyed_by =
        |reason: &str| worker.metric("dedupe_unkeyed_records_total", &[("reason", reason)]);
    for (reason, expected) in [
        ("repeated_key", unkeyed.repeated_key),
        ("unreadable", unkeyed.unreadable),
        ("empty", unkeyed.empty),
        ("too_long", unkeyed.too_long),
        ("missing", unkeyed.missing),
    ] {
        assert_eq!(
            unkeyed_by(reason),
            expected,
            "{source}: unkeyed for {reason}"
        );
    }
    worker.terminate(Duration::from_secs(30));
}

#[test]
fn json_ids_are_read_exactly_and_a_rewritten_retry_is_a_retry() {
    exact_ids_and_retries(
        "json:/id",
        Unkeyed {
            repeated_key: 2.0,
            unreadable: 5.0,
            empty: 1.0,
            too_long: 1.0,
            missing: 2.0,
        },
    );
}

#[test]
fn composite_parts_are_read_exactly_and_a_rewritten_retry_is_a_retry() {
    // An empty part is still a part (`0:`); a 2 KB one makes the id too long.
    exact_ids_and_retries(
        r#"["json:/id","json:/u"]"#,
        Unkeyed {
            repeated_key: 2.0,
            unreadable: 5.0,
            empty: 0.0,
            too_long: 1.0,
            missing: 2.0,
        },
    );
}

#[test]
fn fingerprints_are_read_exactly_and_a_rewritten_retry_is_a_retry() {
    // A fingerprint of the whole value, of all but `sentAt` (whose retries are sent later), of
    // the id alone (a null id is a value, an absent one is not).
    for (source, missing) in [
        ("fingerprint", 0.0),
        ("fingerprint:without:/sentAt", 0.0),
        ("fingerprint:of:/id", 1.0),
    ] {
        exact_ids_and_retries(
            source,
            Unkeyed {
                repeated_key: 2.0,
                unreadable: 5.0,
                empty: 0.0,
                too_long: 0.0,
                missing,
            },
        );
    }
}

#[test]
fn with_ids_in_the_key_a_rewritten_value_is_a_retry() {
    // The digest is the value's canonical JSON text: a retry written otherwise is no reused id.
    exact_ids_and_retries(
        "key",
        Unkeyed {
            repeated_key: 0.0,
            unreadable: 0.0,
            empty: 0.0,
            too_long: 0.0,
            missing: 0.0,
        },
    );
}

#[test]
fn a_producers_own_duplicate_header_never_reaches_the_output_as_a_duplicate_claim() {
    let input = TestTopic::create("claim-in", 1);
    let output = TestTopic::create("claim-out", 1);
    let dir = tempfile::tempdir().unwrap();
    let ids = ids(3);
    // Each record carries the worker's own header, set by its producer: a first copy (source
    // "import", whose copies are flagged), its copy, and a first copy from "web" (dropped copies).
    let record = |id: &String, source: &str, claim: &str| -> Outgoing {
        (
            Some(id.as_bytes().to_vec()),
            Some(br#"{"n":1}"#.to_vec()),
            vec![
                ("dedupe-source".to_string(), source.as_bytes().to_vec()),
                ("dedupe-duplicate".to_string(), claim.as_bytes().to_vec()),
            ],
        )
    };
    produce_full(
        &input.name,
        &[
            record(&ids[0], "import", "forged-first"),
            record(&ids[0], "import", "forged-copy"),
            record(&ids[1], "web", "forged-web"),
            // A first copy without the header: published as it came.
            (
                Some(ids[2].as_bytes().to_vec()),
                Some(br#"{"n":2}"#.to_vec()),
                vec![("dedupe-source".to_string(), b"web".to_vec())],
            ),
        ],
    );
    // The front door's write keys in the worker's environment too (one configuration for both):
    // the worker does not read them. It counts apart the sources its own settings name, here
    // `worker.source_modes`' (no `worker.sources`), so "web" counts as `other`.
    let mut worker = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_WORKER_SOURCE_MODES", "import=flag")
        .env("DEDUPE_WRITE_KEYS", "claim-key=web")
        .start();
    worker.wait_ready(Duration::from_secs(60));
    let out = wait_for_records(&output.name, 4, Duration::from_secs(60));
    worker.wait_settled(4, Duration::from_secs(30));
    assert_eq!(out.len(), 4, "three first copies and the flagged copy");
    let values = |r: &Record, name: &str| -> Vec<String> {
        r.headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8(v.clone().unwrap_or_default()).unwrap())
            .collect()
    };
    // The first copies: no claim of being a duplicate; the producer's header kept, renamed.
    for (r, kept) in [(&out[0], "forged-first"), (&out[2], "forged-web")] {
        assert!(values(r, "dedupe-duplicate").is_empty(), "{r:?}");
        assert_eq!(values(r, "dedupe-input-duplicate"), [kept], "{r:?}");
    }
    assert!(values(&out[3], "dedupe-duplicate").is_empty());
    assert!(values(&out[3], "dedupe-input-duplicate").is_empty());
    // The flagged copy: exactly one claim, the worker's verdict; the producer's kept, renamed.
    assert_eq!(
        values(&out[1], "dedupe-duplicate"),
        ["retry"],
        "{:?}",
        out[1]
    );
    assert_eq!(values(&out[1], "dedupe-input-duplicate"), ["forged-copy"]);
    assert_eq!(
        worker.metric("dedupe_input_duplicate_headers_total", &[]),
        3.0,
        "each renamed header is counted"
    );
    let by_source = |source, outcome| {
        worker.metric(
            "dedupe_source_records_total",
            &[("source", source), ("outcome", outcome)],
        )
    };
    assert_eq!(by_source("import", "published"), 1.0);
    assert_eq!(by_source("import", "flagged"), 1.0);
    assert_eq!(
        by_source("web", "published"),
        0.0,
        "not from the write keys"
    );
    assert_eq!(
        by_source("other", "published"),
        2.0,
        "web's two first copies"
    );
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
}

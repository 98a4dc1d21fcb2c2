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
    let mut worker = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_WORKER_SOURCE_MODES", "import=flag")
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
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
}

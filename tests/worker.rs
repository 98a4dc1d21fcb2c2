//! The dedupe worker against the real broker: duplicates removed in order, across batches and
//! restarts; bad input under every policy; failure paths (aborted transactions, a full producer
//! queue, a partition taken over again while the others publish, a hung commit left behind, a
//! zombie worker).
//! Crash tests live in `tests/crash.rs`.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use base64::Engine;
use kit::exactly_once::{audit_records, dropped_copies};
use kit::*;

/// The binary under test, built by cargo for this test run.
const DEDUPE: Dedupe = Dedupe::at(env!("CARGO_BIN_EXE_dedupe"));

#[test]
fn golden_path_removes_duplicates_in_order_across_batches_and_restarts() {
    let (input, output) = TestTopic::pair("golden", 2);
    let spec = DEDUPE.worker_in_temp_dir(&input.name, &output.name);
    let all = ids(600);

    // Phase 1: 300 ids; every tenth is re-sent right away, so the repeat lands in the same batch.
    let mut phase1 = Vec::new();
    for (i, id) in all[..300].iter().enumerate() {
        phase1.push(id);
        if i % 10 == 0 {
            phase1.push(id);
        }
    }
    produce_full(&input.name, &keyed(&phase1));
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 300, Duration::from_secs(60));

    // Phase 2: ids 0..50 again (a later batch) and 100 new ones.
    let phase2: Vec<&String> = all[..50].iter().chain(&all[300..400]).collect();
    produce_full(&input.name, &keyed(&phase2));
    wait_for_records(&output.name, 400, Duration::from_secs(60));
    worker.stop_cleanly();

    // Phase 3: while the worker is down, ids 50..100 again and 200 new; then a restart.
    let phase3: Vec<&String> = all[50..100].iter().chain(&all[400..600]).collect();
    produce_full(&input.name, &keyed(&phase3));
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 600, Duration::from_secs(60));
    let page = worker.metrics().expect("metrics page");
    worker.stop_cleanly();
    let out = consume_all(&output.name, true);

    // Each id exactly once.
    let out_keys: Vec<Vec<u8>> = out.iter().map(|r| r.key.clone().unwrap()).collect();
    let distinct: HashSet<_> = out_keys.iter().collect();
    assert_eq!(out.len(), 600);
    assert_eq!(distinct.len(), 600, "no id twice in the output");

    // Per partition, the output is the input's first occurrences in input order, with value,
    // headers and timestamp kept.
    let inp = consume_all(&input.name, true);
    let mut expected: BTreeMap<i32, Vec<&Record>> = BTreeMap::new();
    let mut seen = HashSet::new();
    for r in &inp {
        if seen.insert(r.key.clone()) {
            expected.entry(r.partition).or_default().push(r);
        }
    }
    for (p, want) in &expected {
        let got: Vec<&Record> = out.iter().filter(|r| r.partition == *p).collect();
        assert_eq!(got.len(), want.len(), "partition {p}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g.key, w.key, "partition {p}: order differs");
            assert_eq!(g.value, w.value);
            assert_eq!(g.headers, w.headers);
            assert_eq!(g.timestamp, w.timestamp);
        }
    }

    // The restarted worker counted the re-sent ids of phase 3 as duplicates.
    let dropped = metric_value(&page, "dedupe_duplicates_dropped_total", &[]).unwrap_or(0.0);
    assert_eq!(dropped, 50.0, "phase 3 re-sent 50 ids");

    let (code, summary) = DEDUPE.verify(&input.name, &output.name);
    assert_eq!(code, 0, "{summary}");
    assert_eq!(summary["duplicate_ids_in_output"], 0);
    assert_eq!(summary["input_ids_missing_from_output"], 0);
    assert_eq!(summary["distinct_input_ids"], 600);
    assert_eq!(summary["input_records"], 330 + 150 + 250);
}

#[test]
fn verify_fails_on_a_duplicate_and_on_a_missing_id() {
    let (input, output) = TestTopic::pair("verify", 1);
    let [a, b, c] = [ids(1), ids(1), ids(1)].map(|mut v| v.remove(0));
    produce_full(&input.name, &keyed(&[&a, &b, &c]));
    // The output repeats a and lacks c.
    produce_full(&output.name, &keyed(&[&a, &b, &a]));
    let (code, summary) = DEDUPE.verify(&input.name, &output.name);
    assert_eq!(code, 1, "{summary}");
    assert_eq!(summary["duplicate_ids_in_output"], 1);
    assert_eq!(summary["input_ids_missing_from_output"], 1);
}

/// `n` ids, each copied `1 + extra(i)` times in a row (repeats land in the same batch), every
/// other one with the front door's source header; then `again` of them re-sent later.
fn with_repeats(all: &[String], extra: impl Fn(usize) -> usize) -> Vec<Outgoing> {
    let mut records = Vec::new();
    for (i, id) in all.iter().enumerate() {
        let mut record = keyed(&[id]).remove(0);
        if i % 2 == 0 {
            record
                .2
                .push(("dedupe-source".to_string(), b"web".to_vec()));
        }
        for _ in 0..=extra(i) {
            records.push(record.clone());
        }
    }
    records
}

#[test]
fn every_dropped_copy_is_in_the_duplicate_audit_once_with_its_story() {
    let (input, output) = TestTopic::pair("audit", 2);
    let audit = dedupe::audit::default_topic(&output.name);
    let spec = DEDUPE
        .worker_in_temp_dir(&input.name, &output.name)
        .env("DEDUPE_WORKER_SOURCES", "web");
    let all = ids(300);
    // Every fifth id sent twice in a row (the copy lands in the same batch), then ids 0..40
    // again in a later batch, and ids 40..60 again after a restart.
    produce_full(
        &input.name,
        &with_repeats(&all, |i| usize::from(i % 5 == 0)),
    );
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 300, Duration::from_secs(60));
    produce_full(&input.name, &with_repeats(&all[..40], |_| 0));
    wait_for_records(&audit, 60 + 40, Duration::from_secs(60));
    let page = worker.metrics().expect("metrics page");
    worker.stop_cleanly();
    produce_full(&input.name, &with_repeats(&all[40..60], |_| 0));
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&audit, 60 + 40 + 20, Duration::from_secs(60));
    worker.stop_cleanly();

    let written = metric_value(
        &page,
        "dedupe_audit_records_total",
        &[("outcome", "written")],
    );
    assert_eq!(
        written,
        Some(100.0),
        "the first run's audit records, counted once committed"
    );
    assert_eq!(
        metric_value(
            &page,
            "dedupe_duplicates_dropped_total",
            &[("verdict", "retry")]
        ),
        Some(100.0)
    );
    // Per source: every other id came through the front door as `web`, the rest without the
    // header; of the first run's 100 drops, 30 + 20 were web's.
    let by_source = |source, outcome| {
        metric_value(
            &page,
            "dedupe_source_records_total",
            &[("source", source), ("outcome", outcome)],
        )
    };
    assert_eq!(by_source("web", "duplicate"), Some(50.0));
    assert_eq!(by_source("none", "duplicate"), Some(50.0));
    assert_eq!(by_source("web", "published"), Some(150.0));
    assert_eq!(by_source("none", "published"), Some(150.0));
    assert_eq!(
        by_source("other", "duplicate"),
        Some(0.0),
        "no source outside worker.sources"
    );
    let dropped = dropped_copies(&input.name);
    let audited = audit_records(&audit);
    assert_eq!(dropped.len(), 120);
    assert_eq!(
        audited.keys().collect::<Vec<_>>(),
        dropped.keys().collect::<Vec<_>>(),
        "exactly the dropped copies, each once"
    );
    let mut in_batch = 0;
    for (at, (record, v)) in &audited {
        let copy = &dropped[at];
        let id = String::from_utf8(copy.key.clone().unwrap()).unwrap();
        assert_eq!(record.key, copy.key, "keyed like the input");
        assert_eq!(
            record.partition, copy.partition,
            "in the input partition's number"
        );
        assert_eq!(v["v"], 1);
        assert_eq!(
            v["ledger_key"],
            id.replace('-', ""),
            "a UUID id's own digits"
        );
        assert_eq!(v["input_topic"], input.name.as_str());
        assert_eq!(v["timestamp_ms"], copy.timestamp.unwrap());
        let first_seen = v["first_seen_ms"].as_i64().unwrap();
        assert!(
            first_seen <= copy.timestamp.unwrap() && first_seen > copy.timestamp.unwrap() - 600_000,
            "{v}"
        );
        assert_eq!(
            v["age_ms"].as_i64().unwrap(),
            copy.timestamp.unwrap() - first_seen
        );
        let index = all.iter().position(|i| *i == id).unwrap();
        assert_eq!(
            v["source"],
            if index % 2 == 0 {
                serde_json::json!("web")
            } else {
                serde_json::Value::Null
            }
        );
        assert_eq!(
            v["verdict"], "retry",
            "every copy is its first copy's value again"
        );
        assert!(
            v.get("payload").is_none(),
            "no payload unless worker.audit_payloads"
        );
        in_batch += usize::from(v["in_batch"] == true);
    }
    assert!(
        in_batch > 0 && in_batch <= 60,
        "the copies sent at once were mostly in their first copy's batch: {in_batch}"
    );
    let (code, summary) = DEDUPE.verify(&input.name, &output.name);
    assert_eq!(code, 0, "{summary}");
}

/// Records of `ids` whose values say `content`.
fn with_content(ids: &[String], content: &str) -> Vec<Outgoing> {
    ids.iter()
        .map(|id| {
            (
                Some(id.as_bytes().to_vec()),
                Some(format!(r#"{{"messageId":"{id}","c":"{content}"}}"#).into_bytes()),
                Vec::new(),
            )
        })
        .collect()
}

#[test]
fn a_retry_is_told_from_a_reused_id_and_a_reused_id_follows_its_policy() {
    let (input, output) = TestTopic::pair("reused", 1);
    let dead = TestTopic::create("reused-dead", 1);
    let audit = dedupe::audit::default_topic(&output.name);
    let dir = tempfile::tempdir().unwrap();
    let all = ids(30);
    // 30 first copies; ids 0..10 again as they were (retries), ids 10..20 with other content
    // (reused ids); ids 20..30 again with other content but the same front door digest header,
    // which wins over the value (a retry whose sentAt changed).
    let header = |records: Vec<Outgoing>| -> Vec<Outgoing> {
        records
            .into_iter()
            .map(|(k, v, _)| {
                (
                    k,
                    v,
                    vec![(
                        "dedupe-content-digest".to_string(),
                        b"00000000000000aa".to_vec(),
                    )],
                )
            })
            .collect()
    };
    produce_full(
        &input.name,
        &[
            with_content(&all[..20], "a"),
            header(with_content(&all[20..], "a")),
        ]
        .concat(),
    );
    produce_full(
        &input.name,
        &[
            with_content(&all[..10], "a"),
            with_content(&all[10..20], "b"),
            header(with_content(&all[20..], "b")),
        ]
        .concat(),
    );
    let spec = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_WORKER_ON_REUSED_ID", "dead-letter")
        .env("DEDUPE_WORKER_DEAD_LETTER_TOPIC", &dead.name);
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 30, Duration::from_secs(60));
    wait_for_records(&dead.name, 10, Duration::from_secs(60));
    wait_for_records(&audit, 20, Duration::from_secs(60));
    let page = worker.metrics().expect("metrics page");
    worker.stop_cleanly();
    let count = |name, labels: &[(&str, &str)]| metric_value(&page, name, labels).unwrap_or(0.0);
    assert_eq!(
        count("dedupe_duplicates_dropped_total", &[("verdict", "retry")]),
        20.0
    );
    assert_eq!(
        count(
            "dedupe_duplicates_dropped_total",
            &[("verdict", "reused_id")]
        ),
        0.0,
        "dead-lettered, not dropped"
    );
    assert_eq!(
        count("dedupe_reused_ids_total", &[("action", "dead_lettered")]),
        10.0
    );
    assert_eq!(
        count("dedupe_source_reused_ids_total", &[("source", "none")]),
        10.0,
        "counted under the records' source"
    );
    // The dead letters are the reused ids' second events, as sent.
    let dead_values: Vec<String> = consume_all(&dead.name, true)
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
        .collect();
    assert_eq!(
        dead_values,
        with_content(&all[10..20], "b")
            .iter()
            .map(|r| String::from_utf8(r.1.clone().unwrap()).unwrap())
            .collect::<Vec<_>>()
    );
    let verdicts: BTreeMap<String, usize> =
        audit_records(&audit)
            .values()
            .fold(BTreeMap::new(), |mut m, (_, v)| {
                *m.entry(v["verdict"].as_str().unwrap().to_string())
                    .or_default() += 1;
                m
            });
    assert_eq!(verdicts, BTreeMap::from([("retry".to_string(), 20)]));

    // The digests outlive a restart (the ledger keeps them); the default policy drops a reused
    // id, counted and audited as one.
    produce_full(
        &input.name,
        &[
            with_content(&all[10..20], "c"),
            with_content(&all[..5], "a"),
        ]
        .concat(),
    );
    let spec = DEDUPE.worker(&input.name, &output.name, &dir.path().join("ledger"));
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&audit, 35, Duration::from_secs(60));
    let page = worker.metrics().expect("metrics page");
    worker.stop_cleanly();
    let counted: Vec<&str> = page
        .lines()
        .filter(|l| {
            l.starts_with("dedupe_duplicates_dropped_total")
                || l.starts_with("dedupe_reused_ids_total")
        })
        .collect();
    let why = format!("{counted:#?}\n{}", worker.log_text());
    assert_eq!(
        metric_value(
            &page,
            "dedupe_duplicates_dropped_total",
            &[("verdict", "reused_id")]
        ),
        Some(10.0),
        "{why}"
    );
    assert_eq!(
        metric_value(&page, "dedupe_reused_ids_total", &[("action", "dropped")]),
        Some(10.0),
        "{why}"
    );
    let verdicts: BTreeMap<String, usize> =
        audit_records(&audit)
            .values()
            .fold(BTreeMap::new(), |mut m, (_, v)| {
                *m.entry(v["verdict"].as_str().unwrap().to_string())
                    .or_default() += 1;
                m
            });
    assert_eq!(
        verdicts,
        BTreeMap::from([("retry".to_string(), 25), ("reused_id".to_string(), 10)]),
        "{why}"
    );
    assert_eq!(
        consume_all(&output.name, true).len(),
        30,
        "nothing more published"
    );
}

#[test]
fn the_duplicate_audit_samples_by_id_caps_its_rate_carries_payloads_on_request_and_turns_off() {
    let (input, output) = TestTopic::pair("audit-sampled", 1);
    let audit = dedupe::audit::default_topic(&output.name);
    let all = ids(400);
    let records = with_repeats(&all, |_| 1);
    produce_full(&input.name, &records);
    let spec = DEDUPE
        .worker_in_temp_dir(&input.name, &output.name)
        .env("DEDUPE_WORKER_AUDIT_SAMPLE", "0.5")
        .env("DEDUPE_WORKER_AUDIT_MAX_PER_SEC", "50")
        .env("DEDUPE_WORKER_AUDIT_PAYLOADS", "true");
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 400, Duration::from_secs(60));
    // The last batch's counters move after its commit: wait until every drop is counted.
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = worker.metrics().expect("metrics page");
        if metric_value(&page, "dedupe_duplicates_dropped_total", &[]) == Some(400.0)
            || Instant::now() > deadline
        {
            break page;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    worker.stop_cleanly();
    let count = |outcome| {
        metric_value(&page, "dedupe_audit_records_total", &[("outcome", outcome)]).unwrap_or(0.0)
            as usize
    };
    // Sampled in: ids whose first 8 key bytes are below half the range.
    let sampled_in = all
        .iter()
        .filter(|id| u64::from_str_radix(&id.replace('-', "")[..16], 16).unwrap() < u64::MAX / 2)
        .count();
    assert_eq!(count("sampled_out"), 400 - sampled_in, "sampling is by id");
    assert_eq!(count("written") + count("over_cap"), sampled_in);
    assert!(count("over_cap") > 0 && count("written") >= 50, "{page}");
    let audited = audit_records(&audit);
    assert_eq!(audited.len(), count("written"));
    let dropped = dropped_copies(&input.name);
    for (at, (_, v)) in &audited {
        let id = v["ledger_key"].as_str().unwrap();
        assert!(
            u64::from_str_radix(&id[..16], 16).unwrap() < u64::MAX / 2,
            "an id outside the sample was audited: {v}"
        );
        let payload = base64::engine::general_purpose::STANDARD
            .decode(v["payload"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            Some(payload),
            dropped[at].value,
            "the dropped copy's value, as read"
        );
    }

    // Off: no audit topic at all.
    let (input, output) = TestTopic::pair("audit-off", 1);
    produce_full(&input.name, &with_repeats(&all[..50], |_| 1));
    let mut worker = DEDUPE
        .worker_in_temp_dir(&input.name, &output.name)
        .env("DEDUPE_WORKER_AUDIT_TOPIC", "")
        .start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 50, Duration::from_secs(60));
    worker.stop_cleanly();
    let exists = dedupe::kafka::partition_count(
        &kafka_config(),
        &dedupe::audit::default_topic(&output.name),
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(
        exists, None,
        "worker.audit_topic = \"\" makes no audit topic"
    );
}

/// The bad-input records of one run: (expected keyed ids, records).
fn bad_input() -> (usize, Vec<Outgoing>) {
    let good = ids(5);
    let non_utf8 = vec![0xff, 0xfe, 0x00, 0x80, 0x41];
    let tombstone_key = uuid::Uuid::new_v4().to_string().into_bytes();
    let v = |s: &str| Some(s.as_bytes().to_vec());
    let mut records: Vec<Outgoing> = good
        .iter()
        .map(|id| (Some(id.as_bytes().to_vec()), v("good"), vec![]))
        .collect();
    records.push((Some(good[0].as_bytes().to_vec()), v("repeat"), vec![])); // a duplicate
    records.push((None, v("null key 1"), vec![]));
    records.push((None, v("null key 2"), vec![]));
    records.push((Some(vec![]), v("empty key 1"), vec![]));
    records.push((Some(vec![]), v("empty key 2"), vec![]));
    records.push((Some(vec![b'k'; 2048]), v("2 KiB key 1"), vec![]));
    records.push((Some(vec![b'q'; 2048]), v("2 KiB key 2"), vec![]));
    records.push((Some(non_utf8.clone()), v("non-utf8"), vec![])); // a valid id: its bytes hash
    records.push((Some(non_utf8), v("non-utf8 again"), vec![])); // its duplicate
    records.push((Some(tombstone_key.clone()), None, vec![])); // a keyed tombstone
    records.push((Some(tombstone_key), None, vec![])); // and its duplicate
    records.push((None, None, vec![])); // a tombstone without a key
    (7, records)
}

fn run_bad_input(policy: &str) {
    let (input, output) = TestTopic::pair("bad", 1);
    let dlq = TestTopic::create("bad-dlq", 1);
    let (keyed_unique, records) = bad_input();
    let unkeyed = 7; // 2 null keys, 2 empty, 2 too long, 1 keyless tombstone
    produce_full(&input.name, &records);
    let spec = DEDUPE
        .worker_in_temp_dir(&input.name, &output.name)
        .env("DEDUPE_WORKER_UNKEYED_POLICY", policy)
        .env("DEDUPE_WORKER_DEAD_LETTER_TOPIC", &dlq.name);
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    let expected_out = if policy == "forward" {
        keyed_unique + unkeyed
    } else {
        keyed_unique
    };
    wait_for_records(&output.name, expected_out, Duration::from_secs(60));
    let page = worker.metrics().expect("metrics");
    worker.stop_cleanly();
    let out = consume_all(&output.name, true);

    assert_eq!(out.len(), expected_out, "policy {policy}");
    let unkeyed_out = out
        .iter()
        .filter(|r| {
            r.key.is_none()
                || r.key
                    .as_ref()
                    .is_some_and(|k| k.is_empty() || k.len() > 1024)
        })
        .count();
    assert_eq!(
        unkeyed_out,
        if policy == "forward" { unkeyed } else { 0 },
        "policy {policy}"
    );
    let dead = consume_all(&dlq.name, true);
    assert_eq!(
        dead.len(),
        if policy == "dead-letter" { unkeyed } else { 0 },
        "policy {policy}"
    );
    if policy == "dead-letter" {
        let values: HashSet<_> = dead.iter().map(|r| r.value.clone()).collect();
        assert!(values.contains(&Some(b"2 KiB key 1".to_vec())));
    }
    // Each case is counted with its reason and the policy applied.
    assert_eq!(
        metric_value(&page, "dedupe_unkeyed_records_total", &[("policy", policy)]),
        Some(unkeyed as f64),
        "{page}"
    );
    let by_reason = |r: &str| metric_value(&page, "dedupe_unkeyed_records_total", &[("reason", r)]);
    assert_eq!(by_reason("missing"), Some(3.0));
    assert_eq!(by_reason("empty"), Some(2.0));
    assert_eq!(by_reason("too_long"), Some(2.0));
    // Keyed records, non-UTF-8 and tombstones included, were deduplicated.
    assert_eq!(
        metric_value(&page, "dedupe_duplicates_dropped_total", &[]),
        Some(3.0)
    );
    // The warning names the cause and never the payload.
    let log = worker.log_text();
    assert!(log.contains("no usable message id"), "{log}");
    assert!(!log.contains("2 KiB key"), "payloads must not be logged");
}

#[test]
fn bad_input_is_forwarded_by_default() {
    run_bad_input("forward");
}

#[test]
fn bad_input_can_be_dropped() {
    run_bad_input("drop");
}

#[test]
fn bad_input_can_go_to_a_dead_letter_topic() {
    run_bad_input("dead-letter");
}

#[test]
fn aborted_transactions_are_retried_without_loss() {
    let (input, output) = TestTopic::pair("abort", 1);
    let all = ids(200);
    let refs: Vec<&String> = all.iter().chain(&all[..20]).collect();
    produce_full(&input.name, &keyed(&refs));
    // The first two transactions fail before anything is produced, and are aborted.
    let spec = DEDUPE
        .worker_in_temp_dir(&input.name, &output.name)
        .env("FAILPOINTS", "output-before-produce=2*return->off");
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 200, Duration::from_secs(60));
    let page = worker.metrics().unwrap();
    worker.stop_cleanly();
    let out = consume_all(&output.name, true);
    assert_eq!(out.len(), 200);
    assert_eq!(
        metric_value(
            &page,
            "dedupe_transactions_total",
            &[("outcome", "aborted")]
        ),
        Some(2.0),
        "{page}"
    );
    let (code, summary) = DEDUPE.verify(&input.name, &output.name);
    assert_eq!(code, 0, "{summary}");
}

#[test]
fn a_full_output_producer_queue_makes_records_wait_not_vanish() {
    // The producers' queues hold 16 records and a batch has up to 500: each transaction's records
    // find the queue full again and again, and wait for room (counted) instead of being dropped.
    let (input, output) = TestTopic::pair("qfull", 2);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("dedupe.toml");
    std::fs::write(
        &config,
        "[kafka.properties]\n\"queue.buffering.max.messages\" = \"16\"\n",
    )
    .unwrap();
    let all = ids(1500);
    let refs: Vec<&String> = all.iter().chain(&all[..150]).collect();
    produce_full(&input.name, &keyed(&refs));
    let mut spec = DEDUPE.worker(&input.name, &output.name, &dir.path().join("ledger"));
    spec.extra_args = vec!["--config".into(), config.display().to_string()];
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, all.len(), Duration::from_secs(90));
    let page = worker.metrics().unwrap();
    worker.stop_cleanly();
    let waits = metric_value(&page, "dedupe_output_queue_full_waits_total", &[]).unwrap_or(0.0);
    assert!(
        waits > 0.0,
        "no record waited for room, so the queue was never full:\n{page}"
    );
    assert_eq!(
        metric_value(
            &page,
            "dedupe_transactions_total",
            &[("outcome", "aborted")]
        ),
        None,
        "{page}"
    );
    assert_eq!(consume_all(&output.name, true).len(), all.len());
    let (code, summary) = DEDUPE.verify(&input.name, &output.name);
    assert_eq!(code, 0, "{summary}");
}

#[test]
fn a_partition_whose_transactions_keep_aborting_is_taken_over_again_while_the_other_publishes() {
    // Input in both partitions; the first six transactions abort (partition 0's, whose input is
    // there first): its pipeline gives up, and only partition 0 is taken over again. Partition 1
    // publishes meanwhile.
    let (input, output) = TestTopic::pair("retake", 2);
    let first = ids(50);
    produce_full_to(
        &input.name,
        Some(0),
        &keyed(&first.iter().collect::<Vec<_>>()),
    );
    let mut spec = DEDUPE
        .worker_in_temp_dir(&input.name, &output.name)
        .env("FAILPOINTS", "output-before-produce=6*return->off");
    spec.partitions = Some("0,1".into());
    let mut worker = spec.start();
    wait_for_records(&output.name, first.len(), Duration::from_secs(90));
    // New ids in both partitions, and some of the first ones again.
    let second = ids(100);
    let refs: Vec<&String> = second.iter().chain(&first[..20]).collect();
    produce_full(&input.name, &keyed(&refs));
    wait_for_records(
        &output.name,
        first.len() + second.len(),
        Duration::from_secs(60),
    );
    let page = worker.metrics().unwrap();
    let retakes = |reason| {
        metric_value(
            &page,
            "dedupe_partition_retakes_total",
            &[("partition", "0"), ("reason", reason)],
        )
    };
    assert_eq!(
        retakes("failed"),
        Some(1.0),
        "partition 0 taken over again once:\n{page}"
    );
    assert_eq!(
        metric_value(
            &page,
            "dedupe_partition_retakes_total",
            &[("partition", "1")]
        ),
        None,
        "partition 1 left alone:\n{page}"
    );
    worker.stop_cleanly();
    let out = consume_all(&output.name, true);
    assert_eq!(
        out.len(),
        first.len() + second.len(),
        "{}",
        worker.log_text()
    );
    let (code, summary) = DEDUPE.verify(&input.name, &output.name);
    assert_eq!(code, 0, "{summary}");
}

#[test]
fn a_hung_commit_is_left_behind_and_its_late_end_changes_nothing() {
    // The first commit hangs 30 s inside librdkafka's call (as its known hangs do). With a 20 s
    // transaction timeout the call's own timeout is 10 s, so the watchdog hands it over 20 s in:
    // the partition is taken over again with a new producer, which fences the hung one. When the
    // hung call returns, its pipeline ends (fenced) long after it was replaced: that changes
    // nothing, and the worker never exits.
    let (input, output) = TestTopic::pair("hung", 1);
    let first = ids(30);
    produce_full(&input.name, &keyed(&first.iter().collect::<Vec<_>>()));
    let mut worker = DEDUPE
        .worker_in_temp_dir(&input.name, &output.name)
        .env("DEDUPE_WORKER_TRANSACTION_TIMEOUT_MS", "20000")
        .env("FAILPOINTS", "output-commit-hangs=1*sleep(30000)->off")
        .start();
    wait_for_records(&output.name, first.len(), Duration::from_secs(90));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !worker
        .log_text()
        .contains("A partition pipeline that was replaced ended")
    {
        assert!(
            Instant::now() < deadline,
            "the hung pipeline's late end never came:\n{}",
            worker.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let second = ids(40);
    let refs: Vec<&String> = second.iter().chain(&first[..10]).collect();
    produce_full(&input.name, &keyed(&refs));
    wait_for_records(
        &output.name,
        first.len() + second.len(),
        Duration::from_secs(60),
    );
    let page = worker.metrics().unwrap();
    assert_eq!(
        metric_value(
            &page,
            "dedupe_partition_retakes_total",
            &[("reason", "hung")]
        ),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        metric_value(&page, "dedupe_errors_total", &[("kind", "stuck")]),
        Some(1.0),
        "{page}"
    );
    // The late end was the replaced pipeline's: nothing of this worker was fenced, and the new
    // pipeline was left alone.
    assert_eq!(
        metric_value(&page, "dedupe_errors_total", &[("kind", "fenced")]),
        None,
        "{page}"
    );
    assert_eq!(
        metric_value(
            &page,
            "dedupe_partition_retakes_total",
            &[("reason", "fenced")]
        ),
        None,
        "{page}"
    );
    worker.stop_cleanly();
    assert_eq!(
        consume_all(&output.name, true).len(),
        first.len() + second.len(),
        "{}",
        worker.log_text()
    );
    let (code, summary) = DEDUPE.verify(&input.name, &output.name);
    assert_eq!(code, 0, "{summary}");
}

#[test]
fn a_zombie_worker_is_fenced_and_the_output_has_no_duplicates() {
    let (input, output) = TestTopic::pair("zombie", 1);
    let dir = tempfile::tempdir().unwrap();
    let spec_a = DEDUPE.worker(&input.name, &output.name, &dir.path().join("ledger-a"));
    // Same group, same partition, another ledger: a copy of the worker left running elsewhere.
    let group = spec_a
        .env
        .iter()
        .find(|(k, _)| k == "DEDUPE_WORKER_GROUP_ID")
        .unwrap()
        .1
        .clone();
    let spec_b = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger-b"))
        .env("DEDUPE_WORKER_GROUP_ID", &group);

    let mut a = spec_a.start();
    a.wait_ready(Duration::from_secs(60));
    // A steady trickle of input, with re-sent ids, while the second worker starts.
    let topic = input.name.clone();
    let feeder = std::thread::spawn(move || {
        let mut sent = Vec::new();
        for round in 0..40 {
            let fresh = ids(25);
            let mut batch: Vec<&String> = fresh.iter().collect();
            if round > 0 {
                batch.extend(sent.iter().rev().take(5));
            }
            produce_full(&topic, &keyed(&batch));
            sent.extend(fresh);
            std::thread::sleep(Duration::from_millis(100));
        }
        sent.len()
    });
    // The second worker starts once the first is publishing the trickle.
    wait_for_records(&output.name, 25, Duration::from_secs(60));
    let mut b = spec_b.start();
    b.wait_ready(Duration::from_secs(60));
    // Two writers of one partition: the first fenced takes its partition over again (a fence can
    // also be the broker aborting a transaction that outlived its timeout), which fences the
    // other, and so on; one fenced a second time within five minutes stops itself with status 3.
    // Which one, and when, depends on who writes when: what must hold is that only the newest
    // producer's transactions commit, so every id is published once.
    let distinct = feeder.join().unwrap();
    wait_for_records(&output.name, distinct, Duration::from_secs(90));
    let codes = [
        a.terminate(Duration::from_secs(30)),
        b.terminate(Duration::from_secs(30)),
    ];
    eprintln!("zombie: exit codes {codes:?}");
    let logs = [a.log_text(), b.log_text()];
    assert!(
        logs[0].contains("fenced"),
        "the first worker was fenced:\n{}",
        logs[0]
    );
    for (code, log) in codes.iter().zip(&logs) {
        assert!(matches!(code, Some(0) | Some(3)), "exit {code:?}:\n{log}");
        assert_eq!(
            *code == Some(3),
            log.contains("Fenced again soon after a fence"),
            "{log}"
        );
    }
    let out = consume_all(&output.name, true);
    let keys: HashSet<_> = out.iter().map(|r| r.key.clone()).collect();
    assert_eq!(keys.len(), out.len(), "no duplicates in the output");
    let (code, summary) = DEDUPE.verify(&input.name, &output.name);
    assert_eq!(code, 0, "{summary}");
}

#[test]
fn missing_topics_and_too_few_output_partitions_are_refused() {
    let input = TestTopic::create("refuse-in", 4);
    let output = TestTopic::create("refuse-out", 2);
    let dir = tempfile::tempdir().unwrap();
    let mut w = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("l"))
        .start();
    assert_eq!(w.wait(Duration::from_secs(60)), Some(2));
    assert!(
        w.log_text().contains("needs at least 4"),
        "{}",
        w.log_text()
    );
    let mut w = DEDUPE
        .worker(&input.name, "no-such-topic-here", &dir.path().join("l"))
        .start();
    assert_eq!(w.wait(Duration::from_secs(60)), Some(2));
    assert!(w.log_text().contains("does not exist"), "{}", w.log_text());
}

#[test]
fn two_pipelines_on_one_input_each_publish_all_of_it_and_never_share_offsets() {
    // One input, two pipelines (two output topics), both with the default consumer group.
    let input = TestTopic::create("pipelines-in", 2);
    let (out_a, out_b) = (
        TestTopic::create("pipelines-a", 2),
        TestTopic::create("pipelines-b", 2),
    );
    let dir = tempfile::tempdir().unwrap();
    let all = ids(300);
    produce_full(&input.name, &keyed(&all[..200].iter().collect::<Vec<_>>()));
    let a = DEDUPE
        .worker(&input.name, &out_a.name, &dir.path().join("a"))
        .without("DEDUPE_WORKER_GROUP_ID");
    let b = DEDUPE
        .worker(&input.name, &out_b.name, &dir.path().join("b"))
        .without("DEDUPE_WORKER_GROUP_ID");
    // The first pipeline reads the input and stops; the second, started after it on an empty
    // ledger, still publishes the whole input, not only what arrives after it.
    let mut worker = a.start();
    wait_for_records(&out_a.name, 200, Duration::from_secs(90));
    worker.stop_cleanly();
    let mut worker = b.start();
    wait_for_records(&out_b.name, 200, Duration::from_secs(90));
    worker.stop_cleanly();
    // More input; both run side by side and each resumes at its own position.
    produce_full(&input.name, &keyed(&all[200..].iter().collect::<Vec<_>>()));
    let (mut wa, mut wb) = (a.start(), b.start());
    wait_for_records(&out_a.name, 300, Duration::from_secs(90));
    wait_for_records(&out_b.name, 300, Duration::from_secs(90));
    wa.stop_cleanly();
    wb.stop_cleanly();
    for out in [&out_a, &out_b] {
        let (code, summary) = DEDUPE.verify(&input.name, &out.name);
        assert_eq!(code, 0, "{}: {summary}", out.name);
        assert_eq!(
            (
                summary["input_ids_missing_from_output"].as_u64(),
                summary["distinct_input_ids"].as_u64()
            ),
            (Some(0), Some(300)),
            "{summary}"
        );
    }

    // A third pipeline told to use the first one's group is refused, naming the conflict.
    let out_c = TestTopic::create("pipelines-c", 2);
    let group_a = format!("dedupe.{}", out_a.name);
    let mut c = DEDUPE
        .worker(&input.name, &out_c.name, &dir.path().join("c"))
        .env("DEDUPE_WORKER_GROUP_ID", &group_a)
        .start();
    assert_eq!(c.wait(Duration::from_secs(60)), Some(2), "{}", c.log_text());
    let log = c.log_text();
    assert!(
        log.contains(&format!("consumer group `{group_a}`"))
            && log.contains(&format!("`{}`", out_a.name))
            && log.contains("worker.group_id"),
        "{log}"
    );
    assert!(
        consume_all(&out_c.name, true).is_empty(),
        "the refused pipeline published"
    );
}

#[test]
fn an_unreachable_broker_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port(); // nothing listens there
    let out = DEDUPE
        .command()
        .args([
            "run",
            "--brokers",
            &format!("127.0.0.1:{port}"),
            "--input-topic",
            "i",
            "--output-topic",
            "o",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("ledger"))
        .args(["--metrics-addr", &format!("127.0.0.1:{}", free_port())])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{port}")),
        "the error names the broker: {stderr}"
    );
    // Nothing was created before the broker answered.
    assert!(!dir.path().join("ledger").exists());
}

#[test]
fn a_corrupt_ledger_is_refused_and_left_as_it_is() {
    let (input, output) = TestTopic::pair("corrupt", 1);
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    // A ledger that worked once...
    produce_full(&input.name, &keyed(&ids(10).iter().collect::<Vec<_>>()));
    let spec = DEDUPE.worker(&input.name, &output.name, &ledger);
    let mut w = spec.start();
    w.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 10, Duration::from_secs(60));
    w.stop_cleanly();
    // ...then its CURRENT file is overwritten with garbage.
    std::fs::write(ledger.join("CURRENT"), b"garbage\n").unwrap();
    let files_before: Vec<_> = std::fs::read_dir(&ledger)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut w = spec.start();
    assert_eq!(w.wait(Duration::from_secs(60)), Some(2));
    let log = w.log_text();
    assert!(
        log.contains("opening the ledger") && log.contains(ledger.to_str().unwrap()),
        "{log}"
    );
    // The directory was neither deleted nor recreated.
    assert_eq!(std::fs::read(ledger.join("CURRENT")).unwrap(), b"garbage\n");
    let files_after: Vec<_> = std::fs::read_dir(&ledger)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files_before, files_after);
}

/// A small tmpfs mounted for one test (the suite runs as root, as CI does).
struct SmallDisk {
    path: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(path: &std::path::Path, size: &str) -> Self {
        std::fs::create_dir_all(path).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "the full-disk test mounts a small tmpfs and needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            path: path.to_path_buf(),
        }
    }

    fn grow(&self, size: &str) {
        let out = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

#[test]
fn a_full_disk_stops_the_worker_without_losing_or_repeating_anything() {
    let (input, output) = TestTopic::pair("diskfull", 2);
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(&dir.path().join("disk"), "12m");
    let summary = DEDUPE
        .command()
        .args([
            "loadgen",
            "--brokers",
            &brokers(),
            "--topic",
            &input.name,
            "--count",
            "600000",
            "--dup-ratio",
            "0.02",
        ])
        .args(["--value-bytes", "100"])
        .output()
        .unwrap();
    assert!(summary.status.success());
    let summary: serde_json::Value = serde_json::from_slice(&summary.stdout).unwrap();
    let distinct = summary["distinct_ids"].as_u64().unwrap() as usize;
    let spec = DEDUPE
        .worker(&input.name, &output.name, &disk.path.join("ledger"))
        .env("DEDUPE_LEDGER_WRITE_BUFFER_BYTES", "4MiB")
        .env("DEDUPE_WORKER_BATCH_MAX_RECORDS", "4096");

    // The ledger outgrows the 12 MiB disk long before its budget: the worker stops with an error
    // that names the cause.
    let mut w = spec.start();
    let code = w.wait(Duration::from_secs(240));
    let log = w.log_text();
    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains("No space left on device"),
        "the error names the cause:\n{log}"
    );
    // Everything published so far is there once.
    let (_, partial) = DEDUPE.verify(&input.name, &output.name);
    assert_eq!(partial["duplicate_ids_in_output"], 0, "{partial}");
    assert!(
        partial["input_ids_missing_from_output"].as_u64().unwrap() > 0,
        "the disk filled before the end: {partial}"
    );

    // With room again, a restart finishes the job: nothing lost, nothing twice.
    disk.grow("512m");
    let mut w = spec.start();
    w.wait_ready(Duration::from_secs(120));
    wait_for_records(&output.name, distinct, Duration::from_secs(240));
    w.stop_cleanly();
    let (code, summary) = DEDUPE.verify(&input.name, &output.name);
    assert_eq!(code, 0, "{summary}");
}

#[test]
fn a_ledger_ahead_of_the_output_is_refused_unless_the_operator_accepts_it() {
    let (input, output) = TestTopic::pair("ahead", 1);
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    produce_full(&input.name, &keyed(&ids(50).iter().collect::<Vec<_>>()));
    let spec = DEDUPE.worker(&input.name, &output.name, &ledger);
    let mut w = spec.start();
    w.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 50, Duration::from_secs(60));
    w.stop_cleanly();

    // `dedupe ledger stats` reads the stopped worker's ledger: 50 ids, and partition 0's progress.
    let stats = DEDUPE
        .command()
        .args(["ledger", "stats", "--data-dir"])
        .arg(&ledger)
        .output()
        .unwrap();
    assert!(
        stats.status.success(),
        "{}",
        String::from_utf8_lossy(&stats.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["ids_estimate"], 50, "{stats}");
    assert_eq!(stats["partitions"]["0"]["next_input_offset"], 50, "{stats}");
    assert!(
        stats["partitions"]["0"]["next_output_offset"]
            .as_i64()
            .unwrap()
            >= 50,
        "{stats}"
    );

    // The output topic is deleted and created again, empty: the ledger now vouches for ids the
    // output does not hold. Starting would drop re-read messages that never reached the output.
    output.recreate();
    let mut w = spec.start();
    assert_eq!(w.wait(Duration::from_secs(60)), Some(1), "{}", w.log_text());
    assert!(
        w.log_text()
            .contains("the ledger is ahead of the output topic"),
        "{}",
        w.log_text()
    );

    // The operator may choose to trust the ledger: then nothing already recorded is published again.
    let mut accepting = spec.clone();
    accepting.extra_args.push("--accept-ledger-ahead".into());
    let mut w = accepting.start();
    w.wait_ready(Duration::from_secs(60));
    produce_full(&input.name, &keyed(&ids(5).iter().collect::<Vec<_>>()));
    wait_for_records(&output.name, 5, Duration::from_secs(60));
    w.stop_cleanly();
    let out = consume_all(&output.name, true);
    assert_eq!(out.len(), 5, "only the new ids are published");
}

/// Bytes that do not compress (the producer compresses, and a topic's limit is on the compressed
/// batch), as a record's value.
fn noise(len: usize) -> Vec<u8> {
    (0..len).map(|_| rand::random()).collect()
}

/// Records keyed by fresh ids, `big` of them (by their place) with `bytes` of noise as value.
fn with_large(n: usize, big: &[(usize, usize)]) -> (Vec<String>, Vec<Outgoing>) {
    let all = ids(n);
    let mut records = keyed(&all.iter().collect::<Vec<_>>());
    for &(at, bytes) in big {
        records[at].1 = Some(noise(bytes));
    }
    (all, records)
}

/// The keys the output holds on `partition`, in order.
fn keys_on(out: &[Record], partition: i32) -> Vec<Vec<u8>> {
    out.iter()
        .filter(|r| r.partition == partition)
        .filter_map(|r| r.key.clone())
        .collect()
}

/// The output topic's `max.message.bytes` in the refusal tests: a 5 KB record of noise is over it.
const SMALL_LIMIT: &str = "2000";

#[test]
fn a_record_the_output_refuses_stalls_only_its_partition_which_heals_when_the_limit_is_raised() {
    let input = TestTopic::create("refused-in", 2);
    let output = TestTopic::create_with("refused-out", 2, &[("max.message.bytes", SMALL_LIMIT)]);
    // The default configuration, without a dead-letter topic.
    let spec = DEDUPE
        .worker_in_temp_dir(&input.name, &output.name)
        .without("DEDUPE_WORKER_BATCH_MAX_RECORDS")
        .without("DEDUPE_WORKER_BATCH_LINGER_MS")
        .without("DEDUPE_LEDGER_BUDGET_BYTES")
        .without("DEDUPE_LEDGER_WRITE_BUFFER_BYTES");
    // Partition 0: five records, one of 5 KB of noise, ten more. Partition 1: ten records.
    let (p0, records0) = with_large(16, &[(5, 5_000)]);
    let (p1, records1) = with_large(10, &[]);
    produce_full_to(&input.name, Some(0), &records0);
    produce_full_to(&input.name, Some(1), &records1);
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));

    // The five before it and all of partition 1 are published; partition 0 stops at it, shows
    // so, and counts the eleven records waiting from it as its lag.
    wait_for_records(&output.name, 15, Duration::from_secs(60));
    let stalled = [("partition", "0")];
    wait_until(
        "partition 0 shown stalled, with its lag counted from the refused record",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            (worker.metric("dedupe_partition_stalled", &stalled) == 1.0
                && worker.metric("dedupe_consumer_lag_records", &stalled) == 11.0)
                .then_some(())
        },
        || worker.metrics().unwrap_or_default(),
    );
    let log = worker.log_text();
    assert!(
        log.contains("PartitionStalled") && log.contains(&format!("{}/0 at offset 5", input.name)),
        "the log names the record: {log}"
    );
    assert!(!log.contains("WorkerGivesUp"));

    // Partition 1 publishes throughout: ten more records go through while partition 0 waits.
    let (more, records) = with_large(10, &[]);
    produce_full_to(&input.name, Some(1), &records);
    wait_for_records(&output.name, 25, Duration::from_secs(60));
    assert_eq!(worker.exited(), None, "the worker lives");

    // The output's limit raised: the partition heals without a restart.
    output.alter("max.message.bytes", "1048588");
    wait_for_records(&output.name, 36, Duration::from_secs(90));
    wait_until(
        "partition 0 no longer stalled",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || (worker.metric("dedupe_partition_stalled", &stalled) == 0.0).then_some(()),
        || worker.metrics().unwrap_or_default(),
    );
    // The refused record's retry is a duplicate now.
    produce_full_to(&input.name, Some(0), &records0[5..6]);
    wait_until(
        "the retry dropped",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || (worker.metric("dedupe_duplicates_dropped_total", &stalled) >= 1.0).then_some(()),
        || worker.metrics().unwrap_or_default(),
    );
    worker.stop_cleanly();
    let out = consume_all(&output.name, true);
    let keys: HashSet<Vec<u8>> = out.iter().filter_map(|r| r.key.clone()).collect();
    assert_eq!(out.len(), 36, "each id once");
    for id in p0.iter().chain(&p1).chain(&more) {
        assert!(keys.contains(id.as_bytes()), "{id} published");
    }
    // Partition 0 kept its order, the refused record in its place.
    let expected: Vec<Vec<u8>> = p0.iter().map(|id| id.as_bytes().to_vec()).collect();
    assert_eq!(keys_on(&out, 0), expected);
}

#[test]
fn records_the_output_refuses_go_to_the_dead_letter_topic_once_and_their_retries_are_dropped() {
    let input = TestTopic::create("refused-dl-in", 2);
    let output = TestTopic::create_with("refused-dl-out", 2, &[("max.message.bytes", SMALL_LIMIT)]);
    // The dead-letter topic takes 8 KB: a 5 KB record goes there whole, a 12 KB one without its
    // value.
    let dead_letters = TestTopic::create_with("refused-dl", 1, &[("max.message.bytes", "8000")]);
    let spec = DEDUPE
        .worker_in_temp_dir(&input.name, &output.name)
        .env("DEDUPE_WORKER_DEAD_LETTER_TOPIC", &dead_letters.name);
    // Partition 0: refused records first and last in its batch, and one in the middle; partition
    // 1: one too, at the same time.
    let (p0, records0) = with_large(12, &[(0, 5_000), (6, 12_000), (11, 5_000)]);
    let (p1, records1) = with_large(6, &[(3, 5_000)]);
    produce_full_to(&input.name, Some(0), &records0);
    produce_full_to(&input.name, Some(1), &records1);
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&dead_letters.name, 4, Duration::from_secs(90));
    wait_for_records(&output.name, 14, Duration::from_secs(60));

    // Each refused record's retry is a duplicate: dropped, never dead-lettered again.
    let retries: Vec<Outgoing> = [0, 6, 11].map(|i| records0[i].clone()).to_vec();
    produce_full_to(&input.name, Some(0), &retries);
    produce_full_to(&input.name, Some(1), &records1[3..4]);
    wait_until(
        "the four retries dropped",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || (worker.metric("dedupe_duplicates_dropped_total", &[]) == 4.0).then_some(()),
        || worker.metrics().unwrap_or_default(),
    );
    assert_eq!(
        worker.metric("dedupe_dead_lettered_total", &[("reason", "too_large")]),
        4.0
    );
    assert_eq!(worker.exited(), None, "the worker lives");
    // `dedupe explain` says where a refused record went, with and without its value; a
    // published id has no dead letter.
    let explain = |id: &str| {
        let out = DEDUPE
            .command()
            .args(["explain", id, "--brokers", &brokers()])
            .args(["--metrics-addr", &worker.metrics_addr().to_string()])
            .output()
            .expect("dedupe explain");
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let answer: serde_json::Value =
            serde_json::from_str(stdout.lines().next().unwrap_or_default()).expect("its JSON");
        (answer, stdout)
    };
    for (id, offset) in [(&p0[6], 6), (&p1[3], 3)] {
        let (answer, printed) = explain(id);
        let partition = if offset == 6 { 0 } else { 1 };
        assert_eq!(answer["held"], true, "{printed}");
        assert_eq!(answer["dead_letter"]["topic"], dead_letters.name.as_str());
        assert_eq!(answer["dead_letter"]["reason"], "too_large", "{printed}");
        assert_eq!(
            answer["dead_letter"]["read_at"],
            format!("{}:{partition}:{offset}", input.name).as_str()
        );
        assert!(
            printed.contains("was not published: the output refused it (too_large)"),
            "{printed}"
        );
    }
    let (published, printed) = explain(&p0[1]);
    assert!(
        published["held"] == true && published["dead_letter"].is_null(),
        "{printed}"
    );
    worker.stop_cleanly();

    let header = |r: &Record, name: &str| {
        r.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.clone())
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    };
    let dead = consume_all(&dead_letters.name, true);
    assert_eq!(dead.len(), 4, "each refused record once");
    let dead: BTreeMap<String, &Record> = dead
        .iter()
        .map(|r| (header(r, "dedupe-refused-source").expect("its source"), r))
        .collect();
    assert_eq!(dead.len(), 4, "four places");
    for (partition, offset, id, bytes, whole) in [
        (0, 0, &p0[0], 5_000, true),
        (0, 6, &p0[6], 12_000, false),
        (0, 11, &p0[11], 5_000, true),
        (1, 3, &p1[3], 5_000, true),
    ] {
        let r = dead[&format!("{}:{partition}:{offset}", input.name)];
        assert_eq!(r.key.as_deref(), Some(id.as_bytes()));
        assert_eq!(header(r, "dedupe-reason").as_deref(), Some("too_large"));
        assert_eq!(
            header(r, "dedupe-refused-by").as_deref(),
            Some(output.name.as_str())
        );
        let size: usize = header(r, "dedupe-refused-bytes")
            .expect("its size")
            .parse()
            .unwrap();
        assert!(size > bytes, "{size} counts key, value and headers");
        assert_eq!(r.value.as_ref().map(Vec::len), whole.then_some(bytes));
    }
    // The output holds every other record once, in order.
    let out = consume_all(&output.name, true);
    assert_eq!(out.len(), 14);
    let keys: HashSet<Vec<u8>> = out.iter().filter_map(|r| r.key.clone()).collect();
    assert_eq!(keys.len(), 14);
}

/// A dead-letter topic that refuses even a refused record's dead letter without its value (its key
/// and headers are over the topic's limit): the partition stops at the record, as it does without
/// a dead-letter topic, and heals once the dead-letter topic takes it; the other partition
/// publishes throughout.
#[test]
fn a_dead_letter_topic_that_refuses_the_dead_letter_too_stalls_only_its_partition_until_it_takes_it(
) {
    let input = TestTopic::create("refused-dlq-in", 2);
    let output =
        TestTopic::create_with("refused-dlq-out", 2, &[("max.message.bytes", SMALL_LIMIT)]);
    let dead_letters = TestTopic::create_with("refused-dlq", 1, &[("max.message.bytes", "150")]);
    let mut worker = DEDUPE
        .worker_in_temp_dir(&input.name, &output.name)
        .env("DEDUPE_WORKER_DEAD_LETTER_TOPIC", &dead_letters.name)
        .start();
    let (p0, records0) = with_large(6, &[(2, 5_000)]);
    let (p1, records1) = with_large(4, &[]);
    produce_full_to(&input.name, Some(0), &records0);
    produce_full_to(&input.name, Some(1), &records1);
    worker.wait_ready(Duration::from_secs(60));
    // The two records before it and partition 1's four are published; partition 0 stops.
    wait_for_records(&output.name, 6, Duration::from_secs(60));
    let stalled = [("partition", "0")];
    wait_until(
        "partition 0 shown stalled",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || (worker.metric("dedupe_partition_stalled", &stalled) == 1.0).then_some(()),
        || worker.metrics().unwrap_or_default(),
    );
    assert!(worker.log_text().contains("PartitionStalled"));
    let (more, records) = with_large(4, &[]);
    produce_full_to(&input.name, Some(1), &records);
    wait_for_records(&output.name, 10, Duration::from_secs(60));
    assert_eq!(worker.exited(), None, "the worker lives");
    // The dead-letter topic takes it now: the record goes there with its value, and the partition
    // goes on.
    dead_letters.alter("max.message.bytes", "8000");
    wait_for_records(&output.name, 13, Duration::from_secs(90));
    worker.stop_cleanly();
    let dead = consume_all(&dead_letters.name, true);
    assert_eq!(dead.len(), 1, "the refused record once");
    assert_eq!(dead[0].key.as_deref(), Some(p0[2].as_bytes()));
    assert_eq!(dead[0].value.as_ref().map(Vec::len), Some(5_000));
    let out = consume_all(&output.name, true);
    let keys: HashSet<Vec<u8>> = out.iter().filter_map(|r| r.key.clone()).collect();
    assert_eq!((out.len(), keys.len()), (13, 13), "each id once");
    for id in p1.iter().chain(&more) {
        assert!(keys.contains(id.as_bytes()), "{id} published");
    }
}

/// A partition stalled at a record the output refuses, attacked: the worker SIGKILLed while it
/// waits and started again (it stops at the same record), then in group mode a second worker
/// joins, so the partitions move while one waits; raising the output's limit heals it wherever it
/// is, and the output holds each id once, in order.
#[test]
fn a_stall_holds_through_a_sigkill_a_restart_and_a_partition_move_then_heals() {
    let input = TestTopic::create("stall-moves-in", 2);
    let output =
        TestTopic::create_with("stall-moves-out", 2, &[("max.message.bytes", SMALL_LIMIT)]);
    let dir = tempfile::tempdir().unwrap();
    let group = format!("stall-moves-{}", uuid::Uuid::new_v4().simple());
    let member = |name: &str| {
        DEDUPE
            .worker(&input.name, &output.name, &dir.path().join(name))
            .env("DEDUPE_WORKER_GROUP_ID", &group)
            .extra(&["--assignment", "group", "--member-id", name])
    };
    let (p0, records0) = with_large(8, &[(3, 5_000)]);
    let (p1, records1) = with_large(8, &[]);
    produce_full_to(&input.name, Some(0), &records0);
    produce_full_to(&input.name, Some(1), &records1);
    let stalled = [("partition", "0")];
    let wait_stalled = |w: &Worker| {
        wait_until(
            "partition 0 stalled",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || (w.metric("dedupe_partition_stalled", &stalled) == 1.0).then_some(()),
            || tail(&w.log_text(), 30),
        )
    };
    let mut a = member("a").start();
    a.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 11, Duration::from_secs(60));
    wait_stalled(&a);
    // SIGKILL while it waits; the restart reads from the committed offset: the refused record.
    a.kill();
    let mut a = member("a").start();
    a.wait_ready(Duration::from_secs(60));
    wait_stalled(&a);
    // A second member joins: the partitions move while partition 0 waits.
    let mut b = member("b").start();
    wait_until(
        "both members own a partition",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            (a.metric("dedupe_partitions_owned", &[]) == 1.0
                && b.metric("dedupe_partitions_owned", &[]) == 1.0)
                .then_some(())
        },
        || format!("{}\n{}", tail(&a.log_text(), 20), tail(&b.log_text(), 20)),
    );
    // Whichever owns partition 0 now stops at the record; the other publishes.
    if a.metric("dedupe_partition_stalled", &stalled) != 1.0 {
        wait_stalled(&b);
    }
    assert_eq!((a.exited(), b.exited()), (None, None), "both live");
    // Healed where it now is.
    output.alter("max.message.bytes", "1048588");
    wait_for_records(&output.name, 16, Duration::from_secs(90));
    a.stop_cleanly();
    b.stop_cleanly();
    let out = consume_all(&output.name, true);
    assert_eq!(out.len(), 16, "each id once");
    let expected: Vec<Vec<u8>> = p0.iter().map(|id| id.as_bytes().to_vec()).collect();
    assert_eq!(keys_on(&out, 0), expected, "partition 0 in order");
    assert_eq!(out.iter().filter(|r| r.partition == 1).count(), p1.len());
}

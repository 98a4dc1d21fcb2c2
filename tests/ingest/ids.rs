//! Events sent without a `messageId`: a client that is not one of Segment's libraries (a webhook,
//! a script) retries a request whose answer it lost, and the retry must be dropped like any other.
//! The front door derives such an event's id from its content when it carries the client's own
//! `timestamp`; without one, the event gets a random id (a retry cannot be told from a second
//! event). Plain HTTP against the real `dedupe ingest`, then `dedupe run` and `verify`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use super::browser::dedupe_and_verify;
use kit::{brokers, consume_all, TestTopic};

use super::{header, KEY_WEB};

fn paid(timestamp: Option<&str>) -> Value {
    let mut event = json!({ "type": "track", "event": "Paid", "userId": "u-7", "properties": { "amount": 12, "currency": "EUR" } });
    if let Some(t) = timestamp {
        event["timestamp"] = json!(t);
    }
    event
}

#[test]
fn an_id_less_request_sent_again_is_published_once_and_an_event_at_another_time_is_another() {
    let input = TestTopic::create("ingest-idless", 3);
    let ingest = super::start_ingest(&brokers(), &input.name, &[]);
    ingest.wait_ready(200);
    let post = |body: Value| {
        let answer = ingest.post_json("/v1/batch", Some(KEY_WEB), &body);
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
    };
    // The request, and its retry after a lost answer: sent later, so its sentAt differs.
    let first = paid(Some("2026-12-03T10:00:00.000Z"));
    post(json!({ "batch": [first], "sentAt": "2026-12-03T10:00:01.000Z" }));
    post(json!({ "batch": [first], "sentAt": "2026-12-03T10:00:31.000Z" }));
    // The same purchase a millisecond later is another purchase.
    post(json!({ "batch": [paid(Some("2026-12-03T10:00:00.001Z"))] }));
    // Without the client's timestamp, two sends are two events.
    post(json!({ "batch": [paid(None)] }));
    post(json!({ "batch": [paid(None)] }));

    let mut copies: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for r in consume_all(&input.name, false) {
        let value: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let id = value["messageId"].as_str().unwrap().to_string();
        let marked = header(&r, "dedupe-message-id")
            .unwrap_or_default()
            .to_string();
        let entry = copies.entry(id).or_insert((0, marked));
        entry.0 += 1;
    }
    let derived: Vec<(&String, usize)> = copies
        .iter()
        .filter(|(_, (_, m))| m == "derived")
        .map(|(id, (n, _))| (id, *n))
        .collect();
    let random: Vec<(&String, usize)> = copies
        .iter()
        .filter(|(_, (_, m))| m == "random")
        .map(|(id, (n, _))| (id, *n))
        .collect();
    assert_eq!(
        copies.len(),
        4,
        "two derived ids and two random ones: {copies:?}"
    );
    let mut counts: Vec<usize> = derived.iter().map(|(_, n)| *n).collect();
    counts.sort();
    assert_eq!(
        counts,
        [1, 2],
        "the retry has its first send's id: {copies:?}"
    );
    assert!(
        derived
            .iter()
            .all(|(id, _)| uuid::Uuid::parse_str(id).unwrap().get_version_num() == 8),
        "{copies:?}"
    );
    assert_eq!(
        random.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
        [1, 1],
        "{copies:?}"
    );
    assert!(
        random
            .iter()
            .all(|(id, _)| uuid::Uuid::parse_str(id).unwrap().get_version_num() == 4),
        "{copies:?}"
    );
    assert_eq!(
        ingest.metric("dedupe_ingest_assigned_ids_total", &[("origin", "derived")]),
        3.0
    );
    assert_eq!(
        ingest.metric("dedupe_ingest_assigned_ids_total", &[("origin", "random")]),
        2.0
    );

    // The worker drops the retry: four events out, each once.
    dedupe_and_verify(&input, &copies.keys().cloned().collect::<BTreeSet<_>>());
}

#[test]
fn with_random_ids_configured_a_retry_of_an_id_less_request_is_another_event() {
    let input = TestTopic::create("ingest-idless-random", 1);
    let ingest = super::start_ingest(
        &brokers(),
        &input.name,
        &[("DEDUPE_INGEST_MISSING_MESSAGE_ID", "random")],
    );
    ingest.wait_ready(200);
    let body = json!({ "batch": [paid(Some("2026-12-03T10:00:00.000Z"))] });
    for _ in 0..2 {
        assert_eq!(
            ingest.post_json("/v1/batch", Some(KEY_WEB), &body).status,
            200
        );
    }
    let ids: BTreeSet<String> = consume_all(&input.name, false)
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(r.value.as_deref().unwrap()).unwrap()["messageId"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
}

#[test]
fn through_the_front_door_a_retry_and_a_reused_id_get_their_verdicts() {
    let input = TestTopic::create("ingest-verdicts", 1);
    let output = TestTopic::create("ingest-verdicts-out", 1);
    let ingest = super::start_ingest(&brokers(), &input.name, &[]);
    ingest.wait_ready(200);
    let post = |body: Value| {
        let answer = ingest.post_json("/v1/batch", Some(KEY_WEB), &body);
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
    };
    let event = |id: &str, amount: u32| json!({ "type": "track", "event": "Paid", "userId": "u-7", "messageId": id, "properties": { "amount": amount } });
    // A request and its retry (another sentAt); then a client reusing an id for another purchase.
    post(
        json!({ "batch": [event("m-1", 12), event("m-2", 5)], "sentAt": "2026-12-03T10:00:01.000Z" }),
    );
    post(
        json!({ "batch": [event("m-1", 12), event("m-2", 5)], "sentAt": "2026-12-03T10:00:31.000Z" }),
    );
    post(json!({ "batch": [event("m-1", 99)], "sentAt": "2026-12-03T10:01:00.000Z" }));
    assert!(consume_all(&input.name, false)
        .iter()
        .all(|r| header(r, "dedupe-content-digest").is_some_and(|d| d.len() == 16)));

    let mut worker = super::DEDUPE
        .worker_in_temp_dir(&input.name, &output.name)
        .start();
    worker.wait_ready(std::time::Duration::from_secs(60));
    kit::wait_for_records(&output.name, 2, std::time::Duration::from_secs(90));
    let audit = dedupe::audit::default_topic(&output.name);
    kit::wait_for_records(&audit, 3, std::time::Duration::from_secs(90));
    let page = worker.metrics().expect("metrics page");
    worker.stop_cleanly();
    // By input offset: the retry's two copies, then the reused id.
    let verdicts: Vec<String> = kit::exactly_once::audit_records(&audit)
        .values()
        .map(|(_, v)| v["verdict"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(verdicts, ["retry", "retry", "reused_id"]);
    assert_eq!(
        kit::metric_value(
            &page,
            "dedupe_duplicates_dropped_total",
            &[("verdict", "retry")]
        ),
        Some(2.0)
    );
    assert_eq!(
        kit::metric_value(&page, "dedupe_reused_ids_total", &[("action", "dropped")]),
        Some(1.0)
    );
    // The output has each id once, its first copy.
    let out: Vec<Value> = consume_all(&output.name, true)
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap()).unwrap())
        .collect();
    assert_eq!(out.len(), 2);
    assert_eq!(out[0]["properties"]["amount"], 12);
}

#[test]
fn a_load_with_retries_and_reused_ids_keeps_its_verdicts_and_its_audit_through_a_kill() {
    let input = TestTopic::create("ingest-verdict-load", 2);
    let output = TestTopic::create("ingest-verdict-load-out", 2);
    let ingest = super::start_ingest(&brokers(), &input.name, &[]);
    ingest.wait_ready(200);
    let post = |batch: Vec<Value>, sent_at: &str| {
        let answer = ingest.post_json(
            "/v1/batch",
            Some(KEY_WEB),
            &json!({ "batch": batch, "sentAt": sent_at }),
        );
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
    };
    let event = |i: usize, amount: usize| json!({ "type": "track", "event": "Paid", "userId": format!("u-{i}"), "messageId": format!("e-{i}"), "properties": { "amount": amount } });
    // 200 events in batches of 10; 5% of them sent again later (a lost answer); three ids reused
    // by a client for other purchases.
    for b in 0..20 {
        post(
            (b * 10..b * 10 + 10).map(|i| event(i, i)).collect(),
            "2026-12-03T10:00:00.000Z",
        );
    }
    post(
        (0..10).map(|k| event(k * 20, k * 20)).collect(),
        "2026-12-03T10:00:30.000Z",
    );
    post(
        (1..4).map(|i| event(i, 999)).collect(),
        "2026-12-03T10:01:00.000Z",
    );

    // The worker is killed once some of it is through, then finishes.
    let spec = super::DEDUPE.worker_in_temp_dir(&input.name, &output.name);
    let mut worker = spec.start();
    kit::wait_for_records(&output.name, 50, std::time::Duration::from_secs(90));
    worker.kill();
    let mut worker = spec.start();
    kit::wait_for_records(&output.name, 200, std::time::Duration::from_secs(90));
    let audit = dedupe::audit::default_topic(&output.name);
    kit::wait_for_records(&audit, 13, std::time::Duration::from_secs(90));
    worker.stop_cleanly();

    // The audit holds exactly the dropped copies, with their verdicts.
    kit::exactly_once::assert_audit_holds_the_drops(&input.name, &output.name, "after a kill");
    let mut verdicts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (record, v) in kit::exactly_once::audit_records(&audit).values() {
        let key = String::from_utf8(record.key.clone().unwrap()).unwrap();
        verdicts
            .entry(v["verdict"].as_str().unwrap().to_string())
            .or_default()
            .push(key);
    }
    let mut reused = verdicts.remove("reused_id").unwrap_or_default();
    reused.sort();
    assert_eq!(reused, ["web:e-1", "web:e-2", "web:e-3"]);
    assert_eq!(verdicts.remove("retry").map(|k| k.len()), Some(10));
    assert!(verdicts.is_empty(), "no other verdict: {verdicts:?}");
    let (code, summary) = super::DEDUPE.verify(&input.name, &output.name);
    assert_eq!(code, 0, "{summary}");
}

/// Posts `body` as its text (numbers keep every digit) to `path` with the web source's key.
fn post_text(ingest: &kit::Ingest, path: &str, body: &str) {
    let auth = kit::ingest::basic(KEY_WEB);
    let answer = ingest.post(path, &[("Authorization", &auth)], body.as_bytes());
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
}

#[test]
fn id_less_events_that_one_double_would_merge_are_each_published() {
    // Integers a unit apart past 2^64, and a decimal that a double rounds to 0.1, each id-less
    // with the client's timestamp: four events, four derived ids, four records out.
    let input = TestTopic::create("ingest-exact", 2);
    let ingest = super::start_ingest(&brokers(), &input.name, &[]);
    ingest.wait_ready(200);
    let order = |field: &str, n: &str| {
        format!(
            r#"{{"event":"Order","userId":"u9","timestamp":"2026-12-05T07:00:00.000Z","properties":{{"tag":"T","{field}":{n}}}}}"#
        )
    };
    let numbers = [
        ("orderId", "12345678901234567890123"),
        ("orderId", "12345678901234567890124"),
        ("amount", "0.10000000000000000001"),
        ("amount", "0.1"),
    ];
    for (field, n) in numbers {
        post_text(&ingest, "/v1/track", &order(field, n));
    }
    let sent = consume_all(&input.name, false);
    let ids: BTreeSet<String> = sent
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(r.value.as_deref().unwrap()).unwrap()["messageId"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(ids.len(), 4, "each event has an id of its own");
    // Each number reached Kafka as sent.
    for (field, n) in numbers {
        assert!(
            sent.iter()
                .any(|r| String::from_utf8_lossy(r.value.as_deref().unwrap())
                    .contains(&format!(r#""{field}":{n}"#))),
            "{n}"
        );
    }
    dedupe_and_verify(&input, &ids);
}

#[test]
fn an_id_less_retry_with_another_page_url_is_a_retry_under_either_reused_id_policy() {
    // The same page view sent twice without a messageId: the retry's context names another URL,
    // which the definition of the same event leaves out. The worker drops it as a `retry`, and
    // `on_reused_id = "publish"` (the runbook's mitigation for reused ids) publishes it no more.
    for policy in ["drop", "publish"] {
        let input = TestTopic::create("ingest-retry-url", 1);
        let output = TestTopic::create("ingest-retry-url-out", 1);
        let ingest = super::start_ingest(&brokers(), &input.name, &[]);
        ingest.wait_ready(200);
        let view = |url: &str| {
            format!(
                r#"{{"name":"Home","anonymousId":"a-1","timestamp":"2026-12-05T07:00:00.000Z","context":{{"page":{{"url":"{url}"}}}}}}"#
            )
        };
        post_text(
            &ingest,
            "/v1/batch",
            &format!(
                r#"{{"batch":[{}]}}"#,
                view("/a").replacen('{', r#"{"type":"page","#, 1)
            ),
        );
        post_text(&ingest, "/v1/page", &view("/b"));
        let mut worker = super::DEDUPE
            .worker_in_temp_dir(&input.name, &output.name)
            .env("DEDUPE_WORKER_ON_REUSED_ID", policy)
            .start();
        worker.wait_ready(std::time::Duration::from_secs(60));
        let audit = dedupe::audit::default_topic(&output.name);
        kit::wait_for_records(&audit, 1, std::time::Duration::from_secs(90));
        let page = worker.metrics().expect("metrics page");
        worker.stop_cleanly();
        let verdicts: Vec<String> = kit::exactly_once::audit_records(&audit)
            .values()
            .map(|(_, v)| v["verdict"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(verdicts, ["retry"], "on_reused_id = {policy}");
        assert_eq!(
            kit::metric_value(
                &page,
                "dedupe_duplicates_dropped_total",
                &[("verdict", "retry")]
            ),
            Some(1.0),
            "on_reused_id = {policy}"
        );
        let out = consume_all(&output.name, true);
        assert_eq!(
            out.len(),
            1,
            "on_reused_id = {policy}: the retry was published"
        );
        assert!(
            String::from_utf8_lossy(out[0].value.as_deref().unwrap()).contains("/a"),
            "the first copy is the one out"
        );
    }
}

#[test]
fn explain_with_the_source_finds_what_the_front_door_wrote_on_its_partition() {
    let input = TestTopic::create("ingest-explain", 2);
    let output = TestTopic::create("ingest-explain-out", 2);
    let ingest = super::start_ingest(&brokers(), &input.name, &[]);
    ingest.wait_ready(200);
    // An id whose bare form and scoped form land on different partitions, so a tool that
    // partitions the bare id names the wrong one.
    let id = (0..1000)
        .map(|i| format!("m-{i}"))
        .find(|id| {
            super::java_partition(format!("web:{id}").as_bytes(), 2)
                != super::java_partition(id.as_bytes(), 2)
        })
        .expect("an id whose two forms part");
    let event = json!({ "type": "track", "event": "Paid", "userId": "u-7", "messageId": id });
    assert_eq!(
        ingest.post_json("/v1/track", Some(KEY_WEB), &event).status,
        200
    );
    let partition = consume_all(&input.name, false)[0].partition;
    assert_eq!(
        partition,
        super::java_partition(format!("web:{id}").as_bytes(), 2)
    );

    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let mut worker = super::DEDUPE
        .worker(&input.name, &output.name, &ledger)
        .start();
    kit::wait_for_records(&output.name, 1, std::time::Duration::from_secs(90));
    // With its source: held, on the partition the front door wrote it to.
    let (a, sentence) =
        super::DEDUPE.explain(&ledger, worker.metrics_addr(), &id, &["--source", "web"]);
    assert_eq!(
        (
            a["held"].as_bool(),
            a["partition"].as_i64(),
            a["key"].as_str()
        ),
        (
            Some(true),
            Some(partition as i64),
            Some(format!("web:{id}").as_str())
        ),
        "{a}"
    );
    assert!(
        a["window_start_ms"].as_i64().unwrap() <= a["first_seen_ms"].as_i64().unwrap(),
        "{a}"
    );
    assert!(sentence.contains("is in the window"), "{sentence}");
    // As the record's key: the same answer.
    let (k, _) = super::DEDUPE.explain(&ledger, worker.metrics_addr(), &format!("web:{id}"), &[]);
    assert_eq!(
        (k["held"].as_bool(), k["partition"].as_i64()),
        (Some(true), Some(partition as i64)),
        "{k}"
    );
    // Bare: not held here, and the answer says how to ask.
    let (b, sentence) = super::DEDUPE.explain(&ledger, worker.metrics_addr(), &id, &[]);
    assert_eq!(b["held"].as_bool(), Some(false), "{b}");
    assert!(
        sentence.contains("scoped by source") && sentence.contains("--source"),
        "{sentence}"
    );
    worker.stop_cleanly();
}

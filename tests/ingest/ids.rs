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
        assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
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
        let marked = header(&r, "dedupe-message-id").unwrap_or_default().to_string();
        let entry = copies.entry(id).or_insert((0, marked));
        entry.0 += 1;
    }
    let derived: Vec<(&String, usize)> = copies.iter().filter(|(_, (_, m))| m == "derived").map(|(id, (n, _))| (id, *n)).collect();
    let random: Vec<(&String, usize)> = copies.iter().filter(|(_, (_, m))| m == "random").map(|(id, (n, _))| (id, *n)).collect();
    assert_eq!(copies.len(), 4, "two derived ids and two random ones: {copies:?}");
    let mut counts: Vec<usize> = derived.iter().map(|(_, n)| *n).collect();
    counts.sort();
    assert_eq!(counts, [1, 2], "the retry has its first send's id: {copies:?}");
    assert!(derived.iter().all(|(id, _)| uuid::Uuid::parse_str(id).unwrap().get_version_num() == 8), "{copies:?}");
    assert_eq!(random.iter().map(|(_, n)| *n).collect::<Vec<_>>(), [1, 1], "{copies:?}");
    assert!(random.iter().all(|(id, _)| uuid::Uuid::parse_str(id).unwrap().get_version_num() == 4), "{copies:?}");
    assert_eq!(ingest.metric("dedupe_ingest_assigned_ids_total", &[("origin", "derived")]), 3.0);
    assert_eq!(ingest.metric("dedupe_ingest_assigned_ids_total", &[("origin", "random")]), 2.0);

    // The worker drops the retry: four events out, each once.
    dedupe_and_verify(&input, &copies.keys().cloned().collect::<BTreeSet<_>>());
}

#[test]
fn with_random_ids_configured_a_retry_of_an_id_less_request_is_another_event() {
    let input = TestTopic::create("ingest-idless-random", 1);
    let ingest = super::start_ingest(&brokers(), &input.name, &[("DEDUPE_INGEST_MISSING_MESSAGE_ID", "random")]);
    ingest.wait_ready(200);
    let body = json!({ "batch": [paid(Some("2026-12-03T10:00:00.000Z"))] });
    for _ in 0..2 {
        assert_eq!(ingest.post_json("/v1/batch", Some(KEY_WEB), &body).status, 200);
    }
    let ids: BTreeSet<String> = consume_all(&input.name, false)
        .iter()
        .map(|r| serde_json::from_slice::<Value>(r.value.as_deref().unwrap()).unwrap()["messageId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
}

//! Segment's own libraries send a batch of ten in which one event is invalid in a way the library
//! lets through: a 300-character `messageId` (`@segment/analytics-node`; the Python library's
//! test is in `tests/python/test_segment_client.py`), or a track whose name a source middleware
//! removed (`@segment/analytics-next` in headless Chromium). The library is answered 200 and moves
//! on; the nine valid events are in the input topic, the tenth in the dead-letter topic with its
//! reason; after `dedupe run` the output holds the nine once each.
//!
//! Each test first checks that the ten went out in one request, so a front door that refused the
//! whole batch (as `ingest.on_invalid_event = "refuse-request"` does) fails it: the nine would not
//! be in Kafka.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::browser::{dedupe_and_verify, input_copies, run_browser, run_node, strings};
use kit::{brokers, Record, TestTopic};

use super::{dead_letters, header, KEY_WEB};

/// The client's requests, as its proxy logged them: the ten events went out in one POST, the
/// only one (never sent again), answered 200 naming the invalid event by its place and `code`.
fn assert_one_request_answered_200_naming(requests: &[Value], index: usize, code: &str) {
    let posts: Vec<&Value> = requests.iter().filter(|r| r["method"] == "POST").collect();
    assert_eq!(
        posts.len(),
        1,
        "the ten events did not go out in one request, once: {posts:?}"
    );
    let post = posts[0];
    assert_eq!(post["ids"].as_array().map(Vec::len), Some(10), "{post}");
    assert_eq!(post["status"], 200, "{post}");
    assert_eq!(post["answer"]["success"], true, "{post}");
    let rejected = post["answer"]["rejected"]
        .as_array()
        .unwrap_or_else(|| panic!("the answer names no event: {post}"));
    assert_eq!(rejected.len(), 1, "{post}");
    assert_eq!(
        (rejected[0]["index"].as_u64(), rejected[0]["code"].as_str()),
        (Some(index as u64), Some(code)),
        "{post}"
    );
    assert!(
        rejected[0]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with(&format!("batch[{index}]: "))),
        "{post}"
    );
}

/// The input topic holds the valid events once each and nothing else; the dead-letter topic holds
/// the invalid one alone, with the reason, its place and its route. Returns the dead-letter record.
fn assert_dead_lettered_alone(
    input: &TestTopic,
    valid: &BTreeSet<String>,
    invalid_id: &str,
    index: usize,
    code: &str,
) -> Record {
    let copies = input_copies(&input.name);
    assert_eq!(
        copies.keys().cloned().collect::<BTreeSet<_>>(),
        *valid,
        "the input topic does not hold the nine valid events alone"
    );
    assert!(
        copies.values().all(|&n| n == 1),
        "a valid event is in the input topic more than once: {copies:?}"
    );
    let mut letters = dead_letters(&input.name);
    assert_eq!(
        letters.len(),
        1,
        "the dead-letter topic does not hold one record: {letters:?}"
    );
    let letter = letters.remove(0);
    assert_eq!(
        header(&letter, "dedupe-reason"),
        Some(code),
        "{:?}",
        letter.headers
    );
    assert_eq!(
        header(&letter, "dedupe-index"),
        Some(index.to_string().as_str()),
        "{:?}",
        letter.headers
    );
    assert_eq!(
        header(&letter, "dedupe-endpoint"),
        Some("batch"),
        "{:?}",
        letter.headers
    );
    assert_eq!(
        header(&letter, "dedupe-source"),
        Some("web"),
        "{:?}",
        letter.headers
    );
    assert!(
        header(&letter, "dedupe-error")
            .is_some_and(|e| e.starts_with(&format!("batch[{index}]: "))),
        "{:?}",
        letter.headers
    );
    let value: Value = serde_json::from_slice(letter.value.as_deref().unwrap()).unwrap();
    assert_eq!(value["messageId"], invalid_id, "{value}");
    letter
}

#[test]
fn analytics_node_batches_ten_with_one_overlong_message_id_and_the_nine_arrive_once() {
    let input = TestTopic::create("ingest-node-invalid", 2);
    let ingest = super::start_ingest(&brokers(), &input.name, &[]);
    ingest.wait_ready(200);
    let url = format!("http://{}", ingest.addr);
    let out = run_node(
        "node_invalid_event.mjs",
        &[("INGEST_URL", url.as_str()), ("WRITE_KEY", KEY_WEB)],
        &ingest,
    );
    // The 200 made the library move on: it reported no event as failed.
    assert_eq!(
        out["errors"],
        json!([]),
        "the library reported errors: {out}"
    );
    let valid: BTreeSet<String> = strings(&out["valid"]).into_iter().collect();
    let index = out["invalid"]["index"].as_u64().unwrap() as usize;
    let invalid = out["invalid"]["messageId"].as_str().unwrap();
    assert_eq!((valid.len(), invalid.len()), (9, 300), "{out}");

    assert_one_request_answered_200_naming(
        out["requests"].as_array().unwrap(),
        index,
        "bad_message_id",
    );
    let letter = assert_dead_lettered_alone(&input, &valid, invalid, index, "bad_message_id");
    // An id the API cannot use keys nothing; the event is otherwise the library's, as sent.
    assert_eq!(letter.key, None);
    let value: Value = serde_json::from_slice(letter.value.as_deref().unwrap()).unwrap();
    assert_eq!(
        (value["event"].as_str(), value["properties"]["i"].as_u64()),
        (Some("Clicked"), Some(index as u64)),
        "{value}"
    );
    assert_eq!(
        value["context"]["library"]["name"], "@segment/analytics-node",
        "{value}"
    );
    dedupe_and_verify(&input, &valid);
}

#[test]
fn analytics_next_in_chromium_batches_ten_with_one_nameless_track_and_the_nine_arrive_once() {
    let input = TestTopic::create("ingest-browser-invalid", 2);
    let (_ingest, page_origin, out) =
        run_browser(&input, &[("SCENARIO", "invalid-event"), ("HOLD_MS", "0")]);
    let scenarios = out["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), 1, "{out}");
    let scenario = &scenarios[0];
    let valid: BTreeSet<String> = strings(&scenario["expected"]).into_iter().collect();
    let invalid = scenario["invalid"].as_str().unwrap();
    assert_eq!(valid.len(), 9, "{out}");

    // The batch went to the batching strategy's route from the page's origin; its place in the
    // batch is where the library put it.
    let requests = scenario["requests"].as_array().unwrap();
    let post = requests
        .iter()
        .find(|r| r["method"] == "POST")
        .unwrap_or_else(|| panic!("no POST: {requests:?}"));
    assert_eq!(
        (post["path"].as_str(), post["origin"].as_str()),
        (Some("/v1/b"), Some(page_origin.as_str())),
        "{post}"
    );
    let index = strings(&post["ids"])
        .iter()
        .position(|id| id == invalid)
        .unwrap_or_else(|| panic!("{post}"));
    assert_one_request_answered_200_naming(requests, index, "missing_event");
    let letter = assert_dead_lettered_alone(&input, &valid, invalid, index, "missing_event");
    // The id is usable, so the record is keyed by it; the event is the library's, without its name.
    assert_eq!(
        letter.key.as_deref(),
        Some(format!("web:{invalid}").as_bytes())
    );
    let value: Value = serde_json::from_slice(letter.value.as_deref().unwrap()).unwrap();
    assert_eq!(
        (value["type"].as_str(), value.get("event")),
        (Some("track"), None),
        "{value}"
    );
    assert_eq!(
        value["context"]["library"]["name"], "analytics.js",
        "{value}"
    );
    dedupe_and_verify(&input, &valid);
}

//! The front door's limits on the real binary: each source's rate limit (429 with the wait in
//! `Retry-After` and `x-ratelimit-reset`, counted by reason) and the bound on requests in flight
//! (503 before a body is read).

use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::common::{brokers, consume_all, TestTopic};
use super::{basic, open_with, Ingest, KEY_IOS, KEY_WEB};

fn events(n: usize, tag: &str) -> Value {
    let batch: Vec<Value> =
        (0..n).map(|i| json!({"type": "track", "event": "e", "userId": "u", "messageId": format!("{tag}-{i}")})).collect();
    json!({ "batch": batch })
}

#[test]
fn a_source_over_its_rate_is_answered_429_with_the_wait_and_others_are_not() {
    let topic = TestTopic::create("ingest-rate", 1);
    let ingest = Ingest::start(
        &brokers(),
        &topic.name,
        // One event a second: what refills while the first requests wait for Kafka (a first
        // produce to a new topic can take a few hundred ms) stays under one event. At 10 a second
        // the third request found a token often enough to fail the test.
        &[("DEDUPE_INGEST_RATE_LIMIT_EVENTS_PER_SEC", "1"), ("DEDUPE_INGEST_RATE_LIMIT_BURST_EVENTS", "30")],
    );
    // The burst passes at once, in any shape: 20 events on the batch route, 10 on the short one.
    assert_eq!(ingest.post_json("/v1/batch", Some(KEY_WEB), &events(20, "a")).status, 200);
    assert_eq!(ingest.post_json("/v1/b", Some(KEY_WEB), &events(10, "b")).status, 200);
    // The next request is over: 429, with how long to wait, and nothing produced.
    let started = Instant::now();
    let r = ingest.post_json("/v1/t", Some(KEY_WEB), &json!({"event": "e", "userId": "u", "messageId": "c-0"}));
    assert_eq!((r.status, r.json()["code"].as_str()), (429, Some("rate_limited")), "{:?}", r.json());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("1"));
    assert!(r.json()["message"].as_str().unwrap().contains("retry in 1 s"));
    // Another source has a bucket of its own.
    assert_eq!(ingest.post_json("/v1/batch", Some(KEY_IOS), &events(30, "ios")).status, 200);
    // Once the wait is over, the same request passes.
    std::thread::sleep(Duration::from_secs(1).saturating_sub(started.elapsed()) + Duration::from_millis(50));
    let r = ingest.post_json("/v1/t", Some(KEY_WEB), &json!({"event": "e", "userId": "u", "messageId": "c-0"}));
    assert_eq!(r.status, 200, "{:?}", r.json());

    assert_eq!(ingest.metric("dedupe_ingest_rejected_total", &[("reason", "rate_limited")]), 1.0);
    assert_eq!(ingest.metric("dedupe_ingest_requests_total", &[("status", "429")]), 1.0);
    assert_eq!(consume_all(&topic.name, false).len(), 20 + 10 + 30 + 1);
}

#[test]
fn past_the_in_flight_limit_a_request_is_answered_503_unread_and_the_next_one_passes() {
    let topic = TestTopic::create("ingest-in-flight", 1);
    let ingest = Ingest::start(
        &brokers(),
        &topic.name,
        &[("DEDUPE_INGEST_MAX_IN_FLIGHT_REQUESTS", "2"), ("DEDUPE_INGEST_REQUEST_TIMEOUT_MS", "1500")],
    );
    ingest.wait_ready(200);
    // Two requests whose bodies never finish arriving hold both places.
    let head = format!(
        "POST /v1/b HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n{{\"batch\":",
        basic(KEY_WEB)
    );
    let held: Vec<_> = (0..2).map(|_| open_with(ingest.addr, head.as_bytes())).collect();
    std::thread::sleep(Duration::from_millis(300));

    // A third is refused at once, with the reason, and its connection closed.
    let started = Instant::now();
    let r = ingest.post_json("/v1/batch", Some(KEY_WEB), &events(1, "refused"));
    assert_eq!((r.status, r.json()["code"].as_str()), (503, Some("too_many_requests_in_flight")), "{:?}", r.json());
    assert!(started.elapsed() < Duration::from_secs(1), "the refusal took {:?}", started.elapsed());
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(ingest.metric("dedupe_ingest_rejected_total", &[("reason", "too_many_requests_in_flight")]), 1.0);

    // The held requests time out (408) and free their places; then requests pass again.
    for mut stream in held {
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 408"), "{}", String::from_utf8_lossy(&answer));
    }
    let r = ingest.post_json("/v1/batch", Some(KEY_WEB), &events(1, "after"));
    assert_eq!(r.status, 200, "{:?}", r.json());
    let records = consume_all(&topic.name, false);
    assert_eq!(records.len(), 1, "only the request after the limit was produced");
}

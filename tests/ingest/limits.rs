//! The front door's limits on the real binary: each source's rate limit, every event charged (429
//! with the wait in `Retry-After` and `x-ratelimit-reset`, counted by reason), the bound on
//! requests in flight (503, taken only once a body has arrived), the bound on keyless bodies
//! (trickling clients without a key cannot starve one with a key), and logs that a flood of
//! refusals cannot fill.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use kit::{brokers, consume_all, TestTopic};

use super::{basic, KEY_IOS, KEY_WEB};

fn events(n: usize, tag: &str) -> Value {
    let batch: Vec<Value> =
        (0..n).map(|i| json!({"type": "track", "event": "e", "userId": "u", "messageId": format!("{tag}-{i}")})).collect();
    json!({ "batch": batch })
}

#[test]
fn a_source_over_its_rate_is_answered_429_with_the_wait_and_others_are_not() {
    let topic = TestTopic::create("ingest-rate", 1);
    let ingest = super::start_ingest(
        &brokers(),
        &topic.name,
        // One event a second: what refills while the first requests wait for Kafka (a first
        // produce to a new topic can take a few hundred ms) stays under one event. At 10 a second
        // the third request found a token often enough to fail the test.
        &[
            ("DEDUPE_INGEST_RATE_LIMIT_EVENTS_PER_SEC", "1"),
            ("DEDUPE_INGEST_RATE_LIMIT_BURST_EVENTS", "30"),
        ],
    );
    // The burst passes at once, in any shape: 20 events on the batch route, 10 on the short one.
    assert_eq!(
        ingest
            .post_json("/v1/batch", Some(KEY_WEB), &events(20, "a"))
            .status,
        200
    );
    assert_eq!(
        ingest
            .post_json("/v1/b", Some(KEY_WEB), &events(10, "b"))
            .status,
        200
    );
    // The next request is over: 429, with how long to wait, and nothing produced.
    let started = Instant::now();
    let r = ingest.post_json(
        "/v1/t",
        Some(KEY_WEB),
        &json!({"event": "e", "userId": "u", "messageId": "c-0"}),
    );
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (429, Some("rate_limited")),
        "{:?}",
        r.json()
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("1"));
    assert!(r.json()["message"]
        .as_str()
        .unwrap()
        .contains("retry in 1 s"));
    // Another source has a bucket of its own.
    assert_eq!(
        ingest
            .post_json("/v1/batch", Some(KEY_IOS), &events(30, "ios"))
            .status,
        200
    );
    // Once the wait is over, the same request passes.
    std::thread::sleep(
        Duration::from_secs(1).saturating_sub(started.elapsed()) + Duration::from_millis(50),
    );
    let r = ingest.post_json(
        "/v1/t",
        Some(KEY_WEB),
        &json!({"event": "e", "userId": "u", "messageId": "c-0"}),
    );
    assert_eq!(r.status, 200, "{:?}", r.json());

    assert_eq!(
        ingest.metric(
            "dedupe_ingest_rejected_total",
            &[("reason", "rate_limited")]
        ),
        1.0
    );
    assert_eq!(
        ingest.metric("dedupe_ingest_requests_total", &[("status", "429")]),
        1.0
    );
    assert_eq!(consume_all(&topic.name, false).len(), 20 + 10 + 30 + 1);
}

#[test]
fn the_rate_limit_charges_every_event_so_large_batches_cannot_bypass_it() {
    let topic = TestTopic::create("ingest-rate-every-event", 1);
    let ingest = super::start_ingest(
        &brokers(),
        &topic.name,
        &[
            ("DEDUPE_INGEST_RATE_LIMIT_EVENTS_PER_SEC", "20"),
            ("DEDUPE_INGEST_RATE_LIMIT_BURST_EVENTS", "20"),
        ],
    );
    ingest.wait_ready(200);
    // For 10 s, a 5,000-event batch and a 15-event one in turn, as fast as answers come.
    let started = Instant::now();
    let (mut accepted, mut over_burst, mut sent) = (0usize, 0usize, 0usize);
    while started.elapsed() < Duration::from_secs(10) {
        let size = if sent % 2 == 0 { 5_000 } else { 15 };
        let r = ingest.post_json("/v1/b", Some(KEY_WEB), &events(size, &format!("r{sent}")));
        sent += 1;
        match (r.status, r.json()["code"].as_str()) {
            (200, _) => accepted += size,
            (429, Some("over_burst")) => {
                over_burst += 1;
                assert_eq!(size, 5_000);
                assert!(
                    r.header("retry-after").is_some() && r.header("x-ratelimit-reset").is_some()
                );
            }
            (429, Some("rate_limited")) => {}
            other => panic!("answered {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let landed = consume_all(&topic.name, false).len();
    eprintln!("rate limit: {sent} requests, {accepted} events accepted in {elapsed:.1} s, {over_burst} over the burst");
    // At most the burst plus the rate over the span, every event counted; and the small
    // batches do get through.
    assert_eq!(landed, accepted);
    assert!(
        landed as f64 <= 20.0 + 20.0 * elapsed,
        "{landed} events in {elapsed:.1} s"
    );
    assert!(
        landed >= 100,
        "only {landed} events passed in {elapsed:.1} s"
    );
    assert!(over_burst >= sent / 2 - 1, "{over_burst} of {sent}");
    assert!(
        ingest.metric("dedupe_ingest_rejected_total", &[("reason", "over_burst")])
            >= over_burst as f64
    );
}

#[test]
fn past_the_in_flight_limit_a_request_is_answered_503_and_the_next_one_passes() {
    let topic = TestTopic::create("ingest-in-flight", 1);
    let ingest = super::start_ingest(
        &brokers(),
        &topic.name,
        // Each request holds its place for 3 s (the failpoint waits without blocking the server).
        &[
            ("DEDUPE_INGEST_MAX_IN_FLIGHT_REQUESTS", "2"),
            ("FAILPOINTS", "ingest-in-flight=return(3000)"),
        ],
    );
    ingest.wait_ready(200);
    // Two whole requests hold both places.
    let addr = ingest.addr;
    let held: Vec<_> = (0..2)
        .map(|i| {
            let body = events(1, &format!("held-{i}")).to_string();
            std::thread::spawn(move || {
                kit::http::request(
                    addr,
                    "POST",
                    "/v1/batch",
                    &[
                        ("Authorization", &basic(KEY_WEB)),
                        ("Content-Type", "application/json"),
                    ],
                    body.as_bytes(),
                )
                .unwrap()
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ingest.metric("dedupe_ingest_requests_in_flight", &[]) < 2.0 {
        assert!(
            Instant::now() < deadline,
            "two requests were not in flight within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A third, whole too, is refused at once, with the reason, and produces nothing.
    let started = Instant::now();
    let r = ingest.post_json("/v1/batch", Some(KEY_WEB), &events(1, "refused"));
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (503, Some("too_many_requests_in_flight")),
        "{:?}",
        r.json()
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the refusal took {:?}",
        started.elapsed()
    );
    assert_eq!(
        ingest.metric(
            "dedupe_ingest_rejected_total",
            &[("reason", "too_many_requests_in_flight")]
        ),
        1.0
    );
    // The held ones finish; then requests pass again.
    for h in held {
        assert_eq!(h.join().unwrap().status, 200);
    }
    let r = ingest.post_json("/v1/batch", Some(KEY_WEB), &events(1, "after"));
    assert_eq!(r.status, 200, "{:?}", r.json());
    let ids: Vec<String> = consume_all(&topic.name, false)
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(r.value.as_deref().unwrap()).unwrap()["messageId"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(!ids.iter().any(|id| id.starts_with("refused")), "{ids:?}");
}

#[test]
fn keyless_trickling_clients_cannot_starve_a_client_with_a_key() {
    // The defaults, as deployed: 512 connections, 64 places in flight, keyless bodies bounded.
    let topic = TestTopic::create("ingest-trickle", 1);
    let ingest = super::start_ingest(&brokers(), &topic.name, &[]);
    ingest.wait_ready(200);
    // 200 connections that send a keyless text/plain body to /v1/t one byte every half second,
    // each opening a new connection when its last is closed, for 12 s.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addr = ingest.addr;
    let slow: Vec<_> = (0..200)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut opened = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if opened > 0 {
                        // A new connection a little after the last was closed, not in a tight loop.
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else { continue };
                    let head = "POST /v1/t HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n{";
                    if s.write_all(head.as_bytes()).is_err() {
                        continue;
                    }
                    opened += 1;
                    let _ = super::trickle_until_closed(&mut s, b"\"writeKey\":\"x\",", Duration::from_millis(500), Duration::from_secs(13));
                }
                opened
            })
        })
        .collect();
    // Let them all connect and start trickling.
    let deadline = Instant::now() + Duration::from_secs(10);
    while ingest.metric("dedupe_ingest_body_reads", &[("key", "keyless")]) < 10.0 {
        assert!(
            Instant::now() < deadline,
            "the trickling clients never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A client with a key sends a request every 50 ms meanwhile.
    let started = Instant::now();
    let (mut ok, mut total) = (0, 0);
    let mut other: BTreeMap<u16, usize> = BTreeMap::new();
    while started.elapsed() < Duration::from_secs(12) {
        let r = ingest.post_json(
            "/v1/batch",
            Some(KEY_WEB),
            &events(1, &format!("keyed-{total}")),
        );
        total += 1;
        if r.status == 200 {
            ok += 1;
        } else {
            *other.entry(r.status).or_default() += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opened: usize = slow.into_iter().map(|h| h.join().unwrap()).sum();
    let refused = ingest.metric(
        "dedupe_ingest_rejected_total",
        &[("reason", "too_many_keyless_reads")],
    );
    let timed_out = ingest.metric(
        "dedupe_ingest_rejected_total",
        &[("reason", "request_timeout")],
    );
    eprintln!("trickle: keyed {ok}/{total} answered 200 (others {other:?}); {opened} slow connections, {refused} refused at once, {timed_out} timed out");
    assert!(
        ok as f64 >= 0.99 * total as f64,
        "a keyed client got {ok} of {total} answered 200 ({other:?})"
    );
    assert!(
        refused + timed_out > 0.0,
        "the trickling clients were neither refused nor timed out"
    );
}

#[test]
fn a_flood_of_refusals_logs_a_few_lines_and_counts_every_one() {
    let topic = TestTopic::create("ingest-log-flood", 1);
    let ingest = super::start_ingest(&brokers(), &topic.name, &[]);
    // 2,000 requests with an unknown key, as fast as they are answered.
    let body = events(1, "flood");
    for _ in 0..2_000 {
        assert_eq!(
            ingest
                .post_json("/v1/batch", Some("not-a-key"), &body)
                .status,
            401
        );
    }
    assert_eq!(
        ingest.metric(
            "dedupe_ingest_rejected_total",
            &[("reason", "unknown_write_key")]
        ),
        2_000.0
    );
    let lines = ingest
        .log_text()
        .lines()
        .filter(|l| l.contains("Refused a request."))
        .count();
    let suppressed = ingest.metric(
        "dedupe_ingest_log_lines_suppressed_total",
        &[("reason", "unknown_write_key")],
    );
    eprintln!("log flood: {lines} lines for 2000 refusals, {suppressed} not written");
    // The first line, then at most one per 10 s.
    assert!(
        (1..=3).contains(&lines),
        "{lines} log lines for 2000 refusals"
    );
    assert_eq!(suppressed, 2_000.0 - lines as f64);
}

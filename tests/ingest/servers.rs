//! Segment's server libraries that post batches to `/v1/import`, the batch endpoint's older name
//! (the Java, Ruby and .NET libraries; the Java one to `/v1/import/`, with a trailing slash):
//! `analytics-java` from Maven Central, run by the JVM against the real `dedupe ingest` and broker,
//! ending with `dedupe run` and `verify`.
//!
//! The Java program is `tests/java/AnalyticsJavaClient.java`; `tests/java/install.sh` resolves
//! the library (pinned by `tests/java/pom.xml`) with Maven and this test runs it first.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::{json, Value};

use super::browser::{dedupe_and_verify, input_copies, run_client, strings};
use kit::Ingest;
use kit::{brokers, TestTopic};

use super::KEY_WEB;

/// Runs `tests/java/AnalyticsJavaClient.java` on analytics-java's classpath; returns the JSON line
/// it prints.
fn run_java_client(env: &[(&str, &str)], ingest: &Ingest) -> Value {
    let java_dir = kit::repo_root().join("tests/java");
    let install = Command::new(java_dir.join("install.sh"))
        .output()
        .expect("run tests/java/install.sh");
    assert!(
        install.status.success(),
        "tests/java/install.sh failed:\n{}",
        String::from_utf8_lossy(&install.stderr)
    );
    let classpath_file = String::from_utf8_lossy(&install.stdout).trim().to_string();
    let classpath = std::fs::read_to_string(&classpath_file)
        .unwrap_or_else(|e| panic!("{classpath_file}: {e}"));
    let mut cmd = Command::new("java");
    cmd.arg("-cp")
        .arg(classpath.trim())
        .arg("AnalyticsJavaClient.java")
        .current_dir(&java_dir);
    run_client(
        cmd,
        "java AnalyticsJavaClient.java",
        "install a JDK 17 or newer",
        env,
        ingest,
    )
}

#[test]
fn analytics_java_posts_to_import_retries_a_lost_answer_and_every_event_arrives_once() {
    let input = TestTopic::create("ingest-java", 3);
    let ingest = super::start_ingest(&brokers(), &input.name, &[]);
    ingest.wait_ready(200);
    let url = format!("http://{}", ingest.addr);
    let out = run_java_client(
        &[("INGEST_URL", url.as_str()), ("WRITE_KEY", KEY_WEB)],
        &ingest,
    );
    assert_eq!(
        out["complete"], true,
        "the library did not answer for every message: {out}"
    );
    assert_eq!(
        out["failures"],
        json!([]),
        "the library reported failures: {out}"
    );
    let delivered: BTreeSet<String> = strings(&out["delivered"]).into_iter().collect();
    assert_eq!(delivered.len(), 25, "{out}");

    // Every request went to the library's own route, and each was taken.
    let requests = out["requests"].as_array().unwrap();
    assert!(
        requests
            .iter()
            .all(|r| r["path"] == "/v1/import/" && r["status"] == 200),
        "{requests:?}"
    );
    // The lost answer: that batch reached Kafka, and the library sent the same messageIds again.
    let dropped: Vec<&Value> = requests.iter().filter(|r| r["dropped"] == true).collect();
    assert_eq!(dropped.len(), 1, "{requests:?}");
    let dropped_ids: BTreeSet<String> = strings(&dropped[0]["ids"]).into_iter().collect();
    assert_eq!(
        dropped_ids.len(),
        10,
        "the first batch holds ten messages: {requests:?}"
    );
    let resent = requests.iter().filter(|r| {
        r["dropped"] == false
            && strings(&r["ids"]).into_iter().collect::<BTreeSet<_>>() == dropped_ids
    });
    assert_eq!(
        resent.count(),
        1,
        "the batch was not sent again with the same messageIds: {requests:?}"
    );

    // Kafka holds the lost batch twice; after the worker, the output holds every message once.
    let copies = input_copies(&input.name);
    assert_eq!(
        copies.keys().cloned().collect::<BTreeSet<_>>(),
        delivered,
        "{copies:?}"
    );
    assert!(
        copies
            .iter()
            .all(|(id, &n)| n == if dropped_ids.contains(id) { 2 } else { 1 }),
        "{copies:?}"
    );
    // `/v1/import` is the batch endpoint, and counted as such.
    let answered = ingest.metric(
        "dedupe_ingest_requests_total",
        &[("endpoint", "batch"), ("status", "200")],
    );
    assert_eq!(answered, requests.len() as f64);
    dedupe_and_verify(&input, &delivered);
}

#[test]
fn import_and_a_trailing_slash_reach_the_same_endpoints() {
    let topic = TestTopic::create("ingest-import-routes", 2);
    let ingest = super::start_ingest(&brokers(), &topic.name, &[]);
    ingest.wait_ready(200);
    let batch = |id: &str| json!({"batch": [{"type": "track", "event": "e", "userId": "u", "messageId": id}]});
    for (path, id) in [
        ("/v1/import", "imp-1"),
        ("/v1/import/", "imp-2"),
        ("/v1/batch/", "imp-3"),
    ] {
        let r = ingest.post_json(path, Some(KEY_WEB), &batch(id));
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let r = ingest.post_json(
        "/v1/t/",
        Some(KEY_WEB),
        &json!({"event": "e", "userId": "u", "messageId": "imp-4"}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // Invalid events, unreadable bodies and unknown names are treated on these paths as on the
    // others.
    let r = ingest.post_json(
        "/v1/import/",
        Some(KEY_WEB),
        &json!({"batch": [{"type": "track", "userId": "u"}]}),
    );
    assert_eq!(
        (r.status, r.json()["rejected"][0]["code"].as_str()),
        (200, Some("missing_event")),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let r = ingest.post(
        "/v1/import/",
        &[("Authorization", &super::basic(KEY_WEB))],
        b"{\"batch\":[",
    );
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    let r = ingest.post_json("/v1/import", Some("no-such-key"), &batch("imp-5"));
    assert_eq!(r.status, 401);
    let r = ingest.post_json("/v1/imports/", Some(KEY_WEB), &batch("imp-6"));
    assert_eq!(r.status, 404);
    assert!(String::from_utf8_lossy(&r.body).contains("unknown_endpoint"));
    // Another method on a message route is 405, naming the one it takes.
    for (method, path) in [
        ("GET", "/v1/track"),
        ("PUT", "/v1/import/"),
        ("DELETE", "/v1/b"),
    ] {
        let r = ingest.request(method, path, &[], b"");
        assert_eq!(
            (r.status, r.header("allow")),
            (405, Some("POST")),
            "{method} {path}"
        );
        assert_eq!(r.json()["code"], "method_not_allowed", "{method} {path}");
    }
    let ids: BTreeSet<String> = input_copies(&topic.name).into_keys().collect();
    assert_eq!(
        ids,
        ["imp-1", "imp-2", "imp-3", "imp-4"]
            .map(String::from)
            .into_iter()
            .collect()
    );
}

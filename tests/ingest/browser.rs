//! The routes Segment's browser and mobile libraries use (`/v1/t` ... `/v1/b`, `text/plain`,
//! `navigator.sendBeacon`), CORS, the settings document, and the libraries themselves:
//! `@segment/analytics-node` from Node and `@segment/analytics-next` in a real headless Chromium,
//! each against the real `dedupe ingest` and broker, each ending with `dedupe run` and `verify`.
//!
//! The JavaScript is in `tests/js/` (pinned by its package-lock.json); `npm ci --prefix tests/js`
//! installs it (deploy/local/install-deps.sh does), and the browser is Debian's `chromium`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use kit::{brokers, consume_all, wait_for_records, TestTopic};
use kit::{free_port, Ingest};

use super::{basic, DEDUPE, KEY_IOS, KEY_WEB};

/// Messages by the key they were produced under.
fn by_key(topic: &str) -> BTreeMap<String, Value> {
    consume_all(topic, false)
        .iter()
        .map(|r| {
            (
                String::from_utf8(r.key.clone().unwrap()).unwrap(),
                serde_json::from_slice(r.value.as_deref().unwrap()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn the_one_letter_routes_take_json_as_text_plain_and_from_a_beacon() {
    let topic = TestTopic::create("ingest-browser-routes", 2);
    let ingest = super::start_ingest(&brokers(), &topic.name, &[]);
    let auth = basic(KEY_WEB);

    // The browser library's standard strategy: one event per request to the type's first letter,
    // as text/plain, with Basic auth; each content type the API takes, once.
    let singles = [
        (
            "t",
            "text/plain",
            json!({"userId": "u", "event": "Clicked", "messageId": "b-t"}),
        ),
        (
            "i",
            "application/json",
            json!({"userId": "u", "traits": {}, "messageId": "b-i"}),
        ),
        (
            "p",
            "",
            json!({"anonymousId": "a", "name": "Home", "messageId": "b-p"}),
        ),
        (
            "s",
            "text/plain",
            json!({"anonymousId": "a", "name": "Feed", "messageId": "b-s"}),
        ),
        (
            "g",
            "text/plain",
            json!({"userId": "u", "groupId": "g", "messageId": "b-g"}),
        ),
        (
            "a",
            "text/plain",
            json!({"previousId": "a", "userId": "u", "messageId": "b-a"}),
        ),
    ];
    for (letter, content_type, body) in &singles {
        let mut headers = vec![("Authorization", auth.as_str())];
        if !content_type.is_empty() {
            headers.push(("Content-Type", *content_type));
        }
        let r = ingest.request(
            "POST",
            &format!("/v1/{letter}"),
            &headers,
            body.to_string().as_bytes(),
        );
        assert_eq!(
            (r.status, r.json()),
            (200, json!({"success": true})),
            "/v1/{letter} as {content_type:?}"
        );
    }
    // Its batching strategy and the mobile libraries: /v1/b with the key in the body.
    let batch = json!({"writeKey": KEY_IOS, "batch": [
        {"type": "track", "event": "Opened", "userId": "u", "messageId": "b-b1"},
        {"type": "screen", "name": "Feed", "userId": "u", "messageId": "b-b2"}]});
    let r = ingest.request(
        "POST",
        "/v1/b",
        &[("Content-Type", "text/plain")],
        batch.to_string().as_bytes(),
    );
    assert_eq!((r.status, r.json()), (200, json!({"success": true})));
    // navigator.sendBeacon: text/plain;charset=UTF-8, no Authorization, the key in the body.
    let beacon = json!({"writeKey": KEY_WEB, "type": "track", "event": "Left", "anonymousId": "a", "messageId": "b-beacon"});
    let r = ingest.request(
        "POST",
        "/v1/t",
        &[
            ("Content-Type", "text/plain;charset=UTF-8"),
            ("Origin", "https://shop.example"),
        ],
        beacon.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{:?}", r.json());

    let got = by_key(&topic.name);
    for (letter, _, _) in &singles {
        let expected_type = match *letter {
            "t" => "track",
            "i" => "identify",
            "p" => "page",
            "s" => "screen",
            "g" => "group",
            _ => "alias",
        };
        assert_eq!(
            got[&format!("web:b-{letter}")]["type"],
            expected_type,
            "/v1/{letter}"
        );
    }
    assert_eq!(got["ios:b-b1"]["event"], "Opened");
    assert_eq!(got["ios:b-b2"]["type"], "screen");
    assert_eq!(got["web:b-beacon"]["event"], "Left");
    assert!(got.values().all(|v| v.get("writeKey").is_none()));
    assert_eq!(got.len(), 9);
    // Without CORS configured, no answer carries a CORS header, even to a request with an Origin.
    assert!(
        r.header("access-control-allow-origin").is_none() && r.header("vary").is_none(),
        "{:?}",
        r.headers
    );
}

#[test]
fn bad_input_on_the_new_routes_is_refused_as_on_the_old_ones() {
    let topic = TestTopic::create("ingest-browser-bad", 1);
    let ingest = super::start_ingest(&brokers(), &topic.name, &[]);
    ingest.wait_ready(200);
    let good = json!({"type": "track", "event": "e", "userId": "u"});
    let text = [("Content-Type", "text/plain")];

    // One bad event costs only itself: the answer names it and where it is, the good one is
    // produced, and the bad one dead-lettered; the same on a single-event route.
    let r = ingest.request(
        "POST",
        "/v1/b",
        &text,
        json!({"writeKey": KEY_WEB, "batch": [good, {"type": "track", "userId": "u"}]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(
        (r.status, r.json()["rejected"][0]["code"].as_str()),
        (200, Some("missing_event")),
        "{:?}",
        r.json()
    );
    assert_eq!(
        r.json()["rejected"][0]["message"],
        "batch[1]: a track message needs an `event` name"
    );
    let r = ingest.request(
        "POST",
        "/v1/g",
        &text,
        json!({"writeKey": KEY_WEB, "userId": "u"})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(
        (r.status, r.json()["rejected"][0]["code"].as_str()),
        (200, Some("missing_group_id")),
        "{:?}",
        r.json()
    );
    // A body that cannot be read is refused whole.
    let r = ingest.request("POST", "/v1/t", &text, b"{\"event\": ");
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (400, Some("malformed_json"))
    );
    // An unknown or missing key in the body is 401.
    let r = ingest.request(
        "POST",
        "/v1/b",
        &text,
        json!({"writeKey": "not-a-key", "batch": [good]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (401, Some("unknown_write_key"))
    );
    let r = ingest.request("POST", "/v1/t", &text, good.to_string().as_bytes());
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (401, Some("missing_write_key"))
    );
    // A body that is not JSON by its type is 415, named.
    let r = ingest.request(
        "POST",
        "/v1/t",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"event=e&userId=u",
    );
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (415, Some("unsupported_content_type"))
    );
    assert!(
        !r.json()["message"].as_str().unwrap().contains("urlencoded"),
        "the header's value is not echoed"
    );
    // Unknown routes stay unknown.
    let r = ingest.request("POST", "/v1/x", &text, good.to_string().as_bytes());
    assert_eq!(r.status, 404);

    // Each refusal is counted by its reason; only the good event beside the bad one was produced,
    // and the two bad events were dead-lettered.
    for (reason, n) in [
        ("missing_event", 1.0),
        ("missing_group_id", 1.0),
        ("unknown_write_key", 1.0),
        ("unsupported_content_type", 1.0),
    ] {
        assert_eq!(
            ingest.metric("dedupe_ingest_rejected_total", &[("reason", reason)]),
            n,
            "{reason}"
        );
    }
    assert_eq!(consume_all(&topic.name, false).len(), 1);
    assert_eq!(
        consume_all(&format!("{}.dead-letter", topic.name), false).len(),
        2
    );
}

#[test]
fn cors_answers_only_the_configured_origins() {
    let topic = TestTopic::create("ingest-cors", 1);
    let allowed = "http://localhost:5000";
    let origins = format!(r#"["{allowed}", "https://shop.example.com"]"#);
    let ingest = super::start_ingest(
        &brokers(),
        &topic.name,
        &[("DEDUPE_INGEST_CORS_ORIGINS", origins.as_str())],
    );
    let preflight = |origin: &str| {
        ingest.request(
            "OPTIONS",
            "/v1/t",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization,content-type",
                ),
            ],
            b"",
        )
    };

    // The preflight from an allowed origin: 204, that origin, the library's headers, a max age.
    let r = preflight(allowed);
    assert_eq!(r.status, 204);
    assert_eq!(r.header("access-control-allow-origin"), Some(allowed));
    let allow_headers = r
        .header("access-control-allow-headers")
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        allow_headers.contains("authorization") && allow_headers.contains("x-retry-count"),
        "{allow_headers}"
    );
    assert!(r
        .header("access-control-allow-methods")
        .unwrap()
        .contains("POST"));
    assert!(r.header("access-control-max-age").is_some());
    // The request itself: the origin, and the rate limit's headers readable by the page.
    let body = json!({"userId": "u", "event": "e", "messageId": "cors-1"}).to_string();
    let auth = basic(KEY_WEB);
    let r = ingest.request(
        "POST",
        "/v1/t",
        &[
            ("Origin", allowed),
            ("Authorization", &auth),
            ("Content-Type", "text/plain"),
        ],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some(allowed));
    assert!(r
        .header("access-control-expose-headers")
        .unwrap()
        .to_ascii_lowercase()
        .contains("retry-after"));
    assert_eq!(r.header("vary"), Some("Origin"));
    // The settings document is readable from an allowed page too.
    let r = ingest.request(
        "GET",
        &format!("/v1/projects/{KEY_WEB}/settings"),
        &[("Origin", allowed)],
        b"",
    );
    assert_eq!(
        (r.status, r.header("access-control-allow-origin")),
        (200, Some(allowed))
    );

    // Another origin (another port, a look-alike host) gets no CORS header at all, and its
    // preflight is refused.
    for other in [
        "http://localhost:5001",
        "https://shop.example.com.evil.io",
        "null",
    ] {
        let r = preflight(other);
        assert_eq!(
            (r.status, r.json()["code"].as_str()),
            (403, Some("cors_origin_not_allowed")),
            "{other}"
        );
        assert!(
            r.headers
                .iter()
                .all(|(k, _)| !k.to_ascii_lowercase().starts_with("access-control-")),
            "{other}: {:?}",
            r.headers
        );
        let r = ingest.request(
            "POST",
            "/v1/t",
            &[
                ("Origin", other),
                ("Authorization", &auth),
                ("Content-Type", "text/plain"),
            ],
            body.as_bytes(),
        );
        assert!(
            r.headers
                .iter()
                .all(|(k, _)| !k.to_ascii_lowercase().starts_with("access-control-")),
            "{other}: {:?}",
            r.headers
        );
    }
    assert_eq!(
        ingest.metric(
            "dedupe_ingest_rejected_total",
            &[("reason", "cors_origin_not_allowed")]
        ),
        3.0
    );
}

#[test]
fn the_wildcard_origin_is_allowed_and_warned_about() {
    let topic = TestTopic::create("ingest-cors-any", 1);
    let ingest = super::start_ingest(
        &brokers(),
        &topic.name,
        &[("DEDUPE_INGEST_CORS_ORIGINS", r#"["*"]"#)],
    );
    let r = ingest.request(
        "OPTIONS",
        "/v1/b",
        &[
            ("Origin", "https://any.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
        b"",
    );
    assert_eq!(
        (r.status, r.header("access-control-allow-origin")),
        (204, Some("*"))
    );
    assert!(
        ingest.log_text().contains("allows every origin"),
        "{}",
        ingest.log_text()
    );
}

#[test]
fn the_settings_document_points_analytics_js_back_here_for_known_keys_only() {
    let topic = TestTopic::create("ingest-settings", 1);
    let ingest = super::start_ingest(&brokers(), &topic.name, &[]);
    let r = ingest.request("GET", &format!("/v1/projects/{KEY_WEB}/settings"), &[], b"");
    assert_eq!(r.status, 200);
    let doc = r.json();
    let segment = &doc["integrations"]["Segment.io"];
    assert_eq!(segment["apiHost"], format!("{}/v1", ingest.addr));
    assert_eq!(segment["protocol"], "http");
    assert_eq!(segment["apiKey"], KEY_WEB);
    assert_eq!(doc["metrics"]["sampleRate"], 0);
    // Built from the configuration alone, so the browser may keep it.
    assert_eq!(r.header("cache-control"), Some("private, max-age=300"));
    // A Host header is never echoed into the document (a shared cache could be poisoned with it).
    let r = ingest.request(
        "GET",
        &format!("/v1/projects/{KEY_WEB}/settings"),
        &[("Host", "evil.example:1")],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json()["integrations"]["Segment.io"]["apiHost"],
        format!("{}/v1", ingest.addr)
    );
    assert!(
        !String::from_utf8_lossy(&r.body).contains("evil"),
        "the request's Host reached the document"
    );

    let r = ingest.request("GET", "/v1/projects/not-a-key/settings", &[], b"");
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (401, Some("unknown_write_key"))
    );
    assert!(
        !ingest.log_text().contains("not-a-key"),
        "a write key from a path was logged"
    );

    // With ingest.public_url the document points there instead, and may be cached.
    let public = super::start_ingest(
        &brokers(),
        &topic.name,
        &[("DEDUPE_INGEST_PUBLIC_URL", "https://track.example.com/seg/")],
    );
    let r = public.request("GET", &format!("/v1/projects/{KEY_IOS}/settings"), &[], b"");
    let doc = r.json();
    assert_eq!(
        doc["integrations"]["Segment.io"]["apiHost"],
        "track.example.com/seg/v1"
    );
    assert_eq!(doc["integrations"]["Segment.io"]["protocol"], "https");
    // By the browser only: a shared cache that ignored `Vary: Origin` must not hand one origin's
    // CORS answer to another.
    assert_eq!(r.header("cache-control"), Some("private, max-age=300"));
    // Listening on every address without a public URL, there is no one address to point at.
    let everywhere = DEDUPE
        .ingest(&topic.name)
        .brokers(&brokers())
        .write_key(KEY_WEB, "web")
        .every_address()
        .start();
    let r = everywhere.request("GET", &format!("/v1/projects/{KEY_WEB}/settings"), &[], b"");
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (503, Some("no_public_url"))
    );
    // Without a public URL, the start warns that HTTPS pages will refuse the http it points to.
    assert!(
        ingest.log_text().contains("ingest.public_url is not set"),
        "{}",
        ingest.log_text()
    );
}

/// `tests/js/`, with its packages installed.
fn js_dir() -> PathBuf {
    let dir = kit::repo_root().join("tests/js");
    assert!(
        dir.join("node_modules/@segment/analytics-next").exists() && dir.join("node_modules/puppeteer-core").exists(),
        "the JavaScript packages are not installed: run `npm ci --prefix tests/js` (deploy/local/install-deps.sh does)"
    );
    dir
}

/// Runs `node tests/js/<script>` with `env`; returns the JSON line it prints.
pub(super) fn run_node(script: &str, env: &[(&str, &str)], ingest: &Ingest) -> Value {
    let mut cmd = Command::new("node");
    cmd.arg(script).current_dir(js_dir());
    run_client(
        cmd,
        &format!("node {script}"),
        "install Node.js 20 or newer",
        env,
        ingest,
    )
}

/// Runs a client of one of Segment's libraries (`what`; `install` says how to get its runtime)
/// with `env` added; it must succeed, and the last line it prints that starts with `{` is its
/// JSON report.
pub(super) fn run_client(
    mut cmd: Command,
    what: &str,
    install: &str,
    env: &[(&str, &str)],
    ingest: &Ingest,
) -> Value {
    let started = Instant::now();
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what} ({install}): {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}\ningest log:\n{}",
        out.status,
        ingest.log_text()
    );
    eprintln!("{what} took {:?}", started.elapsed());
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("{what} printed no JSON:\n{stdout}\n{stderr}"));
    serde_json::from_str(line).unwrap()
}

pub(super) fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// `dedupe run` over `input` until the output holds `expected.len()` messages, then stopped; the
/// output must hold each expected message exactly once, and `dedupe verify` must agree.
pub(super) fn dedupe_and_verify(input: &TestTopic, expected: &BTreeSet<String>) {
    let output = TestTopic::create(
        &format!("{}-out", &input.name[..input.name.len().min(24)]),
        input.partitions,
    );
    let mut worker = super::DEDUPE
        .worker_in_temp_dir(&input.name, &output.name)
        .start();
    wait_for_records(&output.name, expected.len(), Duration::from_secs(90));
    worker.stop_cleanly();
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for r in consume_all(&output.name, true) {
        let value: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        *copies
            .entry(value["messageId"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    let got: BTreeSet<String> = copies.keys().cloned().collect();
    assert_eq!(
        &got, expected,
        "the output's messages are not the ones sent"
    );
    assert!(
        copies.values().all(|&n| n == 1),
        "a message is in the output more than once: {copies:?}"
    );
    let (code, summary) = super::DEDUPE.verify(&input.name, &output.name);
    assert_eq!(code, 0, "dedupe verify: {summary}");
}

/// How many times each message id was produced to `topic`.
pub(super) fn input_copies(topic: &str) -> BTreeMap<String, usize> {
    let mut copies = BTreeMap::new();
    for r in consume_all(topic, false) {
        let value: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        *copies
            .entry(value["messageId"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    copies
}

#[test]
fn analytics_node_retries_a_lost_answer_and_a_rate_limit_and_every_event_arrives_once() {
    let input = TestTopic::create("ingest-node", 3);
    // A rate limit the library's second phase (60 events) must run into.
    let ingest = super::start_ingest(
        &brokers(),
        &input.name,
        &[
            ("DEDUPE_INGEST_RATE_LIMIT_EVENTS_PER_SEC", "20"),
            ("DEDUPE_INGEST_RATE_LIMIT_BURST_EVENTS", "20"),
        ],
    );
    ingest.wait_ready(200);
    let url = format!("http://{}", ingest.addr);
    let out = run_node(
        "node_client.mjs",
        &[("INGEST_URL", url.as_str()), ("WRITE_KEY", KEY_WEB)],
        &ingest,
    );
    assert_eq!(
        out["errors"],
        json!([]),
        "the library reported errors: {out}"
    );

    // The lost answer: the first batch reached Kafka, its answer was dropped, and the library sent
    // the same messageIds again, saying it was a retry.
    let retry_sent: BTreeSet<String> = strings(&out["sent"]["retry"]).into_iter().collect();
    let requests = out["requests"]["retry"].as_array().unwrap();
    let dropped: Vec<&Value> = requests.iter().filter(|r| r["dropped"] == true).collect();
    assert_eq!(dropped.len(), 1, "{requests:?}");
    let dropped_ids: BTreeSet<String> = strings(&dropped[0]["ids"]).into_iter().collect();
    assert_eq!(
        dropped_ids, retry_sent,
        "the first batch held all six messages"
    );
    let resent: BTreeSet<String> = requests
        .iter()
        .filter(|r| r["retryCount"].as_str().is_some_and(|c| c != "0") && r["status"] == 200)
        .flat_map(|r| strings(&r["ids"]))
        .collect();
    assert_eq!(
        resent, retry_sent,
        "the retry did not carry the same messageIds: {requests:?}"
    );

    // The rate limit: answered 429 with Retry-After, the library waited and every event was taken.
    let limited = out["requests"]["rateLimited"].as_array().unwrap();
    let refused: Vec<&Value> = limited.iter().filter(|r| r["status"] == 429).collect();
    assert!(
        !refused.is_empty(),
        "60 events at 20/s were never rate limited: {limited:?}"
    );
    assert!(
        refused.iter().all(|r| r["retryAfter"]
            .as_str()
            .is_some_and(|s| s.parse::<u64>().is_ok_and(|s| s >= 1))),
        "{refused:?}"
    );
    let burst_sent: BTreeSet<String> = strings(&out["sent"]["rateLimited"]).into_iter().collect();
    assert_eq!(burst_sent.len(), 60);
    let accepted: BTreeSet<String> = limited
        .iter()
        .filter(|r| r["status"] == 200)
        .flat_map(|r| strings(&r["ids"]))
        .collect();
    assert_eq!(accepted, burst_sent);
    assert!(
        ingest.metric(
            "dedupe_ingest_rejected_total",
            &[("reason", "rate_limited")]
        ) >= refused.len() as f64
    );

    // Kafka holds the lost batch twice; after the worker, the output holds every event once.
    let copies = input_copies(&input.name);
    assert!(dropped_ids.iter().all(|id| copies[id] == 2), "{copies:?}");
    let expected: BTreeSet<String> = retry_sent.union(&burst_sent).cloned().collect();
    dedupe_and_verify(&input, &expected);
}

/// Starts a front door for `input` that allows a page origin on a free port, and runs
/// `tests/js/browser.mjs` in headless Chromium against it with `env` added; returns the front
/// door, the page's origin and what the script printed.
pub(super) fn run_browser(input: &TestTopic, env: &[(&str, &str)]) -> (Ingest, String, Value) {
    let page_port = free_port();
    let page_origin = format!("http://localhost:{page_port}");
    let origins = format!(r#"["{page_origin}"]"#);
    // The page reaches the API through the script's recording proxy: the settings document
    // points there, as `ingest.public_url` names a deployment's proxy.
    let proxy_port = std::iter::repeat_with(free_port)
        .find(|p| *p != page_port)
        .expect("a second free port");
    let public_url = format!("http://127.0.0.1:{proxy_port}");
    let ingest = super::start_ingest(
        &brokers(),
        &input.name,
        &[
            ("DEDUPE_INGEST_CORS_ORIGINS", origins.as_str()),
            ("DEDUPE_INGEST_PUBLIC_URL", public_url.as_str()),
        ],
    );
    ingest.wait_ready(200);
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&chromium).exists(),
        "no Chromium at {chromium}: apt-get install chromium (deploy/local/install-deps.sh does)"
    );
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let url = format!("http://{}", ingest.addr);
    let port = page_port.to_string();
    let proxy_port = proxy_port.to_string();
    let mut all = vec![
        ("INGEST_URL", url.as_str()),
        ("WRITE_KEY", KEY_WEB),
        ("PAGE_PORT", port.as_str()),
        ("PROXY_PORT", proxy_port.as_str()),
        ("RUN_ID", run_id.as_str()),
        ("CHROMIUM", chromium.as_str()),
    ];
    all.extend_from_slice(env);
    let out = run_node("browser.mjs", &all, &ingest);
    (ingest, page_origin, out)
}

#[test]
fn analytics_next_in_chromium_from_another_origin_in_both_strategies_navigated_away_mid_flight() {
    let input = TestTopic::create("ingest-browser", 3);
    let (_ingest, page_origin, out) = run_browser(&input, &[]);

    let mut expected = BTreeSet::new();
    for scenario in out["scenarios"].as_array().unwrap() {
        let name = scenario["name"].as_str().unwrap();
        let requests = scenario["requests"].as_array().unwrap();
        let ids = strings(&scenario["expected"]);
        // CORS was real: the library's requests came from the page's origin, were preflighted,
        // and were answered with that origin.
        let posts: Vec<&Value> = requests.iter().filter(|r| r["method"] == "POST").collect();
        assert!(
            posts.iter().all(|r| r["origin"] == page_origin.as_str()),
            "{name}: {posts:?}"
        );
        assert!(
            requests.iter().any(|r| r["method"] == "OPTIONS"
                && r["status"] == 204
                && r["allowOrigin"] == page_origin.as_str()),
            "{name}: no preflight: {requests:?}"
        );
        assert!(
            requests.iter().any(|r| r["method"] == "GET"
                && r["path"].as_str().unwrap().ends_with("/settings")
                && r["status"] == 200),
            "{name}: the settings were not loaded from the API: {requests:?}"
        );
        // Every POST was JSON as text/plain, to the routes of its strategy, and taken.
        assert!(
            posts.iter().all(|r| r["contentType"]
                .as_str()
                .is_some_and(|t| t.starts_with("text/plain"))
                && r["status"] == 200),
            "{name}: {posts:?}"
        );
        let paths: BTreeSet<&str> = posts.iter().map(|r| r["path"].as_str().unwrap()).collect();
        let event_paths: BTreeSet<&str> = paths
            .iter()
            .copied()
            .filter(|p| *p != "/v1/t" || name == "standard")
            .collect();
        match name {
            "standard" => assert_eq!(
                event_paths,
                BTreeSet::from(["/v1/t", "/v1/i", "/v1/p", "/v1/g", "/v1/a"]),
                "{name}"
            ),
            _ => assert!(
                event_paths.contains("/v1/b") && event_paths.iter().all(|p| *p == "/v1/b"),
                "{name}: {paths:?}"
            ),
        }
        // The page was left while requests were in flight: the ingest had taken them, and their
        // answers were not yet passed on (or never could be).
        let left_at = scenario["leftAt"].as_i64().unwrap();
        let in_flight = posts.iter().filter(|r| {
            r["receivedAt"].as_i64().unwrap() < left_at
                && (r["clientGone"] == true || r["answeredAt"].as_i64().is_none_or(|a| a > left_at))
        });
        assert!(
            in_flight.count() > 0,
            "{name}: nothing was in flight when the page was left: {posts:?}"
        );
        expected.extend(ids);
    }
    assert_eq!(expected.len(), 2 * 2 + 9 + 13, "{out}");

    // Whatever the library sent twice, the worker lets through once.
    let copies = input_copies(&input.name);
    let sent: BTreeSet<String> = copies.keys().cloned().collect();
    assert_eq!(
        sent, expected,
        "the input topic holds other messages than the pages sent"
    );
    eprintln!(
        "browser: {} events, {} records in the input topic",
        expected.len(),
        copies.values().sum::<usize>()
    );
    dedupe_and_verify(&input, &expected);
}

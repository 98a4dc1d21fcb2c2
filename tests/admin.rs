//! The worker's admin endpoints against the real broker and the real binary: every route, and
//! every path under `/admin`, is behind the one guard, and no route is registered outside it;
//! without a token, what a browser page can send (a cross-site form, a DNS name rebound to
//! loopback) is refused; requests in a loop take at most one snapshot per
//! `snapshots.min_interval_secs` (the default here), so the ledger's files and the worker's open
//! descriptors stay flat; with a token, the bearer scheme is taken in any case; `explain` answers
//! from the running worker and from a stopped worker's ledger.

use std::path::Path;
use std::time::{Duration, Instant};

use dedupe::metrics as m;
use kit::*;

/// The binary under test, built by cargo for this test run.
const DEDUPE: Dedupe = Dedupe::at(env!("CARGO_BIN_EXE_dedupe"));

const SNAPSHOT: &str = "/admin/snapshot";
/// Requests sent in a loop; on this machine they take a few seconds, well within the default
/// minute between snapshots.
const LOOP_REQUESTS: usize = 1_000;
/// Records produced between requests every this many, so that a checkpoint taken for a request
/// would have new ids to write out (a file each) had the pace not refused it.
const PRODUCE_EVERY: usize = 50;
/// What the ledger's files and the worker's descriptors may move by while the requests run
/// (background work of RocksDB and librdkafka, a connection still closing).
const SST_SLACK: usize = 3;
const FD_SLACK: usize = 8;

#[test]
fn browsers_cannot_trigger_a_snapshot_and_a_loop_of_requests_takes_one_per_interval() {
    let input = TestTopic::create("admin-in", 1);
    let output = TestTopic::create("admin-out", 1);
    let dir = tempfile::tempdir().unwrap();
    let snapshots = dir.path().join("snapshots");
    let ledger = dir.path().join("ledger");
    // No admin token, and the default snapshots.min_interval_secs (60).
    let spec = DEDUPE
        .worker(&input.name, &output.name, &ledger)
        .env("DEDUPE_SNAPSHOTS_DIR", snapshots.to_str().unwrap());
    produce_full(&input.name, &keyed(&ids(200).iter().collect::<Vec<_>>()));
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 200, Duration::from_secs(60));
    let port = worker.metrics_port.to_string();

    // (a) What a browser page sends is refused, each with the reason in its body and counted.
    let foreign_host = format!("evil.example:{port}");
    let browser_requests: [(&str, &str, &str); 3] = [
        ("Origin", "https://evil.example", "Origin header"),
        ("Sec-Fetch-Site", "cross-site", "Sec-Fetch-Site"),
        ("Host", &foreign_host, "Host header"),
    ];
    for (name, value, says) in browser_requests {
        let answer = worker.post(SNAPSHOT, &[(name, value)]);
        assert_eq!(
            answer.status,
            403,
            "{name}: {value} was not refused: {:?}",
            answer.json()
        );
        let error = answer.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(error.contains(says), "{name}: {value}: {error}");
    }
    assert_eq!(
        snapshot_dirs(&snapshots),
        0,
        "a refused request took a snapshot"
    );
    let page = worker.metrics().unwrap();
    let refused = metric_value(
        &page,
        m::ERRORS,
        &[(m::LABEL_KIND, m::KIND_ADMIN_UNAUTHORIZED)],
    );
    assert_eq!(refused, Some(3.0), "each refusal is counted once");
    // A plain request from loopback, as `dedupe ledger snapshot` or curl sends it, is taken.
    let first = worker.post(SNAPSHOT, &[]);
    assert_eq!(
        first.status,
        200,
        "{:?}\n{}",
        first.json(),
        worker.log_text()
    );
    assert_eq!(snapshot_dirs(&snapshots), 1);

    // (b) Requests in a loop, with ids arriving between them.
    let pid = worker.child.id();
    let (ssts_before, fds_before) = (sst_files(&ledger), open_fds(pid));
    let started = Instant::now();
    let mut answers = Vec::with_capacity(LOOP_REQUESTS);
    for i in 0..LOOP_REQUESTS {
        if i % PRODUCE_EVERY == 0 {
            produce_full(&input.name, &keyed(&ids(10).iter().collect::<Vec<_>>()));
        }
        answers.push(worker.post(SNAPSHOT, &[]));
    }
    let took = started.elapsed();
    let taken = answers.iter().filter(|a| a.status == 200).count();
    for answer in answers.iter().filter(|a| a.status != 200) {
        assert_eq!(
            answer.status,
            429,
            "a request was neither taken nor told to wait: {:?}",
            answer.json()
        );
        let retry_after: u64 = answer
            .header("Retry-After")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "a 429 without a whole-seconds Retry-After: {:?}",
                    answer.headers
                )
            });
        assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
        assert_eq!(
            answer.json()["retry_after_secs"].as_u64(),
            Some(retry_after),
            "{:?}",
            answer.json()
        );
    }
    let dirs = snapshot_dirs(&snapshots);
    assert_eq!(dirs, 1 + taken, "each snapshot directory answers one 200");
    assert!(
        dirs <= 2,
        "{LOOP_REQUESTS} requests in {took:?} took {taken} snapshots"
    );
    // The files: flat at once. The descriptors: the loop's connections may take a moment to close.
    let ssts_after = sst_files(&ledger);
    let deadline = Instant::now() + Duration::from_secs(10);
    let fds_after = loop {
        let fds = open_fds(pid);
        if fds <= fds_before + FD_SLACK || Instant::now() > deadline {
            break fds;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "{LOOP_REQUESTS} snapshot requests in {took:?}: {taken} taken (snapshot directories: {dirs}); \
         ledger SST files {ssts_before} -> {ssts_after}; worker open fds {fds_before} -> {fds_after}"
    );
    assert!(
        ssts_after <= ssts_before + SST_SLACK,
        "the ledger's SST files went from {ssts_before} to {ssts_after}"
    );
    assert!(
        fds_after <= fds_before + FD_SLACK,
        "the worker's open fds went from {fds_before} to {fds_after}"
    );
    let page = worker.metrics().unwrap();
    assert_eq!(
        metric_value(&page, "dedupe_snapshot_failures_total", &[]).unwrap_or(0.0),
        0.0,
        "refusals are not failures: {page}"
    );
    assert_eq!(
        worker.terminate(Duration::from_secs(30)),
        Some(0),
        "{}",
        worker.log_text()
    );
}

#[test]
fn with_a_token_the_bearer_scheme_is_taken_in_any_case() {
    let input = TestTopic::create("admin-token-in", 1);
    let output = TestTopic::create("admin-token-out", 1);
    let dir = tempfile::tempdir().unwrap();
    let snapshots = dir.path().join("snapshots");
    let token = "t0ken-for-the-admin-test";
    let spec = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_SNAPSHOTS_DIR", snapshots.to_str().unwrap())
        .env("DEDUPE_ADMIN_TOKEN", token);
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));

    // A wrong token is refused whatever the scheme's case.
    let wrong = worker.post(
        SNAPSHOT,
        &[("Authorization", "bearer t0ken-for-the-admin-tes")],
    );
    assert_eq!(wrong.status, 401, "{:?}", wrong.json());
    // The scheme in lower case, with the token: taken.
    let lower = worker.post(SNAPSHOT, &[("Authorization", &format!("bearer {token}"))]);
    assert_eq!(
        lower.status,
        200,
        "{:?}\n{}",
        lower.json(),
        worker.log_text()
    );
    assert_eq!(snapshot_dirs(&snapshots), 1);
    // In capitals: authorized too, and then told to wait for the next interval.
    let upper = worker.post(SNAPSHOT, &[("Authorization", &format!("BEARER {token}"))]);
    assert_eq!(upper.status, 429, "{:?}", upper.json());
    assert_eq!(
        worker.terminate(Duration::from_secs(30)),
        Some(0),
        "{}",
        worker.log_text()
    );
    assert!(
        !worker.log_text().contains(token),
        "the admin token was logged"
    );
}

/// Runs `dedupe explain ID` against a worker's metrics port and ledger directory.
fn explain(
    ledger: &Path,
    metrics_port: u16,
    id: &str,
    sent_at: Option<&str>,
) -> (serde_json::Value, String) {
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], metrics_port));
    match sent_at {
        Some(t) => DEDUPE.explain(ledger, metrics, id, &["--sent-at", t]),
        None => DEDUPE.explain(ledger, metrics, id, &[]),
    }
}

#[test]
fn any_id_is_explained_by_the_running_worker_and_from_a_stopped_workers_ledger() {
    let input = TestTopic::create("explain-in", 2);
    let output = TestTopic::create("explain-out", 2);
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let all = ids(60);
    produce_full(&input.name, &keyed(&all.iter().collect::<Vec<_>>()));
    let records = consume_all(&input.name, true);
    let in_partition = |p: i32| {
        records
            .iter()
            .filter(|r| r.partition == p)
            .collect::<Vec<_>>()
    };
    let (mine, theirs) = (in_partition(0), in_partition(1));
    assert!(
        !mine.is_empty() && !theirs.is_empty(),
        "the ids spread over both partitions"
    );
    // This worker owns partition 0 only. The test's producer is librdkafka's, with its default
    // partitioner.
    let mut worker = DEDUPE
        .worker(&input.name, &output.name, &ledger)
        .env("DEDUPE_WORKER_PARTITIONS", "0")
        .env("DEDUPE_WORKER_INPUT_PARTITIONER", "consistent_random")
        .start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, mine.len(), Duration::from_secs(60));
    let port = worker.metrics_port;

    // An id the worker holds: where, since when, and the window.
    let held = mine[0];
    let id = String::from_utf8(held.key.clone().unwrap()).unwrap();
    let (a, sentence) = explain(&ledger, port, &id, None);
    assert_eq!(a["held"], true, "{a}");
    assert_eq!(a["partition"], 0);
    assert_eq!(a["owned"], true);
    // First seen at its record's time, as the ledger keeps it: to the second of its generation.
    let first_seen = a["first_seen_ms"].as_i64().unwrap();
    let sent = held.timestamp.unwrap();
    assert!(
        first_seen <= sent && sent - first_seen < 1000,
        "first seen {first_seen}, sent {sent}"
    );
    assert!(
        a["generation"].is_u64() && a["copies"].as_array().unwrap().len() == 1,
        "{a}"
    );
    assert!(
        a["window_secs"].as_f64().unwrap() >= 0.0 && a["reason"].is_null(),
        "{a}"
    );
    assert!(
        sentence.contains("is in the window") && sentence.contains("dropped"),
        "{sentence}"
    );

    // An id never sent: not held; the time it was sent tells never seen from aged out.
    let unknown = uuid::Uuid::new_v4().to_string();
    let unknown_mine = (0..1000)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .find(|u| {
            let partition = dedupe_cli::explain_client::partition_of_id(
                &dedupe::config::IdSource::Key,
                dedupe::config::InputPartitioner::ConsistentRandom,
                u.as_bytes(),
                2,
            );
            partition == Some(0)
        })
        .unwrap_or(unknown);
    let (a, sentence) = explain(&ledger, port, &unknown_mine, None);
    assert_eq!(
        (a["held"].clone(), a["reason"].clone()),
        (serde_json::json!(false), serde_json::json!("not_in_window")),
        "{a}"
    );
    assert!(sentence.contains("published"), "{sentence}");
    let now = dedupe::clock::now_ms().to_string();
    let (a, _) = explain(&ledger, port, &unknown_mine, Some(&now));
    assert_eq!(a["reason"], "never_seen", "{a}");
    let (a, _) = explain(&ledger, port, &unknown_mine, Some("2020-01-01T00:00:00Z"));
    assert_eq!(a["reason"], "aged_out", "{a}");

    // An id of the partition another worker owns: which one.
    let other = String::from_utf8(theirs[0].key.clone().unwrap()).unwrap();
    let (a, sentence) = explain(&ledger, port, &other, None);
    assert_eq!(
        (
            a["owned"].clone(),
            a["partition"].clone(),
            a["reason"].clone()
        ),
        (
            serde_json::json!(false),
            serde_json::json!(1),
            serde_json::json!("not_owned")
        )
    );
    assert!(
        sentence.contains("ask the worker that owns partition 1"),
        "{sentence}"
    );

    // The endpoint keeps the admin rules: a web page is refused.
    let answer = kit::http::request(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        "GET",
        &format!("/admin/ids/{id}"),
        &[("Origin", "https://evil.example")],
        b"",
    )
    .expect("an answer");
    assert_eq!(answer.status, 403);

    // The worker stopped: the same from its ledger directory.
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
    let (a, _) = explain(&ledger, port, &id, None);
    assert_eq!(
        (a["held"].clone(), a["first_seen_ms"].clone()),
        (serde_json::json!(true), serde_json::json!(first_seen)),
        "{a}"
    );
    assert!(
        a["partition"].is_null() && a["owned"].is_null(),
        "a stopped worker's ledger does not say whose partition: {a}"
    );
}

/// Published snapshot directories (`ledger-*`) under `root`.
fn snapshot_dirs(root: &Path) -> usize {
    match std::fs::read_dir(root) {
        Ok(entries) => entries
            .map(|e| e.expect("a snapshot directory entry"))
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(dedupe::snapshot::SNAPSHOT_PREFIX)
            })
            .count(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => panic!("reading {}: {e}", root.display()),
    }
}

/// `.sst` files anywhere under `dir` (the live ledger).
fn sst_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a ledger directory entry"))
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => sst_files(&e.path()),
            _ => usize::from(e.file_name().to_string_lossy().ends_with(".sst")),
        })
        .sum()
}

/// The process's open file descriptors, from `/proc`.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/fd: {e}"))
        .count()
}

/// The one admin guard, tried on every route the worker serves under `/admin`
/// (`dedupe_cli::http::telemetry::ADMIN_ROUTES`) and on paths it does not serve: with a token set, a request
/// without it or with a wrong one is refused (401); without a token, one with a hostile `Origin` or
/// a foreign `Host` is refused (403). Authorized, each route is there (neither 404 nor 405), so
/// the list is what the server serves; nothing a refused request asked for happened.
#[test]
fn every_admin_route_is_behind_the_one_guard() {
    let probes = || {
        let mut probes: Vec<(&str, String)> = dedupe_cli::http::telemetry::ADMIN_ROUTES
            .iter()
            .map(|(method, path)| {
                (
                    *method,
                    path.replace("{id}", "6ba7b810-9dad-11d1-80b4-00c04fd430c8"),
                )
            })
            .collect();
        // Paths no route serves, and methods no route takes: the guard answers them first.
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            probes.push((method, "/admin/not-a-route".into()));
            probes.push((method, "/admin/".into()));
        }
        probes.push(("PUT", "/admin/snapshot".into()));
        probes
    };
    let token = "t0ken-for-the-guard-test";
    let dir = tempfile::tempdir().unwrap();
    let snapshots = dir.path().join("snapshots");
    let (input, output) = TestTopic::pair("admin-guard", 1);
    let mut with_token = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_SNAPSHOTS_DIR", snapshots.to_str().unwrap())
        .env("DEDUPE_ADMIN_TOKEN", token)
        .start();
    with_token.wait_ready(Duration::from_secs(60));
    let addr = with_token.metrics_addr();
    for (method, path) in probes() {
        for headers in [
            vec![],
            vec![("Authorization", "Bearer wr0ng")],
            vec![("Authorization", "Basic dDBrZW4=")],
        ] {
            let answer = kit::http::request(addr, method, &path, &headers, b"").unwrap();
            assert_eq!(answer.status, 401, "{method} {path} with {headers:?}");
        }
    }
    assert_eq!(
        snapshot_dirs(&snapshots),
        0,
        "a refused request took a snapshot"
    );
    // Authorized, every listed route is served: the list is the server's.
    let bearer = format!("Bearer {token}");
    for (method, path) in dedupe_cli::http::telemetry::ADMIN_ROUTES {
        let path = path.replace("{id}", "6ba7b810-9dad-11d1-80b4-00c04fd430c8");
        let answer =
            kit::http::request(addr, method, &path, &[("Authorization", &bearer)], b"").unwrap();
        assert!(
            ![401, 403, 404, 405].contains(&answer.status),
            "{method} {path} authorized: {} {:?}",
            answer.status,
            answer.json()
        );
    }
    with_token.stop_cleanly();

    // Without a token: what a web page sends is refused on every route.
    let (input, output) = TestTopic::pair("admin-guard-open", 1);
    let mut open = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger-open"))
        .start();
    open.wait_ready(Duration::from_secs(60));
    let foreign = format!("evil.example:{}", open.metrics_port);
    for (method, path) in probes() {
        for header in [
            ("Origin", "https://evil.example"),
            ("Sec-Fetch-Site", "cross-site"),
            ("Host", foreign.as_str()),
        ] {
            let answer =
                kit::http::request(open.metrics_addr(), method, &path, &[header], b"").unwrap();
            assert_eq!(answer.status, 403, "{method} {path} with {header:?}");
        }
    }
    open.stop_cleanly();
}

/// No admin route is registered outside the guarded scope: the binary's HTTP sources name an
/// `/admin` path in a route or resource only inside `telemetry::admin_scope`, whose paths are
/// relative.
#[test]
fn no_admin_route_is_registered_outside_the_guarded_scope() {
    let http = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    for entry in std::fs::read_dir(&http).unwrap() {
        let path = entry.unwrap().path();
        let source = std::fs::read_to_string(&path).unwrap();
        for (n, line) in source.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let registers = ["route(\"/admin", "resource(\"/admin", "scope(\"/admin/"];
            assert!(
                !registers.iter().any(|r| code.contains(r)),
                "{}:{}: an admin route outside telemetry::admin_scope, which the guard does not cover: {line}",
                path.display(),
                n + 1
            );
        }
    }
}

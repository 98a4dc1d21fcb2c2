//! Operations against the real broker: a real Prometheus scrapes a running worker, and a ledger
//! snapshot restored after more traffic loses nothing the output topic still holds.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kit::*;

/// The binary under test, built by cargo for this test run.
const DEDUPE: Dedupe = Dedupe::at(env!("CARGO_BIN_EXE_dedupe"));

#[test]
fn a_real_prometheus_scrapes_the_window_of_every_owned_partition() {
    let input = TestTopic::create("prom-in", 3);
    let output = TestTopic::create("prom-out", 3);
    let dir = tempfile::tempdir().unwrap();
    // Enough ids that every partition holds some.
    let all = ids(300);
    let refs: Vec<&String> = all.iter().collect();
    let acks = produce_full(&input.name, &keyed(&refs));
    let used: std::collections::BTreeSet<i32> = acks.iter().map(|(p, _)| *p).collect();
    assert_eq!(used.len(), 3, "300 ids reach all 3 partitions");
    let mut worker = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 300, Duration::from_secs(60));

    let (mut prom, prom_port) = prometheus_scraping(&worker, dir.path());
    let deadline = Instant::now() + Duration::from_secs(60);
    let query = "/api/v1/query?query=dedupe_window_seconds";
    let result = loop {
        if let Some((200, body)) = http_get(prom_port, query) {
            let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let series = json["data"]["result"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if series.len() == 3 {
                break series;
            }
        }
        if Instant::now() > deadline {
            let _ = prom.kill();
            panic!(
                "Prometheus did not return the window of 3 partitions within 60 s:\n{}",
                worker.metrics().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let mut partitions: Vec<String> = result
        .iter()
        .map(|s| s["metric"]["partition"].as_str().unwrap().to_string())
        .collect();
    partitions.sort();
    assert_eq!(partitions, ["0", "1", "2"]);
    for s in &result {
        let v: f64 = s["value"][1].as_str().unwrap().parse().unwrap();
        assert!(
            (0.0..3600.0).contains(&v),
            "a fresh ledger's window is seconds old, got {v}"
        );
    }
    // The page's own expression, read from the rules file, selects this worker: its window is
    // seconds old, under the default 24-hour promise it exports (in production it fires once that
    // has lasted 10 minutes).
    let page = page_expression();
    assert_eq!(
        prometheus_query(prom_port, &page).len(),
        1,
        "{page} should select the young worker"
    );
    let _ = prom.kill();
    let _ = prom.wait();
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
}

/// A Prometheus scraping `worker` every second, its data in `dir`; and its port.
fn prometheus_scraping(worker: &Worker, dir: &std::path::Path) -> (std::process::Child, u16) {
    let prometheus = which("prometheus");
    let prom_port = free_port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: dedupe\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            worker.metrics_port
        ),
    )
    .unwrap();
    let prom = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus");
    (prom, prom_port)
}

/// The page's (DedupeWindowUnderPromise's) expression, as the rules file has it.
fn page_expression() -> String {
    let rules = std::fs::read_to_string(repo_root().join("deploy/prometheus/rules.yml")).unwrap();
    rules
        .split("alert: DedupeWindowUnderPromise")
        .nth(1)
        .and_then(|rest| rest.lines().find_map(|l| l.trim().strip_prefix("expr:")))
        .expect("the DedupeWindowUnderPromise rule and its expr")
        .trim()
        .to_string()
}

/// The series an instant query answers.
fn prometheus_query(port: u16, expr: &str) -> Vec<serde_json::Value> {
    let encoded: String = expr
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let (status, body) =
        http_get(port, &format!("/api/v1/query?query={encoded}")).expect("a query answer");
    assert_eq!(status, 200, "{expr}: {body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    json["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// A retention limit equal to the promise (20 s each), under load for longer than the limit: the
/// window reads under the promise (expiry drops whole generations), yet only the limit bounds it,
/// so a real Prometheus evaluating the page's own expression selects nothing.
#[test]
fn a_limit_equal_to_the_promise_never_selects_the_page_on_a_real_prometheus() {
    const LIMIT_SECS: u64 = 20;
    let input = TestTopic::create("limitpage-in", 1);
    let output = TestTopic::create("limitpage-out", 1);
    let dir = tempfile::tempdir().unwrap();
    let mut worker = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_LEDGER_MAX_WINDOW_SECS", &LIMIT_SECS.to_string())
        .env(
            "DEDUPE_WORKER_PROMISED_WINDOW_SECS",
            &LIMIT_SECS.to_string(),
        )
        .start();
    worker.wait_ready(Duration::from_secs(60));
    let (mut prom, prom_port) = prometheus_scraping(&worker, dir.path());
    let page = page_expression();
    // 30 s of ids, 20 every half second; the page never selects the worker meanwhile.
    let started = Instant::now();
    let mut under = 0;
    while started.elapsed() < Duration::from_secs(30) {
        let batch = ids(20);
        produce_full(&input.name, &keyed(&batch.iter().collect::<Vec<_>>()));
        std::thread::sleep(Duration::from_millis(500));
        let selected = prometheus_query(prom_port, &page);
        assert!(selected.is_empty(), "{page} selected {selected:?}");
        under += prometheus_query(prom_port, "dedupe_window_seconds < 20").len();
    }
    assert!(under > 0, "the window read under the promise at some point");
    assert_eq!(
        prometheus_query(prom_port, "dedupe_window_limited == 1").len(),
        1,
        "only the limit bounds the window"
    );
    let _ = prom.kill();
    let _ = prom.wait();
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
}

/// Each pipeline's promise reaches the metric the alert rules compare the window with: a 1-hour
/// and a 7-day promise, read from the worker's own metrics page.
#[test]
fn the_worker_exports_the_window_its_pipeline_promises() {
    for (promise, retention) in [("3600", None), ("604800", Some("604800"))] {
        let input = TestTopic::create("promise-in", 1);
        let output = TestTopic::create("promise-out", 1);
        let dir = tempfile::tempdir().unwrap();
        let mut spec = DEDUPE
            .worker(&input.name, &output.name, &dir.path().join("ledger"))
            .env("DEDUPE_WORKER_PROMISED_WINDOW_SECS", promise);
        if let Some(secs) = retention {
            // The changelog must keep what the promise moves with a partition (7 days is the
            // default; it is set here so the test says why a 7-day promise starts).
            spec = spec.env("DEDUPE_WORKER_CHANGELOG_RETENTION_SECS", secs);
        }
        let mut worker = spec.start();
        worker.wait_ready(Duration::from_secs(60));
        let page = worker.metrics().expect("the worker's metrics page");
        assert_eq!(
            metric_value(
                &page,
                "dedupe_promised_window_seconds",
                &[("input_topic", &input.name)]
            ),
            Some(promise.parse().unwrap()),
            "promise {promise}: {page}"
        );
        assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
    }
}

/// `dedupe plan --topic` measures the rate it plans for: records appended to the topic over the
/// measuring time, by its partitions' high watermarks.
#[test]
fn dedupe_plan_measures_a_topics_rate() {
    let topic = TestTopic::create("plan-rate", 2);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // About 1,000 records a second into the topic while the plan measures it.
    let producer = {
        let (name, stop) = (topic.name.clone(), stop.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
                let batch = ids(100);
                let refs: Vec<&String> = batch.iter().collect();
                produce_full(&name, &keyed(&refs));
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let output = Command::new(env!("CARGO_BIN_EXE_dedupe"))
        .args([
            "plan",
            "--topic",
            &topic.name,
            "--measure",
            "4s",
            "--brokers",
            &brokers(),
            "--json",
        ])
        .output()
        .expect("run dedupe plan --topic");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    producer.join().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let rate = json["ids_per_sec"].as_f64().unwrap();
    // At most 1,000 a second (100 every 100 ms plus the time each batch takes); at least a
    // fifth of it on a busy machine.
    assert!(
        (100.0..=1_100.0).contains(&rate),
        "measured {rate} records/s: {json}"
    );
    let held = json["ids_held"].as_f64().unwrap();
    assert!((held - rate * 86_400.0).abs() <= held * 1e-9, "{json}");
    // A topic that does not exist is an error naming it, not a rate of zero.
    let output = Command::new(env!("CARGO_BIN_EXE_dedupe"))
        .args([
            "plan",
            "--topic",
            "no-such-topic-for-plan",
            "--measure",
            "1s",
            "--brokers",
            &brokers(),
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("no-such-topic-for-plan"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn which(name: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .unwrap();
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        !path.is_empty(),
        "{name} is not installed (apt-get install prometheus); .ci/run installs it"
    );
    path
}

#[test]
fn a_restored_snapshot_loses_nothing_the_output_holds() {
    let input = TestTopic::create("snap-in", 2);
    let output = TestTopic::create("snap-out", 2);
    let dir = tempfile::tempdir().unwrap();
    let snapshots = dir.path().join("snapshots");
    let hook_log = dir.path().join("hook.log");
    let spec = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_SNAPSHOTS_DIR", snapshots.to_str().unwrap())
        .env("DEDUPE_SNAPSHOTS_KEEP", "2")
        .env(
            "DEDUPE_SNAPSHOTS_HOOK",
            &format!(
                "echo \"$DEDUPE_SNAPSHOT_DIR $DEDUPE_SNAPSHOT_PARTITIONS\" >> {}",
                hook_log.display()
            ),
        );

    // Phase A, then a snapshot taken on demand through the running worker.
    let a = ids(400);
    produce_full(&input.name, &keyed(&a.iter().collect::<Vec<_>>()));
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    wait_for_records(&output.name, 400, Duration::from_secs(60));
    let snap = DEDUPE
        .command()
        .args([
            "ledger",
            "snapshot",
            "--metrics-addr",
            &format!("127.0.0.1:{}", worker.metrics_port),
        ])
        .output()
        .unwrap();
    assert!(
        snap.status.success(),
        "{}",
        String::from_utf8_lossy(&snap.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&snap.stdout).unwrap();
    let snapshot_dir = json["snapshot"].as_str().unwrap().to_string();
    assert!(std::path::Path::new(&snapshot_dir).join("CURRENT").exists());
    let hook = std::fs::read_to_string(&hook_log).unwrap();
    assert!(
        hook.starts_with(&snapshot_dir),
        "the hook ran with the snapshot's path: {hook}"
    );
    let page = worker.metrics().unwrap();
    assert!(
        metric_value(&page, "dedupe_snapshot_last_success_timestamp_seconds", &[]).unwrap() > 0.0
    );

    // Phase B after the snapshot: the snapshot does not know these ids.
    let b = ids(300);
    produce_full(&input.name, &keyed(&b.iter().collect::<Vec<_>>()));
    wait_for_records(&output.name, 700, Duration::from_secs(60));
    assert_eq!(
        worker.terminate(Duration::from_secs(30)),
        Some(0),
        "{}",
        worker.log_text()
    );

    // Restore the snapshot over the newer ledger (moved aside, not deleted).
    let data_dir = dir.path().join("ledger");
    let restore = DEDUPE
        .command()
        .args([
            "ledger",
            "restore",
            "--from",
            &snapshot_dir,
            "--force",
            "--data-dir",
        ])
        .arg(&data_dir)
        .output()
        .unwrap();
    assert!(
        restore.status.success(),
        "{}",
        String::from_utf8_lossy(&restore.stderr)
    );
    let restored: serde_json::Value = serde_json::from_slice(&restore.stdout).unwrap();
    let aside = restored["moved_aside"]
        .as_str()
        .expect("the newer ledger was moved aside");
    assert!(std::path::Path::new(aside).join("CURRENT").exists());

    // Clients retry phase B's ids. The restarted worker replays the output tail written after the
    // snapshot, so it knows them, and drops every retry.
    produce_full(&input.name, &keyed(&b.iter().collect::<Vec<_>>()));
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    // Every retry is read and dropped...
    let deadline = Instant::now() + Duration::from_secs(60);
    let page = loop {
        let page = worker.metrics().unwrap_or_default();
        if metric_value(&page, "dedupe_duplicates_dropped_total", &[]).unwrap_or(0.0) >= 300.0 {
            break page;
        }
        assert!(
            Instant::now() < deadline,
            "the retries were not all dropped within 60 s:\n{page}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
    // ...and, the worker stopped, the output is final: nothing was published again.
    let out = consume_all(&output.name, true);
    assert_eq!(out.len(), 700, "no retried id was published again");
    assert!(
        metric_value(&page, "dedupe_recovery_replayed_records_total", &[]).unwrap() >= 300.0,
        "{page}"
    );
    assert_eq!(
        metric_value(&page, "dedupe_duplicates_dropped_total", &[]),
        Some(300.0)
    );
    let (code, summary) = DEDUPE.verify(&input.name, &output.name);
    assert_eq!(code, 0, "{summary}");
}

#[test]
fn concurrent_admin_snapshots_run_one_at_a_time_and_need_the_token() {
    let input = TestTopic::create("admin-in", 1);
    let output = TestTopic::create("admin-out", 1);
    let dir = tempfile::tempdir().unwrap();
    let snapshots = dir.path().join("snapshots");
    let hook_log = dir.path().join("hook.log");
    // The hook is slow, so concurrent requests overlap it; it records whether its directory
    // still exists when it finishes (a concurrent prune would have removed it).
    let hook = format!(
        "sleep 0.3; if [ -f \"$DEDUPE_SNAPSHOT_DIR/CURRENT\" ]; then echo ok; else echo gone; fi >> {}",
        hook_log.display()
    );
    let spec = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_SNAPSHOTS_DIR", snapshots.to_str().unwrap())
        .env("DEDUPE_SNAPSHOTS_KEEP", "2")
        .env("DEDUPE_SNAPSHOTS_HOOK", &hook)
        // The shortest pace allowed, so the command at the end need not wait a minute.
        .env("DEDUPE_SNAPSHOTS_MIN_INTERVAL_SECS", "1")
        .env("DEDUPE_ADMIN_TOKEN", "t0ken-for-tests");
    produce_full(&input.name, &keyed(&ids(100).iter().collect::<Vec<_>>()));
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", worker.metrics_port)
        .parse()
        .unwrap();

    // Without the token, or with a wrong one: refused, nothing taken.
    let none = kit::http::request(addr, "POST", "/admin/snapshot", &[], b"").unwrap();
    assert_eq!(none.status, 401, "{:?}", none.json());
    let wrong = kit::http::request(
        addr,
        "POST",
        "/admin/snapshot",
        &[("Authorization", "Bearer nope")],
        b"",
    )
    .unwrap();
    assert_eq!(wrong.status, 401);
    assert!(!snapshots.exists() || std::fs::read_dir(&snapshots).unwrap().count() == 0);

    // Twenty at once with the token: each is taken, refused as busy, or (once one has finished
    // within the second) told to wait; none fails.
    let answers: Vec<kit::http::Response> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..20)
            .map(|_| {
                s.spawn(move || {
                    kit::http::request(
                        addr,
                        "POST",
                        "/admin/snapshot",
                        &[("Authorization", "Bearer t0ken-for-tests")],
                        b"",
                    )
                    .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let taken: Vec<String> = answers
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.json()["snapshot"].as_str().unwrap().to_string())
        .collect();
    let busy = answers.iter().filter(|r| r.status == 409).count();
    let too_soon = answers
        .iter()
        .filter(|r| r.status == 429 && r.header("Retry-After").is_some())
        .count();
    assert!(!taken.is_empty(), "no snapshot was taken: {answers:?}");
    assert_eq!(
        taken.len() + busy + too_soon,
        20,
        "every request is taken (200), refused as busy (409) or told to wait (429): {answers:?}"
    );
    let unique: std::collections::HashSet<_> = taken.iter().collect();
    assert_eq!(
        unique.len(),
        taken.len(),
        "two snapshots got one name: {taken:?}"
    );
    let hooks = std::fs::read_to_string(&hook_log).unwrap();
    assert_eq!(hooks.lines().count(), taken.len(), "{hooks}");
    assert!(
        hooks.lines().all(|l| l == "ok"),
        "a hook saw its directory pruned away: {hooks}"
    );
    let page = worker.metrics().unwrap();
    assert_eq!(
        metric_value(&page, "dedupe_snapshot_failures_total", &[]).unwrap_or(0.0),
        0.0,
        "refusals are not failures: {page}"
    );
    // Only published snapshots are listed; keep = 2 holds.
    let left: Vec<_> = std::fs::read_dir(&snapshots)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        left.len() <= 2 && left.iter().all(|n| n.starts_with("ledger-")),
        "{left:?}"
    );

    // `dedupe ledger snapshot` passes the token from its environment; it is told to wait (429)
    // until a second has passed since the last snapshot started.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let snap = DEDUPE
            .command()
            .args(["ledger", "snapshot", "--metrics-addr", &addr.to_string()])
            .env("DEDUPE_ADMIN_TOKEN", "t0ken-for-tests")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&snap.stderr);
        if snap.status.success() {
            break;
        }
        assert!(
            stderr.contains("(429") && Instant::now() < deadline,
            "{stderr}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        worker.terminate(Duration::from_secs(30)),
        Some(0),
        "{}",
        worker.log_text()
    );
    assert!(
        !worker.log_text().contains("t0ken-for-tests"),
        "the admin token was logged"
    );
}

/// Sleeps until `at` (the test's clock: the records' timestamps are the producer's wall clock).
fn sleep_until(at: Instant) {
    if let Some(left) = at.checked_duration_since(Instant::now()) {
        std::thread::sleep(left);
    }
}

/// Produces `id` once, keyed by it, and waits until `worker` has published or dropped every record
/// it read (`read` in all, this one included); returns whether it was published.
fn send_once(input: &str, worker: &Worker, id: &String, read: usize) -> bool {
    let before = worker.metric("dedupe_records_out_total", &[]);
    produce_full(input, &keyed(&[id]));
    worker.wait_settled(read, Duration::from_secs(60));
    worker.metric("dedupe_records_out_total", &[]) > before
}

#[test]
fn a_retention_limit_publishes_copies_past_it_fresh_across_a_restart_a_move_and_a_restore() {
    const LIMIT_SECS: u64 = 20;
    let input = TestTopic::create("limit-in", 1);
    let output = TestTopic::create("limit-out", 1);
    let dir = tempfile::tempdir().unwrap();
    let snapshots = dir.path().join("snapshots");
    // The default configuration but for the limit, and a promise within it (a longer one is
    // refused at start).
    let spec = |ledger: &str| {
        DEDUPE
            .worker(&input.name, &output.name, &dir.path().join(ledger))
            .env("DEDUPE_LEDGER_MAX_WINDOW_SECS", &LIMIT_SECS.to_string())
            .env(
                "DEDUPE_WORKER_PROMISED_WINDOW_SECS",
                &LIMIT_SECS.to_string(),
            )
            .env("DEDUPE_SNAPSHOTS_DIR", snapshots.to_str().unwrap())
    };
    let [a, b, c]: [String; 3] = ids(3).try_into().unwrap();
    let mut worker = spec("first").start();
    worker.wait_ready(Duration::from_secs(60));
    assert_eq!(
        worker.metric("dedupe_retention_limit_seconds", &[]),
        LIMIT_SECS as f64
    );
    // The changelog was created to keep no id past the limit plus a generation's span (20 s / 8).
    let changelog = dedupe::changelog::default_topic(&output.name);
    let setting = |key: &str| {
        futures::executor::block_on(dedupe::kafka::topic_setting_ms(
            &kafka_config(),
            &changelog,
            key,
        ))
        .unwrap()
    };
    assert_eq!(
        (setting("retention.ms"), setting("segment.ms")),
        (Some(20_000), Some(2_000))
    );

    // A fresh worker: a and b first seen at t0; a copy of a 10 s later is dropped.
    let t0 = Instant::now();
    assert!(send_once(&input.name, &worker, &a, 1));
    assert!(send_once(&input.name, &worker, &b, 2));
    sleep_until(t0 + Duration::from_secs(10));
    assert!(
        !send_once(&input.name, &worker, &a, 3),
        "10 s after: dropped"
    );
    // Across a restart.
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
    let mut worker = spec("first").start();
    worker.wait_ready(Duration::from_secs(60));
    assert!(
        !send_once(&input.name, &worker, &a, 1),
        "after a restart: dropped"
    );
    // After a partition move: a new owner with an empty ledger loads the ids from the changelog.
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
    let mut worker = spec("second").start();
    worker.wait_ready(Duration::from_secs(60));
    assert!(
        !send_once(&input.name, &worker, &b, 1),
        "after a move: dropped"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(LIMIT_SECS),
        "the checks above ran within the limit ({:?})",
        t0.elapsed()
    );
    // c first seen now; a snapshot holds it, and is restored into a third ledger.
    let t1 = Instant::now();
    assert!(send_once(&input.name, &worker, &c, 2));
    let snap = DEDUPE
        .command()
        .args(["ledger", "snapshot", "--metrics-addr"])
        .arg(worker.metrics_addr().to_string())
        .output()
        .unwrap();
    assert!(
        snap.status.success(),
        "{}",
        String::from_utf8_lossy(&snap.stderr)
    );
    let snapshot: serde_json::Value = serde_json::from_slice(&snap.stdout).unwrap();
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
    let restore = DEDUPE
        .command()
        .args(["ledger", "restore", "--from"])
        .arg(snapshot["snapshot"].as_str().unwrap())
        .arg("--data-dir")
        .arg(dir.path().join("third"))
        .output()
        .unwrap();
    assert!(
        restore.status.success(),
        "{}",
        String::from_utf8_lossy(&restore.stderr)
    );
    let mut worker = spec("third").start();
    worker.wait_ready(Duration::from_secs(60));
    assert!(
        !send_once(&input.name, &worker, &c, 1),
        "after a restore: dropped"
    );
    assert!(t1.elapsed() < Duration::from_secs(LIMIT_SECS));

    // 25 s after their first sighting, copies are published, and explain says why.
    sleep_until(t0 + Duration::from_secs(25));
    let metrics = worker.metrics_addr();
    let ledger = dir.path().join("third");
    // Past the limit, b is not held: by its sighting, or gone with its generation already.
    let (answer, _) = DEDUPE.explain(&ledger, metrics, &b, &[]);
    assert_eq!(answer["held"], false, "{answer}");
    assert!(
        ["past_limit", "not_in_window"].contains(&answer["reason"].as_str().unwrap()),
        "{answer}"
    );
    assert!(
        send_once(&input.name, &worker, &a, 2),
        "25 s after: published"
    );
    assert!(send_once(&input.name, &worker, &b, 3));
    sleep_until(t1 + Duration::from_secs(25));
    assert!(send_once(&input.name, &worker, &c, 4));
    assert!(worker.metric("dedupe_window_seconds", &[("partition", "0")]) <= LIMIT_SECS as f64);

    // Quiet now: the ledger shrinks to what its limit holds, nothing (the limit after the last
    // sighting, plus a generation's span and the 5 s pass).
    kit::wait_until(
        "the quiet ledger holds no id",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || (worker.metric("dedupe_ledger_ids", &[]) == 0.0).then_some(()),
        || worker.log_text(),
    );
    assert!(worker.metric("dedupe_ledger_expired_generations_total", &[]) >= 1.0);
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
    // A new owner loads the changelog's ids within the limit of its newest (the partition's own
    // clock: records waiting in the input may repeat them), and once caught up, with nothing
    // waiting, its quiet ledger expires them on the wall clock.
    let mut worker = spec("fourth").start();
    worker.wait_ready(Duration::from_secs(60));
    kit::wait_until(
        "the caught-up new owner holds no id",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let page = worker.metrics()?;
            metric_value(&page, "dedupe_ledger_generations", &[])?;
            (metric_value(&page, "dedupe_ledger_ids", &[])? == 0.0).then_some(())
        },
        || worker.log_text(),
    );
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
    // Every copy past the limit was published, and nothing else twice.
    assert_eq!(consume_all(&output.name, true).len(), 6);
}

/// The retention limit on the input's own clock: a worker stopped for a second longer than the
/// limit while events and their retries (5 s apart, within the limit of each other) arrive drops
/// every retry when it catches up, whether the first copy was read before the outage or in the
/// catch-up; then, caught up and quiet, its ledger expires on the wall clock.
#[test]
fn an_outage_longer_than_the_limit_still_drops_the_retries_within_it() {
    outage_drops_the_retries_within_the_limit(21);
}

/// The same with an outage a second shorter than the limit.
#[test]
fn an_outage_just_shorter_than_the_limit_drops_the_retries_within_it() {
    outage_drops_the_retries_within_the_limit(19);
}

/// A worker stopped for `outage_secs` against a 20 s limit (see the tests above).
fn outage_drops_the_retries_within_the_limit(outage_secs: u64) {
    const LIMIT_SECS: u64 = 20;
    let input = TestTopic::create(&format!("outage-{outage_secs}-in"), 1);
    let output = TestTopic::create(&format!("outage-{outage_secs}-out"), 1);
    let dir = tempfile::tempdir().unwrap();
    let spec = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env("DEDUPE_LEDGER_MAX_WINDOW_SECS", &LIMIT_SECS.to_string())
        .env(
            "DEDUPE_WORKER_PROMISED_WINDOW_SECS",
            &LIMIT_SECS.to_string(),
        );
    let before = ids(20);
    let during = ids(20);
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    // t0: the first copies of `before`, read live.
    let t0 = Instant::now();
    produce_full(&input.name, &keyed(&before.iter().collect::<Vec<_>>()));
    worker.wait_settled(20, Duration::from_secs(60));
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
    // The worker is down for `outage_secs`. At 5 s the retries of `before` and the first copies
    // of `during`; at 10 s the retries of `during`.
    sleep_until(t0 + Duration::from_secs(5));
    produce_full(&input.name, &keyed(&before.iter().collect::<Vec<_>>()));
    produce_full(&input.name, &keyed(&during.iter().collect::<Vec<_>>()));
    sleep_until(t0 + Duration::from_secs(10));
    produce_full(&input.name, &keyed(&during.iter().collect::<Vec<_>>()));
    sleep_until(t0 + Duration::from_secs(outage_secs));
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    worker.wait_settled(60, Duration::from_secs(60));
    // Each id once: every retry was within the limit of its first copy by their record times.
    let out = consume_all(&output.name, true);
    let keys: HashSet<Vec<u8>> = out.iter().filter_map(|r| r.key.clone()).collect();
    assert_eq!((out.len(), keys.len()), (40, 40), "each id once");
    assert_eq!(worker.metric("dedupe_duplicates_dropped_total", &[]), 40.0);
    assert_eq!(worker.metric("dedupe_late_records_total", &[]), 0.0);
    // Caught up and quiet: the ledger expires on the wall clock.
    kit::wait_until(
        "the caught-up, quiet ledger holds no id",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || (worker.metric("dedupe_ledger_ids", &[]) == 0.0).then_some(()),
        || worker.metrics().unwrap_or_default(),
    );
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
}

/// The limit to the millisecond on the real broker, by the records' own times: a copy at most the
/// limit after its first is dropped, one a millisecond later published, at odd record times.
#[test]
fn a_copy_at_the_limit_is_dropped_and_one_a_millisecond_past_it_published() {
    const LIMIT_MS: i64 = 20_000;
    let input = TestTopic::create("exact-in", 1);
    let output = TestTopic::create("exact-out", 1);
    let dir = tempfile::tempdir().unwrap();
    let mut worker = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .env(
            "DEDUPE_LEDGER_MAX_WINDOW_SECS",
            &(LIMIT_MS / 1000).to_string(),
        )
        .env(
            "DEDUPE_WORKER_PROMISED_WINDOW_SECS",
            &(LIMIT_MS / 1000).to_string(),
        )
        .start();
    worker.wait_ready(Duration::from_secs(60));
    let [a, b, c, d]: [String; 4] = ids(4).try_into().unwrap();
    let record = |id: &String| keyed(&[id]).remove(0);
    // First copies 30 s ago, at an odd millisecond; the copies 1 ms within, at, and 1 ms past
    // the limit after them, then one far past.
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 30_000
        + 757;
    let stamped = [
        (record(&a), t0),
        (record(&b), t0 + 1),
        (record(&c), t0 + 2),
        (record(&d), t0 + 3),
        (record(&a), t0 + LIMIT_MS - 1),
        (record(&b), t0 + 1 + LIMIT_MS),
        (record(&c), t0 + 2 + LIMIT_MS + 1),
        (record(&d), t0 + 3 + LIMIT_MS + 5_000),
    ];
    // The first copies recorded first, so that the copies are judged against the ledger's
    // stored sightings (within one batch, the earlier copy's exact time is at hand anyway).
    produce_stamped(&input.name, Some(0), &stamped[..4]);
    worker.wait_settled(4, Duration::from_secs(60));
    produce_stamped(&input.name, Some(0), &stamped[4..]);
    worker.wait_settled(8, Duration::from_secs(60));
    let out: Vec<Option<i64>> = consume_all(&output.name, true)
        .iter()
        .map(|r| r.timestamp)
        .collect();
    assert_eq!(
        out,
        [
            t0,
            t0 + 1,
            t0 + 2,
            t0 + 3,
            t0 + 2 + LIMIT_MS + 1,
            t0 + 3 + LIMIT_MS + 5_000
        ]
        .map(Some),
        "the first copies, then those past the limit"
    );
    assert_eq!(worker.metric("dedupe_duplicates_dropped_total", &[]), 2.0);
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
}

#[test]
fn a_client_resending_one_event_is_caught_for_as_long_as_it_sends_with_refresh_and_once_per_window_without(
) {
    const LIMIT_SECS: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let pipeline = |name: &str, refresh: bool| {
        let input = TestTopic::create(&format!("refresh-{name}-in"), 1);
        let output = TestTopic::create(&format!("refresh-{name}-out"), 1);
        let mut worker = DEDUPE
            .worker(&input.name, &output.name, &dir.path().join(name))
            .env("DEDUPE_LEDGER_MAX_WINDOW_SECS", &LIMIT_SECS.to_string())
            .env(
                "DEDUPE_WORKER_PROMISED_WINDOW_SECS",
                &LIMIT_SECS.to_string(),
            )
            .env("DEDUPE_LEDGER_REFRESH_ON_DUPLICATE", &refresh.to_string())
            .start();
        worker.wait_ready(Duration::from_secs(60));
        (input, output, worker)
    };
    let (on_in, on_out, on) = pipeline("on", true);
    let (off_in, off_out, off) = pipeline("off", false);
    let id = ids(1).remove(0);
    // One event, then a copy every 5 s for three times the limit.
    let t0 = Instant::now();
    let mut published = (0, 0);
    for i in 0..=12u32 {
        sleep_until(t0 + Duration::from_secs(5) * i);
        published.0 += usize::from(send_once(&on_in.name, &on, &id, i as usize + 1));
        published.1 += usize::from(send_once(&off_in.name, &off, &id, i as usize + 1));
    }
    // With refresh every copy is dropped; without, one copy per window goes through (at 25 s and
    // 50 s: each more than 20 s after the last one recorded).
    assert_eq!(published, (1, 3));
    assert_eq!(consume_all(&on_out.name, true).len(), 1);
    assert_eq!(consume_all(&off_out.name, true).len(), 3);
    assert_eq!(on.metric("dedupe_refreshed_ids_total", &[]), 12.0);
    assert_eq!(off.metric("dedupe_refreshed_ids_total", &[]), 0.0);
    // The audit says each drop refreshed the id; explain says when it was last refreshed.
    let audit = kit::exactly_once::audit_records(&format!("{}.duplicates", on_out.name));
    assert_eq!(audit.len(), 12);
    assert!(
        audit.values().all(|(_, v)| v["refreshed"] == true),
        "{audit:?}"
    );
    let (answer, _) = DEDUPE.explain(&dir.path().join("on"), on.metrics_addr(), &id, &[]);
    assert_eq!(answer["held"], true, "{answer}");
    assert!(
        answer["sentence"].as_str().unwrap().contains("refreshed"),
        "{answer}"
    );
    let refreshed = answer["last_refreshed_ms"]
        .as_i64()
        .or(answer["first_seen_ms"].as_i64());
    let newest_ms = consume_all(&on_in.name, true)
        .iter()
        .filter_map(|r| r.timestamp)
        .max()
        .unwrap();
    assert!(
        refreshed.is_some_and(|ms| newest_ms - ms < 1_000),
        "held from the last copy ({newest_ms}): {answer}"
    );
}

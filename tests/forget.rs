//! `dedupe forget` against the real broker: a forgotten id's next copy is published once, the copy
//! after it is dropped, the audit topic holds each forget with who asked; a forget holds across a
//! SIGKILL of the worker (its mark is durable), across a crash between its commit and its mark
//! (recovery reads the marker back), and across a lost ledger (the new ledger is loaded from the
//! id changelog, whose marker records bring the forgets back, and the re-sends after them).

use std::time::Duration;

use dedupe::config::InputPartitioner;
use kit::*;

/// The binary under test, built by cargo for this test run.
const DEDUPE: Dedupe = Dedupe::at(env!("CARGO_BIN_EXE_dedupe"));

/// The input record of id `i`: keyed by its id, as the front door writes.
fn event(ids: &[String], i: usize) -> Outgoing {
    (
        Some(ids[i].as_bytes().to_vec()),
        Some(format!(r#"{{"n":{i}}}"#).into_bytes()),
        Vec::new(),
    )
}

/// Runs `dedupe forget` against the worker at `metrics`; its stdout. Panics when it fails.
fn forget(metrics: std::net::SocketAddr, args: &[&str]) -> String {
    let out = DEDUPE
        .forget_command(metrics)
        .args(args)
        .output()
        .expect("dedupe forget");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "dedupe forget {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The output's values, in order per partition, as `n` numbers.
fn published(output: &str) -> Vec<usize> {
    let mut ns: Vec<usize> = consume_all(output, true)
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            v["n"].as_u64().unwrap() as usize
        })
        .collect();
    ns.sort_unstable();
    ns
}

#[test]
fn a_forgotten_id_is_published_once_more_audited_and_kept_forgotten_across_a_kill_and_a_lost_ledger(
) {
    let input = TestTopic::create("forget-in", 2);
    let output = TestTopic::create("forget-out", 2);
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let ids = ids(20);
    let spec = DEDUPE.worker(&input.name, &output.name, &ledger);
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    let all: Vec<Outgoing> = (0..20).map(|i| event(&ids, i)).collect();
    produce_full(&input.name, &all);
    wait_for_records(&output.name, 20, Duration::from_secs(60));
    let mut sent = 20;

    // Two ids forgotten by the command, and one never seen by the admin route's DELETE (it is
    // forgotten all the same).
    let answer = forget(
        worker.metrics_addr(),
        &[&ids[0], &ids[1], "--by", "alice", "--reason", "ticket 42"],
    );
    let first: serde_json::Value = serde_json::from_str(answer.lines().next().unwrap()).unwrap();
    assert_eq!(
        (first["forgotten"].as_u64(), first["failed"].as_u64()),
        (Some(2), Some(0)),
        "{answer}"
    );
    let response = ureq::delete(&format!(
        "http://{}/admin/ids/never-sent?by=alice&reason=ticket%2042",
        worker.metrics_addr()
    ))
    .call()
    .expect("DELETE /admin/ids/never-sent");
    let deleted: serde_json::Value = serde_json::from_reader(response.into_reader()).unwrap();
    assert_eq!(deleted["forgotten"], 1, "{deleted}");
    // Explain says so.
    let (answer, sentence) = DEDUPE.explain(&ledger, worker.metrics_addr(), &ids[0], &[]);
    assert_eq!(
        (answer["held"].as_bool(), answer["reason"].as_str()),
        (Some(false), Some("forgotten")),
        "{answer}"
    );
    assert!(sentence.contains("forgotten on request"), "{sentence}");
    // The re-sends: each forgotten id published once more, the other dropped; then the copies
    // after them dropped.
    produce_full(
        &input.name,
        &[event(&ids, 0), event(&ids, 1), event(&ids, 2)],
    );
    sent += 3;
    worker.wait_settled(sent, Duration::from_secs(60));
    produce_full(&input.name, &[event(&ids, 0), event(&ids, 1)]);
    sent += 2;
    worker.wait_settled(sent, Duration::from_secs(60));
    let mut expected: Vec<usize> = (0..20).chain([0, 1]).collect();
    expected.sort_unstable();
    assert_eq!(published(&output.name), expected);
    let sum = |outcome: &str| -> f64 {
        (0..2)
            .map(|p| {
                worker.metric(
                    "dedupe_forgotten_ids_total",
                    &[("partition", &p.to_string()), ("outcome", outcome)],
                )
            })
            .sum()
    };
    // Each id is forgotten on the partition of each common partitioner (one or two), and
    // published again on the one its record is on.
    assert!(sum("forgotten") >= 3.0, "{}", sum("forgotten"));
    assert_eq!(sum("resent"), 2.0);

    // The audit holds each forget, with who asked and why.
    let forgets: Vec<serde_json::Value> = consume_all(&format!("{}.duplicates", output.name), true)
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap()).unwrap())
        .filter(|v: &serde_json::Value| v["event"] == "forget")
        .collect();
    assert_eq!(
        forgets.len() as f64,
        sum("forgotten"),
        "one per id and partition"
    );
    for f in &forgets {
        assert_eq!(
            (f["by"].as_str(), f["reason"].as_str()),
            (Some("alice"), Some("ticket 42"))
        );
        assert!(
            f["at_ms"].as_i64().unwrap() > 0 && f["ledger_key"].is_string(),
            "{f}"
        );
    }
    let mut audited: Vec<&str> = forgets.iter().map(|f| f["id"].as_str().unwrap()).collect();
    audited.sort_unstable();
    audited.dedup();
    let mut asked = vec![ids[0].as_str(), ids[1].as_str(), "never-sent"];
    asked.sort_unstable();
    assert_eq!(audited, asked);

    // A forget, then SIGKILL: the restarted worker still publishes the id's next copy.
    forget(worker.metrics_addr(), &[&ids[3], "--by", "bob"]);
    let audit = format!("{}.duplicates", output.name);
    worker.kill();
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    produce_full(&input.name, &[event(&ids, 3), event(&ids, 4)]);
    sent += 2;
    wait_for_records(&output.name, 23, Duration::from_secs(60));

    // A forget read from a file, then the ledger lost: the new one is loaded from the changelog,
    // forgets and re-sends included.
    let file = dir.path().join("ids.txt");
    std::fs::write(&file, format!("# deletion request\n{}\n\n", ids[5])).unwrap();
    // Without --by, the user running the command is who asks.
    let out = DEDUPE
        .forget_command(worker.metrics_addr())
        .args(["--file", file.to_str().unwrap()])
        .env("USER", "carol")
        .output()
        .expect("dedupe forget");
    assert!(out.status.success(), "{out:?}");
    let by_carol = consume_all(&audit, true).iter().any(|r| {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        v["id"] == ids[5].as_str() && v["by"].as_str().is_some_and(|b| b.starts_with("carol@"))
    });
    assert!(by_carol, "the audit names carol@HOST");
    worker.terminate(Duration::from_secs(30));
    // The stopped worker's ledger counts its marks: 5 forgotten on one or two partitions, 3 and
    // the two re-sent before it marked resent on the partition their copy was on.
    let stats = DEDUPE
        .command()
        .args(["ledger", "stats", "--brokers", &brokers()])
        .args(["--data-dir", ledger.to_str().unwrap()])
        .output()
        .expect("dedupe ledger stats");
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    assert_eq!(stats["resent_ids"], 3, "{stats}");
    assert!(stats["forgotten_ids"].as_u64().unwrap() >= 2, "{stats}");
    std::fs::remove_dir_all(&ledger).unwrap();
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    // 5 was forgotten: published; 0 and 3 were re-sent after their forget: dropped; 6: dropped.
    produce_full(
        &input.name,
        &[
            event(&ids, 5),
            event(&ids, 0),
            event(&ids, 3),
            event(&ids, 6),
        ],
    );
    sent += 4;
    wait_for_records(&output.name, 24, Duration::from_secs(60));
    let _ = sent;
    std::thread::sleep(Duration::from_secs(2));
    let mut expected: Vec<usize> = (0..20).chain([0, 1, 3, 5]).collect();
    expected.sort_unstable();
    assert_eq!(published(&output.name), expected);
    worker.terminate(Duration::from_secs(30));
}

#[test]
fn a_forget_with_an_empty_by_or_for_a_partition_not_owned_is_refused_and_changes_nothing() {
    let input = TestTopic::create("forget-refused-in", 2);
    let output = TestTopic::create("forget-refused-out", 2);
    let dir = tempfile::tempdir().unwrap();
    let mut spec = DEDUPE.worker(&input.name, &output.name, &dir.path().join("ledger"));
    spec.partitions = Some("0".to_string());
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    let ids = ids(40);
    let run = |args: &[&str]| {
        DEDUPE
            .forget_command(worker.metrics_addr())
            .args(args)
            .output()
            .expect("dedupe forget")
    };
    // A web page cannot forget: a request with an Origin header is refused before anything.
    let page = ureq::delete(&format!(
        "http://{}/admin/ids/{}?by=mallory",
        worker.metrics_addr(),
        ids[0]
    ))
    .set("Origin", "http://pages.example")
    .call();
    assert!(matches!(page, Err(ureq::Error::Status(403, _))), "{page:?}");
    // An empty --by: refused, naming the field.
    let out = run(&[&ids[0], "--by", " "]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("by: say who asks"));
    // An id of partition 1 (by either partitioner), which this worker does not own: named,
    // exit 2, nothing forgotten.
    let other = ids
        .iter()
        .find(|id| {
            InputPartitioner::ALL
                .iter()
                .all(|p| p.partition(id.as_bytes(), 2) == Some(1))
        })
        .unwrap();
    let out = run(&[other, "--by", "alice"]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("does not own"), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 of 1 ids were not forgotten"));
    assert_eq!(
        worker.metric(
            "dedupe_forgotten_ids_total",
            &[("partition", "0"), ("outcome", "forgotten")]
        ),
        0.0
    );
    worker.terminate(Duration::from_secs(30));
}

#[test]
fn a_worker_that_dies_between_a_forgets_commit_and_its_mark_applies_it_on_restart() {
    let input = TestTopic::create("forget-crash-in", 2);
    let output = TestTopic::create("forget-crash-out", 2);
    let dir = tempfile::tempdir().unwrap();
    // Ids whose partition both common partitioners agree on: the forget goes to one partition,
    // whose pipeline dies after its commit.
    let ids: Vec<String> = ids(200)
        .into_iter()
        .filter(|id| {
            let [a, b] = InputPartitioner::ALL.map(|p| p.partition(id.as_bytes(), 2));
            a == b
        })
        .take(10)
        .collect();
    // The default configuration: the default ledger budget, batches and linger.
    let spec = DEDUPE
        .worker(&input.name, &output.name, &dir.path().join("ledger"))
        .without("DEDUPE_WORKER_BATCH_MAX_RECORDS")
        .without("DEDUPE_WORKER_BATCH_LINGER_MS")
        .without("DEDUPE_LEDGER_BUDGET_BYTES")
        .without("DEDUPE_LEDGER_WRITE_BUFFER_BYTES");
    let mut worker = spec
        .clone()
        .env("FAILPOINTS", "forget-after-commit=return")
        .start();
    worker.wait_ready(Duration::from_secs(60));
    let all: Vec<Outgoing> = (0..10).map(|i| event(&ids, i)).collect();
    produce_full(&input.name, &all);
    wait_for_records(&output.name, 10, Duration::from_secs(60));
    // The worker commits the forget, then dies before its ledger marks the id: no answer.
    let out = DEDUPE
        .forget_command(worker.metrics_addr())
        .args([ids[4].as_str(), "--by", "alice"])
        .output()
        .expect("dedupe forget");
    assert!(!out.status.success(), "the worker died before it answered");
    assert_eq!(worker.wait(Duration::from_secs(30)), Some(86));
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    produce_full(&input.name, &[event(&ids, 4), event(&ids, 5)]);
    worker.wait_settled(2, Duration::from_secs(60));
    assert_eq!(published(&output.name), [0, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9]);
    worker.terminate(Duration::from_secs(30));
}

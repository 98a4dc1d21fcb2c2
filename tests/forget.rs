//! `dedupe forget` against the real broker: a forgotten id's next copy is published once, the copy
//! after it is dropped, the audit topic holds each forget with who asked; a forget holds across a
//! SIGKILL of the worker (its mark is durable), across a crash between its commit and its mark
//! (recovery reads the marker back), and across a lost ledger (the new ledger is loaded from the
//! id changelog, whose marker records bring the forgets back, and the re-sends after them); a
//! number id read from the value is named with `--json-id`, and its bare digits are refused.

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
fn a_forgets_exit_code_says_whether_all_some_or_none_of_its_ids_were_forgotten() {
    let input = TestTopic::create("forget-refused-in", 2);
    let output = TestTopic::create("forget-refused-out", 2);
    let dir = tempfile::tempdir().unwrap();
    let mut spec = DEDUPE.worker(&input.name, &output.name, &dir.path().join("ledger"));
    spec.partitions = Some("0".to_string());
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    let ids = ids(80);
    let run = |args: &[&str]| {
        DEDUPE
            .forget_command(worker.metrics_addr())
            .args(args)
            .output()
            .expect("dedupe forget")
    };
    // An id whose partitions under the two common partitioners are `murmur` and `crc`.
    let on = |murmur: i32, crc: i32| {
        ids.iter()
            .find(|id| {
                InputPartitioner::Murmur2Random.partition(id.as_bytes(), 2) == Some(murmur)
                    && InputPartitioner::ConsistentRandom.partition(id.as_bytes(), 2) == Some(crc)
            })
            .unwrap()
            .as_str()
    };
    let (mine, other, split) = (on(0, 0), on(1, 1), on(1, 0));
    let forgotten = |p: &str| {
        worker.metric(
            "dedupe_forgotten_ids_total",
            &[("partition", p), ("outcome", "forgotten")],
        )
    };
    // A web page cannot forget: a request with an Origin header is refused before anything.
    let page = ureq::delete(&format!(
        "http://{}/admin/ids/{}?by=mallory",
        worker.metrics_addr(),
        mine
    ))
    .set("Origin", "http://pages.example")
    .call();
    assert!(matches!(page, Err(ureq::Error::Status(403, _))), "{page:?}");
    // An empty --by: refused, naming the field.
    let out = run(&[mine, "--by", " "]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("by: say who asks"));
    // An id of partition 1 (by either partitioner), which this worker does not own: named,
    // exit 2, nothing forgotten.
    let out = run(&[other, "--by", "alice"]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("does not own"), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 of 1 ids were not forgotten"));
    assert_eq!(forgotten("0"), 0.0);
    // An id whose configured partitioner (murmur2) puts it on partition 1, not owned here, and
    // librdkafka's on partition 0: forgotten on 0 only, which is partial (its next copy on 1 is
    // still dropped by the worker that owns 1): exit 1, and said so.
    let out = run(&[split, "--by", "alice"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&answer["forgotten"], &answer["partial"], &answer["failed"]),
        (&0.into(), &1.into(), &0.into()),
        "{answer}"
    );
    assert!(
        stderr.contains("1 of 1 ids were not forgotten on every partition"),
        "{stderr}"
    );
    assert_eq!(forgotten("0"), 1.0);
    // Every id on partitions this worker owns: exit 0. With one it does not own: exit 1.
    let out = run(&[mine, "--by", "alice"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("forgot 1 ids"));
    let out = run(&[mine, other, "--by", "alice"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
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

/// The ids of `all` whose two common partitioners put them on different partitions of a topic of
/// `partitions`, with (murmur2's, crc32's) partition.
fn split_ids(all: &[String], partitions: i32) -> Vec<(String, i32, i32)> {
    all.iter()
        .filter_map(|id| {
            let murmur = InputPartitioner::Murmur2Random.partition(id.as_bytes(), partitions)?;
            let crc = InputPartitioner::ConsistentRandom.partition(id.as_bytes(), partitions)?;
            (murmur != crc).then(|| (id.clone(), murmur, crc))
        })
        .collect()
}

/// How many records of `output` hold each of `ids` (read_committed), by the `n` in their value.
fn copies(output: &str, n: usize) -> usize {
    published(output).iter().filter(|&&m| m == n).count()
}

#[test]
fn a_forget_lets_exactly_one_more_copy_through_whichever_partitioner_re_sends_it() {
    let input = TestTopic::create("forget-two-in", 2);
    let output = TestTopic::create("forget-two-out", 2);
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let split = split_ids(&ids(60), 2);
    assert!(split.len() >= 3, "ids on two partitions");
    let ids: Vec<String> = split.iter().map(|(id, ..)| id.clone()).collect();
    // A copy of id `i` sent through the Java client's partitioner (murmur2) or librdkafka's
    // (crc32): to the partition each computes.
    let via = |i: usize, murmur: bool| {
        let (_, m, c) = &split[i];
        produce_full_to(
            &input.name,
            Some(if murmur { *m } else { *c }),
            &[event(&ids, i)],
        );
    };
    // The default configuration: one worker owning both partitions, with the default ledger
    // budget, batches and linger.
    let spec = DEDUPE
        .worker(&input.name, &output.name, &ledger)
        .without("DEDUPE_WORKER_BATCH_MAX_RECORDS")
        .without("DEDUPE_WORKER_BATCH_LINGER_MS")
        .without("DEDUPE_LEDGER_BUDGET_BYTES")
        .without("DEDUPE_LEDGER_WRITE_BUFFER_BYTES");
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    // The first copy of each id, through murmur2.
    for i in 0..3 {
        via(i, true);
    }
    let mut sent = 3;
    worker.wait_settled(sent, Duration::from_secs(60));
    assert_eq!(published(&output.name), [0, 1, 2]);

    // Ids 0 and 1 forgotten: on both of their partitions, in full.
    let answer = forget(worker.metrics_addr(), &[&ids[0], &ids[1], "--by", "alice"]);
    let first: serde_json::Value = serde_json::from_str(answer.lines().next().unwrap()).unwrap();
    assert_eq!(
        (&first["forgotten"], &first["partial"], &first["failed"]),
        (&2.into(), &0.into(), &0.into()),
        "{answer}"
    );
    assert_eq!(first["done"].as_array().map(Vec::len), Some(2), "{answer}");
    // Id 0 re-sent through crc32 first, then through murmur2: the first is published, the
    // second dropped. Id 1 the other way round. One at a time, each settled before the next.
    for (i, murmur_first) in [(0, false), (1, true)] {
        via(i, murmur_first);
        sent += 1;
        worker.wait_settled(sent, Duration::from_secs(60));
        assert_eq!(copies(&output.name, i), 2, "id {i}: its one more copy");
        via(i, !murmur_first);
        sent += 1;
        worker.wait_settled(sent, Duration::from_secs(60));
        assert_eq!(copies(&output.name, i), 2, "id {i}: the next copy dropped");
        // No forget left behind on the partition the copy did not come through.
        let (answer, _) = DEDUPE.explain(&ledger, worker.metrics_addr(), &ids[i], &[]);
        assert_eq!(
            (
                answer["held"].as_bool(),
                answer["forgotten"].as_array().map(Vec::len)
            ),
            (Some(true), Some(0)),
            "{answer}"
        );
    }
    // Id 2, never forgotten: dropped through either partitioner.
    via(2, false);
    sent += 1;
    worker.wait_settled(sent, Duration::from_secs(60));
    let resent: f64 = (0..2)
        .map(|p| {
            worker.metric(
                "dedupe_forgotten_ids_total",
                &[("partition", &p.to_string()), ("outcome", "resent")],
            )
        })
        .sum();
    assert_eq!(resent, 2.0);
    assert_eq!(published(&output.name), [0, 0, 1, 1, 2]);

    // After a SIGKILL, and again after the ledger is lost (loaded from both changelogs, whose
    // markers are ordered by their times), a copy through either partitioner is still dropped.
    worker.kill();
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    via(0, false);
    via(1, true);
    worker.wait_settled(2, Duration::from_secs(60));
    worker.terminate(Duration::from_secs(30));
    let stats = DEDUPE
        .command()
        .args(["ledger", "stats", "--brokers", &brokers()])
        .args(["--data-dir", ledger.to_str().unwrap()])
        .output()
        .expect("dedupe ledger stats");
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    assert_eq!(
        (&stats["forgotten_ids"], &stats["resent_ids"]),
        (&0.into(), &2.into()),
        "{stats}"
    );
    std::fs::remove_dir_all(&ledger).unwrap();
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    via(0, true);
    via(1, false);
    worker.wait_settled(2, Duration::from_secs(60));
    assert_eq!(published(&output.name), [0, 0, 1, 1, 2]);
    worker.terminate(Duration::from_secs(30));

    // Id 0's murmur2 partition, loaded alone into a new ledger (as a partition moved to another
    // worker is): it holds id 0's first copy and its forget, ended by the copy published on the
    // crc32 partition, whose transaction wrote the re-send's marker here too. A copy through
    // murmur2 is dropped.
    let (_, murmur, _) = split[0];
    let mut alone = spec.clone();
    alone.data_dir = dir.path().join("alone");
    alone.partitions = Some(murmur.to_string());
    let mut worker = alone.start();
    worker.wait_ready(Duration::from_secs(60));
    via(0, true);
    worker.wait_settled(1, Duration::from_secs(60));
    let (answer, _) = DEDUPE.explain(&alone.data_dir, worker.metrics_addr(), &ids[0], &[]);
    assert_eq!(answer["held"].as_bool(), Some(true), "{answer}");
    assert_eq!(published(&output.name), [0, 0, 1, 1, 2]);
    worker.terminate(Duration::from_secs(30));
}

#[test]
fn a_token_with_a_trailing_newline_works_and_is_never_printed_and_odd_ids_and_closed_pipes_are_handled(
) {
    let input = TestTopic::create("forget-token-in", 1);
    let output = TestTopic::create("forget-token-out", 1);
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    // As a Kubernetes Secret made from a file holds it.
    let token = "tok3n-from-a-file-9f2c";
    let mounted = format!("{token}\n");
    let mut worker = DEDUPE
        .worker(&input.name, &output.name, &ledger)
        .env("DEDUPE_ADMIN_TOKEN", &mounted)
        .start();
    worker.wait_ready(Duration::from_secs(60));
    let ids = ids(2);
    produce_full(&input.name, &[event(&ids, 0)]);
    wait_for_records(&output.name, 1, Duration::from_secs(60));
    // Everything the commands print, to look for the token in.
    let printed = std::cell::RefCell::new(String::new());
    let keep = |out: &std::process::Output| {
        let mut printed = printed.borrow_mut();
        printed.push_str(&String::from_utf8_lossy(&out.stdout));
        printed.push_str(&String::from_utf8_lossy(&out.stderr));
    };
    let metrics = worker.metrics_addr();
    let forget_with = |token: &str, args: &[&str]| {
        DEDUPE
            .forget_command(metrics)
            .env("DEDUPE_ADMIN_TOKEN", token)
            .args(args)
            .output()
            .expect("dedupe forget")
    };
    let explain_with = |token: &str, id: &str| {
        let mut command = DEDUPE.command();
        command
            .args(["explain", id, "--brokers", &brokers()])
            .args(["--data-dir", ledger.to_str().unwrap()])
            .args(["--metrics-addr", &metrics.to_string()])
            .env("DEDUPE_ADMIN_TOKEN", token);
        command
    };

    // The client with the same mounted token: both commands work.
    let out = forget_with(&mounted, &[&ids[0], "--by", "alice"]);
    keep(&out);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = explain_with(&mounted, &ids[0]).output().unwrap();
    keep(&out);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("forgotten"));
    // A wrong token: refused (401), exit 2, and neither token printed.
    let out = forget_with("wr0ng-t0ken\n", &[&ids[1], "--by", "alice"]);
    keep(&out);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{out:?}"
    );
    assert!(
        !printed.borrow().contains("wr0ng-t0ken"),
        "{}",
        printed.borrow()
    );
    // A token a header cannot carry: refused before any request, without echoing it.
    let out = forget_with(
        &format!("{token}\nX-Injected: 1"),
        &[&ids[1], "--by", "alice"],
    );
    keep(&out);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("DEDUPE_ADMIN_TOKEN"));
    assert!(
        !printed.borrow().contains("X-Injected"),
        "{}",
        printed.borrow()
    );

    // An id that is not UTF-8 once percent-decoded: refused with 400, naming the cause, for
    // explain and forget alike; so is a source that is not.
    let bearer = format!("Bearer {token}");
    let auth = [("Authorization", bearer.as_str())];
    for (method, path) in [
        ("GET", "/admin/ids/%FF%FEab"),
        ("DELETE", "/admin/ids/ab%C3?by=alice"),
        ("GET", "/admin/ids/ab?source=w%FFeb"),
        ("DELETE", "/admin/ids/ab?by=alice&source=%80"),
    ] {
        let response = http::request(worker.metrics_addr(), method, path, &auth, b"").unwrap();
        assert_eq!(
            response.status,
            400,
            "{method} {path}: {:?}",
            response.json()
        );
        let error = response.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(error.contains("not UTF-8"), "{method} {path}: {error}");
    }
    assert_eq!(
        worker.metric(
            "dedupe_forgotten_ids_total",
            &[("partition", "0"), ("outcome", "forgotten")]
        ),
        1.0,
        "nothing forgotten by the refused requests"
    );
    // A UTF-8 id, percent-encoded, is taken as it is.
    let response = http::request(
        worker.metrics_addr(),
        "GET",
        "/admin/ids/caf%C3%A9%2F1",
        &auth,
        b"",
    )
    .unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["id"], "café/1");

    // A reader that stops early (`| head -1`): the commands end quietly, with their exit code.
    for (what, mut command) in [
        ("explain", explain_with(&mounted, &ids[0])),
        ("forget", {
            let mut c = DEDUPE.forget_command(worker.metrics_addr());
            c.env("DEDUPE_ADMIN_TOKEN", &mounted)
                .args([ids[1].as_str(), "--by", "alice"]);
            c
        }),
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = command.stdout(writer).output().unwrap();
        keep(&out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{what}: {stderr}");
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    }
    // As an operator types it.
    let mut sh = std::process::Command::new("sh");
    sh.arg("-c")
        .arg(format!(
            "\"$0\" explain '{}' --brokers '{}' --metrics-addr '{}' | head -1",
            ids[0],
            brokers(),
            worker.metrics_addr()
        ))
        .arg(DEDUPE.path())
        .env("DEDUPE_ADMIN_TOKEN", &mounted);
    let out = sh.output().unwrap();
    keep(&out);
    assert!(out.status.success(), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "{out:?}"
    );

    // The worker gone: the client's error names the address, not the token.
    assert_eq!(worker.terminate(Duration::from_secs(30)), Some(0));
    let out = forget_with(&mounted, &[&ids[1], "--by", "alice"]);
    keep(&out);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let printed = printed.into_inner();
    assert!(
        !printed.contains(token),
        "the token was printed:\n{printed}"
    );
    assert!(!worker.log_text().contains(token), "the token was logged");
}

/// A number id read from the record value (`json:/id`) is named by `--json-id`: explained held,
/// forgotten (its next copy published once, the one after it dropped). Its digits given bare name
/// the string of them, which the worker does not hold: explain and forget refuse them (exit 2)
/// naming both ways to ask, never answering `never_seen` or "forgot", and the number stays held.
#[test]
fn a_number_id_is_named_with_json_id_and_its_bare_digits_are_refused_not_answered() {
    let input = TestTopic::create("forget-number-in", 2);
    let output = TestTopic::create("forget-number-out", 2);
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let spec = DEDUPE
        .worker(&input.name, &output.name, &ledger)
        .env("DEDUPE_WORKER_ID_SOURCE", "json:/id");
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(60));
    let metrics = worker.metrics_addr();
    let digits = "12345678901234567890";
    // Each copy keyed by the id's text, as `dedupe rekey` keys it; the value holds the number.
    let copy = |n: usize| -> Outgoing {
        (
            Some(digits.as_bytes().to_vec()),
            Some(format!(r#"{{"id":{digits},"n":{n}}}"#).into_bytes()),
            Vec::new(),
        )
    };
    let partition = produce_full(&input.name, &[copy(0)])[0].0.to_string();
    wait_for_records(&output.name, 1, Duration::from_secs(60));
    let mut sent = 1;

    // Named as the number: held, and said to be a number.
    let (answer, sentence) = DEDUPE.explain(&ledger, metrics, &format!("--json-id={digits}"), &[]);
    assert_eq!(
        (answer["held"].as_bool(), answer["json_number"].as_bool()),
        (Some(true), Some(true)),
        "{sentence}"
    );
    assert!(sentence.contains("(a JSON number)"), "{sentence}");
    // The bare digits: refused, naming both ways; nothing on standard output.
    let bare = DEDUPE
        .command()
        .args(["explain", digits, "--brokers", &brokers()])
        .args(["--metrics-addr", &metrics.to_string()])
        .output()
        .expect("dedupe explain");
    let stderr = String::from_utf8_lossy(&bare.stderr);
    assert_eq!(bare.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("--json-id {digits}"))
            && stderr.contains(&format!("--json-id '\"{digits}\"'")),
        "{stderr}"
    );
    assert!(
        bare.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&bare.stdout)
    );
    // Forgetting the bare digits: refused the same way, exit 2, never "forgot".
    let refused = DEDUPE
        .forget_command(metrics)
        .args([digits, "--partition", &partition, "--by", "alice"])
        .output()
        .expect("dedupe forget");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("--json-id {digits}")), "{stderr}");
    assert!(!String::from_utf8_lossy(&refused.stdout).contains("forgot"));
    // So the number is still held: its next copy is dropped.
    produce_full(&input.name, &[copy(1)]);
    sent += 1;
    worker.wait_settled(sent, Duration::from_secs(60));
    assert_eq!(published(&output.name), vec![0]);

    // Forgotten as the number: the next copy is published, the one after it dropped.
    let forgot = forget(
        metrics,
        &[
            "--json-id",
            digits,
            "--partition",
            &partition,
            "--by",
            "alice",
        ],
    );
    assert!(forgot.contains("forgot 1 ids"), "{forgot}");
    produce_full(&input.name, &[copy(2)]);
    sent += 1;
    worker.wait_settled(sent, Duration::from_secs(60));
    produce_full(&input.name, &[copy(3)]);
    sent += 1;
    worker.wait_settled(sent, Duration::from_secs(60));
    assert_eq!(published(&output.name), vec![0, 2]);
    worker.terminate(Duration::from_secs(30));
}

//! Faults outside the worker, on a three-node KRaft cluster (`deploy/local/cluster.sh`:
//! replication factor 3, `min.insync.replicas=2`, the transaction state and offsets topics
//! replicated three ways).
//!
//! Each fault test produces load from before its fault until every output partition grows again
//! after it (1,000 records/s, 5% of ids re-sent, many of them 5 s or more after their first copy),
//! restarts the worker whenever it exits (as its orchestrator would, and counts that), then checks
//! the output twice: `dedupe verify`, and the kit's own count (every input id exactly once, in its
//! own partition, as its first copy, in the order of its first copies).
//!
//! The worker runs its default configuration. The default run pauses a node 65 s and cuts one off
//! or takes the whole cluster down for 60 s, past every client timeout; `DEDUPE_CLUSTER_LONG=1`
//! runs the long variants: 30 kills, three rolling restarts, a pause of 130 s, a cut and an
//! outage of 180 s. Each prints one `cluster-fault:` line for the fault table in docs/testing.md,
//! with the longest time an output partition stood still.
//!
//! The cluster also has a SASL_SSL listener (SCRAM-SHA-512 over TLS, ACLs enforced) for the
//! security tests at the end, and a network namespace joined to it by a veth pair, where a
//! worker can be cut off from one node. The tests share the cluster and run one at a time (the
//! `cluster` test group, `.config/nextest.toml`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use kit::cluster::{cluster, long, Operation, Resource};
use kit::worker::Supervised;
use kit::*;
use rand::Rng;

/// The binary under test, built by cargo for this test run.
const DEDUPE: Dedupe = Dedupe::at(env!("CARGO_BIN_EXE_dedupe"));

/// How long a pause, a cut or an outage lasts: `secs`, or `long_secs` in the long variants.
fn hold(secs: u64, long_secs: u64) -> Duration {
    Duration::from_secs(if long() { long_secs } else { secs })
}

/// One fault test: topics, a supervised worker, load produced while the fault runs.
struct Scenario {
    fault: &'static str,
    input: TestTopic,
    output: TestTopic,
    dir: tempfile::TempDir,
    group: String,
    worker: Supervised,
    load: Load,
    stalls: StallMeter,
    started: Instant,
    /// When every output partition was first seen growing.
    flowing: Instant,
}

/// What a fault's stall is measured on.
enum Stall {
    /// The longest time any output partition stood still.
    Any,
    /// The longest time a partition other than these stood still (a node their transactions
    /// need was cut off from the worker, so nothing could commit them), and how long after the
    /// link came back they grew again.
    Except(Vec<i32>),
    /// How long after the last node was back every output partition grew again.
    AfterOutage,
    /// Per fault, the longest time a partition stood still among the stills that overlap the
    /// fault's span (from the fault until every partition grew again after the repair).
    PerFault(Vec<(Instant, Instant)>),
}

const PARTITIONS: i32 = 3;

impl Scenario {
    /// Starts the worker and the load.
    fn start(fault: &'static str) -> Self {
        Self::start_with(fault, |spec| spec)
    }

    /// Starts the worker (its spec changed by `adapt`) and the load, and waits until the worker
    /// publishes on every output partition.
    fn start_with(fault: &'static str, adapt: impl FnOnce(WorkerSpec) -> WorkerSpec) -> Self {
        let _ = cluster();
        let input = TestTopic::create("cluster-in", PARTITIONS);
        let output = TestTopic::create("cluster-out", PARTITIONS);
        let dir = tempfile::tempdir().unwrap();
        // The worker's own batching and timeouts: its defaults.
        let spec = DEDUPE
            .worker(&input.name, &output.name, &dir.path().join("ledger"))
            .without("DEDUPE_WORKER_BATCH_MAX_RECORDS")
            .without("DEDUPE_WORKER_BATCH_LINGER_MS");
        let spec = adapt(spec);
        let group = spec
            .env
            .iter()
            .find(|(k, _)| k == "DEDUPE_WORKER_GROUP_ID")
            .expect("the spec names its group")
            .1
            .clone();
        let worker = Supervised::start(&spec);
        let stalls = StallMeter::start(&output.name, PARTITIONS);
        let started = Instant::now();
        let load = Load::start(&input.name, LoadSpec::default());
        stalls.wait_flowing(started, Duration::from_secs(120));
        let flowing = Instant::now();
        Self {
            fault,
            input,
            output,
            dir,
            group,
            worker,
            load,
            stalls,
            started,
            flowing,
        }
    }

    /// Ends the load once every output partition grows again after the fault (`healed`), waits
    /// until the output holds every id, stops the worker, and checks that the output holds every
    /// input id exactly once, in its partition, as its first copy, in order.
    fn finish(self, injected: usize, healed: Instant, measured: Stall) {
        let Scenario {
            fault,
            input,
            output,
            dir,
            worker,
            load,
            stalls,
            started,
            flowing,
            ..
        } = self;
        stalls.wait_flowing(healed, Duration::from_secs(300));
        let load = load.finish();
        let growth = stalls.finish();
        // The line's figures, the worst of them and its target (the issue's: a kill or the
        // outage's recovery 15 s, any other fault 25 s).
        let overall = growth.longest_stall(flowing, &[]);
        let (stall, worst, target) = match measured {
            Stall::Any => {
                let each: Vec<f64> = (0..PARTITIONS)
                    .map(|p| {
                        let others: Vec<i32> = (0..PARTITIONS).filter(|o| *o != p).collect();
                        (growth.longest_stall(flowing, &others).as_secs_f64() * 10.0).round() / 10.0
                    })
                    .collect();
                (
                    format!(
                        "longest stall {:.1} s (per partition {each:?} s)",
                        overall.as_secs_f64()
                    ),
                    overall,
                    25,
                )
            }
            Stall::Except(cut) => {
                let others = growth.longest_stall(flowing, &cut);
                let back = growth.back_after(healed, &cut).unwrap_or(Duration::MAX);
                let line = format!(
                    "longest stall {:.1} s of the partitions whose transactions did not need the node; partitions {cut:?} grew again {:.1} s after the link came back",
                    others.as_secs_f64(),
                    back.as_secs_f64()
                );
                (line, others.max(back), 25)
            }
            Stall::PerFault(spans) => {
                let each: Vec<Duration> = spans
                    .iter()
                    .map(|(from, to)| growth.longest_stall_during(*from, *to))
                    .collect();
                let worst = each.iter().copied().max().unwrap_or_default();
                let line = format!(
                    "longest stall {:.1} s (per fault {:?} s; longest overall {:.1} s)",
                    worst.as_secs_f64(),
                    each.iter()
                        .map(|s| (s.as_secs_f64() * 10.0).round() / 10.0)
                        .collect::<Vec<_>>(),
                    overall.as_secs_f64()
                );
                (line, worst, 15)
            }
            Stall::AfterOutage => {
                let back = growth.back_after(healed, &[]).unwrap_or(Duration::MAX);
                let line = format!(
                    "every partition grew again {:.1} s after the last node was back (longest stall {:.1} s, the outage included)",
                    back.as_secs_f64(),
                    overall.as_secs_f64()
                );
                (line, back, 15)
            }
        };
        // What the worker said through the fault, for finding what held a stall: on request, and
        // whenever a stall ran past half its target (such runs are rare and come mostly in full
        // suites, where nothing else keeps the worker's log).
        if std::env::var_os("DEDUPE_CLUSTER_WORKER_LOG").is_some()
            || worst > Duration::from_secs(target) / 2
        {
            let log = worker.worker.lock().unwrap().log_text();
            eprintln!(
                "worker log ({fault}):\n{}",
                log.lines()
                    .filter(|l| !l.contains("DEBUG"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        let distinct = load.distinct as usize;
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            worker.wait_for_output(&output.name, distinct, Duration::from_secs(300))
        }));
        if waited.is_err() {
            // Said last, where a long failure's output is not cut: what the output lacks, per
            // partition (the worker's metrics and log tail are in the message above).
            panic!(
                "{fault}: the output stopped short of the input's {distinct} ids: {}",
                shortfall(&input.name, &output.name)
            );
        }
        let exits = worker.finish();
        let count = Count::of(&input.name, &output.name);
        eprintln!(
            "cluster-fault: {fault} | injected {injected} | in {} | out {} | duplicates {} | missing {} | worker restarts {} (exit codes {exits:?}) | {stall} | load {:.0} s",
            count.input_records,
            count.output_records,
            count.duplicates,
            count.missing,
            exits.len(),
            started.elapsed().as_secs_f64()
        );
        exactly_once::assert_exactly_once(DEDUPE, &input.name, &output.name, distinct, fault);
        assert!(
            exits.iter().all(|c| *c != Some(0)),
            "{fault}: the worker exited 0 by itself: {exits:?}"
        );
        drop(dir);
    }
}

/// Per partition: the input's distinct ids, the output's records, and the ids missing from it.
fn shortfall(input: &str, output: &str) -> String {
    let (input, output) = (consume_all(input, true), consume_all(output, true));
    let out: HashSet<(i32, Vec<u8>)> = output
        .iter()
        .map(|r| (r.partition, r.key.clone().unwrap_or_default()))
        .collect();
    (0..PARTITIONS)
        .map(|p| {
            let ids: HashSet<&[u8]> = input
                .iter()
                .filter(|r| r.partition == p)
                .map(|r| r.key.as_deref().unwrap_or_default())
                .collect();
            let published = output.iter().filter(|r| r.partition == p).count();
            let missing = ids
                .iter()
                .filter(|id| !out.contains(&(p, id.to_vec())))
                .count();
            format!(
                "partition {p}: {} ids in, {published} out, {missing} missing",
                ids.len()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// SIGKILL and restart (on its data) of the node that leads an input partition, an output
/// partition, a partition's transaction coordinator, or the group coordinator, in turn, at random
/// moments under load. Each kill meets a whole cluster (every replica in sync, every output
/// partition flowing) and its stall is measured alone: the fault is one node's death. The long
/// variant kills at random moments without waiting, so kills compound (a node killed while the
/// last one still catches up leaves partitions under `min.insync.replicas`).
#[test]
fn leaders_and_coordinators_killed_at_random_moments() {
    let kills = if long() { 30 } else { 8 };
    let s = Scenario::start("SIGKILL + restart of a leader or coordinator");
    let c = cluster();
    let mut rng = rand::rng();
    let kinds = [
        "input leader",
        "output leader",
        "transaction coordinator",
        "group coordinator",
    ];
    let mut spans = Vec::new();
    for kill in 0..kills {
        if !long() {
            c.wait_in_sync();
            s.stalls
                .wait_flowing(Instant::now(), Duration::from_secs(120));
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(500..3000)));
        let partition = rng.random_range(0..PARTITIONS);
        let txn = dedupe::output::transactional_id(&s.output.name, partition);
        let kind = kinds[kill % kinds.len()];
        let victim = c.wait_for(kind, |c| match kill % kinds.len() {
            0 => c.leader(&s.input.name, partition),
            1 => c.leader(&s.output.name, partition),
            2 => c.transaction_coordinator(&txn),
            _ => c.group_coordinator(&s.group),
        });
        let controller = if c.active_controller() == Some(victim) {
            ", the active controller"
        } else {
            ""
        };
        eprintln!("kill {kill}: node {victim} ({kind} of partition {partition}{controller})");
        let killed = Instant::now();
        c.kill(victim);
        std::thread::sleep(Duration::from_millis(rng.random_range(0..4000)));
        c.start(victim);
        if !long() {
            s.stalls
                .wait_flowing(Instant::now(), Duration::from_secs(120));
            spans.push((killed, Instant::now()));
        }
    }
    let measured = if long() {
        Stall::Any
    } else {
        Stall::PerFault(spans)
    };
    s.finish(kills, Instant::now(), measured);
}

/// Every node stopped cleanly (SIGTERM) and started again, one after the other, under load.
#[test]
fn a_rolling_restart_of_every_node() {
    let rounds = if long() { 3 } else { 1 };
    let s = Scenario::start("rolling restart (SIGTERM, start) of all three nodes");
    let c = cluster();
    for _ in 0..rounds {
        for node in kit::cluster::NODES {
            c.stop(node);
            c.start(node);
            c.wait_for_leaders(&s.output.name, PARTITIONS);
        }
    }
    s.finish(3 * rounds, Instant::now(), Stall::Any);
}

/// A node that hangs (SIGSTOP) for longer than the worker's transaction timeout and its clients'
/// socket timeout, then resumes: the cluster fences it and moves its leaders; the worker's
/// transactions on it time out. The node paused is the active KRaft controller when that node
/// coordinates a partition's transactions (the worst case: the cluster first elects a new
/// controller, which then gives the silent node a whole session timeout before it moves its
/// leaders), otherwise partition 0's coordinator.
#[test]
fn a_node_paused_past_the_transaction_and_client_timeouts() {
    let s = Scenario::start(
        "SIGSTOP of the transaction coordinator past transaction.timeout.ms, then SIGCONT",
    );
    let c = cluster();
    let coordinators: Vec<i32> = (0..PARTITIONS)
        .map(|p| {
            let id = dedupe::output::transactional_id(&s.output.name, p);
            c.wait_for("transaction coordinator", |c| {
                c.transaction_coordinator(&id)
            })
        })
        .collect();
    let controller = c.active_controller();
    let victim = controller
        .filter(|n| coordinators.contains(n))
        .unwrap_or(coordinators[0]);
    eprintln!(
        "pausing node {victim}: transaction coordinators of partitions 0-{} {coordinators:?}, active controller {controller:?}",
        PARTITIONS - 1
    );
    c.pause(victim);
    std::thread::sleep(hold(65, 130));
    c.resume(victim);
    s.finish(1, Instant::now(), Stall::Any);
}

/// The worker cut off from one node past its client timeouts, then reconnected: the worker runs
/// in the network namespace `cluster.sh` made and reaches each node on its own address over a
/// veth pair; a blackhole route there drops every packet to a node leading an output partition
/// (its connections hang, as on a cut cable), while the node stays in the cluster and keeps its
/// leaderships. The partitions whose transactions need that node cannot commit until the link is
/// back; the others must go on.
#[test]
fn a_node_cut_off_from_the_worker_past_its_timeouts() {
    let c = cluster();
    let netns = c.netns();
    let s = Scenario::start_with(
        "a node cut off from the worker (blackhole route), then reconnected",
        |mut spec| {
            spec.wrapper = vec![
                "ip".into(),
                "netns".into(),
                "exec".into(),
                netns.name.clone(),
            ];
            spec.brokers = Some(netns.bootstrap.clone());
            spec.metrics_host = Some(netns.address);
            spec
        },
    );
    // The leader of an output partition, not the group's coordinator if another one will do
    // (every transaction sends its offsets there: cut off, it stalls every partition).
    let group_coordinator = c.group_coordinator(&s.group);
    let victim = c.wait_for("output leader", |c| {
        let leaders: Vec<i32> = (0..PARTITIONS)
            .filter_map(|p| c.leader(&s.output.name, p))
            .collect();
        leaders
            .iter()
            .copied()
            .find(|&n| Some(n) != group_coordinator)
            .or(leaders.first().copied())
    });
    // The partitions the cut leaves without a way to go on: the node leads their input (nobody
    // else serves its records), output or changelog partition, or coordinates their transactions
    // or the group's offsets.
    let changelog = format!("{}.ids", s.output.name);
    let cut: Vec<i32> = (0..PARTITIONS)
        .filter(|&p| {
            let txn = dedupe::output::transactional_id(&s.output.name, p);
            [
                c.leader(&s.input.name, p),
                c.leader(&s.output.name, p),
                c.leader(&changelog, p),
                c.transaction_coordinator(&txn),
                group_coordinator,
            ]
            .contains(&Some(victim))
        })
        .collect();
    c.cut(victim);
    std::thread::sleep(hold(60, 180));
    c.heal(victim);
    s.finish(1, Instant::now(), Stall::Except(cut));
}

/// All three nodes killed at once, down past the worker's client timeouts, then started on their
/// data.
#[test]
fn the_whole_cluster_down_past_the_client_timeouts() {
    let s = Scenario::start("the whole cluster SIGKILLed, down, restarted");
    let c = cluster();
    for node in kit::cluster::NODES {
        c.kill(node);
    }
    std::thread::sleep(hold(60, 180));
    // The nodes are started together: a KRaft quorum needs two of them to elect a controller.
    let starts: Vec<_> = kit::cluster::NODES
        .into_iter()
        .map(|node| std::thread::spawn(move || cluster().start(node)))
        .collect();
    for s in starts {
        s.join().expect("node start");
    }
    let back = Instant::now();
    c.wait_for_leaders(&s.output.name, PARTITIONS);
    s.finish(1, back, Stall::AfterOutage);
}

/// `dedupe rekey` in group mode on the cluster through every kind of rebalance, while nodes are
/// killed and paused: replicas frozen past their session (possibly in the middle of a
/// transaction) and woken as members the group dropped, SIGKILLed and started again, and added.
/// The input holds each source record as often as the source does (its own producer's retries,
/// if any, are counted apart).
#[test]
fn rekey_replicas_copy_each_record_once_through_rebalances_and_broker_faults() {
    let c = cluster();
    let source = TestTopic::create("rekey-faults-src", 6);
    let input = TestTopic::create("rekey-faults-in", 4);
    c.wait_for_leaders(&source.name, 6);
    c.wait_for_leaders(&input.name, 4);
    let dir = tempfile::tempdir().expect("a directory for the logs");
    let output = format!("{}-out", input.name);
    let member = |id: &str| {
        DEDUPE
            .rekey(&source.name, &input.name, &output, dir.path())
            .env("DEDUPE_WORKER_ID_SOURCE", "json:/messageId")
            .env("DEDUPE_WORKER_ASSIGNMENT", "group")
            .env("DEDUPE_WORKER_MEMBER_ID", id)
            .env("DEDUPE_REKEY_BATCH_MAX_RECORDS", "300")
            .start()
    };
    let committing = |r: &kit::rekey::Rekey| {
        wait_until(
            "the rekey replica commits a transaction",
            Duration::from_secs(90),
            Duration::from_millis(100),
            || {
                (r.metric(
                    "dedupe_rekey_transactions_total",
                    &[("outcome", "committed")],
                ) > 0.0)
                    .then_some(())
            },
            || tail(&r.log_text(), 30),
        )
    };
    let rounds = if long() { 4 } else { 1 };
    let load = kit::rekey::SourceLoad::start(
        &source.name,
        40_000 * rounds,
        1_000,
        Duration::from_millis(400),
    );
    let mut a = member("rekey-a");
    let mut b = member("rekey-b");
    committing(&a);
    committing(&b);
    let group = format!("dedupe-rekey.{}", input.name);
    let mut rng = rand::rng();
    let mut extra = Vec::new();
    for round in 0..rounds {
        // The group's coordinator killed and started again.
        let node = c.wait_for("group coordinator", |c| c.group_coordinator(&group));
        eprintln!("round {round}: group coordinator {node} killed");
        c.kill(node);
        std::thread::sleep(Duration::from_millis(rng.random_range(500..3000)));
        c.start(node);
        // a frozen past its session (6 s) while another replica joins and the leader of an input
        // partition is paused; then a wakes up, a member the group dropped.
        a.signal(libc::SIGSTOP);
        let joined = member(&format!("rekey-c{round}"));
        let paused = c.wait_for("input leader", |c| c.leader(&input.name, round as i32 % 4));
        eprintln!("round {round}: a frozen, node {paused} paused");
        c.pause(paused);
        std::thread::sleep(Duration::from_secs(8));
        c.resume(paused);
        a.signal(libc::SIGCONT);
        committing(&joined);
        extra.push(joined);
        // b SIGKILLed at a random moment, maybe mid-transaction, and started again.
        std::thread::sleep(Duration::from_millis(rng.random_range(0..2000)));
        eprintln!("round {round}: b killed");
        b.kill();
        b = member("rekey-b");
        // The transaction coordinator of a replica killed.
        let txn = format!("dedupe-rekey.{}.rekey-c{round}", input.name);
        let node = c.wait_for("transaction coordinator", |c| {
            c.transaction_coordinator(&txn)
        });
        eprintln!("round {round}: transaction coordinator {node} killed");
        c.kill(node);
        std::thread::sleep(Duration::from_millis(rng.random_range(500..3000)));
        c.start(node);
        c.wait_in_sync();
    }
    load.finish();
    kit::rekey::assert_copied_once(
        &source.name,
        &input.name,
        Duration::from_secs(180),
        "group-mode rekey through rebalances and broker faults",
    );
    for (name, member) in [("a", &mut a), ("b", &mut b)]
        .into_iter()
        .chain(extra.iter_mut().map(|r| ("c", r)))
    {
        let code = match member.exited() {
            Some(code) => code,
            None => member.terminate(Duration::from_secs(30)),
        };
        // Its own lines, without the client library's connection errors of the faults.
        let log = member.log_text();
        let own: Vec<&str> = log.lines().filter(|l| !l.contains("librdkafka")).collect();
        assert!(
            matches!(code, Some(0) | Some(3)),
            "replica {name} exited {code:?}:\n{}",
            tail(&own.join("\n"), 20)
        );
    }
}

/// Adds ACLs allowing `principal` the `operations` on one resource.
fn allow(principal: &str, operations: &[Operation], resource: Resource<'_>) {
    cluster().allow(principal, operations, resource);
}

/// The ACLs docs/security.md lists for the worker ("ACLs"), and nothing else.
fn allow_worker(principal: &str, input: &str, output: &str, group: &str) {
    use Operation::*;
    let changelog = format!("{output}.ids");
    let audit = format!("{output}.duplicates");
    let transactional_prefix = format!("dedupe-{output}-");
    allow(principal, &[Read, Describe], Resource::Topic(input));
    allow(principal, &[Write, Read, Describe], Resource::Topic(output));
    allow(
        principal,
        &[Write, Read, Describe, DescribeConfigs, Create],
        Resource::Topic(&changelog),
    );
    allow(
        principal,
        &[Write, Describe, Create],
        Resource::Topic(&audit),
    );
    allow(principal, &[Read], Resource::Group(group));
    allow(
        principal,
        &[Write, Describe],
        Resource::TransactionalIdPrefix(&transactional_prefix),
    );
}

/// What `loadgen`, `ingest` and `verify` need: write and read the input, read the output.
fn allow_client(principal: &str, input: &str, output: &str) {
    use Operation::*;
    allow(principal, &[Write, Read, Describe], Resource::Topic(input));
    allow(principal, &[Read, Describe], Resource::Topic(output));
    // The front door's dead-letter topic, which it creates at start when it is missing.
    allow(
        principal,
        &[Write, Describe, Create],
        Resource::Topic(&format!("{input}.dead-letter")),
    );
}

/// A `dedupe` command with `env`; (exit code, stdout, stderr).
fn dedupe(args: &[&str], env: &[(String, String)]) -> (Option<i32>, String, String) {
    let mut cmd = DEDUPE.command();
    cmd.args(args).env_remove("DEDUPE_KAFKA_SASL_PASSWORD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run dedupe");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const WRITE_KEY: &str = "wk-secure-0123456789abcdef";

/// `dedupe ingest` in front of `topic` with one write key and `env`, ready.
fn secure_ingest(topic: &str, env: &[(String, String)]) -> Ingest {
    let mut spec = DEDUPE.ingest(topic).write_key(WRITE_KEY, "secure-test");
    for (k, v) in env {
        spec = spec.env(k, v);
    }
    let ingest = spec.start();
    ingest.wait_ready(200);
    ingest
}

/// Posts a batch of `track` events with these message ids; the status.
fn post_batch(ingest: &Ingest, ids: &[String]) -> u16 {
    let events: Vec<serde_json::Value> = ids
        .iter()
        .map(|id| serde_json::json!({"type": "track", "event": "Secured", "userId": "u-1", "messageId": id}))
        .collect();
    ingest
        .post_json(
            "/v1/batch",
            Some(WRITE_KEY),
            &serde_json::json!({ "batch": events }),
        )
        .status
}

/// The worker, `loadgen`, `ingest`, `verify` and the recovery after a crash, all through the
/// SASL_SSL listener (SCRAM-SHA-512 over TLS, the CA made by cluster.sh), the worker with exactly
/// the ACLs docs/security.md lists and no more.
#[test]
fn sasl_ssl_end_to_end_with_only_the_documented_acls() {
    let tls = cluster().secure();
    let input = TestTopic::create("secure-in", PARTITIONS);
    let output = TestTopic::create("secure-out", PARTITIONS);
    let group = format!("dedupe-secure-{}", uuid::Uuid::new_v4().simple());
    allow_worker(
        &format!("User:{}", tls.worker_user),
        &input.name,
        &output.name,
        &group,
    );
    allow_client(
        &format!("User:{}", tls.client_user),
        &input.name,
        &output.name,
    );
    let client_env = tls.env(&tls.client_user, &tls.password);

    let dir = tempfile::tempdir().unwrap();
    let spec = tls.worker(
        DEDUPE
            .worker(&input.name, &output.name, &dir.path().join("ledger"))
            .env("DEDUPE_WORKER_GROUP_ID", &group),
    );
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(120));

    let (code, stdout, stderr) = dedupe(
        &[
            "loadgen",
            "--topic",
            &input.name,
            "--count",
            "5000",
            "--dup-ratio",
            "0.05",
        ],
        &client_env,
    );
    assert_eq!(
        code,
        Some(0),
        "loadgen through SASL_SSL:\n{stdout}\n{stderr}"
    );
    let summary: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("loadgen's summary ({e}): {stdout}"));
    let loadgen_ids = summary["distinct_ids"]
        .as_u64()
        .expect("distinct_ids in loadgen's summary") as usize;
    let ingest = secure_ingest(&input.name, &client_env);
    let ids: Vec<String> = (0..20).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    assert_eq!(post_batch(&ingest, &ids), 200);
    // The client's retry after a lost response: the same events again.
    assert_eq!(post_batch(&ingest, &ids), 200);
    drop(ingest);

    // A crash, then recovery from the output and the id changelog, through SASL_SSL as well.
    // Killed once it has published part of the input.
    wait_until(
        "the first records in the output",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || (!consume_all(&output.name, true).is_empty()).then_some(()),
        || tail(&worker.log_text(), 40),
    );
    worker.kill();
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(120));
    let distinct = loadgen_ids + ids.len();
    wait_for_records(&output.name, distinct, Duration::from_secs(180));
    let code = worker.terminate(Duration::from_secs(60));
    assert_eq!(
        code,
        Some(0),
        "the worker stopped cleanly:\n{}",
        tail(&worker.log_text(), 40)
    );

    let (code, stdout, stderr) = dedupe(
        &[
            "verify",
            "--input-topic",
            &input.name,
            "--output-topic",
            &output.name,
        ],
        &client_env,
    );
    assert_eq!(
        code,
        Some(0),
        "verify through SASL_SSL:\n{stdout}\n{stderr}"
    );
    let count = Count::of(&input.name, &output.name);
    count.assert_exactly_once("over SASL_SSL");
    assert_eq!(count.distinct, distinct, "{count:?}");
    for text in [worker.log_text(), stdout, stderr] {
        assert!(!text.contains(&tls.password), "the password was printed");
    }
}

/// `unkeyed_policy = "dead-letter"` over SASL_SSL. Without the ACL docs/security.md adds for it (Write
/// and Describe on the dead-letter topic), the transactions that carry a record for it abort, the
/// log names the topic and the cause, and nothing reaches the dead-letter topic. With it (after a
/// SIGKILL and a restart), keyed records reach the output once and records without a usable id
/// the dead-letter topic, in the same transactions.
#[test]
fn sasl_ssl_dead_letters_with_the_documented_acl() {
    let tls = cluster().secure();
    let input = TestTopic::create("secure-dlq-in", PARTITIONS);
    let output = TestTopic::create("secure-dlq-out", PARTITIONS);
    let dead_letters = TestTopic::create("secure-dlq", 1);
    let group = format!("dedupe-secure-dlq-{}", uuid::Uuid::new_v4().simple());
    let principal = format!("User:{}", tls.worker_user);
    allow_worker(&principal, &input.name, &output.name, &group);

    // 30 keyed records (5 of them sent twice) and 4 without a usable id: a null key, an empty one.
    let keyed_ids = ids(25);
    let mut records = keyed(&keyed_ids.iter().chain(&keyed_ids[..5]).collect::<Vec<_>>());
    for (i, key) in [None, Some(Vec::new()), None, Some(Vec::new())]
        .into_iter()
        .enumerate()
    {
        records.push((key, Some(format!("unkeyed {i}").into_bytes()), Vec::new()));
    }
    produce_full(&input.name, &records);

    let dir = tempfile::tempdir().unwrap();
    let spec = tls.worker(
        DEDUPE
            .worker(&input.name, &output.name, &dir.path().join("ledger"))
            .env("DEDUPE_WORKER_GROUP_ID", &group)
            .env("DEDUPE_WORKER_UNKEYED_POLICY", "dead-letter")
            .env("DEDUPE_WORKER_DEAD_LETTER_TOPIC", &dead_letters.name),
    );
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(120));
    let deadline = Instant::now() + Duration::from_secs(90);
    let names_the_cause = |log: String| {
        log.lines().any(|l| {
            l.contains("was not delivered")
                && l.contains(&dead_letters.name)
                && l.contains("Topic authorization failed")
        })
    };
    while !names_the_cause(worker.log_text()) {
        assert!(
            Instant::now() < deadline,
            "no line names the dead-letter topic and the missing ACL:\n{}",
            tail(&worker.log_text(), 40)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        consume_all(&dead_letters.name, true).is_empty(),
        "nothing reaches the dead-letter topic without its ACL"
    );
    worker.kill();

    allow(
        &principal,
        &[Operation::Write, Operation::Describe],
        Resource::Topic(&dead_letters.name),
    );
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(120));
    wait_for_records(&output.name, keyed_ids.len(), Duration::from_secs(120));
    let dead = wait_for_records(&dead_letters.name, 4, Duration::from_secs(60));
    assert_eq!(
        worker.terminate(Duration::from_secs(60)),
        Some(0),
        "{}",
        tail(&worker.log_text(), 40)
    );

    let out = consume_all(&output.name, true);
    let out_keys: HashSet<Vec<u8>> = out.iter().filter_map(|r| r.key.clone()).collect();
    assert_eq!(out.len(), keyed_ids.len(), "each keyed record once");
    assert_eq!(
        out_keys,
        keyed_ids.iter().map(|id| id.as_bytes().to_vec()).collect()
    );
    let dead_values: HashSet<Vec<u8>> = dead.iter().filter_map(|r| r.value.clone()).collect();
    assert_eq!(
        dead_values,
        (0..4)
            .map(|i| format!("unkeyed {i}").into_bytes())
            .collect(),
        "the records without an id, each once"
    );
    assert_eq!(consume_all(&dead_letters.name, true).len(), 4);
}

/// A CA of its own, which signed none of the brokers' certificates.
fn unknown_ca(dir: &std::path::Path) -> PathBuf {
    let (key, cert) = (dir.join("other-ca.key"), dir.join("other-ca.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=some other CA",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl req: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    cert
}

/// A wrong password, a CA that did not sign the brokers' certificates, and a plaintext client on
/// the SASL_SSL port: each command fails (non-zero) with a last line that names the cause, and
/// never prints the password.
#[test]
fn a_wrong_password_an_unknown_ca_and_plaintext_on_the_secure_port_are_named() {
    let tls = cluster().secure();
    let input = TestTopic::create("refused-in", 1);
    let output = TestTopic::create("refused-out", 1);
    let dir = tempfile::tempdir().unwrap();
    let wrong_password = format!("not-the-password-{}", uuid::Uuid::new_v4().simple());
    let other_ca = unknown_ca(dir.path());
    let plaintext = vec![("DEDUPE_KAFKA_BROKERS".to_string(), tls.bootstrap.clone())];
    // (what is wrong, the environment that has it, what the last line must say)
    type Case<'a> = (&'a str, Vec<(String, String)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "wrong password",
            tls.env(&tls.client_user, &wrong_password),
            "SASL authentication failed",
        ),
        (
            "unknown CA",
            tls.env(&tls.client_user, &tls.password)
                .into_iter()
                .map(|(k, v)| {
                    if k == "DEDUPE_KAFKA_SSL_CA_LOCATION" {
                        (k, other_ca.display().to_string())
                    } else {
                        (k, v)
                    }
                })
                .collect(),
            "TLS handshake failed",
        ),
        (
            "plaintext on the SASL_SSL port",
            plaintext,
            "check kafka.security_protocol",
        ),
    ];
    let ledger = dir.path().join("ledger");
    let metrics = format!("127.0.0.1:{}", free_port());
    let listen = format!("127.0.0.1:{}", free_port());
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("{WRITE_KEY} refused-test\n")).unwrap();
    let commands: Vec<(&str, Vec<&str>)> = vec![
        (
            "run",
            vec![
                "run",
                "--input-topic",
                &input.name,
                "--output-topic",
                &output.name,
                "--data-dir",
                ledger.to_str().unwrap(),
                "--metrics-addr",
                &metrics,
            ],
        ),
        (
            "verify",
            vec![
                "verify",
                "--input-topic",
                &input.name,
                "--output-topic",
                &output.name,
                "--timeout-secs",
                "60",
            ],
        ),
        (
            "loadgen",
            vec!["loadgen", "--topic", &input.name, "--count", "10"],
        ),
        (
            "ingest",
            vec![
                "ingest",
                "--topic",
                &input.name,
                "--listen",
                &listen,
                "--metrics-addr",
                &metrics,
                "--write-keys-file",
                keys.to_str().unwrap(),
            ],
        ),
    ];
    for (case, env, cause) in &cases {
        for (name, args) in &commands {
            let started = Instant::now();
            let (code, stdout, stderr) = dedupe(args, env);
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or_default();
            eprintln!(
                "{case}, dedupe {name}: exit {code:?} after {:.1} s: {last}",
                started.elapsed().as_secs_f64()
            );
            assert!(
                code.is_some_and(|c| c != 0),
                "{case}: dedupe {name} exited {code:?}:\n{stdout}\n{stderr}"
            );
            assert!(
                last.starts_with("error: ") && last.contains(cause),
                "{case}: dedupe {name}'s last line does not name the cause ({cause}):\n{stderr}"
            );
            assert!(
                !stderr.contains(&tls.password) && !stdout.contains(&tls.password),
                "{case}: dedupe {name} printed the password"
            );
            assert!(
                !stderr.contains(&wrong_password) && !stdout.contains(&wrong_password),
                "{case}: dedupe {name} printed the password"
            );
        }
    }
    assert!(
        !ledger.exists(),
        "the worker created its ledger before the brokers let it in"
    );
}

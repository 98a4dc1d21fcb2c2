//! Faults outside the worker, on a three-node KRaft cluster (`deploy/local/cluster.sh`:
//! replication factor 3, `min.insync.replicas=2`, the transaction state and offsets topics
//! replicated three ways), with the worker's default configuration.
//!
//! Each test produces load from before its fault until 10 s after it (5% of ids re-sent, many of
//! them 5 s or more after their first copy), restarts the worker whenever it exits (as its orchestrator would, and
//! counts that), then checks the output twice: `dedupe verify`, and an independent count here
//! (every input id exactly once, in its own partition, in the order of its first copy).
//!
//! The tests are ignored by default until the stall they found is fixed (see the README's
//! "Broker faults"): `cargo test --release --test cluster -- --ignored` runs them. They share
//! the cluster and run one at a time. `DEDUPE_CLUSTER_LONG=1` runs the soak
//! variants (more kills, more load); each prints one `cluster-fault:` line for the README's table.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use common::*;
use rand::Rng;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// One fault test at a time: they crash and pause the nodes every test shares.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn long() -> bool {
    std::env::var("DEDUPE_CLUSTER_LONG").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The three-node cluster, started once for this test binary.
struct Cluster {
    script: PathBuf,
}

fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let cluster = Cluster { script: repo_root().join("deploy/local/cluster.sh") };
        let up = cluster.run(&["up"]);
        let bootstrap = up.lines().last().expect("cluster.sh up prints the bootstrap list").trim().to_string();
        use_brokers(&bootstrap);
        cluster
    })
}

impl Cluster {
    /// Runs a verb of the cluster script; panics with its output if it fails.
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("bash").arg(&self.script).args(args).output().expect("bash runs cluster.sh");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "cluster.sh {} failed:\n{stdout}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    fn node(&self, verb: &str, node: i32) {
        let t = Instant::now();
        self.run(&[verb, &node.to_string()]);
        eprintln!("cluster.sh {verb} {node}: {:.1} s", t.elapsed().as_secs_f64());
    }

    /// Polls `find` until it names a node (a partition without a leader gets one within the
    /// brokers' session timeout, 9 s here).
    fn wait_for(&self, what: &str, find: impl Fn(&Self) -> Option<i32>) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(node) = find(self) {
                return node;
            }
            assert!(Instant::now() < deadline, "no {what} after 90 s:\n{}", self.run(&["status"]));
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The node that leads `partition` of `topic`, from the cluster's metadata.
    fn leader(&self, topic: &str, partition: i32) -> Option<i32> {
        let consumer: BaseConsumer = client_config().create().expect("metadata client");
        let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).ok()?;
        let t = md.topics().iter().find(|t| t.name() == topic)?;
        let p = t.partitions().iter().find(|p| p.id() == partition)?;
        (p.leader() >= 0).then_some(p.leader())
    }

    /// The transaction coordinator of `transactional_id`: the leader of its `__transaction_state`
    /// partition, which Kafka picks as `Utils.abs(id.hashCode()) % partitions` (Java's
    /// `String.hashCode`; `Utils.abs` maps `i32::MIN` to 0).
    fn coordinator(&self, transactional_id: &str) -> Option<i32> {
        let consumer: BaseConsumer = client_config().create().expect("metadata client");
        let md = consumer.fetch_metadata(Some("__transaction_state"), Duration::from_secs(10)).ok()?;
        let partitions = md.topics().first()?.partitions().len() as i32;
        if partitions == 0 {
            return None;
        }
        let hash = transactional_id.encode_utf16().fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(c as i32));
        let abs = if hash == i32::MIN { 0 } else { hash.abs() };
        self.leader("__transaction_state", abs % partitions)
    }
}

/// A worker kept running as an orchestrator would: restarted whenever it exits.
struct Supervised {
    worker: Arc<Mutex<Worker>>,
    exits: Arc<Mutex<Vec<Option<i32>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Supervised {
    fn start(spec: &WorkerSpec) -> Self {
        let mut first = spec.start();
        first.wait_ready(Duration::from_secs(120));
        let worker = Arc::new(Mutex::new(first));
        let exits = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (worker, exits, stop, spec) = (worker.clone(), exits.clone(), stop.clone(), spec.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut w = worker.lock().unwrap();
                    if let Ok(Some(status)) = w.child.try_wait() {
                        eprintln!("the worker exited with {status}; restarting it:\n{}", tail(&w.log_text(), 15));
                        exits.lock().unwrap().push(status.code());
                        *w = spec.start();
                    }
                    drop(w);
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        Self { worker, exits, stop, thread: Some(thread) }
    }

    /// Waits until `topic` holds `expected` records; panics with the worker's log if it does not.
    fn wait_for_output(&self, topic: &str, expected: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let got = consume_all(topic, true).len();
            if got >= expected {
                return;
            }
            if Instant::now() > deadline {
                let w = self.worker.lock().unwrap();
                let page = w.metrics().unwrap_or_default();
                let interesting: Vec<&str> = page.lines().filter(|l| !l.starts_with('#') && (l.contains("lag") || l.contains("ready") || l.contains("errors") || l.contains("transactions"))).collect();
                panic!("{topic} holds {got} records, expected {expected}, after {timeout:?}\nworker metrics:\n{}\nworker log:\n{}", interesting.join("\n"), tail(&w.log_text(), 60));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Stops restarting, then stops the worker with SIGTERM; the exit codes of every restart.
    fn finish(mut self) -> Vec<Option<i32>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().expect("the supervising thread");
        let mut w = self.worker.lock().unwrap();
        let code = w.terminate(Duration::from_secs(60));
        assert_eq!(code, Some(0), "the worker did not stop cleanly:\n{}", tail(&w.log_text(), 40));
        self.exits.lock().unwrap().clone()
    }
}

impl Drop for Supervised {
    /// A test that failed half-way stops restarting before its data directory goes.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Watches the output topic's high watermarks and keeps the longest time they stood still.
struct StallMeter {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Duration>,
}

impl StallMeter {
    fn start(topic: &str, partitions: i32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, topic) = (stop.clone(), topic.to_string());
            std::thread::spawn(move || {
                let consumer: BaseConsumer = client_config().create().expect("watermark client");
                let mut last: HashMap<i32, i64> = HashMap::new();
                let mut moved = Instant::now();
                let mut longest = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    for p in 0..partitions {
                        if let Ok((_, high)) = consumer.fetch_watermarks(&topic, p, Duration::from_secs(1)) {
                            if last.insert(p, high).is_some_and(|before| high > before) {
                                moved = Instant::now();
                            }
                        }
                    }
                    longest = longest.max(moved.elapsed());
                    std::thread::sleep(Duration::from_millis(250));
                }
                longest
            })
        };
        Self { stop, thread }
    }

    fn finish(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the stall meter")
    }
}

/// Load produced until it is told to stop: `RATE` keyed records per second, 5% of them re-sent
/// ids (the oldest id at least 5 s old when there is one), `acks=all`, so a broker fault is
/// ridden out by the producer's retries; a record it still fails to deliver (after
/// `message.timeout.ms`, 5 min) fails the test. Not idempotent: librdkafka 2.12's idempotent
/// producer was seen spinning a core (`poll` with a zero timeout in its broker thread) for
/// minutes after a broker was killed, which starved the nodes of this 2-core machine. A retry
/// that writes a record twice is one more duplicate for the worker to remove; the checks read
/// the input back, so they count it right.
struct Load {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, u64)>,
    started: Instant,
}

const RATE: u64 = 1_000;

impl Load {
    fn start(topic: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, topic) = (stop.clone(), topic.to_string());
            std::thread::spawn(move || produce_until(&topic, &stop))
        };
        Self { stop, thread, started: Instant::now() }
    }

    /// Stops producing (after at least `min` of load) and waits for every record's delivery:
    /// (records sent, distinct ids).
    fn finish(self, min: Duration) -> (u64, u64) {
        if let Some(rest) = min.checked_sub(self.started.elapsed()) {
            std::thread::sleep(rest);
        }
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the load thread")
    }
}

fn produce_until(topic: &str, stop: &AtomicBool) -> (u64, u64) {
    use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
    use rdkafka::producer::{DeliveryResult, ProducerContext};
    #[derive(Default)]
    struct Failures(Mutex<Vec<String>>);
    impl rdkafka::ClientContext for Failures {}
    impl ProducerContext for Failures {
        type DeliveryOpaque = ();
        fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
            if let Err((e, _)) = result {
                self.0.lock().unwrap().push(e.to_string());
            }
        }
    }
    let producer: ThreadedProducer<Failures> = client_config()
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create_with_context(Failures::default())
        .expect("load producer");
    let mut rng = rand::rng();
    let mut recent: std::collections::VecDeque<(Instant, String)> = Default::default();
    let (mut sent, mut distinct) = (0u64, 0u64);
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let resend = !recent.is_empty() && rng.random_bool(0.05);
        let id = if resend {
            let due = recent.iter().position(|(t, _)| t.elapsed() >= Duration::from_secs(5));
            recent[due.unwrap_or_else(|| rng.random_range(0..recent.len()))].1.clone()
        } else {
            distinct += 1;
            let id = uuid::Uuid::new_v4().to_string();
            recent.push_back((Instant::now(), id.clone()));
            if recent.len() > 20_000 {
                recent.pop_front();
            }
            id
        };
        let value = format!(r#"{{"messageId":"{id}","seq":{sent}}}"#);
        let mut record = BaseRecord::to(topic).key(&id).payload(&value);
        while let Err((e, r)) = producer.send(record) {
            assert!(matches!(e.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::QueueFull)), "producing: {e}");
            record = r;
            std::thread::sleep(Duration::from_millis(5));
        }
        sent += 1;
        let due = started + Duration::from_secs_f64(sent as f64 / RATE as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    producer.flush(Duration::from_secs(360)).expect("every load record delivered within 6 min");
    let failures = producer.context().0.lock().unwrap();
    assert!(failures.is_empty(), "{} load records were not delivered: {:?}", failures.len(), failures.first());
    (sent, distinct)
}

/// One fault test: topics, a supervised worker, load produced while the fault runs.
struct Scenario {
    fault: &'static str,
    input: TestTopic,
    output: TestTopic,
    _dir: tempfile::TempDir,
    worker: Supervised,
    load: Load,
    stalls: StallMeter,
}

const PARTITIONS: i32 = 3;

impl Scenario {
    /// Starts the worker and the load.
    fn start(fault: &'static str) -> Self {
        let _ = cluster();
        let input = TestTopic::create("cluster-in", PARTITIONS);
        let output = TestTopic::create("cluster-out", PARTITIONS);
        let dir = tempfile::tempdir().unwrap();
        let spec = WorkerSpec::new(&input.name, &output.name, &dir.path().join("ledger"))
            .without("DEDUPE_WORKER_BATCH_MAX_RECORDS")
            .without("DEDUPE_WORKER_BATCH_LINGER_MS");
        let worker = Supervised::start(&spec);
        let stalls = StallMeter::start(&output.name, PARTITIONS);
        let load = Load::start(&input.name);
        Self { fault, input, output, _dir: dir, worker, load, stalls }
    }

    /// Ends the load 10 s after the fault (at least 30 s after it started), waits until the
    /// output holds every id, stops the worker, and checks that the output holds every input id
    /// exactly once, in its partition, in order.
    fn finish(self, injected: usize) {
        let Scenario { fault, input, output, _dir, worker, load, stalls } = self;
        std::thread::sleep(Duration::from_secs(10));
        let (_, distinct) = load.finish(Duration::from_secs(30));
        let longest_stall = stalls.finish();
        let distinct = distinct as usize;
        worker.wait_for_output(&output.name, distinct, Duration::from_secs(300));
        let exits = worker.finish();
        let count = independent_count(&input.name, &output.name);
        let (code, verified) = verify(&input.name, &output.name);
        eprintln!(
            "cluster-fault: {fault} | injected {injected} | in {} | out {} | duplicates {} | missing {} | worker restarts {} (exit codes {exits:?}) | longest stall {:.1} s",
            count.input_records,
            count.output_records,
            count.duplicates,
            count.missing,
            exits.len(),
            longest_stall.as_secs_f64()
        );
        assert_eq!(code, 0, "{fault}: verify: {verified}");
        assert_eq!(count.distinct, distinct, "{fault}: the input holds every id loadgen sent");
        assert_eq!((count.duplicates, count.missing, count.misplaced, count.out_of_order), (0, 0, 0, 0), "{fault}: {count:?}");
        assert!(exits.iter().all(|c| *c != Some(0)), "{fault}: the worker exited 0 by itself: {exits:?}");
    }
}

#[derive(Debug)]
struct Count {
    input_records: usize,
    output_records: usize,
    distinct: usize,
    duplicates: usize,
    missing: usize,
    /// Output ids in another partition than their input's.
    misplaced: usize,
    /// Partitions whose output is not the input's first copies in input order.
    out_of_order: usize,
}

/// Reads both topics (read_committed) and compares them partition by partition.
fn independent_count(input: &str, output: &str) -> Count {
    let input_records = consume_all(input, true);
    let output_records = consume_all(output, true);
    let mut first_copies: HashMap<i32, Vec<Vec<u8>>> = HashMap::new();
    let mut home: HashMap<Vec<u8>, i32> = HashMap::new();
    for r in &input_records {
        let key = r.key.clone().expect("loadgen keys every record");
        if !home.contains_key(&key) {
            home.insert(key.clone(), r.partition);
            first_copies.entry(r.partition).or_default().push(key);
        }
    }
    let mut published: HashMap<i32, Vec<Vec<u8>>> = HashMap::new();
    let mut seen = HashSet::new();
    let (mut duplicates, mut misplaced) = (0, 0);
    for r in &output_records {
        let key = r.key.clone().expect("the output keeps the key");
        if !seen.insert(key.clone()) {
            duplicates += 1;
        }
        if home.get(&key) != Some(&r.partition) {
            misplaced += 1;
        }
        published.entry(r.partition).or_default().push(key);
    }
    let missing = home.keys().filter(|k| !seen.contains(*k)).count();
    let out_of_order = first_copies.iter().filter(|(p, ids)| published.get(p) != Some(ids)).count();
    Count {
        input_records: input_records.len(),
        output_records: output_records.len(),
        distinct: home.len(),
        duplicates,
        missing,
        misplaced,
        out_of_order,
    }
}

/// Waits until every partition of `topic` has a leader again (after a node came back).
fn wait_for_leaders(topic: &str) {
    let c = cluster();
    let deadline = Instant::now() + Duration::from_secs(120);
    while (0..PARTITIONS).any(|p| c.leader(topic, p).is_none()) {
        assert!(Instant::now() < deadline, "{topic} still lacks a leader after 120 s");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// SIGKILL and restart (on its data) of the node that leads an input partition, an output
/// partition, or a partition's transaction coordinator, in turn, at random moments under load.
#[test]
#[ignore = "issue 13, open: after broker restarts one input partition can stop being consumed for good (lag grows, no error, the worker stays ready); run with --ignored"]
fn leaders_and_transaction_coordinators_killed_at_random_moments() {
    let _serial = serial();
    let kills = if long() { 30 } else { 10 };
    let s = Scenario::start("SIGKILL + restart of a leader or coordinator");
    let c = cluster();
    let mut rng = rand::rng();
    for kill in 0..kills {
        std::thread::sleep(Duration::from_millis(rng.random_range(500..3000)));
        let partition = rng.random_range(0..PARTITIONS);
        let (input, output) = (s.input.name.clone(), s.output.name.clone());
        let txn = dedupe::output::transactional_id(&output, partition);
        let victim = match kill % 3 {
            0 => c.wait_for("input leader", |c| c.leader(&input, partition)),
            1 => c.wait_for("output leader", |c| c.leader(&output, partition)),
            _ => c.wait_for("transaction coordinator", |c| c.coordinator(&txn)),
        };
        eprintln!("kill {kill}: node {victim} ({} of partition {partition})", ["input leader", "output leader", "coordinator"][kill % 3]);
        c.node("kill", victim);
        std::thread::sleep(Duration::from_millis(rng.random_range(0..4000)));
        c.node("start", victim);
    }
    s.finish(kills);
}

/// Every node stopped cleanly (SIGTERM) and started again, one after the other, under load.
#[test]
#[ignore = "issue 13, open: after broker restarts one input partition can stop being consumed for good (lag grows, no error, the worker stays ready); run with --ignored"]
fn a_rolling_restart_of_every_node() {
    let _serial = serial();
    let s = Scenario::start("rolling restart (SIGTERM, start) of all three nodes");
    let c = cluster();
    std::thread::sleep(Duration::from_secs(3));
    for node in 1..=3 {
        c.node("stop", node);
        c.node("start", node);
        wait_for_leaders(&s.output.name);
    }
    s.finish(3);
}

/// A node that hangs (SIGSTOP) for longer than the worker's transaction timeout and its clients'
/// socket timeout (60 s each by default), then resumes: the cluster fences it and moves its
/// leaders; the worker's transactions on it time out.
#[test]
#[ignore = "issue 13, open: after broker restarts one input partition can stop being consumed for good (lag grows, no error, the worker stays ready); run with --ignored"]
fn a_node_paused_past_the_transaction_and_client_timeouts() {
    let _serial = serial();
    let s = Scenario::start("SIGSTOP for 65 s (past transaction.timeout.ms), then SIGCONT");
    let c = cluster();
    std::thread::sleep(Duration::from_secs(3));
    let coordinator = dedupe::output::transactional_id(&s.output.name, 0);
    let victim = c.wait_for("transaction coordinator", |c| c.coordinator(&coordinator));
    c.node("pause", victim);
    std::thread::sleep(Duration::from_secs(65));
    c.node("resume", victim);
    s.finish(1);
}

/// All three nodes killed at once, down for a minute, then started on their data.
#[test]
#[ignore = "issue 13, open: after broker restarts one input partition can stop being consumed for good (lag grows, no error, the worker stays ready); run with --ignored"]
fn the_whole_cluster_down_for_a_minute() {
    let _serial = serial();
    let s = Scenario::start("the whole cluster SIGKILLed, down 60 s, restarted");
    let c = cluster();
    std::thread::sleep(Duration::from_secs(3));
    for node in 1..=3 {
        c.node("kill", node);
    }
    std::thread::sleep(Duration::from_secs(60));
    // The nodes are started together: a KRaft quorum needs two of them to elect a controller.
    let starts: Vec<_> = (1..=3)
        .map(|node| std::thread::spawn(move || cluster().node("start", node)))
        .collect();
    for s in starts {
        s.join().expect("node start");
    }
    wait_for_leaders(&s.output.name);
    s.finish(1);
}

//! Faults outside the worker, on a three-node KRaft cluster (`deploy/local/cluster.sh`:
//! replication factor 3, `min.insync.replicas=2`, the transaction state and offsets topics
//! replicated three ways), with the worker's default configuration.
//!
//! Each test produces load from before its fault until 10 s after it (5% of ids re-sent, many of
//! them 5 s or more after their first copy), restarts the worker whenever it exits (as its orchestrator would, and
//! counts that), then checks the output twice: `dedupe verify`, and an independent count here
//! (every input id exactly once, in its own partition, in the order of its first copy).
//!
//! The tests share the cluster and run one at a time. `DEDUPE_CLUSTER_LONG=1` runs the soak
//! variants (30 kills, three rolling restarts, pauses, cuts and outages of 130-180 s); each prints one `cluster-fault:` line for the fault
//! table in docs/testing.md.
//!
//! The cluster also has a SASL_SSL listener (SCRAM-SHA-512 over TLS, ACLs enforced) for the
//! security tests at the end, and a network namespace joined to it by a veth pair, where a
//! worker can be cut off from one node.

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

/// The network namespace `cluster.sh up` makes, where a worker can be cut off from one node.
const NETNS: &str = "dedupe-cluster-test";

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
        let out = Command::new("bash")
            .arg(&self.script)
            .args(args)
            .env("CLUSTER_NETNS", NETNS)
            .output()
            .expect("bash runs cluster.sh");
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

/// Watches the output topic's high watermarks and keeps the longest time one partition's stood
/// still (the load spreads over every partition, so each one grows every second when all is well).
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
                let started = Instant::now();
                let mut moved: HashMap<i32, Instant> = HashMap::new();
                let mut longest = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    for p in 0..partitions {
                        if let Ok((_, high)) = consumer.fetch_watermarks(&topic, p, Duration::from_secs(1)) {
                            if last.insert(p, high).is_some_and(|before| high > before) {
                                moved.insert(p, Instant::now());
                            }
                        }
                        longest = longest.max(moved.get(&p).unwrap_or(&started).elapsed());
                    }
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
        Self::start_with(fault, |spec| spec)
    }

    /// Starts the worker (its spec changed by `adapt`) and the load.
    fn start_with(fault: &'static str, adapt: impl FnOnce(WorkerSpec) -> WorkerSpec) -> Self {
        let _ = cluster();
        let input = TestTopic::create("cluster-in", PARTITIONS);
        let output = TestTopic::create("cluster-out", PARTITIONS);
        let dir = tempfile::tempdir().unwrap();
        let spec = WorkerSpec::new(&input.name, &output.name, &dir.path().join("ledger"))
            .without("DEDUPE_WORKER_BATCH_MAX_RECORDS")
            .without("DEDUPE_WORKER_BATCH_LINGER_MS");
        let spec = adapt(spec);
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
fn a_rolling_restart_of_every_node() {
    let _serial = serial();
    let rounds = if long() { 3 } else { 1 };
    let s = Scenario::start("rolling restart (SIGTERM, start) of all three nodes");
    let c = cluster();
    std::thread::sleep(Duration::from_secs(3));
    for _ in 0..rounds {
        for node in 1..=3 {
            c.node("stop", node);
            c.node("start", node);
            wait_for_leaders(&s.output.name);
        }
    }
    s.finish(3 * rounds);
}

/// A node that hangs (SIGSTOP) for longer than the worker's transaction timeout and its clients'
/// socket timeout (60 s each by default), then resumes: the cluster fences it and moves its
/// leaders; the worker's transactions on it time out.
#[test]
fn a_node_paused_past_the_transaction_and_client_timeouts() {
    let _serial = serial();
    let s = Scenario::start("SIGSTOP for 65 s (past transaction.timeout.ms), then SIGCONT");
    let c = cluster();
    std::thread::sleep(Duration::from_secs(3));
    let coordinator = dedupe::output::transactional_id(&s.output.name, 0);
    let victim = c.wait_for("transaction coordinator", |c| c.coordinator(&coordinator));
    c.node("pause", victim);
    std::thread::sleep(Duration::from_secs(if long() { 130 } else { 65 }));
    c.node("resume", victim);
    s.finish(1);
}

/// The worker cut off from one node for a minute, then reconnected: the worker runs in the
/// network namespace `cluster.sh` made and reaches each node on its own address over a veth pair;
/// a blackhole route there drops every packet to the node leading output partition 0 (its
/// connections hang, as on a cut cable), while the node stays in the cluster and keeps its leaderships.
#[test]
fn a_node_cut_off_from_the_worker_for_a_minute() {
    let _serial = serial();
    let c = cluster();
    let info = c.run(&["netns"]);
    let field = |name: &str| -> String {
        info.lines().find_map(|l| l.strip_prefix(&format!("{name}="))).unwrap_or_else(|| panic!("cluster.sh netns: no {name}:\n{info}")).trim().to_string()
    };
    let (netns, address, bootstrap) = (field("netns"), field("address"), field("bootstrap"));
    let s = Scenario::start_with("a node cut off from the worker for 60 s (blackhole route), then reconnected", |mut spec| {
        spec.wrapper = vec!["ip".into(), "netns".into(), "exec".into(), netns.clone()];
        spec.brokers = Some(bootstrap.clone());
        spec.metrics_host = Some(address.parse().expect("the namespace's address"));
        spec
    });
    std::thread::sleep(Duration::from_secs(3));
    let victim = c.wait_for("output leader", |c| c.leader(&s.output.name, 0));
    c.node("cut", victim);
    std::thread::sleep(Duration::from_secs(if long() { 180 } else { 60 }));
    c.node("heal", victim);
    s.finish(1);
}

/// All three nodes killed at once, down for a minute, then started on their data.
#[test]
fn the_whole_cluster_down_for_a_minute() {
    let _serial = serial();
    let s = Scenario::start("the whole cluster SIGKILLed, down 60 s, restarted");
    let c = cluster();
    std::thread::sleep(Duration::from_secs(3));
    for node in 1..=3 {
        c.node("kill", node);
    }
    std::thread::sleep(Duration::from_secs(if long() { 180 } else { 60 }));
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

/// How to reach the cluster's SASL_SSL listener (`cluster.sh secure`).
struct SecureListener {
    bootstrap: String,
    ca: PathBuf,
    worker_user: String,
    client_user: String,
    password: String,
}

fn secure_listener() -> SecureListener {
    let text = cluster().run(&["secure"]);
    let field = |name: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("cluster.sh secure printed no {name}:\n{text}"))
            .trim()
            .to_string()
    };
    let password = std::fs::read_to_string(field("password_file")).expect("the SCRAM password file");
    SecureListener {
        bootstrap: field("bootstrap"),
        ca: PathBuf::from(field("ca")),
        worker_user: field("worker_username"),
        client_user: field("client_username"),
        password: password.trim().to_string(),
    }
}

impl SecureListener {
    /// The environment that makes a command connect as `user` over SASL_SSL.
    fn env(&self, user: &str, password: &str) -> Vec<(String, String)> {
        vec![
            ("DEDUPE_KAFKA_BROKERS".into(), self.bootstrap.clone()),
            ("DEDUPE_KAFKA_SECURITY_PROTOCOL".into(), "sasl_ssl".into()),
            ("DEDUPE_KAFKA_SASL_MECHANISM".into(), "SCRAM-SHA-512".into()),
            ("DEDUPE_KAFKA_SASL_USERNAME".into(), user.into()),
            ("DEDUPE_KAFKA_SASL_PASSWORD".into(), password.into()),
            ("DEDUPE_KAFKA_SSL_CA_LOCATION".into(), self.ca.display().to_string()),
        ]
    }

    /// `spec` connecting as the worker's user through this listener.
    fn worker(&self, mut spec: WorkerSpec) -> WorkerSpec {
        spec.brokers = Some(self.bootstrap.clone());
        for (k, v) in self.env(&self.worker_user, &self.password) {
            spec = spec.env(&k, &v);
        }
        spec
    }
}

/// Adds ACLs allowing `principal` the `operations` on one resource (AclCommand's resource flags).
fn allow(principal: &str, operations: &[&str], resource: &[&str]) {
    let mut args = vec!["acl", "--add", "--allow-principal", principal];
    for op in operations {
        args.extend(["--operation", op]);
    }
    args.extend(resource);
    cluster().run(&args);
}

/// The ACLs docs/security.md lists for the worker ("ACLs"), and nothing else.
fn allow_worker(principal: &str, input: &str, output: &str, group: &str) {
    let changelog = format!("{output}.ids");
    let transactional_prefix = format!("dedupe-{output}-");
    allow(principal, &["Read", "Describe"], &["--topic", input]);
    allow(principal, &["Write", "Read", "Describe"], &["--topic", output]);
    allow(principal, &["Write", "Read", "Describe", "DescribeConfigs", "Create"], &["--topic", &changelog]);
    allow(principal, &["Read"], &["--group", group]);
    allow(principal, &["Write", "Describe"], &["--resource-pattern-type", "prefixed", "--transactional-id", &transactional_prefix]);
}

/// What `loadgen`, `ingest` and `verify` need: write and read the input, read the output.
fn allow_client(principal: &str, input: &str, output: &str) {
    allow(principal, &["Write", "Read", "Describe"], &["--topic", input]);
    allow(principal, &["Read", "Describe"], &["--topic", output]);
    // The front door's dead-letter topic, which it creates at start when it is missing.
    allow(principal, &["Write", "Describe", "Create"], &["--topic", &format!("{input}.dead-letter")]);
}

/// A `dedupe` command with `env`; (exit code, stdout, stderr).
fn dedupe(args: &[&str], env: &[(String, String)]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(dedupe_bin());
    cmd.args(args).env_remove("DEDUPE_KAFKA_SASL_PASSWORD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run dedupe");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A `dedupe ingest` on a free loopback port, killed when dropped.
struct IngestProcess {
    child: std::process::Child,
    addr: std::net::SocketAddr,
    _log: tempfile::NamedTempFile,
    _keys: tempfile::NamedTempFile,
}

const WRITE_KEY: &str = "wk-secure-0123456789abcdef";

impl IngestProcess {
    fn start(topic: &str, env: &[(String, String)]) -> Self {
        use std::io::Write as _;
        let mut keys = tempfile::NamedTempFile::new().unwrap();
        writeln!(keys, "{WRITE_KEY} secure-test").unwrap();
        let log = tempfile::NamedTempFile::new().unwrap();
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut cmd = Command::new(dedupe_bin());
        cmd.arg("ingest")
            .args(["--listen", &addr.to_string(), "--topic", topic])
            .args(["--metrics-addr", &format!("127.0.0.1:{}", free_port())])
            .arg("--write-keys-file")
            .arg(keys.path())
            .env_remove("DEDUPE_WRITE_KEYS")
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start dedupe ingest");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = common::http::get(addr, "/readyz") {
                if r.status == 200 {
                    return Self { child, addr, _log: log, _keys: keys };
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("dedupe ingest exited with {status}:\n{}", std::fs::read_to_string(log.path()).unwrap_or_default());
            }
            assert!(Instant::now() < deadline, "dedupe ingest was not ready within 60 s:\n{}", std::fs::read_to_string(log.path()).unwrap_or_default());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn post_batch(&self, ids: &[String]) -> u16 {
        use base64::Engine as _;
        let events: Vec<serde_json::Value> = ids
            .iter()
            .map(|id| serde_json::json!({"type": "track", "event": "Secured", "userId": "u-1", "messageId": id}))
            .collect();
        let body = serde_json::json!({ "batch": events }).to_string();
        let auth = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{WRITE_KEY}:")));
        let headers = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
        common::http::request(self.addr, "POST", "/v1/batch", &headers, body.as_bytes()).expect("POST /v1/batch").status
    }
}

impl Drop for IngestProcess {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// The worker, `loadgen`, `ingest`, `verify` and the recovery after a crash, all through the
/// SASL_SSL listener (SCRAM-SHA-512 over TLS, the CA made by cluster.sh), the worker with exactly
/// the ACLs docs/security.md lists and no more.
#[test]
fn sasl_ssl_end_to_end_with_only_the_documented_acls() {
    let _serial = serial();
    let tls = secure_listener();
    let input = TestTopic::create("secure-in", PARTITIONS);
    let output = TestTopic::create("secure-out", PARTITIONS);
    let group = format!("dedupe-secure-{}", uuid::Uuid::new_v4().simple());
    allow_worker(&format!("User:{}", tls.worker_user), &input.name, &output.name, &group);
    allow_client(&format!("User:{}", tls.client_user), &input.name, &output.name);
    let client_env = tls.env(&tls.client_user, &tls.password);

    let dir = tempfile::tempdir().unwrap();
    let spec = tls.worker(WorkerSpec::new(&input.name, &output.name, &dir.path().join("ledger")).env("DEDUPE_WORKER_GROUP_ID", &group));
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(120));

    let (code, stdout, stderr) = dedupe(&["loadgen", "--topic", &input.name, "--count", "5000", "--dup-ratio", "0.05"], &client_env);
    assert_eq!(code, Some(0), "loadgen through SASL_SSL:\n{stdout}\n{stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("loadgen's summary ({e}): {stdout}"));
    let loadgen_ids = summary["distinct_ids"].as_u64().expect("distinct_ids in loadgen's summary") as usize;
    let ingest = IngestProcess::start(&input.name, &client_env);
    let ids: Vec<String> = (0..20).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    assert_eq!(ingest.post_batch(&ids), 200);
    // The client's retry after a lost response: the same events again.
    assert_eq!(ingest.post_batch(&ids), 200);
    drop(ingest);

    // A crash, then recovery from the output and the id changelog, through SASL_SSL as well.
    std::thread::sleep(Duration::from_secs(2));
    worker.kill();
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(120));
    let distinct = loadgen_ids + ids.len();
    wait_for_records(&output.name, distinct, Duration::from_secs(180));
    let code = worker.terminate(Duration::from_secs(60));
    assert_eq!(code, Some(0), "the worker stopped cleanly:\n{}", tail(&worker.log_text(), 40));

    let (code, stdout, stderr) = dedupe(&["verify", "--input-topic", &input.name, "--output-topic", &output.name], &client_env);
    assert_eq!(code, Some(0), "verify through SASL_SSL:\n{stdout}\n{stderr}");
    let count = independent_count(&input.name, &output.name);
    assert_eq!((count.duplicates, count.missing, count.misplaced, count.out_of_order), (0, 0, 0, 0), "{count:?}");
    assert_eq!(count.distinct, distinct, "{count:?}");
    assert_eq!(count.output_records, distinct, "{count:?}");
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
    let _serial = serial();
    let tls = secure_listener();
    let input = TestTopic::create("secure-dlq-in", PARTITIONS);
    let output = TestTopic::create("secure-dlq-out", PARTITIONS);
    let dead_letters = TestTopic::create("secure-dlq", 1);
    let group = format!("dedupe-secure-dlq-{}", uuid::Uuid::new_v4().simple());
    let principal = format!("User:{}", tls.worker_user);
    allow_worker(&principal, &input.name, &output.name, &group);

    // 30 keyed records (5 of them sent twice) and 4 without a usable id: a null key, an empty one.
    let keyed_ids = ids(25);
    let mut records = keyed(&keyed_ids.iter().chain(&keyed_ids[..5]).collect::<Vec<_>>());
    for (i, key) in [None, Some(Vec::new()), None, Some(Vec::new())].into_iter().enumerate() {
        records.push((key, Some(format!("unkeyed {i}").into_bytes()), Vec::new()));
    }
    produce_full(&input.name, &records);

    let dir = tempfile::tempdir().unwrap();
    let spec = tls.worker(
        WorkerSpec::new(&input.name, &output.name, &dir.path().join("ledger"))
            .env("DEDUPE_WORKER_GROUP_ID", &group)
            .env("DEDUPE_WORKER_UNKEYED_POLICY", "dead-letter")
            .env("DEDUPE_WORKER_DEAD_LETTER_TOPIC", &dead_letters.name),
    );
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(120));
    let deadline = Instant::now() + Duration::from_secs(90);
    let names_the_cause = |log: String| {
        log.lines().any(|l| l.contains("was not delivered") && l.contains(&dead_letters.name) && l.contains("Topic authorization failed"))
    };
    while !names_the_cause(worker.log_text()) {
        assert!(Instant::now() < deadline, "no line names the dead-letter topic and the missing ACL:\n{}", tail(&worker.log_text(), 40));
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(consume_all(&dead_letters.name, true).is_empty(), "nothing reaches the dead-letter topic without its ACL");
    worker.kill();

    allow(&principal, &["Write", "Describe"], &["--topic", &dead_letters.name]);
    let mut worker = spec.start();
    worker.wait_ready(Duration::from_secs(120));
    wait_for_records(&output.name, keyed_ids.len(), Duration::from_secs(120));
    let dead = wait_for_records(&dead_letters.name, 4, Duration::from_secs(60));
    assert_eq!(worker.terminate(Duration::from_secs(60)), Some(0), "{}", tail(&worker.log_text(), 40));

    let out = consume_all(&output.name, true);
    let out_keys: HashSet<Vec<u8>> = out.iter().filter_map(|r| r.key.clone()).collect();
    assert_eq!(out.len(), keyed_ids.len(), "each keyed record once");
    assert_eq!(out_keys, keyed_ids.iter().map(|id| id.as_bytes().to_vec()).collect());
    let dead_values: HashSet<Vec<u8>> = dead.iter().filter_map(|r| r.value.clone()).collect();
    assert_eq!(dead_values, (0..4).map(|i| format!("unkeyed {i}").into_bytes()).collect(), "the records without an id, each once");
    assert_eq!(consume_all(&dead_letters.name, true).len(), 4);
}

/// A CA of its own, which signed none of the brokers' certificates.
fn unknown_ca(dir: &std::path::Path) -> PathBuf {
    let (key, cert) = (dir.join("other-ca.key"), dir.join("other-ca.pem"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=some other CA", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(out.status.success(), "openssl req: {}", String::from_utf8_lossy(&out.stderr));
    cert
}

/// A wrong password, a CA that did not sign the brokers' certificates, and a plaintext client on
/// the SASL_SSL port: each command fails (non-zero) with a last line that names the cause, and
/// never prints the password.
#[test]
fn a_wrong_password_an_unknown_ca_and_plaintext_on_the_secure_port_are_named() {
    let _serial = serial();
    let tls = secure_listener();
    let input = TestTopic::create("refused-in", 1);
    let output = TestTopic::create("refused-out", 1);
    let dir = tempfile::tempdir().unwrap();
    let wrong_password = format!("not-the-password-{}", uuid::Uuid::new_v4().simple());
    let other_ca = unknown_ca(dir.path());
    let plaintext = vec![("DEDUPE_KAFKA_BROKERS".to_string(), tls.bootstrap.clone())];
    // (what is wrong, the environment that has it, what the last line must say)
    type Case<'a> = (&'a str, Vec<(String, String)>, &'a str);
    let cases: Vec<Case> = vec![
        ("wrong password", tls.env(&tls.client_user, &wrong_password), "SASL authentication failed"),
        (
            "unknown CA",
            tls.env(&tls.client_user, &tls.password)
                .into_iter()
                .map(|(k, v)| if k == "DEDUPE_KAFKA_SSL_CA_LOCATION" { (k, other_ca.display().to_string()) } else { (k, v) })
                .collect(),
            "TLS handshake failed",
        ),
        ("plaintext on the SASL_SSL port", plaintext, "check kafka.security_protocol"),
    ];
    let ledger = dir.path().join("ledger");
    let metrics = format!("127.0.0.1:{}", free_port());
    let listen = format!("127.0.0.1:{}", free_port());
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("{WRITE_KEY} refused-test\n")).unwrap();
    let commands: Vec<(&str, Vec<&str>)> = vec![
        ("run", vec!["run", "--input-topic", &input.name, "--output-topic", &output.name, "--data-dir", ledger.to_str().unwrap(), "--metrics-addr", &metrics]),
        ("verify", vec!["verify", "--input-topic", &input.name, "--output-topic", &output.name, "--timeout-secs", "60"]),
        ("loadgen", vec!["loadgen", "--topic", &input.name, "--count", "10"]),
        ("ingest", vec!["ingest", "--topic", &input.name, "--listen", &listen, "--metrics-addr", &metrics, "--write-keys-file", keys.to_str().unwrap()]),
    ];
    for (case, env, cause) in &cases {
        for (name, args) in &commands {
            let started = Instant::now();
            let (code, stdout, stderr) = dedupe(args, env);
            let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
            eprintln!("{case}, dedupe {name}: exit {code:?} after {:.1} s: {last}", started.elapsed().as_secs_f64());
            assert!(code.is_some_and(|c| c != 0), "{case}: dedupe {name} exited {code:?}:\n{stdout}\n{stderr}");
            assert!(last.starts_with("error: ") && last.contains(cause), "{case}: dedupe {name}'s last line does not name the cause ({cause}):\n{stderr}");
            assert!(!stderr.contains(&tls.password) && !stdout.contains(&tls.password), "{case}: dedupe {name} printed the password");
            assert!(!stderr.contains(&wrong_password) && !stdout.contains(&wrong_password), "{case}: dedupe {name} printed the password");
        }
    }
    assert!(!ledger.exists(), "the worker created its ledger before the brokers let it in");
}

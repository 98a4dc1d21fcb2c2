//! Shared helpers for the integration tests: a real Apache Kafka broker started by the project's
//! own script, uniquely named topics that delete themselves, and produce/consume helpers.
//!
//! A test that cannot reach its broker fails with a message saying what is missing; nothing here
//! skips.
#![allow(dead_code)]

pub mod http;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use dedupe::config::KafkaConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

/// The repository's top directory.
pub fn repo_root() -> PathBuf {
    // Read when the test runs (cargo sets it then too): a binary left in a shared target
    // directory by a build of another checkout must still use this one.
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

static BROKERS: OnceLock<String> = OnceLock::new();

/// Points every helper of this test binary at `bootstrap` (e.g. the three-node cluster) instead
/// of the single test broker. It must be called before any helper asks for [`brokers`].
pub fn use_brokers(bootstrap: &str) {
    let set = BROKERS.get_or_init(|| bootstrap.to_string());
    assert_eq!(set, bootstrap, "the tests already use the brokers at {set}");
}

/// The bootstrap address of the test broker, starting it with `deploy/local/kafka.sh up` the
/// first time it is asked for. `DEDUPE_TEST_BROKERS` points the tests at another broker.
pub fn brokers() -> String {
    BROKERS
        .get_or_init(|| {
            if let Ok(b) = std::env::var("DEDUPE_TEST_BROKERS") {
                return b;
            }
            let script = repo_root().join("deploy/local/kafka.sh");
            let out = Command::new("bash")
                .arg(&script)
                .arg("up")
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
            assert!(
                out.status.success(),
                "the test broker did not start ({} up failed):\n{}\n{}",
                script.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            stdout.lines().last().expect("kafka.sh up prints the bootstrap address").trim().to_string()
        })
        .clone()
}

pub fn kafka_config() -> KafkaConfig {
    KafkaConfig { brokers: brokers(), ..KafkaConfig::default() }
}

pub fn client_config() -> ClientConfig {
    dedupe::kafka::client_config(&kafka_config())
}

/// A record to produce: its key and value, either possibly absent.
pub type KeyAndValue = (Option<Vec<u8>>, Option<Vec<u8>>);

/// A topic with a unique name, deleted when dropped.
pub struct TestTopic {
    pub name: String,
    pub partitions: i32,
}

impl TestTopic {
    /// Creates `<prefix>-<uuid>` with `partitions` partitions on the test brokers, with the
    /// brokers' default replication factor (1 on the single broker, 3 on the cluster).
    pub fn create(prefix: &str, partitions: i32) -> Self {
        let name = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
        futures::executor::block_on(dedupe::kafka::create_topic(&kafka_config(), &name, partitions, -1, &[]))
            .unwrap_or_else(|e| panic!("cannot create topic {name} on {}: {e}", brokers()));
        wait_for_topic(&name, partitions as usize);
        Self { name, partitions }
    }
}

impl TestTopic {
    /// Deletes the topic and creates it again, empty, under the same name.
    pub fn recreate(&self) {
        let admin: AdminClient<DefaultClientContext> = client_config().create().expect("admin client");
        futures::executor::block_on(admin.delete_topics(&[&self.name], &AdminOptions::new()))
            .expect("delete topics request");
        // Deletion completes asynchronously: wait until the metadata no longer lists the topic.
        let consumer: BaseConsumer = client_config().create().expect("consumer");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let md = consumer.fetch_metadata(Some(&self.name), Duration::from_secs(5));
            let gone = md.map(|md| md.topics().iter().all(|t| t.name() != self.name || t.error().is_some())).unwrap_or(false);
            if gone {
                break;
            }
            assert!(Instant::now() < deadline, "topic {} was not deleted within 30 s", self.name);
            std::thread::sleep(Duration::from_millis(200));
        }
        futures::executor::block_on(dedupe::kafka::create_topic(&kafka_config(), &self.name, self.partitions, -1, &[]))
            .unwrap_or_else(|e| panic!("cannot create topic {} again: {e}", self.name));
        wait_for_topic(&self.name, self.partitions as usize);
    }
}

impl Drop for TestTopic {
    fn drop(&mut self) {
        let admin: Result<AdminClient<DefaultClientContext>, _> = client_config().create();
        if let Ok(admin) = admin {
            // With the id changelog a worker made for it, when this is an output topic, and the
            // dead-letter topic a front door made for it, when this is an input topic.
            let changelog = dedupe::changelog::default_topic(&self.name);
            let dead_letters = format!("{}.dead-letter", self.name);
            let _ = futures::executor::block_on(admin.delete_topics(&[&self.name, &changelog, &dead_letters], &AdminOptions::new()));
        }
    }
}

/// Waits until the broker's metadata shows `topic` with `partitions` partitions and leaders.
pub fn wait_for_topic(topic: &str, partitions: usize) {
    let consumer: BaseConsumer = client_config().create().expect("consumer");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(md) = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
            if let Some(t) = md.topics().iter().find(|t| t.name() == topic) {
                if t.error().is_none()
                    && t.partitions().len() == partitions
                    && t.partitions().iter().all(|p| p.leader() >= 0 && p.error().is_none())
                {
                    return;
                }
            }
        }
        assert!(Instant::now() < deadline, "topic {topic} did not appear with {partitions} partitions");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A record as read back from a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp: Option<i64>,
}

/// A record to produce: key, value, headers.
pub type Outgoing = (Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Vec<u8>)>);

/// Produces `(key, value)` records (idempotent, acks=all) and waits for every acknowledgement.
/// Returns (partition, offset) of each.
pub fn produce(topic: &str, records: &[KeyAndValue]) -> Vec<(i32, i64)> {
    let full: Vec<Outgoing> = records.iter().map(|(k, v)| (k.clone(), v.clone(), Vec::new())).collect();
    produce_full(topic, &full)
}

/// Produces records with headers, in order, and waits for every acknowledgement.
pub fn produce_full(topic: &str, records: &[Outgoing]) -> Vec<(i32, i64)> {
    produce_full_to(topic, None, records)
}

/// [`produce_full`] into one partition, or where the key puts each record if None.
pub fn produce_full_to(topic: &str, partition: Option<i32>, records: &[Outgoing]) -> Vec<(i32, i64)> {
    let producer: FutureProducer = client_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut pending = Vec::with_capacity(records.len());
        for (k, v, hs) in records {
            let mut r: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
            if let Some(p) = partition {
                r = r.partition(p);
            }
            if let Some(k) = k {
                r = r.key(k.as_slice());
            }
            if let Some(v) = v {
                r = r.payload(v.as_slice());
            }
            if !hs.is_empty() {
                let mut h = rdkafka::message::OwnedHeaders::new();
                for (name, value) in hs {
                    h = h.insert(rdkafka::message::Header { key: name, value: Some(value.as_slice()) });
                }
                r = r.headers(h);
            }
            pending.push(producer.send_result(r).map_err(|(e, _)| e).expect("enqueue"));
        }
        let mut out = Vec::with_capacity(pending.len());
        for p in pending {
            let delivery = p.await.expect("delivery future").map_err(|(e, _)| e).expect("delivered");
            out.push((delivery.partition, delivery.offset));
        }
        out
    })
}

/// Reads every partition of `topic` from the beginning to its end (to the last stable offset
/// when `read_committed`), in offset order per partition.
pub fn consume_all(topic: &str, read_committed: bool) -> Vec<Record> {
    try_consume_all(topic, read_committed, Duration::from_secs(120)).unwrap_or_else(|e| panic!("{e}"))
}

pub fn try_consume_all(topic: &str, read_committed: bool, timeout: Duration) -> Result<Vec<Record>, dedupe::kafka::ReadError> {
    let mut out = Vec::new();
    dedupe::kafka::read_to_end(&kafka_config(), topic, read_committed, timeout, &mut |m| {
        let headers = m
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.map(|v| v.to_vec()))).collect())
            .unwrap_or_default();
        out.push(Record {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(|k| k.to_vec()),
            value: m.payload().map(|v| v.to_vec()),
            headers,
            timestamp: m.timestamp().to_millis(),
        });
    })?;
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}


/// The `dedupe` binary built by this test run (`target/<profile>/dedupe`).
pub fn dedupe_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test>-<hash> → target/<profile>/dedupe
    let bin = exe.parent().and_then(|d| d.parent()).expect("target dir").join("dedupe");
    assert!(bin.exists(), "{} is missing: run the tests with `cargo test --workspace` so the binary is built", bin.display());
    bin
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// A `dedupe run` child process with its own ledger directory and metrics port.
pub struct Worker {
    pub child: std::process::Child,
    pub metrics_port: u16,
    /// Where its metrics listener is (127.0.0.1 unless the worker runs in another network namespace).
    pub metrics_host: std::net::IpAddr,
    pub data_dir: PathBuf,
    pub log: PathBuf,
}

/// How to start a worker.
#[derive(Clone)]
pub struct WorkerSpec {
    pub input: String,
    pub output: String,
    pub data_dir: PathBuf,
    pub partitions: Option<String>,
    pub env: Vec<(String, String)>,
    pub extra_args: Vec<String>,
    /// `--brokers` (the tests' broker if None).
    pub brokers: Option<String>,
    /// A command the worker runs under (e.g. `ip netns exec NAME`).
    pub wrapper: Vec<String>,
    /// The address its metrics listener binds (127.0.0.1 if None).
    pub metrics_host: Option<std::net::IpAddr>,
}

impl WorkerSpec {
    pub fn new(input: &str, output: &str, data_dir: &std::path::Path) -> Self {
        Self {
            input: input.into(),
            output: output.into(),
            data_dir: data_dir.to_path_buf(),
            partitions: None,
            env: vec![
                ("DEDUPE_WORKER_BATCH_MAX_RECORDS".into(), "500".into()),
                ("DEDUPE_WORKER_BATCH_LINGER_MS".into(), "5".into()),
                ("DEDUPE_LEDGER_BUDGET_BYTES".into(), "256MiB".into()),
                ("DEDUPE_LEDGER_WRITE_BUFFER_BYTES".into(), "8MiB".into()),
                ("DEDUPE_WORKER_GROUP_ID".into(), format!("dedupe-test-{}", uuid::Uuid::new_v4().simple())),
            ],
            extra_args: Vec::new(),
            brokers: None,
            wrapper: Vec::new(),
            metrics_host: None,
        }
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.retain(|(key, _)| key != k);
        self.env.push((k.into(), v.into()));
        self
    }

    /// Drops a setting, so the worker runs with the default (e.g. the default ledger budget).
    pub fn without(mut self, k: &str) -> Self {
        self.env.retain(|(key, _)| key != k);
        self
    }

    /// Starts `dedupe run`; its stderr goes to a log file in the data directory's parent.
    pub fn start(&self) -> Worker {
        let metrics_port = free_port();
        let log = self.data_dir.with_extension(format!("log-{}", uuid::Uuid::new_v4().simple()));
        let log_file = std::fs::File::create(&log).expect("log file");
        let metrics_host = self.metrics_host.unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
        let mut cmd = match self.wrapper.split_first() {
            None => Command::new(dedupe_bin()),
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(dedupe_bin());
                cmd
            }
        };
        cmd.arg("run")
            .arg("--brokers")
            .arg(self.brokers.clone().unwrap_or_else(brokers))
            .arg("--input-topic")
            .arg(&self.input)
            .arg("--output-topic")
            .arg(&self.output)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--metrics-addr")
            .arg(std::net::SocketAddr::new(metrics_host, metrics_port).to_string())
            .args(&self.extra_args)
            .stdout(std::process::Stdio::null())
            .stderr(log_file);
        if let Some(p) = &self.partitions {
            cmd.arg("--partitions").arg(p);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn dedupe run");
        Worker { child, metrics_port, metrics_host, data_dir: self.data_dir.clone(), log }
    }
}

impl Worker {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The metrics page, if the worker serves it yet.
    pub fn metrics(&self) -> Option<String> {
        self.get("/metrics").map(|(_, body)| body)
    }

    /// GET on its metrics listener; (status, body), or None if nothing answers.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        let response = http::get(self.metrics_addr(), path).ok()?;
        Some((response.status, String::from_utf8_lossy(&response.body).into_owned()))
    }

    /// Where its metrics (and admin) listener is.
    pub fn metrics_addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.metrics_host, self.metrics_port)
    }

    /// An empty POST to its metrics listener (the admin endpoints) with these headers; panics if
    /// nothing answers.
    pub fn post(&self, path: &str, headers: &[(&str, &str)]) -> http::Response {
        http::request(self.metrics_addr(), "POST", path, headers, b"")
            .unwrap_or_else(|e| panic!("POST {path} to the worker: {e}\n{}", self.log_text()))
    }

    /// Waits until /readyz answers 200 (every owned partition recovered).
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((200, _)) = self.get("/readyz") {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the worker exited with {status} before it was ready:\n{}", self.log_text());
            }
            assert!(Instant::now() < deadline, "the worker was not ready within {timeout:?}:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends SIGTERM and waits for the exit code.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.wait(timeout)
    }

    /// SIGKILL: the crash case.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                self.kill();
                panic!("the worker did not exit within {timeout:?}:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// GET http://127.0.0.1:port/path; (status, body), or None if nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let response = http::get(std::net::SocketAddr::from(([127, 0, 0, 1], port)), path).ok()?;
    Some((response.status, String::from_utf8_lossy(&response.body).into_owned()))
}

/// The sum of a counter's or gauge's series named `name` whose labels include `labels`, on a
/// metrics page; None when no series matches. Panics if the page is not the Prometheus text format.
pub fn metric_value(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    use prometheus_parse::{Scrape, Value};
    let scrape = Scrape::parse(page.lines().map(|l| Ok(l.to_owned()))).expect("a Prometheus text page");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .filter_map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
            _ => None,
        })
        .reduce(|a, b| a + b)
}

/// Reads `topic` (read_committed) until it holds at least `expected` records, and returns what
/// it holds then. To check that nothing more (a duplicate) arrives, stop the worker and read the
/// topic again with [`consume_all`]: once the worker has exited, the output is final.
pub fn wait_for_records(topic: &str, expected: usize, timeout: Duration) -> Vec<Record> {
    let deadline = Instant::now() + timeout;
    loop {
        let got = consume_all(topic, true);
        if got.len() >= expected {
            return got;
        }
        assert!(Instant::now() < deadline, "{topic} holds {} records, expected {expected}, after {timeout:?}", got.len());
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Runs `dedupe verify` over the two topics; returns (exit code, JSON summary).
pub fn verify(input: &str, output: &str) -> (i32, serde_json::Value) {
    let out = Command::new(dedupe_bin())
        .args(["verify", "--brokers", &brokers(), "--input-topic", input, "--output-topic", output])
        .output()
        .expect("dedupe verify");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!("verify printed no JSON: {stdout}\n{}", String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().unwrap_or(-1), json)
}


/// `n` fresh UUIDv4 message ids.
pub fn ids(n: usize) -> Vec<String> {
    (0..n).map(|_| uuid::Uuid::new_v4().to_string()).collect()
}

/// Records keyed by these ids, with a small JSON value and a header.
pub fn keyed(ids: &[&String]) -> Vec<Outgoing> {
    ids.iter()
        .map(|id| {
            let value = format!(r#"{{"messageId":"{id}","n":1}}"#).into_bytes();
            (Some(id.as_bytes().to_vec()), Some(value), vec![("trace".to_string(), id.as_bytes()[..8].to_vec())])
        })
        .collect()
}


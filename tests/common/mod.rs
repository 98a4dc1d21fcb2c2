//! Shared helpers for the integration tests: a real Apache Kafka broker started by the project's
//! own script, uniquely named topics that delete themselves, and produce/consume helpers.
//!
//! A test that cannot reach its broker fails with a message saying what is missing; nothing here
//! skips.
#![allow(dead_code)]

pub mod http;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use dedupe::config::KafkaConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// The repository's top directory.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The bootstrap address of the test broker, starting it with `deploy/local/kafka.sh up` the
/// first time it is asked for. `DEDUPE_TEST_BROKERS` points the tests at another broker.
pub fn brokers() -> String {
    static BROKERS: OnceLock<String> = OnceLock::new();
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

/// A topic with a unique name, deleted when dropped.
pub struct TestTopic {
    pub name: String,
    pub partitions: i32,
}

impl TestTopic {
    /// Creates `<prefix>-<uuid>` with `partitions` partitions on the test broker.
    pub fn create(prefix: &str, partitions: i32) -> Self {
        let name = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
        futures::executor::block_on(dedupe::kafka::create_topic(&kafka_config(), &name, partitions, 1, &[]))
            .unwrap_or_else(|e| panic!("cannot create topic {name} on {}: {e}", brokers()));
        wait_for_topic(&name, partitions as usize);
        Self { name, partitions }
    }
}

impl Drop for TestTopic {
    fn drop(&mut self) {
        let admin: Result<AdminClient<DefaultClientContext>, _> = client_config().create();
        if let Ok(admin) = admin {
            let _ = futures::executor::block_on(admin.delete_topics(&[&self.name], &AdminOptions::new()));
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

/// Produces `(key, value)` records (idempotent, acks=all) and waits for every acknowledgement.
/// Returns (partition, offset) of each.
pub fn produce(topic: &str, records: &[(Option<Vec<u8>>, Option<Vec<u8>>)]) -> Vec<(i32, i64)> {
    let producer: FutureProducer = client_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut pending = Vec::with_capacity(records.len());
        for (k, v) in records {
            let mut r: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
            if let Some(k) = k {
                r = r.key(k.as_slice());
            }
            if let Some(v) = v {
                r = r.payload(v.as_slice());
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

pub fn try_consume_all(topic: &str, read_committed: bool, timeout: Duration) -> Result<Vec<Record>, KafkaError> {
    let consumer: BaseConsumer = client_config()
        .set("group.id", format!("test-reader-{}", uuid::Uuid::new_v4().simple()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", if read_committed { "read_committed" } else { "read_uncommitted" })
        .create()?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let parts: Vec<i32> = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    assert!(!parts.is_empty(), "topic {topic} has no partitions");
    let mut tpl = TopicPartitionList::new();
    for p in &parts {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut at_end: HashMap<i32, bool> = parts.iter().map(|p| (*p, false)).collect();
    let mut out = Vec::new();
    let deadline = Instant::now() + timeout;
    while at_end.values().any(|e| !e) {
        if Instant::now() > deadline {
            panic!("reading {topic} did not reach the end of every partition within {timeout:?}");
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p, true);
            }
            Some(Err(e)) => return Err(e),
            Some(Ok(m)) => {
                at_end.insert(m.partition(), false);
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
            }
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}

/// True if `e` is the error a broker gives for an unknown topic or partition.
pub fn is_unknown_topic(e: &KafkaError) -> bool {
    matches!(e.rdkafka_error_code(), Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic))
}

//! The test broker, uniquely named topics that delete themselves, and produce/consume helpers.
//!
//! A test that cannot reach its broker fails with a message saying what is missing; nothing here
//! skips.

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dedupe::config::KafkaConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use crate::repo_root;

static BROKERS: OnceLock<String> = OnceLock::new();

/// Points every helper of this test process at `bootstrap` (e.g. the three-node cluster) instead
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
            stdout
                .lines()
                .last()
                .expect("kafka.sh up prints the bootstrap address")
                .trim()
                .to_string()
        })
        .clone()
}

pub fn kafka_config() -> KafkaConfig {
    KafkaConfig {
        brokers: brokers(),
        ..KafkaConfig::default()
    }
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
        Self::create_with(prefix, partitions, &[])
    }

    /// A worker's input and output topics, `<prefix>-in-<uuid>` and `<prefix>-out-<uuid>`, each
    /// with `partitions` partitions.
    pub fn pair(prefix: &str, partitions: i32) -> (Self, Self) {
        (
            Self::create(&format!("{prefix}-in"), partitions),
            Self::create(&format!("{prefix}-out"), partitions),
        )
    }

    /// [`TestTopic::create`] with topic settings (e.g. `max.message.bytes`).
    pub fn create_with(prefix: &str, partitions: i32, configs: &[(&str, &str)]) -> Self {
        let name = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
        futures::executor::block_on(dedupe::kafka::create_topic(
            &kafka_config(),
            &name,
            partitions,
            -1,
            configs,
        ))
        .unwrap_or_else(|e| panic!("cannot create topic {name} on {}: {e}", brokers()));
        wait_for_topic(&name, partitions as usize);
        Self { name, partitions }
    }
}

impl TestTopic {
    /// Sets one of the topic's settings (e.g. raises `max.message.bytes`) through Kafka's admin
    /// API, and waits until the broker answers it so.
    pub fn alter(&self, key: &str, value: &str) {
        use rdkafka::admin::{AlterConfig, ResourceSpecifier};
        let admin: AdminClient<DefaultClientContext> =
            client_config().create().expect("admin client");
        let config = AlterConfig::new(ResourceSpecifier::Topic(&self.name)).set(key, value);
        let results =
            futures::executor::block_on(admin.alter_configs(&[config], &AdminOptions::new()))
                .unwrap_or_else(|e| panic!("alter {key} of {}: {e}", self.name));
        for result in results {
            result.unwrap_or_else(|(r, e)| panic!("alter {key} of {r:?}: {e}"));
        }
    }

    /// Deletes the topic and creates it again, empty, under the same name.
    pub fn recreate(&self) {
        let admin: AdminClient<DefaultClientContext> =
            client_config().create().expect("admin client");
        futures::executor::block_on(admin.delete_topics(&[&self.name], &AdminOptions::new()))
            .expect("delete topics request");
        // Deletion completes asynchronously: wait until the metadata no longer lists the topic.
        let consumer: BaseConsumer = client_config().create().expect("consumer");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let md = consumer.fetch_metadata(Some(&self.name), Duration::from_secs(5));
            let gone = md
                .map(|md| {
                    md.topics()
                        .iter()
                        .all(|t| t.name() != self.name || t.error().is_some())
                })
                .unwrap_or(false);
            if gone {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "topic {} was not deleted within 30 s",
                self.name
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        futures::executor::block_on(dedupe::kafka::create_topic(
            &kafka_config(),
            &self.name,
            self.partitions,
            -1,
            &[],
        ))
        .unwrap_or_else(|e| panic!("cannot create topic {} again: {e}", self.name));
        wait_for_topic(&self.name, self.partitions as usize);
    }
}

impl Drop for TestTopic {
    fn drop(&mut self) {
        let admin: Result<AdminClient<DefaultClientContext>, _> = client_config().create();
        if let Ok(admin) = admin {
            // With the id changelog and the duplicate audit a worker made for it, when this is an
            // output topic, and the dead-letter topic a front door made for it, when this is an
            // input topic.
            let changelog = dedupe::changelog::default_topic(&self.name);
            let audit = dedupe::audit::default_topic(&self.name);
            let dead_letters = format!("{}.dead-letter", self.name);
            let _ = futures::executor::block_on(admin.delete_topics(
                &[&self.name, &changelog, &audit, &dead_letters],
                &AdminOptions::new(),
            ));
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
                    && t.partitions()
                        .iter()
                        .all(|p| p.leader() >= 0 && p.error().is_none())
                {
                    return;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "topic {topic} did not appear with {partitions} partitions"
        );
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
    let full: Vec<Outgoing> = records
        .iter()
        .map(|(k, v)| (k.clone(), v.clone(), Vec::new()))
        .collect();
    produce_full(topic, &full)
}

/// Produces records with headers, in order, and waits for every acknowledgement.
pub fn produce_full(topic: &str, records: &[Outgoing]) -> Vec<(i32, i64)> {
    produce_full_to(topic, None, records)
}

/// [`produce_full`] into one partition, or where the key puts each record if None.
pub fn produce_full_to(
    topic: &str,
    partition: Option<i32>,
    records: &[Outgoing],
) -> Vec<(i32, i64)> {
    produce_full_with(topic, partition, records, &[])
}

/// [`produce_full_to`] by a producer with these librdkafka properties too (e.g. a larger
/// `message.max.bytes`).
pub fn produce_full_with(
    topic: &str,
    partition: Option<i32>,
    records: &[Outgoing],
    properties: &[(&str, &str)],
) -> Vec<(i32, i64)> {
    let stamped: Vec<(&Outgoing, Option<i64>)> = records.iter().map(|r| (r, None)).collect();
    produce_records(topic, partition, &stamped, properties)
}

/// [`produce_full_to`] with each record's own timestamp (CreateTime, ms).
pub fn produce_stamped(
    topic: &str,
    partition: Option<i32>,
    records: &[(Outgoing, i64)],
) -> Vec<(i32, i64)> {
    let stamped: Vec<(&Outgoing, Option<i64>)> =
        records.iter().map(|(r, ts)| (r, Some(*ts))).collect();
    produce_records(topic, partition, &stamped, &[])
}

fn produce_records(
    topic: &str,
    partition: Option<i32>,
    records: &[(&Outgoing, Option<i64>)],
    properties: &[(&str, &str)],
) -> Vec<(i32, i64)> {
    let mut config = client_config();
    for (k, v) in properties {
        config.set(*k, *v);
    }
    let producer: FutureProducer = config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut pending = Vec::with_capacity(records.len());
        for &((k, v, hs), timestamp) in records {
            let mut r: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
            if let Some(p) = partition {
                r = r.partition(p);
            }
            if let Some(ts) = timestamp {
                r = r.timestamp(ts);
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
                    h = h.insert(rdkafka::message::Header {
                        key: name,
                        value: Some(value.as_slice()),
                    });
                }
                r = r.headers(h);
            }
            pending.push(
                producer
                    .send_result(r)
                    .map_err(|(e, _)| e)
                    .expect("enqueue"),
            );
        }
        let mut out = Vec::with_capacity(pending.len());
        for p in pending {
            let delivery = p
                .await
                .expect("delivery future")
                .map_err(|(e, _)| e)
                .expect("delivered");
            out.push((delivery.partition, delivery.offset));
        }
        out
    })
}

/// Reads every partition of `topic` from the beginning to its end (to the last stable offset
/// when `read_committed`), in offset order per partition.
pub fn consume_all(topic: &str, read_committed: bool) -> Vec<Record> {
    try_consume_all(topic, read_committed, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e}"))
}

pub fn try_consume_all(
    topic: &str,
    read_committed: bool,
    timeout: Duration,
) -> Result<Vec<Record>, dedupe::kafka::ReadError> {
    let mut out = Vec::new();
    dedupe::kafka::read_to_end(&kafka_config(), topic, read_committed, timeout, &mut |m| {
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.map(|v| v.to_vec())))
                    .collect()
            })
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
        assert!(
            Instant::now() < deadline,
            "{topic} holds {} records, expected {expected}, after {timeout:?}",
            got.len()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Watches a topic's high watermarks: when each partition grew (under load spread over every
/// partition, each one grows every second when all is well), from which how long each stood still.
pub struct StallMeter {
    stop: Arc<AtomicBool>,
    moved: Arc<Mutex<HashMap<i32, Instant>>>,
    partitions: i32,
    thread: std::thread::JoinHandle<Growth>,
}

/// When each partition of a watched topic grew, from when the watch started until it stopped.
pub struct Growth {
    started: Instant,
    stopped: Instant,
    grew: HashMap<i32, Vec<Instant>>,
}

impl Growth {
    /// The longest time one of the partitions not in `except` did not grow, from `from` (every
    /// partition growing then) until the watch stopped.
    pub fn longest_stall(&self, from: Instant, except: &[i32]) -> Duration {
        let mut longest = Duration::ZERO;
        for (p, times) in &self.grew {
            if except.contains(p) {
                continue;
            }
            let mut last = from.max(self.started);
            for t in times.iter().filter(|t| **t > from).chain([&self.stopped]) {
                longest = longest.max(t.duration_since(last));
                last = *t;
            }
        }
        longest
    }

    /// The longest time one partition did not grow, among the stills that overlap `[from, to]`
    /// (a fault's: the output flowed on every partition before it, and again after it).
    pub fn longest_stall_during(&self, from: Instant, to: Instant) -> Duration {
        let mut longest = Duration::ZERO;
        for times in self.grew.values() {
            let mut last = self.started;
            for t in times.iter().chain([&self.stopped]) {
                if *t > from && last < to {
                    longest = longest.max(t.duration_since(last));
                }
                last = *t;
            }
        }
        longest
    }

    /// How long after `since` the last of the partitions in `of` grew again (all of them when
    /// empty); `None` if one never did.
    pub fn back_after(&self, since: Instant, of: &[i32]) -> Option<Duration> {
        let mut slowest = Duration::ZERO;
        for (p, times) in &self.grew {
            if !of.is_empty() && !of.contains(p) {
                continue;
            }
            let first = times.iter().find(|t| **t > since)?;
            slowest = slowest.max(first.duration_since(since));
        }
        Some(slowest)
    }
}

impl StallMeter {
    pub fn start(topic: &str, partitions: i32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let moved: Arc<Mutex<HashMap<i32, Instant>>> = Arc::default();
        let thread = {
            let (stop, moved, topic) = (stop.clone(), moved.clone(), topic.to_string());
            std::thread::spawn(move || {
                // Leaders looked up every second: a client that asks a paused or cut-off node
                // hears nothing back, not "not the leader", and would keep asking it, so the
                // meter would see the output stall as long as the node does, however soon the
                // worker writes to the partition's new leader.
                let consumer: BaseConsumer = client_config()
                    .set("topic.metadata.refresh.interval.ms", "1000")
                    .create()
                    .expect("watermark client");
                let mut last: HashMap<i32, i64> = HashMap::new();
                let started = Instant::now();
                let mut grew: HashMap<i32, Vec<Instant>> =
                    (0..partitions).map(|p| (p, Vec::new())).collect();
                while !stop.load(Ordering::Relaxed) {
                    for p in 0..partitions {
                        if let Ok((_, high)) =
                            consumer.fetch_watermarks(&topic, p, Duration::from_secs(1))
                        {
                            if last.insert(p, high).is_some_and(|before| high > before) {
                                let now = Instant::now();
                                moved.lock().unwrap().insert(p, now);
                                grew.entry(p).or_default().push(now);
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                Growth {
                    started,
                    stopped: Instant::now(),
                    grew,
                }
            })
        };
        Self {
            stop,
            moved,
            partitions,
            thread,
        }
    }

    /// Waits until every partition has grown after `since` (the worker publishes on each again).
    pub fn wait_flowing(&self, since: Instant, timeout: Duration) {
        crate::wait_until(
            "every output partition growing",
            timeout,
            Duration::from_millis(250),
            || {
                let moved = self.moved.lock().unwrap();
                (0..self.partitions)
                    .all(|p| moved.get(&p).is_some_and(|t| *t > since))
                    .then_some(())
            },
            || {
                format!(
                    "last growth per partition: {:?}",
                    self.moved
                        .lock()
                        .unwrap()
                        .iter()
                        .map(|(p, t)| (*p, t.elapsed()))
                        .collect::<Vec<_>>()
                )
            },
        )
    }

    /// Stops watching; when each partition grew.
    pub fn finish(self) -> Growth {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the stall meter")
    }
}

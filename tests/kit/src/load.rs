//! The one load generator: keyed records at a steady rate with a share of them re-sent (some
//! right away, some long after their first copy), in a thread until it is told to stop; and the
//! fixed inputs the smaller tests produce at once.
//!
//! The producer uses `acks=all`, so a broker fault is ridden out by its retries; a record it still
//! fails to deliver (after `message.timeout.ms`, 5 min) fails the test. It is not idempotent:
//! librdkafka 2.12's idempotent producer was seen spinning a core (`poll` with a zero timeout in
//! its broker thread) for minutes after a broker was killed, which starved the nodes of a 2-core
//! machine. A retry that writes a record twice is one more duplicate for the worker to remove;
//! the checks read the input back ([`crate::exactly_once`]), so they count it right.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};

use crate::{client_config, produce_full, Outgoing};

/// `n` fresh UUIDv4 message ids.
pub fn ids(n: usize) -> Vec<String> {
    (0..n).map(|_| uuid::Uuid::new_v4().to_string()).collect()
}

/// Records keyed by these ids, with a small JSON value and a header.
pub fn keyed(ids: &[&String]) -> Vec<Outgoing> {
    ids.iter()
        .map(|id| {
            let value = format!(r#"{{"messageId":"{id}","n":1}}"#).into_bytes();
            (
                Some(id.as_bytes().to_vec()),
                Some(value),
                vec![("trace".to_string(), id.as_bytes()[..8].to_vec())],
            )
        })
        .collect()
}

/// Produces `unique` fresh ids with `resent` of them sent again at random later places, and
/// waits for every acknowledgement; returns `unique`, the number of distinct ids.
pub fn produce_with_repeats(topic: &str, unique: usize, resent: usize) -> usize {
    let all = ids(unique);
    let mut rng = rand::rng();
    let mut order: Vec<&String> = all.iter().collect();
    for _ in 0..resent {
        let at = rng.random_range(1..order.len());
        let earlier = order[rng.random_range(0..at)];
        order.insert(at, earlier);
    }
    produce_full(topic, &keyed(&order));
    unique
}

/// What a [`Load`] produces.
#[derive(Debug, Clone, Copy)]
pub struct LoadSpec {
    /// Records per second, re-sent ones included.
    pub rate_per_sec: u64,
    /// The share of records that repeat an earlier id.
    pub resend_share: f64,
    /// The share of re-sends that repeat an id at least `old_after` old, when there is one (the
    /// others repeat the id sent just before).
    pub old_share: f64,
    pub old_after: Duration,
}

impl Default for LoadSpec {
    /// 1,000 records/s, 5% re-sent, every re-send of an id 5 s old or more when there is one.
    fn default() -> Self {
        Self {
            rate_per_sec: 1_000,
            resend_share: 0.05,
            old_share: 1.0,
            old_after: Duration::from_secs(5),
        }
    }
}

/// What a [`Load`] sent, once every record is delivered.
#[derive(Debug, Clone, Copy)]
pub struct LoadSummary {
    pub sent: u64,
    pub distinct: u64,
    pub resent: u64,
}

/// Load produced in a thread until [`Load::finish`].
pub struct Load {
    stop: Arc<AtomicBool>,
    distinct: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<LoadSummary>>,
}

impl Load {
    pub fn start(topic: &str, spec: LoadSpec) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let distinct = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, distinct, topic) = (stop.clone(), distinct.clone(), topic.to_string());
            std::thread::spawn(move || produce_until(&topic, spec, &stop, &distinct))
        };
        Self {
            stop,
            distinct,
            thread: Some(thread),
        }
    }

    /// Distinct ids handed to the producer so far (delivered or on their way).
    pub fn distinct(&self) -> usize {
        self.distinct.load(Ordering::Relaxed) as usize
    }

    /// Stops producing and waits for every record's delivery.
    pub fn finish(mut self) -> LoadSummary {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .expect("the load thread")
            .join()
            .expect("the load thread")
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

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

fn produce_until(
    topic: &str,
    spec: LoadSpec,
    stop: &AtomicBool,
    distinct: &AtomicU64,
) -> LoadSummary {
    let producer: ThreadedProducer<Failures> = client_config()
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create_with_context(Failures::default())
        .expect("load producer");
    let mut rng = rand::rng();
    let mut recent: VecDeque<(Instant, String)> = VecDeque::new();
    let (mut sent, mut resent) = (0u64, 0u64);
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let resend = !recent.is_empty() && rng.random_bool(spec.resend_share);
        let id = if resend {
            resent += 1;
            if rng.random_bool(spec.old_share) {
                let old = recent
                    .iter()
                    .position(|(t, _)| t.elapsed() >= spec.old_after);
                recent[old.unwrap_or_else(|| rng.random_range(0..recent.len()))]
                    .1
                    .clone()
            } else {
                recent.back().expect("not empty").1.clone()
            }
        } else {
            distinct.fetch_add(1, Ordering::Relaxed);
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
            assert!(
                matches!(
                    e.rdkafka_error_code(),
                    Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                ),
                "producing: {e}"
            );
            record = r;
            std::thread::sleep(Duration::from_millis(5));
        }
        sent += 1;
        // Paced against the start, so a stall is caught up at once afterwards.
        let due = started + Duration::from_secs_f64(sent as f64 / spec.rate_per_sec as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    producer
        .flush(Duration::from_secs(360))
        .expect("every load record delivered within 6 min");
    let failures = producer.context().0.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} load records were not delivered: {:?}",
        failures.len(),
        failures.first()
    );
    LoadSummary {
        sent,
        distinct: distinct.load(Ordering::Relaxed),
        resent,
    }
}

//! The tests' load: keyed records at a steady rate with a share of them re-sent (some right
//! away, some long after their first copy), in a thread until it is told to stop, produced by the
//! service's one load generator (`dedupe::bench::load`); and the fixed inputs the smaller tests
//! produce at once.
//!
//! The producer uses `acks=all`, so a broker fault is ridden out by its retries; a record it still
//! fails to deliver (after `message.timeout.ms`, 5 min) fails the test. It is not idempotent:
//! librdkafka 2.12's idempotent producer was seen spinning a core (`poll` with a zero timeout in
//! its broker thread) for minutes after a broker was killed, which starved the nodes of a 2-core
//! machine. A retry that writes a record twice is one more duplicate for the worker to remove;
//! the checks read the input back ([`crate::exactly_once`]), so they count it right.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dedupe::bench::load::{self, Deliveries, Pace, Shape, Until};
use rand::Rng;
use rdkafka::producer::ThreadedProducer;

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
    /// The share of records that repeat an earlier record.
    pub resend_share: f64,
    /// The share of re-sends that repeat a record at least `old_after` old, when there is one
    /// (the others repeat the record sent just before).
    pub old_share: f64,
    pub old_after: Duration,
}

impl Default for LoadSpec {
    /// 1,000 records/s, 5% re-sent, every re-send of a record 5 s old or more when there is one.
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

/// Load produced in a thread until [`Load::finish`], by the service's own load generator
/// (`dedupe::bench::load`, the one `dedupe loadgen` and the benches use).
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

fn produce_until(
    topic: &str,
    spec: LoadSpec,
    stop: &AtomicBool,
    distinct: &AtomicU64,
) -> LoadSummary {
    let producer: ThreadedProducer<Deliveries> = client_config()
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create_with_context(Deliveries::default())
        .expect("load producer");
    let shape = Shape {
        retry_share: spec.resend_share,
        old_share: spec.old_share,
        old_after: spec.old_after,
        reused_share: 0.0,
        value_bytes: 0,
    };
    let pace = Pace {
        rate_per_sec: Some(spec.rate_per_sec as f64),
        spread_timestamps: None,
        sample_every: 0,
    };
    let summary = load::produce(
        &producer,
        topic,
        shape,
        Until::Stopped(stop),
        pace,
        distinct,
        &mut |_| {},
    )
    .unwrap_or_else(|e| panic!("the load (records fail the test when a broker fault outlasts the producer's retries): {e}"));
    LoadSummary {
        sent: summary.sent,
        distinct: summary.distinct,
        resent: summary.retries,
    }
}

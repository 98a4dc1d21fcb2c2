//! The one load generator: records keyed by UUIDv4, a share of them sent again as a retrying
//! client does (the same key and value, some right after their first copy, some long after), and
//! a share reusing an earlier id for other content (a client bug). `dedupe loadgen`, the benches
//! and the tests' background load (the test kit's `Load`) all produce with [`produce`]; they
//! differ only in their producer's settings and in when they stop.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

/// How many recent records retries and reused ids draw from.
const RECENT: usize = 10_000;

/// What the records are.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The share of records that send an earlier record again, as it was.
    pub retry_share: f64,
    /// Of the retries, the share that send the oldest recent record at least `old_after` old
    /// (a random recent one while none is that old); the others send the record just before.
    pub old_share: f64,
    pub old_after: Duration,
    /// The share of records that reuse a recent id for another value.
    pub reused_share: f64,
    /// Approximate size of each record's value (at least its JSON's own, about 90 bytes).
    pub value_bytes: usize,
}

impl Default for Shape {
    /// 1% retries, each of a record 5 s old or more when there is one; no reused id.
    fn default() -> Self {
        Self {
            retry_share: 0.01,
            old_share: 1.0,
            old_after: Duration::from_secs(5),
            reused_share: 0.0,
            value_bytes: 100,
        }
    }
}

/// What one record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    New,
    /// An earlier record sent again as it was.
    Retry,
    /// An earlier id with a new value.
    Reused,
}

/// Draws the records of a [`Shape`]: the same sequence for the same random numbers.
pub struct Draw {
    shape: Shape,
    recent: VecDeque<(Instant, String, String)>,
    filler: String,
}

impl Draw {
    pub fn new(shape: Shape) -> Self {
        let retry_share = shape.retry_share.clamp(0.0, 1.0);
        let reused_share = shape.reused_share.clamp(0.0, 1.0 - retry_share);
        Self {
            shape: Shape {
                retry_share,
                reused_share,
                old_share: shape.old_share.clamp(0.0, 1.0),
                ..shape
            },
            recent: VecDeque::new(),
            filler: "x".repeat(shape.value_bytes.saturating_sub(90)),
        }
    }

    /// Record number `seq` at `now`: what it is, its id and its value.
    pub fn next(&mut self, rng: &mut impl Rng, seq: u64, now: Instant) -> (Sent, String, String) {
        let draw: f64 = rng.random();
        let s = self.shape;
        let kind = match self.recent.is_empty() {
            true => Sent::New,
            false if draw < s.retry_share => Sent::Retry,
            false if draw < s.retry_share + s.reused_share => Sent::Reused,
            false => Sent::New,
        };
        match kind {
            Sent::Retry => {
                let at = if rng.random_bool(s.old_share) {
                    self.recent
                        .iter()
                        .position(|(t, _, _)| now.saturating_duration_since(*t) >= s.old_after)
                        .unwrap_or_else(|| rng.random_range(0..self.recent.len()))
                } else {
                    self.recent.len() - 1
                };
                let (_, id, value) = &self.recent[at];
                (kind, id.clone(), value.clone())
            }
            Sent::Reused => {
                let id = self.recent[rng.random_range(0..self.recent.len())]
                    .1
                    .clone();
                let value = self.value(&id, seq);
                (kind, id, value)
            }
            Sent::New => {
                let id = uuid::Uuid::new_v4().to_string();
                let value = self.value(&id, seq);
                self.recent.push_back((now, id.clone(), value.clone()));
                if self.recent.len() > RECENT {
                    self.recent.pop_front();
                }
                (kind, id, value)
            }
        }
    }

    fn value(&self, id: &str, seq: u64) -> String {
        format!(
            r#"{{"messageId":"{id}","seq":{seq},"type":"track","pad":"{}"}}"#,
            self.filler
        )
    }
}

/// When [`produce`] ends.
#[derive(Clone, Copy)]
pub enum Until<'a> {
    /// After this many records.
    Records(u64),
    /// When the flag is set.
    Stopped(&'a AtomicBool),
}

/// How [`produce`] produces.
#[derive(Clone, Copy)]
pub struct Pace {
    /// At most this many records per second (against the start, so a stall is caught up at
    /// once afterwards); as fast as the broker takes them if None.
    pub rate_per_sec: Option<f64>,
    /// Stamp the records with times spread evenly over this span, ending now (the first-seen
    /// times of a partition that has been running that long; needs [`Until::Records`]); the
    /// producer's clock if None.
    pub spread_timestamps: Option<Duration>,
    /// Keep every this-many-th new id in the summary's `samples` (0: none).
    pub sample_every: u64,
}

/// What [`produce`] sent: every record delivered.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub sent: u64,
    pub distinct: u64,
    pub retries: u64,
    pub reused: u64,
    pub seconds: f64,
    /// Every `sample_every`-th new id with the time it was stamped with (ms).
    pub samples: Vec<(String, i64)>,
}

/// Why [`produce`] failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("producing a record: {0}")]
    Produce(KafkaError),
    #[error("flushing the records: {0}")]
    Flush(KafkaError),
    #[error("{failed} of {sent} records were not delivered to {topic} (first error: {first})")]
    NotDelivered {
        failed: u64,
        sent: u64,
        topic: String,
        first: String,
    },
}

/// Counts the records the brokers refused for good (after the producer's own retries, within
/// `message.timeout.ms`), keeping the first error. The context of [`produce`]'s producer.
#[derive(Default)]
pub struct Deliveries {
    failed: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed.fetch_add(1, Ordering::Relaxed);
            self.first_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| e.to_string());
        }
    }
}

/// Produces records of `shape` to `topic` with `producer` until `until`, then waits for every
/// one to be delivered: a summary never counts a record the topic lacks. `distinct` is moved as
/// new ids are handed to the producer (for a caller that watches a load in progress);
/// `progress` is called every 1,024 records with the count sent.
pub fn produce(
    producer: &ThreadedProducer<Deliveries>,
    topic: &str,
    shape: Shape,
    until: Until<'_>,
    pace: Pace,
    distinct: &AtomicU64,
    progress: &mut dyn FnMut(u64),
) -> Result<Summary, LoadError> {
    let count = match until {
        Until::Records(n) => Some(n),
        Until::Stopped(_) => None,
    };
    let spread = pace
        .spread_timestamps
        .zip(count)
        .map(|(span, n)| (crate::clock::now_ms() - span.as_millis() as i64, span, n));
    let mut draw = Draw::new(shape);
    let mut rng = rand::rng();
    let mut summary = Summary::default();
    let started = Instant::now();
    loop {
        let done = match until {
            Until::Records(n) => summary.sent >= n,
            Until::Stopped(flag) => flag.load(Ordering::Relaxed),
        };
        if done {
            break;
        }
        let i = summary.sent;
        let (kind, id, value) = draw.next(&mut rng, i, Instant::now());
        match kind {
            Sent::New => {
                summary.distinct += 1;
                distinct.fetch_add(1, Ordering::Relaxed);
            }
            Sent::Retry => summary.retries += 1,
            Sent::Reused => summary.reused += 1,
        }
        let stamp =
            spread.map(|(from, span, n)| from + (span.as_millis() as u64 * i / n.max(1)) as i64);
        if kind == Sent::New
            && pace.sample_every > 0
            && summary.distinct.is_multiple_of(pace.sample_every)
        {
            summary
                .samples
                .push((id.clone(), stamp.unwrap_or_else(crate::clock::now_ms)));
        }
        let mut record = BaseRecord::to(topic)
            .key(id.as_str())
            .payload(value.as_str());
        if let Some(ms) = stamp {
            record = record.timestamp(ms);
        }
        send(producer, record)?;
        summary.sent += 1;
        if summary.sent % 1024 == 0 {
            progress(summary.sent);
        }
        if let Some(rate) = pace.rate_per_sec {
            let due = started + Duration::from_secs_f64(summary.sent as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
    }
    all_delivered(producer, topic, summary.sent)?;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// Hands `record` to the producer, waiting for room while its queue is full.
fn send(
    producer: &ThreadedProducer<Deliveries>,
    mut record: BaseRecord<'_, str, str>,
) -> Result<(), LoadError> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((e, _)) => return Err(LoadError::Produce(e)),
        }
    }
}

/// Waits until every record handed to the producer is delivered or given up on; fails naming
/// how many were not delivered and the first error.
fn all_delivered(
    producer: &ThreadedProducer<Deliveries>,
    topic: &str,
    sent: u64,
) -> Result<(), LoadError> {
    producer
        .flush(Duration::from_secs(360))
        .map_err(LoadError::Flush)?;
    let tally = producer.context();
    let failed = tally.failed.load(Ordering::Relaxed);
    if failed == 0 {
        return Ok(());
    }
    let first = tally
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default();
    Err(LoadError::NotDelivered {
        failed,
        sent,
        topic: topic.to_string(),
        first,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn draws(shape: Shape, n: u64) -> Vec<(Sent, String, String)> {
        let mut draw = Draw::new(shape);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let t0 = Instant::now();
        (0..n)
            .map(|i| draw.next(&mut rng, i, t0 + Duration::from_millis(i)))
            .collect()
    }

    #[test]
    fn retries_repeat_a_record_as_it_was_and_reused_ids_change_the_value() {
        let shape = Shape {
            retry_share: 0.2,
            reused_share: 0.1,
            ..Shape::default()
        };
        let records = draws(shape, 20_000);
        let mut first: std::collections::HashMap<&str, &str> = Default::default();
        let (mut retries, mut reused) = (0, 0);
        for (kind, id, value) in &records {
            match kind {
                Sent::New => assert!(first.insert(id, value).is_none(), "a new id twice"),
                Sent::Retry => {
                    retries += 1;
                    assert_eq!(
                        first[id.as_str()],
                        value.as_str(),
                        "a retry changed its value"
                    );
                }
                Sent::Reused => {
                    reused += 1;
                    assert!(first.contains_key(id.as_str()));
                    assert_ne!(first[id.as_str()], value.as_str());
                }
            }
            assert!(value.contains(id.as_str()));
        }
        // The shares hold within a few percent.
        assert!((3_600..4_400).contains(&retries), "{retries} retries");
        assert!((1_700..2_300).contains(&reused), "{reused} reused");
    }

    #[test]
    fn old_retries_wait_for_a_record_old_enough_and_the_others_repeat_the_last() {
        // Records 1 ms apart: a retry of a record at least 1 s old, once there is one.
        let old = Shape {
            retry_share: 0.1,
            old_after: Duration::from_secs(1),
            ..Shape::default()
        };
        let records = draws(old, 5_000);
        let position: std::collections::HashMap<&str, usize> = records
            .iter()
            .enumerate()
            .filter(|(_, (k, _, _))| *k == Sent::New)
            .map(|(i, (_, id, _))| (id.as_str(), i))
            .collect();
        for (i, (kind, id, _)) in records.iter().enumerate().skip(2_000) {
            if *kind == Sent::Retry {
                assert!(
                    i - position[id.as_str()] >= 1_000,
                    "record {i} retried too soon"
                );
            }
        }
        let latest = Shape {
            old_share: 0.0,
            ..old
        };
        let records = draws(latest, 2_000);
        for w in records.windows(2) {
            if w[1].0 == Sent::Retry {
                assert_eq!(w[1].1, w[0].1, "a retry of the latest record");
            }
        }
    }

    #[test]
    fn the_value_has_about_the_asked_size() {
        let records = draws(
            Shape {
                value_bytes: 500,
                ..Shape::default()
            },
            10,
        );
        for (_, _, value) in records {
            assert!((490..=520).contains(&value.len()), "{}", value.len());
        }
    }
}

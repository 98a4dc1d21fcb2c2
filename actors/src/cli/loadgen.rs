//! `dedupe loadgen`: keyed UUIDv4 messages, a share of them re-sent as a retrying client does and
//! a share reusing an id for other content; the demo's and the benches' load. Built with the
//! `tools` feature only: the image's binary does not carry it.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use dedupe::config::Config;
use rand::Rng;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use serde::Serialize;

/// Counts the records the brokers refused for good (after the producer's own retries, within
/// `message.timeout.ms`), keeping the first error.
#[derive(Default)]
struct DeliveryTally {
    failed: std::sync::atomic::AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

impl ClientContext for DeliveryTally {}

impl ProducerContext for DeliveryTally {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.first_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| e.to_string());
        }
    }
}

/// What `dedupe loadgen` sent.
#[derive(Debug, Serialize)]
pub struct LoadgenSummary {
    pub records_sent: u64,
    pub distinct_ids: u64,
    /// Retries: records that re-send an earlier record as it was (the same key and value).
    pub resent: u64,
    /// Records that reuse an earlier id for another value (a client bug the worker calls a
    /// reused id).
    pub reused: u64,
    pub seconds: f64,
    pub records_per_sec: f64,
    /// Every `sample_every`-th new id with the time it was stamped with (ms), for a caller that
    /// sends some of them again later.
    #[serde(skip)]
    pub samples: Vec<(String, i64)>,
}

/// What `loadgen` produces.
#[derive(Debug, Clone, Copy)]
pub struct Load<'a> {
    pub topic: &'a str,
    /// Records to produce.
    pub count: u64,
    /// The share of records that re-send an earlier record as it was (a retry)...
    pub dup_ratio: f64,
    /// The share of records that reuse an earlier id for another value.
    pub reused_ratio: f64,
    /// ...sent at least this long before, when there is one that old.
    pub dup_delay: Duration,
    /// Approximate size of each record's value.
    pub value_bytes: usize,
    /// At most this many records per second; as fast as the broker takes them if None.
    pub rate_per_sec: Option<f64>,
    pub show_progress: bool,
    /// Stamp the records with times spread evenly over this span, ending now (the first-seen
    /// times of a partition that has been running that long); the producer's clock if None.
    pub spread_timestamps: Option<Duration>,
    /// Keep every this-many-th new id in the summary's `samples` (0: none).
    pub sample_every: u64,
}

/// Produces `count` records keyed by UUIDv4; a share `dup_ratio` of them re-send a record sent
/// `dup_delay` earlier (or a recent one, when nothing is that old yet) with the same key and
/// value, as a retrying client does; a share `reused_ratio` reuse a recent id for a new value.
pub fn loadgen(config: &Config, load: Load<'_>) -> anyhow::Result<LoadgenSummary> {
    let Load {
        topic,
        count,
        dup_ratio,
        reused_ratio,
        dup_delay,
        value_bytes,
        rate_per_sec,
        show_progress,
        spread_timestamps,
        sample_every,
    } = load;
    let spread_from =
        spread_timestamps.map(|span| dedupe::clock::now_ms() - span.as_millis() as i64);
    dedupe::kafka::check_security(&config.kafka, Duration::from_secs(15))
        .with_context(|| format!("connecting to {}", config.kafka.brokers))?;
    // A broker that restarts or a leader that moves is ridden out by the producer's retries
    // (idempotent, so without duplicates) for up to `message.timeout.ms`; a record that is still
    // not delivered then makes the run fail, so a summary never counts ids the topic lacks.
    let producer: ThreadedProducer<DeliveryTally> = dedupe::kafka::client_config(&config.kafka)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "10")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.kbytes", "262144")
        .create_with_context(DeliveryTally::default())
        .context("creating the loadgen producer")?;
    let bar = if show_progress {
        indicatif::ProgressBar::new(count)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut rng = rand::rng();
    // Recent records as sent (when, id, value), for retries and reused ids to draw from.
    let mut recent: std::collections::VecDeque<(Instant, String, String)> =
        std::collections::VecDeque::new();
    let mut distinct = 0u64;
    let mut resent = 0u64;
    let mut reused = 0u64;
    let mut samples = Vec::new();
    let started = Instant::now();
    let filler: String = "x".repeat(value_bytes.saturating_sub(90));
    let (dup_ratio, reused_ratio) = (dup_ratio.clamp(0.0, 1.0), reused_ratio.clamp(0.0, 1.0));
    for i in 0..count {
        let draw: f64 = rng.random();
        let kind = match recent.is_empty() {
            true => Sent::New,
            false if draw < dup_ratio => Sent::Retry,
            false if draw < dup_ratio + reused_ratio => Sent::Reused,
            false => Sent::New,
        };
        let (id, value) = match kind {
            Sent::Retry => {
                resent += 1;
                // The oldest record at least dup_delay old, else a random recent one.
                let now = Instant::now();
                let due = recent
                    .iter()
                    .position(|(t, _, _)| now.duration_since(*t) >= dup_delay);
                let idx = due.unwrap_or_else(|| rng.random_range(0..recent.len()));
                (recent[idx].1.clone(), recent[idx].2.clone())
            }
            Sent::Reused => {
                reused += 1;
                let id = recent[rng.random_range(0..recent.len())].1.clone();
                let value =
                    format!(r#"{{"messageId":"{id}","seq":{i},"type":"track","pad":"{filler}"}}"#);
                (id, value)
            }
            Sent::New => {
                distinct += 1;
                let id = uuid::Uuid::new_v4().to_string();
                let value =
                    format!(r#"{{"messageId":"{id}","seq":{i},"type":"track","pad":"{filler}"}}"#);
                recent.push_back((Instant::now(), id.clone(), value.clone()));
                if recent.len() > 10_000 {
                    recent.pop_front();
                }
                (id, value)
            }
        };
        let resend = kind != Sent::New;
        let mut record = BaseRecord::to(topic).key(&id).payload(&value);
        let stamp = match (spread_from, spread_timestamps) {
            (Some(from), Some(span)) => {
                Some(from + (span.as_millis() as u64 * i / count.max(1)) as i64)
            }
            _ => None,
        };
        if let Some(ms) = stamp {
            record = record.timestamp(ms);
        }
        if !resend && sample_every > 0 && distinct.is_multiple_of(sample_every) {
            samples.push((id.clone(), stamp.unwrap_or_else(dedupe::clock::now_ms)));
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull,
                    ),
                    r,
                )) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(e).context("producing a loadgen record"),
            }
        }
        if i % 1024 == 0 {
            bar.set_position(i);
        }
        if let Some(rate) = rate_per_sec {
            // Pace the load: never run ahead of `rate` records per second.
            let due = started + Duration::from_secs_f64((i + 1) as f64 / rate);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
    }
    producer
        .flush(Duration::from_secs(360))
        .context("flushing loadgen records")?;
    bar.finish_and_clear();
    let tally = producer.context();
    let failed = tally.failed.load(std::sync::atomic::Ordering::Relaxed);
    if failed > 0 {
        let first = tally
            .first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default();
        anyhow::bail!("{failed} of {count} loadgen records were not delivered to {topic} (first error: {first})");
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(LoadgenSummary {
        records_sent: count,
        distinct_ids: distinct,
        resent,
        reused,
        seconds,
        records_per_sec: count as f64 / seconds,
        samples,
    })
}

/// What one loadgen record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    New,
    /// An earlier record sent again as it was.
    Retry,
    /// An earlier id with a new value.
    Reused,
}

//! `dedupe loadgen`: keyed UUIDv4 messages, a share of them re-sent as a retrying client does and
//! a share reusing an id for other content; the demo's and the benches' load, produced by the one
//! load generator (`dedupe::bench::load`). Built with the `tools` feature only: the image's
//! binary does not carry it.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::Context as _;
use dedupe::bench::load::{self, Deliveries, Pace, Shape, Until};
use dedupe::config::Config;
use rdkafka::producer::ThreadedProducer;
use serde::Serialize;

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
    dedupe::kafka::check_security(&config.kafka, Duration::from_secs(15))
        .with_context(|| format!("connecting to {}", config.kafka.brokers))?;
    // A broker that restarts or a leader that moves is ridden out by the producer's retries
    // (idempotent, so without duplicates) for up to `message.timeout.ms`; a record that is still
    // not delivered then makes the run fail, so a summary never counts ids the topic lacks.
    let producer: ThreadedProducer<Deliveries> = dedupe::kafka::client_config(&config.kafka)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "10")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.kbytes", "262144")
        .create_with_context(Deliveries::default())
        .context("creating the loadgen producer")?;
    let bar = if load.show_progress {
        indicatif::ProgressBar::new(load.count)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let shape = Shape {
        retry_share: load.dup_ratio,
        old_share: 1.0,
        old_after: load.dup_delay,
        reused_share: load.reused_ratio,
        value_bytes: load.value_bytes,
    };
    let pace = Pace {
        rate_per_sec: load.rate_per_sec,
        spread_timestamps: load.spread_timestamps,
        sample_every: load.sample_every,
    };
    let summary = load::produce(
        &producer,
        load.topic,
        shape,
        Until::Records(load.count),
        pace,
        &AtomicU64::new(0),
        &mut |sent| bar.set_position(sent),
    )?;
    bar.finish_and_clear();
    Ok(LoadgenSummary {
        records_sent: summary.sent,
        distinct_ids: summary.distinct,
        resent: summary.retries,
        reused: summary.reused,
        seconds: summary.seconds,
        records_per_sec: summary.sent as f64 / summary.seconds.max(1e-9),
        samples: summary.samples,
    })
}

//! `dedupe bench latency`: how long events take from the front door to a reader of the output
//! topic. It reads the output topic `read_committed`, from its end, as it is written, for a given
//! time; a record is readable there only once the worker's transaction that wrote it committed.
//! Each record's timestamp is the time the front door received its request (the worker keeps the
//! input record's), so the wait of each is the time it was read minus its timestamp: the front
//! door, Kafka's acknowledgement, the worker's batch and transaction, and the reader's fetch.

use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use dedupe::config::Config;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

/// What the reader saw.
#[derive(Debug, Serialize)]
pub struct LatencyBench {
    pub topic: String,
    pub seconds: f64,
    pub records: u64,
    pub records_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Reads `topic` from its end for `duration`; the records' waits, in milliseconds.
pub fn run(config: &Config, topic: &str, duration: Duration) -> anyhow::Result<LatencyBench> {
    let consumer: BaseConsumer = dedupe::kafka::client_config(&config.kafka)
        .set(
            "group.id",
            format!("dedupe-bench-latency-{}", uuid::Uuid::new_v4()),
        )
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        // Answer a fetch as soon as there is a record: the wait measured is the pipeline's.
        .set("fetch.wait.max.ms", "5")
        .set("fetch.min.bytes", "1")
        .create()
        .context("creating the reader")?;
    let partitions = dedupe::kafka::partition_count(&config.kafka, topic, Duration::from_secs(10))
        .context("reading the topic's metadata")?
        .with_context(|| format!("topic {topic} has no partitions (does it exist?)"))?;
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        assignment.add_partition_offset(topic, p, Offset::End)?;
    }
    consumer.assign(&assignment)?;
    let mut waits_ms: Vec<f64> = Vec::with_capacity(1 << 20);
    let started = Instant::now();
    while started.elapsed() < duration {
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message.context("reading the output topic")?;
        let now_ms = dedupe_tracking::unix_millis(SystemTime::now());
        if let Some(sent_ms) = message.timestamp().to_millis() {
            waits_ms.push((now_ms - sent_ms) as f64);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    waits_ms.sort_by(f64::total_cmp);
    let at = |q: f64| {
        waits_ms
            .get(((waits_ms.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    Ok(LatencyBench {
        topic: topic.to_string(),
        seconds,
        records: waits_ms.len() as u64,
        records_per_sec: waits_ms.len() as f64 / seconds,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: waits_ms.last().copied().unwrap_or(f64::NAN),
    })
}

//! The records the bench sends and reads beside its workers (`super`): copies of old ids and a
//! trickle of new ones while the partition moves, and the reads of the output and the changelog.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use dedupe::config::Config;

/// Reads every record of `topic` (`read_committed`) with a plain consumer: its bytes (keys and
/// values) and the seconds it took.
pub fn read_whole(config: &Config, topic: &str) -> anyhow::Result<(u64, f64)> {
    let mut bytes = 0u64;
    let started = Instant::now();
    dedupe::kafka::read_to_end(
        &config.kafka,
        topic,
        true,
        Duration::from_secs(600),
        &mut |m| {
            bytes += (m.key_len() + m.payload_len()) as u64;
        },
    )
    .with_context(|| format!("reading {topic}"))?;
    Ok((bytes, started.elapsed().as_secs_f64()))
}

/// The end (high watermark) of the output's only partition.
pub fn output_end(config: &Config, output: &str) -> anyhow::Result<i64> {
    let reader: dedupe::kafka::Reader = dedupe::kafka::client_config(&config.kafka)
        .set(
            "group.id",
            format!("dedupe-reader-{}", uuid::Uuid::new_v4().simple()),
        )
        .create_with_context(dedupe::kafka::ReaderContext)?;
    let (_, high) =
        rdkafka::consumer::Consumer::fetch_watermarks(&reader, output, 0, Duration::from_secs(30))?;
    Ok(high)
}

/// Sends each of `ids` again, 200 a second, on a thread; returns how many were sent.
pub fn send_again(
    config: &Config,
    input: &str,
    ids: Vec<String>,
) -> std::thread::JoinHandle<anyhow::Result<u64>> {
    let (config, input) = (config.clone(), input.to_string());
    std::thread::spawn(move || {
        let started = Instant::now();
        let producer = bench_producer(&config)?;
        for (i, id) in ids.iter().enumerate() {
            produce_one(&producer, &input, id)?;
            let due = started + Duration::from_millis(5 * (i as u64 + 1));
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        rdkafka::producer::Producer::flush(&producer, Duration::from_secs(60))?;
        Ok(ids.len() as u64)
    })
}

fn bench_producer(config: &Config) -> anyhow::Result<rdkafka::producer::BaseProducer> {
    Ok(dedupe::kafka::client_config(&config.kafka)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()?)
}

fn produce_one(
    producer: &rdkafka::producer::BaseProducer,
    topic: &str,
    id: &str,
) -> anyhow::Result<()> {
    let value = format!(r#"{{"messageId":"{id}","type":"track"}}"#);
    producer
        .send(
            rdkafka::producer::BaseRecord::to(topic)
                .key(id)
                .payload(&value),
        )
        .map_err(|(e, _)| e)?;
    producer.poll(Duration::ZERO);
    Ok(())
}

/// How many records B wrote (the output from `from` on) carry one of the `old` ids, once B has
/// processed the whole input: a last new id is sent, and B's output is read until it holds it.
pub fn published_again(
    config: &Config,
    input: &str,
    output: &str,
    from: i64,
    old: &HashSet<String>,
) -> anyhow::Result<u64> {
    let last = uuid::Uuid::new_v4().to_string();
    let producer = bench_producer(config)?;
    produce_one(&producer, input, &last)?;
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(60))?;
    let started = Instant::now();
    loop {
        let (mut found, mut again) = (false, 0u64);
        let start = std::collections::HashMap::from([(0, from)]);
        dedupe::kafka::read_from(
            &config.kafka,
            output,
            true,
            &start,
            Duration::from_secs(120),
            &mut |m| {
                let key = rdkafka::Message::key(m)
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default();
                found |= key == last;
                again += u64::from(old.contains(key.as_ref()));
            },
        )?;
        if found {
            return Ok(again);
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("worker B did not publish the bench's last id within 300 s");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A trickle of new ids during the take-over, 200 a second, so B has something to publish.
pub fn trickle(config: &Config, input: &str) -> std::thread::JoinHandle<anyhow::Result<u64>> {
    let config = config.clone();
    let input = input.to_string();
    std::thread::spawn(move || {
        let load = crate::loadgen::Load {
            topic: &input,
            count: 6000,
            dup_ratio: 0.0,
            reused_ratio: 0.0,
            dup_delay: Duration::ZERO,
            value_bytes: 64,
            rate_per_sec: Some(200.0),
            show_progress: false,
            spread_timestamps: None,
            sample_every: 0,
        };
        crate::loadgen::loadgen(&config, load).map(|s| s.distinct_ids)
    })
}

//! Whether the tracking API can take requests: the brokers answered a metadata request for the
//! input topic and the dead-letter topic recently, and both exist. The dead-letter topic is
//! created (with the input topic's partition count) when it does not exist; the input topic
//! never is (the worker's deployment owns it).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate as tracking;
use dedupe::config::KafkaConfig;
use rdkafka::producer::Producer;
use tracing::info;

use super::events::{ReadinessChanged, ReadinessFound, ReadinessProbeNotStarted};
use super::producer::IngestProducer;

/// How often the readiness probe asks the broker for the topics' metadata.
const READINESS_INTERVAL: Duration = Duration::from_secs(2);
/// How long a metadata answer keeps the server ready: a few missed probes, not one.
pub const READINESS_FRESH: Duration = Duration::from_secs(10);

/// What one readiness probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Probed {
    Ready,
    /// The input topic does not exist.
    NoTopic,
    /// The dead-letter topic does not exist, and creating it failed with this.
    NoDeadLetterTopic(String),
    NoAnswer(String),
}

/// Whether the producer can reach the topics: a metadata request for them succeeded recently.
pub struct Readiness {
    pub last_ok_ms: AtomicI64,
    pub stop: AtomicBool,
}

impl Readiness {
    /// Probes in a thread of its own: metadata requests block.
    pub fn start(
        producer: IngestProducer,
        kafka: KafkaConfig,
        topic: String,
        dead_letter_topic: String,
    ) -> Arc<Self> {
        let readiness = Arc::new(Self {
            last_ok_ms: AtomicI64::new(0),
            stop: AtomicBool::new(false),
        });
        let probe = Arc::clone(&readiness);
        let spawned = std::thread::Builder::new()
            .name("ingest-readiness".into())
            .spawn(move || {
                // What the previous probe found: a change is logged, a repeat is not.
                let mut last: Option<Probed> = None;
                while !probe.stop.load(Ordering::Relaxed) {
                    let now = probe_once(&producer, &kafka, &topic, &dead_letter_topic);
                    if now == Probed::Ready {
                        probe
                            .last_ok_ms
                            .store(tracking::unix_millis(SystemTime::now()), Ordering::Relaxed);
                    }
                    if last.as_ref() != Some(&now) {
                        let found = match &now {
                            Probed::Ready => ReadinessFound::Ready,
                            Probed::NoTopic => ReadinessFound::NoTopic,
                            Probed::NoDeadLetterTopic(error) => {
                                ReadinessFound::NoDeadLetterTopic(error)
                            }
                            Probed::NoAnswer(error) => ReadinessFound::NoAnswer(error),
                        };
                        ReadinessChanged {
                            topic: &topic,
                            dead_letter_topic: &dead_letter_topic,
                            found,
                        }
                        .emit();
                        last = Some(now);
                    }
                    std::thread::sleep(READINESS_INTERVAL);
                }
            });
        if let Err(e) = spawned {
            ReadinessProbeNotStarted { error: &e }.emit();
        }
        readiness
    }

    pub fn check(&self) -> Result<(), &'static str> {
        let age_ms =
            tracking::unix_millis(SystemTime::now()) - self.last_ok_ms.load(Ordering::Relaxed);
        if age_ms <= READINESS_FRESH.as_millis() as i64 {
            Ok(())
        } else {
            Err("no recent metadata for the input and dead-letter topics from Kafka")
        }
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The number of partitions of `topic` in the producer's metadata, or `None` if it does not
/// exist.
fn partitions(producer: &IngestProducer, topic: &str) -> Result<Option<usize>, String> {
    let md = producer
        .client()
        .fetch_metadata(Some(topic), READINESS_INTERVAL)
        .map_err(|e| e.to_string())?;
    Ok(md
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map(|t| t.partitions().len())
        .filter(|&n| n > 0))
}

fn probe_once(
    producer: &IngestProducer,
    kafka: &KafkaConfig,
    topic: &str,
    dead_letter_topic: &str,
) -> Probed {
    let input = match partitions(producer, topic) {
        Ok(Some(n)) => n,
        Ok(None) => return Probed::NoTopic,
        Err(e) => return Probed::NoAnswer(e),
    };
    match partitions(producer, dead_letter_topic) {
        Ok(Some(_)) => Probed::Ready,
        Err(e) => Probed::NoAnswer(e),
        Ok(None) => {
            // -1: the brokers' default.replication.factor.
            let created = futures::executor::block_on(dedupe::kafka::create_topic(
                kafka,
                dead_letter_topic,
                input as i32,
                -1,
                &[],
            ));
            match created {
                Ok(()) => {
                    info!(dead_letter_topic = %dead_letter_topic, partitions = input, "Created the dead-letter topic.");
                    Probed::Ready
                }
                Err(e) => Probed::NoDeadLetterTopic(e.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_a_recent_metadata_answer() {
        // Never answered: not ready. Answered just now: ready. Answered long ago: not ready.
        let r = Readiness {
            last_ok_ms: AtomicI64::new(0),
            stop: AtomicBool::new(false),
        };
        assert!(r.check().is_err());
        let now = tracking::unix_millis(SystemTime::now());
        r.last_ok_ms.store(now, Ordering::Relaxed);
        assert!(r.check().is_ok());
        r.last_ok_ms.store(
            now - 2 * READINESS_FRESH.as_millis() as i64,
            Ordering::Relaxed,
        );
        assert!(r.check().is_err());
    }
}

//! The input and dead-letter topics' producer: idempotent, `acks=all`, the Java client's
//! partitioner, its defaults (linger, compression), and the acknowledgements it counts per request
//! ([`Acks`]), handed to it with each record (`topic::Topic::send`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dedupe::config::Config;
use futures::channel::oneshot;
use rdkafka::client::ClientContext;
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryResult, ProducerContext, ThreadedProducer};

/// librdkafka's partitioner that matches the Java client's for keyed records.
pub const PARTITIONER: &str = "murmur2_random";
/// The ingest producer's `linger.ms`, unless `kafka.properties` sets it.
///
/// A 1 ms linger: the records of the requests that arrive within a millisecond go out in one
/// produce request per partition, not one per request. librdkafka sends each partition's batch
/// as a request of its own, and the broker's cost is mostly per request: in four paired runs of
/// 32 connections, 20-event requests, it took the broker 23-34% less CPU per event than no
/// linger and gave 1-15% more events/s. A longer linger adds to every request's wait, and with
/// a bounded number of clients each waiting on its answer the wait bounds the throughput: 2 ms
/// lost 25-28% of the events/s at 32 connections (gaining 2-14% at 128). `kafka.properties`
/// may set another.
pub const LINGER_MS: &str = "1";
/// The ingest producer's `compression.type`, unless `kafka.properties` sets it.
///
/// lz4 batches: the broker appends a compressed batch as it came (the topic's default
/// `compression.type=producer`), skipping each record's key, value and headers when it checks
/// them, and it writes and keeps a fraction of the bytes. Events that lz4 makes 4.4 times
/// smaller (each with 64 random characters; real events repeat their field names and context
/// the same way) took the broker 14-24% less CPU per event in three paired runs of 128
/// connections, and librdkafka's broker thread, which compresses, about 0.3 µs more: with
/// both on one 2-core machine the events/s were -6%, -6% and +6%. Events that differed only in
/// their ids, 13 times smaller: the broker's CPU per event 18-35% lower, events/s -2% to +17%.
/// The input topic's disk and network shrink by the same factor; the worker's consumer
/// decompresses transparently. `kafka.properties` may set another codec, or none.
pub const COMPRESSION: &str = "lz4";
/// What [`producer`] sets when `kafka.properties` does not.
const PRODUCER_DEFAULTS: [(&str, &str); 2] =
    [("linger.ms", LINGER_MS), ("compression.type", COMPRESSION)];

/// The acknowledgements one request waits for. Kafka's answer for each of its messages is counted
/// here, on the producer's polling thread, and the last one wakes the request: one wake-up and one
/// allocation per request, not per message.
pub struct Acks {
    remaining: AtomicUsize,
    first_error: std::sync::Mutex<Option<KafkaError>>,
    done: std::sync::Mutex<Option<oneshot::Sender<Option<KafkaError>>>>,
}

impl Acks {
    pub(super) fn new(messages: usize) -> (Arc<Self>, oneshot::Receiver<Option<KafkaError>>) {
        let (tx, rx) = oneshot::channel();
        let acks = Self {
            remaining: AtomicUsize::new(messages),
            first_error: std::sync::Mutex::new(None),
            done: std::sync::Mutex::new(Some(tx)),
        };
        (Arc::new(acks), rx)
    }

    /// Counts one message's answer; the last sends the first error, if any.
    fn record(&self, error: Option<&KafkaError>) {
        // A poisoned lock only means a panic elsewhere; the value is still an Option.
        if let Some(e) = error {
            self.first_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| e.clone());
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let first_error = self
                .first_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(done) = self.done.lock().unwrap_or_else(|p| p.into_inner()).take() {
                // The request may have given up (timeout) and dropped its receiver.
                let _ = done.send(first_error);
            }
        }
    }
}

/// The producer's context: hands each delivery report to its request's [`Acks`].
pub struct RequestAcks;

impl ClientContext for RequestAcks {}

impl ProducerContext for RequestAcks {
    type DeliveryOpaque = Arc<Acks>;

    fn delivery(&self, result: &DeliveryResult<'_>, acks: Arc<Acks>) {
        acks.record(result.as_ref().err().map(|(e, _)| e));
    }
}

/// The input and dead-letter topics' producer, polled on a thread of its own.
pub type IngestProducer = Arc<ThreadedProducer<RequestAcks>>;

/// The input and dead-letter topics' producer: idempotent, `acks=all`, Java-compatible partitioning, and giving
/// up on a message no earlier than the request does.
pub fn producer(config: &Config) -> Result<IngestProducer, KafkaError> {
    ThreadedProducer::from_config_and_context(&producer_config(config), RequestAcks).map(Arc::new)
}

/// The settings of [`producer`].
fn producer_config(config: &Config) -> rdkafka::ClientConfig {
    let mut client_config = dedupe::kafka::client_config(&config.kafka);
    client_config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", PARTITIONER)
        .set(
            "message.timeout.ms",
            config.ingest.ack_timeout_ms.to_string(),
        );
    // Defaults, not requirements: where `kafka.properties` sets one, it wins.
    for (name, value) in PRODUCER_DEFAULTS {
        if !config.kafka.properties.contains_key(name) {
            client_config.set(name, value);
        }
    }
    client_config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_producer_lingers_and_compresses_unless_kafka_properties_say_otherwise() {
        let mut config = Config::default();
        let defaults = producer_config(&config);
        assert_eq!(defaults.get("linger.ms"), Some(LINGER_MS));
        assert_eq!(defaults.get("compression.type"), Some(COMPRESSION));
        assert_eq!(defaults.get("enable.idempotence"), Some("true"));
        assert_eq!(defaults.get("acks"), Some("all"));

        config
            .kafka
            .properties
            .insert("linger.ms".into(), "5".into());
        config
            .kafka
            .properties
            .insert("compression.type".into(), "none".into());
        let overridden = producer_config(&config);
        assert_eq!(overridden.get("linger.ms"), Some("5"));
        assert_eq!(overridden.get("compression.type"), Some("none"));
    }
}

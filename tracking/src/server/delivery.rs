//! A request's records, produced to the input and dead-letter topics with the wire contract's
//! key and headers (`dedupe::wire`), and the wait until Kafka acknowledged every one, so a request
//! is answered 200 only once Kafka holds every record it made.

use std::sync::Arc;
use std::time::Duration;

use crate as tracking;
use crate::{Endpoint, Events, IdOrigin};
use dedupe::wire::{
    content_digest_header, push_scoped_id, scoped_id, HEADER_CONTENT_DIGEST, HEADER_ENDPOINT,
    HEADER_ERROR, HEADER_INDEX, HEADER_MESSAGE_ID, HEADER_REASON, HEADER_RECEIVED_AT,
    HEADER_SOURCE,
};
use futures::channel::oneshot;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;

use super::producer::{Acks, IngestProducer};
use super::topic::Topic;

/// Why a request's messages are not all in Kafka. Every variant is answered 503: each is worth
/// retrying, and a retry can only make duplicates, which the worker removes.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("the producer refused a message: {0}")]
    Enqueue(KafkaError),
    #[error("Kafka did not take a message: {0}")]
    Delivery(KafkaError),
    #[error("the producer dropped a message before it was acknowledged")]
    Dropped,
    #[error("Kafka did not acknowledge within {0:?}")]
    Timeout(Duration),
}

impl DeliveryError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Enqueue(_) => "kafka_enqueue",
            Self::Delivery(_) => "kafka_delivery",
            Self::Dropped => "kafka_dropped",
            Self::Timeout(_) => "kafka_timeout",
        }
    }
}

/// Where a request's records go, and how long it waits for Kafka.
pub struct Delivery {
    input: Topic,
    dead_letter: Topic,
    ack_timeout: Duration,
}

impl Delivery {
    pub fn new(
        producer: &IngestProducer,
        topic: &str,
        dead_letter_topic: &str,
        ack_timeout: Duration,
    ) -> Result<Self, KafkaError> {
        Ok(Self {
            input: Topic::new(producer, topic)?,
            dead_letter: Topic::new(producer, dead_letter_topic)?,
            ack_timeout,
        })
    }

    /// Produces every valid event to the input topic and every refused one to the dead-letter
    /// topic, then waits until Kafka acknowledged all of them, or gives up.
    pub async fn deliver(
        &self,
        source: &str,
        endpoint: Endpoint,
        events: &Events,
        received_at_ms: i64,
    ) -> Result<(), DeliveryError> {
        if let Some((code, _)) = self.input.producer().client().fatal_error() {
            return Err(DeliveryError::Enqueue(KafkaError::MessageProduction(code)));
        }
        if events.is_empty() {
            return Ok(());
        }
        let (acks, answered) = Acks::new(events.len());
        // Records already handed over may still land; the client's retry makes duplicates of
        // them, which the worker removes (and the dead-letter topic keeps, keyed alike).
        self.send_valid(source, events, received_at_ms, &acks)?;
        self.send_refused(source, endpoint, events, received_at_ms, &acks)?;
        let answer = tokio::time::timeout(self.ack_timeout, answered)
            .await
            .map_err(|_| DeliveryError::Timeout(self.ack_timeout))?;
        match answer {
            Ok(None) => Ok(()),
            Ok(Some(e)) => Err(DeliveryError::Delivery(e)),
            Err(oneshot::Canceled) => Err(DeliveryError::Dropped),
        }
    }

    /// Hands every valid event to the input topic, keyed by its scoped id.
    fn send_valid(
        &self,
        source: &str,
        events: &Events,
        received_at_ms: i64,
        acks: &Arc<Acks>,
    ) -> Result<(), DeliveryError> {
        // One key buffer for the request: librdkafka copies the key, so it is reused.
        let mut key = String::with_capacity(source.len() + 1 + 64);
        for m in &events.messages {
            key.clear();
            push_scoped_id(&mut key, source, &m.message_id);
            let digest = content_digest_header(m.content_hash);
            let source_header = (HEADER_SOURCE, source.as_bytes());
            let digest_header = (HEADER_CONTENT_DIGEST, &digest[..]);
            let derived;
            let headers: &[(&str, &[u8])] = if m.id_origin == IdOrigin::Client {
                &[source_header, digest_header]
            } else {
                derived = [
                    source_header,
                    digest_header,
                    (HEADER_MESSAGE_ID, m.id_origin.as_str().as_bytes()),
                ];
                &derived
            };
            self.input
                .send(
                    Some(key.as_bytes()),
                    &m.value,
                    headers,
                    received_at_ms,
                    acks,
                )
                .map_err(DeliveryError::Enqueue)?;
        }
        Ok(())
    }

    /// Hands every refused event to the dead-letter topic, keyed alike when it has a usable id,
    /// with headers naming the reason.
    fn send_refused(
        &self,
        source: &str,
        endpoint: Endpoint,
        events: &Events,
        received_at_ms: i64,
        acks: &Arc<Acks>,
    ) -> Result<(), DeliveryError> {
        if events.refused.is_empty() {
            return Ok(());
        }
        let received_at = tracking::rfc3339_millis(
            std::time::UNIX_EPOCH + Duration::from_millis(received_at_ms.max(0) as u64),
        );
        for r in &events.refused {
            let key = r.message_id.as_deref().map(|id| scoped_id(source, id));
            let error = r.sentence();
            let index = r.at.0.map(|i| i.to_string());
            let mut headers: Vec<(&str, &[u8])> = vec![
                (HEADER_SOURCE, source.as_bytes()),
                (HEADER_REASON, r.problem.reason().as_bytes()),
                (HEADER_ERROR, error.as_bytes()),
                (HEADER_RECEIVED_AT, received_at.as_bytes()),
                (HEADER_ENDPOINT, endpoint.as_str().as_bytes()),
            ];
            if let Some(index) = &index {
                headers.push((HEADER_INDEX, index.as_bytes()));
            }
            self.dead_letter
                .send(
                    key.as_deref().map(str::as_bytes),
                    &r.value,
                    &headers,
                    received_at_ms,
                    acks,
                )
                .map_err(DeliveryError::Enqueue)?;
        }
        Ok(())
    }
}

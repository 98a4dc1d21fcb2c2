//! The rekey stage's two clients (`super`): the source consumer, whose context notes every
//! rebalance, and the input topic's transactional producer, whose context notes the records the
//! brokers refused for their size.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

/// The consumer's context: notes every rebalance, which the loop answers by dropping the batch it
/// is gathering.
pub struct RebalanceFlag(pub Arc<AtomicBool>);

impl ClientContext for RebalanceFlag {}

impl ConsumerContext for RebalanceFlag {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, _: &Rebalance<'_>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

pub type SourceConsumer = BaseConsumer<RebalanceFlag>;

/// The producer's context: notes which records of the open transaction the brokers refused for
/// their size, by their index in the batch (a limit the client's own check did not see).
#[derive(Default)]
pub struct Deliveries {
    too_large: Mutex<BTreeSet<usize>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
        if let Err((e, _)) = result {
            if is_too_large(e) {
                if let Ok(mut refused) = self.too_large.lock() {
                    refused.insert(index);
                }
            }
        }
    }
}

impl Deliveries {
    pub fn take(&self) -> BTreeSet<usize> {
        self.too_large
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default()
    }
}

pub type InputProducer = ThreadedProducer<Deliveries>;

/// Whether a Kafka error says a record is larger than the input topic accepts.
pub fn is_too_large(e: &KafkaError) -> bool {
    e.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageSizeTooLarge)
}

//! Starting a transactional producer: `init_transactions`, asked again while the coordinator's
//! refusal is a passing one.

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer};

use super::delivery::DeliveryTracker;
use super::error::{classify, timed_out};
use super::PublishError;

/// How long `init_transactions` is asked again while its refusal is a passing one: the
/// coordinator still completing the previous producer's transaction (it writes that
/// transaction's markers, which waits for the leaders of its partitions when a node just died),
/// loading, or moving.
const INIT_PATIENCE: Duration = Duration::from_secs(45);

/// Calls `init_transactions` until it succeeds, fails for good, or [`INIT_PATIENCE`] runs out.
/// librdkafka documents a timed-out or retriable `init_transactions` as resumable by calling it
/// again on the same producer; asking again at once saves a new producer, a new coordinator
/// lookup and the take-over's backoff.
pub(super) fn init_transactions(
    producer: &BaseProducer<DeliveryTracker>,
    transactional_id: &str,
    timeout: Duration,
) -> Result<(), PublishError> {
    let deadline = std::time::Instant::now() + INIT_PATIENCE;
    loop {
        let watched = crate::watchdog::arm("init_transactions", transactional_id, timeout);
        let result = producer.init_transactions(timeout);
        drop(watched);
        let e = match result {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let passing = match &e {
            KafkaError::Transaction(t) => {
                !t.is_fatal()
                    && (t.is_retriable()
                        || matches!(
                            t.code(),
                            RDKafkaErrorCode::ConcurrentTransactions
                                | RDKafkaErrorCode::CoordinatorLoadInProgress
                                | RDKafkaErrorCode::CoordinatorNotAvailable
                                | RDKafkaErrorCode::NotCoordinator
                                | RDKafkaErrorCode::OperationTimedOut
                                | RDKafkaErrorCode::RequestTimedOut
                        ))
            }
            other => timed_out(other),
        };
        if !passing || std::time::Instant::now() >= deadline {
            return Err(classify(e, transactional_id));
        }
        tracing::info!(transactional_id, error = %e, "The transaction coordinator refused the producer id for now; asking again.");
        std::thread::sleep(Duration::from_millis(100));
    }
}

//! Why a transaction did not commit, sorted from librdkafka's errors in one place: what the
//! caller must do (stop, retry the batch, or make a new producer).

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Why a transaction did not commit, and what the caller must do.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The producer was fenced: another worker took over the partition, or the broker aborted a
    /// transaction that outlived `transaction.timeout.ms` and bumped the epoch. Stop; never retry.
    #[error("the producer with transactional.id {transactional_id} is fenced (another worker took over, or the broker aborted a transaction that outlived transaction.timeout.ms): {source}")]
    Fenced {
        transactional_id: String,
        source: KafkaError,
    },
    /// The transaction was aborted; nothing of it is visible. Retrying the same batch is safe.
    #[error("the transaction was aborted and can be retried: {source}")]
    Aborted { source: KafkaError },
    /// The producer is unusable. Make a new one (which aborts whatever was open) and recover.
    #[error("the output producer failed fatally: {source}")]
    Fatal { source: KafkaError },
    /// The transaction was aborted because the broker or the producer refused records of it for
    /// good (see [`is_refusal`]): sent again as they are, they are refused again. Nothing of the
    /// transaction is visible. A refused record may have shared a request with records that are
    /// fine (the broker refuses a whole request batch for one record over its limit), so the
    /// records named are suspects: only a record refused when sent alone is the cause.
    #[error("the transaction was aborted: the broker or the producer refused {} of its records for good: {source}", .refused.len())]
    Refused {
        refused: Vec<RefusedRecord>,
        source: KafkaError,
    },
}

/// Which list of a batch a refused record was in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RefusedIn {
    /// [`super::Batch::records`], for the output topic.
    Output,
    /// [`super::Batch::dead_letters`], for the dead-letter topic.
    DeadLetter,
}

impl RefusedIn {
    pub fn name(self) -> &'static str {
        match self {
            Self::Output => "output topic",
            Self::DeadLetter => "dead-letter topic",
        }
    }
}

/// A record of a batch the broker or the producer refused, by its place in the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusedRecord {
    pub topic: RefusedIn,
    /// Its index in the batch's list ([`RefusedIn`]).
    pub index: usize,
    pub code: RDKafkaErrorCode,
}

impl PublishError {
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Fenced { .. })
    }
}

/// Whether a call gave up waiting for an answer (librdkafka's local timeout).
pub(super) fn timed_out(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::OperationTimedOut
                | RDKafkaErrorCode::MessageTimedOut
                | RDKafkaErrorCode::RequestTimedOut
        )
    )
}

/// Sorts a transactional error into fenced / abortable / fatal.
pub(super) fn classify(e: KafkaError, transactional_id: &str) -> PublishError {
    if let KafkaError::Transaction(ref t) = e {
        let code = t.code();
        if matches!(
            code,
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
        ) {
            return PublishError::Fenced {
                transactional_id: transactional_id.to_string(),
                source: e,
            };
        }
        if t.txn_requires_abort() {
            return PublishError::Aborted { source: e };
        }
        if t.is_fatal() {
            return PublishError::Fatal { source: e };
        }
        // Retriable errors that ran out of retries: abort and try the batch again.
        return PublishError::Aborted { source: e };
    }
    if matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::Fenced | RDKafkaErrorCode::ProducerFenced)
    ) {
        return PublishError::Fenced {
            transactional_id: transactional_id.to_string(),
            source: e,
        };
    }
    PublishError::Aborted { source: e }
}

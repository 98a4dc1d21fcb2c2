//! The rekey stage's events (`super`).

use dedupe::metrics as m;
use rdkafka::error::KafkaError;

/// A transaction committed: its records copied into the input topic (keyed by id, or with their
/// own key when they have no usable id) and their source offsets with them.
pub struct RekeyBatch {
    /// Records copied keyed by their id.
    pub rekeyed: u64,
    /// Records without a usable id (missing, empty, over 1 KiB, unreadable): copied with their
    /// own key.
    pub unkeyed: u64,
}

impl RekeyBatch {
    pub fn emit(&self) {
        metrics::counter!(m::REKEY_RECORDS, m::LABEL_OUTCOME => m::OUTCOME_REKEYED)
            .increment(self.rekeyed);
        if self.unkeyed > 0 {
            metrics::counter!(m::REKEY_RECORDS, m::LABEL_OUTCOME => m::OUTCOME_UNKEYED)
                .increment(self.unkeyed);
            tracing::warn!(
                event = "RekeyBatch",
                records = self.unkeyed,
                "Records without a usable id were copied with their own key (they reach the worker unkeyed)."
            );
        }
        metrics::counter!(m::REKEY_TRANSACTIONS, m::LABEL_OUTCOME => m::OUTCOME_COMMITTED)
            .increment(1);
    }
}

/// Where a source record is, and how large it is (its key, value and headers).
pub struct SourceRecord<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub bytes: usize,
}

/// A source record larger than the input topic accepts was written to the dead-letter topic (its
/// key, headers, position and size; not its value), in a committed transaction.
pub struct RekeyDeadLettered<'a> {
    pub record: SourceRecord<'a>,
    pub limit_bytes: usize,
    pub dead_letter_topic: &'a str,
}

impl RekeyDeadLettered<'_> {
    pub fn emit(&self) {
        let r = &self.record;
        metrics::counter!(m::REKEY_RECORDS, m::LABEL_OUTCOME => m::OUTCOME_DEAD_LETTERED)
            .increment(1);
        tracing::warn!(
            event = "RekeyDeadLettered",
            topic = r.topic,
            partition = r.partition,
            offset = r.offset,
            bytes = r.bytes,
            limit_bytes = self.limit_bytes,
            dead_letter_topic = self.dead_letter_topic,
            "The source record {}/{} at offset {} is {} bytes, more than the input topic accepts ({} bytes a record): its position and size went to the dead-letter topic {}, its value stays in the source.",
            r.topic, r.partition, r.offset, r.bytes, self.limit_bytes, self.dead_letter_topic
        );
    }
}

/// A source record larger than the input topic accepts, and no dead-letter topic: the stage
/// stops at it (the records before it are committed) and exits.
pub struct RekeyRecordTooLarge<'a> {
    pub record: SourceRecord<'a>,
    pub input_topic: &'a str,
    pub limit_bytes: usize,
}

impl RekeyRecordTooLarge<'_> {
    pub fn emit(&self) {
        let r = &self.record;
        metrics::counter!(m::REKEY_RECORDS, m::LABEL_OUTCOME => m::OUTCOME_TOO_LARGE).increment(1);
        tracing::error!(
            event = "RekeyRecordTooLarge",
            topic = r.topic,
            partition = r.partition,
            offset = r.offset,
            bytes = r.bytes,
            limit_bytes = self.limit_bytes,
            "The source record {}/{} at offset {} is {} bytes, more than the input topic {} accepts ({} bytes a record), and no dead-letter topic is set (worker.dead_letter_topic): stopping at it, with every record before it committed. Raise the input topic's max.message.bytes (and kafka.properties' message.max.bytes) or set worker.dead_letter_topic, then start again.",
            r.topic, r.partition, r.offset, r.bytes, self.input_topic, self.limit_bytes
        );
    }
}

/// A rekey transaction failed and was aborted; its records are read again.
pub struct RekeyAborted<'a> {
    pub error: &'a KafkaError,
}

impl RekeyAborted<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::REKEY_TRANSACTIONS, m::LABEL_OUTCOME => m::OUTCOME_ABORTED)
            .increment(1);
        tracing::warn!(event = "RekeyAborted", error = %self.error, "A rekey transaction failed; aborting it and reading its records again from the first one not committed.");
    }
}

/// The producer was fenced: another instance with the same transactional id took over. Nothing
/// more is committed; the stage exits.
pub struct RekeyFenced<'a> {
    pub error: &'a KafkaError,
}

impl RekeyFenced<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::REKEY_TRANSACTIONS, m::LABEL_OUTCOME => m::OUTCOME_FENCED)
            .increment(1);
        tracing::error!(event = "RekeyFenced", error = %self.error, "The rekey producer was fenced: another instance took its place; exiting without committing anything more.");
    }
}

/// The source partitions that held uncommitted records were sought back to the first of them
/// (after a rebalance or an aborted transaction).
pub struct RekeyRewound {
    pub partitions: usize,
}

impl RekeyRewound {
    pub fn emit(&self) {
        metrics::counter!(m::REKEY_REWINDS).increment(1);
        tracing::info!(
            event = "RekeyRewound",
            partitions = self.partitions,
            "Rewound the rekey consumer to the first source record not committed."
        );
    }
}

/// Reading the source failed; the consumer retries by itself.
pub struct RekeyReadFailed<'a> {
    pub error: &'a KafkaError,
}

impl RekeyReadFailed<'_> {
    pub fn emit(&self) {
        tracing::warn!(event = "RekeyReadFailed", error = %self.error, "Reading the source topic failed; retrying.");
    }
}

/// The stage stopped on a signal.
pub struct RekeyStopped {
    /// Whether every record it read was committed (else its last batch was aborted, and the next
    /// run copies it from the committed offsets).
    pub all_committed: bool,
}

impl RekeyStopped {
    pub fn emit(&self) {
        if self.all_committed {
            tracing::info!(
                event = "RekeyStopped",
                "Received a stop signal; every record read is committed. Exiting."
            );
        } else {
            tracing::warn!(event = "RekeyStopped", "Received a stop signal; the last batch was aborted, not committed: the next run copies it again from the committed offsets. Exiting.");
        }
    }
}

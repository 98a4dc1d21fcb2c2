//! The rekey stage's events (`crate::rekey`).

use dedupe::metrics as m;
use rdkafka::error::KafkaError;

/// A batch copied into the input topic, keyed by id, and its source offsets committed with it.
pub struct RekeyBatch {
    pub records: u64,
    /// Records without a usable id: copied with their own key.
    pub unkeyed: u64,
}

impl RekeyBatch {
    pub fn emit(&self) {
        metrics::counter!(m::REKEY_RECORDS, m::LABEL_OUTCOME => m::OUTCOME_REKEYED)
            .increment(self.records - self.unkeyed);
        if self.unkeyed > 0 {
            metrics::counter!(m::REKEY_RECORDS, m::LABEL_OUTCOME => m::OUTCOME_UNKEYED)
                .increment(self.unkeyed);
            tracing::warn!(
                records = self.unkeyed,
                "Records without a usable id were copied with their own key (they reach the worker unkeyed)."
            );
        }
        metrics::counter!(m::REKEY_TRANSACTIONS, m::LABEL_OUTCOME => m::OUTCOME_COMMITTED)
            .increment(1);
    }
}

/// A rekey transaction failed and was aborted; its batch is read again.
pub struct RekeyAborted<'a> {
    pub error: &'a KafkaError,
}

impl RekeyAborted<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::REKEY_TRANSACTIONS, m::LABEL_OUTCOME => m::OUTCOME_ABORTED)
            .increment(1);
        tracing::warn!(error = %self.error, "A rekey transaction failed; aborting it and reading its batch again from the committed offsets.");
    }
}

/// The source partitions were sought back to their committed offsets (after a rebalance or an
/// aborted transaction).
pub struct RekeyRewound {
    pub partitions: usize,
}

impl RekeyRewound {
    pub fn emit(&self) {
        metrics::counter!(m::REKEY_REWINDS).increment(1);
        tracing::info!(
            partitions = self.partitions,
            "Rewound the rekey consumer to the committed source offsets."
        );
    }
}

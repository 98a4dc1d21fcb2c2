//! The duplicate audit: how dropped copies are audited (`worker.audit_topic`), and the audit
//! record of one (see `dedupe::audit`, which encodes it). Which drops are audited the sampler
//! decides, in the batch's decision (`protocol.rs`).

use dedupe::audit::{self, DroppedCopy};
use dedupe::batch::Seen;
use dedupe::identity::LedgerKey;
use dedupe::output::OutRecord;

use super::seams::{SinkAccess, StoreAccess};
use super::{InRecord, Pipeline};

/// How dropped duplicates are audited (see `dedupe::audit`).
#[derive(Debug, Clone)]
pub struct AuditSettings {
    pub payloads: bool,
    pub sample: f64,
    pub max_per_sec: u32,
}

impl<S: StoreAccess, K: SinkAccess> Pipeline<S, K> {
    /// The audit record of a dropped copy from `source`.
    pub(super) fn audit_record(
        &self,
        r: &InRecord,
        key: LedgerKey,
        source: Option<&str>,
        seen: Seen,
    ) -> OutRecord {
        let drop = DroppedCopy {
            key,
            record: &r.out,
            source,
            input_topic: &self.settings.input_topic,
            input_partition: self.partition,
            input_offset: r.offset,
            first_seen_ms: seen.first_seen_ms,
            age_ms: seen.age_ms,
            in_batch: seen.in_batch,
            verdict: seen.verdict,
            refreshed: seen.refreshed,
        };
        audit::encode(
            &drop,
            self.settings.audit.as_ref().is_some_and(|a| a.payloads),
        )
    }
}

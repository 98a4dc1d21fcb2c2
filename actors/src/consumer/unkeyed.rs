//! Records without a usable id: the batch's decision applies `worker.unkeyed_policy` (forward,
//! dead-letter or drop); each is counted, with its reason, and warned about at most once a minute
//! per partition.

use std::time::{Duration, Instant};

use dedupe::config::UnkeyedPolicy;
use dedupe::identity::Unkeyed;

use super::seams::{SinkAccess, StoreAccess};
use super::Pipeline;
use crate::events::UnkeyedRecord;

impl<S: StoreAccess, K: SinkAccess> Pipeline<S, K> {
    /// Counts a record without a usable id, and warns at most once a minute per partition.
    pub(super) fn unkeyed(&mut self, reason: Unkeyed, policy: UnkeyedPolicy) {
        let warn = self
            .unkeyed_warned_at
            .is_none_or(|t| t.elapsed() > Duration::from_secs(60));
        if warn {
            self.unkeyed_warned_at = Some(Instant::now());
        }
        UnkeyedRecord {
            partition: self.partition,
            label: &self.metrics.label,
            reason,
            policy,
        }
        .emit(warn);
    }
}

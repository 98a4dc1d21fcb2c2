//! Records whose id belongs on another input partition (see `dedupe::kafka::is_home`): counted
//! in `dedupe_misrouted_ids_total`, and warned about at most once a minute per partition. They are
//! deduplicated as any record is.

use std::time::{Duration, Instant};

use super::seams::{SinkAccess, StoreAccess};
use super::{InRecord, Pipeline};
use crate::events::MisroutedIds;

impl<S: StoreAccess, K: SinkAccess> Pipeline<S, K> {
    /// Counts the batch's records whose id belongs on another partition, and warns at most once a
    /// minute per partition.
    pub(super) fn count_misrouted(&mut self, batch: &[InRecord]) {
        let records = batch.iter().filter(|r| r.misrouted).count() as u64;
        if records == 0 {
            return;
        }
        self.misrouted_since_warned += records;
        let warn = self
            .misrouted_warned_at
            .is_none_or(|t| t.elapsed() > Duration::from_secs(60));
        let since = warn.then_some(self.misrouted_since_warned);
        if warn {
            self.misrouted_warned_at = Some(Instant::now());
            self.misrouted_since_warned = 0;
        }
        MisroutedIds {
            partition: self.partition,
            counter: &self.metrics.misrouted,
            records,
            warn: since,
        }
        .emit();
    }
}

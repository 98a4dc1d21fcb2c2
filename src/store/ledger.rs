//! The ledger as an [`IdStore`]: each method one call of [`Ledger`]'s own API.

use super::{IdStore, Looked, NewId};
use crate::identity::LedgerKey;
use crate::ledger::{Ledger, Mark, MarkOrder, Result, Verdict};
use crate::Partition;

impl IdStore for Ledger {
    fn look_up(&self, keys: &[LedgerKey]) -> Result<Looked> {
        let (held, forgotten) = self.held_in(keys)?;
        Ok(Looked { held, forgotten })
    }

    fn record(
        &self,
        partition: Partition,
        items: &[NewId],
        progress: &[u8],
        marks: &[(LedgerKey, Mark)],
    ) -> Result<Vec<Verdict>> {
        self.check_and_record_marked(partition, items, progress, marks)
    }

    fn mark(&self, marks: &[(LedgerKey, Mark)], order: MarkOrder) -> Result<()> {
        Ledger::mark(self, marks, order)
    }

    fn progress(&self, partition: Partition) -> Result<Option<Vec<u8>>> {
        Ledger::progress(self, partition)
    }
}

//! The seam between the per-batch protocol and where it keeps ids: the [`IdStore`] trait, what
//! the pipeline, recovery and handover need of the ledger, and nothing of how it is kept.
//!
//! Its implementations: [`crate::ledger::Ledger`] (`ledger.rs`: RocksDB and the id index) and
//! [`MemoryStore`] (`memory.rs`: a double for tests, one map and one generation). One suite of
//! checks, `conformance.rs`, runs against both, so the double cannot drift from the ledger it
//! stands for. The output's seam, [`crate::output::Sink`], sits beside the output it abstracts.
//!
//! The trait is blocking, as the ledger is: the worker calls it from the ledger actor's own
//! threads (actix's `SyncArbiter`), never from the async executor.

use crate::identity::{ContentDigest, LedgerKey};
use crate::ledger::{Forgotten, Held, Mark, MarkOrder, Result, Verdict};
use crate::Partition;

#[cfg(test)]
mod conformance;
mod ledger;
mod memory;

#[doc(hidden)]
pub use memory::MemoryStore;

/// A new id as recorded: its key, first-seen (event) time in ms and content digest.
pub type NewId = (LedgerKey, i64, Option<ContentDigest>);

/// What a look-up found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Looked {
    /// Per key, in order: what the store holds of it (`None` for an id it does not hold, or one
    /// an operator forgot).
    pub held: Vec<Option<Held>>,
    /// The keys forgotten (each once), since when and where (see [`crate::ledger::Mark`]):
    /// published again, they are marked resent.
    pub forgotten: Vec<Forgotten>,
}

/// Where a worker's partitions keep the ids they have published, and each partition's progress.
///
/// The rules every implementation keeps (checked by the conformance suite):
/// - [`IdStore::record`] answers each item, in order: [`Verdict::New`] for an id not held (or
///   held for longer than the retention limit at the item's time, see
///   [`crate::ledger::past_limit`]), [`Verdict::Duplicate`] with the first sighting's time and
///   digest otherwise; an id repeated in one batch is new once.
/// - A duplicate never changes the first sighting, except with refresh on
///   (`ledger.refresh_on_duplicate`): a copy later than the sighting records the id again at
///   its time, keeping the first digest; never backwards.
/// - An item older than the retention limit (wall clock) is judged new and recorded nowhere.
/// - A batch's ids, its marks (first) and its progress record become visible together.
/// - An id whose newest mark is a forget newer than any re-send is not held, and is listed as
///   forgotten, until a re-send mark ends it.
pub trait IdStore {
    /// What the store holds of each key, in the keys' order, and which keys are forgotten.
    fn look_up(&self, keys: &[LedgerKey]) -> Result<Looked>;

    /// Judges one partition's batch of ids and records the new ones (and the refreshed ones)
    /// with the partition's `progress` record, atomically, `marks` applied first (as the
    /// newest). An empty `progress` leaves the partition's record as it is. Answers each
    /// item's verdict, in order.
    fn record(
        &self,
        partition: Partition,
        items: &[NewId],
        progress: &[u8],
        marks: &[(LedgerKey, Mark)],
    ) -> Result<Vec<Verdict>>;

    /// Applies marks durably, each to its partition's id.
    fn mark(&self, marks: &[(LedgerKey, Mark)], order: MarkOrder) -> Result<()>;

    /// The progress record last written for `partition`.
    fn progress(&self, partition: Partition) -> Result<Option<Vec<u8>>>;
}

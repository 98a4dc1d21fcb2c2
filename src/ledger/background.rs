//! The ledger's background threads over the id index: storing it in its file after a seal, and
//! splitting its buckets as it doubles. Each is tracked, so that none outlives the ledger.

use std::sync::Arc;

use super::{index_file, Durability, Ledger, State};
use crate::metrics::events::{IdIndexNotStored, IndexGrownAtOnce, IndexStore};

impl Ledger {
    /// Starts storing the id index right after a seal, in the background (see `index_file.rs`);
    /// a failure only costs the next open time.
    pub(super) fn store_index_after_seal(&self, state: &mut State) {
        // While the table doubles it is not read whole: the next seal or the close stores it.
        if !state.index.knows()
            || !state.pending.is_empty()
            || state.in_flight.is_some()
            || state.index.growing()
        {
            return;
        }
        if self.options.durability == Durability::NoWal {
            // Without a WAL the seal reaches the disk only with the flush: a file stamped with a
            // seal that a crash then lost would vouch for a generation that takes more ids.
            if let Err(e) = self.flush_all(state, true) {
                IdIndexNotStored {
                    path: &self.path,
                    when: IndexStore::SealNotFlushed,
                    error: &e,
                }
                .emit();
                return;
            }
        }
        state.index_epoch += 1;
        let epoch = state.index_epoch;
        let shared = Arc::clone(&self.state);
        let dir = self.path.clone();
        let spawned = self.spawn_tracked("index-store", move || {
            index_file::store_in_background(&shared, &dir, epoch)
        });
        if let Err(e) = spawned {
            IdIndexNotStored {
                path: &self.path,
                when: IndexStore::NoThread,
                error: &e,
            }
            .emit();
        }
    }

    /// Splits the buckets of a doubling of the id index on a thread of its own, taking the lock
    /// for a short step at a time (see `index/grow.rs`); done at once where no thread can be had.
    pub(super) fn grow_in_background(&self, state: &mut State) {
        /// Buckets split per step: about a millisecond and a half under the lock.
        const STEP: usize = 32 << 10;
        if !state.index.growing() {
            return;
        }
        let shared = Arc::clone(&self.state);
        let spawned = self.spawn_tracked("index-grow", move || loop {
            let done = shared
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .index
                .split_some(STEP);
            if done {
                return;
            }
            std::thread::yield_now();
        });
        if let Err(e) = spawned {
            IndexGrownAtOnce { error: &e }.emit();
            state.index.finish_growth();
        }
    }

    /// Runs `work` on a thread named `name`, kept among the index's background threads: joined
    /// when the ledger is dropped (the finished ones are let go as new ones start).
    fn spawn_tracked(
        &self,
        name: &str,
        work: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<()> {
        let handle = std::thread::Builder::new().name(name.into()).spawn(work)?;
        let mut stores = self
            .index_stores
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        stores.retain(|h| !h.is_finished());
        stores.push(handle);
        Ok(())
    }

    /// Makes any background store of the id index give up, and waits for it.
    pub(super) fn stop_index_stores(&self) {
        self.lock().index_epoch += 1;
        self.join_index_stores();
    }

    /// Waits for the background stores of the id index to finish (or give up).
    fn join_index_stores(&self) {
        let stores = std::mem::take(
            &mut *self
                .index_stores
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for handle in stores {
            let _ = handle.join();
        }
    }

    /// Waits until the id index stored after the last seal is in its file (tests).
    #[cfg(test)]
    pub(super) fn wait_for_index_store(&self) {
        self.join_index_stores();
    }
}

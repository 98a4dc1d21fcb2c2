//! The id buffer: new ids of the active generation wait in an in-memory hash map, which answers
//! lookups first, until a commit writes them to disk (see *How ids are written* in the module
//! docs). How its keys are hashed, and how checked batches are recorded into it.

use std::collections::HashMap;

use super::batch_log::LoggedBatch;
use super::format::TimeBase;
use super::index::IdIndex;
use super::stats::DEFAULT_BYTES_PER_ID_ESTIMATE;
use super::tuning::effective_write_buffer_bytes;
use super::{stored_first_seen_ms, Durability, Held, Ledger, PartitionSpan, Result, State};
use crate::identity::LedgerKey;

/// What a buffered batch's progress record and metadata are assumed to cost towards the write
/// buffer, so batches without new ids are committed too.
const BUFFERED_BATCH_OVERHEAD_BYTES: u64 = 64;

/// Buffered ids, with their stored first-seen times and digests.
pub(super) type IdBuffer = HashMap<LedgerKey, Held, KeyHashing>;

/// An empty buffer, hashing with a new random seed.
pub(super) fn new_buffer() -> IdBuffer {
    HashMap::with_hasher(KeyHashing(rand::random()))
}

/// Hashing of buffered keys: XXH3 with a random per-ledger seed (ids come from clients, so a
/// fixed hash would let them choose colliding ids). Several times cheaper than SipHash on
/// 16-byte keys.
#[derive(Clone)]
pub(super) struct KeyHashing(u64);

pub(super) struct KeyHasher {
    seed: u64,
    hash: u64,
}

impl std::hash::BuildHasher for KeyHashing {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher {
            seed: self.0,
            hash: 0,
        }
    }
}

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.hash = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.seed ^ self.hash);
    }
    fn write_usize(&mut self, _length: usize) {
        // The length prefix of a slice: keys are all 16 bytes long.
    }
    fn finish(&self) -> u64 {
        self.hash
    }
}

impl Ledger {
    /// Whether the buffer holds a write buffer's worth, and should become the next commit.
    pub(super) fn buffer_is_full(&self, state: &State) -> bool {
        let buffered_bytes = state.pending.len() as u64 * DEFAULT_BYTES_PER_ID_ESTIMATE
            + state.pending_batches * BUFFERED_BATCH_OVERHEAD_BYTES;
        buffered_bytes >= effective_write_buffer_bytes(&self.options) as u64
    }

    /// About how many ids a full buffer holds.
    pub(super) fn buffer_capacity_ids(&self) -> u64 {
        effective_write_buffer_bytes(&self.options) as u64 / DEFAULT_BYTES_PER_ID_ESTIMATE
    }

    /// Records a checked batch: appended to the batch log, when there is one, then applied to the
    /// buffer.
    pub(super) fn buffer_batch(&self, state: &mut State, batch: LoggedBatch) -> Result<()> {
        if let Some(log) = state.log.as_mut() {
            log.append(&batch, self.options.durability == Durability::SyncWal)?;
        }
        self.record_buffered(state, batch);
        Ok(())
    }

    /// Applies a checked batch to the in-memory state: its new ids join the buffer of the
    /// active generation, whose metadata counts them; its progress record is buffered too.
    pub(super) fn record_buffered(&self, state: &mut State, batch: LoggedBatch) {
        let LoggedBatch {
            partition,
            base_ms,
            new_ids,
            progress,
        } = batch;
        let State {
            generations,
            pending,
            index,
            ..
        } = state;
        if let Some(active) = generations.last_mut() {
            let tag = IdIndex::tag(active.meta.id);
            if let Some(&(_, first, _)) = new_ids.first() {
                let meta = &mut active.meta;
                let base = TimeBase {
                    base_ms: *meta.base_ms.get_or_insert(base_ms),
                    resolution_ms: meta.resolution_ms.max(1),
                };
                let span = meta.partitions.entry(partition).or_insert(PartitionSpan {
                    first_seen_ms: first,
                    last_seen_ms: first,
                    ids: 0,
                });
                let places: Vec<_> = new_ids.iter().map(|(key, ..)| index.place(key)).collect();
                // Ids may be recorded again into the generation that holds them (a refresh, a
                // copy past the retention limit): they take no second slot.
                let again =
                    self.options.refresh_on_duplicate || self.options.max_window_ms.is_some();
                for (i, &(key, time_ms, digest)) in new_ids.iter().enumerate() {
                    index.prefetch_ahead(&places, i);
                    span.first_seen_ms = span.first_seen_ms.min(time_ms);
                    span.last_seen_ms = span.last_seen_ms.max(time_ms);
                    let held = Held {
                        first_seen_ms: stored_first_seen_ms(base, time_ms),
                        digest,
                    };
                    if pending.insert(key, held).is_some() {
                        continue;
                    }
                    if again {
                        index.insert_once(&places[i], tag);
                    } else {
                        index.insert(&places[i], tag);
                    }
                }
                span.ids += new_ids.len() as u64;
                meta.ids += new_ids.len() as u64;
            }
        }
        // An empty progress record leaves the partition's as it is (ids loaded in the background).
        if !progress.is_empty() {
            state.pending_progress.insert(partition, progress);
        }
        state.pending_batches += 1;
    }
}

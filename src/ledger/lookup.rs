//! Lookups: which of a batch's ids the ledger holds (the id index first, then the buffers, then
//! the generations on disk the index names), the verdict on each, and the progress records.

use std::collections::BTreeMap;

use super::batch_log::LoggedBatch;
use super::error::{rocks, Doing};
use super::format::{decode_value, progress_key, TimeBase};
use super::index::{IdIndex, Probe};
use super::{
    stored_first_seen_ms, Held, Ledger, LedgerError, Result, Sent, Sighting, State, Verdict,
    CF_PROGRESS,
};
use crate::identity::{ContentDigest, LedgerKey};
use crate::Partition;

impl Ledger {
    /// Looks up sorted, distinct keys. Returns what the ledger holds of each key held.
    ///
    /// The id index answers most keys ("not held") from memory. The others are looked up in the
    /// buffer and in RocksDB, only in the generations the index names (in every generation, newest
    /// first, when the index cannot tell).
    pub(super) fn lookup_sorted(
        &self,
        state: &State,
        keys: &[LedgerKey],
    ) -> Result<Vec<Option<Held>>> {
        let mut found = vec![None; keys.len()];
        let gens = &state.generations;
        let active_tag = gens.last().map(|g| IdIndex::tag(g.meta.id));
        let mut position_of_tag = [usize::MAX; 256];
        for (i, g) in gens.iter().enumerate() {
            position_of_tag[usize::from(IdIndex::tag(g.meta.id))] = i;
        }
        // Per generation (by position), the keys to look up in it, in key order.
        let mut to_read: Vec<Vec<usize>> = vec![Vec::new(); gens.len()];
        let index = &state.index;
        let places: Vec<_> = keys.iter().map(|k| index.place(k)).collect();
        for (i, place) in places.iter().enumerate() {
            index.prefetch_ahead(&places, i);
            let (tags, len, every) = match index.probe(place) {
                Probe::Absent => continue,
                Probe::Maybe { tags, len } => (tags, usize::from(len), false),
                Probe::Unknown => ([0; 4], 0, true),
            };
            if every || tags[..len].iter().any(|t| Some(*t) == active_tag) {
                let buffered = state
                    .pending
                    .get(&keys[i])
                    .or_else(|| state.in_flight.as_ref().and_then(|f| f.ids.get(&keys[i])));
                if let Some(&held) = buffered {
                    found[i] = Some(held);
                    continue;
                }
            }
            if every {
                to_read.iter_mut().for_each(|list| list.push(i));
            } else {
                for &tag in &tags[..len] {
                    if let Some(list) = to_read.get_mut(position_of_tag[usize::from(tag)]) {
                        list.push(i);
                    }
                }
            }
        }
        for (position, list) in to_read.iter().enumerate().rev() {
            let generation = &gens[position];
            let Some(base) = generation.meta.time_base() else {
                continue;
            };
            // Found in a newer generation already: an id lives in one generation only, but an
            // index false positive can name an older one too.
            let list: Vec<usize> = list
                .iter()
                .copied()
                .filter(|&i| found[i].is_none())
                .collect();
            if list.is_empty() {
                continue;
            }
            let cf = self.cf(&generation.name)?;
            self.disk_lookups
                .fetch_add(list.len() as u64, std::sync::atomic::Ordering::Relaxed);
            let results = self
                .db
                .batched_multi_get_cf(&cf, list.iter().map(|&i| &keys[i].0), true);
            for (&i, result) in list.iter().zip(results) {
                if let Some(value) = result.map_err(rocks(Doing::Read))? {
                    found[i] = Some(decode_value(base, &value)?);
                }
            }
        }
        Ok(found)
    }

    /// Every copy of `key` the ledger holds, newest generation first: each generation's id and
    /// the copy's first-seen time. Reads every live generation (not the id index): for explaining
    /// one id, not for the pipeline.
    pub(super) fn sightings_in(&self, state: &State, key: &LedgerKey) -> Result<Vec<Sighting>> {
        let mut found = Vec::new();
        let buffered = state
            .pending
            .get(key)
            .or_else(|| state.in_flight.as_ref().and_then(|f| f.ids.get(key)));
        for (newest, generation) in state.generations.iter().rev().enumerate() {
            if newest == 0 {
                if let Some(held) = buffered {
                    found.push(Sighting {
                        generation: generation.meta.id,
                        first_seen_ms: held.first_seen_ms,
                    });
                    continue;
                }
            }
            let Some(base) = generation.meta.time_base() else {
                continue;
            };
            let cf = self.cf(&generation.name)?;
            if let Some(value) = self.db.get_cf(&cf, key.0).map_err(rocks(Doing::Read))? {
                found.push(Sighting {
                    generation: generation.meta.id,
                    first_seen_ms: decode_value(base, &value)?.first_seen_ms,
                });
            }
        }
        Ok(found)
    }

    /// The progress record last written for `partition`: buffered, in flight, or on disk.
    pub(super) fn read_progress(
        &self,
        state: &State,
        partition: Partition,
    ) -> Result<Option<Vec<u8>>> {
        let buffered = state.pending_progress.get(&partition).or_else(|| {
            state
                .in_flight
                .as_ref()
                .and_then(|f| f.progress.get(&partition))
        });
        if let Some(value) = buffered {
            return Ok(Some(value.clone()));
        }
        let cf = self.cf(CF_PROGRESS)?;
        self.db
            .get_cf(&cf, progress_key(partition))
            .map_err(rocks(Doing::Read))
    }

    /// Every partition's progress record: on disk, overridden by those in flight, then buffered.
    pub(super) fn read_all_progress(&self, state: &State) -> Result<BTreeMap<Partition, Vec<u8>>> {
        let mut all = self.durable_progress()?;
        if let Some(f) = &state.in_flight {
            all.extend(f.progress.iter().map(|(p, v)| (*p, v.clone())));
        }
        all.extend(state.pending_progress.iter().map(|(p, v)| (*p, v.clone())));
        Ok(all)
    }

    /// Progress records in the progress column family.
    pub(super) fn durable_progress(&self) -> Result<BTreeMap<Partition, Vec<u8>>> {
        let cf = self.cf(CF_PROGRESS)?;
        let mut all = BTreeMap::new();
        for item in self.db.iterator_cf(&cf, rocksdb::IteratorMode::Start) {
            let (key, value) = item.map_err(rocks(Doing::Read))?;
            let partition = <[u8; 4]>::try_from(&key[..])
                .map(Partition::from_be_bytes)
                .map_err(|_| LedgerError::CorruptMetadata {
                    what: format!("progress key {key:?} is not a partition number"),
                })?;
            all.insert(partition, value.to_vec());
        }
        Ok(all)
    }
}

/// How a batch is judged besides what the ledger holds: the retention limit, the partition's
/// watermark before the batch and the wall clock (the floor below which nothing is recorded, see
/// [`super::retention_floor`]), and whether a dropped copy refreshes its id.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Judging {
    pub(super) limit_ms: Option<i64>,
    pub(super) watermark_ms: Option<i64>,
    pub(super) now_ms: i64,
    pub(super) refresh: bool,
}

/// The verdict on each item of a batch, in input order, and the batch to record: the new ids, at
/// the base the active generation has or takes with them. `slot` gives each item's distinct key,
/// `found` what the ledger holds of each distinct key held.
///
/// With a retention limit, a held id whose sighting is past the limit at the item's time is
/// judged new ([`super::past_limit`]), and a new item older than the floor (the limit before the
/// latest time the partition has reached, this batch's items so far included) is not recorded:
/// it is judged new all the same (nothing holds it), and counted as late (the last value). With
/// `refresh`, a duplicate newer than the sighting held is recorded again at its time, with the
/// held digest, and still judged a duplicate.
pub(super) fn judge_batch<S: Sent>(
    state: &State,
    partition: Partition,
    items: &[S],
    progress: &[u8],
    slot: &[usize],
    found: &[Option<Held>],
    rules: Judging,
) -> (Vec<Verdict>, LoggedBatch, u64) {
    let active_index = state.generations.len() - 1;
    let active = &state.generations[active_index];
    let base_ms = active
        .meta
        .base_ms
        .or_else(|| items.first().map(Sent::time_ms))
        .unwrap_or(0);
    let base = TimeBase {
        base_ms,
        resolution_ms: active.meta.resolution_ms.max(1),
    };
    // What each distinct key is held or recorded as so far in this batch.
    let mut held: Vec<Option<Held>> = found.to_vec();
    // Position in `new_ids` of the key's record in this batch, so a refresh replaces it.
    let mut recorded_at: Vec<Option<usize>> = vec![None; found.len()];
    let mut verdicts = Vec::with_capacity(items.len());
    let mut new_ids: Vec<(LedgerKey, i64, Option<ContentDigest>)> = Vec::with_capacity(items.len());
    let mut reached = rules.watermark_ms;
    let mut late = 0;
    for (item, &s) in items.iter().zip(slot) {
        let (time_ms, digest) = (item.time_ms(), item.digest());
        reached = Some(reached.map_or(time_ms, |r| r.max(time_ms)));
        let live = held[s].filter(|h| !super::past_limit(rules.limit_ms, h.first_seen_ms, time_ms));
        if let Some(h) = live {
            verdicts.push(Verdict::Duplicate {
                first_seen_ms: h.first_seen_ms,
                digest: h.digest,
            });
            let stored = stored_first_seen_ms(base, time_ms);
            if rules.refresh && stored > h.first_seen_ms {
                let refreshed = (item.key(), time_ms, h.digest);
                match recorded_at[s] {
                    Some(at) => new_ids[at] = refreshed,
                    None => {
                        recorded_at[s] = Some(new_ids.len());
                        new_ids.push(refreshed);
                    }
                }
                held[s] = Some(Held {
                    first_seen_ms: stored,
                    digest: h.digest,
                });
            }
            continue;
        }
        verdicts.push(Verdict::New);
        held[s] = Some(Held {
            first_seen_ms: stored_first_seen_ms(base, time_ms),
            digest,
        });
        let floor = super::retention_floor(rules.limit_ms, reached, rules.now_ms);
        if floor.is_some_and(|floor| time_ms < floor) {
            // Older than the limit already: judged new (once in the batch), recorded nowhere.
            late += 1;
            continue;
        }
        recorded_at[s] = Some(new_ids.len());
        new_ids.push((item.key(), time_ms, digest));
    }
    let batch = LoggedBatch {
        partition,
        base_ms,
        new_ids,
        progress: progress.to_vec(),
    };
    (verdicts, batch, late)
}

/// Sorted distinct keys, and for each input key the index of its distinct key.
pub(super) fn sort_distinct(keys: impl Iterator<Item = LedgerKey>) -> (Vec<LedgerKey>, Vec<usize>) {
    let keys: Vec<LedgerKey> = keys.collect();
    let mut order: Vec<u32> = (0..keys.len() as u32).collect();
    order.sort_unstable_by_key(|&i| keys[i as usize]);
    let mut sorted: Vec<LedgerKey> = Vec::with_capacity(keys.len());
    let mut slot = vec![0usize; keys.len()];
    for i in order {
        let key = keys[i as usize];
        if sorted.last() != Some(&key) {
            sorted.push(key);
        }
        slot[i as usize] = sorted.len() - 1;
    }
    (sorted, slot)
}

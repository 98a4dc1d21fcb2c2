//! What the ledger reports about its size and reach ([`LedgerStats`], [`GenerationInfo`]), and
//! the size estimates that sealing and forgetting go by.

use serde::Serialize;

use super::error::{rocks, Doing};
use super::{Generation, GenerationMeta, Ledger, Result, State, CF_META, CF_PROGRESS};

/// A generation as reported to callers, e.g. to forecast the window once the budget is full.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationInfo {
    /// Its metadata.
    pub meta: GenerationMeta,
    /// Estimated bytes on disk (live SST bytes, plus the ids still in memtables or buffered, at
    /// the observed bytes per id).
    pub bytes: u64,
}

/// A snapshot of the ledger's size and reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LedgerStats {
    /// Ids held (sum over live generations).
    pub ids_estimate: u64,
    /// Bytes of SST files in the current version of every column family.
    pub live_sst_bytes: u64,
    /// Bytes of all SST files, including obsolete ones not yet deleted.
    pub total_sst_bytes: u64,
    /// Bytes of all memtables.
    pub memtable_bytes: u64,
    /// Live generations (including the active one).
    pub generations: u64,
    /// Memory held by table readers: filters and indexes of live SST files.
    pub filter_bytes: u64,
    /// Bytes in the block cache.
    pub block_cache_bytes: u64,
    /// First-seen time of the oldest id held, ms.
    pub oldest_first_seen_ms: Option<i64>,
    /// First-seen time of the newest id held, ms.
    pub newest_first_seen_ms: Option<i64>,
    /// Bytes of the in-memory id index (it grows with the ids held, up to its full size).
    pub index_bytes: u64,
    /// Ids the id index holds at its current size before it grows again.
    pub index_capacity_ids: u64,
    /// Ids in the id index.
    pub index_ids: u64,
    /// Index buckets that overflowed: ids hashing to them are looked up in every generation.
    /// Zero unless the ledger holds more ids than `index_capacity_ids`.
    pub index_overflowed_buckets: u64,
    /// Id lookups that went to a generation on disk since the ledger was opened (the id index
    /// named that generation): duplicates, plus fingerprint collisions (about 6 in 10,000 ids).
    pub disk_lookups: u64,
    /// The retention limit the ledger was last opened for writing under, ms (`None`: none). A
    /// checkpoint carries it, so a snapshot says which limit it was taken under.
    pub retention_limit_ms: Option<i64>,
}

/// Bytes per id assumed for ids not in SST files yet (buffered, or in memtables), before any SST
/// tells us better; also what a buffered id counts towards the write buffer.
pub(super) const DEFAULT_BYTES_PER_ID_ESTIMATE: u64 = 24;

impl Ledger {
    /// Every live generation, oldest first, with its estimated size.
    pub(super) fn generation_infos(&self, state: &State) -> Result<Vec<GenerationInfo>> {
        state
            .generations
            .iter()
            .map(|g| {
                Ok(GenerationInfo {
                    meta: g.meta.clone(),
                    bytes: self.generation_bytes(state, g)?,
                })
            })
            .collect()
    }

    /// Size and reach of the ledger, in the state given.
    pub(super) fn collect_stats(&self, state: &State) -> Result<LedgerStats> {
        let mut stats = LedgerStats {
            ids_estimate: state.generations.iter().map(|g| g.meta.ids).sum(),
            live_sst_bytes: 0,
            total_sst_bytes: 0,
            memtable_bytes: 0,
            generations: state.generations.len() as u64,
            filter_bytes: 0,
            block_cache_bytes: self.block_cache.get_usage() as u64,
            oldest_first_seen_ms: None,
            newest_first_seen_ms: None,
            index_bytes: state.index.table_bytes(),
            index_capacity_ids: {
                let (geometry, level) = state.index.geometry();
                geometry.capacity(level)
            },
            index_ids: state.index.live_slots(),
            index_overflowed_buckets: state.index.overflowed_buckets(),
            disk_lookups: self.disk_lookups.load(std::sync::atomic::Ordering::Relaxed),
            retention_limit_ms: self.recorded_limit()?,
        };
        let mut names: Vec<&str> = vec![CF_META, CF_PROGRESS];
        names.extend(state.generations.iter().map(|g| g.name.as_str()));
        for name in names {
            stats.live_sst_bytes += self.int_property(name, "rocksdb.live-sst-files-size")?;
            stats.total_sst_bytes += self.int_property(name, "rocksdb.total-sst-files-size")?;
            stats.memtable_bytes += self.int_property(name, "rocksdb.cur-size-all-mem-tables")?;
            stats.filter_bytes += self.int_property(name, "rocksdb.estimate-table-readers-mem")?;
        }
        let spans = state
            .generations
            .iter()
            .flat_map(|g| g.meta.partitions.values());
        for s in spans {
            stats.oldest_first_seen_ms = Some(
                stats
                    .oldest_first_seen_ms
                    .map_or(s.first_seen_ms, |o| o.min(s.first_seen_ms)),
            );
            stats.newest_first_seen_ms = Some(
                stats
                    .newest_first_seen_ms
                    .map_or(s.last_seen_ms, |o| o.max(s.last_seen_ms)),
            );
        }
        Ok(stats)
    }

    fn int_property(&self, cf_name: &str, property: &str) -> Result<u64> {
        let cf = self.cf(cf_name)?;
        Ok(self
            .db
            .property_int_value_cf(&cf, property)
            .map_err(rocks(Doing::Read))?
            .unwrap_or(0))
    }

    /// Estimated bytes of one generation once on disk.
    pub(super) fn generation_bytes(&self, state: &State, generation: &Generation) -> Result<u64> {
        let sst = self.int_property(&generation.name, "rocksdb.live-sst-files-size")?;
        let buffered = if state
            .generations
            .last()
            .is_some_and(|g| g.meta.id == generation.meta.id)
        {
            state.pending.len() as u64
        } else {
            0
        } + state
            .in_flight
            .as_ref()
            .filter(|f| f.record.meta.id == generation.meta.id)
            .map_or(0, |f| f.ids.len() as u64);
        let mem_ids = self
            .int_property(&generation.name, "rocksdb.num-entries-active-mem-table")?
            + self.int_property(&generation.name, "rocksdb.num-entries-imm-mem-tables")?
            + buffered;
        let sst_ids = generation.meta.ids.saturating_sub(mem_ids);
        let per_id = if sst_ids > 0 && sst > 0 {
            sst.div_ceil(sst_ids)
        } else {
            DEFAULT_BYTES_PER_ID_ESTIMATE
        };
        Ok(sst + mem_ids * per_id)
    }
}

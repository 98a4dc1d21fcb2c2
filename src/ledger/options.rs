//! Configuration of a ledger: [`LedgerOptions`], with the crash [`Durability`] it chooses.

use super::index::{Geometry, IdIndex};

/// How much of the most recent work may be lost on a crash (see the [module docs](super) for
/// costs). The one type for it: the configuration's `ledger.durability` and the bench's
/// `--durability` parse into it (`sync-wal`, `wal`, `no-wal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// The batch log (the ledger's WAL), fsynced per batch: nothing is lost, even on power
    /// failure.
    SyncWal,
    /// The batch log, not fsynced: a process crash loses nothing, a machine crash may lose a tail.
    Wal,
    /// No batch log: a crash, even of the process, loses the batches since the last applied
    /// commit; what survives stays a consistent prefix.
    NoWal,
}

impl Durability {
    pub const ALL: [Durability; 3] = [Self::SyncWal, Self::Wal, Self::NoWal];

    /// The name used in configuration and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SyncWal => "sync-wal",
            Self::Wal => "wal",
            Self::NoWal => "no-wal",
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| format!("`{s}` is not one of sync-wal, wal, no-wal"))
    }
}

/// Ledger configuration. A plain struct: the service maps its configuration onto it.
#[derive(Debug, Clone)]
pub struct LedgerOptions {
    /// Disk budget for ids, in bytes. Disk use stays within this plus one generation.
    /// Default 16 GiB: about 950M ids at ~18 bytes each without content digests, 830M with.
    pub budget_bytes: u64,
    /// Number of generations the budget is split into (G). More generations make forgetting
    /// finer-grained (disk ≤ budget × (1 + 1/G)); they cost a lookup nothing, since the id index
    /// names the one generation to look in. At most 200 live at once (the index has 256 tags).
    /// Default 8, as the design proposes.
    pub generations: u32,
    /// Seal the active generation after this many ids even if it is under `budget / G`
    /// (`None`: by size only). Useful to bound a generation's time span, and in tests.
    pub seal_after_ids: Option<u64>,
    /// Crash durability. Default [`Durability::Wal`]: the batch log append costs a few percent of
    /// the ledger's throughput, an fsync per batch (`SyncWal`) about a quarter (the ledger bench's
    /// figures are in docs/performance.md, "Durability modes").
    /// `Wal` loses nothing on a process crash, so replays after a crash stay short; the worker
    /// must still be able to replay a lost tail from the output topic, since a machine crash
    /// loses the unsynced tail.
    pub durability: Durability,
    /// Shared LRU block cache for data blocks. Default 64 MiB: recent retries hit recent
    /// blocks; most lookups are answered by the id index and never read a block.
    pub block_cache_bytes: usize,
    /// Size of one memtable, and the amount of buffered ids (at 24 bytes per id, i.e. ~2.8M ids by
    /// default) committed as one ingested file. Default 64 MiB. Never more than half a generation.
    /// Two buffers' worth can be in memory: one filling, one being committed.
    pub write_buffer_bytes: usize,
    /// Memtables per column family (one being written, the rest flushing). Default 3. Only the
    /// small metadata and progress column families and version 1 data use memtables.
    pub max_write_buffers: i32,
    /// Bloom filter size of the active generation's files, in bits per key. Default 10 (~1%
    /// false positives). A sealed generation's compacted run has no filter.
    pub filter_bits_per_key: f64,
    /// RocksDB background threads (flush + compaction). Default 2, the core count measured on.
    pub background_jobs: i32,
    /// Keys between restart points in data blocks. Larger shares more key prefix (random keys
    /// share ~3 bytes with their neighbour) at the cost of a longer scan inside a block on a hit.
    /// Default 64 (RocksDB's is 16): measured (with LZ4) 22.7 instead of 23.2 bytes per id; only
    /// lookups that reach the disk (duplicates and index false positives) pay the scan.
    pub block_restart_interval: i32,
    /// Ids the in-memory id index is sized for (`None`: `budget_bytes / 16`, more ids than the
    /// budget can hold). The index takes about 3.4 bytes per id of capacity, i.e. about a fifth
    /// of the disk budget in memory. If more ids than this are held, lookups of some ids fall
    /// back to RocksDB in every generation (still exact, slower); see
    /// [`LedgerStats`](super::LedgerStats).
    pub index_capacity_ids: Option<u64>,
    /// Build the id index when opening (default). Without it (maintenance commands that only read
    /// stats or take a checkpoint), opening is quick and takes no index memory, and every lookup
    /// goes to each generation on disk: answers stay exact, lookups are slow.
    pub build_index: bool,
    /// The retention limit, ms (`None`: none, the budget alone bounds the window). A copy more
    /// than this after its id's last recorded sighting is not a duplicate of it; no id older than
    /// this is recorded or loaded; the active generation is sealed once it spans
    /// `limit / generations`, and a sealed generation is dropped once its newest id is past the
    /// limit ([`Ledger::expire`](super::Ledger::expire)). See `retention.rs`.
    pub max_window_ms: Option<i64>,
    /// A dropped copy records its id again at the copy's time, so an id stays held for as long as
    /// its copies keep coming (the retention limit then counts from the last of them). Default
    /// off: the window counts from an id's first sighting.
    pub refresh_on_duplicate: bool,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        LedgerOptions {
            budget_bytes: 16 << 30,
            generations: 8,
            seal_after_ids: None,
            durability: Durability::Wal,
            block_cache_bytes: 64 << 20,
            write_buffer_bytes: 64 << 20,
            max_write_buffers: 3,
            filter_bits_per_key: 10.0,
            background_jobs: 2,
            block_restart_interval: 64,
            index_capacity_ids: None,
            build_index: true,
            max_window_ms: None,
            refresh_on_duplicate: false,
        }
    }
}

impl LedgerOptions {
    /// Size at which the active generation is sealed.
    pub fn generation_target_bytes(&self) -> u64 {
        (self.budget_bytes / u64::from(self.generations.max(1))).max(1)
    }

    /// Ids the in-memory id index is sized for.
    pub fn index_capacity(&self) -> u64 {
        self.index_capacity_ids
            .unwrap_or_else(|| IdIndex::capacity_for_budget(self.budget_bytes))
    }

    /// Bytes of memory the id index takes at full size (it starts at most 64 times smaller and
    /// grows with the ids held).
    pub fn index_bytes(&self) -> u64 {
        IdIndex::bytes_for_capacity(self.index_capacity())
    }

    /// The id index's sizes.
    pub(super) fn index_geometry(&self) -> Geometry {
        Geometry::for_capacity(self.index_capacity())
    }
}

//! The ledger: a worker's durable memory of which message ids it has seen, bounded by a disk budget.
//!
//! # What it guarantees
//! - **Answers.** [`Ledger::check_and_record`] returns, in input order, [`Verdict::New`] for an id it
//!   does not hold and [`Verdict::Duplicate`] (with the first-seen time) for one it holds; an id
//!   repeated inside one batch is `New` once, then `Duplicate`. A batch costs one probe per id of
//!   the in-memory id index ([`index`]: 16-bit fingerprints tagged with their generation), which
//!   answers "not held" for almost every new id; the other ids get one batched lookup in the
//!   buffer and in each generation the index names. Recording is an insert into the buffer and
//!   the index plus, with a WAL, one append to the batch log. New ids never go through a
//!   memtable (see *How ids are written*).
//! - **Atomicity and order.** A batch's new ids, the partition's progress record (opaque bytes:
//!   the pipeline keeps its offsets there) and the generation metadata the batch changes become
//!   durable together: in one checksummed batch-log record, and in one ingested file with its
//!   commit record. After a crash at any instant, a batch is there entirely with its progress
//!   record, or not at all, and the surviving batches are a prefix of the batches written.
//! - **Durability** is a choice ([`Durability`]): which tail of recent batches may be lost on a
//!   crash. A lost tail is repaired by the worker, which replays the output topic from the progress
//!   record the ledger returns after reopening.
//! - **Size-bounded, oldest-first forgetting.** Ids live in generations, one column family each
//!   (`gen-000000000042`). The active generation is sealed when it holds about
//!   `budget_bytes / generations` bytes; after a seal, the oldest generations are dropped whole
//!   (`drop_cf`) until the rest fit the budget. There are no per-key deletes, so forgetting costs
//!   the same whatever the number of ids, and disk stays within the budget plus one generation.
//!   A load spike shrinks the dedupe window; it never makes the ledger grow without bound.
//! - **The window** ([`Ledger::window`]) is conservative: every id first seen after
//!   `now - window` is held. It is never reported for data the ledger does not hold.
//! - **Safe opening.** A missing ledger is created. A directory that cannot be opened is an error
//!   naming the path and RocksDB's reason; the ledger never deletes or recreates it. A ledger of
//!   an unknown format version is refused; a version 1 ledger is upgraded.
//! - **Memory** is bounded by configuration: the id index (about 3.4 bytes per id of
//!   `index_capacity_ids`, by default `budget_bytes / 16`: about a fifth of the disk budget), the
//!   block cache (`block_cache_bytes`, data blocks only), the id buffer and the commit in flight
//!   (each about `write_buffer_bytes / 24` ids at ~32 bytes each, so ~2.8 × `write_buffer_bytes`
//!   together), the
//!   memtables of the small column families, plus the filter and index blocks of the live SST
//!   files, held by the table readers. Only the active generation's files carry filters
//!   (`filter_bits_per_key / 8` bytes per id); a sealed generation's single run has none.
//!
//! # On-disk format (version [`FORMAT_VERSION`])
//! - `gen-<12 digit id>` column families: key = the 16-byte [`LedgerKey`], value = zigzag varint
//!   of `(first_seen_ms - generation.base_ms)` in whole seconds ([`FIRST_SEEN_RESOLUTION_MS`]), so a
//!   value is 1-3 bytes for ids within ~12 days of the generation's base. Reported first-seen
//!   times are therefore rounded down to the second relative to the generation's base.
//! - [`CF_META`]: `format_version` (u32 LE), `gen/<u64 BE id>` = JSON [`GenerationMeta`],
//!   `forgotten` = JSON map partition → last first-seen time (ms) of any id already forgotten.
//!   `commit_seq` (u64 LE) = the last commit applied to this column family and [`CF_PROGRESS`].
//! - [`CF_PROGRESS`]: key = partition (u32 BE), value = the caller's progress record.
//! - Commit records: in a generation column family, key `[0xff; 16] ++ "commit"` (never an id:
//!   ids are 16 bytes) = JSON `{seq, meta, progress}`, the generation's metadata and every
//!   partition's progress record as of that commit.
//! - Batch log `batches-<12 digit commit seq>.log` (with a WAL): records `[payload length u32 LE]
//!   [XXH3-64 of the payload, u64 LE][payload]`, payload = partition u32, base ms i64, progress
//!   length u32 and bytes, id count u32, then per new id its 16 bytes and event time ms i64 (all LE).
//! - Message identity ([`crate::identity`]) is part of the format too.
//!
//! # How ids are written
//! New ids of the active generation are kept in an in-memory hash map (which answers lookups
//! first), not in RocksDB memtables: a memtable insert of a random 16-byte key is a skiplist walk
//! of cache misses, and was 60% of the CPU. When the buffer reaches a write buffer's worth
//! (`write_buffer_bytes` at 24 bytes per id), it becomes the commit *in flight* and a fresh buffer
//! takes new ids. A background thread sorts the commit's ids and writes them with a commit record
//! into one SST file, while the in-flight ids keep answering lookups from memory. The next ledger
//! call that finds the file written ingests it into the generation's column family (the atomic
//! step); then the generation metadata, the progress records and `commit_seq` are written to their
//! column families and flushed together. If a crash falls between the two, opening applies the
//! newest commit record whose sequence is above `commit_seq`. At most one commit is in flight;
//! generation seals and checkpoints finish it and commit the buffer on the caller's thread. With a
//! WAL, every batch is first appended to the batch log of the commit it belongs to; opening
//! replays the logs of uncommitted commits in order (at most two: the one in flight and the next),
//! each up to the first torn or corrupt record, stops at a torn one, and commits them.
//!
//! The active generation is never compacted: its committed files pile up in L0, each with its own
//! bloom filter, and a lookup reaches them only for ids the id index names. Compacting a growing
//! generation rewrote its whole sorted run every few commits, which made throughput fall with the
//! number of ids. A sealed generation is compacted once, in the background, into one sorted run
//! without a filter (the index already turns new ids away), compressed with ZSTD.
//!
//! The id index is not stored: opening rebuilds it by reading every generation's keys in order
//! (see [`LedgerStats`] and the log line "rebuilt the ledger's id index" for its size and time).
//!
//! # Durability: what each mode costs
//! - [`Durability::SyncWal`]: every batch is appended to the batch log and fsynced
//!   (`fdatasync`) before the call returns. Nothing is lost even on power failure; costs an fsync
//!   per batch (milliseconds on most disks), which caps batches per second.
//! - [`Durability::Wal`]: the batch is appended to the batch log (the OS page cache) before the
//!   call returns. A process crash loses nothing; a machine crash may lose the last few batches.
//!   Costs an append of ~24 bytes per new id.
//! - [`Durability::NoWal`]: no log; a crash, even of the process, loses the batches since the
//!   last applied commit (up to two write buffers' worth: the buffer and the commit in flight),
//!   and what survives is a consistent prefix.
//!
//! Default: [`Durability::Wal`] — see [`LedgerOptions::durability`] for the measurement.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompressionType, DBWithThreadMode,
    FlushOptions, IngestExternalFileOptions, MultiThreaded, Options, SstFileWriter, WriteBatch,
    WriteOptions,
};
use serde::{Deserialize, Serialize};

use crate::identity::{LedgerKey, LEDGER_KEY_BYTES};

mod index;
use index::{IdIndex, Probe};

/// Column family holding format version and generation metadata.
pub const CF_META: &str = "meta";
/// Column family holding each partition's progress record.
pub const CF_PROGRESS: &str = "progress";
/// Prefix of the generation column families (`gen-000000000042`).
pub const GENERATION_CF_PREFIX: &str = "gen-";
/// The on-disk format this code reads and writes.
/// Version 2 added the batch log, ingested files and commit records; a version 1 ledger (ids in
/// memtables, RocksDB's WAL) is read and upgraded on open. Older code must not open a version 2
/// ledger: it would neither replay the batch log nor apply a commit record.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format this code opens (and upgrades).
const OLDEST_READABLE_FORMAT_VERSION: u32 = 1;
/// Resolution of stored first-seen times.
pub const FIRST_SEEN_RESOLUTION_MS: i64 = 1000;

const META_FORMAT_VERSION: &[u8] = b"format_version";
const META_GENERATION_PREFIX: &[u8] = b"gen/";
const META_FORGOTTEN: &[u8] = b"forgotten";
const META_COMMIT_SEQ: &[u8] = b"commit_seq";
/// Key of the commit record in a generation column family: longer than any id, and after every
/// id in key order, so it is the last key of an ingested file and never answers a lookup.
const COMMIT_KEY: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xffcommit";
/// Extension of the files written for ingestion (moved into the database when ingested).
const INGEST_FILE_EXTENSION: &str = "ingest";
/// What a buffered batch's progress record and metadata are assumed to cost towards the write
/// buffer, so batches without new ids are committed too.
const BUFFERED_BATCH_OVERHEAD_BYTES: u64 = 64;
/// Bytes per id assumed for data still in memtables, before any SST tells us better.
const DEFAULT_BYTES_PER_ID_ESTIMATE: u64 = 24;
/// Live generations are capped below the id index's 256 generation tags, so no two live
/// generations share a tag. Only tiny `seal_after_ids` settings come near it.
const MAX_LIVE_GENERATIONS: usize = 200;
/// Keys whose index buckets are prefetched together while the index is rebuilt.
const REBUILD_RUN: usize = 64;

/// Errors of the ledger layer. RocksDB errors are converted in [`rocks`].
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Opening (or creating) the ledger at `path` failed; nothing was deleted.
    #[error("cannot open the ledger at {path}: {source}")]
    Open {
        /// The ledger directory.
        path: PathBuf,
        /// RocksDB's reason.
        source: rocksdb::Error,
    },
    /// The directory exists, is not empty and does not look like a ledger; it was left alone.
    #[error("{path} is not a ledger: {reason}; it was left untouched")]
    NotALedger {
        /// The directory.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// A file-system operation outside RocksDB failed.
    #[error("cannot {what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Writing a batch (or metadata) failed.
    #[error("cannot write to the ledger: {source}")]
    Write {
        /// RocksDB's reason.
        source: rocksdb::Error,
    },
    /// Reading the ledger failed.
    #[error("cannot read the ledger: {source}")]
    Read {
        /// RocksDB's reason.
        source: rocksdb::Error,
    },
    /// Creating or dropping a generation failed.
    #[error("cannot {what} generation {name}: {source}")]
    Generation {
        /// "create" or "drop".
        what: &'static str,
        /// Column family name.
        name: String,
        /// RocksDB's reason.
        source: rocksdb::Error,
    },
    /// Creating a checkpoint in `dir` failed.
    #[error("cannot create a ledger checkpoint in {dir}: {source}")]
    Checkpoint {
        /// Checkpoint directory.
        dir: PathBuf,
        /// RocksDB's reason.
        source: rocksdb::Error,
    },
    /// Restoring into a non-empty directory without being told to replace it.
    #[error("refusing to restore into {dir}: it is not empty")]
    TargetNotEmpty {
        /// The target directory.
        dir: PathBuf,
    },
    /// The metadata column family holds something this code cannot interpret.
    #[error("corrupt ledger metadata: {what}")]
    CorruptMetadata {
        /// What is wrong.
        what: String,
    },
    /// The ledger was written in a format version this code does not know.
    #[error("the ledger has format version {found}; this build reads versions {OLDEST_READABLE_FORMAT_VERSION} to {FORMAT_VERSION}")]
    UnknownFormat {
        /// Version found on disk.
        found: u32,
    },
}

impl LedgerError {
    /// Whether retrying the same call may succeed (transient I/O trouble), as opposed to a state
    /// that needs an operator (corruption, unknown format, misuse).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LedgerError::Write { .. } | LedgerError::Read { .. } | LedgerError::Checkpoint { .. }
        )
    }
}

/// Result of the ledger layer.
pub type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// What was being done when RocksDB failed: the one place RocksDB errors are converted.
enum Doing<'a> {
    Write,
    Read,
    Open(&'a Path),
    Checkpoint(&'a Path),
    Generation(&'static str, &'a str),
}

fn rocks(doing: Doing<'_>) -> impl FnOnce(rocksdb::Error) -> LedgerError + '_ {
    move |source| match doing {
        Doing::Write => LedgerError::Write { source },
        Doing::Read => LedgerError::Read { source },
        Doing::Open(path) => LedgerError::Open {
            path: path.to_path_buf(),
            source,
        },
        Doing::Checkpoint(dir) => LedgerError::Checkpoint {
            dir: dir.to_path_buf(),
            source,
        },
        Doing::Generation(what, name) => LedgerError::Generation {
            what,
            name: name.to_string(),
            source,
        },
    }
}

fn io_error<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LedgerError + 'a {
    move |source| LedgerError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// How much of the most recent work may be lost on a crash (see the module docs for costs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// WAL, fsynced per batch: nothing is lost, even on power failure.
    SyncWal,
    /// WAL, not fsynced: a process crash loses nothing, a machine crash may lose a tail.
    Wal,
    /// No WAL, atomic flushes: a crash loses the tail since the last flush; state stays a
    /// consistent prefix.
    NoWal,
}

/// Memtable implementation of the generation column families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemtableKind {
    /// RocksDB's default sorted skiplist: every insert is an O(log n) walk with cache misses.
    SkipList,
    /// A hash table of short sorted lists, keyed by the whole 16-byte key: inserts and lookups
    /// are O(1); the sort is paid once per memtable, by the flush thread.
    HashLinkList,
}

/// Ledger configuration. A plain struct: the service maps its configuration onto it.
#[derive(Debug, Clone)]
pub struct LedgerOptions {
    /// Disk budget for ids, in bytes. Disk use stays within this plus one generation.
    /// Default 16 GiB: about 950M ids at ~18 bytes each.
    pub budget_bytes: u64,
    /// Number of generations the budget is split into (G). More generations make forgetting
    /// finer-grained (disk ≤ budget × (1 + 1/G)); they cost a lookup nothing, since the id index
    /// names the one generation to look in. At most 200 live at once (the index has 256 tags).
    /// Default 8, as the design proposes.
    pub generations: u32,
    /// Seal the active generation after this many ids even if it is under `budget / G`
    /// (`None`: by size only). Useful to bound a generation's time span, and in tests.
    pub seal_after_ids: Option<u64>,
    /// Crash durability. Default [`Durability::Wal`]: measured with the bench (5M ids, 4096-id
    /// batches, this shared 2-core machine) `Wal` ran at 2.34M and 2.46M ids/s, `NoWal` at 2.54M
    /// ids/s and `SyncWal` at 1.81M ids/s: the batch log append costs a few percent, an fsync per
    /// batch about a quarter.
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
    /// small metadata and progress column families and version 1 data use memtables now.
    pub max_write_buffers: i32,
    /// Bloom filter size of the active generation's files, in bits per key. Default 10 (~1%
    /// false positives). A sealed generation's compacted run has no filter.
    pub filter_bits_per_key: f64,
    /// RocksDB background threads (flush + compaction). Default 2, the core count measured on.
    pub background_jobs: i32,
    /// Memtable implementation of the generation column families (see [`MemtableKind`]). Default
    /// [`MemtableKind::SkipList`]. Since ids are buffered and ingested, generation memtables stay
    /// empty (only a version 1 ledger's WAL replays into them), so this hardly matters any more;
    /// when ids went through memtables, `HashLinkList` measured slower (0.31M vs 0.45M ids/s).
    pub memtable: MemtableKind,
    /// Keys between restart points in data blocks. Larger shares more key prefix (random keys
    /// share ~3 bytes with their neighbour) at the cost of a longer scan inside a block on a hit.
    /// Default 64 (RocksDB's is 16): measured (with LZ4) 22.7 instead of 23.2 bytes per id; only
    /// lookups that reach the disk (duplicates and index false positives) pay the scan.
    pub block_restart_interval: i32,
    /// Ids the in-memory id index is sized for (`None`: `budget_bytes / 16`, more ids than the
    /// budget can hold). The index takes about 3.4 bytes per id of capacity, i.e. about a fifth
    /// of the disk budget in memory. If more ids than this are held, lookups of some ids fall
    /// back to RocksDB in every generation (still exact, slower); see [`LedgerStats`].
    pub index_capacity_ids: Option<u64>,
    /// Build the id index when opening (default). Without it (maintenance commands that only read
    /// stats or take a checkpoint), opening is quick and takes no index memory, and every lookup
    /// goes to each generation on disk: answers stay exact, lookups are slow.
    pub build_index: bool,
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
            memtable: MemtableKind::SkipList,
            block_restart_interval: 64,
            index_capacity_ids: None,
            build_index: true,
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

    /// Bytes of memory the id index takes.
    pub fn index_bytes(&self) -> u64 {
        IdIndex::bytes_for_capacity(self.index_capacity())
    }
}

/// The answer for one id of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not held before: now recorded.
    New,
    /// Held already; first seen at this time (rounded down to [`FIRST_SEEN_RESOLUTION_MS`]
    /// relative to its generation's base).
    Duplicate {
        /// Event time of the first sighting, ms.
        first_seen_ms: i64,
    },
}

/// First and last event times of the ids one partition recorded into one generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionSpan {
    /// Earliest event time, ms.
    pub first_seen_ms: i64,
    /// Latest event time, ms.
    pub last_seen_ms: i64,
    /// Ids recorded.
    pub ids: u64,
}

/// Metadata of one generation, stored in [`CF_META`] and written atomically with the batches
/// that change it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationMeta {
    /// Generation number (increasing with age: higher is newer).
    pub id: u64,
    /// Event time the stored first-seen offsets are relative to (first id recorded), ms.
    pub base_ms: Option<i64>,
    /// No more ids are recorded into a sealed generation.
    pub sealed: bool,
    /// Ids recorded (exact; "approximate" only in that a crash in NoWal mode may roll it back
    /// together with the ids).
    pub ids: u64,
    /// Per-partition spans.
    pub partitions: BTreeMap<u32, PartitionSpan>,
}

/// A generation as reported to callers, e.g. to forecast the window once the budget is full.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationInfo {
    /// Its metadata.
    pub meta: GenerationMeta,
    /// Estimated bytes on disk (live SST bytes, plus memtable ids at the observed bytes per id).
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
    /// Bytes of the in-memory id index.
    pub index_bytes: u64,
    /// Ids in the id index.
    pub index_ids: u64,
    /// Index buckets that overflowed: ids hashing to them are looked up in every generation.
    /// Zero unless the ledger holds more ids than `index_capacity_ids`.
    pub index_overflowed_buckets: u64,
    /// Id lookups that went to a generation on disk since the ledger was opened (the id index
    /// named that generation): duplicates, plus fingerprint collisions (about 6 in 10,000 ids).
    pub disk_lookups: u64,
}

struct Generation {
    name: String,
    meta: GenerationMeta,
}

struct State {
    /// Oldest first; the last one is the active (unsealed) generation.
    generations: Vec<Generation>,
    /// Per partition: latest first-seen time of any id already forgotten.
    forgotten: BTreeMap<u32, i64>,
    /// [`Durability::NoWal`] only: ids recorded into the active generation since its last
    /// commit, with their stored first-seen times. Nothing of them is in RocksDB yet.
    pending: HashMap<LedgerKey, i64, KeyHashing>,
    /// [`Durability::NoWal`] only: progress records written since the last commit.
    pending_progress: BTreeMap<u32, Vec<u8>>,
    /// [`Durability::NoWal`] only: batches recorded since the last commit.
    pending_batches: u64,
    /// Sequence number of the last commit applied to the metadata and progress column families.
    commit_seq: u64,
    /// With a WAL ([`Durability::Wal`], [`Durability::SyncWal`]): the log of the batches
    /// buffered since the last commit.
    log: Option<BatchLog>,
    /// Fingerprints of every id held, tagged with their generation (see [`index`]).
    index: IdIndex,
    /// The commit whose file a background thread is writing, if any. Its ids still answer
    /// lookups from memory until the file is ingested.
    in_flight: Option<InFlight>,
    /// An emptied buffer kept for the next commit (a buffer's worth of hash map, allocated once).
    spare: Option<HashMap<LedgerKey, i64, KeyHashing>>,
}

/// A buffer of ids being committed: written to a file by a background thread, then ingested by
/// whichever ledger call finds the thread done.
struct InFlight {
    record: CommitRecord,
    ids: std::sync::Arc<HashMap<LedgerKey, i64, KeyHashing>>,
    /// The progress records of the buffered batches (the newest per partition).
    progress: BTreeMap<u32, Vec<u8>>,
    /// The log of the batches in this commit, removed once it is applied.
    log: Option<PathBuf>,
    /// `None` once joined and failed: the next attempt writes the file on the caller's thread.
    job: Option<std::thread::JoinHandle<Result<PathBuf>>>,
}

/// Hashing of buffered keys: XXH3 with a random per-ledger seed (ids come from clients, so a
/// fixed hash would let them choose colliding ids). Several times cheaper than SipHash on
/// 16-byte keys.
#[derive(Clone)]
struct KeyHashing(u64);

struct KeyHasher {
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

/// A checked batch as the buffer and the batch log hold it: its new ids with their event times.
struct LoggedBatch {
    partition: u32,
    /// Base the active generation takes if this batch is its first.
    base_ms: i64,
    new_ids: Vec<(LedgerKey, i64)>,
    progress: Vec<u8>,
}

/// The ledger's own write-ahead log of buffered batches: `batches-<commit seq>.log` holds the
/// batches that commit will ingest. Records are `[payload length u32 LE][XXH3-64 of the payload
/// u64 LE][payload]`; a torn or corrupt record ends the log, so what replays is a prefix.
struct BatchLog {
    file: std::fs::File,
    path: PathBuf,
    buf: Vec<u8>,
}

const LOG_FILE_PREFIX: &str = "batches-";
const LOG_FILE_EXTENSION: &str = "log";
const LOG_RECORD_HEADER: usize = 12;

fn log_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{LOG_FILE_PREFIX}{seq:012}.{LOG_FILE_EXTENSION}"))
}

impl BatchLog {
    /// Opens (creating it if needed) the log of commit `seq`, keeping its first `len` bytes.
    fn open(dir: &Path, seq: u64, len: u64) -> Result<BatchLog> {
        let path = log_path(dir, seq);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_error("open", &path))?;
        file.set_len(len).map_err(io_error("truncate", &path))?;
        let mut log = BatchLog {
            file,
            path,
            buf: Vec::new(),
        };
        std::io::Seek::seek(&mut log.file, std::io::SeekFrom::Start(len))
            .map_err(io_error("seek in", &log.path))?;
        Ok(log)
    }

    fn append(&mut self, batch: &LoggedBatch, sync: bool) -> Result<()> {
        let buf = &mut self.buf;
        buf.clear();
        buf.resize(LOG_RECORD_HEADER, 0);
        buf.extend_from_slice(&batch.partition.to_le_bytes());
        buf.extend_from_slice(&batch.base_ms.to_le_bytes());
        buf.extend_from_slice(&(batch.progress.len() as u32).to_le_bytes());
        buf.extend_from_slice(&batch.progress);
        buf.extend_from_slice(&(batch.new_ids.len() as u32).to_le_bytes());
        for (key, time_ms) in &batch.new_ids {
            buf.extend_from_slice(&key.0);
            buf.extend_from_slice(&time_ms.to_le_bytes());
        }
        let payload_len = (buf.len() - LOG_RECORD_HEADER) as u32;
        let checksum = xxhash_rust::xxh3::xxh3_64(&buf[LOG_RECORD_HEADER..]);
        buf[..4].copy_from_slice(&payload_len.to_le_bytes());
        buf[4..LOG_RECORD_HEADER].copy_from_slice(&checksum.to_le_bytes());
        std::io::Write::write_all(&mut self.file, buf).map_err(io_error("append to", &self.path))?;
        if sync {
            self.file.sync_data().map_err(io_error("sync", &self.path))?;
        }
        Ok(())
    }

    /// The batches of a log, up to the first torn or corrupt record, and the length they take.
    fn read(path: &Path) -> Result<(Vec<LoggedBatch>, u64)> {
        let bytes = std::fs::read(path).map_err(io_error("read", path))?;
        let mut batches = Vec::new();
        let mut at = 0usize;
        while let Some(header) = bytes.get(at..at + LOG_RECORD_HEADER) {
            let len = u32::from_le_bytes(header[..4].try_into().unwrap_or_default()) as usize;
            let checksum = u64::from_le_bytes(header[4..].try_into().unwrap_or_default());
            let Some(payload) = bytes.get(at + LOG_RECORD_HEADER..at + LOG_RECORD_HEADER + len) else {
                break;
            };
            if xxhash_rust::xxh3::xxh3_64(payload) != checksum {
                break;
            }
            let Some(batch) = Self::parse(payload) else {
                break;
            };
            batches.push(batch);
            at += LOG_RECORD_HEADER + len;
        }
        Ok((batches, at as u64))
    }

    fn parse(payload: &[u8]) -> Option<LoggedBatch> {
        let mut rest = payload;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
            rest = tail;
            Some(head)
        };
        let partition = u32::from_le_bytes(take(4)?.try_into().ok()?);
        let base_ms = i64::from_le_bytes(take(8)?.try_into().ok()?);
        let progress_len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let progress = take(progress_len)?.to_vec();
        let count = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let mut new_ids = Vec::with_capacity(count.min(payload.len() / 24));
        for _ in 0..count {
            let key = LedgerKey(take(LEDGER_KEY_BYTES)?.try_into().ok()?);
            let time_ms = i64::from_le_bytes(take(8)?.try_into().ok()?);
            new_ids.push((key, time_ms));
        }
        Some(LoggedBatch {
            partition,
            base_ms,
            new_ids,
            progress,
        })
    }
}

/// The commit record ingested with a buffered run of ids ([`COMMIT_KEY`]): what the metadata
/// and progress column families must say once that file is in. Cumulative, so the newest one
/// alone restores them.
#[derive(Debug, Serialize, Deserialize)]
struct CommitRecord {
    seq: u64,
    meta: GenerationMeta,
    progress: BTreeMap<u32, Vec<u8>>,
}

type Db = DBWithThreadMode<MultiThreaded>;

/// Writes a commit's file: its ids sorted, then its commit record. Needs nothing of the open
/// database, so it runs on a thread of its own.
struct CommitWriter {
    file: PathBuf,
    options: Options,
    base_ms: i64,
    record: Vec<u8>,
    ids: std::sync::Arc<HashMap<LedgerKey, i64, KeyHashing>>,
}

impl CommitWriter {
    fn new(
        ledger: &Ledger,
        record: &CommitRecord,
        ids: std::sync::Arc<HashMap<LedgerKey, i64, KeyHashing>>,
    ) -> CommitWriter {
        CommitWriter {
            file: ledger
                .path
                .join(format!("commit-{:012}.{INGEST_FILE_EXTENSION}", record.seq)),
            options: ingest_file_options(&ledger.options, &ledger.block_cache),
            base_ms: record.meta.base_ms.unwrap_or(0),
            record: to_json(record),
            ids,
        }
    }

    fn write(self) -> Result<PathBuf> {
        let mut ids: Vec<(LedgerKey, i64)> = self.ids.iter().map(|(k, t)| (*k, *t)).collect();
        ids.sort_unstable_by_key(|(k, _)| *k);
        let written = (|| {
            let mut writer = SstFileWriter::create(&self.options);
            writer.open(&self.file)?;
            let mut value = Vec::with_capacity(4);
            for (key, t) in &ids {
                value.clear();
                encode_first_seen(self.base_ms, *t, &mut value);
                writer.put(key.0, &value)?;
            }
            writer.put(COMMIT_KEY, &self.record)?;
            writer.finish()
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&self.file);
        }
        written.map_err(rocks(Doing::Write))?;
        Ok(self.file)
    }
}

/// The ledger. `Send + Sync`: all methods take `&self` and serialize on an internal lock.
pub struct Ledger {
    db: Db,
    path: PathBuf,
    options: LedgerOptions,
    block_cache: Cache,
    state: Mutex<State>,
    /// Keys looked up in a generation's column family (the id index could not rule them out).
    disk_lookups: std::sync::atomic::AtomicU64,
}

fn generation_cf_name(id: u64) -> String {
    format!("{GENERATION_CF_PREFIX}{id:012}")
}

fn generation_meta_key(id: u64) -> Vec<u8> {
    let mut key = META_GENERATION_PREFIX.to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

fn progress_key(partition: u32) -> [u8; 4] {
    partition.to_be_bytes()
}

/// Stored offset of an event time relative to a generation base (zigzag varint, seconds).
fn encode_first_seen(base_ms: i64, first_seen_ms: i64, out: &mut Vec<u8>) {
    let delta = first_seen_ms.saturating_sub(base_ms).div_euclid(FIRST_SEEN_RESOLUTION_MS);
    let mut zz = ((delta << 1) ^ (delta >> 63)) as u64;
    loop {
        let byte = (zz & 0x7f) as u8;
        zz >>= 7;
        if zz == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn decode_first_seen(base_ms: i64, bytes: &[u8]) -> Result<i64> {
    let mut zz: u64 = 0;
    for (i, byte) in bytes.iter().enumerate() {
        if i >= 10 {
            break;
        }
        zz |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let delta = ((zz >> 1) as i64) ^ -((zz & 1) as i64);
            return Ok(base_ms.saturating_add(delta.saturating_mul(FIRST_SEEN_RESOLUTION_MS)));
        }
    }
    Err(LedgerError::CorruptMetadata {
        what: format!("a stored first-seen time is not a varint: {bytes:?}"),
    })
}

/// The first-seen time a later lookup will report for an id recorded at `first_seen_ms`.
pub fn stored_first_seen_ms(base_ms: i64, first_seen_ms: i64) -> i64 {
    base_ms.saturating_add(
        first_seen_ms
            .saturating_sub(base_ms)
            .div_euclid(FIRST_SEEN_RESOLUTION_MS)
            .saturating_mul(FIRST_SEEN_RESOLUTION_MS),
    )
}

fn db_options(options: &LedgerOptions, create: bool) -> Options {
    let mut db = Options::default();
    db.create_if_missing(create);
    db.create_missing_column_families(create);
    db.set_atomic_flush(true);
    // One writer at a time (the ledger lock); hash memtables require this.
    db.set_allow_concurrent_memtable_write(false);
    db.set_max_background_jobs(options.background_jobs);
    let memtables_bytes = effective_write_buffer_bytes(options)
        * usize::try_from(options.max_write_buffers.max(1)).unwrap_or(1);
    db.set_db_write_buffer_size(memtables_bytes);
    db.set_max_total_wal_size(memtables_bytes as u64);
    db.set_keep_log_file_num(4);
    db.set_max_log_file_size(16 << 20);
    db.set_log_level(rocksdb::LogLevel::Warn);
    db
}

/// A memtable never holds more than half a generation, so a small budget is not exceeded by
/// memtables and the WAL that backs them.
fn effective_write_buffer_bytes(options: &LedgerOptions) -> usize {
    let half_generation = usize::try_from(options.generation_target_bytes() / 2).unwrap_or(usize::MAX);
    options.write_buffer_bytes.min(half_generation.max(1 << 20))
}

fn small_cf_options() -> Options {
    let mut cf = Options::default();
    cf.set_write_buffer_size(4 << 20);
    cf
}

fn generation_cf_options(options: &LedgerOptions, cache: &Cache) -> Options {
    generation_options(options, cache, true)
}

/// Options of the files ingested into a generation: the same table format with a bloom filter,
/// which is several times cheaper to build than a ribbon filter. These files stay in L0 while
/// their generation is active; its compaction at seal rewrites them into one run without filters.
fn ingest_file_options(options: &LedgerOptions, cache: &Cache) -> Options {
    generation_options(options, cache, false)
}

fn generation_options(options: &LedgerOptions, cache: &Cache, ribbon: bool) -> Options {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    if ribbon {
        table.set_ribbon_filter(options.filter_bits_per_key);
    } else {
        table.set_bloom_filter(options.filter_bits_per_key, false);
    }
    table.set_whole_key_filtering(true);
    // Filters and indexes stay with the table readers: bounded by ids held, never evicted.
    table.set_cache_index_and_filter_blocks(false);
    table.set_block_size(16 << 10);
    table.set_format_version(6);
    table.set_block_restart_interval(options.block_restart_interval);
    let mut cf = Options::default();
    cf.set_block_based_table_factory(&table);
    cf.set_compression_type(DBCompressionType::Zstd);
    // Most of an entry is its 16 random key bytes; ZSTD's entropy coding packs the rest (entry
    // headers, the zeroed sequence numbers, the first-seen offsets) far better than LZ4: 17.7
    // bytes per id at 20M ids, against 20.9 with LZ4 and ribbon filters (~0.9 of those).
    cf.set_compression_options(-14, ZSTD_LEVEL, 0, 0);
    cf.set_bottommost_compression_type(DBCompressionType::Zstd);
    cf.set_bottommost_compression_options(-14, ZSTD_LEVEL, 0, 0, true);
    cf.set_write_buffer_size(effective_write_buffer_bytes(options));
    cf.set_max_write_buffer_number(options.max_write_buffers);
    if options.memtable == MemtableKind::HashLinkList {
        // The "prefix" is the whole key, so it adds nothing to the filters.
        cf.set_prefix_extractor(rocksdb::SliceTransform::create_fixed_prefix(LEDGER_KEY_BYTES));
        cf.set_memtable_factory(rocksdb::MemtableFactory::HashLinkList {
            bucket_count: (options.write_buffer_bytes / 48).max(1024),
        });
    }
    cf.set_memtable_prefix_bloom_ratio(0.1);
    cf.set_memtable_whole_key_filtering(true);
    cf.set_target_file_size_base(64 << 20);
    // The active generation is never compacted: each commit adds one sorted file (L0) with its
    // own filter, and lookups reach it only for ids the id index names. Compacting as it grows
    // would rewrite the generation once per few commits. When it is sealed, it is compacted once
    // into a single sorted run in the last level ([`Ledger::compact_when_sealed`]).
    cf.set_disable_auto_compactions(true);
    cf.set_level_zero_slowdown_writes_trigger(1 << 20);
    cf.set_level_zero_stop_writes_trigger(1 << 20);
    cf.set_soft_pending_compaction_bytes_limit(0);
    cf.set_hard_pending_compaction_bytes_limit(0);
    // With dynamic level sizes and a base level as large as a generation, the sealed
    // generation's compaction goes straight into the last level. That run has no filter: the id
    // index sends a lookup there only for ids it holds (or, rarely, a fingerprint collision),
    // which a filter would not turn away.
    cf.set_level_compaction_dynamic_level_bytes(true);
    cf.set_max_bytes_for_level_base(options.generation_target_bytes().max(256 << 20));
    cf.set_optimize_filters_for_hits(true);
    cf
}

/// A file present in the ledger directory only while the ledger is being created.
pub const CREATING_MARKER: &str = "CREATING";

/// Writes `name` in `dir` and makes both the file and its directory entry durable.
fn write_durably(dir: &Path, name: &str, contents: &[u8]) -> Result<()> {
    use std::io::Write;
    let path = dir.join(name);
    let mut file = std::fs::File::create(&path).map_err(io_error("create", &path))?;
    file.write_all(contents).and_then(|()| file.sync_all()).map_err(io_error("write", &path))?;
    sync_dir(dir)
}

/// Removes `name` from `dir` and makes the removal durable.
fn remove_durably(dir: &Path, name: &str) -> Result<()> {
    let path = dir.join(name);
    std::fs::remove_file(&path).map_err(io_error("remove", &path))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_error("sync", dir))
}

/// Removes everything inside `dir` (which is kept).
fn clear_dir(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(io_error("read", dir))? {
        let entry = entry.map_err(io_error("read", dir))?;
        let path = entry.path();
        let removed = if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(io_error("clear", &path))?;
    }
    sync_dir(dir)
}

/// ZSTD level of generation files. Measured at 20M ids: level 3 stores 17.7 bytes per id, level 1
/// 18.5, at the same throughput (compression is a small share of the CPU).
const ZSTD_LEVEL: i32 = 3;

fn parse_json<T: for<'de> Deserialize<'de>>(what: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| LedgerError::CorruptMetadata {
        what: format!("{what}: {e}"),
    })
}

fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing these plain structs and maps with integer keys cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

impl Ledger {
    /// Opens the ledger at `path`, creating it if the directory is missing or empty.
    ///
    /// Creating is atomic: a [`CREATING_MARKER`] file is made durable before RocksDB writes
    /// anything, and removed only once the format marker is durable. A directory that still holds
    /// the marker is a creation that a crash interrupted; it can hold no recorded id (nothing is
    /// recorded before `open` returns), so it is cleared and created again, with a warning and
    /// [`crate::metrics::LEDGER_CREATIONS_RESTARTED`] counted.
    pub fn open(path: impl AsRef<Path>, options: LedgerOptions) -> Result<Ledger> {
        Self::open_inner(path.as_ref(), options, true)
    }

    /// Opens an existing ledger, never creating one: a missing or empty directory is refused
    /// with [`LedgerError::NotALedger`]. For maintenance commands that read a ledger or a
    /// checkpoint an operator named, where a typo must not make an empty ledger.
    pub fn open_existing(path: impl AsRef<Path>, options: LedgerOptions) -> Result<Ledger> {
        Self::open_inner(path.as_ref(), options, false)
    }

    fn open_inner(path: &Path, options: LedgerOptions, create: bool) -> Result<Ledger> {
        let path = path.to_path_buf();
        let refuse = |reason: &str| LedgerError::NotALedger { path: path.clone(), reason: reason.into() };
        let mut fresh = match std::fs::read_dir(&path) {
            Ok(mut entries) => entries.next().is_none(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                std::fs::create_dir_all(&path).map_err(io_error("create", &path))?;
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(refuse("the directory does not exist")),
            Err(e) => return Err(io_error("read", &path)(e)),
        };
        if fresh && !create {
            return Err(refuse("the directory is empty"));
        }
        if !fresh && path.join(CREATING_MARKER).exists() {
            if !create {
                return Err(refuse("its creation never finished (a crash during the first start)"));
            }
            tracing::warn!(
                path = %path.display(),
                "The ledger's creation was interrupted by a crash before it held any id; creating it again."
            );
            metrics::counter!(crate::metrics::LEDGER_CREATIONS_RESTARTED).increment(1);
            clear_dir(&path)?;
            fresh = true;
        }
        if fresh {
            write_durably(&path, CREATING_MARKER, b"this ledger is being created\n")?;
        }
        if !fresh && !path.join("CURRENT").exists() {
            return Err(LedgerError::NotALedger {
                path,
                reason: "the directory is not empty and has no CURRENT file".into(),
            });
        }
        let db_opts = db_options(&options, fresh);
        let names = if fresh {
            vec![CF_META.to_string(), CF_PROGRESS.to_string()]
        } else {
            let names = Db::list_cf(&db_opts, &path).map_err(rocks(Doing::Open(&path)))?;
            if !names.iter().any(|n| n == CF_META) || !names.iter().any(|n| n == CF_PROGRESS) {
                // Either damage (e.g. a truncated MANIFEST lists fewer column families) or a
                // foreign database. A read-only open, which writes nothing, tells them apart and
                // gives RocksDB's reason.
                Db::open_cf_for_read_only(&db_opts, &path, &names, false)
                    .map_err(rocks(Doing::Open(&path)))?;
                return Err(LedgerError::NotALedger {
                    path,
                    reason: format!("its MANIFEST lists no {CF_META} and {CF_PROGRESS} column families (a damaged MANIFEST, or another database)"),
                });
            }
            names
        };
        let block_cache = Cache::new_lru_cache(options.block_cache_bytes);
        let descriptors = names.iter().filter(|n| n.as_str() != "default").map(|name| {
            let cf_opts = if name.starts_with(GENERATION_CF_PREFIX) {
                generation_cf_options(&options, &block_cache)
            } else {
                small_cf_options()
            };
            ColumnFamilyDescriptor::new(name, cf_opts)
        });
        let db = Db::open_cf_descriptors(&db_opts, &path, descriptors)
            .map_err(rocks(Doing::Open(&path)))?;
        let index = if options.build_index {
            IdIndex::new(options.index_capacity(), rand::random())
        } else {
            IdIndex::unknowing()
        };
        let ledger = Ledger {
            db,
            path,
            options,
            block_cache,
            state: Mutex::new(State {
                generations: Vec::new(),
                forgotten: BTreeMap::new(),
                pending: HashMap::with_hasher(KeyHashing(rand::random())),
                pending_progress: BTreeMap::new(),
                pending_batches: 0,
                commit_seq: 0,
                log: None,
                index,
                in_flight: None,
                spare: None,
            }),
            disk_lookups: std::sync::atomic::AtomicU64::new(0),
        };
        ledger.load(fresh, &names)?;
        if fresh {
            // The format marker must be on disk before the creation marker goes: without a WAL
            // it is only in a memtable until flushed.
            ledger.flush_cfs(&[CF_META, CF_PROGRESS], true)?;
            remove_durably(&ledger.path, CREATING_MARKER)?;
        }
        Ok(ledger)
    }

    /// True if the ledger has no progress record and no generation holds a key.
    fn holds_nothing(&self, cf_names: &[String]) -> Result<bool> {
        let holders = cf_names.iter().filter(|n| n.starts_with(GENERATION_CF_PREFIX)).map(String::as_str);
        for name in std::iter::once(CF_PROGRESS).chain(holders) {
            let cf = self.cf(name)?;
            if let Some(item) = self.db.iterator_cf(&cf, rocksdb::IteratorMode::Start).next() {
                item.map_err(rocks(Doing::Read))?;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Reads the format marker and generation metadata, and reconciles them with the column
    /// families (a crash can leave a generation created but not yet described, or described but
    /// already dropped).
    fn load(&self, fresh: bool, cf_names: &[String]) -> Result<()> {
        let meta = self.cf(CF_META)?;
        let sync = self.sync_write_options();
        match self.db.get_cf(&meta, META_FORMAT_VERSION).map_err(rocks(Doing::Read))? {
            Some(bytes) => {
                let found = <[u8; 4]>::try_from(bytes.as_slice())
                    .map(u32::from_le_bytes)
                    .map_err(|_| LedgerError::CorruptMetadata {
                        what: format!("format version is {} bytes, not 4", bytes.len()),
                    })?;
                if !(OLDEST_READABLE_FORMAT_VERSION..=FORMAT_VERSION).contains(&found) {
                    return Err(LedgerError::UnknownFormat { found });
                }
                if found != FORMAT_VERSION {
                    // The older format's data reads as is; from now on batch logs and commit
                    // records are written, which older code would ignore.
                    let mut batch = WriteBatch::default();
                    batch.put_cf(&meta, META_FORMAT_VERSION, FORMAT_VERSION.to_le_bytes());
                    self.db.write_opt(batch, &sync).map_err(rocks(Doing::Write))?;
                    self.flush_cfs(&[CF_META], true)?;
                }
            }
            None if fresh => {
                let mut batch = WriteBatch::default();
                batch.put_cf(&meta, META_FORMAT_VERSION, FORMAT_VERSION.to_le_bytes());
                self.db.write_opt(batch, &sync).map_err(rocks(Doing::Write))?;
            }
            None if self.holds_nothing(cf_names)? => {
                // Left by a build whose creation was not atomic, killed before the marker was
                // written: no generation, no progress record, no metadata; nothing to lose.
                tracing::warn!(
                    path = %self.path.display(),
                    "The ledger has no format marker and holds nothing (a creation interrupted by a crash); initializing it."
                );
                metrics::counter!(crate::metrics::LEDGER_CREATIONS_RESTARTED).increment(1);
                let mut batch = WriteBatch::default();
                batch.put_cf(&meta, META_FORMAT_VERSION, FORMAT_VERSION.to_le_bytes());
                self.db.write_opt(batch, &sync).map_err(rocks(Doing::Write))?;
                self.flush_cfs(&[CF_META], true)?;
            }
            None => {
                return Err(LedgerError::CorruptMetadata {
                    what: "the format version marker is missing, yet the ledger holds generations or progress records".into(),
                })
            }
        }
        let mut forgotten: BTreeMap<u32, i64> =
            match self.db.get_cf(&meta, META_FORGOTTEN).map_err(rocks(Doing::Read))? {
                Some(bytes) => parse_json("forgotten", &bytes)?,
                None => BTreeMap::new(),
            };
        let mut metas = BTreeMap::new();
        for item in self.db.prefix_iterator_cf(&meta, META_GENERATION_PREFIX) {
            let (key, value) = item.map_err(rocks(Doing::Read))?;
            if !key.starts_with(META_GENERATION_PREFIX) {
                break;
            }
            let gm: GenerationMeta = parse_json("generation metadata", &value)?;
            metas.insert(gm.id, gm);
        }
        drop(meta);
        let mut generations = Vec::new();
        let mut batch = WriteBatch::default();
        let meta = self.cf(CF_META)?;
        // Described but gone: its drop finished, the metadata deletion did not survive.
        for (id, gm) in &metas {
            if !cf_names.contains(&generation_cf_name(*id)) {
                for (p, span) in &gm.partitions {
                    let f = forgotten.entry(*p).or_insert(span.last_seen_ms);
                    *f = (*f).max(span.last_seen_ms);
                }
                batch.delete_cf(&meta, generation_meta_key(*id));
            }
        }
        batch.put_cf(&meta, META_FORGOTTEN, to_json(&forgotten));
        self.db.write_opt(batch, &sync).map_err(rocks(Doing::Write))?;
        drop(meta);
        for name in cf_names.iter().filter(|n| n.starts_with(GENERATION_CF_PREFIX)) {
            let id: Option<u64> = name[GENERATION_CF_PREFIX.len()..].parse().ok();
            match id.and_then(|id| metas.remove(&id)) {
                Some(gm) => generations.push(Generation {
                    name: name.clone(),
                    meta: gm,
                }),
                // Present but never described (created just before a crash) or described no
                // more (being dropped): it holds nothing the ledger vouches for.
                None => self
                    .db
                    .drop_cf(name)
                    .map_err(rocks(Doing::Generation("drop", name)))?,
            }
        }
        generations.sort_by_key(|g| g.meta.id);
        let commit_seq = self.recover_commit(&mut generations)?;
        self.remove_ingest_leftovers()?;
        for g in generations.iter().filter(|g| g.meta.sealed) {
            self.compact_when_sealed(&g.name)?;
        }
        let mut state = self.lock();
        state.generations = generations;
        state.forgotten = forgotten;
        state.commit_seq = commit_seq;
        self.build_index(&mut state)?;
        if state.generations.last().is_none_or(|g| g.meta.sealed) {
            self.start_generation(&mut state)?;
        }
        self.replay_log(&mut state)?;
        if fresh && self.options.durability == Durability::NoWal {
            // Without a WAL the format marker and the first generation's metadata live only in
            // memtables until a flush: a crash before the first flush would leave column families
            // without their marker, which the next open must refuse as corrupt. Flush them now.
            self.flush_locked(&mut state)?;
        }
        Ok(())
    }

    /// Fills the id index with every id of every generation (the index is not stored). Reader
    /// threads (one per core, generations shared out among them) read the keys and work out their
    /// places; this thread inserts them, a prefetched run at a time.
    fn build_index(&self, state: &mut State) -> Result<()> {
        let started = std::time::Instant::now();
        let State {
            generations, index, ..
        } = state;
        for g in generations.iter() {
            index.start(IdIndex::tag(g.meta.id));
        }
        if !self.options.build_index || generations.is_empty() {
            return Ok(());
        }
        let generations: &[Generation] = generations;
        let readers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(generations.len());
        let placer = index.placer();
        let mut ids = 0u64;
        let mut failed = None;
        std::thread::scope(|scope| {
            let (tx, rx) = crossbeam_channel::bounded::<Result<(u8, Vec<index::Place>)>>(64);
            for r in 0..readers {
                let tx = tx.clone();
                scope.spawn(move || {
                    for g in generations.iter().skip(r).step_by(readers) {
                        let tag = IdIndex::tag(g.meta.id);
                        if let Err(e) = self.read_places(&g.name, tag, placer, &tx) {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                });
            }
            drop(tx);
            for message in rx {
                match message {
                    Ok((tag, places)) => {
                        ids += places.len() as u64;
                        for run in places.chunks(REBUILD_RUN) {
                            for place in run {
                                index.prefetch(place);
                            }
                            for place in run {
                                index.insert(place, tag);
                            }
                        }
                    }
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        tracing::info!(
            ids,
            elapsed_ms = started.elapsed().as_millis() as u64,
            overflowed_buckets = index.overflowed_buckets(),
            "rebuilt the ledger's id index"
        );
        Ok(())
    }

    /// Reads a generation's keys and sends their index places, in chunks.
    fn read_places(
        &self,
        name: &str,
        tag: u8,
        placer: index::Placer,
        tx: &crossbeam_channel::Sender<Result<(u8, Vec<index::Place>)>>,
    ) -> Result<()> {
        const CHUNK: usize = 16 << 10;
        let cf = self.cf(name)?;
        let mut read = rocksdb::ReadOptions::default();
        read.fill_cache(false);
        read.set_readahead_size(4 << 20);
        let mut iter = self.db.raw_iterator_cf_opt(&cf, read);
        iter.seek_to_first();
        let mut chunk = Vec::with_capacity(CHUNK);
        while let Some(key) = iter.key() {
            if let Ok(key) = <[u8; LEDGER_KEY_BYTES]>::try_from(key) {
                chunk.push(placer.place(&LedgerKey(key)));
                if chunk.len() == CHUNK {
                    let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
                    // The receiver only goes away once every sender has.
                    let _ = tx.send(Ok((tag, full)));
                }
            }
            iter.next();
        }
        iter.status().map_err(rocks(Doing::Read))?;
        if !chunk.is_empty() {
            let _ = tx.send(Ok((tag, chunk)));
        }
        Ok(())
    }

    /// A buffered run of ids becomes durable when its file is ingested; the metadata and progress
    /// records that go with it are written (and flushed) just after. If a crash fell between the
    /// two, the file's commit record says what they must be: apply it. Returns the sequence
    /// number of the last commit applied.
    fn recover_commit(&self, generations: &mut [Generation]) -> Result<u64> {
        let meta_cf = self.cf(CF_META)?;
        let applied = match self.db.get_cf(&meta_cf, META_COMMIT_SEQ).map_err(rocks(Doing::Read))? {
            Some(bytes) => <[u8; 8]>::try_from(bytes.as_slice())
                .map(u64::from_le_bytes)
                .map_err(|_| LedgerError::CorruptMetadata {
                    what: format!("commit sequence is {} bytes, not 8", bytes.len()),
                })?,
            None => 0,
        };
        let mut newest: Option<(usize, CommitRecord)> = None;
        for (i, g) in generations.iter().enumerate() {
            let cf = self.cf(&g.name)?;
            if let Some(bytes) = self.db.get_cf(&cf, COMMIT_KEY).map_err(rocks(Doing::Read))? {
                let record: CommitRecord = parse_json("commit record", &bytes)?;
                if newest.as_ref().is_none_or(|(_, n)| record.seq > n.seq) {
                    newest = Some((i, record));
                }
            }
        }
        let Some((i, record)) = newest.filter(|(_, r)| r.seq > applied) else {
            return Ok(applied);
        };
        let mut meta = record.meta;
        meta.sealed |= generations[i].meta.sealed;
        let mut batch = WriteBatch::default();
        batch.put_cf(&meta_cf, generation_meta_key(meta.id), to_json(&meta));
        batch.put_cf(&meta_cf, META_COMMIT_SEQ, record.seq.to_le_bytes());
        let progress_cf = self.cf(CF_PROGRESS)?;
        for (partition, value) in &record.progress {
            batch.put_cf(&progress_cf, progress_key(*partition), value);
        }
        self.db
            .write_opt(batch, &self.sync_write_options())
            .map_err(rocks(Doing::Write))?;
        self.flush_cfs(&[CF_META, CF_PROGRESS], true)?;
        generations[i].meta = meta;
        Ok(record.seq)
    }

    /// Replays the batch log of the next commit into the buffer and commits it at once (a clean
    /// start for the new log), removes logs of earlier commits, and opens the log when there is
    /// a WAL.
    fn replay_log(&self, state: &mut State) -> Result<()> {
        // Two logs can be there: one of a commit that was in flight, and the next. They are
        // replayed in order, each committed on its own. A torn log ends the replay: batches after
        // a lost one must not survive it (the later log may have reached the disk first).
        loop {
            let next = log_path(&self.path, state.commit_seq + 1);
            if !next.exists() {
                break;
            }
            let (batches, valid) = BatchLog::read(&next)?;
            let torn = std::fs::metadata(&next).map_err(io_error("read", &next))?.len() > valid;
            for batch in batches {
                self.record_buffered(state, batch);
            }
            let before = state.commit_seq;
            self.commit_pending(state)?;
            if torn || state.commit_seq == before {
                break;
            }
        }
        for entry in std::fs::read_dir(&self.path).map_err(io_error("read", &self.path))? {
            let path = entry.map_err(io_error("read", &self.path))?.path();
            let seq = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix(LOG_FILE_PREFIX))
                .and_then(|n| n.strip_suffix(LOG_FILE_EXTENSION))
                .and_then(|n| n.strip_suffix('.'))
                .and_then(|n| n.parse::<u64>().ok());
            // Logs of commits already made, and a torn log just replayed and committed.
            if seq.is_some_and(|seq| seq <= state.commit_seq) {
                std::fs::remove_file(&path).map_err(io_error("remove", &path))?;
            }
        }
        if self.options.durability != Durability::NoWal && state.log.is_none() {
            state.log = Some(BatchLog::open(&self.path, state.commit_seq + 1, 0)?);
        }
        Ok(())
    }

    /// Files written for an ingestion that a crash interrupted.
    fn remove_ingest_leftovers(&self) -> Result<()> {
        for entry in std::fs::read_dir(&self.path).map_err(io_error("read", &self.path))? {
            let path = entry.map_err(io_error("read", &self.path))?.path();
            if path.extension().is_some_and(|e| e == INGEST_FILE_EXTENSION) {
                std::fs::remove_file(&path).map_err(io_error("remove", &path))?;
            }
        }
        Ok(())
    }

    fn flush_cfs(&self, names: &[&str], wait: bool) -> Result<()> {
        let handles = names.iter().map(|n| self.cf(n)).collect::<Result<Vec<_>>>()?;
        let refs: Vec<_> = handles.iter().collect();
        let mut flush = FlushOptions::default();
        flush.set_wait(wait);
        self.db
            .flush_cfs_opt(&refs, &flush)
            .map_err(rocks(Doing::Write))
    }

    /// Makes the buffered ids, progress records and metadata durable together, on the caller's
    /// thread: a commit in flight is finished first, then the buffer is committed.
    fn commit_pending(&self, state: &mut State) -> Result<()> {
        self.finish_in_flight(state, true)?;
        if self.take_commit(state, false)? {
            self.finish_in_flight(state, true)?;
        }
        Ok(())
    }

    /// Starts committing the buffer in the background: the file is written by another thread
    /// while batches keep being recorded into a fresh buffer. A previous commit still in flight
    /// is finished first.
    fn start_commit(&self, state: &mut State) -> Result<()> {
        self.finish_in_flight(state, true)?;
        self.take_commit(state, true)?;
        Ok(())
    }

    /// Moves the buffer into a commit in flight; with `background`, its file is written by a
    /// new thread. False when there was nothing to commit.
    fn take_commit(&self, state: &mut State, background: bool) -> Result<bool> {
        debug_assert!(state.in_flight.is_none());
        if state.pending.is_empty() && state.pending_progress.is_empty() {
            return Ok(false);
        }
        let seq = state.commit_seq + 1;
        let Some(active) = state.generations.last() else {
            return Ok(false);
        };
        let mut progress = self.durable_progress()?;
        progress.extend(state.pending_progress.iter().map(|(p, v)| (*p, v.clone())));
        let record = CommitRecord {
            seq,
            meta: active.meta.clone(),
            progress,
        };
        // Batches recorded from now on go to the next commit's log.
        let log = match state.log.take() {
            Some(old) => {
                state.log = Some(BatchLog::open(&self.path, seq + 1, 0)?);
                Some(old.path)
            }
            None => None,
        };
        let fresh = match state.spare.take() {
            Some(map) => map,
            None => HashMap::with_capacity_and_hasher(state.pending.capacity(), state.pending.hasher().clone()),
        };
        let ids = std::sync::Arc::new(std::mem::replace(&mut state.pending, fresh));
        let job = if background {
            let writer = CommitWriter::new(self, &record, ids.clone());
            let spawned = std::thread::Builder::new()
                .name("ledger-commit".into())
                .spawn(move || writer.write());
            // Without a thread, the file is written on the caller's thread when finishing.
            spawned.ok()
        } else {
            None
        };
        state.in_flight = Some(InFlight {
            record,
            ids,
            progress: std::mem::take(&mut state.pending_progress),
            log,
            job,
        });
        state.pending_batches = 0;
        Ok(true)
    }

    /// Applies the commit in flight, if any: waits for its file (or, with `wait` false, returns
    /// at once if it is not written yet), ingests it into its generation (the atomic step), then
    /// brings the metadata and progress column families in line and flushes them. On an error the
    /// commit stays in flight (its ids keep answering lookups, its log stays on disk) and the
    /// next call retries it.
    fn finish_in_flight(&self, state: &mut State, wait: bool) -> Result<()> {
        let Some(in_flight) = state.in_flight.as_mut() else {
            return Ok(());
        };
        let written = match in_flight.job.take() {
            Some(job) if !wait && !job.is_finished() => {
                in_flight.job = Some(job);
                return Ok(());
            }
            Some(job) => job.join().unwrap_or_else(|_| {
                Err(LedgerError::CorruptMetadata {
                    what: "the commit thread panicked".into(),
                })
            }),
            None => CommitWriter::new(self, &in_flight.record, in_flight.ids.clone()).write(),
        };
        let file = written?;
        let record = &in_flight.record;
        let mut ingest = IngestExternalFileOptions::default();
        ingest.set_move_files(true);
        let cf = self.cf(&generation_cf_name(record.meta.id))?;
        let ingested = self
            .db
            .ingest_external_file_cf_opts(&cf, &ingest, vec![file.clone()])
            .map_err(rocks(Doing::Write));
        drop(cf);
        if ingested.is_err() {
            let _ = std::fs::remove_file(&file);
        }
        ingested?;
        #[cfg(test)]
        if std::env::var_os(tests::CRASH_AFTER_INGEST_ENV).is_some() {
            // The crash test's child dies between the atomic step and the bookkeeping after it.
            std::process::abort();
        }
        let meta_cf = self.cf(CF_META)?;
        let progress_cf = self.cf(CF_PROGRESS)?;
        let mut batch = WriteBatch::default();
        batch.put_cf(&meta_cf, generation_meta_key(record.meta.id), to_json(&record.meta));
        batch.put_cf(&meta_cf, META_COMMIT_SEQ, record.seq.to_le_bytes());
        for (partition, value) in &in_flight.progress {
            batch.put_cf(&progress_cf, progress_key(*partition), value);
        }
        drop((meta_cf, progress_cf));
        self.db
            .write_opt(batch, &self.write_options())
            .map_err(rocks(Doing::Write))?;
        state.commit_seq = record.seq;
        // Everything written to the small column families before (generation starts, seals,
        // forgetting) goes with it: one atomic flush.
        self.flush_all(state, true)?;
        let Some(done) = state.in_flight.take() else {
            return Ok(());
        };
        // The committed batches' log is not needed any more.
        if let Some(log) = &done.log {
            std::fs::remove_file(log).map_err(io_error("remove", log))?;
        }
        // Keeps its capacity: the next buffer fills it without rehashing.
        if let Ok(mut map) = std::sync::Arc::try_unwrap(done.ids) {
            map.clear();
            state.spare = Some(map);
        }
        Ok(())
    }

    /// Progress records in the progress column family.
    fn durable_progress(&self) -> Result<BTreeMap<u32, Vec<u8>>> {
        let cf = self.cf(CF_PROGRESS)?;
        let mut all = BTreeMap::new();
        for item in self.db.iterator_cf(&cf, rocksdb::IteratorMode::Start) {
            let (key, value) = item.map_err(rocks(Doing::Read))?;
            let partition = <[u8; 4]>::try_from(&key[..])
                .map(u32::from_be_bytes)
                .map_err(|_| LedgerError::CorruptMetadata {
                    what: format!("progress key {key:?} is not a partition number"),
                })?;
            all.insert(partition, value.to_vec());
        }
        Ok(all)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves no half-applied state: the in-memory state is
        // only changed after the RocksDB write succeeded.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn cf(&self, name: &str) -> Result<std::sync::Arc<rocksdb::BoundColumnFamily<'_>>> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| LedgerError::CorruptMetadata {
                what: format!("column family {name} is missing"),
            })
    }

    fn write_options(&self) -> WriteOptions {
        let mut w = WriteOptions::default();
        match self.options.durability {
            Durability::SyncWal => w.set_sync(true),
            Durability::Wal => {}
            Durability::NoWal => w.disable_wal(true),
        }
        w
    }

    /// For rare metadata changes that must not be lost: synced when there is a WAL.
    fn sync_write_options(&self) -> WriteOptions {
        let mut w = WriteOptions::default();
        match self.options.durability {
            Durability::NoWal => w.disable_wal(true),
            _ => w.set_sync(true),
        }
        w
    }

    fn start_generation(&self, state: &mut State) -> Result<()> {
        let id = state.generations.last().map_or(1, |g| g.meta.id + 1);
        let name = generation_cf_name(id);
        self.db
            .create_cf(&name, &generation_cf_options(&self.options, &self.block_cache))
            .map_err(rocks(Doing::Generation("create", &name)))?;
        let meta = GenerationMeta {
            id,
            base_ms: None,
            sealed: false,
            ids: 0,
            partitions: BTreeMap::new(),
        };
        let mut batch = WriteBatch::default();
        batch.put_cf(&self.cf(CF_META)?, generation_meta_key(id), to_json(&meta));
        self.db
            .write_opt(batch, &self.write_options())
            .map_err(rocks(Doing::Write))?;
        state.index.start(IdIndex::tag(id));
        state.generations.push(Generation { name, meta });
        Ok(())
    }

    /// Looks up sorted, distinct keys. Returns the first-seen time of each key held.
    ///
    /// The id index answers most keys ("not held") from memory. The others are looked up in the
    /// buffer and in RocksDB, only in the generations the index names (in every generation, newest
    /// first, when the index cannot tell).
    fn lookup_sorted(&self, state: &State, keys: &[LedgerKey]) -> Result<Vec<Option<i64>>> {
        /// Keys whose buckets are prefetched ahead of the one being probed.
        const PREFETCH_AHEAD: usize = 8;
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
        for place in places.iter().take(PREFETCH_AHEAD) {
            index.prefetch(place);
        }
        for (i, place) in places.iter().enumerate() {
            if let Some(ahead) = places.get(i + PREFETCH_AHEAD) {
                index.prefetch(ahead);
            }
            let (tags, len, every) = match index.probe(place) {
                Probe::Absent => continue,
                Probe::Maybe { tags, len } => (tags, usize::from(len), false),
                Probe::Unknown => ([0; 4], 0, true),
            };
            if every || tags[..len].iter().any(|t| Some(*t) == active_tag) {
                let buffered = state.pending.get(&keys[i]).or_else(|| {
                    state.in_flight.as_ref().and_then(|f| f.ids.get(&keys[i]))
                });
                if let Some(&t) = buffered {
                    found[i] = Some(t);
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
            let Some(base_ms) = generation.meta.base_ms else {
                continue;
            };
            // Found in a newer generation already: an id lives in one generation only, but an
            // index false positive can name an older one too.
            let list: Vec<usize> = list.iter().copied().filter(|&i| found[i].is_none()).collect();
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
                    found[i] = Some(decode_first_seen(base_ms, &value)?);
                }
            }
        }
        Ok(found)
    }

    /// Looks keys up without recording anything: the first-seen time of each key held.
    pub fn check(&self, keys: &[LedgerKey]) -> Result<Vec<Option<i64>>> {
        let (sorted, slot) = sort_distinct(keys.iter().copied());
        let state = self.lock();
        let found = self.lookup_sorted(&state, &sorted)?;
        Ok(slot.into_iter().map(|s| found[s]).collect())
    }

    /// Checks a batch of one partition's ids (key, event time ms) and records the new ones,
    /// together with the partition's progress record, in one atomic write.
    pub fn check_and_record(
        &self,
        partition: u32,
        items: &[(LedgerKey, i64)],
        progress: &[u8],
    ) -> Result<Vec<Verdict>> {
        let (sorted, slot) = sort_distinct(items.iter().map(|(k, _)| *k));
        let mut state = self.lock();
        // Commits happen before this batch is recorded, so that an error (worth a retry) always
        // means the batch was not recorded: a finished background commit is applied, and a full
        // buffer starts the next one.
        self.finish_in_flight(&mut state, false)?;
        let buffered_bytes = state.pending.len() as u64 * DEFAULT_BYTES_PER_ID_ESTIMATE
            + state.pending_batches * BUFFERED_BATCH_OVERHEAD_BYTES;
        if buffered_bytes >= effective_write_buffer_bytes(&self.options) as u64 {
            self.start_commit(&mut state)?;
        }
        let found = self.lookup_sorted(&state, &sorted)?;

        let active_index = state.generations.len() - 1;
        let active = &state.generations[active_index];
        let base_ms = active
            .meta
            .base_ms
            .or_else(|| items.first().map(|(_, t)| *t))
            .unwrap_or(0);
        // Time each distinct key is recorded at in this batch, if it is new.
        let mut recorded: Vec<Option<i64>> = vec![None; sorted.len()];
        let mut verdicts = Vec::with_capacity(items.len());
        let mut new_ids: Vec<(LedgerKey, i64)> = Vec::with_capacity(items.len());
        for ((key, time_ms), &s) in items.iter().zip(&slot) {
            if let Some(first_seen_ms) = found[s].or(recorded[s]) {
                verdicts.push(Verdict::Duplicate { first_seen_ms });
                continue;
            }
            recorded[s] = Some(stored_first_seen_ms(base_ms, *time_ms));
            verdicts.push(Verdict::New);
            new_ids.push((*key, *time_ms));
        }
        let batch = LoggedBatch {
            partition,
            base_ms,
            new_ids,
            progress: progress.to_vec(),
        };
        if let Some(log) = state.log.as_mut() {
            log.append(&batch, self.options.durability == Durability::SyncWal)?;
        }
        self.record_buffered(&mut state, batch);
        self.maybe_seal(&mut state)?;
        Ok(verdicts)
    }

    /// Applies a checked batch to the in-memory state: its new ids join the buffer of the
    /// active generation, whose metadata counts them; its progress record is buffered too.
    fn record_buffered(&self, state: &mut State, batch: LoggedBatch) {
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
            if let Some(&(_, first)) = new_ids.first() {
                let meta = &mut active.meta;
                let base_ms = *meta.base_ms.get_or_insert(base_ms);
                let span = meta.partitions.entry(partition).or_insert(PartitionSpan {
                    first_seen_ms: first,
                    last_seen_ms: first,
                    ids: 0,
                });
                for (key, time_ms) in &new_ids {
                    span.first_seen_ms = span.first_seen_ms.min(*time_ms);
                    span.last_seen_ms = span.last_seen_ms.max(*time_ms);
                    pending.insert(*key, stored_first_seen_ms(base_ms, *time_ms));
                    index.insert(&index.place(key), tag);
                }
                span.ids += new_ids.len() as u64;
                meta.ids += new_ids.len() as u64;
            }
        }
        state.pending_progress.insert(partition, progress);
        state.pending_batches += 1;
    }

    /// Same as [`Ledger::check_and_record`]: recording always checks, so a key recorded by a
    /// concurrent path is never recorded twice.
    pub fn record(
        &self,
        partition: u32,
        items: &[(LedgerKey, i64)],
        progress: &[u8],
    ) -> Result<Vec<Verdict>> {
        self.check_and_record(partition, items, progress)
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
    fn generation_bytes(&self, state: &State, generation: &Generation) -> Result<u64> {
        let sst = self.int_property(&generation.name, "rocksdb.live-sst-files-size")?;
        let buffered = if state.generations.last().is_some_and(|g| g.meta.id == generation.meta.id) {
            state.pending.len() as u64
        } else {
            0
        } + state
            .in_flight
            .as_ref()
            .filter(|f| f.record.meta.id == generation.meta.id)
            .map_or(0, |f| f.ids.len() as u64);
        let mem_ids = self.int_property(&generation.name, "rocksdb.num-entries-active-mem-table")?
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

    /// Seals the active generation when it is full, then forgets the oldest generations until
    /// the rest fit the budget.
    fn maybe_seal(&self, state: &mut State) -> Result<()> {
        let Some(active) = state.generations.last() else {
            return Ok(());
        };
        let full_by_ids = self
            .options
            .seal_after_ids
            .is_some_and(|n| active.meta.ids >= n);
        if !full_by_ids
            && self.generation_bytes(state, active)? < self.options.generation_target_bytes()
        {
            return Ok(());
        }
        // The sealed generation's buffered ids go in before it is sealed.
        self.commit_pending(state)?;
        let Some(active) = state.generations.last() else {
            return Ok(());
        };
        let mut sealed = active.meta.clone();
        sealed.sealed = true;
        let mut batch = WriteBatch::default();
        batch.put_cf(&self.cf(CF_META)?, generation_meta_key(sealed.id), to_json(&sealed));
        self.db
            .write_opt(batch, &self.write_options())
            .map_err(rocks(Doing::Write))?;
        let sealed_name = match state.generations.last_mut() {
            Some(last) => {
                last.meta = sealed;
                last.name.clone()
            }
            None => return Ok(()),
        };
        self.start_generation(state)?;
        // Flush without waiting (all column families together, so NoWal stays a consistent
        // prefix): the sealed generation leaves the memtables and the WAL, which would otherwise
        // hold several small generations' worth of disk. Then let RocksDB compact it into one
        // sorted run in the background, without filters (see `generation_options`).
        self.flush_all(state, false)?;
        self.compact_when_sealed(&sealed_name)?;
        self.age(state)
    }

    /// A sealed generation takes no more writes: let RocksDB compact its files into one sorted
    /// run, in the background.
    fn compact_when_sealed(&self, name: &str) -> Result<()> {
        let cf = self.cf(name)?;
        self.db
            .set_options_cf(
                &cf,
                &[
                    ("level0_file_num_compaction_trigger", "1"),
                    ("disable_auto_compactions", "false"),
                ],
            )
            .map_err(rocks(Doing::Write))
    }

    /// Drops the oldest sealed generations while the live ones exceed the budget.
    fn age(&self, state: &mut State) -> Result<()> {
        let mut sizes = Vec::with_capacity(state.generations.len());
        for generation in &state.generations {
            sizes.push(self.generation_bytes(state, generation)?);
        }
        // The WAL backing the memtables takes disk too: keep room for it, up to a generation.
        let wal_bytes = ((effective_write_buffer_bytes(&self.options)
            * usize::try_from(self.options.max_write_buffers.max(1)).unwrap_or(1))
            as u64)
            .min(self.options.generation_target_bytes());
        let mut total: u64 = sizes.iter().sum::<u64>() + wal_bytes;
        let mut dropped = 0;
        let too_many = |dropped: usize| state.generations.len() - dropped > MAX_LIVE_GENERATIONS;
        while (total > self.options.budget_bytes || too_many(dropped))
            && dropped + 1 < state.generations.len()
        {
            total -= sizes[dropped];
            dropped += 1;
        }
        for generation in state.generations.drain(..dropped).collect::<Vec<_>>() {
            for (p, span) in &generation.meta.partitions {
                let f = state.forgotten.entry(*p).or_insert(span.last_seen_ms);
                *f = (*f).max(span.last_seen_ms);
            }
            // Metadata first: a crash between the two leaves an undescribed column family,
            // which the next open drops.
            let meta = self.cf(CF_META)?;
            let mut batch = WriteBatch::default();
            batch.delete_cf(&meta, generation_meta_key(generation.meta.id));
            batch.put_cf(&meta, META_FORGOTTEN, to_json(&state.forgotten));
            drop(meta);
            self.db
                .write_opt(batch, &self.write_options())
                .map_err(rocks(Doing::Write))?;
            self.db
                .drop_cf(&generation.name)
                .map_err(rocks(Doing::Generation("drop", &generation.name)))?;
            state.index.forget(IdIndex::tag(generation.meta.id));
        }
        Ok(())
    }

    /// How far back the ledger remembers one partition's ids: every id of `partition` first seen
    /// after `now_ms - window` is held. `None` when it holds none of that partition's ids.
    pub fn window(&self, partition: u32, now_ms: i64) -> Option<Duration> {
        let state = self.lock();
        let oldest = state
            .generations
            .iter()
            .filter_map(|g| g.meta.partitions.get(&partition))
            .map(|s| s.first_seen_ms)
            .min()?;
        let start = match state.forgotten.get(&partition) {
            Some(&f) => oldest.max(f),
            None => oldest,
        };
        Some(window_from(start, now_ms))
    }

    /// The window that holds for every partition's ids (see [`Ledger::window`]).
    pub fn window_overall(&self, now_ms: i64) -> Option<Duration> {
        let state = self.lock();
        let oldest = state
            .generations
            .iter()
            .flat_map(|g| g.meta.partitions.values())
            .map(|s| s.first_seen_ms)
            .min()?;
        let start = state.forgotten.values().copied().fold(oldest, i64::max);
        Some(window_from(start, now_ms))
    }

    /// Live generations, oldest first, with their sizes: ids per generation and their time
    /// spans let a caller forecast the window once the budget is full.
    pub fn generations(&self) -> Result<Vec<GenerationInfo>> {
        let state = self.lock();
        state
            .generations
            .iter()
            .map(|g| {
                Ok(GenerationInfo {
                    meta: g.meta.clone(),
                    bytes: self.generation_bytes(&state, g)?,
                })
            })
            .collect()
    }

    /// Size and reach of the ledger.
    pub fn stats(&self) -> Result<LedgerStats> {
        let state = self.lock();
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
            index_ids: state.index.live_slots(),
            index_overflowed_buckets: state.index.overflowed_buckets(),
            disk_lookups: self.disk_lookups.load(std::sync::atomic::Ordering::Relaxed),
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

    /// The progress record last written for `partition`.
    pub fn progress(&self, partition: u32) -> Result<Option<Vec<u8>>> {
        let state = self.lock();
        let buffered = state.pending_progress.get(&partition).or_else(|| {
            state.in_flight.as_ref().and_then(|f| f.progress.get(&partition))
        });
        if let Some(value) = buffered {
            return Ok(Some(value.clone()));
        }
        let cf = self.cf(CF_PROGRESS)?;
        self.db
            .get_cf(&cf, progress_key(partition))
            .map_err(rocks(Doing::Read))
    }

    /// Every partition's progress record.
    pub fn all_progress(&self) -> Result<BTreeMap<u32, Vec<u8>>> {
        let state = self.lock();
        let mut all = self.durable_progress()?;
        if let Some(f) = &state.in_flight {
            all.extend(f.progress.iter().map(|(p, v)| (*p, v.clone())));
        }
        all.extend(state.pending_progress.iter().map(|(p, v)| (*p, v.clone())));
        Ok(all)
    }

    /// Flushes every memtable to SST files (all column families together). In
    /// [`Durability::NoWal`] mode this is what makes recorded batches durable.
    pub fn flush(&self) -> Result<()> {
        let mut state = self.lock();
        self.flush_locked(&mut state)
    }

    fn flush_locked(&self, state: &mut State) -> Result<()> {
        self.commit_pending(state)?;
        self.flush_all(state, true)
    }

    fn flush_all(&self, state: &State, wait: bool) -> Result<()> {
        let mut handles = vec![self.cf(CF_META)?, self.cf(CF_PROGRESS)?];
        for g in &state.generations {
            handles.push(self.cf(&g.name)?);
        }
        let refs: Vec<_> = handles.iter().collect();
        let mut flush = FlushOptions::default();
        flush.set_wait(wait);
        self.db
            .flush_cfs_opt(&refs, &flush)
            .map_err(rocks(Doing::Write))
    }

    /// Writes a consistent checkpoint (hard links where possible) into `dir`, which must not
    /// exist, and returns the progress records it contains. No batch is recorded meanwhile.
    pub fn checkpoint(&self, dir: impl AsRef<Path>) -> Result<BTreeMap<u32, Vec<u8>>> {
        let dir = dir.as_ref();
        let mut state = self.lock();
        self.flush_locked(&mut state)?;
        let checkpoint =
            rocksdb::checkpoint::Checkpoint::new(&self.db).map_err(rocks(Doing::Checkpoint(dir)))?;
        checkpoint
            .create_checkpoint(dir)
            .map_err(rocks(Doing::Checkpoint(dir)))?;
        // Still under the lock: the live progress records are those in the checkpoint (nothing
        // is buffered after the flush).
        self.durable_progress()
    }

    /// Copies a checkpoint into `target_dir` so it can be opened as a ledger. Refuses a non-empty
    /// target unless `replace` is set, in which case the target is replaced only once the copy is
    /// complete.
    pub fn restore_from(
        checkpoint_dir: impl AsRef<Path>,
        target_dir: impl AsRef<Path>,
        replace: bool,
    ) -> Result<()> {
        let source = checkpoint_dir.as_ref();
        let target = target_dir.as_ref();
        if !source.join("CURRENT").exists() {
            return Err(LedgerError::NotALedger {
                path: source.to_path_buf(),
                reason: "the checkpoint has no CURRENT file".into(),
            });
        }
        let target_used = match std::fs::read_dir(target) {
            Ok(mut entries) => entries.next().is_some(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(io_error("read", target)(e)),
        };
        if target_used && !replace {
            return Err(LedgerError::TargetNotEmpty {
                dir: target.to_path_buf(),
            });
        }
        let mut staging = target.as_os_str().to_owned();
        staging.push(".restoring");
        let staging = PathBuf::from(staging);
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(io_error("clear", &staging))?;
        }
        std::fs::create_dir_all(&staging).map_err(io_error("create", &staging))?;
        for entry in std::fs::read_dir(source).map_err(io_error("read", source))? {
            let entry = entry.map_err(io_error("read", source))?;
            let to = staging.join(entry.file_name());
            std::fs::copy(entry.path(), &to).map_err(io_error("copy into", &to))?;
        }
        if target_used {
            std::fs::remove_dir_all(target).map_err(io_error("replace", target))?;
        } else if target.exists() {
            std::fs::remove_dir(target).map_err(io_error("replace", target))?;
        }
        std::fs::rename(&staging, target).map_err(io_error("move into place", target))
    }

    /// The ledger directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The options it was opened with.
    pub fn options(&self) -> &LedgerOptions {
        &self.options
    }

    /// Value of a RocksDB statistics-free integer property summed over generations (diagnostics).
    pub fn generation_property(&self, property: &str) -> Result<u64> {
        let state = self.lock();
        let mut sum = 0;
        for g in &state.generations {
            sum += self.int_property(&g.name, property)?;
        }
        Ok(sum)
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        // Without a WAL, buffered and unflushed batches would be lost on a clean close (with
        // one, the next open replays the batch log).
        if self.options.durability == Durability::NoWal {
            let _ = self.flush();
        }
        // A commit file still being written is left for the next open to remove; its batches
        // are in the log. Wait for the thread so it does not outlive the ledger.
        let in_flight = self.lock().in_flight.take();
        if let Some(job) = in_flight.and_then(|f| f.job) {
            let _ = job.join();
        }
    }
}

fn window_from(start_ms: i64, now_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(now_ms.saturating_sub(start_ms)).unwrap_or(0))
}

/// Sorted distinct keys, and for each input key the index of its distinct key.
fn sort_distinct(keys: impl Iterator<Item = LedgerKey>) -> (Vec<LedgerKey>, Vec<usize>) {
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

const _: () = assert!(LEDGER_KEY_BYTES == 16);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::ledger_key;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    fn key(n: u64) -> LedgerKey {
        ledger_key(format!("id-{n}").as_bytes()).unwrap()
    }

    fn small_options(durability: Durability) -> LedgerOptions {
        LedgerOptions {
            durability,
            // The id index is sized from the budget and made resident when the ledger opens.
            budget_bytes: 256 << 20,
            write_buffer_bytes: 1 << 20,
            block_cache_bytes: 1 << 20,
            background_jobs: 2,
            ..LedgerOptions::default()
        }
    }

    const ALL_MODES: [Durability; 3] = [Durability::SyncWal, Durability::Wal, Durability::NoWal];

    #[test]
    fn ledger_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Ledger>();
    }

    #[test]
    fn first_seen_round_trips_at_second_resolution() {
        for (base, t) in [(0, 0), (1_000, 999), (1_000, 1_001), (5_000, 1_234_567), (i64::MAX / 4, 1)] {
            let mut v = Vec::new();
            encode_first_seen(base, t, &mut v);
            let back = decode_first_seen(base, &v).unwrap();
            assert_eq!(back, stored_first_seen_ms(base, t));
            assert!(back <= t && t - back < FIRST_SEEN_RESOLUTION_MS || t < base);
        }
        // A value is at most 3 bytes for ids up to ~12 days either side of the base.
        let mut v = Vec::new();
        encode_first_seen(0, 12 * 24 * 3_600_000, &mut v);
        assert!(v.len() <= 3, "{} bytes", v.len());
    }

    #[test]
    fn batch_verdicts_in_order_with_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
        // The third item repeats the first id, so it is a duplicate of this same batch.
        let v = ledger
            .check_and_record(3, &[(key(1), 10_000), (key(2), 10_500), (key(1), 11_000)], b"p1")
            .unwrap();
        assert_eq!(
            v,
            vec![Verdict::New, Verdict::New, Verdict::Duplicate { first_seen_ms: 10_000 }]
        );
        // The next batch re-sends id 2 (first seen at 10.5 s, stored at second resolution).
        let v = ledger.check_and_record(3, &[(key(2), 20_000), (key(3), 20_000)], b"p2").unwrap();
        assert_eq!(v, vec![Verdict::Duplicate { first_seen_ms: 10_000 }, Verdict::New]);
        assert_eq!(ledger.check(&[key(1), key(4), key(3)]).unwrap(), vec![Some(10_000), None, Some(20_000)]);
        assert_eq!(ledger.progress(3).unwrap().as_deref(), Some(&b"p2"[..]));
        assert_eq!(ledger.progress(4).unwrap(), None);
        let stats = ledger.stats().unwrap();
        assert_eq!(stats.ids_estimate, 3);
        assert_eq!(stats.oldest_first_seen_ms, Some(10_000));
        assert_eq!(stats.newest_first_seen_ms, Some(20_000));
    }

    #[test]
    fn everything_survives_a_clean_reopen_in_every_mode() {
        for mode in ALL_MODES {
            let dir = tempfile::tempdir().unwrap();
            {
                let ledger = Ledger::open(dir.path(), small_options(mode)).unwrap();
                ledger.check_and_record(0, &[(key(1), 1_000)], b"a").unwrap();
                ledger.check_and_record(7, &[(key(2), 2_000)], b"b").unwrap();
            }
            let ledger = Ledger::open(dir.path(), small_options(mode)).unwrap();
            assert_eq!(ledger.check(&[key(1), key(2), key(3)]).unwrap(), vec![Some(1_000), Some(2_000), None], "{mode:?}");
            let all = ledger.all_progress().unwrap();
            assert_eq!(all, BTreeMap::from([(0, b"a".to_vec()), (7, b"b".to_vec())]));
        }
    }

    #[test]
    fn empty_ledger_reports_no_window() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
        assert_eq!(ledger.window(0, 1_000_000), None);
        assert_eq!(ledger.window_overall(1_000_000), None);
        // A batch of only progress (no ids) holds no window either.
        ledger.check_and_record(0, &[], b"x").unwrap();
        assert_eq!(ledger.window(0, 1_000_000), None);
        ledger.check_and_record(0, &[(key(1), 400_000)], b"y").unwrap();
        assert_eq!(ledger.window(0, 1_000_000), Some(Duration::from_millis(600_000)));
        assert_eq!(ledger.window(1, 1_000_000), None);
        assert_eq!(ledger.window_overall(1_000_000), Some(Duration::from_millis(600_000)));
    }

    #[test]
    fn aging_drops_oldest_generations_whole_and_shrinks_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let options = LedgerOptions {
            seal_after_ids: Some(100),
            // Room for about three generations of 100 ids each.
            budget_bytes: 3 * 100 * DEFAULT_BYTES_PER_ID_ESTIMATE + 10,
            generations: 3,
            ..small_options(Durability::Wal)
        };
        let ledger = Ledger::open(dir.path(), options).unwrap();
        // Ten batches of 100 ids, one second apart: each batch fills and seals a generation.
        for b in 0..10u64 {
            let items: Vec<_> = (0..100).map(|i| (key(b * 100 + i), (b as i64) * 1_000)).collect();
            ledger.check_and_record(0, &items, &b.to_le_bytes()).unwrap();
        }
        let generations = ledger.generations().unwrap();
        assert!(generations.len() <= 4, "{} generations", generations.len());
        let oldest = generations.iter().find(|g| g.meta.ids > 0).unwrap();
        let held_from = oldest.meta.partitions[&0].first_seen_ms;
        assert!(held_from > 0, "the first generations were forgotten");
        // Ids of forgotten generations are new again; the newest are still duplicates.
        assert_eq!(ledger.check(&[key(0)]).unwrap(), vec![None]);
        assert_eq!(ledger.check(&[key(999)]).unwrap(), vec![Some(9_000)]);
        // The window covers exactly what is held.
        assert_eq!(ledger.window(0, 20_000), Some(Duration::from_millis((20_000 - held_from) as u64)));
        // Generation ids are consecutive and the oldest went first.
        let ids: Vec<u64> = generations.iter().map(|g| g.meta.id).collect();
        assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
        assert_eq!(*ids.last().unwrap(), 11);
        // Same after reopening.
        drop(ledger);
        let ledger = Ledger::open(dir.path(), LedgerOptions { seal_after_ids: Some(100), ..small_options(Durability::Wal) }).unwrap();
        assert_eq!(ledger.generations().unwrap().iter().map(|g| g.meta.id).collect::<Vec<_>>(), ids);
        assert_eq!(ledger.window(0, 20_000), Some(Duration::from_millis((20_000 - held_from) as u64)));
    }

    #[test]
    fn garbage_in_current_is_an_open_error_and_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        drop(Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap());
        std::fs::write(dir.path().join("CURRENT"), b"garbage\n").unwrap();
        match Ledger::open(dir.path(), small_options(Durability::Wal)) {
            Err(LedgerError::Open { path, source }) => {
                assert_eq!(path, dir.path());
                assert!(!source.to_string().is_empty());
            }
            Err(other) => panic!("expected an open error, got {other}"),
            Ok(_) => panic!("a ledger with a garbage CURRENT file opened"),
        }
        // The garbage is still there: nothing was deleted or recreated.
        assert_eq!(std::fs::read(dir.path().join("CURRENT")).unwrap(), b"garbage\n");
    }

    #[test]
    fn truncated_manifest_is_an_open_error_and_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        {
            let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
            ledger.check_and_record(0, &[(key(1), 1)], b"p").unwrap();
        }
        let current = std::fs::read_to_string(dir.path().join("CURRENT")).unwrap();
        let manifest = dir.path().join(current.trim());
        let bytes = std::fs::read(&manifest).unwrap();
        std::fs::write(&manifest, &bytes[..bytes.len() / 3]).unwrap();
        let before = std::fs::read_dir(dir.path()).unwrap().count();
        let err = Ledger::open(dir.path(), small_options(Durability::Wal)).err().expect("opened a truncated MANIFEST");
        // RocksDB refuses the MANIFEST, or reads a prefix of it that lacks the ledger's column
        // families: either way the ledger is refused and named.
        assert!(
            matches!(&err, LedgerError::Open { path, .. } | LedgerError::NotALedger { path, .. } if path == dir.path()),
            "{err}"
        );
        assert!(err.to_string().contains(&dir.path().display().to_string()));
        assert_eq!(std::fs::read(&manifest).unwrap().len(), bytes.len() / 3);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), before);
    }

    #[test]
    fn a_directory_that_is_not_a_ledger_is_refused_and_untouched() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
        let err = Ledger::open(dir.path(), small_options(Durability::Wal)).err().unwrap();
        assert!(matches!(err, LedgerError::NotALedger { .. }), "{err}");
        assert_eq!(std::fs::read(dir.path().join("notes.txt")).unwrap(), b"mine");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_version_1_ledger_is_read_and_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        {
            let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
            ledger.check_and_record(0, &[(key(1), 1000)], b"p").unwrap();
            ledger.flush().unwrap();
            let meta = ledger.cf(CF_META).unwrap();
            ledger.db.put_cf(&meta, META_FORMAT_VERSION, 1u32.to_le_bytes()).unwrap();
        }
        let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
        assert_eq!(ledger.check(&[key(1)]).unwrap(), vec![Some(1000)]);
        assert_eq!(ledger.progress(0).unwrap(), Some(b"p".to_vec()));
        let meta = ledger.cf(CF_META).unwrap();
        let marker = ledger.db.get_cf(&meta, META_FORMAT_VERSION).unwrap().unwrap();
        assert_eq!(marker, FORMAT_VERSION.to_le_bytes());
    }

    #[test]
    fn unknown_format_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
            let meta = ledger.cf(CF_META).unwrap();
            ledger.db.put_cf(&meta, META_FORMAT_VERSION, 99u32.to_le_bytes()).unwrap();
        }
        let err = Ledger::open(dir.path(), small_options(Durability::Wal)).err().unwrap();
        assert!(matches!(err, LedgerError::UnknownFormat { found: 99 }), "{err}");
    }

    #[test]
    fn checkpoint_opens_and_restores() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path().join("live"), small_options(Durability::NoWal)).unwrap();
        ledger.check_and_record(1, &[(key(1), 5_000)], b"one").unwrap();
        let cp = dir.path().join("cp");
        let progress = ledger.checkpoint(&cp).unwrap();
        assert_eq!(progress, BTreeMap::from([(1, b"one".to_vec())]));
        // Writes after the checkpoint are not in it.
        ledger.check_and_record(1, &[(key(2), 6_000)], b"two").unwrap();
        // Restoring refuses a non-empty target unless told.
        let target = dir.path().join("restored");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("keep"), b"x").unwrap();
        let err = Ledger::restore_from(&cp, &target, false).err().unwrap();
        assert!(matches!(err, LedgerError::TargetNotEmpty { .. }), "{err}");
        assert!(target.join("keep").exists());
        Ledger::restore_from(&cp, &target, true).unwrap();
        for path in [&cp, &target] {
            let copy = Ledger::open(path, small_options(Durability::NoWal)).unwrap();
            assert_eq!(copy.check(&[key(1), key(2)]).unwrap(), vec![Some(5_000), None]);
            assert_eq!(copy.progress(1).unwrap().as_deref(), Some(&b"one"[..]));
        }
    }

    #[test]
    fn generation_tags_wrap_around_without_losing_count_of_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let options = LedgerOptions {
            seal_after_ids: Some(4),
            // A few small files' worth: a handful of generations stay live.
            budget_bytes: 16 << 10,
            generations: 2,
            ..small_options(Durability::NoWal)
        };
        let ledger = Ledger::open(dir.path(), options).unwrap();
        // 300 generations of 4 ids: the 256 tags are all reused once.
        for g in 0..300u64 {
            let items: Vec<_> = (0..4).map(|i| (key(g * 4 + i), g as i64 * 1000)).collect();
            let verdicts = ledger.check_and_record(0, &items, b"p").unwrap();
            assert!(verdicts.iter().all(|v| *v == Verdict::New), "generation {g}: {verdicts:?}");
        }
        let stats = ledger.stats().unwrap();
        assert!(ledger.generations().unwrap()[0].meta.id > 256, "tags did not wrap");
        assert_eq!(stats.index_overflowed_buckets, 0);
        assert_eq!(stats.index_ids, stats.ids_estimate, "index slots of dropped generations leaked");
        // Batch g went into generation g + 1. The live generations' ids are known; the first
        // generations' ids, whose tags were reused, are not.
        let live: Vec<u64> = ledger.generations().unwrap().iter().filter(|g| g.meta.ids > 0).map(|g| g.meta.id).collect();
        assert!(!live.is_empty());
        for id in live {
            let held = ledger.check(&[key((id - 1) * 4), key((id - 1) * 4 + 3)]).unwrap();
            assert!(held.iter().all(Option::is_some), "generation {id}: {held:?}");
        }
        let oldest = ledger.check(&[key(0), key(1)]).unwrap();
        assert_eq!(oldest, vec![None, None]);
    }

    #[test]
    fn a_ledger_opened_without_its_index_still_answers_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let options = LedgerOptions {
            seal_after_ids: Some(1_000),
            ..small_options(Durability::Wal)
        };
        let ledger = Ledger::open(dir.path(), options.clone()).unwrap();
        let items: Vec<_> = (0..3_000).map(|i| (key(i), 0)).collect();
        ledger.check_and_record(0, &items[..1_500], b"a").unwrap();
        ledger.check_and_record(0, &items[1_500..], b"b").unwrap();
        drop(ledger);
        let ledger = Ledger::open(dir.path(), LedgerOptions { build_index: false, ..options }).unwrap();
        let stats = ledger.stats().unwrap();
        assert_eq!((stats.index_ids, stats.ids_estimate), (0, 3_000));
        let held = ledger.check(&[key(0), key(1_499), key(2_999), key(5_000)]).unwrap();
        assert!(held[..3].iter().all(Option::is_some), "{held:?}");
        assert_eq!(held[3], None);
        let verdicts = ledger.check_and_record(0, &[(key(10), 0), (key(6_000), 0)], b"c").unwrap();
        assert_eq!(verdicts[1], Verdict::New);
        assert!(matches!(verdicts[0], Verdict::Duplicate { .. }));
    }

    #[test]
    fn live_generations_stay_fewer_than_the_index_tags() {
        let dir = tempfile::tempdir().unwrap();
        let options = LedgerOptions {
            seal_after_ids: Some(1),
            // Room for far more than 256 one-id generations.
            budget_bytes: 1 << 30,
            ..small_options(Durability::NoWal)
        };
        let ledger = Ledger::open(dir.path(), options).unwrap();
        for n in 0..260u64 {
            ledger.check_and_record(0, &[(key(n), 0)], b"").unwrap();
        }
        let live = ledger.generations().unwrap();
        assert!(live.len() <= MAX_LIVE_GENERATIONS, "{} live generations", live.len());
        assert_eq!(ledger.check(&[key(259)]).unwrap(), vec![Some(0)]);
        assert_eq!(ledger.check(&[key(0)]).unwrap(), vec![None]);
    }

    #[test]
    fn new_ids_are_answered_by_the_index_without_disk_lookups() {
        let dir = tempfile::tempdir().unwrap();
        let options = LedgerOptions {
            seal_after_ids: Some(20_000),
            ..small_options(Durability::Wal)
        };
        let ledger = Ledger::open(dir.path(), options).unwrap();
        for batch in 0..25u64 {
            let items: Vec<_> = (0..4_000).map(|i| (key(batch * 4_000 + i), 0)).collect();
            ledger.check_and_record(0, &items, b"").unwrap();
        }
        assert!(ledger.generations().unwrap().len() >= 5);
        let before = ledger.stats().unwrap().disk_lookups;
        // 1,000 new ids and 100 held ones, spread over the sealed generations (the active one is
        // still buffered in memory).
        let mut items: Vec<_> = (1_000_000..1_001_000).map(|i| (key(i), 0)).collect();
        items.extend((0..100).map(|i| (key(i * 797), 0)));
        let verdicts = ledger.check_and_record(0, &items, b"").unwrap();
        assert_eq!(verdicts.iter().filter(|v| **v == Verdict::New).count(), 1_000);
        let looked_up = ledger.stats().unwrap().disk_lookups - before;
        // The 100 held ids, each in the one generation holding it, plus a few collisions.
        assert!((100..110).contains(&looked_up), "{looked_up} disk lookups");
    }

    #[test]
    fn filters_are_used() {
        // Explicit column family descriptors keep the table options (filters): after a flush,
        // table readers hold filter memory.
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), small_options(Durability::NoWal)).unwrap();
        let items: Vec<_> = (0..10_000).map(|i| (key(i), 0)).collect();
        ledger.check_and_record(0, &items, b"").unwrap();
        ledger.flush().unwrap();
        drop(ledger);
        let ledger = Ledger::open(dir.path(), small_options(Durability::NoWal)).unwrap();
        let stats = ledger.stats().unwrap();
        assert!(stats.filter_bytes >= 10_000 * 6 / 8, "{stats:?}");
    }

    // ---- model-based property test -------------------------------------------------------

    #[derive(Debug, Clone)]
    enum Op {
        Batch { partition: u32, ids: Vec<u8>, time_step: i64 },
        Reopen,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0u32..3, prop::collection::vec(0u8..80, 0..24), 0i64..3_000)
                .prop_map(|(partition, ids, time_step)| Op::Batch { partition, ids, time_step }),
            1 => Just(Op::Reopen),
        ]
    }

    fn mode() -> impl Strategy<Value = Durability> {
        prop_oneof![Just(Durability::SyncWal), Just(Durability::Wal), Just(Durability::NoWal)]
    }

    /// The reference model: a set of held ids with the generation each was recorded into, and
    /// the same aging rule (whole generations, oldest first, as the ledger reports them).
    #[derive(Default)]
    struct Model {
        held: HashMap<LedgerKey, (u64, u32, i64)>,
        forgotten_through: HashMap<u32, i64>,
        live: Vec<u64>,
    }

    fn run_model(
        mode: Durability,
        seal_after: u64,
        index_capacity_ids: Option<u64>,
        write_buffer_bytes: usize,
        ops: Vec<Op>,
    ) -> Result<(), TestCaseError> {
        let dir = tempfile::tempdir().unwrap();
        let options = LedgerOptions {
            seal_after_ids: Some(seal_after),
            // A tiny budget: a few generations' worth, so aging happens often.
            budget_bytes: 3 * seal_after * DEFAULT_BYTES_PER_ID_ESTIMATE,
            generations: 3,
            // Sometimes far too small an index: answers must stay exact when it overflows.
            index_capacity_ids,
            // Sometimes a buffer of a few batches: commits run in the background while batches
            // are recorded, and reopens find them in flight.
            write_buffer_bytes,
            ..small_options(mode)
        };
        let mut ledger = Ledger::open(dir.path(), options.clone()).unwrap();
        let mut model = Model::default();
        let mut now = 0i64;
        let mut progress: HashMap<u32, Vec<u8>> = HashMap::new();
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Reopen => {
                    drop(ledger);
                    ledger = Ledger::open(dir.path(), options.clone()).unwrap();
                }
                Op::Batch { partition, ids, time_step } => {
                    now += time_step;
                    let before = ledger.generations().unwrap();
                    let active = before.last().unwrap();
                    let base = active.meta.base_ms.unwrap_or(now);
                    let bases: HashMap<u64, i64> = before.iter().filter_map(|g| g.meta.base_ms.map(|b| (g.meta.id, b))).collect();
                    let items: Vec<_> = ids.iter().map(|&i| (key(u64::from(i)), now)).collect();
                    let record = format!("step {step}").into_bytes();
                    let verdicts = ledger.check_and_record(partition, &items, &record).unwrap();
                    progress.insert(partition, record);
                    // Each verdict is what the model says, and the model learns the new ids.
                    for ((k, t), verdict) in items.iter().zip(&verdicts) {
                        let expected = match model.held.get(k) {
                            Some(&(gen, _, first)) => {
                                let b = bases.get(&gen).copied().unwrap_or(base);
                                Verdict::Duplicate { first_seen_ms: stored_first_seen_ms(b, first) }
                            }
                            None => {
                                model.held.insert(*k, (active.meta.id, partition, *t));
                                Verdict::New
                            }
                        };
                        prop_assert_eq!(*verdict, expected);
                    }
                    // Apply the aging the ledger did: only whole generations, oldest first.
                    let after: Vec<u64> = ledger.generations().unwrap().iter().map(|g| g.meta.id).collect();
                    prop_assert!(after.windows(2).all(|w| w[1] == w[0] + 1), "gaps in {:?}", after);
                    if let (Some(first_before), Some(first_after)) = (model.live.first(), after.first()) {
                        prop_assert!(first_after >= first_before);
                    }
                    prop_assert!(after.len() <= options.generations as usize + 2, "{:?}", after);
                    model.live = after;
                    let live: HashSet<u64> = model.live.iter().copied().collect();
                    let forgotten: Vec<_> = model.held.iter().filter(|(_, (g, _, _))| !live.contains(g)).map(|(k, v)| (*k, *v)).collect();
                    for (k, (_, p, t)) in forgotten {
                        model.held.remove(&k);
                        let f = model.forgotten_through.entry(p).or_insert(t);
                        *f = (*f).max(t);
                    }
                }
            }
            // The window never claims an id it forgot, and exists exactly when ids are held.
            for p in 0..3u32 {
                let window = ledger.window(p, now);
                let holds = model.held.values().any(|(_, q, _)| *q == p);
                prop_assert_eq!(window.is_some(), holds, "partition {}", p);
                if let (Some(w), Some(f)) = (window, model.forgotten_through.get(&p)) {
                    prop_assert!(now - w.as_millis() as i64 >= *f);
                }
                prop_assert_eq!(ledger.progress(p).unwrap(), progress.get(&p).cloned());
            }
            let stats = ledger.stats().unwrap();
            prop_assert_eq!(stats.ids_estimate, model.held.len() as u64);
            if stats.index_overflowed_buckets == 0 {
                prop_assert_eq!(stats.index_ids, model.held.len() as u64);
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn ledger_matches_reference_model(
            mode in mode(),
            seal_after in 4u64..40,
            index_capacity_ids in prop_oneof![3 => Just(None), 1 => (1u64..64).prop_map(Some)],
            write_buffer_bytes in prop_oneof![Just(1usize << 20), 300usize..2_000],
            ops in prop::collection::vec(op(), 1..40),
        ) {
            run_model(mode, seal_after, index_capacity_ids, write_buffer_bytes, ops)?;
        }
    }

    // ---- crash safety ---------------------------------------------------------------------

    const CRASH_DIR_ENV: &str = "DEDUPE_LEDGER_CRASH_DIR";
    const CRASH_MODE_ENV: &str = "DEDUPE_LEDGER_CRASH_MODE";
    const CRASH_BATCH_IDS: u64 = 64;
    const CRASH_KILLS_PER_MODE: usize = 12;
    pub(super) const CRASH_AFTER_INGEST_ENV: &str = "DEDUPE_LEDGER_CRASH_AFTER_INGEST";

    fn crash_options(mode: Durability) -> LedgerOptions {
        LedgerOptions {
            durability: mode,
            // Small buffers and generations: flushes, seals and new column families happen
            // within the child's short life, so kills land in all of them.
            write_buffer_bytes: 256 << 10,
            max_write_buffers: 2,
            seal_after_ids: Some(20_000),
            block_cache_bytes: 1 << 20,
            budget_bytes: 256 << 20,
            ..LedgerOptions::default()
        }
    }

    fn crash_key(batch: u64, i: u64) -> LedgerKey {
        ledger_key(format!("batch-{batch}-id-{i}").as_bytes()).unwrap()
    }

    fn parse_mode(s: &str) -> Durability {
        match s {
            "SyncWal" => Durability::SyncWal,
            "Wal" => Durability::Wal,
            _ => Durability::NoWal,
        }
    }

    /// The child side of the crash test: when run by the parent, writes batches forever.
    /// Batch n holds ids derived from n, repeats the first id of batch n - 1, and its progress
    /// record is n. Run on its own (without the parent's environment) it does nothing.
    #[test]
    fn crash_child_writer() {
        let (Ok(dir), Ok(mode)) = (std::env::var(CRASH_DIR_ENV), std::env::var(CRASH_MODE_ENV)) else {
            // Run on its own, as part of the suite, it has nothing to do.
            assert!(std::env::var_os(CRASH_DIR_ENV).is_none(), "the crash tests' child is run without its mode");
            return;
        };
        let ledger = Ledger::open(&dir, crash_options(parse_mode(&mode))).unwrap();
        let mut batch = ledger
            .progress(0)
            .unwrap()
            .map_or(0, |p| u64::from_le_bytes(p.try_into().unwrap()));
        loop {
            batch += 1;
            let mut items: Vec<_> = (0..CRASH_BATCH_IDS).map(|i| (crash_key(batch, i), batch as i64 * 1000)).collect();
            if batch > 1 {
                items.push((crash_key(batch - 1, 0), batch as i64 * 1000));
            }
            ledger.check_and_record(0, &items, &batch.to_le_bytes()).unwrap();
        }
    }

    /// The child side of the creation crash test: opens a fresh ledger with the default options
    /// (the default budget's 3.4 GiB id index included), then writes batches forever.
    #[test]
    fn crash_child_creator() {
        let Ok(dir) = std::env::var(CRASH_DIR_ENV) else {
            assert!(std::env::var_os(CRASH_MODE_ENV).is_none(), "the crash tests' child is run without its directory");
            return;
        };
        let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
        for batch in 1.. {
            let items: Vec<_> = (0..CRASH_BATCH_IDS).map(|i| (crash_key(batch, i), batch as i64 * 1000)).collect();
            ledger.check_and_record(0, &items, &batch.to_le_bytes()).unwrap();
        }
    }

    /// Opens the crash test's ledger and checks that batches 1..=n are entirely there, n + 1 is
    /// entirely absent and the metadata counts exactly their ids. Returns n.
    fn check_crashed_ledger(dir: &Path, mode: Durability, what: &str) -> u64 {
        check_crashed_ledger_with(dir, crash_options(mode), what)
    }

    fn check_crashed_ledger_with(dir: &Path, options: LedgerOptions, what: &str) -> u64 {
        let ledger = Ledger::open(dir, options).unwrap_or_else(|e| panic!("{what}: the ledger does not open again: {e}"));
        let n = ledger
            .progress(0)
            .unwrap()
            .map_or(0, |p| u64::from_le_bytes(p.try_into().unwrap()));
        for b in 1..=n {
            let keys: Vec<_> = (0..CRASH_BATCH_IDS).map(|i| crash_key(b, i)).collect();
            let found = ledger.check(&keys).unwrap();
            assert!(found.iter().all(|f| *f == Some(b as i64 * 1000)), "{what}: batch {b} of {n} is incomplete");
        }
        let next: Vec<_> = (0..CRASH_BATCH_IDS).map(|i| crash_key(n + 1, i)).collect();
        assert!(ledger.check(&next).unwrap().iter().all(Option::is_none), "{what}: batch {} is there without its progress record {n}", n + 1);
        assert_eq!(ledger.stats().unwrap().ids_estimate, n * CRASH_BATCH_IDS, "{what}");
        n
    }

    /// With a WAL, buffered batches are replayed from the batch log on open; a torn record at
    /// its end (a crash mid-append) ends the replay, and later batches append after the good part.
    #[test]
    fn batch_log_replays_a_prefix_and_drops_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let items = |b: u64| -> Vec<(LedgerKey, i64)> { (0..10).map(|i| (key(b * 100 + i), b as i64 * 1000)).collect() };
        for mode in [Durability::Wal, Durability::SyncWal] {
            let dir = dir.path().join(format!("{mode:?}"));
            {
                let ledger = Ledger::open(&dir, small_options(mode)).unwrap();
                for b in 1..=3 {
                    ledger.check_and_record(0, &items(b), &b.to_le_bytes()).unwrap();
                }
            }
            let logs: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(LOG_FILE_PREFIX)).collect();
            assert_eq!(logs.len(), 1, "{logs:?}");
            let mut bytes = std::fs::read(&logs[0]).unwrap();
            let whole = bytes.len();
            bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3]);
            std::fs::write(&logs[0], &bytes).unwrap();
            assert!(whole > 0);
            {
                let ledger = Ledger::open(&dir, small_options(mode)).unwrap();
                assert_eq!(ledger.progress(0).unwrap(), Some(3u64.to_le_bytes().to_vec()));
                assert_eq!(ledger.stats().unwrap().ids_estimate, 30);
                let verdicts = ledger.check_and_record(0, &items(3), &4u64.to_le_bytes()).unwrap();
                assert!(verdicts.iter().all(|v| *v == Verdict::Duplicate { first_seen_ms: 3000 }), "{verdicts:?}");
                ledger.check_and_record(0, &items(5), &5u64.to_le_bytes()).unwrap();
            }
            let ledger = Ledger::open(&dir, small_options(mode)).unwrap();
            assert_eq!(ledger.progress(0).unwrap(), Some(5u64.to_le_bytes().to_vec()));
            assert_eq!(ledger.stats().unwrap().ids_estimate, 40);
            for b in [1, 2, 3, 5] {
                assert!(ledger.check(&items(b).iter().map(|(k, _)| *k).collect::<Vec<_>>()).unwrap().iter().all(|f| *f == Some(b as i64 * 1000)));
            }
        }
    }

    /// Without a WAL, buffered ids become durable when their file is ingested; a crash right
    /// after the ingestion, before the metadata and progress records are written, must still
    /// leave exactly the committed batches with their progress record.
    #[test]
    fn a_crash_between_ingestion_and_bookkeeping_keeps_the_commit() {
        let exe = std::env::current_exe().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut last = 0u64;
        for crash in 0..3 {
            let status = std::process::Command::new(&exe)
                .args(["--exact", "ledger::tests::crash_child_writer", "--nocapture", "--test-threads", "1"])
                .env(CRASH_DIR_ENV, dir.path())
                .env(CRASH_MODE_ENV, "NoWal")
                .env(CRASH_AFTER_INGEST_ENV, "1")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(!status.success(), "crash {crash}: the child was meant to abort");
            let n = check_crashed_ledger(dir.path(), Durability::NoWal, &format!("crash {crash}"));
            assert!(n > last, "crash {crash}: the ingested batches were lost (progress {n}, before {last})");
            last = n;
        }
    }

    /// A worker killed during its first start, with the default budget, at any moment from the
    /// very first: the ledger always opens again, and holds a prefix of the batches.
    #[test]
    fn a_kill_at_any_moment_of_creation_never_bricks_the_ledger() {
        let exe = std::env::current_exe().unwrap();
        let root = tempfile::tempdir().unwrap();
        let check = LedgerOptions { build_index: false, ..LedgerOptions::default() };
        let mut survived = 0;
        // Kills at fixed moments of the creation (which takes seconds: the index is made
        // resident), then at moments after it finished, while batches are written.
        let during = [0u64, 1, 3, 8, 15, 30, 60, 100, 160, 250, 400, 600, 900, 1300, 1800, 2500].map(|ms| (ms, false));
        let after = [0u64, 50, 300].map(|ms| (ms, true));
        for (n, (delay_ms, after_creation)) in during.into_iter().chain(after).enumerate() {
            let dir = root.path().join(format!("kill-{n}"));
            let mut child = std::process::Command::new(&exe)
                .args(["--exact", "ledger::tests::crash_child_creator", "--nocapture", "--test-threads", "1"])
                .env(CRASH_DIR_ENV, &dir)
                .env(CRASH_MODE_ENV, "default")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            if after_creation {
                let deadline = std::time::Instant::now() + Duration::from_secs(120);
                while !(dir.join("CURRENT").exists() && !dir.join(CREATING_MARKER).exists()) {
                    assert!(std::time::Instant::now() < deadline, "the child never finished creating its ledger");
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            std::thread::sleep(Duration::from_millis(delay_ms));
            child.kill().unwrap();
            child.wait().unwrap();
            if !dir.exists() {
                continue; // Killed before it made anything.
            }
            let batches = check_crashed_ledger_with(&dir, check.clone(), &format!("killed {delay_ms} ms into its first start"));
            survived += usize::from(batches > 0);
            // Opened once, it opens again: the creation is over.
            assert!(!dir.join(CREATING_MARKER).exists(), "killed at {delay_ms} ms: the creation marker is still there");
        }
        assert!(survived > 0, "no kill landed after the ledger was created and written; the test proves nothing");
    }

    #[test]
    fn an_interrupted_creation_is_started_again_and_maintenance_refuses_it() {
        let dir = tempfile::tempdir().unwrap();
        // What a kill during creation leaves: the marker, and some of RocksDB's files.
        std::fs::write(dir.path().join(CREATING_MARKER), b"").unwrap();
        std::fs::write(dir.path().join("CURRENT"), b"MANIFEST-000005\n").unwrap();
        std::fs::write(dir.path().join("000004.log"), b"torn").unwrap();
        match Ledger::open_existing(dir.path(), small_options(Durability::Wal)) {
            Err(LedgerError::NotALedger { reason, .. }) => assert!(reason.contains("never finished"), "{reason}"),
            other => panic!("maintenance opened a half-created ledger: {:?}", other.map(|_| ())),
        }
        let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
        assert!(!dir.path().join(CREATING_MARKER).exists());
        assert!(!dir.path().join("000004.log").exists());
        ledger.check_and_record(0, &[(key(1), 1000)], b"p").unwrap();
        drop(ledger);
        let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
        assert_eq!(ledger.check(&[key(1)]).unwrap(), vec![Some(1000)]);
    }

    #[test]
    fn a_ledger_without_its_format_marker_is_initialized_only_if_it_holds_nothing() {
        for mode in [Durability::NoWal, Durability::Wal] {
            // Empty: what an older build left when killed before writing the marker.
            let dir = tempfile::tempdir().unwrap();
            {
                let ledger = Ledger::open(dir.path(), small_options(mode)).unwrap();
                let meta = ledger.cf(CF_META).unwrap();
                ledger.db.delete_cf(&meta, META_FORMAT_VERSION).unwrap();
                ledger.flush_cfs(&[CF_META], true).unwrap();
            }
            let ledger = Ledger::open(dir.path(), small_options(mode)).unwrap();
            drop(ledger);
            // Holding a batch: a missing marker is damage, refused and left alone.
            let ledger = Ledger::open(dir.path(), small_options(mode)).unwrap();
            ledger.check_and_record(0, &[(key(1), 1000)], b"p").unwrap();
            ledger.flush().unwrap();
            let meta = ledger.cf(CF_META).unwrap();
            ledger.db.delete_cf(&meta, META_FORMAT_VERSION).unwrap();
            ledger.flush_cfs(&[CF_META], true).unwrap();
            drop(meta);
            drop(ledger);
            match Ledger::open(dir.path(), small_options(mode)) {
                Err(LedgerError::CorruptMetadata { what }) => assert!(what.contains("format version marker is missing"), "{what}"),
                other => panic!("{mode:?}: a ledger holding ids without its marker opened: {:?}", other.map(|_| ())),
            }
        }
    }

    #[test]
    fn batches_are_all_or_nothing_and_a_prefix_after_sigkill() {
        let exe = std::env::current_exe().unwrap();
        let mut rng = rand::rng();
        for mode in [Durability::NoWal, Durability::Wal, Durability::SyncWal] {
            let dir = tempfile::tempdir().unwrap();
            let mut last = 0u64;
            for kill in 0..CRASH_KILLS_PER_MODE {
                let mut child = std::process::Command::new(&exe)
                    .args(["--exact", "ledger::tests::crash_child_writer", "--nocapture", "--test-threads", "1"])
                    .env(CRASH_DIR_ENV, dir.path())
                    .env(CRASH_MODE_ENV, format!("{mode:?}"))
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                std::thread::sleep(Duration::from_millis(rand::Rng::random_range(&mut rng, 40..400)));
                // Child::kill sends SIGKILL.
                child.kill().unwrap();
                child.wait().unwrap();

                // Every batch up to n is entirely there; batch n + 1 is entirely absent; the
                // generation metadata counts exactly their ids.
                let n = check_crashed_ledger(dir.path(), mode, &format!("{mode:?} kill {kill}"));
                // Batches never go back: a batch seen after one reopen survives (closing the
                // ledger flushes, so this holds without a WAL too).
                assert!(n >= last, "{mode:?} kill {kill}: progress went back from {last} to {n}");
                last = n;
            }
            assert!(last > 0, "{mode:?}: no batch ever survived a kill; the test proves nothing");
        }
    }
}

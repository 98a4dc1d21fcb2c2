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
//!   of `(first_seen_ms - generation.base_ms)` in whole seconds ([`FIRST_SEEN_RESOLUTION_MS`]), so
//!   1-3 bytes for ids within ~12 days of the generation's base (in milliseconds in a generation
//!   whose metadata says `resolution_ms: 1`, one started under a retention limit: 1-4 bytes
//!   within ~3 days, its comparisons with the limit exact), followed by the first copy's
//!   [`ContentDigest`](crate::identity::ContentDigest) (2 bytes, little-endian, never 0) when it was recorded with one. Reported
//!   first-seen times are therefore rounded down to the second relative to the generation's base.
//! - [`CF_META`]: `format_version` (u32 LE), `gen/<u64 BE id>` = JSON [`GenerationMeta`],
//!   `retention_limit_ms` = JSON ms or null: the retention limit last opened under (see
//!   `retention.rs`; absent before any open recorded one, which reads as none),
//!   `forgotten` = JSON map partition → last first-seen time (ms) of any id already forgotten.
//!   `commit_seq` (u64 LE) = the last commit applied to this column family and [`CF_PROGRESS`].
//! - [`CF_PROGRESS`]: key = partition (i32 BE; partitions are never negative), value = the caller's progress record.
//! - Commit records: in a generation column family, key `[0xff; 16] ++ "commit"` (never an id:
//!   ids are 16 bytes) = JSON `{seq, meta, progress}`, the generation's metadata and every
//!   partition's progress record as of that commit.
//! - Batch log `batches-<12 digit commit seq>.log` (with a WAL): records `[payload length u32 LE]
//!   [XXH3-64 of the payload, u64 LE][payload]`, payload = partition i32, base ms i64, progress
//!   length u32 and bytes, id count u32, then per new id its 16 bytes, event time ms i64 and content
//!   digest u16 (0: none) (all LE). A version 2 log's records lack the digests; their length tells.
//! - Message identity ([`crate::identity`]) is part of the format too.
//!
//! # How ids are written
//! New ids of the active generation are kept in an in-memory hash map (which answers lookups
//! first), not in RocksDB memtables: a memtable insert of a random 16-byte key is a skiplist walk
//! of cache misses. When the buffer reaches a write buffer's worth
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
//! The id index is stored in the file `id-index` when the ledger closes and in every checkpoint;
//! opening loads it and reads from disk only the generations it cannot vouch for (all of them
//! when it is missing, stale or corrupt). See `index_file.rs`, [`Ledger::open_report`] and the
//! log lines "loaded the ledger's id index from its file" and "rebuilt the ledger's id index".
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
//!
//! # Where the code is
//! - `mod.rs`: [`Ledger`] and its public methods, each a short entry point into the files below;
//!   the in-memory state they share; the public constants.
//! - `answers.rs`: what a batch sends ([`Sent`]) and what the ledger answers ([`Verdict`],
//!   [`Held`], [`Sighting`]).
//! - `background.rs`: the id index's background threads (storing it after a seal, growing it),
//!   each tracked until the ledger is dropped.
//! - `options.rs`: [`LedgerOptions`], [`Durability`].
//! - `error.rs`: [`LedgerError`], and the one place RocksDB and I/O errors are converted.
//! - `format.rs`: the on-disk format above: keys, first-seen encoding, metadata, commit records.
//! - `batch_log.rs`: the batch log and its records.
//! - `buffer.rs`: the id buffer, and recording checked batches into it.
//! - `commit.rs`: the commit pipeline: the commit in flight, its file, ingestion, the bookkeeping
//!   after it, flushes.
//! - `lookup.rs`: lookups through the id index ([`index`]), the buffers and the generations; the
//!   verdicts on a batch; progress records.
//! - `generations.rs`: starting, sealing, compacting and forgetting generations; the window.
//! - `open.rs`: opening a ledger, and creating one atomically.
//! - `recover.rs`: recovering, on open, what a crash left.
//! - `rebuild.rs`: making the id index on open.
//! - `index_file.rs`: the id index's file, and when it is trusted; `direct_io.rs`: streaming it
//!   to and from disk past the page cache.
//! - `stats.rs`: [`LedgerStats`], [`GenerationInfo`] and the size estimates.
//! - `tuning.rs`: RocksDB options.
//! - `checkpoint.rs`: checkpoints and restores.
//! - `tests.rs`: the ledger's tests, crash tests included.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rocksdb::{Cache, DBWithThreadMode, MultiThreaded};

use crate::identity::LedgerKey;

mod answers;
mod background;
mod batch_log;
mod buffer;
mod checkpoint;
mod commit;
mod direct_io;
mod error;
mod forget;
mod format;
mod generations;
mod index;
mod index_file;
mod load;
mod lookup;
mod open;
mod options;
mod rebuild;
mod recover;
mod retention;
mod stats;
#[cfg(test)]
mod tests;
mod tuning;

pub use answers::{Held, Sent, Sighting, Verdict};
pub use error::{LedgerError, Result};
pub use forget::{forgotten_since, Forgotten, Mark, MarkKind, MarkOrder};
pub use format::{stored_first_seen_ms, GenerationMeta, PartitionSpan, TimeBase};
pub use index_file::{IndexSource, INDEX_FILE, VERSION as INDEX_FILE_VERSION};
pub use load::{Load, LoadTimes, WindowFloor, RUN_IDS};
pub use options::{Durability, LedgerOptions};
pub use retention::{generation_span_ms, past_limit, retention_floor, Expired};
pub use stats::{GenerationInfo, LedgerStats};

use crate::metrics::events::{IdIndexNotStored, IdIndexStored, IndexStore};
use crate::Partition;
use batch_log::BatchLog;
use buffer::IdBuffer;
use commit::InFlight;
use index::IdIndex;
use lookup::{judge_batch, sort_distinct, Judging};

/// Column family holding format version and generation metadata.
pub const CF_META: &str = "meta";
/// Column family holding each partition's progress record.
pub const CF_PROGRESS: &str = "progress";
/// Prefix of the generation column families (`gen-000000000042`).
pub const GENERATION_CF_PREFIX: &str = "gen-";
/// The on-disk format this code reads and writes.
/// Version 2 added the batch log, ingested files and commit records; a version 1 ledger (ids in
/// memtables, RocksDB's WAL) is read and upgraded on open. Version 3 added content digests to
/// stored values and batch log records; a version 2 ledger opens as it is (its ids have no
/// digest) and is marked version 3. Version 4 adds generations whose first-seen times are stored to
/// the millisecond (`resolution_ms` in their metadata), which a generation started under a
/// retention limit has: a ledger is marked version 4 only once it has such a generation, and
/// stays version 3 otherwise, so a build that reads versions 1 to 3 still opens it. Older code
/// must not open a newer ledger: version 2 code would misread a version 3 batch log, and
/// version 3 code would read millisecond offsets as seconds.
pub const FORMAT_VERSION: u32 = 4;
/// The format a ledger without millisecond generations is marked with.
pub const SECONDS_FORMAT_VERSION: u32 = 3;
/// The oldest format this code opens (and upgrades).
pub const OLDEST_READABLE_FORMAT_VERSION: u32 = 1;
/// Resolution of stored first-seen times in a generation started without a retention limit (and
/// in every generation of format version 3 and older).
pub const FIRST_SEEN_RESOLUTION_MS: i64 = 1000;

/// A file present in the ledger directory only while the ledger is being created.
pub const CREATING_MARKER: &str = "CREATING";

struct Generation {
    name: String,
    meta: GenerationMeta,
}

struct State {
    /// Oldest first; the last one is the active (unsealed) generation.
    generations: Vec<Generation>,
    /// Per partition: latest first-seen time of any id already forgotten.
    forgotten: BTreeMap<Partition, i64>,
    /// Per partition: the newest id of a generation the budget dropped (not the retention
    /// limit), since the open; at the open, every floor recorded before it counts as the budget's
    /// (the ledger's metadata does not say which made it). See [`Ledger::window_limited`].
    budget_floor: BTreeMap<Partition, i64>,
    /// Ids an operator had forgotten, and the ids published again since (see `forget.rs`).
    marks: forget::Marks,
    /// The id buffer: ids recorded into the active generation since the last commit was taken,
    /// with their stored first-seen times, in every durability mode. Nothing of them is in
    /// RocksDB yet (with a WAL, they are in the batch log).
    pending: IdBuffer,
    /// Progress records written since the last commit was taken (the newest per partition).
    pending_progress: BTreeMap<Partition, Vec<u8>>,
    /// Batches recorded since the last commit was taken: they count towards the buffer's size.
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
    spare: Option<IdBuffer>,
    /// The `commit_seq` at which the ledger directory's index file was last written, if it was
    /// written since the open (a close then has nothing to store when nothing was committed since).
    index_stored_at: Option<u64>,
    /// Bumped before anything clears or forgets index slots (a seal), and before a close or a
    /// checkpoint writes the index file itself: a background store started under an older epoch
    /// gives up (see `index_file.rs`).
    index_epoch: u64,
    /// Bulk loads under way (`load.rs`): the active generation is not sealed while there are any.
    loads: u32,
    /// Ids the loads under way said they bring: room the id index keeps for them.
    reserved: u64,
    /// Seal the active generation at the next chance, full or not (after a large bulk load).
    seal_requested: bool,
    /// Seals put off in a row while a large id buffer is committed in the background first
    /// (see [`Ledger::ready_to_seal`]).
    seal_deferrals: u32,
}

type Db = DBWithThreadMode<MultiThreaded>;

/// The ledger. `Send + Sync`: all methods take `&self` and serialize on an internal lock.
pub struct Ledger {
    db: Db,
    path: PathBuf,
    options: LedgerOptions,
    block_cache: Cache,
    /// Shared with the thread that stores the id index after a seal.
    state: Arc<Mutex<State>>,
    /// Threads storing or growing the id index in the background (joined when the ledger is
    /// dropped).
    index_stores: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Keys looked up in a generation's column family (the id index could not rule them out).
    disk_lookups: std::sync::atomic::AtomicU64,
    /// How the last open went (set once it succeeded).
    opened: std::sync::OnceLock<OpenReport>,
}

/// How long opening a ledger took, and where its id index came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpenReport {
    /// Seconds from the call to `open` until it returned.
    pub seconds: f64,
    /// Loaded from the index file, partly loaded, or rebuilt from the generations.
    pub index: IndexSource,
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

    /// Looks keys up without recording anything: what the ledger holds of each key held (its
    /// first-seen time and digest).
    pub fn held(&self, keys: &[LedgerKey]) -> Result<Vec<Option<Held>>> {
        let (sorted, slot) = sort_distinct(keys.iter().copied());
        let state = self.lock();
        let found = self.lookup_sorted(&state, &sorted)?;
        Ok(slot.into_iter().map(|s| found[s]).collect())
    }

    /// What a partition's pipeline sees of keys: [`Ledger::held`], except that a forgotten id is
    /// not held (on whichever partition: the ledger is shared by the worker's partitions); and
    /// which of the keys are forgotten, since when and where (see `forget.rs`).
    pub fn held_in(&self, keys: &[LedgerKey]) -> Result<(Vec<Option<Held>>, Vec<Forgotten>)> {
        let (sorted, slot) = sort_distinct(keys.iter().copied());
        let state = self.lock();
        let mut found = self.lookup_sorted(&state, &sorted)?;
        let forgotten = forget::forget_override(&state, &sorted, &mut found);
        Ok((slot.into_iter().map(|s| found[s]).collect(), forgotten))
    }

    /// Looks keys up without recording anything: the first-seen time of each key held.
    pub fn check(&self, keys: &[LedgerKey]) -> Result<Vec<Option<i64>>> {
        Ok(self
            .held(keys)?
            .into_iter()
            .map(|h| h.map(|h| h.first_seen_ms))
            .collect())
    }

    /// Checks a batch of one partition's ids (key, event time ms, and optionally content digest)
    /// and records the new ones, together with the partition's progress record, in one atomic
    /// write. An empty `progress` leaves the partition's progress record as it is.
    pub fn check_and_record<S: Sent>(
        &self,
        partition: Partition,
        items: &[S],
        progress: &[u8],
    ) -> Result<Vec<Verdict>> {
        self.check_and_record_marked(partition, items, progress, &[])
    }

    /// [`Ledger::check_and_record`], with `marks` applied (as the newest) after the batch is
    /// judged and before it is recorded: a forgotten id published again is judged new and
    /// recorded, and its mark says "resent" durably before the batch can be (see `forget.rs`).
    pub fn check_and_record_marked<S: Sent>(
        &self,
        partition: Partition,
        items: &[S],
        progress: &[u8],
        marks: &[(LedgerKey, Mark)],
    ) -> Result<Vec<Verdict>> {
        let (sorted, slot) = sort_distinct(items.iter().map(Sent::key));
        let mut state = self.lock();
        // Commits happen before this batch is recorded, so that an error (worth a retry) always
        // means the batch was not recorded: a finished background commit is applied, and a full
        // buffer starts the next one.
        self.finish_in_flight(&mut state, false)?;
        if self.buffer_is_full(&state) {
            self.start_commit(&mut state)?;
        }
        let mut found = self.lookup_sorted(&state, &sorted)?;
        forget::forget_override(&state, &sorted, &mut found);
        let rules = Judging {
            limit_ms: self.options.max_window_ms,
            watermark_ms: state.watermark(partition),
            now_ms: crate::clock::now_ms(),
            refresh: self.options.refresh_on_duplicate,
        };
        let (verdicts, batch, late) =
            judge_batch(&state, partition, items, progress, &slot, &found, rules);
        if late > 0 {
            crate::metrics::events::LateRecords {
                partition,
                records: late,
            }
            .emit();
        }
        self.apply_marks(&mut state, marks, MarkOrder::Newest)?;
        self.buffer_batch(&mut state, batch)?;
        self.maybe_seal(&mut state)?;
        Ok(verdicts)
    }

    /// Every copy of `key` held, newest generation first (see [`Sighting`]).
    pub fn sightings(&self, key: &LedgerKey) -> Result<Vec<Sighting>> {
        let state = self.lock();
        self.sightings_in(&state, key)
    }

    /// How far back the ledger remembers one partition's ids: every id of `partition` first seen
    /// after `now_ms - window` is held. `None` when it holds none of that partition's ids.
    pub fn window(&self, partition: Partition, now_ms: i64) -> Option<Duration> {
        State::capped(
            self.lock().window(partition, now_ms),
            self.options.max_window_ms,
        )
    }

    /// Whether only the retention limit bounds `partition`'s window, not the budget: a limit is
    /// set and no generation holding ids of the partition younger than the limit was dropped
    /// for the budget. Such a window falls short of the limit only by how expiry rounds (whole
    /// generations, record times), and every id within the limit is held: with a limit at least
    /// the promise, the promise is kept whatever `window` reads.
    pub fn window_limited(&self, partition: Partition, now_ms: i64) -> bool {
        let Some(limit) = self.options.max_window_ms else {
            return false;
        };
        let floor = now_ms.saturating_sub(limit);
        self.lock()
            .budget_floor
            .get(&partition)
            .is_none_or(|&dropped| dropped < floor)
    }

    /// The window that holds for every partition's ids (see [`Ledger::window`]).
    pub fn window_overall(&self, now_ms: i64) -> Option<Duration> {
        State::capped(
            self.lock().window_overall(now_ms),
            self.options.max_window_ms,
        )
    }

    /// Live generations, oldest first, with their sizes: ids per generation and their time
    /// spans let a caller forecast the window once the budget is full.
    pub fn generations(&self) -> Result<Vec<GenerationInfo>> {
        let state = self.lock();
        self.generation_infos(&state)
    }

    /// Size and reach of the ledger.
    pub fn stats(&self) -> Result<LedgerStats> {
        let state = self.lock();
        self.collect_stats(&state)
    }

    /// The progress record last written for `partition`.
    pub fn progress(&self, partition: Partition) -> Result<Option<Vec<u8>>> {
        let state = self.lock();
        self.read_progress(&state, partition)
    }

    /// Every partition's progress record.
    pub fn all_progress(&self) -> Result<BTreeMap<Partition, Vec<u8>>> {
        let state = self.lock();
        self.read_all_progress(&state)
    }

    /// Commits the buffered batches (the commit in flight first), then flushes every memtable to
    /// SST files (all column families together). In [`Durability::NoWal`] mode this is what makes
    /// recorded batches durable.
    pub fn flush(&self) -> Result<()> {
        let mut state = self.lock();
        self.flush_locked(&mut state)
    }

    /// Writes a consistent checkpoint (hard links where possible) into `dir`, which must not
    /// exist, and returns the progress records it contains. No batch is recorded meanwhile.
    pub fn checkpoint(&self, dir: impl AsRef<Path>) -> Result<BTreeMap<Partition, Vec<u8>>> {
        let mut state = self.lock();
        self.write_checkpoint(&mut state, dir.as_ref())
    }

    /// Copies a checkpoint into `target_dir` so it can be opened as a ledger. Refuses a non-empty
    /// target unless `replace` is set, in which case the target is replaced only once the copy is
    /// complete.
    pub fn restore_from(
        checkpoint_dir: impl AsRef<Path>,
        target_dir: impl AsRef<Path>,
        replace: bool,
    ) -> Result<()> {
        checkpoint::restore(checkpoint_dir.as_ref(), target_dir.as_ref(), replace)
    }

    /// How opening this ledger went.
    pub fn open_report(&self) -> OpenReport {
        self.opened.get().copied().unwrap_or(OpenReport {
            seconds: 0.0,
            index: IndexSource::Empty,
        })
    }

    /// Commits everything buffered and stores the id index in its file, so that the next open
    /// loads it instead of reading every id. Done when the ledger is dropped; callers that want
    /// the error (or the time it takes) call it first.
    pub fn close(&self) -> Result<()> {
        let mut state = self.lock();
        if !state.index.knows() {
            return Ok(());
        }
        self.flush_locked(&mut state)?;
        if state.index_stored_at == Some(state.commit_seq) {
            return Ok(());
        }
        state.index_epoch += 1;
        state.index.finish_growth();
        index_file::write(&self.path, &state, true)?;
        state.index_stored_at = Some(state.commit_seq);
        Ok(())
    }

    /// Drops the ledger without closing it, as a crash would leave it: nothing buffered is
    /// committed and the id index is not stored. For tests of what an open finds after a crash,
    /// and for the bench's timed reopens, which must leave the index file as they found it.
    pub fn drop_without_closing(mut self) {
        self.opened.take();
    }

    /// The ledger directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The options it was opened with.
    pub fn options(&self) -> &LedgerOptions {
        &self.options
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves no half-applied state: the in-memory state is
        // only changed after the RocksDB write succeeded.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn cf(&self, name: &str) -> Result<std::sync::Arc<rocksdb::BoundColumnFamily<'_>>> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| LedgerError::CorruptMetadata {
                what: format!("column family {name} is missing"),
            })
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        // Only a ledger that opened is closed: one refused during its open is left exactly as
        // it was.
        if self.opened.get().is_some() {
            if self.options.build_index {
                // Commits what is buffered (without a WAL it would be lost; with one, the next
                // open would replay it) and stores the id index for the next open.
                let started = std::time::Instant::now();
                match self.close() {
                    Ok(()) => IdIndexStored {
                        path: &self.path,
                        elapsed_ms: started.elapsed().as_millis() as u64,
                        at_close: true,
                    }
                    .emit(),
                    Err(e) => IdIndexNotStored {
                        path: &self.path,
                        when: IndexStore::AtClose,
                        error: &e,
                    }
                    .emit(),
                }
            } else if self.options.durability == Durability::NoWal {
                // Without a WAL, buffered and unflushed batches would be lost on a clean close.
                let _ = self.flush();
            }
        }
        // A background store of the index gives up (a close has just written the file), and
        // its thread does not outlive the ledger.
        self.stop_index_stores();
        // A commit file still being written is left for the next open to remove; its batches
        // are in the log. Wait for the thread so it does not outlive the ledger.
        let in_flight = self.lock().in_flight.take();
        if let Some(job) = in_flight.and_then(|f| f.job) {
            let _ = job.join();
        }
    }
}

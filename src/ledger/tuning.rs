//! How the ledger tunes RocksDB: database options, the options of the small column families, of
//! the generation column families and of the files ingested into them, and the write options each
//! [`Durability`] calls for.

use rocksdb::{BlockBasedOptions, Cache, DBCompressionType, Options, WriteOptions};

use super::{Durability, Ledger, LedgerOptions};

pub(super) fn db_options(options: &LedgerOptions, create: bool) -> Options {
    let mut db = Options::default();
    db.create_if_missing(create);
    db.create_missing_column_families(create);
    db.set_atomic_flush(true);
    // One writer at a time (the ledger lock): concurrent memtable writes would buy nothing.
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
pub(super) fn effective_write_buffer_bytes(options: &LedgerOptions) -> usize {
    let half_generation =
        usize::try_from(options.generation_target_bytes() / 2).unwrap_or(usize::MAX);
    options.write_buffer_bytes.min(half_generation.max(1 << 20))
}

/// Options of the metadata and progress column families. Every commit flushes them, so each
/// gains an L0 file every few seconds, and their compactions queue behind a sealed generation's,
/// which takes minutes at hundreds of millions of ids: with RocksDB's default triggers the 36th
/// file stopped writes, and a flush waited (`WaitUntilFlushWouldNotStallWrites`) until the
/// generation's compaction was done: batches of the billion-id ledger bench stalled 12-30 s. Their
/// files are a few kilobytes each, read by the open, a take-over and once per commit (the
/// progress records): reading a few hundred of them costs milliseconds, so their count neither
/// slows nor stops writes; they are compacted when the compaction thread is free.
pub(super) fn small_cf_options() -> Options {
    let mut cf = Options::default();
    cf.set_write_buffer_size(4 << 20);
    cf.set_level_zero_slowdown_writes_trigger(1 << 20);
    cf.set_level_zero_stop_writes_trigger(1 << 20);
    cf.set_soft_pending_compaction_bytes_limit(0);
    cf.set_hard_pending_compaction_bytes_limit(0);
    cf
}

pub(super) fn generation_cf_options(options: &LedgerOptions, cache: &Cache) -> Options {
    generation_options(options, cache, true)
}

/// Options of the files ingested into a generation: the same table format with a bloom filter,
/// which is several times cheaper to build than a ribbon filter. These files stay in L0 while
/// their generation is active; its compaction at seal rewrites them into one run without filters.
pub(super) fn ingest_file_options(options: &LedgerOptions, cache: &Cache) -> Options {
    generation_options(options, cache, false)
}

/// Options of a bulk load's runs (`load.rs`): the generation's table format, uncompressed and
/// without a filter. Measured loading 50M ids on the project's machine: 10.3 s with a bloom filter
/// and uncompressed runs, 6.8 s without the filter; ZSTD took 100-150 ns per id more, as much as
/// writing the run uncompressed. Without a filter, a lookup that reaches the generation reads a
/// block of each run that may hold the id, so a load of more than a few runs has its generation
/// sealed once it is in, which compacts it into one sorted run (`load.rs`). Uncompressed, the runs
/// take about 29 bytes per id instead of 18 until then.
pub(super) fn load_run_options(options: &LedgerOptions, cache: &Cache) -> Options {
    let mut run = generation_options(options, cache, false);
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    table.set_cache_index_and_filter_blocks(false);
    table.set_block_size(16 << 10);
    table.set_format_version(6);
    table.set_block_restart_interval(options.block_restart_interval);
    run.set_block_based_table_factory(&table);
    run.set_compression_type(DBCompressionType::None);
    run.set_bottommost_compression_type(DBCompressionType::None);
    run
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
    // Ids are buffered and ingested as sorted files, so generation memtables stay empty (only a
    // version 1 ledger's WAL replays into them): RocksDB's default skiplist serves.
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

/// ZSTD level of generation files. Measured at 20M ids: level 3 stores 17.7 bytes per id, level 1
/// 18.5, at the same throughput (compression is a small share of the CPU).
const ZSTD_LEVEL: i32 = 3;

impl Ledger {
    pub(super) fn write_options(&self) -> WriteOptions {
        let mut w = WriteOptions::default();
        match self.options.durability {
            Durability::SyncWal => w.set_sync(true),
            Durability::Wal => {}
            Durability::NoWal => w.disable_wal(true),
        }
        w
    }

    /// For rare metadata changes that must not be lost: synced when there is a WAL.
    pub(super) fn sync_write_options(&self) -> WriteOptions {
        let mut w = WriteOptions::default();
        match self.options.durability {
            Durability::NoWal => w.disable_wal(true),
            _ => w.set_sync(true),
        }
        w
    }
}

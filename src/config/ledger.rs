//! The `[ledger]` section: the worker's RocksDB ledger of seen ids. The worker maps it onto
//! [`crate::ledger::LedgerOptions`] (`ledger_options` in `actors/src/run.rs`); every option not
//! named here keeps the ledger's own default.

use serde::{Deserialize, Serialize};

use super::ByteSize;

/// How much of the most recent ledger writes may be lost in a crash. The ledger's own
/// [`crate::ledger::Durability`] says the same; `actors/src/run.rs` maps one onto the other.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum DurabilityMode {
    /// Batch log fsynced on every batch: nothing recorded is lost, even on power failure; slowest.
    SyncWal,
    /// Batch log written but not synced: a process crash loses nothing, a machine crash may lose a
    /// tail.
    Wal,
    /// No batch log: a crash, even of the process, loses the batches since the last commit (up to
    /// twice `write_buffer_bytes` of ids), which recovery replays from the output topic.
    NoWal,
}

/// The RocksDB ledger.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    /// Disk budget for ids; when reached, the oldest generation is forgotten, so disk use stays
    /// within the budget plus one generation. The in-memory id index is sized from it and takes
    /// about a fifth of it in memory (3.4 GiB for 16 GiB).
    pub budget_bytes: ByteSize,
    /// How many generations the budget is split into (the unit of forgetting).
    pub generations: usize,
    /// What a crash may lose of the most recent batches.
    pub durability: DurabilityMode,
    /// RocksDB's LRU block cache, shared by every generation of the ledger. It holds uncompressed
    /// data blocks (16 KiB each) as they are read, almost all by lookups that reach the disk:
    /// duplicates, and the few new ids (about 6 in 10,000) the id index cannot turn away. Filters
    /// and index blocks are not in it: they stay with the table readers, outside this limit
    /// (`dedupe_ledger_filter_bytes`). It costs up to this much memory, on top of the id index,
    /// and fills only as blocks are read. The worker passes this value to the ledger in place of
    /// the ledger's own default (64 MiB, which the ledger bench runs with).
    pub block_cache_bytes: ByteSize,
    /// Ids buffered in memory between commits (each commit writes one sorted file), at 24 bytes per
    /// id; two buffers' worth can be in memory, one filling and one being committed. With `no-wal`,
    /// a crash may lose up to both, which recovery replays from the output.
    pub write_buffer_bytes: ByteSize,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            // About 950M ids at ~18 bytes per id (the ledger bench measured 17.7-17.8; README,
            // Performance): about 53 hours of ids at 5k ids/s per worker.
            budget_bytes: ByteSize(16 * ByteSize::GIB),
            // Forgetting 1/8 of the window at a time keeps the window within 1/8 (12.5%) of its
            // maximum; the ledger's own default, as the design proposes.
            generations: 8,
            // A process crash loses nothing; measured within a few percent of no-wal (README,
            // Performance: 2.34M and 2.46M ids/s against 2.54M).
            durability: DurabilityMode::Wal,
            // Four times the ledger's own 64 MiB default, for the blocks duplicates read; no
            // measurement of it is recorded. Small next to the id index (3.4 GiB at the default
            // budget); deploy/k8s/worker.yaml's memory request counts it.
            block_cache_bytes: ByteSize(256 * ByteSize::MIB),
            // The ledger's own default: about 2.8M ids per commit at 24 bytes per id, the size
            // the ledger bench was measured with (README, Performance).
            write_buffer_bytes: ByteSize(64 * ByteSize::MIB),
        }
    }
}

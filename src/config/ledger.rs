//! The `[ledger]` section: the worker's RocksDB ledger of seen ids, mapped onto
//! [`crate::ledger::LedgerOptions`] by [`LedgerConfig::options`]; every option not named here
//! keeps the ledger's own default.

use serde::{Deserialize, Serialize};

use super::ByteSize;
use crate::ledger::{Durability, LedgerOptions};

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
    /// What a crash may lose of the most recent batches: `sync-wal` (the batch log fsynced on
    /// every batch: nothing recorded is lost, even on power failure; slowest), `wal` (written, not
    /// synced: a process crash loses nothing, a machine crash may lose a tail), `no-wal` (a crash,
    /// even of the process, loses the batches since the last commit, up to twice
    /// `write_buffer_bytes` of ids, which recovery replays from the output topic).
    pub durability: Durability,
    /// RocksDB's LRU block cache, shared by every generation of the ledger. It holds uncompressed
    /// data blocks (16 KiB each) as they are read, almost all by lookups that reach the disk:
    /// duplicates, and the few new ids (about 6 in 10,000) the id index cannot turn away. Filters
    /// and index blocks are not in it: they stay with the table readers, outside this limit
    /// (`dedupe_ledger_filter_bytes`). It costs up to this much memory, on top of the id index,
    /// and fills only as blocks are read.
    pub block_cache_bytes: ByteSize,
    /// Ids buffered in memory between commits (each commit writes one sorted file), at 24 bytes per
    /// id; two buffers' worth can be in memory, one filling and one being committed. With `no-wal`,
    /// a crash may lose up to both, which recovery replays from the output.
    pub write_buffer_bytes: ByteSize,
    /// The retention limit, seconds (unset: none; the budget alone bounds the window). A copy
    /// arriving more than this after its id's last recorded sighting is published as new; no id's
    /// bytes stay in the ledger or the id changelog longer than this plus one generation's span
    /// (`max_window_secs / generations`). At least `worker.promised_window_secs`.
    pub max_window_secs: Option<u64>,
    /// A dropped copy records its id again at its own time, so a client re-sending one event for
    /// days keeps being caught while it keeps sending (`dedupe_refreshed_ids_total`). With a
    /// retention limit, the limit then counts from the last copy. Default off.
    pub refresh_on_duplicate: bool,
}

/// The least `ledger.budget_bytes` [`Config::validate`](super::Config::validate) accepts with
/// any write buffer: below it a generation holds too few ids to be worth a file of its own.
pub const MIN_BUDGET_BYTES: u64 = 64 * ByteSize::MIB;

/// The largest retention limit (`ledger.max_window_secs`): ten years, far beyond any promise, and
/// small enough that it stays exact in milliseconds.
pub const MAX_RETENTION_LIMIT_SECS: u64 = 10 * 365 * 86_400;

impl LedgerConfig {
    /// The least `budget_bytes` [`Config::validate`](super::Config::validate) accepts beside this
    /// section's `generations` and `write_buffer_bytes`: [`MIN_BUDGET_BYTES`], and room for one
    /// write buffer in each generation (a generation smaller than the buffer would be sealed by
    /// every commit). `dedupe plan` recommends no budget below it.
    pub fn least_budget_bytes(&self) -> u64 {
        let generations = self.generations as u64;
        MIN_BUDGET_BYTES.max(self.write_buffer_bytes.0.saturating_mul(generations))
    }

    /// The ledger options this section asks for.
    pub fn options(&self) -> LedgerOptions {
        LedgerOptions {
            budget_bytes: self.budget_bytes.0,
            generations: self.generations as u32,
            durability: self.durability,
            block_cache_bytes: self.block_cache_bytes.0 as usize,
            write_buffer_bytes: self.write_buffer_bytes.0 as usize,
            max_window_ms: self
                .max_window_secs
                .map(|s| (s as i64).saturating_mul(1000)),
            refresh_on_duplicate: self.refresh_on_duplicate,
            ..LedgerOptions::default()
        }
    }

    /// The options of maintenance commands (stats, offline snapshots, checking a checkpoint,
    /// explain): the id index is not built, so opening a large ledger is quick and takes no index
    /// memory.
    pub fn maintenance_options(&self) -> LedgerOptions {
        LedgerOptions {
            build_index: false,
            ..self.options()
        }
    }
}

impl Default for LedgerConfig {
    /// The ledger's own defaults ([`LedgerOptions::default`]), stated there once: a 16 GiB budget
    /// (about 830M ids at ~21 bytes per id with content digests, as `dedupe plan` counts them;
    /// about 46 hours of ids at 5k ids/s per worker) in 8 generations (forgetting 1/8 of the window at a time), `wal` (a process
    /// crash loses nothing; within a few percent of `no-wal`), a 64 MiB block cache (what the
    /// ledger bench measured with) and 64 MiB write buffers (about 2.8M ids per commit).
    fn default() -> Self {
        let ledger = LedgerOptions::default();
        Self {
            budget_bytes: ByteSize(ledger.budget_bytes),
            generations: ledger.generations as usize,
            durability: ledger.durability,
            block_cache_bytes: ByteSize(ledger.block_cache_bytes as u64),
            write_buffer_bytes: ByteSize(ledger.write_buffer_bytes as u64),
            max_window_secs: None,
            refresh_on_duplicate: ledger.refresh_on_duplicate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// A default configuration with `ledger` as its ledger section.
    fn with(ledger: LedgerConfig) -> Config {
        Config {
            ledger,
            ..Config::default()
        }
    }

    #[test]
    fn the_least_budget_is_the_least_that_validate_accepts() {
        // The default write buffer (64 MiB) in each of the 8 generations: 512 MiB, above the floor.
        let default = LedgerConfig::default();
        assert_eq!(default.least_budget_bytes(), 512 * ByteSize::MIB);
        // The smallest write buffer in 2 generations leaves the floor itself.
        let small = LedgerConfig {
            write_buffer_bytes: ByteSize(4 * ByteSize::MIB),
            generations: 2,
            ..LedgerConfig::default()
        };
        assert_eq!(small.least_budget_bytes(), MIN_BUDGET_BYTES);
        for ledger in [default, small] {
            let least = ledger.least_budget_bytes();
            // Exactly the least is accepted, one byte less refused, naming a ledger key.
            let at = LedgerConfig {
                budget_bytes: ByteSize(least),
                ..ledger.clone()
            };
            assert!(with(at).validate().is_ok(), "{least}");
            let under = LedgerConfig {
                budget_bytes: ByteSize(least - 1),
                ..ledger
            };
            let err = with(under).validate().unwrap_err().to_string();
            assert!(err.starts_with("ledger."), "{err}");
        }
    }
}

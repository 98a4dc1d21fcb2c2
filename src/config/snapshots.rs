//! The `[snapshots]` section: ledger checkpoints and the hook that snapshots them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Ledger checkpoints ("EBS snapshots").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SnapshotConfig {
    /// Where checkpoints are written (on the same filesystem as the ledger: they are hard links).
    pub dir: Option<PathBuf>,
    /// Seconds between scheduled checkpoints; 0 turns the schedule off. At least
    /// `min_interval_secs` when on.
    pub interval_secs: u64,
    /// Fewest seconds from the start of one checkpoint to the start of the next, requested or
    /// scheduled (at least 1): a request sooner is answered 429 with `Retry-After`, a scheduled one
    /// sooner is skipped. Each checkpoint commits what the ledger holds in memory into a new file,
    /// so this bounds the files and descriptors a stream of requests can add.
    pub min_interval_secs: u64,
    /// How many checkpoints to keep (the newest). Pruning also keeps the newest checkpoint older
    /// than an hour while none of those kept is, so a burst of checkpoints never leaves only
    /// minutes-old ones.
    pub keep: usize,
    /// A command run after each checkpoint, with DEDUPE_SNAPSHOT_DIR and DEDUPE_SNAPSHOT_PARTITIONS set.
    /// It runs in a process group of its own with a clean environment: `PATH`, `HOME`, `LANG`,
    /// `TZ`, `TMPDIR` and the variables named in `hook_env`, never the worker's secrets.
    pub hook: Option<String>,
    /// Names of further environment variables the hook receives (e.g. a cloud CLI's profile).
    pub hook_env: Vec<String>,
    /// How long the hook may run before its whole process group is killed.
    pub hook_timeout_secs: u64,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        Self {
            // No checkpoints until a directory on the ledger's filesystem is named.
            dir: None,
            // Hourly: a restore replays the output topic from the checkpoint onward, so at most
            // about an hour of it.
            interval_secs: 3600,
            // A minute: far more often than a restore needs, and a client posting in a loop then
            // adds at most one file a minute to the active generation, which is never compacted.
            min_interval_secs: 60,
            // The newest and two older ones, should the newest be unusable.
            keep: 3,
            hook: None,
            hook_env: Vec::new(),
            // Ten minutes: a volume snapshot API call, with retries, finishes well within it.
            hook_timeout_secs: 600,
        }
    }
}

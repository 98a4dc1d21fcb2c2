//! Ledger snapshots: a RocksDB checkpoint (hard links, no copy) in a timestamped directory under
//! `snapshots.dir`, the last `snapshots.keep` of them kept, then an operator hook (e.g. a cloud
//! CLI that snapshots the volume) run with the checkpoint's path and partitions in its
//! environment. A failure is reported to the caller, which counts and logs it; it never stops
//! the pipeline.
//!
//! Restoring copies a checkpoint into the ledger directory while the worker is stopped; the next
//! start replays the output tail from the checkpoint's progress records, so a restore loses
//! nothing that the output topic still retains.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Environment variable the hook receives: the checkpoint directory.
pub const ENV_SNAPSHOT_DIR: &str = "DEDUPE_SNAPSHOT_DIR";
/// Environment variable the hook receives: the partitions the checkpoint holds progress for.
pub const ENV_SNAPSHOT_PARTITIONS: &str = "DEDUPE_SNAPSHOT_PARTITIONS";
/// Every snapshot directory's name starts with this.
pub const SNAPSHOT_PREFIX: &str = "ledger-";

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("creating the snapshot directory {dir}: {source}")]
    CreateDir { dir: PathBuf, source: std::io::Error },
    #[error("checkpointing the ledger into {dir}: {message}")]
    Checkpoint { dir: PathBuf, message: String },
    #[error("the snapshot hook `{hook}` failed: {message}")]
    Hook { hook: String, message: String },
    #[error("pruning old snapshots in {dir}: {source}")]
    Prune { dir: PathBuf, source: std::io::Error },
}

impl SnapshotError {
    /// The metric label of the stage that failed.
    pub fn stage(&self) -> &'static str {
        match self {
            Self::CreateDir { .. } | Self::Checkpoint { .. } => "checkpoint",
            Self::Hook { .. } => "hook",
            Self::Prune { .. } => "prune",
        }
    }
}

/// A fresh, sortable snapshot directory name under `root`: `ledger-<unix ms>`.
pub fn next_snapshot_dir(root: &Path) -> PathBuf {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    root.join(format!("{SNAPSHOT_PREFIX}{ms:015}"))
}

/// Snapshot directories under `root`, oldest first.
pub fn list_snapshots(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = match std::fs::read_dir(root) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(SNAPSHOT_PREFIX))
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .map(|e| e.path())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    dirs.sort();
    Ok(dirs)
}

/// Removes all but the newest `keep` snapshots.
pub fn prune(root: &Path, keep: usize) -> Result<Vec<PathBuf>, SnapshotError> {
    let dirs = list_snapshots(root).map_err(|source| SnapshotError::Prune { dir: root.to_path_buf(), source })?;
    let excess = dirs.len().saturating_sub(keep);
    let mut removed = Vec::new();
    for dir in dirs.into_iter().take(excess) {
        std::fs::remove_dir_all(&dir).map_err(|source| SnapshotError::Prune { dir: dir.clone(), source })?;
        removed.push(dir);
    }
    Ok(removed)
}

/// Runs the operator's hook through `sh -c`, with the snapshot's path and partitions in its
/// environment, and waits at most `timeout` for it.
pub fn run_hook(hook: &str, dir: &Path, partitions: &[u32], timeout: Duration) -> Result<(), SnapshotError> {
    let list = partitions.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let err = |message: String| SnapshotError::Hook { hook: hook.to_string(), message };
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(hook)
        .env(ENV_SNAPSHOT_DIR, dir)
        .env(ENV_SNAPSHOT_PARTITIONS, &list)
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| err(format!("cannot start it: {e}")))?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(err(format!("it exited with {status}"))),
            Ok(None) if std::time::Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(err(format!("it ran longer than {}s and was killed", timeout.as_secs())));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(err(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_the_newest() {
        let root = tempfile::tempdir().unwrap();
        for ms in [3, 1, 2, 4] {
            std::fs::create_dir(root.path().join(format!("{SNAPSHOT_PREFIX}{ms:015}"))).unwrap();
        }
        std::fs::create_dir(root.path().join("unrelated")).unwrap();
        let removed = prune(root.path(), 2).unwrap();
        assert_eq!(removed.len(), 2);
        let left: Vec<String> = list_snapshots(root.path())
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, vec![format!("{SNAPSHOT_PREFIX}{:015}", 3), format!("{SNAPSHOT_PREFIX}{:015}", 4)]);
        // Other directories are never touched.
        assert!(root.path().join("unrelated").exists());
    }

    #[test]
    fn hook_gets_its_environment_and_failures_are_errors() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("out");
        let hook = format!("echo \"${ENV_SNAPSHOT_DIR} ${ENV_SNAPSHOT_PARTITIONS}\" > {}", out.display());
        run_hook(&hook, Path::new("/snap/x"), &[0, 3], Duration::from_secs(10)).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "/snap/x 0,3");
        let e = run_hook("exit 7", Path::new("/x"), &[], Duration::from_secs(10)).unwrap_err();
        assert_eq!(e.stage(), "hook");
        assert!(e.to_string().contains("exit status: 7"), "{e}");
        let e = run_hook("sleep 5", Path::new("/x"), &[], Duration::from_millis(200)).unwrap_err();
        assert!(e.to_string().contains("killed"), "{e}");
    }
}

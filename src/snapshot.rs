//! Ledger snapshots: a RocksDB checkpoint (hard links, no copy) in a timestamped directory under
//! `snapshots.dir`, the last `snapshots.keep` of them kept (and one older than an hour, see
//! [`prune`]), then an operator hook (e.g. a cloud CLI that snapshots the volume) run with the
//! checkpoint's path and partitions in its environment. A failure is reported to the caller,
//! which counts and logs it; it never stops the pipeline.
//!
//! [`SnapshotPace`] starts at most one snapshot per `snapshots.min_interval_secs`: each checkpoint
//! commits what the ledger holds in memory into a new file, so requests in a loop would otherwise
//! add files and open descriptors as fast as they come, and prune away every older checkpoint.
//!
//! Restoring copies a checkpoint into the ledger directory while the worker is stopped; the next
//! start replays the output tail from the checkpoint's progress records, so a restore loses
//! nothing that the output topic still retains.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Environment variable the hook receives: the checkpoint directory.
pub const ENV_SNAPSHOT_DIR: &str = "DEDUPE_SNAPSHOT_DIR";
/// Environment variable the hook receives: the partitions the checkpoint holds progress for.
pub const ENV_SNAPSHOT_PARTITIONS: &str = "DEDUPE_SNAPSHOT_PARTITIONS";
/// Every snapshot directory's name starts with this.
pub const SNAPSHOT_PREFIX: &str = "ledger-";

/// Environment variables every hook receives when the worker has them; nothing else is passed
/// unless named in `snapshots.hook_env`, so the worker's secrets never reach the hook.
pub const HOOK_BASE_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];
/// Prefix of a checkpoint still being written; never listed, pruned or handed to a hook.
const PARTIAL_PREFIX: &str = ".partial-";
/// A snapshot older than this is an old one: pruning keeps the newest such while none of the
/// newest `snapshots.keep` is, so a burst of snapshots never leaves only minutes-old ones.
pub const OLD_SNAPSHOT_AGE: Duration = Duration::from_secs(3600);
/// How much sooner than `snapshots.min_interval_secs` a scheduled snapshot may start: a timer's
/// ticks come a little late by varying amounts, and a schedule as long as the least interval must
/// not be skipped for that.
const SCHEDULE_SLACK: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshots.dir is not configured")]
    NotConfigured,
    #[error("a snapshot is already being taken; try again when it has finished")]
    Busy,
    #[error("the last snapshot started less than snapshots.min_interval_secs ago; try again in {} s", retry_after.as_secs_f64().ceil())]
    TooSoon { retry_after: Duration },
    #[error("the worker is stopping")]
    Stopping,
    #[error("creating the snapshot directory {dir}: {source}")]
    CreateDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("checkpointing the ledger into {dir}: {source}")]
    Checkpoint {
        dir: PathBuf,
        source: crate::ledger::LedgerError,
    },
    #[error("moving the finished checkpoint to {dir}: {source}")]
    Publish {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("the snapshot hook `{hook}` failed: {failure}")]
    Hook { hook: String, failure: HookFailure },
    #[error("pruning old snapshots in {dir}: {source}")]
    Prune {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// How a snapshot hook failed.
#[derive(Debug, thiserror::Error)]
pub enum HookFailure {
    #[error("it could not be started: {0}")]
    Start(std::io::Error),
    #[error("it exited with {0}")]
    Exit(std::process::ExitStatus),
    #[error("it ran longer than {}s; its process group was killed", .0.as_secs())]
    TimedOut(Duration),
    #[error("waiting for it failed: {0}")]
    Wait(std::io::Error),
}

impl SnapshotError {
    /// The metric label of the stage that failed.
    pub fn stage(&self) -> &'static str {
        match self {
            Self::NotConfigured | Self::Busy | Self::TooSoon { .. } | Self::Stopping => "refused",
            Self::CreateDir { .. } | Self::Checkpoint { .. } | Self::Publish { .. } => "checkpoint",
            Self::Hook { .. } => "hook",
            Self::Prune { .. } => "prune",
        }
    }
}

/// What asks for a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// An operator, through the admin endpoint.
    Requested,
    /// The `snapshots.interval_secs` schedule.
    Scheduled,
}

/// At most one snapshot started per `min_interval`, whatever asks for it. Time is passed in, so
/// the decision is tested without a clock.
#[derive(Debug, Clone)]
pub struct SnapshotPace {
    min_interval: Duration,
    last_start: Option<Instant>,
}

impl SnapshotPace {
    /// A pace with no snapshot started yet: the first may start at once.
    pub fn new(min_interval: Duration) -> Self {
        Self {
            min_interval,
            last_start: None,
        }
    }

    /// Records a snapshot starting at `now`, or refuses it with [`SnapshotError::TooSoon`] and how
    /// long until one may start. A start counts whether or not the snapshot then succeeds: a
    /// failing checkpoint costs a flush like any other.
    pub fn try_start(&mut self, now: Instant, trigger: Trigger) -> Result<(), SnapshotError> {
        if let Some(last) = self.last_start {
            let slack = if trigger == Trigger::Scheduled {
                SCHEDULE_SLACK
            } else {
                Duration::ZERO
            };
            let due = last + self.min_interval.saturating_sub(slack);
            if now < due {
                return Err(SnapshotError::TooSoon {
                    retry_after: last + self.min_interval - now,
                });
            }
        }
        self.last_start = Some(now);
        Ok(())
    }
}

/// Where a new snapshot is written, then published.
#[derive(Debug, Clone)]
pub struct SnapshotSlot {
    /// The checkpoint is written here (a name [`list_snapshots`] ignores)...
    pub partial: PathBuf,
    /// ...and renamed to this once complete: `ledger-<unix ms>`, unique under the root.
    pub dir: PathBuf,
}

impl SnapshotSlot {
    /// Reserves a fresh, sortable name under `root` (created if missing): the current time in
    /// milliseconds, moved on past any name already taken.
    pub fn reserve(root: &Path) -> Result<Self, SnapshotError> {
        std::fs::create_dir_all(root).map_err(|source| SnapshotError::CreateDir {
            dir: root.to_path_buf(),
            source,
        })?;
        let mut ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        loop {
            let name = format!("{SNAPSHOT_PREFIX}{ms:015}");
            let slot = Self {
                partial: root.join(format!("{PARTIAL_PREFIX}{name}")),
                dir: root.join(name),
            };
            if !slot.dir.exists() && !slot.partial.exists() {
                return Ok(slot);
            }
            ms += 1;
        }
    }

    /// Moves the complete checkpoint to its published name.
    pub fn publish(&self) -> Result<(), SnapshotError> {
        std::fs::rename(&self.partial, &self.dir).map_err(|source| SnapshotError::Publish {
            dir: self.dir.clone(),
            source,
        })
    }

    /// Removes what a failed checkpoint left behind.
    pub fn discard(&self) {
        let _ = std::fs::remove_dir_all(&self.partial);
    }
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

/// When the snapshot in `dir` was taken (Unix ms): the number in its `ledger-<ms>` name, if it
/// has one.
pub fn taken_at_ms(dir: &Path) -> Option<i64> {
    dir.file_name()?
        .to_str()?
        .strip_prefix(SNAPSHOT_PREFIX)?
        .parse()
        .ok()
}

/// Removes all but the newest `keep` snapshots and, while none of those is older than
/// [`OLD_SNAPSHOT_AGE`] at `now_ms` (Unix ms), the newest one that is. With a retention limit
/// (`limit_ms`), every snapshot taken longer ago than the limit goes too, kept or not: it holds
/// ids the ledger has let go of. Returns what it removed.
pub fn prune(
    root: &Path,
    keep: usize,
    now_ms: i64,
    limit_ms: Option<i64>,
) -> Result<Vec<PathBuf>, SnapshotError> {
    let dirs = list_snapshots(root).map_err(|source| SnapshotError::Prune {
        dir: root.to_path_buf(),
        source,
    })?;
    let mut removed = Vec::new();
    let past_limit = |dir: &&PathBuf| {
        taken_at_ms(dir).is_some_and(|t| crate::ledger::past_limit(limit_ms, t, now_ms))
    };
    let by_count = prunable(&dirs, keep, now_ms);
    let gone = dirs
        .iter()
        .filter(|d| by_count.contains(d) || past_limit(d));
    for dir in gone {
        std::fs::remove_dir_all(dir).map_err(|source| SnapshotError::Prune {
            dir: dir.clone(),
            source,
        })?;
        removed.push(dir.clone());
    }
    Ok(removed)
}

/// Which of `dirs` (oldest first, as [`list_snapshots`] gives them) [`prune`] removes.
fn prunable(dirs: &[PathBuf], keep: usize, now_ms: i64) -> Vec<&PathBuf> {
    let old_ms = i64::try_from(OLD_SNAPSHOT_AGE.as_millis()).unwrap_or(i64::MAX);
    let is_old =
        |dir: &PathBuf| taken_at_ms(dir).is_some_and(|t| now_ms.saturating_sub(t) > old_ms);
    let (older, kept) = dirs.split_at(dirs.len().saturating_sub(keep));
    // Names sort by time (fixed-width milliseconds), so the last old one is the newest.
    let anchor = if kept.iter().any(is_old) {
        None
    } else {
        older.iter().rposition(is_old)
    };
    older
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != anchor)
        .map(|(_, dir)| dir)
        .collect()
}

/// Runs the operator's hook through `sh -c`, with the snapshot's path and partitions, the
/// variables of [`HOOK_BASE_ENV`] and those named in `pass_env` in an otherwise empty
/// environment, in a process group of its own; waits at most `timeout`, then kills the group.
pub fn run_hook(
    hook: &str,
    dir: &Path,
    partitions: &[crate::Partition],
    pass_env: &[String],
    timeout: Duration,
) -> Result<(), SnapshotError> {
    use std::os::unix::process::CommandExt;
    let list = partitions
        .iter()
        .map(crate::Partition::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let err = |failure: HookFailure| SnapshotError::Hook {
        hook: hook.to_string(),
        failure,
    };
    let kept = HOOK_BASE_ENV
        .iter()
        .copied()
        .chain(pass_env.iter().map(String::as_str))
        .filter_map(|name| std::env::var_os(name).map(|v| (name.to_string(), v)));
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(hook)
        .env_clear()
        .envs(kept)
        .env(ENV_SNAPSHOT_DIR, dir)
        .env(ENV_SNAPSHOT_PARTITIONS, &list)
        .stdin(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| err(HookFailure::Start(e)))?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(err(HookFailure::Exit(status))),
            Ok(None) if std::time::Instant::now() > deadline => {
                // The hook leads its own group: the shell and everything it started go together.
                if let Ok(pgid) = i32::try_from(child.id()) {
                    // SAFETY: kill(2) with a negative pid signals that process group; no memory is involved.
                    unsafe { libc::kill(-pgid, libc::SIGKILL) };
                }
                let _ = child.wait();
                return Err(err(HookFailure::TimedOut(timeout)));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(err(HookFailure::Wait(e))),
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
        // `now` is a few ms on: nothing is an hour old, so only the count matters.
        let removed = prune(root.path(), 2, 10, None).unwrap();
        assert_eq!(removed.len(), 2);
        let left: Vec<String> = list_snapshots(root.path())
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            left,
            vec![
                format!("{SNAPSHOT_PREFIX}{:015}", 3),
                format!("{SNAPSHOT_PREFIX}{:015}", 4)
            ]
        );
        // Other directories are never touched.
        assert!(root.path().join("unrelated").exists());
    }

    const MINUTE_MS: i64 = 60_000;
    const HOUR_MS: i64 = 60 * MINUTE_MS;

    /// Snapshot directories taken at these Unix ms, oldest first, as `list_snapshots` gives them.
    fn taken_at(ms: &[i64]) -> Vec<PathBuf> {
        ms.iter()
            .map(|ms| PathBuf::from(format!("/snaps/{SNAPSHOT_PREFIX}{ms:015}")))
            .collect()
    }

    /// The times of the snapshots `prune` would remove.
    fn pruned(ms: &[i64], keep: usize, now_ms: i64) -> Vec<i64> {
        prunable(&taken_at(ms), keep, now_ms)
            .into_iter()
            .filter_map(|d| taken_at_ms(d))
            .collect()
    }

    #[test]
    fn prune_keeps_one_snapshot_older_than_an_hour() {
        let now = 100 * HOUR_MS;
        // Hourly snapshots, then three a minute apart (a burst of requests): the three are kept,
        // and so is the newest of the hourly ones, the only one older than an hour kept.
        let hourly = [
            now - 3 * HOUR_MS,
            now - 2 * HOUR_MS,
            now - HOUR_MS - MINUTE_MS,
        ];
        let burst = [now - 2 * MINUTE_MS, now - MINUTE_MS, now];
        let all: Vec<i64> = hourly.iter().chain(&burst).copied().collect();
        assert_eq!(pruned(&all, 3, now), [now - 3 * HOUR_MS, now - 2 * HOUR_MS]);
        // One of those kept is already older than an hour: the count alone decides.
        let all = [now - 3 * HOUR_MS, now - 2 * HOUR_MS, now - MINUTE_MS, now];
        assert_eq!(pruned(&all, 3, now), [now - 3 * HOUR_MS]);
        // No snapshot is older than an hour: the count alone decides.
        let all = [
            now - 40 * MINUTE_MS,
            now - 30 * MINUTE_MS,
            now - 20 * MINUTE_MS,
            now - 10 * MINUTE_MS,
            now,
        ];
        assert_eq!(
            pruned(&all, 3, now),
            [now - 40 * MINUTE_MS, now - 30 * MINUTE_MS]
        );
        // Exactly an hour old is not older than an hour.
        let all = [now - HOUR_MS, now - 2 * MINUTE_MS, now - MINUTE_MS, now];
        assert_eq!(pruned(&all, 3, now), [now - HOUR_MS]);
        // Fewer than `keep`: nothing is removed.
        assert!(pruned(&[now - 5 * HOUR_MS, now], 3, now).is_empty());
    }

    #[test]
    fn prune_on_disk_keeps_the_old_one_and_never_counts_a_name_without_a_time_as_old() {
        let root = tempfile::tempdir().unwrap();
        let now = 100 * HOUR_MS;
        let names: Vec<String> = [now - 2 * HOUR_MS, now - 2 * MINUTE_MS, now - MINUTE_MS, now]
            .iter()
            .map(|ms| format!("{SNAPSHOT_PREFIX}{ms:015}"))
            .chain([format!("{SNAPSHOT_PREFIX}copy")])
            .collect();
        for name in &names {
            std::fs::create_dir(root.path().join(name)).unwrap();
        }
        // `ledger-copy` sorts last, so it is among the newest three; it has no time, so it is not
        // an old one, and the two-hour-old snapshot stays beside the three kept.
        let removed = prune(root.path(), 3, now, None).unwrap();
        assert_eq!(removed, [root.path().join(&names[1])]);
        assert_eq!(list_snapshots(root.path()).unwrap().len(), 4);
        // With a 90-minute retention limit the two-hour-old one goes too, kept or not: it holds
        // ids the ledger has let go of.
        let removed = prune(root.path(), 3, now, Some(90 * MINUTE_MS)).unwrap();
        assert_eq!(removed, [root.path().join(&names[0])]);
        assert_eq!(list_snapshots(root.path()).unwrap().len(), 3);
    }

    #[test]
    fn one_snapshot_starts_per_interval_whatever_asks() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let mut pace = SnapshotPace::new(secs(60));
        // The first starts at once.
        pace.try_start(t0, Trigger::Requested).unwrap();
        // A request 10.5 s later waits the 49.5 s left (Retry-After rounds it up to 50).
        let e = pace
            .try_start(t0 + Duration::from_millis(10_500), Trigger::Requested)
            .unwrap_err();
        assert!(
            matches!(e, SnapshotError::TooSoon { retry_after } if retry_after == Duration::from_millis(49_500)),
            "{e:?}"
        );
        assert!(e.to_string().contains("try again in 50 s"), "{e}");
        assert_eq!(e.stage(), "refused");
        // A scheduled one is refused too, and neither refusal moves the interval's start.
        assert!(pace.try_start(t0 + secs(30), Trigger::Scheduled).is_err());
        pace.try_start(t0 + secs(60), Trigger::Requested).unwrap();
        // The next interval runs from that start.
        assert!(pace.try_start(t0 + secs(119), Trigger::Requested).is_err());
        pace.try_start(t0 + secs(120), Trigger::Requested).unwrap();
    }

    #[test]
    fn a_schedule_as_long_as_the_interval_is_not_skipped_for_a_late_tick() {
        let t0 = Instant::now();
        let mut pace = SnapshotPace::new(Duration::from_secs(60));
        // The first tick came 300 ms late, the second on time: 59.7 s apart.
        pace.try_start(t0 + Duration::from_millis(300), Trigger::Scheduled)
            .unwrap();
        pace.try_start(t0 + Duration::from_secs(60), Trigger::Scheduled)
            .unwrap();
        // A request at that moment would have been refused.
        let mut pace = SnapshotPace::new(Duration::from_secs(60));
        pace.try_start(t0 + Duration::from_millis(300), Trigger::Requested)
            .unwrap();
        assert!(pace
            .try_start(t0 + Duration::from_secs(60), Trigger::Requested)
            .is_err());
    }

    #[test]
    fn hook_gets_its_environment_and_failures_are_errors() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("out");
        let hook = format!(
            "echo \"${ENV_SNAPSHOT_DIR} ${ENV_SNAPSHOT_PARTITIONS}\" > {}",
            out.display()
        );
        run_hook(
            &hook,
            Path::new("/snap/x"),
            &[0, 3],
            &[],
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "/snap/x 0,3");
        let e = run_hook("exit 7", Path::new("/x"), &[], &[], Duration::from_secs(10)).unwrap_err();
        assert_eq!(e.stage(), "hook");
        assert!(e.to_string().contains("exit status: 7"), "{e}");
        let e = run_hook(
            "sleep 5",
            Path::new("/x"),
            &[],
            &[],
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(e.to_string().contains("killed"), "{e}");
    }

    #[test]
    fn the_hook_never_sees_the_workers_secrets() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("env");
        // SAFETY (test): this test alone reads or writes these variables.
        std::env::set_var("DEDUPE_KAFKA_SASL_PASSWORD", "hunter2");
        std::env::set_var("DEDUPE_WRITE_KEYS", "wk-secret=web");
        std::env::set_var("SNAPSHOT_TEST_PROFILE", "backup-profile");
        let hook = format!("env > {}", out.display());
        run_hook(
            &hook,
            Path::new("/snap/x"),
            &[1],
            &["SNAPSHOT_TEST_PROFILE".to_string()],
            Duration::from_secs(10),
        )
        .unwrap();
        let env = std::fs::read_to_string(&out).unwrap();
        assert!(
            !env.contains("hunter2") && !env.contains("wk-secret"),
            "{env}"
        );
        assert!(
            env.contains("SNAPSHOT_TEST_PROFILE=backup-profile"),
            "{env}"
        );
        assert!(env.contains("PATH="), "{env}");
    }

    #[test]
    fn a_hook_that_times_out_is_killed_with_its_children() {
        let root = tempfile::tempdir().unwrap();
        let pid_file = root.path().join("child.pid");
        // The shell starts a background child that would outlive a kill of the shell alone.
        let hook = format!("sleep 30 & echo $! > {}; wait", pid_file.display());
        let e = run_hook(&hook, Path::new("/x"), &[], &[], Duration::from_millis(500)).unwrap_err();
        assert!(
            matches!(
                e,
                SnapshotError::Hook {
                    failure: HookFailure::TimedOut(_),
                    ..
                }
            ),
            "{e}"
        );
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The child was killed with its group (it may linger a moment as a zombie of init).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let gone = state.is_empty() || state.split_whitespace().nth(2) == Some("Z");
            if gone {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the hook's child {pid} outlived the timeout: {state}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn reserved_names_are_unique_and_partial_checkpoints_are_never_listed() {
        let root = tempfile::tempdir().unwrap();
        let mut names = std::collections::HashSet::new();
        for _ in 0..50 {
            let slot = SnapshotSlot::reserve(root.path()).unwrap();
            assert!(
                names.insert(slot.dir.clone()),
                "{} reserved twice",
                slot.dir.display()
            );
            std::fs::create_dir(&slot.partial).unwrap();
            // Not yet published: invisible to listing and pruning.
            assert!(!list_snapshots(root.path()).unwrap().contains(&slot.dir));
            slot.publish().unwrap();
        }
        assert_eq!(list_snapshots(root.path()).unwrap().len(), 50);
    }
}

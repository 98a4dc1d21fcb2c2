//! The ledger phase: the run's ids inserted in batches, each call timed, the directory sampled.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::disk::{dir_bytes, DiskUse};
use super::ids::IdStream;
use super::{progress_bar, BenchError, LedgerBenchConfig};
use crate::identity::{ContentDigest, LedgerKey};
use crate::ledger::{Ledger, Verdict, INDEX_FILE};

/// How often (in batches) disk use and generations are sampled.
const SAMPLE_EVERY_BATCHES: u64 = 32;
/// A `check_and_record` call slower than this is logged with the ids recorded so far: what the
/// ledger logged just before it (a seal, a doubling of the index) tells the stall's cause.
const SLOW_BATCH: Duration = Duration::from_secs(1);

/// What inserting the ids measured.
pub(super) struct InsertRun {
    /// Time inside `check_and_record`, and its slowest call.
    pub(super) timed: Duration,
    pub(super) slowest: Duration,
    pub(super) wall_secs: f64,
    pub(super) done: u64,
    pub(super) duplicates_found: u64,
    pub(super) duplicates_expected: u64,
    pub(super) max_disk: DiskUse,
    /// Ids done, and time taken, when the oldest generation was first dropped.
    pub(super) aging_started: Option<(u64, Duration)>,
    /// The index file a checkpoint at 90% of the ids carried.
    pub(super) crash_index: Option<PathBuf>,
}

impl InsertRun {
    /// Refuses a run that found other duplicates than it re-sent, when nothing aged out.
    pub(super) fn check(&self, config: &LedgerBenchConfig) -> Result<(), BenchError> {
        if config.budget_bytes.is_none() && self.duplicates_found != self.duplicates_expected {
            return Err(BenchError::Wrong(format!(
                "{} duplicates found, {} re-sent",
                self.duplicates_found, self.duplicates_expected
            )));
        }
        Ok(())
    }

    /// Ids per second before and after the oldest generation was first dropped, once it was.
    pub(super) fn aging_rates(&self) -> (Option<f64>, Option<f64>) {
        match self.aging_started {
            Some((ids, at)) if self.done > ids => (
                Some(ids as f64 / at.as_secs_f64()),
                Some((self.done - ids) as f64 / (self.timed - at).as_secs_f64()),
            ),
            _ => (None, None),
        }
    }
}

/// Inserts the run's ids in batches, timing each call, sampling the directory, and keeping the
/// index file a checkpoint at 90% of the ids carries.
pub(super) fn insert_all(
    config: &LedgerBenchConfig,
    ledger: &Ledger,
    root: &Path,
    ledger_dir: &Path,
) -> Result<InsertRun, BenchError> {
    let mut stream = IdStream::new(config.seed, config.dup_ratio, config.batch);
    let mut items = Vec::with_capacity(config.batch);
    let mut digested: Vec<(LedgerKey, i64, Option<ContentDigest>)> =
        Vec::with_capacity(config.batch);
    let bar = progress_bar(config, config.keys, "ledger");
    let wall = Instant::now();
    let mut run = InsertRun {
        timed: Duration::ZERO,
        slowest: Duration::ZERO,
        wall_secs: 0.0,
        done: 0,
        duplicates_found: 0,
        duplicates_expected: 0,
        max_disk: DiskUse::default(),
        aging_started: None,
        crash_index: None,
    };
    let mut batches = 0u64;
    let mut first_generation = None;
    let checkpoint_at = config.keys / 10 * 9;
    while run.done < config.keys {
        if run.crash_index.is_none() && run.done >= checkpoint_at && run.done > 0 {
            run.crash_index = Some(keep_checkpoint_index(ledger, root, ledger_dir)?);
        }
        let n = (config.keys - run.done).min(config.batch as u64) as usize;
        run.duplicates_expected += stream.next_batch(n, &mut items);
        let progress = (batches + 1).to_le_bytes();
        let started = Instant::now();
        let verdicts = if config.digests {
            // A digest per id, the same for its re-sent copies (retries).
            digested.clear();
            digested.extend(
                items
                    .iter()
                    .map(|&(key, t)| (key, t, Some(ContentDigest::of_value(key.as_bytes())))),
            );
            ledger.check_and_record(0, &digested, &progress)?
        } else {
            ledger.check_and_record(0, &items, &progress)?
        };
        let took = started.elapsed();
        run.timed += took;
        run.slowest = run.slowest.max(took);
        if took > SLOW_BATCH {
            tracing::info!(
                ids = run.done,
                took_ms = took.as_millis() as u64,
                "A batch was slow."
            );
        }
        run.duplicates_found += verdicts
            .iter()
            .filter(|v| matches!(v, Verdict::Duplicate { .. }))
            .count() as u64;
        run.done += n as u64;
        batches += 1;
        if batches.is_multiple_of(SAMPLE_EVERY_BATCHES) {
            run.max_disk = run.max_disk.peak(dir_bytes(ledger_dir));
            if run.aging_started.is_none() && config.budget_bytes.is_some() {
                let oldest = ledger.generations()?.first().map(|g| g.meta.id);
                if first_generation.is_none() {
                    first_generation = oldest;
                } else if oldest != first_generation {
                    run.aging_started = Some((run.done, run.timed));
                }
            }
            bar.set_position(run.done);
        }
    }
    bar.finish_and_clear();
    run.wall_secs = wall.elapsed().as_secs_f64();
    Ok(run)
}

/// A snapshot late in the run: it carries the index file stored after the last seal, as a crash
/// from here on would find it. Keeps that file (returned) and drops the rest. Not timed.
fn keep_checkpoint_index(
    ledger: &Ledger,
    root: &Path,
    ledger_dir: &Path,
) -> Result<PathBuf, BenchError> {
    let checkpoint_dir = root.join("checkpoint-at-90pct");
    ledger.checkpoint(&checkpoint_dir)?;
    let kept = root.join("index-at-90pct");
    std::fs::hard_link(ledger_dir.join(INDEX_FILE), &kept)
        .or_else(|_| std::fs::copy(ledger_dir.join(INDEX_FILE), &kept).map(|_| ()))
        .map_err(|source| BenchError::Dir {
            path: kept.clone(),
            source,
        })?;
    std::fs::remove_dir_all(&checkpoint_dir).map_err(|source| BenchError::Dir {
        path: checkpoint_dir.clone(),
        source,
    })?;
    Ok(kept)
}

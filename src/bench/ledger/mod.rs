//! `dedupe bench ledger`: throughput, bytes per key and memory of the ledger on random UUIDv4
//! ids with a share of client retries, against Segment's design and an in-memory HashSet run on
//! the same ids in the same process.
//!
//! Only the time spent inside the store calls is counted (id generation is excluded for all three
//! stores alike). `peak_rss_bytes` is read right after the ledger phase, before the baselines run,
//! so it is the ledger's peak.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::segment_baseline::SegmentLedger;
use crate::identity::{ContentDigest, LedgerKey};
use crate::ledger::{Durability, Ledger, LedgerError, LedgerOptions, Verdict, INDEX_FILE};

/// Batches a re-sent id may reach back over (client retries re-send recent messages).
const RETRY_HORIZON_BATCHES: usize = 16;
/// Simulated stream rate used to give ids event times.
const SIMULATED_IDS_PER_MS: u64 = 100;
/// Budget per id when no budget is given: comfortably more than an id takes, so nothing ages.
const UNAGED_BUDGET_BYTES_PER_KEY: u64 = 24;
/// How often (in batches) disk use and generations are sampled.
const SAMPLE_EVERY_BATCHES: u64 = 32;
/// A `check_and_record` call slower than this is logged with the ids recorded so far: what the
/// ledger logged just before it (a seal, a doubling of the index) tells the stall's cause.
const SLOW_BATCH: Duration = Duration::from_secs(1);

/// Errors of the bench.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The ledger failed.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The Segment baseline failed.
    #[error("segment baseline: {0}")]
    Baseline(#[from] rocksdb::Error),
    /// Preparing the bench directory failed.
    #[error("cannot prepare the bench directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The bench verified its own answers and found them wrong.
    #[error("wrong answers: {0}")]
    Wrong(String),
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LedgerBenchConfig {
    /// Ids to insert.
    pub keys: u64,
    /// Share of ids that are re-sent copies of recent ids.
    pub dup_ratio: f64,
    /// Disk budget; `None` = one large enough never to age (40 bytes per id).
    pub budget_bytes: Option<u64>,
    /// Ids per batch.
    pub batch: usize,
    /// Parent directory for the stores (a fresh subdirectory is created and removed).
    pub dir: Option<PathBuf>,
    /// Ids the baselines run on (a prefix of the same stream); `None` = all.
    pub baseline_keys: Option<u64>,
    /// Skip the baselines.
    pub skip_baselines: bool,
    /// Ledger durability.
    pub durability: Durability,
    /// Ledger generations.
    pub generations: u32,
    /// Further ledger options (budget, generations and durability above win).
    pub ledger: LedgerOptions,
    /// Id stream seed.
    pub seed: u64,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Record each id with a content digest (what the worker does by default): the cost of
    /// telling retries from reused ids, against a run without.
    pub digests: bool,
    /// `refresh_on_duplicate`: every re-sent copy records its id again at its time.
    pub refresh: bool,
}

impl Default for LedgerBenchConfig {
    fn default() -> Self {
        LedgerBenchConfig {
            keys: 1_000_000,
            dup_ratio: 0.01,
            budget_bytes: None,
            batch: 4096,
            dir: None,
            baseline_keys: None,
            skip_baselines: false,
            durability: LedgerOptions::default().durability,
            generations: LedgerOptions::default().generations,
            ledger: LedgerOptions::default(),
            seed: 42,
            progress: true,
            digests: false,
            refresh: false,
        }
    }
}

/// The figures, printed as one JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerBenchReport {
    pub keys: u64,
    pub batch: usize,
    /// Ids recorded with content digests.
    pub digests: bool,
    /// Re-sent copies refreshed their ids (`refresh_on_duplicate`).
    pub refresh: bool,
    pub dup_ratio: f64,
    pub durability: String,
    pub generations_configured: u32,
    pub budget_bytes: Option<u64>,
    pub ids_per_sec: f64,
    pub wall_secs: f64,
    /// The slowest `check_and_record` call of the run: a stall (a seal, a commit waiting on the
    /// one before) shows here, not in the average.
    pub max_batch_ms: f64,
    pub unaged_ids_per_sec: Option<f64>,
    pub aged_ids_per_sec: Option<f64>,
    pub bytes_per_key: f64,
    pub live_sst_bytes: u64,
    /// The ledger directory at its largest (sampled), everything in it.
    pub max_disk_bytes: u64,
    /// The id index's files at their largest (sampled): the stored file, plus its temporary copy
    /// while it is rewritten.
    pub max_index_file_bytes: u64,
    /// What the directory may hold with a budget: the budget, one generation, and twice the id
    /// index (its file and the copy being written).
    pub disk_limit_bytes: Option<u64>,
    pub peak_rss_bytes: u64,
    pub window_ids: u64,
    pub generations: u64,
    pub filter_bytes: u64,
    /// Memory of the id index.
    pub index_bytes: u64,
    /// Ids looked up on disk because the id index named their generation.
    pub disk_lookups: u64,
    /// Time to close the ledger after the run: committing what is buffered and storing the id
    /// index in its file.
    pub close_secs: f64,
    /// Time to reopen the ledger after that clean close (the id index loaded from its file).
    pub reopen_secs: f64,
    /// Where the reopened index came from ("loaded" after a clean close).
    pub reopen_index: String,
    /// Time to reopen as after a crash late in the run: the index file is the one a checkpoint
    /// taken at 90% of the ids carries (the one stored after the last seal before it), so the
    /// generations sealed since (and the active one) are read from disk.
    pub crash_reopen_secs: Option<f64>,
    /// Where that reopen's index came from ("partial", or "loaded" when nothing sealed since).
    pub crash_reopen_index: Option<String>,
    /// Time to reopen with no index file at all: every generation read (a crash with no
    /// checkpoint or clean close ever, or a corrupt file).
    pub rebuild_secs: f64,
    pub duplicates_found: u64,
    pub duplicates_expected: u64,
    pub baseline_keys: u64,
    pub baseline_segment_design_ids_per_sec: Option<f64>,
    pub baseline_segment_bytes: Option<u64>,
    pub baseline_hashset_ids_per_sec: Option<f64>,
    pub ratio_vs_segment: Option<f64>,
}

/// A deterministic stream of random UUIDv4 ids with re-sent recent ids mixed in.
pub struct IdStream {
    rng: SmallRng,
    dup_ratio: f64,
    recent: VecDeque<LedgerKey>,
    recent_cap: usize,
    emitted: u64,
}

impl IdStream {
    /// A stream; the same seed gives the same ids.
    pub fn new(seed: u64, dup_ratio: f64, batch: usize) -> IdStream {
        IdStream {
            rng: SmallRng::seed_from_u64(seed),
            dup_ratio,
            recent: VecDeque::new(),
            recent_cap: batch * RETRY_HORIZON_BATCHES,
            emitted: 0,
        }
    }

    /// Fills `out` with the next `n` ids; returns how many are re-sent.
    pub fn next_batch(&mut self, n: usize, out: &mut Vec<(LedgerKey, i64)>) -> u64 {
        out.clear();
        let mut resent = 0;
        for _ in 0..n {
            let time_ms = (self.emitted / SIMULATED_IDS_PER_MS) as i64;
            self.emitted += 1;
            if !self.recent.is_empty() && self.rng.random_bool(self.dup_ratio) {
                let i = self.rng.random_range(0..self.recent.len());
                out.push((self.recent[i], time_ms));
                resent += 1;
                continue;
            }
            let mut bytes = self.rng.random::<u128>().to_be_bytes();
            bytes[6] = (bytes[6] & 0x0f) | 0x40;
            bytes[8] = (bytes[8] & 0x3f) | 0x80;
            let key = LedgerKey(bytes);
            if self.recent.len() == self.recent_cap {
                self.recent.pop_front();
            }
            self.recent.push_back(key);
            out.push((key, time_ms));
        }
        resent
    }
}

fn progress_bar(config: &LedgerBenchConfig, len: u64, what: &str) -> indicatif::ProgressBar {
    if !config.progress {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg:>10} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style);
    }
    bar.set_message(what.to_string());
    bar
}

/// Peak resident set size of this process (VmHWM).
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// What the files under `path` take, recursively.
fn dir_bytes(path: &Path) -> DiskUse {
    let mut used = DiskUse::default();
    let Ok(entries) = std::fs::read_dir(path) else {
        return used;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        match entry.metadata() {
            Ok(m) if m.is_dir() => {
                let below = dir_bytes(&entry.path());
                used.all += below.all;
                used.index_files += below.index_files;
            }
            Ok(m) => {
                used.all += m.len();
                if entry.file_name().to_string_lossy().starts_with(INDEX_FILE) {
                    used.index_files += m.len();
                }
            }
            Err(_) => {}
        }
    }
    used
}

/// Bytes under a directory: everything, and the id index's files among them (the stored file and
/// any being written).
#[derive(Debug, Default, Clone, Copy)]
struct DiskUse {
    all: u64,
    index_files: u64,
}

impl DiskUse {
    /// The larger of each figure: what two samples of one directory peaked at.
    fn peak(self, other: Self) -> Self {
        Self {
            all: self.all.max(other.all),
            index_files: self.index_files.max(other.index_files),
        }
    }
}

/// Runs the bench.
pub fn run(config: &LedgerBenchConfig) -> Result<LedgerBenchReport, BenchError> {
    let parent = config.dir.clone().unwrap_or_else(std::env::temp_dir);
    let root = parent.join(format!("dedupe-bench-ledger-{}", std::process::id()));
    std::fs::create_dir_all(&root).map_err(|source| BenchError::Dir {
        path: root.clone(),
        source,
    })?;
    let result = run_in(config, &root);
    let _ = std::fs::remove_dir_all(&root);
    result
}

fn run_in(config: &LedgerBenchConfig, root: &Path) -> Result<LedgerBenchReport, BenchError> {
    let options = bench_options(config);
    let ledger_dir = root.join("ledger");
    let ledger = Ledger::open(&ledger_dir, options.clone())?;
    let run = insert_all(config, &ledger, root, &ledger_dir)?;
    ledger.flush()?;
    let max_disk = run.max_disk.peak(dir_bytes(&ledger_dir));
    let stats = ledger.stats()?;
    let peak_rss = peak_rss_bytes();
    let close = Instant::now();
    ledger.close()?;
    let close_secs = close.elapsed().as_secs_f64();
    drop(ledger);
    let reopens = reopen_all(
        &ledger_dir,
        &options,
        root,
        run.crash_index.as_deref(),
        stats.index_ids,
    )?;

    let ids_per_sec = config.keys as f64 / run.timed.as_secs_f64();
    let (unaged, aged) = match run.aging_started {
        Some((ids, at)) if run.done > ids => (
            Some(ids as f64 / at.as_secs_f64()),
            Some((run.done - ids) as f64 / (run.timed - at).as_secs_f64()),
        ),
        _ => (None, None),
    };
    if config.budget_bytes.is_none() && run.duplicates_found != run.duplicates_expected {
        return Err(BenchError::Wrong(format!(
            "{} duplicates found, {} re-sent",
            run.duplicates_found, run.duplicates_expected
        )));
    }

    let baseline_keys = config.baseline_keys.unwrap_or(config.keys).min(config.keys);
    let (segment, segment_bytes, hashset) = if config.skip_baselines {
        (None, None, None)
    } else {
        let (rate, bytes) = run_segment(config, baseline_keys, &root.join("segment"))?;
        (
            Some(rate),
            Some(bytes),
            Some(run_hashset(config, baseline_keys)),
        )
    };
    Ok(LedgerBenchReport {
        keys: config.keys,
        batch: config.batch,
        digests: config.digests,
        refresh: config.refresh,
        dup_ratio: config.dup_ratio,
        durability: format!("{:?}", config.durability),
        generations_configured: config.generations,
        budget_bytes: config.budget_bytes,
        ids_per_sec,
        wall_secs: run.wall_secs,
        unaged_ids_per_sec: unaged,
        aged_ids_per_sec: aged,
        bytes_per_key: stats.live_sst_bytes as f64 / stats.ids_estimate.max(1) as f64,
        live_sst_bytes: stats.live_sst_bytes,
        max_disk_bytes: max_disk.all,
        max_batch_ms: run.slowest.as_secs_f64() * 1e3,
        max_index_file_bytes: max_disk.index_files,
        disk_limit_bytes: config
            .budget_bytes
            .map(|b| b + options.generation_target_bytes() + 2 * stats.index_bytes),
        peak_rss_bytes: peak_rss,
        window_ids: stats.ids_estimate,
        generations: stats.generations,
        filter_bytes: stats.filter_bytes,
        index_bytes: stats.index_bytes,
        disk_lookups: stats.disk_lookups,
        close_secs,
        reopen_secs: reopens.clean_secs,
        reopen_index: reopens.clean_index,
        crash_reopen_secs: reopens.crash.as_ref().map(|c| c.0),
        crash_reopen_index: reopens.crash.map(|c| c.1),
        rebuild_secs: reopens.rebuild_secs,
        duplicates_found: run.duplicates_found,
        duplicates_expected: run.duplicates_expected,
        baseline_keys,
        baseline_segment_design_ids_per_sec: segment,
        baseline_segment_bytes: segment_bytes,
        baseline_hashset_ids_per_sec: hashset,
        ratio_vs_segment: segment.map(|s| ids_per_sec / s),
    })
}

/// The ledger options of the run.
fn bench_options(config: &LedgerBenchConfig) -> LedgerOptions {
    LedgerOptions {
        // Without a budget, one large enough never to forget anything in this run.
        budget_bytes: config.budget_bytes.unwrap_or(
            config
                .keys
                .saturating_mul(UNAGED_BUDGET_BYTES_PER_KEY)
                .max(1 << 30),
        ),
        generations: config.generations,
        durability: config.durability,
        refresh_on_duplicate: config.refresh || config.ledger.refresh_on_duplicate,
        ..config.ledger.clone()
    }
}

/// What inserting the ids measured.
struct InsertRun {
    /// Time inside `check_and_record`, and its slowest call.
    timed: Duration,
    slowest: Duration,
    wall_secs: f64,
    done: u64,
    duplicates_found: u64,
    duplicates_expected: u64,
    max_disk: DiskUse,
    /// Ids done, and time taken, when the oldest generation was first dropped.
    aging_started: Option<(u64, Duration)>,
    /// The index file a checkpoint at 90% of the ids carried.
    crash_index: Option<PathBuf>,
}

/// Inserts the run's ids in batches, timing each call, sampling the directory, and keeping the
/// index file a checkpoint at 90% of the ids carries.
fn insert_all(
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

/// How long each reopen took, and where its index came from.
struct Reopens {
    clean_secs: f64,
    clean_index: String,
    /// With the index file of the checkpoint at 90%, if one was taken.
    crash: Option<(f64, String)>,
    rebuild_secs: f64,
}

/// Reopens the closed ledger three ways: after the clean close, with the index file a crash late
/// in the run would find, and with no index file. Each must hold exactly `index_ids` ids.
fn reopen_all(
    ledger_dir: &Path,
    options: &LedgerOptions,
    root: &Path,
    crash_index: Option<&Path>,
    index_ids: u64,
) -> Result<Reopens, BenchError> {
    let reopen_timed = |what: &str| -> Result<(f64, String), BenchError> {
        let started = Instant::now();
        let reopened = Ledger::open(ledger_dir, options.clone())?;
        let secs = started.elapsed().as_secs_f64();
        let source = reopened.open_report().index.label().to_string();
        let ids = reopened.stats()?.index_ids;
        reopened.drop_without_closing();
        // With refresh, an id recorded again into a generation that holds it takes no second
        // slot when its bucket already holds its fingerprint for that generation, which another
        // id's equal fingerprint can be too: the reopened index may merge a few more or fewer such
        // pairs than the live one did (each still answers "perhaps", and the disk answers). A
        // difference of one in ten thousand is that; more is a lost id.
        let tolerance = if options.refresh_on_duplicate {
            index_ids / 10_000
        } else {
            0
        };
        if ids.abs_diff(index_ids) > tolerance {
            return Err(BenchError::Wrong(format!(
                "the index reopened {what} holds {ids} ids, not {index_ids}"
            )));
        }
        Ok((secs, source))
    };
    let (clean_secs, clean_index) = reopen_timed("after a clean close")?;
    let index_at_close = root.join("index-at-close");
    std::fs::rename(ledger_dir.join(INDEX_FILE), &index_at_close).map_err(|source| {
        BenchError::Dir {
            path: index_at_close.clone(),
            source,
        }
    })?;
    let crash = match crash_index {
        Some(kept) => {
            std::fs::rename(kept, ledger_dir.join(INDEX_FILE)).map_err(|source| {
                BenchError::Dir {
                    path: kept.to_path_buf(),
                    source,
                }
            })?;
            let reopened = reopen_timed("as after a crash")?;
            std::fs::remove_file(ledger_dir.join(INDEX_FILE)).map_err(|source| {
                BenchError::Dir {
                    path: ledger_dir.to_path_buf(),
                    source,
                }
            })?;
            Some(reopened)
        }
        None => None,
    };
    let (rebuild_secs, _) = reopen_timed("without an index file")?;
    let _ = std::fs::remove_file(&index_at_close);
    Ok(Reopens {
        clean_secs,
        clean_index,
        crash,
        rebuild_secs,
    })
}

fn run_segment(
    config: &LedgerBenchConfig,
    keys: u64,
    dir: &Path,
) -> Result<(f64, u64), BenchError> {
    let mut store = SegmentLedger::open(dir, config.budget_bytes)?;
    let mut stream = IdStream::new(config.seed, config.dup_ratio, config.batch);
    let mut items = Vec::with_capacity(config.batch);
    let mut raw = Vec::with_capacity(config.batch);
    let bar = progress_bar(config, keys, "segment");
    let mut timed = Duration::ZERO;
    let mut done = 0u64;
    while done < keys {
        let n = (keys - done).min(config.batch as u64) as usize;
        stream.next_batch(n, &mut items);
        raw.clear();
        raw.extend(items.iter().map(|(k, _)| k.0));
        let started = Instant::now();
        store.check_and_record(&raw)?;
        timed += started.elapsed();
        done += n as u64;
        bar.set_position(done);
    }
    bar.finish_and_clear();
    let bytes = store.size_bytes()?;
    Ok((keys as f64 / timed.as_secs_f64(), bytes))
}

fn run_hashset(config: &LedgerBenchConfig, keys: u64) -> f64 {
    let mut set: HashSet<[u8; 16]> = HashSet::new();
    let mut stream = IdStream::new(config.seed, config.dup_ratio, config.batch);
    let mut items = Vec::with_capacity(config.batch);
    let mut dups = Vec::with_capacity(config.batch);
    let mut timed = Duration::ZERO;
    let mut done = 0u64;
    while done < keys {
        let n = (keys - done).min(config.batch as u64) as usize;
        stream.next_batch(n, &mut items);
        let started = Instant::now();
        dups.clear();
        dups.extend(items.iter().map(|(k, _)| !set.insert(k.0)));
        timed += started.elapsed();
        done += n as u64;
    }
    std::hint::black_box(&dups);
    keys as f64 / timed.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_bench_finds_every_resent_id() {
        // A tiny run: every re-sent id is found, and the baselines agree on the same stream.
        let dir = tempfile::tempdir().unwrap();
        let config = LedgerBenchConfig {
            keys: 20_000,
            batch: 1000,
            dup_ratio: 0.05,
            dir: Some(dir.path().to_path_buf()),
            progress: false,
            ..LedgerBenchConfig::default()
        };
        let report = run(&config).unwrap();
        assert!(report.duplicates_expected > 0);
        assert_eq!(report.duplicates_found, report.duplicates_expected);
        assert_eq!(report.window_ids, config.keys - report.duplicates_expected);
        assert!(report.baseline_segment_design_ids_per_sec.is_some());
        // The bench cleans up after itself.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

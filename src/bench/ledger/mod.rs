//! `dedupe bench ledger`: throughput, bytes per key and memory of the ledger on random UUIDv4
//! ids with a share of client retries, against Segment's design and an in-memory HashSet run on
//! the same ids in the same process.
//!
//! Only the time spent inside the store calls is counted (id generation is excluded for all three
//! stores alike). `peak_rss_bytes` is read right after the ledger phase, before the baselines run,
//! so it is the ledger's peak.
//!
//! Here the configuration, the report and the run; `insert` the ledger phase, `reopen` its
//! reopens, `baselines` the two baselines, `ids` the id stream they share, `disk` the sizes.

mod baselines;
mod disk;
mod ids;
mod insert;
mod reopen;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

pub use disk::peak_rss_bytes;
pub use ids::IdStream;

use crate::ledger::{Durability, Ledger, LedgerError, LedgerOptions};

/// Budget per id when no budget is given: comfortably more than an id takes, so nothing ages.
const UNAGED_BUDGET_BYTES_PER_KEY: u64 = 24;

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
    let run = insert::insert_all(config, &ledger, root, &ledger_dir)?;
    ledger.flush()?;
    let max_disk = run.max_disk.peak(disk::dir_bytes(&ledger_dir));
    let stats = ledger.stats()?;
    let peak_rss = peak_rss_bytes();
    let close = Instant::now();
    ledger.close()?;
    let close_secs = close.elapsed().as_secs_f64();
    drop(ledger);
    let reopens = reopen::reopen_all(
        &ledger_dir,
        &options,
        root,
        run.crash_index.as_deref(),
        stats.index_ids,
    )?;
    run.check(config)?;
    let ids_per_sec = config.keys as f64 / run.timed.as_secs_f64();
    let (unaged, aged) = run.aging_rates();
    let baseline_keys = config.baseline_keys.unwrap_or(config.keys).min(config.keys);
    let baselines = baselines::run_both(config, baseline_keys, root)?;
    let segment = baselines.segment.map(|(rate, _)| rate);
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
        baseline_segment_bytes: baselines.segment.map(|(_, bytes)| bytes),
        baseline_hashset_ids_per_sec: baselines.hashset,
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

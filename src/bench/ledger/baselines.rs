//! The baselines run on the same ids: Segment's design (RocksDB) and an in-memory HashSet.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use super::ids::IdStream;
use super::{progress_bar, BenchError, LedgerBenchConfig};
use crate::bench::segment_baseline::SegmentLedger;

/// What the baselines measured; nothing when the run skips them.
#[derive(Default)]
pub(super) struct Baselines {
    /// Segment's design: ids per second, and its bytes on disk.
    pub(super) segment: Option<(f64, u64)>,
    /// The in-memory HashSet: ids per second.
    pub(super) hashset: Option<f64>,
}

/// Both baselines on the run's first `keys` ids, unless the run skips them.
pub(super) fn run_both(
    config: &LedgerBenchConfig,
    keys: u64,
    root: &Path,
) -> Result<Baselines, BenchError> {
    if config.skip_baselines {
        return Ok(Baselines::default());
    }
    Ok(Baselines {
        segment: Some(run_segment(config, keys, &root.join("segment"))?),
        hashset: Some(run_hashset(config, keys)),
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

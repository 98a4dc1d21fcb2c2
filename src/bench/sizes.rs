//! `dedupe bench open`: what a ledger costs at a given number of ids, with the options given
//! (the service's defaults unless told otherwise): the first open of an empty directory, the
//! process's resident memory after it, recording the ids, a clean close, the files left on disk
//! (the id index's file among them), and opening again. Each size gets a directory of its own;
//! the sizes run in the order given, so the first one's memory is the process's alone.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use super::ledger::{BenchError, IdStream};
use crate::ledger::{Ledger, LedgerOptions, INDEX_FILE};

/// Ids per recorded batch, as the worker's default batches.
const BATCH: usize = 4096;

/// One size's figures.
#[derive(Debug, Serialize)]
pub struct SizeReport {
    pub ids: u64,
    pub first_open_secs: f64,
    /// This process's resident memory right after the first open (VmRSS).
    pub rss_after_open_bytes: u64,
    /// The id index's memory with `ids` held.
    pub index_bytes: u64,
    pub ids_per_sec: f64,
    pub close_secs: f64,
    /// Every file in the ledger directory after the clean close.
    pub disk_bytes: u64,
    pub index_file_bytes: u64,
    pub reopen_secs: f64,
    /// Where the reopened index came from.
    pub reopen_index: String,
}

/// Runs one size after another in directories under `root`.
pub fn run(
    options: &LedgerOptions,
    sizes: &[u64],
    root: &Path,
) -> Result<Vec<SizeReport>, BenchError> {
    sizes
        .iter()
        .enumerate()
        .map(|(n, &ids)| one(options, ids, &root.join(format!("size-{n}"))))
        .collect()
}

fn one(options: &LedgerOptions, ids: u64, dir: &Path) -> Result<SizeReport, BenchError> {
    let opened = Instant::now();
    let ledger = Ledger::open(dir, options.clone())?;
    let first_open_secs = opened.elapsed().as_secs_f64();
    let rss_after_open_bytes = rss_bytes();
    let mut stream = IdStream::new(7, 0.0, BATCH);
    let mut batch = Vec::with_capacity(BATCH);
    let recording = Instant::now();
    let mut recorded = 0;
    while recorded < ids {
        let n = (ids - recorded).min(BATCH as u64) as usize;
        batch.clear();
        stream.next_batch(n, &mut batch);
        ledger.check_and_record(0, &batch, &recorded.to_le_bytes())?;
        recorded += n as u64;
    }
    let ids_per_sec = ids as f64 / recording.elapsed().as_secs_f64().max(1e-9);
    let index_bytes = ledger.stats()?.index_bytes;
    let closing = Instant::now();
    ledger.close()?;
    let close_secs = closing.elapsed().as_secs_f64();
    drop(ledger);
    let (disk_bytes, index_file_bytes) = files(dir);
    let reopening = Instant::now();
    let ledger = Ledger::open(dir, options.clone())?;
    let reopen_secs = reopening.elapsed().as_secs_f64();
    let reopen_index = ledger.open_report().index.label().to_string();
    ledger.drop_without_closing();
    let _ = std::fs::remove_dir_all(dir);
    Ok(SizeReport {
        ids,
        first_open_secs,
        rss_after_open_bytes,
        index_bytes,
        ids_per_sec,
        close_secs,
        disk_bytes,
        index_file_bytes,
        reopen_secs,
        reopen_index,
    })
}

/// Bytes of every file in `dir`, and of the index file.
fn files(dir: &Path) -> (u64, u64) {
    let mut all = 0;
    let mut index = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let len = entry
            .metadata()
            .map_or(0, |m| if m.is_file() { m.len() } else { 0 });
        all += len;
        if entry.file_name() == INDEX_FILE {
            index = len;
        }
    }
    (all, index)
}

/// This process's resident memory now (VmRSS).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

//! The closed ledger reopened three ways, each timed and its ids counted.

use std::path::Path;
use std::time::Instant;

use super::BenchError;
use crate::ledger::{Ledger, LedgerOptions, INDEX_FILE};

/// How long each reopen took, and where its index came from.
pub(super) struct Reopens {
    pub(super) clean_secs: f64,
    pub(super) clean_index: String,
    /// With the index file of the checkpoint at 90%, if one was taken.
    pub(super) crash: Option<(f64, String)>,
    pub(super) rebuild_secs: f64,
}

/// Reopens the closed ledger three ways: after the clean close, with the index file a crash late
/// in the run would find, and with no index file. Each must hold exactly `index_ids` ids.
pub(super) fn reopen_all(
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

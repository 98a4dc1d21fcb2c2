//! Checkpoints: a consistent copy of a running ledger (hard links where possible), and restoring
//! one into a directory a ledger can be opened from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::{io_error, rocks, Doing};
use super::{Ledger, LedgerError, Result, State};
use crate::Partition;

impl Ledger {
    /// Commits and flushes everything, then writes the checkpoint into `dir`; the caller holds
    /// the lock (see [`Ledger::checkpoint`]).
    pub(super) fn write_checkpoint(
        &self,
        state: &mut State,
        dir: &Path,
    ) -> Result<BTreeMap<Partition, Vec<u8>>> {
        self.flush_locked(state)?;
        let checkpoint = rocksdb::checkpoint::Checkpoint::new(&self.db)
            .map_err(rocks(Doing::Checkpoint(dir)))?;
        checkpoint
            .create_checkpoint(dir)
            .map_err(rocks(Doing::Checkpoint(dir)))?;
        // The id index, so that a restored checkpoint opens without reading every id. When the
        // live directory's file holds the index as it is now (a close or checkpoint wrote it and
        // nothing was committed since), it is synced and linked in. Otherwise a live file is still
        // linked in when there is one: its stamp says which generations it vouches for
        // (`index_file.rs`), and a restored checkpoint reads only the others from disk (usually
        // the generation active when the file was stored after a seal), whereas writing the table
        // again here, under the lock, would stop every partition for seconds at a billion ids.
        // Only a ledger without a file yet has one written now, and linked back into the live
        // directory.
        if state.index.knows() {
            if self.path.join(super::index_file::INDEX_FILE).exists() {
                super::index_file::sync(&self.path)?;
                super::index_file::link_into(&self.path, dir)?;
            } else {
                state.index_epoch += 1;
                state.index.finish_growth();
                super::index_file::write(dir, state, true)?;
                super::index_file::link_into(dir, &self.path)?;
                state.index_stored_at = Some(state.commit_seq);
            }
        }
        // Still under the lock: the live progress records are those in the checkpoint (nothing
        // is buffered after the flush).
        self.durable_progress()
    }
}

/// Copies the checkpoint in `source` into `target` (see [`Ledger::restore_from`]).
pub(super) fn restore(source: &Path, target: &Path, replace: bool) -> Result<()> {
    if !source.join("CURRENT").exists() {
        return Err(LedgerError::NotALedger {
            path: source.to_path_buf(),
            reason: "the checkpoint has no CURRENT file".into(),
        });
    }
    let target_used = match std::fs::read_dir(target) {
        Ok(mut entries) => entries.next().is_some(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(io_error("read", target)(e)),
    };
    if target_used && !replace {
        return Err(LedgerError::TargetNotEmpty {
            dir: target.to_path_buf(),
        });
    }
    let mut staging = target.as_os_str().to_owned();
    staging.push(".restoring");
    let staging = PathBuf::from(staging);
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io_error("clear", &staging))?;
    }
    std::fs::create_dir_all(&staging).map_err(io_error("create", &staging))?;
    for entry in std::fs::read_dir(source).map_err(io_error("read", source))? {
        let entry = entry.map_err(io_error("read", source))?;
        let to = staging.join(entry.file_name());
        std::fs::copy(entry.path(), &to).map_err(io_error("copy into", &to))?;
    }
    if target_used {
        std::fs::remove_dir_all(target).map_err(io_error("replace", target))?;
    } else if target.exists() {
        std::fs::remove_dir(target).map_err(io_error("replace", target))?;
    }
    std::fs::rename(&staging, target).map_err(io_error("move into place", target))
}

//! Recovery, on open, of what a crash left: the commit record of a file ingested without its
//! bookkeeping, the batch logs of commits not made yet, and files written for an ingestion.

use std::collections::BTreeMap;

use rocksdb::WriteBatch;

use super::batch_log::{log_path, log_seq, BatchLog};
use super::error::{io_error, rocks, Doing};
use super::format::{
    generation_meta_key, parse_json, progress_key, to_json, CommitRecord, COMMIT_KEY,
    INGEST_FILE_EXTENSION, META_COMMIT_SEQ, META_FORGOTTEN,
};
use super::{Durability, Generation, Ledger, LedgerError, Result, State, CF_META, CF_PROGRESS};
use crate::Partition;

impl Ledger {
    /// A buffered run of ids becomes durable when its file is ingested; the metadata and progress
    /// records that go with it are written (and flushed) just after. If a crash fell between the
    /// two, the file's commit record says what they must be: apply it. Returns the sequence
    /// number of the last commit applied.
    pub(super) fn recover_commit(
        &self,
        generations: &mut [Generation],
        forgotten: &mut BTreeMap<Partition, i64>,
    ) -> Result<u64> {
        let meta_cf = self.cf(CF_META)?;
        let applied = match self
            .db
            .get_cf(&meta_cf, META_COMMIT_SEQ)
            .map_err(rocks(Doing::Read))?
        {
            Some(bytes) => <[u8; 8]>::try_from(bytes.as_slice())
                .map(u64::from_le_bytes)
                .map_err(|_| LedgerError::CorruptMetadata {
                    what: format!("commit sequence is {} bytes, not 8", bytes.len()),
                })?,
            None => 0,
        };
        let mut newest: Option<(usize, CommitRecord)> = None;
        for (i, g) in generations.iter().enumerate() {
            let cf = self.cf(&g.name)?;
            if let Some(bytes) = self
                .db
                .get_cf(&cf, COMMIT_KEY)
                .map_err(rocks(Doing::Read))?
            {
                let record: CommitRecord = parse_json("commit record", &bytes)?;
                if newest.as_ref().is_none_or(|(_, n)| record.seq > n.seq) {
                    newest = Some((i, record));
                }
            }
        }
        let Some((i, record)) = newest.filter(|(_, r)| r.seq > applied) else {
            return Ok(applied);
        };
        let mut meta = record.meta;
        meta.sealed |= generations[i].meta.sealed;
        let mut batch = WriteBatch::default();
        batch.put_cf(&meta_cf, generation_meta_key(meta.id), to_json(&meta));
        batch.put_cf(&meta_cf, META_COMMIT_SEQ, record.seq.to_le_bytes());
        let progress_cf = self.cf(CF_PROGRESS)?;
        for (partition, value) in &record.progress {
            batch.put_cf(&progress_cf, progress_key(*partition), value);
        }
        if let Some(floors) = &record.forgotten {
            batch.put_cf(&meta_cf, META_FORGOTTEN, to_json(floors));
        }
        self.db
            .write_opt(batch, &self.sync_write_options())
            .map_err(rocks(Doing::Write))?;
        self.flush_cfs(&[CF_META, CF_PROGRESS], true)?;
        generations[i].meta = meta;
        if let Some(floors) = record.forgotten {
            *forgotten = floors;
        }
        Ok(record.seq)
    }

    /// Replays the batch log of the next commit into the buffer and commits it at once (a clean
    /// start for the new log), removes logs of earlier commits, and opens the log when there is
    /// a WAL.
    pub(super) fn replay_log(&self, state: &mut State) -> Result<()> {
        // Two logs can be there: one of a commit that was in flight, and the next. They are
        // replayed in order, each committed on its own. A torn log ends the replay: batches after
        // a lost one must not survive it (the later log may have reached the disk first).
        loop {
            let next = log_path(&self.path, state.commit_seq + 1);
            if !next.exists() {
                break;
            }
            let (batches, valid) = BatchLog::read(&next)?;
            let torn = std::fs::metadata(&next)
                .map_err(io_error("read", &next))?
                .len()
                > valid;
            for batch in batches {
                self.record_buffered(state, batch);
            }
            let before = state.commit_seq;
            self.commit_pending(state)?;
            if torn || state.commit_seq == before {
                break;
            }
        }
        for entry in std::fs::read_dir(&self.path).map_err(io_error("read", &self.path))? {
            let path = entry.map_err(io_error("read", &self.path))?.path();
            let seq = log_seq(&path);
            // Logs of commits already made, and a torn log just replayed and committed.
            if seq.is_some_and(|seq| seq <= state.commit_seq) {
                std::fs::remove_file(&path).map_err(io_error("remove", &path))?;
            }
        }
        if self.options.durability != Durability::NoWal && state.log.is_none() {
            state.log = Some(BatchLog::open(&self.path, state.commit_seq + 1, 0)?);
        }
        Ok(())
    }

    /// Files written for an ingestion that a crash interrupted.
    pub(super) fn remove_ingest_leftovers(&self) -> Result<()> {
        for entry in std::fs::read_dir(&self.path).map_err(io_error("read", &self.path))? {
            let path = entry.map_err(io_error("read", &self.path))?.path();
            if path.extension().is_some_and(|e| e == INGEST_FILE_EXTENSION) {
                std::fs::remove_file(&path).map_err(io_error("remove", &path))?;
            }
        }
        Ok(())
    }
}

//! The commit pipeline: how buffered batches become durable. A full buffer becomes the commit in
//! flight, whose ids a background thread writes into one SST file with its commit record; the
//! file is ingested into its generation (the atomic step), then the metadata and progress column
//! families are brought in line and flushed.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use rocksdb::{FlushOptions, IngestExternalFileOptions, Options, SstFileWriter, WriteBatch};

use super::batch_log::BatchLog;
use super::buffer::IdBuffer;
use super::error::{io_error, rocks, Doing};
use super::format::{
    encode_value, generation_cf_name, generation_meta_key, progress_key, to_json, CommitRecord,
    TimeBase, COMMIT_KEY, INGEST_FILE_EXTENSION, META_COMMIT_SEQ, META_FORGOTTEN,
};
use super::load::LoadedRuns;
use super::tuning::ingest_file_options;
use super::{Held, Ledger, LedgerError, Result, State, CF_META, CF_PROGRESS};
use crate::identity::LedgerKey;
use crate::Partition;

/// A buffer of ids being committed: written to a file by a background thread, then ingested by
/// whichever ledger call finds the thread done.
pub(super) struct InFlight {
    pub(super) record: CommitRecord,
    pub(super) ids: Arc<IdBuffer>,
    /// The progress records of the buffered batches (the newest per partition).
    pub(super) progress: BTreeMap<Partition, Vec<u8>>,
    /// The log of the batches in this commit, removed once it is applied.
    log: Option<PathBuf>,
    /// Files of a bulk load (`load.rs`) ingested together with this commit's own file.
    loaded: Vec<PathBuf>,
    /// `None` once joined and failed: the next attempt writes the file on the caller's thread.
    pub(super) job: Option<std::thread::JoinHandle<Result<PathBuf>>>,
}

impl InFlight {
    /// Whether nothing of it still runs in the background: its file is written, or is written on
    /// the caller's thread when it is finished (no thread, or a failed one).
    pub(super) fn written(&self) -> bool {
        self.job.as_ref().is_none_or(|job| job.is_finished())
    }
}

/// Writes a commit's file: its ids sorted, then its commit record. Needs nothing of the open
/// database, so it runs on a thread of its own.
struct CommitWriter {
    file: PathBuf,
    options: Options,
    base: TimeBase,
    record: Vec<u8>,
    ids: Arc<IdBuffer>,
}

impl CommitWriter {
    fn new(ledger: &Ledger, record: &CommitRecord, ids: Arc<IdBuffer>) -> CommitWriter {
        CommitWriter {
            file: ledger
                .path
                .join(format!("commit-{:012}.{INGEST_FILE_EXTENSION}", record.seq)),
            options: ingest_file_options(&ledger.options, &ledger.block_cache),
            base: record.meta.time_base().unwrap_or(TimeBase::seconds(0)),
            record: to_json(record),
            ids,
        }
    }

    fn write(self) -> Result<PathBuf> {
        let mut ids: Vec<(LedgerKey, Held)> =
            self.ids.iter().map(|(k, held)| (*k, *held)).collect();
        ids.sort_unstable_by_key(|(k, _)| *k);
        let written = (|| {
            let mut writer = SstFileWriter::create(&self.options);
            writer.open(&self.file)?;
            let mut value = Vec::with_capacity(8);
            for (key, held) in &ids {
                value.clear();
                encode_value(self.base, held.first_seen_ms, held.digest, &mut value);
                writer.put(key.0, &value)?;
            }
            writer.put(COMMIT_KEY, &self.record)?;
            writer.finish()
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&self.file);
        }
        written.map_err(rocks(Doing::Write))?;
        Ok(self.file)
    }
}

impl Ledger {
    /// Makes the buffered ids, progress records and metadata durable together, on the caller's
    /// thread: a commit in flight is finished first, then the buffer is committed.
    pub(super) fn commit_pending(&self, state: &mut State) -> Result<()> {
        self.finish_in_flight(state, true)?;
        if self.take_commit(state, false, None)? {
            self.finish_in_flight(state, true)?;
        }
        Ok(())
    }

    /// Starts committing the buffer in the background: the file is written by another thread
    /// while batches keep being recorded into a fresh buffer. A previous commit still in flight
    /// is finished first.
    pub(super) fn start_commit(&self, state: &mut State) -> Result<()> {
        self.finish_in_flight(state, true)?;
        self.take_commit(state, true, None)?;
        Ok(())
    }

    /// Makes a bulk load durable and visible: its runs are ingested with the next commit (the
    /// buffer's file and its commit record, which carries the load's metadata, progress record
    /// and window floor), in one ingestion. The buffer's file is written by a thread while the
    /// lock is free; the commit is applied before this returns.
    pub(super) fn commit_load(&self, runs: LoadedRuns) -> Result<()> {
        let seq = {
            let mut state = self.lock();
            self.finish_in_flight(&mut state, true)?;
            if state.generations.last().map(|g| g.meta.id) != Some(runs.generation) {
                for file in &runs.files {
                    let _ = std::fs::remove_file(file);
                }
                // A load pins its generation, so this is a bug, not a state on disk.
                return Err(LedgerError::CorruptMetadata {
                    what: "the generation a load went into was sealed while it ran".into(),
                });
            }
            self.take_commit(&mut state, true, Some(runs))?;
            state.commit_seq + 1
        };
        // Another call may apply the commit first (it finds the file written): then it is done.
        loop {
            let state = self.lock();
            match &state.in_flight {
                Some(f) if f.record.seq == seq => {
                    if f.written() {
                        break;
                    }
                }
                _ => return Ok(()),
            }
            drop(state);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let mut state = self.lock();
        if state.commit_seq < seq {
            self.finish_in_flight(&mut state, true)?;
        }
        Ok(())
    }

    /// Moves the buffer into a commit in flight, with a bulk load's runs if `load` brings them;
    /// with `background`, its file is written by a new thread. False when there was nothing to
    /// commit.
    fn take_commit(
        &self,
        state: &mut State,
        background: bool,
        load: Option<LoadedRuns>,
    ) -> Result<bool> {
        debug_assert!(state.in_flight.is_none());
        if state.pending.is_empty() && state.pending_progress.is_empty() && load.is_none() {
            return Ok(false);
        }
        let seq = state.commit_seq + 1;
        let mut forgotten = None;
        let mut loaded = Vec::new();
        if let Some(load) = load {
            forgotten = load.apply(state);
            loaded = load.files;
        }
        let Some(active) = state.generations.last() else {
            return Ok(false);
        };
        let mut progress = self.durable_progress()?;
        progress.extend(state.pending_progress.iter().map(|(p, v)| (*p, v.clone())));
        let record = CommitRecord {
            seq,
            meta: active.meta.clone(),
            progress,
            forgotten,
        };
        // Batches recorded from now on go to the next commit's log.
        let log = match state.log.take() {
            Some(old) => {
                state.log = Some(BatchLog::open(&self.path, seq + 1, 0)?);
                Some(old.path)
            }
            None => None,
        };
        let fresh = match state.spare.take() {
            Some(map) => map,
            None => HashMap::with_capacity_and_hasher(
                state.pending.capacity(),
                state.pending.hasher().clone(),
            ),
        };
        let ids = Arc::new(std::mem::replace(&mut state.pending, fresh));
        let job = if background {
            let writer = CommitWriter::new(self, &record, ids.clone());
            let spawned = std::thread::Builder::new()
                .name("ledger-commit".into())
                .spawn(move || {
                    fail::fail_point!("ledger-commit-thread");
                    writer.write()
                });
            // Without a thread, the file is written on the caller's thread when finishing.
            spawned.ok()
        } else {
            None
        };
        state.in_flight = Some(InFlight {
            record,
            ids,
            progress: std::mem::take(&mut state.pending_progress),
            log,
            loaded,
            job,
        });
        state.pending_batches = 0;
        Ok(true)
    }

    /// Applies the commit in flight, if any: waits for its file (or, with `wait` false, returns
    /// at once if it is not written yet), ingests it into its generation (the atomic step), then
    /// brings the metadata and progress column families in line and flushes them. On an error the
    /// commit stays in flight (its ids keep answering lookups, its log stays on disk) and the
    /// next call retries it.
    pub(super) fn finish_in_flight(&self, state: &mut State, wait: bool) -> Result<()> {
        let Some(in_flight) = state.in_flight.as_mut() else {
            return Ok(());
        };
        let written = match in_flight.job.take() {
            Some(job) if !wait && !job.is_finished() => {
                in_flight.job = Some(job);
                return Ok(());
            }
            Some(job) => job
                .join()
                .unwrap_or_else(|payload| Err(LedgerError::panicked("commit", payload.as_ref()))),
            None => CommitWriter::new(self, &in_flight.record, in_flight.ids.clone()).write(),
        };
        let file = written?;
        let record = &in_flight.record;
        let mut ingest = IngestExternalFileOptions::default();
        ingest.set_move_files(true);
        let cf = self.cf(&generation_cf_name(record.meta.id))?;
        // A load's runs first, the commit's own file (with the commit record) last: the newest.
        let mut files = in_flight.loaded.clone();
        files.push(file.clone());
        let ingested = self
            .db
            .ingest_external_file_cf_opts(&cf, &ingest, files)
            .map_err(rocks(Doing::Write));
        drop(cf);
        if ingested.is_err() {
            let _ = std::fs::remove_file(&file);
        }
        ingested?;
        // The crash tests die here: between the atomic step and the bookkeeping after it.
        fail::fail_point!("ledger-after-ingest", |_| std::process::abort());
        let meta_cf = self.cf(CF_META)?;
        let progress_cf = self.cf(CF_PROGRESS)?;
        let mut batch = WriteBatch::default();
        batch.put_cf(
            &meta_cf,
            generation_meta_key(record.meta.id),
            to_json(&record.meta),
        );
        batch.put_cf(&meta_cf, META_COMMIT_SEQ, record.seq.to_le_bytes());
        for (partition, value) in &in_flight.progress {
            batch.put_cf(&progress_cf, progress_key(*partition), value);
        }
        if let Some(forgotten) = &record.forgotten {
            batch.put_cf(&meta_cf, META_FORGOTTEN, to_json(forgotten));
        }
        drop((meta_cf, progress_cf));
        self.db
            .write_opt(batch, &self.write_options())
            .map_err(rocks(Doing::Write))?;
        state.commit_seq = record.seq;
        if let Some(forgotten) = &record.forgotten {
            state.forgotten = forgotten.clone();
        }
        // Everything written to the small column families before (generation starts, seals,
        // forgetting) goes with it: one atomic flush.
        self.flush_all(state, true)?;
        let Some(done) = state.in_flight.take() else {
            return Ok(());
        };
        // The committed batches' log is not needed any more.
        if let Some(log) = &done.log {
            std::fs::remove_file(log).map_err(io_error("remove", log))?;
        }
        // Keeps its capacity: the next buffer fills it without rehashing.
        if let Ok(mut map) = Arc::try_unwrap(done.ids) {
            map.clear();
            state.spare = Some(map);
        }
        Ok(())
    }

    /// Commits everything buffered, then flushes every column family and waits for it.
    pub(super) fn flush_locked(&self, state: &mut State) -> Result<()> {
        self.commit_pending(state)?;
        self.flush_all(state, true)
    }

    /// Flushes the metadata, progress and live generations' column families together: one
    /// atomic flush.
    pub(super) fn flush_all(&self, state: &State, wait: bool) -> Result<()> {
        let mut names = vec![CF_META, CF_PROGRESS];
        names.extend(state.generations.iter().map(|g| g.name.as_str()));
        self.flush_cfs(&names, wait)
    }

    /// Flushes the named column families together.
    pub(super) fn flush_cfs(&self, names: &[&str], wait: bool) -> Result<()> {
        let handles = names
            .iter()
            .map(|n| self.cf(n))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<_> = handles.iter().collect();
        let mut flush = FlushOptions::default();
        flush.set_wait(wait);
        self.db
            .flush_cfs_opt(&refs, &flush)
            .map_err(rocks(Doing::Write))
    }
}

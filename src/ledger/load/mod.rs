//! Loading a partition's ids in bulk: what a partition that moves to this worker brings with it
//! (its window, read from the id changelog), tens or hundreds of millions of ids at a time.
//!
//! A batch through [`Ledger::check_and_record`] looks every id up, buffers it in a hash map and
//! logs it; at a load's size that is the slow part, and none of it is needed: the ids come from
//! the changelog, which holds each published id once, and nothing reads them until the load is
//! complete. A [`Load`] instead
//! - puts each id's fingerprint in the id index as it arrives, on a thread of its own (the index
//!   made room for the load first: it cannot grow while the load runs), taking the ledger's lock
//!   once per call of [`Load::add`];
//! - collects the ids in runs of [`RUN_IDS`], each sorted and written as one SST file
//!   (uncompressed, without a filter: see `tuning.rs`) by a thread of its own while the next run
//!   fills, two runs at a time (`run.rs`: a run is kept in shards by key, sorted within the
//!   CPU's cache);
//! - and, in [`Load::finish`], ingests every run together with the next regular commit (the id
//!   buffer's file and its commit record) in one `ingest_external_file` call.
//!
//! # What it keeps of the ledger's guarantees
//! - **All or nothing.** The runs and the commit record enter RocksDB in one ingestion, the
//!   ledger's atomic step: after a crash at any instant the ledger holds every loaded id (with the
//!   load's metadata and progress record, restored from the commit record if the crash came
//!   before the bookkeeping) or none of them. Run files a crash leaves behind are removed when
//!   the ledger opens.
//! - **The id index never lacks a held id.** A fingerprint is inserted before its id can be held,
//!   so until the ingestion it only answers "perhaps" for an id that is not there, which RocksDB
//!   then answers (as for any fingerprint collision). The ingestion moves `commit_seq` on, so an
//!   index file stored before it no longer vouches for the generation the ids went into.
//! - **One generation.** The ids go into the active generation, which a load pins: it is not
//!   sealed while a load into it is under way (the fingerprints name it), so it may grow past its
//!   target by what the pipeline records meanwhile; it is sealed as usual once the load is in, and
//!   at once after a load of more than [`SEAL_AFTER_RUNS`] runs, so that it is compacted into one
//!   sorted run.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

mod indexer;
mod run;

use super::format::{stored_first_seen_ms, TimeBase, INGEST_FILE_EXTENSION};
use super::index::IdIndex;
use super::tuning::load_run_options;
use super::{Ledger, LedgerError, PartitionSpan, Result, State};
use crate::identity::LedgerKey;
use crate::Partition;
use indexer::Indexer;
use run::{Run, RunWriter};

/// Ids collected before they are sorted and written as one run: 8M ids, about 200 MB of memory
/// (three runs at most per load: one filling, two being written).
pub const RUN_IDS: usize = 8 << 20;

/// A load of more runs than this has its generation sealed once it is in: the runs carry no
/// filter, so until the generation is compacted a lookup that reaches it reads a block of each.
const SEAL_AFTER_RUNS: usize = 3;

/// Runs written at once: sorting and writing a run costs about 150 ns per id, more than the rest
/// of a load together, so two writers keep up with the changelog on two cores.
const WRITERS: usize = 2;

/// Tells apart the run files of loads that run at once.
static NEXT_RUN: AtomicU64 = AtomicU64::new(0);

/// How a finished load changes what the ledger says of its partition's window: the time before
/// which ids of the partition may be missing (the ledger's `forgotten` time for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowFloor {
    /// Leave it.
    Keep,
    /// Ids first seen before this time (ms) may be missing: older records are still to be loaded.
    Raise(i64),
    /// The older records are loaded: if the floor is still `expected` (what a [`WindowFloor::Raise`]
    /// set; nothing has been forgotten since), it becomes `with` (`None`: nothing is missing).
    Lower { expected: i64, with: Option<i64> },
}

/// A load of one partition's ids under way (see the module docs). Dropped without
/// [`Load::finish`], it leaves the ledger as it was, but for fingerprints that answer "perhaps".
pub struct Load<'l> {
    ledger: &'l Ledger,
    partition: Partition,
    /// Once room is made for it in the id index ([`Load::reserve`]): the generation it goes into.
    pinned: Option<Pinned>,
    /// Ids of the run filling: with their first-seen times until the load is pinned, their
    /// stored first-seen times (relative to the generation's base) after.
    run: Run,
    /// Runs written.
    files: Vec<PathBuf>,
    /// The runs being written, oldest first.
    writing: std::collections::VecDeque<JoinHandle<Result<PathBuf>>>,
    span: Option<PartitionSpan>,
    /// The latest first-seen time the load has read: its clock for the retention limit.
    reached_ms: Option<i64>,
    ids: u64,
    times: LoadTimes,
    /// Ids per run ([`RUN_IDS`]; smaller in tests, so that a load has several).
    run_ids: usize,
}

/// The generation a load goes into, held active until it is in, and what the load reserved.
struct Pinned {
    generation: u64,
    /// The generation's base for stored first-seen times.
    base: TimeBase,
    /// The room it reserved in the id index.
    expected_ids: u64,
    /// Puts the added ids' fingerprints in the id index.
    indexer: Indexer,
}

/// Where a load's time went on the thread that feeds it, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadTimes {
    /// Making room in the id index for the load ([`Load::reserve`]).
    pub reserve_secs: f64,
    /// Putting fingerprints in the id index, on its own thread (with the waits for the ledger's
    /// lock).
    pub index_secs: f64,
    /// Waiting for a run to be sorted and written by its thread.
    pub run_wait_secs: f64,
    /// The commit: the last runs' wait, the index's last chunks, the ingestion, the bookkeeping
    /// and the seal that follows a load of more than [`SEAL_AFTER_RUNS`] runs.
    pub commit_secs: f64,
    /// Runs written.
    pub runs: usize,
}

/// What [`Load::finish`] hands the commit: the runs and what they change.
pub(super) struct LoadedRuns {
    pub(super) partition: Partition,
    pub(super) generation: u64,
    pub(super) files: Vec<PathBuf>,
    pub(super) span: Option<PartitionSpan>,
    pub(super) progress: Vec<u8>,
    pub(super) floor: WindowFloor,
}

impl Ledger {
    /// Starts loading `partition`'s ids in bulk (into the active generation, once the load says
    /// how many it brings: see [`Load::reserve`]).
    pub fn begin_load(&self, partition: Partition) -> Load<'_> {
        Load {
            ledger: self,
            partition,
            pinned: None,
            run: Run::with_capacity(RUN_IDS),
            files: Vec::new(),
            writing: std::collections::VecDeque::new(),
            span: None,
            reached_ms: None,
            ids: 0,
            times: LoadTimes::default(),
            run_ids: RUN_IDS,
        }
    }
}

impl Load<'_> {
    /// Makes room in the id index for about `expected_ids` ids (the index cannot grow while a
    /// load is under way: the generation it goes into is pinned, and a generation's entries are
    /// all stored at one size), then pins the active generation and puts the fingerprints of the
    /// ids added so far in the index. The ids [`Load::add`] takes before this wait in memory; the
    /// first full run, and [`Load::finish`], reserve what they hold if nothing was reserved. A load
    /// larger than its reservation still answers exactly, but may leave some of the index's
    /// buckets overflowed (their ids looked up on disk) until the index is rebuilt.
    pub fn reserve(&mut self, expected_ids: u64) -> Result<()> {
        if self.pinned.is_some() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let first = self.run.first_time().unwrap_or_else(crate::clock::now_ms);
        let (generation, base) = {
            let mut state = self.ledger.lock();
            if state.loads == 0 {
                let room = state.reserved + expected_ids;
                self.ledger.make_room(&mut state, room)?;
            }
            let Some(active) = state.generations.last() else {
                return Err(LedgerError::CorruptMetadata {
                    what: "the ledger has no active generation".into(),
                });
            };
            let generation = active.meta.id;
            state.loads += 1;
            state.reserved += expected_ids;
            (generation, pinned_base(&mut state, generation, first))
        };
        let mut indexer = Indexer::start(Arc::clone(&self.ledger.state), IdIndex::tag(generation));
        indexer.add(self.run.keys().collect());
        for t in self.run.times_mut() {
            *t = stored_first_seen_ms(base, *t);
        }
        self.pinned = Some(Pinned {
            generation,
            base,
            expected_ids,
            indexer,
        });
        self.times.reserve_secs = started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Adds ids with their first-seen times (ms). An id may come more than once (the changelog
    /// holds it again when it was published again after it left an earlier owner's window); the
    /// copy with the latest first-seen time is the one kept.
    ///
    /// With a retention limit, ids older than it before the latest time this load has read (its
    /// clock, never past the wall clock) are left out: no copy still to come after those records
    /// is within the limit of them. A load read after an outage longer than the limit keeps the
    /// ids its partition's waiting records may repeat.
    pub fn add(&mut self, ids: &[(LedgerKey, i64)]) -> Result<()> {
        let kept: Vec<(LedgerKey, i64)>;
        if let Some(newest) = ids.iter().map(|&(_, t)| t).max() {
            self.reached_ms = Some(self.reached_ms.map_or(newest, |r| r.max(newest)));
        }
        let floor = super::retention_floor(
            self.ledger.options.max_window_ms,
            self.reached_ms,
            crate::clock::now_ms(),
        );
        let ids = match floor {
            Some(floor) if ids.iter().any(|&(_, t)| t < floor) => {
                kept = ids.iter().copied().filter(|&(_, t)| t >= floor).collect();
                &kept[..]
            }
            _ => ids,
        };
        let Some(&(_, first)) = ids.first() else {
            return Ok(());
        };
        match &mut self.pinned {
            Some(pinned) => {
                pinned.indexer.add(ids.iter().map(|(k, _)| *k).collect());
                let base = pinned.base;
                for &(key, time_ms) in ids {
                    self.run.push(key, stored_first_seen_ms(base, time_ms));
                }
            }
            None => {
                for &(key, time_ms) in ids {
                    self.run.push(key, time_ms);
                }
            }
        }
        let span = self.span.get_or_insert(PartitionSpan {
            first_seen_ms: first,
            last_seen_ms: first,
            ids: 0,
        });
        for &(_, time_ms) in ids {
            span.first_seen_ms = span.first_seen_ms.min(time_ms);
            span.last_seen_ms = span.last_seen_ms.max(time_ms);
        }
        span.ids += ids.len() as u64;
        self.ids += ids.len() as u64;
        if self.run.len() >= self.run_ids {
            // Nothing reserved yet: at least twice what came so far.
            self.reserve(2 * self.ids)?;
            self.write_run()?;
        }
        // The crash tests die here: part way through a load, with runs written.
        fail::fail_point!("ledger-during-load", |_| std::process::abort());
        Ok(())
    }

    /// Ids added so far.
    pub fn ids(&self) -> u64 {
        self.ids
    }

    /// Whether room was made for the load (see [`Load::reserve`]).
    pub fn reserved(&self) -> bool {
        self.pinned.is_some()
    }

    /// Writes the last run and makes the load durable and visible: every run is ingested, with
    /// `progress` as the partition's progress record (empty: left as it is) and the window floor
    /// changed as `floor` says, in one commit. Returns the ids loaded and where the time went.
    pub fn finish(mut self, progress: &[u8], floor: WindowFloor) -> Result<(u64, LoadTimes)> {
        let started = std::time::Instant::now();
        self.reserve(self.ids)?;
        self.write_last_run()?;
        while !self.writing.is_empty() {
            self.wait_for_run()?;
        }
        let Some(pinned) = self.pinned.as_mut() else {
            return Err(LedgerError::CorruptMetadata {
                what: "a load finished without its generation".into(),
            });
        };
        // Every fingerprint is in before any id is (see the module docs).
        self.times.index_secs = pinned.indexer.finish();
        let runs = LoadedRuns {
            partition: self.partition,
            generation: pinned.generation,
            files: std::mem::take(&mut self.files),
            span: self.span,
            progress: progress.to_vec(),
            floor,
        };
        self.ledger.commit_load(runs)?;
        if self.times.runs > SEAL_AFTER_RUNS {
            // Sealed when the load lets go of it (in `drop`), part of the commit's time.
            self.ledger.lock().seal_requested = true;
        }
        let (ids, mut times) = (self.ids, self.times);
        drop(self);
        times.commit_secs = started.elapsed().as_secs_f64();
        Ok((ids, times))
    }

    /// Hands the filled run to a writer thread (once fewer than [`WRITERS`] are busy).
    fn write_run(&mut self) -> Result<()> {
        if self.run.is_empty() {
            return Ok(());
        }
        while self.writing.len() >= WRITERS {
            self.wait_for_run()?;
        }
        let run = std::mem::replace(&mut self.run, Run::with_capacity(self.run_ids));
        self.spawn_writer(run)
    }

    /// Hands the last run to [`WRITERS`] writers at once, in pieces of disjoint key ranges.
    /// Nothing of the load is left to overlap the last run's sort and write with: written whole,
    /// it kept one core busy and left the other idle (the last run of a 50M-id load holds 8M ids,
    /// about a second).
    fn write_last_run(&mut self) -> Result<()> {
        let run = std::mem::replace(&mut self.run, Run::with_capacity(0));
        for piece in run.split(WRITERS) {
            self.spawn_writer(piece)?;
        }
        Ok(())
    }

    fn spawn_writer(&mut self, run: Run) -> Result<()> {
        let writer = RunWriter {
            file: self.ledger.path.join(format!(
                "load-{:06}.{}",
                NEXT_RUN.fetch_add(1, Ordering::Relaxed),
                INGEST_FILE_EXTENSION
            )),
            options: load_run_options(&self.ledger.options, &self.ledger.block_cache),
            base: self
                .pinned
                .as_ref()
                .map_or(TimeBase::seconds(0), |p| p.base),
            run,
        };
        let spawned = std::thread::Builder::new()
            .name("ledger-load".into())
            .spawn(move || writer.write());
        match spawned {
            Ok(handle) => self.writing.push_back(handle),
            Err(e) => {
                return Err(LedgerError::Io {
                    what: "start a thread to write",
                    path: self.ledger.path.clone(),
                    source: e,
                })
            }
        }
        Ok(())
    }

    /// Waits for the oldest run being written.
    fn wait_for_run(&mut self) -> Result<()> {
        if let Some(handle) = self.writing.pop_front() {
            let started = std::time::Instant::now();
            let file = handle.join().unwrap_or_else(|payload| {
                Err(LedgerError::panicked("run writer", payload.as_ref()))
            })?;
            self.files.push(file);
            self.times.run_wait_secs += started.elapsed().as_secs_f64();
            self.times.runs += 1;
        }
        Ok(())
    }
}

impl Drop for Load<'_> {
    fn drop(&mut self) {
        if let Some(pinned) = self.pinned.as_mut() {
            pinned.indexer.finish();
        }
        // Runs still being written are waited for, so that their files can go too.
        while !self.writing.is_empty() {
            let _ = self.wait_for_run();
        }
        for file in self.files.drain(..) {
            let _ = std::fs::remove_file(file);
        }
        let Some(pinned) = self.pinned.take() else {
            return;
        };
        let mut state = self.ledger.lock();
        state.loads = state.loads.saturating_sub(1);
        state.reserved = state.reserved.saturating_sub(pinned.expected_ids);
        // A seal the load held back happens now.
        if let Err(e) = self.ledger.maybe_seal(&mut state) {
            crate::metrics::events::LedgerSealFailed { error: &e }.emit();
        }
    }
}

impl LoadedRuns {
    /// Applies the load to the ledger's state as the commit taking it records it: the ids count
    /// in the active generation's metadata, the progress record joins the buffered ones. Returns
    /// the partition window floors the commit must store, if the load changes one.
    pub(super) fn apply(
        &self,
        state: &mut State,
    ) -> Option<std::collections::BTreeMap<Partition, i64>> {
        if let (Some(span), Some(active)) = (self.span, state.generations.last_mut()) {
            let meta = &mut active.meta;
            meta.base_ms.get_or_insert(span.first_seen_ms);
            meta.ids += span.ids;
            meta.partitions
                .entry(self.partition)
                .and_modify(|held| {
                    held.first_seen_ms = held.first_seen_ms.min(span.first_seen_ms);
                    held.last_seen_ms = held.last_seen_ms.max(span.last_seen_ms);
                    held.ids += span.ids;
                })
                .or_insert(span);
        }
        if !self.progress.is_empty() {
            state
                .pending_progress
                .insert(self.partition, self.progress.clone());
        }
        let mut forgotten = state.forgotten.clone();
        let current = forgotten.get(&self.partition).copied();
        match self.floor {
            WindowFloor::Keep => return None,
            WindowFloor::Raise(at) => {
                forgotten.insert(self.partition, current.map_or(at, |c| c.max(at)));
            }
            WindowFloor::Lower { expected, with } if current == Some(expected) => match with {
                Some(at) => {
                    forgotten.insert(self.partition, at);
                }
                None => {
                    forgotten.remove(&self.partition);
                }
            },
            // Something was forgotten since the floor was raised: it stays.
            WindowFloor::Lower { .. } => return None,
        }
        Some(forgotten)
    }
}

/// The pinned generation's base: its own, or `first` if it has none yet (no id recorded), in the
/// generation's resolution.
fn pinned_base(state: &mut State, generation: u64, first: i64) -> TimeBase {
    match state
        .generations
        .iter_mut()
        .find(|g| g.meta.id == generation)
    {
        Some(g) => {
            g.meta.base_ms.get_or_insert(first);
            g.meta.time_base().unwrap_or(TimeBase::seconds(first))
        }
        None => TimeBase::seconds(first),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::ledger_key;
    use crate::ledger::{Durability, LedgerOptions, Verdict};

    fn key(n: u64) -> LedgerKey {
        ledger_key(format!("loaded-{n}").as_bytes()).unwrap()
    }

    fn options() -> LedgerOptions {
        LedgerOptions {
            budget_bytes: 256 << 20,
            write_buffer_bytes: 1 << 20,
            block_cache_bytes: 1 << 20,
            ..LedgerOptions::default()
        }
    }

    /// Loads ids `0..n` of partition 7 (first seen at 1,000 s + n) in chunks of 1,000, in runs of
    /// 3,000, and finishes with `progress`.
    fn load(ledger: &Ledger, n: u64, progress: &[u8]) -> (u64, LoadTimes) {
        let mut load = ledger.begin_load(7);
        load.run_ids = 3_000;
        let ids: Vec<(LedgerKey, i64)> = (0..n)
            .map(|i| (key(i), 1_000_000 + i as i64 * 1000))
            .collect();
        for chunk in ids.chunks(1_000) {
            load.add(chunk).unwrap();
        }
        load.finish(progress, WindowFloor::Keep).unwrap()
    }

    fn ingest_files(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == super::super::format::INGEST_FILE_EXTENSION)
            })
            .count()
    }

    #[test]
    fn a_load_is_held_whole_with_its_progress_beside_the_pipelines_ids() {
        for durability in Durability::ALL {
            let dir = tempfile::tempdir().unwrap();
            let ledger = Ledger::open(
                dir.path(),
                LedgerOptions {
                    durability,
                    ..options()
                },
            )
            .unwrap();
            // Another partition's batch, buffered when the load starts.
            ledger
                .check_and_record(1, &[(key(1_000_000), 5_000_000)], b"p1")
                .unwrap();
            let (n, times) = load(&ledger, 10_000, b"loaded");
            assert_eq!(
                (n, times.runs),
                (10_000, 5),
                "{durability}: three runs of 3,000, the last 1,000 in two pieces"
            );
            assert_eq!(
                ingest_files(dir.path()),
                0,
                "{durability}: the runs moved into the ledger"
            );
            let check = |ledger: &Ledger, what: &str| {
                let keys: Vec<LedgerKey> = (0..10_000)
                    .map(key)
                    .chain([key(1_000_000), key(20_000)])
                    .collect();
                let held = ledger.check(&keys).unwrap();
                for (i, found) in held[..10_000].iter().enumerate() {
                    assert_eq!(
                        *found,
                        Some(1_000_000 + i as i64 * 1000),
                        "{durability} {what}: loaded id {i}"
                    );
                }
                assert_eq!(
                    held[10_000],
                    Some(5_000_000),
                    "{durability} {what}: the pipeline's id"
                );
                assert_eq!(held[10_001], None, "{durability} {what}: an id never seen");
                assert_eq!(
                    ledger.progress(7).unwrap().as_deref(),
                    Some(&b"loaded"[..]),
                    "{durability} {what}"
                );
                assert_eq!(
                    ledger.progress(1).unwrap().as_deref(),
                    Some(&b"p1"[..]),
                    "{durability} {what}"
                );
                let window = ledger.window(7, 20_000_000).unwrap();
                assert_eq!(
                    window,
                    std::time::Duration::from_secs(19_000),
                    "{durability} {what}: from the oldest loaded id"
                );
                assert_eq!(
                    ledger.stats().unwrap().ids_estimate,
                    10_001,
                    "{durability} {what}"
                );
            };
            check(&ledger, "after the load");
            // A loaded id sent again is a duplicate; a new one is new.
            let v = ledger
                .check_and_record(
                    7,
                    &[(key(5), 30_000_000), (key(30_000), 30_000_000)],
                    b"next",
                )
                .unwrap();
            assert_eq!(
                v,
                vec![
                    Verdict::Duplicate {
                        first_seen_ms: 1_005_000,
                        digest: None
                    },
                    Verdict::New
                ],
                "{durability}"
            );
            ledger.drop_without_closing();
            let ledger = Ledger::open(
                dir.path(),
                LedgerOptions {
                    durability,
                    ..options()
                },
            )
            .unwrap();
            assert_eq!(
                ledger.check(&[key(9_999)]).unwrap(),
                vec![Some(1_000_000 + 9_999_000)],
                "{durability}: after a crash"
            );
            drop(ledger);
        }
    }

    #[test]
    fn a_load_given_up_leaves_neither_ids_nor_files() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), options()).unwrap();
        let mut load = ledger.begin_load(7);
        load.run_ids = 3_000;
        let ids: Vec<(LedgerKey, i64)> = (0..7_000).map(|i| (key(i), 1_000_000)).collect();
        load.add(&ids).unwrap();
        drop(load);
        assert_eq!(ingest_files(dir.path()), 0, "the written runs are removed");
        assert_eq!(
            ledger.check(&[key(1), key(6_999)]).unwrap(),
            vec![None, None]
        );
        assert_eq!(ledger.progress(7).unwrap(), None);
        assert_eq!(ledger.window(7, 5_000_000), None);
        // The generation it pinned is sealed as usual afterwards, and a later load works.
        load_and_check_again(&ledger);
    }

    fn load_and_check_again(ledger: &Ledger) {
        load(ledger, 100, b"again");
        assert_eq!(
            ledger.check(&[key(99)]).unwrap(),
            vec![Some(1_000_000 + 99_000)]
        );
    }

    #[test]
    fn an_id_loaded_twice_keeps_its_latest_first_seen_time() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), options()).unwrap();
        let mut load = ledger.begin_load(7);
        load.run_ids = 2;
        // The changelog holds id 1 twice: published again after it left an earlier window.
        load.add(&[(key(1), 1_000_000), (key(2), 2_000_000)])
            .unwrap();
        load.add(&[(key(3), 3_000_000), (key(1), 4_000_000)])
            .unwrap();
        load.add(&[(key(1), 5_000_000), (key(1), 6_000_000)])
            .unwrap();
        load.finish(b"x", WindowFloor::Keep).unwrap();
        assert_eq!(
            ledger.check(&[key(1), key(2), key(3)]).unwrap(),
            vec![Some(6_000_000), Some(2_000_000), Some(3_000_000)]
        );
    }

    #[test]
    fn the_window_floor_says_what_is_missing_until_the_older_ids_are_in() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), options()).unwrap();
        let now = 200_000_000;
        // The window: ids first seen from 100,000 s on; older ones are still to come.
        let mut load = ledger.begin_load(7);
        load.add(&[(key(1), 150_000_000), (key(2), 190_000_000)])
            .unwrap();
        load.finish(b"p", WindowFloor::Raise(140_000_000)).unwrap();
        assert_eq!(
            ledger.window(7, now),
            Some(std::time::Duration::from_secs(50_000)),
            "the oldest loaded id"
        );
        let mut load = ledger.begin_load(7);
        load.add(&[(key(3), 120_000_000)]).unwrap();
        // The floor holds across a reopen: it is in the commit.
        load.finish(&[], WindowFloor::Keep).unwrap();
        assert_eq!(
            ledger.window(7, now),
            Some(std::time::Duration::from_secs(60_000)),
            "not past the floor"
        );
        drop(ledger);
        let ledger = Ledger::open(dir.path(), options()).unwrap();
        assert_eq!(
            ledger.window(7, now),
            Some(std::time::Duration::from_secs(60_000))
        );
        let mut load = ledger.begin_load(7);
        load.add(&[(key(4), 100_000_000)]).unwrap();
        load.finish(
            &[],
            WindowFloor::Lower {
                expected: 140_000_000,
                with: None,
            },
        )
        .unwrap();
        assert_eq!(
            ledger.window(7, now),
            Some(std::time::Duration::from_secs(100_000)),
            "the older ids are in"
        );
        ledger.drop_without_closing();
        let ledger = Ledger::open(dir.path(), options()).unwrap();
        assert_eq!(
            ledger.window(7, now),
            Some(std::time::Duration::from_secs(100_000)),
            "after a crash too"
        );
    }

    const CRASH_DIR_ENV: &str = "DEDUPE_LOAD_CRASH_DIR";
    const CRASH_LOAD_IDS: u64 = 200_000;

    /// The child side of the load crash tests: loads partition 7's ids (if the ledger does not
    /// hold them), then records batches of partition 0 forever.
    #[test]
    #[ignore = "the load crash tests' child process; they run it"]
    fn crash_child_loader() {
        let dir =
            std::env::var(CRASH_DIR_ENV).expect("run by the crash tests, which set the directory");
        let _failpoints = fail::FailScenario::setup();
        let ledger = Ledger::open(&dir, options()).unwrap();
        if ledger.progress(7).unwrap().is_none() {
            load(&ledger, CRASH_LOAD_IDS, b"loaded");
        }
        for batch in 0u64.. {
            let items: Vec<_> = (0..64)
                .map(|i| (ledger_key(format!("b{batch}-{i}").as_bytes()).unwrap(), 1))
                .collect();
            ledger
                .check_and_record(0, &items, &batch.to_le_bytes())
                .unwrap();
        }
    }

    fn run_child(
        dir: &std::path::Path,
        failpoints: Option<&str>,
        kill_after: Option<std::time::Duration>,
    ) {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "ledger::load::tests::crash_child_loader",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CRASH_DIR_ENV, dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        if let Some(f) = failpoints {
            cmd.env("FAILPOINTS", f);
        }
        let mut child = cmd.spawn().unwrap();
        if let Some(after) = kill_after {
            std::thread::sleep(after);
            child.kill().unwrap();
        }
        let status = child.wait().unwrap();
        assert!(!status.success(), "the child was meant to die");
    }

    /// After a crash: the load's ids are all held with its progress record, or none of them
    /// without it. Returns whether the load was held.
    fn load_whole_or_absent(dir: &std::path::Path, what: &str) -> bool {
        let ledger = Ledger::open(dir, options())
            .unwrap_or_else(|e| panic!("{what}: the ledger does not open again: {e}"));
        let keys: Vec<LedgerKey> = (0..CRASH_LOAD_IDS).map(key).collect();
        let held = ledger
            .check(&keys)
            .unwrap()
            .iter()
            .filter(|f| f.is_some())
            .count() as u64;
        let progress = ledger.progress(7).unwrap();
        assert_eq!(
            ingest_files(dir),
            0,
            "{what}: leftover run files are removed at open"
        );
        match progress.as_deref() {
            Some(b"loaded") => assert_eq!(
                held, CRASH_LOAD_IDS,
                "{what}: a load with its progress record lacks ids"
            ),
            None => assert_eq!(held, 0, "{what}: ids of a load without its progress record"),
            Some(other) => panic!("{what}: unexpected progress {other:?}"),
        }
        progress.is_some()
    }

    // The child dies at a failpoint: without the feature it would record batches forever.
    #[cfg(feature = "failpoints")]
    #[test]
    fn a_crash_between_a_loads_ingestion_and_its_bookkeeping_keeps_the_load() {
        let dir = tempfile::tempdir().unwrap();
        run_child(dir.path(), Some("ledger-after-ingest=return"), None);
        assert!(
            load_whole_or_absent(dir.path(), "after the ingestion"),
            "the ingested load was lost"
        );
    }

    // The child dies at a failpoint: without the feature it would record batches forever.
    #[cfg(feature = "failpoints")]
    #[test]
    fn a_crash_part_way_through_a_load_leaves_nothing_of_it() {
        let dir = tempfile::tempdir().unwrap();
        // Ten chunks of 1,000 ids in: three runs written, one filling.
        run_child(dir.path(), Some("ledger-during-load=10*off->return"), None);
        assert!(
            !load_whole_or_absent(dir.path(), "part way through the load"),
            "a load that never finished is held"
        );
    }

    #[test]
    fn a_load_killed_at_any_moment_is_held_whole_or_not_at_all() {
        let mut rng = rand::rng();
        let (mut whole, mut absent) = (0, 0);
        for kill in 0..10 {
            let dir = tempfile::tempdir().unwrap();
            let after = std::time::Duration::from_millis(rand::Rng::random_range(&mut rng, 5..600));
            run_child(dir.path(), None, Some(after));
            if load_whole_or_absent(dir.path(), &format!("kill {kill} after {after:?}")) {
                whole += 1;
            } else {
                absent += 1;
            }
        }
        eprintln!("loads held whole: {whole}, absent: {absent}");
    }
}

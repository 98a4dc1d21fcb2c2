//! A load's index thread: the fingerprints of the ids a load brings go into the id index on a
//! thread of their own, beside the changelog's reading and the runs' writing, and are all in
//! before the load is committed.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::super::index::BulkPlace;
use super::super::State;
use crate::identity::LedgerKey;

/// The thread that puts a load's fingerprints in the id index, fed chunks of keys; where no thread
/// can be had, the loading thread does it.
pub(super) struct Indexer {
    chunks: Option<crossbeam_channel::Sender<Vec<LedgerKey>>>,
    thread: Option<JoinHandle<f64>>,
    /// Without a thread: the state and tag to insert into on the loading thread, and its time.
    inline: Option<(Arc<Mutex<State>>, u8, f64)>,
}

impl Indexer {
    /// Chunks waiting for the thread: about as many ids as a run.
    const QUEUED: usize = 256;

    pub(super) fn start(state: Arc<Mutex<State>>, tag: u8) -> Indexer {
        let (chunks, queue) = crossbeam_channel::bounded::<Vec<LedgerKey>>(Self::QUEUED);
        let shared = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("ledger-load-index".into())
            .spawn(move || {
                let mut sorted = SortedInserts::new(shared, tag);
                for keys in queue {
                    sorted.add(&keys);
                }
                sorted.finish()
            });
        match thread {
            Ok(thread) => Indexer {
                chunks: Some(chunks),
                thread: Some(thread),
                inline: None,
            },
            Err(e) => {
                tracing::debug!(error = %e, "Could not start a thread for a load's index; it fills on the loading thread.");
                Indexer {
                    chunks: None,
                    thread: None,
                    inline: Some((state, tag, 0.0)),
                }
            }
        }
    }

    pub(super) fn add(&mut self, keys: Vec<LedgerKey>) {
        if let Some(chunks) = &self.chunks {
            // The thread ends only when this sender goes, so it receives every chunk.
            let _ = chunks.send(keys);
        } else if let Some((state, tag, busy)) = &mut self.inline {
            *busy += index_locked(state, &keys, *tag);
        }
    }

    /// Waits until every chunk sent is in the index; the seconds spent putting them there.
    pub(super) fn finish(&mut self) -> f64 {
        self.chunks.take();
        let threaded = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or(0.0);
        threaded + self.inline.as_ref().map_or(0.0, |(_, _, busy)| *busy)
    }
}

/// The index thread's inserts: places gathered [`SortedInserts::BATCH`] at a time, sorted by
/// first bucket and inserted in that order. Ids arrive in the changelog's order, which is random
/// in the table: inserted as they came, each missed the cache (about 60 ns an id); in bucket
/// order, a batch walks the table from one end to the other.
struct SortedInserts {
    state: Arc<Mutex<State>>,
    tag: u8,
    places: Vec<BulkPlace>,
    /// Seconds spent placing, sorting and inserting, the waits for the lock included.
    busy_secs: f64,
}

impl SortedInserts {
    /// Places sorted at once: 12 MB, a quarter of the buckets of a table sized for 50M ids.
    const BATCH: usize = 1 << 20;
    /// Inserts made under one hold of the ledger's lock: other partitions' batches wait for a
    /// slice, not a whole batch.
    const SLICE: usize = 1 << 16;

    fn new(state: Arc<Mutex<State>>, tag: u8) -> SortedInserts {
        SortedInserts {
            state,
            tag,
            places: Vec::with_capacity(Self::BATCH),
            busy_secs: 0.0,
        }
    }

    fn add(&mut self, keys: &[LedgerKey]) {
        let started = std::time::Instant::now();
        let placer = {
            let state = self.lock();
            if !state.index.knows() {
                return;
            }
            state.index.placer()
        };
        for key in keys {
            match placer.bulk_place(key) {
                Some(place) => self.places.push(place),
                // A table of over 2^32 buckets (256 GiB): inserted as it comes.
                None => {
                    self.busy_secs += index_locked(&self.state, std::slice::from_ref(key), self.tag)
                }
            }
        }
        self.busy_secs += started.elapsed().as_secs_f64();
        if self.places.len() >= Self::BATCH {
            self.insert();
        }
    }

    /// Inserts the places gathered, in the order of their first buckets.
    fn insert(&mut self) {
        let started = std::time::Instant::now();
        radsort::sort_by_key(&mut self.places, |p| p.first);
        for slice in self.places.chunks(Self::SLICE) {
            let mut state = self.lock();
            let index = &mut state.index;
            for (i, place) in slice.iter().enumerate() {
                if let Some(ahead) = slice.get(i + PREFETCH_AHEAD) {
                    index.prefetch_bulk_place(ahead);
                }
                index.insert_bulk_place(place, self.tag);
            }
        }
        self.places.clear();
        self.busy_secs += started.elapsed().as_secs_f64();
    }

    /// Inserts what is left; the seconds spent, the waits for the lock included.
    fn finish(mut self) -> f64 {
        self.insert();
        self.busy_secs
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Bulk places prefetched ahead of the one inserted: in bucket order the next few are close.
const PREFETCH_AHEAD: usize = 16;

/// [`index_all`] under the ledger's lock; the seconds it took, the wait for the lock included.
fn index_locked(state: &Mutex<State>, keys: &[LedgerKey], tag: u8) -> f64 {
    let started = std::time::Instant::now();
    index_all(
        &mut state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
        keys,
        tag,
    );
    started.elapsed().as_secs_f64()
}

/// Puts the fingerprint of every key in the index under `tag`, prefetching a few keys ahead.
fn index_all(state: &mut State, keys: &[LedgerKey], tag: u8) {
    let index = &mut state.index;
    if !index.knows() {
        return;
    }
    let placer = index.placer();
    let places: Vec<_> = keys.iter().map(|k| placer.place(k)).collect();
    for (i, place) in places.iter().enumerate() {
        index.prefetch_ahead_for_bulk(&places, i);
        index.insert_bulk(place, tag);
    }
}

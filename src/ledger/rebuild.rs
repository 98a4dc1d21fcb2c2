//! Making the id index when the ledger opens: loaded from its file where the file vouches for the
//! generations (`index_file.rs`), and the other generations' keys read from disk.

use super::error::{rocks, Doing};
use super::index::{self, IdIndex};
use super::index_file::{self, IndexSource};
use super::{Generation, Ledger, Result, State};
use crate::identity::{LedgerKey, LEDGER_KEY_BYTES};

/// Keys whose index buckets are prefetched together while the index is rebuilt.
const REBUILD_RUN: usize = 64;

impl Ledger {
    /// Fills the id index with every id of every generation: from the index file for the
    /// generations it vouches for, from disk for the others.
    pub(super) fn build_index(&self, state: &mut State) -> Result<IndexSource> {
        let started = std::time::Instant::now();
        if !self.options.build_index {
            return Ok(IndexSource::Empty);
        }
        if state.generations.iter().all(|g| g.meta.ids == 0) {
            // Nothing to index (an index that holds nothing is not stored, see `index_file.rs`).
            state.index = IdIndex::new(self.options.index_geometry(), 0, rand::random());
            for g in &state.generations {
                state.index.start(IdIndex::tag(g.meta.id));
            }
            return Ok(IndexSource::Empty);
        }
        let (to_read, source) = self.start_index(state);
        let State {
            generations, index, ..
        } = state;
        let generations: Vec<&Generation> = to_read.iter().map(|&i| &generations[i]).collect();
        if generations.is_empty() {
            crate::metrics::events::IdIndexLoaded {
                ids: index.live_slots(),
                elapsed_ms: started.elapsed().as_millis() as u64,
            }
            .emit();
            return Ok(source);
        }
        let ids = self.read_into_index(&generations, index)?;
        crate::metrics::events::IdIndexRebuilt {
            ids_read: ids,
            generations_read: generations.len(),
            index: source.label(),
            elapsed_ms: started.elapsed().as_millis() as u64,
            overflowed_buckets: index.overflowed_buckets(),
        }
        .emit();
        Ok(source)
    }

    /// Sets `state.index` up: loaded from the index file when it vouches for the generations
    /// (those it trusts revived), else a new table, in either case large enough for the ids still
    /// to read. Returns the generations (by position) whose keys must still be read from disk, and
    /// where the index comes from.
    fn start_index(&self, state: &mut State) -> (Vec<usize>, IndexSource) {
        let sealed = state
            .generations
            .iter()
            .map(|g| (g.meta.id, g.meta.sealed))
            .collect();
        let geometry = self.options.index_geometry();
        match index_file::read(&self.path, geometry, state.commit_seq, &sealed) {
            Some(loaded) => {
                state.index = loaded.index;
                let (trusted, mut to_read): (Vec<usize>, Vec<usize>) = (0..state.generations.len())
                    .partition(|&i| loaded.trusted.contains(&state.generations[i].meta.id));
                for &i in &trusted {
                    state
                        .index
                        .revive(IdIndex::tag(state.generations[i].meta.id));
                }
                // Room for what is read from disk: a generation the file does not vouch for is
                // never the active one being filled, since the file vouches for that one only if
                // nothing was committed since, and then there is nothing to read.
                let more: u64 = to_read.iter().map(|&i| state.generations[i].meta.ids).sum();
                let index = &mut state.index;
                let level = index.geometry().1;
                while index.live_slots() + more > index.geometry().0.capacity(index.geometry().1)
                    && index.geometry().1 < geometry.max_level
                {
                    index.grow();
                    index.finish_growth();
                }
                // A table grown here keeps every entry at the level it was stored at, which is
                // right for the sealed generations. The active one takes more ids, and they go in
                // at the new level, while its entries would be compared at the old one: every id
                // recorded from now on would be answered "absent". So the active generation is
                // read from disk again, at the new level. (A file stored fuller than its level's
                // capacity, as an open that replayed a crash's batch log leaves it, grows here.)
                if index.geometry().1 > level {
                    for &i in trusted
                        .iter()
                        .filter(|&&i| !state.generations[i].meta.sealed)
                    {
                        index.forget(IdIndex::tag(state.generations[i].meta.id));
                        to_read.push(i);
                    }
                    to_read.sort_unstable();
                }
                for &i in &to_read {
                    state
                        .index
                        .start(IdIndex::tag(state.generations[i].meta.id));
                }
                let source = if to_read.is_empty() {
                    IndexSource::Loaded
                } else {
                    IndexSource::Partial
                };
                (to_read, source)
            }
            None => {
                let ids: u64 = state.generations.iter().map(|g| g.meta.ids).sum();
                state.index = IdIndex::new(geometry, geometry.level_for(ids), rand::random());
                for g in state.generations.iter() {
                    state.index.start(IdIndex::tag(g.meta.id));
                }
                ((0..state.generations.len()).collect(), IndexSource::Rebuilt)
            }
        }
    }

    /// Reads every key of `generations` into `index`; returns how many were read. Reader threads
    /// (one per core, generations shared out among them) read the keys and work out their
    /// places; this thread inserts them, a prefetched run at a time.
    fn read_into_index(&self, generations: &[&Generation], index: &mut IdIndex) -> Result<u64> {
        let readers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(generations.len());
        let placer = index.placer();
        // A generation holds an id twice only when ids are recorded again into it (a refresh, a
        // copy past the retention limit): then one slot each.
        let again = self.options.refresh_on_duplicate || self.options.max_window_ms.is_some();
        let mut ids = 0u64;
        let mut failed = None;
        std::thread::scope(|scope| {
            let (tx, rx) = crossbeam_channel::bounded::<Result<(u8, Vec<index::Place>)>>(64);
            for r in 0..readers {
                let tx = tx.clone();
                scope.spawn(move || {
                    for g in generations.iter().skip(r).step_by(readers) {
                        let tag = IdIndex::tag(g.meta.id);
                        if let Err(e) = self.read_places(&g.name, tag, placer, &tx) {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                });
            }
            drop(tx);
            for message in rx {
                match message {
                    Ok((tag, places)) => {
                        ids += places.len() as u64;
                        for run in places.chunks(REBUILD_RUN) {
                            for place in run {
                                index.prefetch(place);
                            }
                            for place in run {
                                if again {
                                    index.insert_once(place, tag);
                                } else {
                                    index.insert(place, tag);
                                }
                            }
                        }
                    }
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(ids),
        }
    }

    /// Reads a generation's keys and sends their index places, in chunks.
    fn read_places(
        &self,
        name: &str,
        tag: u8,
        placer: index::Placer,
        tx: &crossbeam_channel::Sender<Result<(u8, Vec<index::Place>)>>,
    ) -> Result<()> {
        const CHUNK: usize = 16 << 10;
        let cf = self.cf(name)?;
        let mut read = rocksdb::ReadOptions::default();
        read.fill_cache(false);
        read.set_readahead_size(4 << 20);
        let mut iter = self.db.raw_iterator_cf_opt(&cf, read);
        iter.seek_to_first();
        let mut chunk = Vec::with_capacity(CHUNK);
        while let Some(key) = iter.key() {
            if let Ok(key) = <[u8; LEDGER_KEY_BYTES]>::try_from(key) {
                chunk.push(placer.place(&LedgerKey(key)));
                if chunk.len() == CHUNK {
                    let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
                    // The receiver only goes away once every sender has.
                    let _ = tx.send(Ok((tag, full)));
                }
            }
            iter.next();
        }
        iter.status().map_err(rocks(Doing::Read))?;
        if !chunk.is_empty() {
            let _ = tx.send(Ok((tag, chunk)));
        }
        Ok(())
    }
}

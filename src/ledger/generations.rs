//! Generations: starting the active one, sealing it when it is full, compacting a sealed one,
//! forgetting the oldest whole while the rest exceed the budget, and the window that what is
//! left covers.

use std::collections::BTreeMap;
use std::time::Duration;

use rocksdb::WriteBatch;

use super::error::{rocks, Doing};
use super::format::{
    generation_cf_name, generation_meta_key, to_json, META_FORGOTTEN, META_FORMAT_VERSION,
};
use super::index::IdIndex;
use super::tuning::{effective_write_buffer_bytes, generation_cf_options};
use super::{
    Generation, GenerationMeta, Ledger, Result, State, CF_META, FIRST_SEEN_RESOLUTION_MS,
    FORMAT_VERSION,
};
use crate::Partition;

/// Live generations are capped below the id index's 256 generation tags, so no two live
/// generations share a tag. Only tiny `seal_after_ids` settings come near it.
pub(super) const MAX_LIVE_GENERATIONS: usize = 200;

/// A seal commits the id buffer under the ledger's lock; a buffer of more ids than this (about
/// 15 ms of writing) is committed in the background first, and the seal waits for it.
pub(super) const SEAL_BUFFER_IDS: usize = 1 << 16;

/// Background commits a seal waits for, at most: if the buffer fills faster than it is
/// committed, the seal goes ahead with what is buffered then.
const MAX_SEAL_DEFERRALS: u32 = 4;

impl Ledger {
    /// Creates the next generation, empty and active, and describes it in the metadata.
    pub(super) fn start_generation(&self, state: &mut State) -> Result<()> {
        let id = state.generations.last().map_or(1, |g| g.meta.id + 1);
        let name = generation_cf_name(id);
        self.db
            .create_cf(
                &name,
                &generation_cf_options(&self.options, &self.block_cache),
            )
            .map_err(rocks(Doing::Generation("create", &name)))?;
        let meta = GenerationMeta {
            id,
            base_ms: None,
            // Under a retention limit, first-seen times are kept to the millisecond, which its
            // comparisons need (format version 4); otherwise in seconds, as every version reads.
            resolution_ms: if self.options.max_window_ms.is_some() {
                1
            } else {
                FIRST_SEEN_RESOLUTION_MS
            },
            sealed: false,
            ids: 0,
            partitions: BTreeMap::new(),
        };
        let mut batch = WriteBatch::default();
        batch.put_cf(&self.cf(CF_META)?, generation_meta_key(id), to_json(&meta));
        if meta.resolution_ms != FIRST_SEEN_RESOLUTION_MS {
            // A millisecond generation: code that reads only seconds must not open the ledger.
            batch.put_cf(
                &self.cf(CF_META)?,
                META_FORMAT_VERSION,
                FORMAT_VERSION.to_le_bytes(),
            );
        }
        self.db
            .write_opt(batch, &self.write_options())
            .map_err(rocks(Doing::Write))?;
        // Starting a tag may clear slots, and the seal forgets generations: a background store
        // of the index gives up (see `index_file.rs`).
        state.index_epoch += 1;
        state.index.start(IdIndex::tag(id));
        state.generations.push(Generation { name, meta });
        Ok(())
    }

    /// Seals the active generation when it is full, or when the id index must grow, then forgets
    /// the oldest generations until the rest fit the budget.
    pub(super) fn maybe_seal(&self, state: &mut State) -> Result<()> {
        // A bulk load's fingerprints name the active generation: it stays active until the
        // load is in (`load.rs`).
        if state.generations.is_empty() || state.loads > 0 {
            return Ok(());
        }
        if state.index.needs_growth(0) {
            let target = state.index.level_for(0);
            // Put off only while the table has room: at its first sizes a background commit
            // takes longer than the batches need to fill it to overflowing.
            let may_defer = state.index.growth_can_wait();
            return self.grow_to(state, target, may_defer);
        }
        if state.index.growth_near(2 * self.buffer_capacity_ids()) {
            self.commit_ahead_of_growth(state)?;
        }
        let Some(active) = state.generations.last() else {
            return Ok(());
        };
        let full_by_ids = self
            .options
            .seal_after_ids
            .is_some_and(|n| active.meta.ids >= n);
        if !full_by_ids
            && !state.seal_requested
            && self.generation_bytes(state, active)? < self.options.generation_target_bytes()
        {
            return Ok(());
        }
        if !self.ready_to_seal(state)? {
            return Ok(());
        }
        self.seal_active(state, None)
    }

    /// Whether a seal due now can go ahead without writing a large id buffer under the lock (the
    /// batch that waits for it would stall: 0.4-0.8 s at 2.8M buffered ids). If not, the buffer is
    /// committed in the background (unless a commit is in flight already), and a later batch
    /// seals once it is applied, with the few ids buffered since. The generation takes those
    /// batches' ids meanwhile: its size is a target, not a limit.
    fn ready_to_seal(&self, state: &mut State) -> Result<bool> {
        let committing = state
            .in_flight
            .as_ref()
            .is_some_and(|f| f.ids.len() > SEAL_BUFFER_IDS && !f.written());
        if committing {
            return Ok(false);
        }
        if state.pending.len() <= SEAL_BUFFER_IDS || state.seal_deferrals >= MAX_SEAL_DEFERRALS {
            state.seal_deferrals = 0;
            return Ok(true);
        }
        state.seal_deferrals += 1;
        self.start_commit(state)?;
        Ok(false)
    }

    /// Within two buffers' worth of ids of a growth of the id index, commits the id buffer in the
    /// background whenever it holds more than a seal should write under the lock and no commit is
    /// under way, so that the growth's seal finds a small buffer. Otherwise, at the index's first
    /// sizes, the buffer held every id since the last commit (up to a write buffer's worth, 0.4 s
    /// of writing at 1.8M ids); the background commit the seal then started took longer than the
    /// batches took to fill the table to where the growth cannot wait (`growth_can_wait`), and
    /// the seal wrote the buffer under the lock.
    fn commit_ahead_of_growth(&self, state: &mut State) -> Result<()> {
        let idle = state.in_flight.as_ref().is_none_or(|f| f.written());
        if idle && state.pending.len() > SEAL_BUFFER_IDS {
            self.start_commit(state)?;
        }
        Ok(())
    }

    /// Grows the id index, if need be, so that a load of about `more` ids fits at its target load
    /// (rather than within the margin the index grows at: a load's estimate has a margin of its
    /// own, and the table's size is most of what filling it costs).
    pub(super) fn make_room(&self, state: &mut State, more: u64) -> Result<()> {
        let (geometry, level) = state.index.geometry();
        let held = state.index.live_slots() + more;
        let target = (level..=geometry.max_level)
            .find(|&l| geometry.capacity(l) >= held)
            .unwrap_or(geometry.max_level);
        if target == level || state.index.growing() {
            return Ok(());
        }
        self.grow_to(state, target, false)
    }

    /// Grows the id index to level `target`. Its entries of a generation are all stored at one
    /// size (see `index/`), so the active generation is sealed first, unless it holds nothing
    /// yet: then its tag simply starts again at the new size. With `may_defer`, a seal that
    /// would write a large buffer under the lock is put off (see [`Ledger::ready_to_seal`]); a
    /// load making room cannot wait.
    fn grow_to(&self, state: &mut State, target: u8, may_defer: bool) -> Result<()> {
        let Some(active) = state.generations.last() else {
            return Ok(());
        };
        if active.meta.ids > 0 || !state.pending.is_empty() || state.in_flight.is_some() {
            if may_defer && !self.ready_to_seal(state)? {
                return Ok(());
            }
            return self.seal_active(state, Some(target));
        }
        let tag = IdIndex::tag(active.meta.id);
        self.grow_table(state, target);
        // No id was recorded into it, so it has no slot to keep (a bulk load given up may have
        // left fingerprints: they go).
        state.index.forget(tag);
        state.index.start(tag);
        Ok(())
    }

    /// Doubles the id index up to level `target` (the active generation sealed or empty).
    fn grow_table(&self, state: &mut State, target: u8) {
        // A background store of the index copies a table of the old size: it gives up.
        state.index_epoch += 1;
        let started = std::time::Instant::now();
        while state.index.geometry().1 < target {
            // A doubling right after another: the other's buckets are split first (`grow` does).
            state.index.grow();
        }
        self.grow_in_background(state);
        let (geometry, level) = state.index.geometry();
        crate::metrics::events::IdIndexGrown {
            level,
            bytes: state.index.table_bytes(),
            capacity_ids: geometry.capacity(level),
            ids: state.index.live_slots(),
            elapsed_ms: started.elapsed().as_millis() as u64,
        }
        .emit();
    }

    /// Seals the active generation (growing the id index to level `grow` first, if given),
    /// starts the next, forgets the oldest generations while the rest exceed the budget, and
    /// stores the index.
    pub(super) fn seal_active(&self, state: &mut State, grow: Option<u8>) -> Result<()> {
        state.seal_requested = false;
        let started = std::time::Instant::now();
        // The sealed generation's buffered ids go in before it is sealed.
        self.commit_pending(state)?;
        let committed = started.elapsed();
        let Some(active) = state.generations.last() else {
            return Ok(());
        };
        let mut sealed = active.meta.clone();
        sealed.sealed = true;
        let mut batch = WriteBatch::default();
        batch.put_cf(
            &self.cf(CF_META)?,
            generation_meta_key(sealed.id),
            to_json(&sealed),
        );
        self.db
            .write_opt(batch, &self.write_options())
            .map_err(rocks(Doing::Write))?;
        let sealed_name = match state.generations.last_mut() {
            Some(last) => {
                last.meta = sealed;
                last.name.clone()
            }
            None => return Ok(()),
        };
        if let Some(target) = grow {
            self.grow_table(state, target);
        }
        self.start_generation(state)?;
        // Flush without waiting (all column families together, so NoWal stays a consistent
        // prefix): the sealed generation leaves the memtables and the WAL, which would otherwise
        // hold several small generations' worth of disk. Then let RocksDB compact it into one
        // sorted run in the background, without filters (see `tuning::generation_options`).
        self.flush_all(state, false)?;
        self.compact_when_sealed(&sealed_name)?;
        let flushed = started.elapsed();
        self.age(state)?;
        let aged = started.elapsed();
        // Everything is committed and the new generation is empty: store the index, so that a
        // crash from here on reads only the generation now active (see `index_file.rs`).
        self.store_index_after_seal(state);
        crate::metrics::events::GenerationSealed {
            generation: &sealed_name,
            commit_ms: committed.as_millis() as u64,
            flush_ms: (flushed - committed).as_millis() as u64,
            age_ms: (aged - flushed).as_millis() as u64,
            elapsed_ms: started.elapsed().as_millis() as u64,
        }
        .emit();
        Ok(())
    }

    /// A sealed generation takes no more writes: let RocksDB compact its files into one sorted
    /// run, in the background.
    pub(super) fn compact_when_sealed(&self, name: &str) -> Result<()> {
        let cf = self.cf(name)?;
        self.db
            .set_options_cf(
                &cf,
                &[
                    ("level0_file_num_compaction_trigger", "1"),
                    ("disable_auto_compactions", "false"),
                ],
            )
            .map_err(rocks(Doing::Write))
    }

    /// Drops the oldest sealed generations while the live ones exceed the budget.
    pub(super) fn age(&self, state: &mut State) -> Result<()> {
        let mut sizes = Vec::with_capacity(state.generations.len());
        for generation in &state.generations {
            sizes.push(self.generation_bytes(state, generation)?);
        }
        // The WAL backing the memtables takes disk too: keep room for it, up to a generation.
        let wal_bytes = ((effective_write_buffer_bytes(&self.options)
            * usize::try_from(self.options.max_write_buffers.max(1)).unwrap_or(1))
            as u64)
            .min(self.options.generation_target_bytes());
        let mut total: u64 = sizes.iter().sum::<u64>() + wal_bytes;
        let mut dropped = 0;
        let too_many = |dropped: usize| state.generations.len() - dropped > MAX_LIVE_GENERATIONS;
        while (total > self.options.budget_bytes || too_many(dropped))
            && dropped + 1 < state.generations.len()
        {
            total -= sizes[dropped];
            dropped += 1;
        }
        let oldest: Vec<usize> = (0..dropped).collect();
        for generation in &state.generations[..dropped] {
            for (p, span) in &generation.meta.partitions {
                let f = state.budget_floor.entry(*p).or_insert(span.last_seen_ms);
                *f = (*f).max(span.last_seen_ms);
            }
        }
        self.drop_generations(state, &oldest)
    }

    /// Drops the sealed generations at `positions` (in `state.generations`, ascending) whole:
    /// their metadata, then their column families and their slots in the id index. The window
    /// floor of each partition they held moves up to their newest id.
    pub(super) fn drop_generations(&self, state: &mut State, positions: &[usize]) -> Result<()> {
        let mut gone = Vec::with_capacity(positions.len());
        for &position in positions.iter().rev() {
            gone.push(state.generations.remove(position));
        }
        gone.reverse();
        for generation in gone {
            for (p, span) in &generation.meta.partitions {
                let f = state.forgotten.entry(*p).or_insert(span.last_seen_ms);
                *f = (*f).max(span.last_seen_ms);
            }
            // Metadata first: a crash between the two leaves an undescribed column family,
            // which the next open drops.
            let meta = self.cf(CF_META)?;
            let mut batch = WriteBatch::default();
            batch.delete_cf(&meta, generation_meta_key(generation.meta.id));
            batch.put_cf(&meta, META_FORGOTTEN, to_json(&state.forgotten));
            drop(meta);
            self.db
                .write_opt(batch, &self.write_options())
                .map_err(rocks(Doing::Write))?;
            self.db
                .drop_cf(&generation.name)
                .map_err(rocks(Doing::Generation("drop", &generation.name)))?;
            state.index.forget(IdIndex::tag(generation.meta.id));
        }
        if !positions.is_empty() {
            self.prune_marks(state)?;
        }
        Ok(())
    }
}

impl State {
    /// See [`Ledger::window`].
    pub(super) fn window(&self, partition: Partition, now_ms: i64) -> Option<Duration> {
        let oldest = self
            .generations
            .iter()
            .filter_map(|g| g.meta.partitions.get(&partition))
            .map(|s| s.first_seen_ms)
            .min()?;
        let start = match self.forgotten.get(&partition) {
            Some(&f) => oldest.max(f),
            None => oldest,
        };
        Some(window_from(start, now_ms))
    }

    /// See [`Ledger::window_overall`].
    pub(super) fn window_overall(&self, now_ms: i64) -> Option<Duration> {
        let oldest = self
            .generations
            .iter()
            .flat_map(|g| g.meta.partitions.values())
            .map(|s| s.first_seen_ms)
            .min()?;
        let start = self.forgotten.values().copied().fold(oldest, i64::max);
        Some(window_from(start, now_ms))
    }
}

fn window_from(start_ms: i64, now_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(now_ms.saturating_sub(start_ms)).unwrap_or(0))
}

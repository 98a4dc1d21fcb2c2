//! The id index: an in-memory table holding a 16-bit fingerprint of every id the ledger holds,
//! tagged with the id's generation; it grows with the ids it holds.
//!
//! Almost every id a worker checks is new. Without the index, telling that costs one RocksDB
//! probe per live generation (a filter check each, plus the lookup machinery around it); with it,
//! it costs one hash and two cache lines. Only ids whose fingerprint is in the table (duplicates,
//! plus a few in 10,000 new ids) go to RocksDB, and only to the generations the table names.
//!
//! # Layout
//! The table is an array of 64-byte buckets (one cache line each). A bucket holds 21 slots of 3
//! bytes (`[tag][fingerprint lo][fingerprint hi]`, all zero = empty) and a flags byte. An id hashes
//! (XXH3-128 with a per-process random seed, so clients cannot aim ids at one bucket) to two
//! buckets, each with its own fingerprint (`place.rs`); it is stored in the emptier of the two
//! ("two choices", which keeps buckets evenly filled up to ~90% load). A lookup reads both buckets.
//!
//! # Growing
//! The table starts small (level 0: at most 1/64 of its full size, which is sized from the disk
//! budget) and doubles, in place, when the ids it holds near its capacity: each bucket splits into
//! two, each entry going where the next bit of its stored fingerprint says, a bucket at a time
//! while the index is in use (`grow.rs`). Memory, the index file and the times to store and load
//! it follow the ids held, not the budget. Every entry of a generation is stored at one level (the
//! table grows only between generations: the ledger seals the active generation first), so the
//! index knows, per tag, how many fingerprint bits the bucket has taken over since; a lookup
//! compares all of them.
//!
//! # Forgetting
//! The tag is the generation id modulo 256. Dropping a generation only marks its tag dead: its
//! slots read as free from then on and are reused by inserts, so forgetting costs nothing per id.
//! Before a tag is reused by a new generation (256 generations later), any slot still holding it
//! is cleared by one sweep of the table.
//!
//! # When the table is full
//! If both buckets of an id are full, the id is not stored and its first bucket is marked
//! *overflowed*: from then on every id hashing to it is answered "unknown", and the ledger looks
//! it up in RocksDB in every generation. Answers stay exact; only speed suffers. The table grows
//! well before that, and is sized at full capacity from the disk budget so that this does not
//! happen in practice (see [`IdIndex::capacity_for_budget`]); the overflowed buckets are counted
//! in the ledger's stats. A bucket that splits passes its flag to both halves.
//!
//! The table is stored when the ledger closes and after every seal, and checkpoints carry it
//! (`index_file.rs`); opening loads it, and reads from disk only the generations the stored table
//! cannot vouch for.

mod grow;
mod insert;
mod place;
mod region;
mod stored;
#[cfg(test)]
mod tests;

pub(crate) use place::{BulkPlace, Geometry, Place, Placer};
pub(crate) use stored::Header;

use grow::Splitting;
use place::{fingerprint, Choice};
use region::Region;

use crate::identity::LedgerKey;

const BUCKET_BYTES: usize = 64;
const SLOT_BYTES: usize = 3;
const SLOTS: usize = 21;
const FLAGS_BYTE: usize = 63;
const OVERFLOW: u8 = 1;
/// The share of slots the table is sized to fill.
const TARGET_LOAD: f64 = 0.9;
/// The share of the current level's capacity at which the table grows (at the next seal).
const GROW_AT: f64 = 0.8;
/// The share past which a growth due waits for nothing: buckets start to overflow not far above
/// it, and an overflowed bucket stays so after the growth.
const GROW_NOW_AT: f64 = 0.85;
/// The share at which the next level's memory starts to be made resident, in the background.
const PREPARE_AT: f64 = 0.5;
/// Places whose buckets are prefetched ahead of the one being probed or inserted.
const PREFETCH_AHEAD: usize = 8;
/// The fewest bytes an id takes on disk (16 key bytes less the prefix shared with its neighbour,
/// plus its value and entry overhead): sizing the table by it makes the budget run out first.
const MIN_DISK_BYTES_PER_ID: u64 = 16;
/// Tags per table: generation ids modulo this.
const TAGS: usize = 256;
/// A tag's entry in [`IdIndex::gap`] when it is dead: the fingerprint it selects never matches.
const DEAD: u8 = 15;

/// The index's answer for one id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Not held: no slot has its fingerprint.
    Absent,
    /// Perhaps held, in the generations with these tags (`len` of them).
    Maybe { tags: [u8; 4], len: u8 },
    /// The index cannot tell (an overflowed bucket, or more than four candidate slots).
    Unknown,
}

/// See the module documentation.
pub(crate) struct IdIndex {
    region: Region,
    geometry: Geometry,
    /// The current level: the table is `geometry.buckets(level)` buckets.
    level: u8,
    seed: u64,
    live: [bool; TAGS],
    /// The level each tag's entries were stored at.
    level_of: [u8; TAGS],
    /// Per tag, doublings since its entries were stored ([`DEAD`] for a dead tag): which
    /// fingerprint of an id a slot with that tag is compared with.
    gap: [u8; TAGS],
    /// Slots holding each tag, dead or alive.
    slots_by_tag: [u64; TAGS],
    overflowed: u64,
    /// A doubling under way (`grow.rs`).
    splitting: Option<Splitting>,
    /// False for an index that was not built: every probe is [`Probe::Unknown`].
    knows: bool,
}

impl IdIndex {
    /// Ids the table should be sized for, at full size, under a disk budget.
    pub(crate) fn capacity_for_budget(budget_bytes: u64) -> u64 {
        (budget_bytes / MIN_DISK_BYTES_PER_ID).max(1)
    }

    /// Bytes the table takes at full size for `capacity` ids.
    pub(crate) fn bytes_for_capacity(capacity: u64) -> u64 {
        let g = Geometry::for_capacity(capacity);
        g.bytes(g.max_level) as u64
    }

    /// An empty table of `geometry` at `level`, its memory made resident at once: touched lazily
    /// instead, the first inserts each paid a page fault (the pipeline bench ran 14% slower on a
    /// fresh 3.4 GiB table), and random probes of a large table miss the TLB on small pages.
    pub(crate) fn new(geometry: Geometry, level: u8, seed: u64) -> IdIndex {
        let mut index = Self::allocate(geometry, level, seed);
        let len = index.table_len();
        index.region.populate(0, len);
        index
    }

    /// The table, its memory left to whoever fills it next (a stored table being read in touches
    /// every page anyway: a separate pass first cost a second at 1B ids).
    fn allocate(geometry: Geometry, level: u8, seed: u64) -> IdIndex {
        let level = level.min(geometry.max_level);
        IdIndex {
            region: Region::map(geometry.bytes(geometry.max_level)),
            geometry,
            level,
            seed,
            live: [false; TAGS],
            level_of: [level; TAGS],
            gap: [DEAD; TAGS],
            slots_by_tag: [0; TAGS],
            overflowed: 0,
            splitting: None,
            knows: true,
        }
    }

    /// A minimal index that answers every probe "unknown": for a ledger opened without building
    /// its index.
    pub(crate) fn unknowing() -> IdIndex {
        IdIndex {
            knows: false,
            ..IdIndex::allocate(
                Geometry {
                    base: 2,
                    max_level: 0,
                },
                0,
                0,
            )
        }
    }

    /// The tag of generation `id`.
    pub(crate) fn tag(generation_id: u64) -> u8 {
        (generation_id % TAGS as u64) as u8
    }

    /// Buckets of the table now.
    fn buckets(&self) -> usize {
        self.geometry.buckets(self.level)
    }

    fn table_len(&self) -> usize {
        self.buckets() * BUCKET_BYTES
    }

    /// Bytes of the table now.
    pub(crate) fn table_bytes(&self) -> u64 {
        self.table_len() as u64
    }

    /// The table's sizes, and its level among them.
    pub(crate) fn geometry(&self) -> (Geometry, u8) {
        (self.geometry, self.level)
    }

    /// Buckets marked overflowed.
    pub(crate) fn overflowed_buckets(&self) -> u64 {
        self.overflowed
    }

    /// Live slots (ids stored, in live generations).
    pub(crate) fn live_slots(&self) -> u64 {
        (0..TAGS)
            .filter(|&t| self.live[t])
            .map(|t| self.slots_by_tag[t])
            .sum()
    }

    /// Where `key` lives at the current level.
    pub(crate) fn place(&self, key: &LedgerKey) -> Place {
        self.placer().place(key)
    }

    /// What computing places at the current level takes, for other threads.
    pub(crate) fn placer(&self) -> Placer {
        Placer::new(self.seed, self.geometry, self.level)
    }

    /// Before the `i`-th of `places` is probed or inserted, prefetches the buckets of the one
    /// [`PREFETCH_AHEAD`] places later (and, at the first, of those up to it): a batch's probes
    /// and inserts overlap their cache misses this way.
    pub(crate) fn prefetch_ahead(&self, places: &[Place], i: usize) {
        if i == 0 {
            places
                .iter()
                .take(PREFETCH_AHEAD)
                .for_each(|p| self.prefetch(p));
        }
        if let Some(ahead) = places.get(i + PREFETCH_AHEAD) {
            self.prefetch(ahead);
        }
    }

    /// [`IdIndex::prefetch_ahead`] for a bulk load: only the first bucket of each place, the one
    /// [`IdIndex::insert_bulk`] reads unless it is full, and further ahead, since an insert does
    /// less work than a probe to cover the memory's latency with.
    pub(crate) fn prefetch_ahead_for_bulk(&self, places: &[Place], i: usize) {
        const AHEAD: usize = 2 * PREFETCH_AHEAD;
        if i == 0 {
            places
                .iter()
                .take(AHEAD)
                .for_each(|p| self.prefetch_bucket(p.first));
        }
        if let Some(ahead) = places.get(i + AHEAD) {
            self.prefetch_bucket(ahead.first);
        }
    }

    /// Asks the CPU to start loading the buckets of `place` (lookups of a batch overlap their
    /// cache misses this way).
    pub(crate) fn prefetch(&self, place: &Place) {
        self.prefetch_bucket(place.first);
        self.prefetch_bucket(place.second);
    }

    fn prefetch_bucket(&self, b: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let line = self.region.bytes(self.table_len())[b * BUCKET_BYTES..].as_ptr();
            // SAFETY: a prefetch is a hint; it never faults, and `line` points into the table.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.cast::<i8>()) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = b;
    }

    fn bucket(&self, b: usize) -> &[u8] {
        &self.region.bytes(self.table_len())[b * BUCKET_BYTES..(b + 1) * BUCKET_BYTES]
    }

    fn bucket_mut(&mut self, b: usize) -> &mut [u8] {
        let len = self.table_len();
        &mut self.region.bytes_mut(len)[b * BUCKET_BYTES..(b + 1) * BUCKET_BYTES]
    }

    fn slot(bucket: &[u8], i: usize) -> (u8, u16) {
        let s = &bucket[i * SLOT_BYTES..i * SLOT_BYTES + SLOT_BYTES];
        (s[0], u16::from_le_bytes([s[1], s[2]]))
    }

    /// The fingerprints a slot is compared with, by its tag's [`IdIndex::gap`]: the id's
    /// fingerprint at each level it may have been stored at; [`DEAD`] selects a value no stored
    /// fingerprint has.
    fn wanted(&self, choice: Choice) -> [u32; 16] {
        let mut wanted = [u32::MAX; 16];
        for gap in 0..=self.level {
            wanted[usize::from(gap)] = u32::from(fingerprint(choice, self.level - gap));
        }
        wanted
    }

    /// The generations `key` may be held in.
    pub(crate) fn probe(&self, place: &Place) -> Probe {
        if !self.knows {
            return Probe::Unknown;
        }
        let mut tags = [0u8; 4];
        let mut len = 0usize;
        for choice in place.choices {
            let bucket = self.bucket(self.bucket_of(choice));
            if bucket[FLAGS_BYTE] & OVERFLOW != 0 {
                return Probe::Unknown;
            }
            let wanted = self.wanted(choice);
            for i in 0..SLOTS {
                let (tag, f) = Self::slot(bucket, i);
                if u32::from(f) == wanted[usize::from(self.gap[usize::from(tag)])] {
                    if len == tags.len() {
                        return Probe::Unknown;
                    }
                    tags[len] = tag;
                    len += 1;
                }
            }
        }
        if len == 0 {
            Probe::Absent
        } else {
            Probe::Maybe {
                tags,
                len: len as u8,
            }
        }
    }

    /// Makes `tag` live for a new generation, stored at the current level, first clearing any slot
    /// a dead generation with the same tag left behind.
    pub(crate) fn start(&mut self, tag: u8) {
        let t = usize::from(tag);
        if self.live[t] {
            return;
        }
        if self.slots_by_tag[t] > 0 {
            for b in 0..self.buckets() {
                let bucket = self.bucket_mut(b);
                for i in 0..SLOTS {
                    if Self::slot(bucket, i).0 == tag {
                        bucket[i * SLOT_BYTES..i * SLOT_BYTES + SLOT_BYTES].fill(0);
                    }
                }
            }
            self.slots_by_tag[t] = 0;
        }
        self.level_of[t] = self.level;
        self.revive(tag);
    }

    /// Forgets every id of `tag`'s generation at once: its slots become free.
    pub(crate) fn forget(&mut self, tag: u8) {
        let t = usize::from(tag);
        self.live[t] = false;
        self.gap[t] = DEAD;
    }

    /// Makes `tag` live again without clearing its slots: for a generation whose ids a stored
    /// table holds.
    pub(crate) fn revive(&mut self, tag: u8) {
        let t = usize::from(tag);
        self.live[t] = true;
        self.gap[t] = self.level - self.level_of[t];
    }

    /// The level the table should be at to hold `more` ids beside those it holds within
    /// [`GROW_AT`] of its capacity (its full size's if none is large enough).
    pub(crate) fn level_for(&self, more: u64) -> u8 {
        let held = (self.live_slots() + more) as f64;
        (self.level..=self.geometry.max_level)
            .find(|&l| held <= GROW_AT * self.geometry.capacity(l) as f64)
            .unwrap_or(self.geometry.max_level)
    }

    /// Whether the table should grow before `more` ids are stored: it holds (with them) more than
    /// [`GROW_AT`] of what the current level is sized for, and it is not at full size. Past
    /// [`PREPARE_AT`], the next level's memory is made resident in the background meanwhile.
    pub(crate) fn needs_growth(&mut self, more: u64) -> bool {
        if !self.knows || self.level >= self.geometry.max_level || self.growing() {
            return false;
        }
        let held = (self.live_slots() + more) as f64;
        let capacity = self.geometry.capacity(self.level) as f64;
        if held > PREPARE_AT * capacity {
            let (from, to) = (self.table_len(), self.geometry.bytes(self.level + 1));
            self.region.populate_in_background(from, to);
        }
        held > GROW_AT * capacity
    }

    /// Whether the table nears its next growth: `ahead` more ids would take it past its growth
    /// mark ([`GROW_AT`]), it holds more than [`PREPARE_AT`] of its current level's capacity,
    /// and it is not at full size or growing.
    pub(crate) fn growth_near(&self, ahead: u64) -> bool {
        let held = self.live_slots() as f64;
        let capacity = self.geometry.capacity(self.level) as f64;
        self.knows
            && self.level < self.geometry.max_level
            && !self.growing()
            && held > PREPARE_AT * capacity
            && held + ahead as f64 > GROW_AT * capacity
    }

    /// Whether a growth due can wait a little (for a seal to find a small id buffer): the table
    /// holds at most [`GROW_NOW_AT`] of its current level's capacity.
    pub(crate) fn growth_can_wait(&self) -> bool {
        (self.live_slots() as f64) <= GROW_NOW_AT * self.geometry.capacity(self.level) as f64
    }
}

//! The id index: an in-memory table holding a 16-bit fingerprint of every id the ledger holds,
//! tagged with the id's generation.
//!
//! Almost every id a worker checks is new. Without the index, telling that costs one RocksDB
//! probe per live generation (a filter check each, plus the lookup machinery around it); with it,
//! it costs one hash and one cache line. Only ids whose fingerprint is in the table (duplicates,
//! plus about 6 in 10,000 new ids) go to RocksDB, and only to the generations the table names.
//!
//! # Layout
//! The table is an array of 64-byte buckets (one cache line each). A bucket holds 21 slots of 3
//! bytes (`[tag][fingerprint lo][fingerprint hi]`, all zero = empty) and a flags byte. An id hashes
//! (XXH3-128 with a per-process random seed, so clients cannot aim ids at one bucket) to two
//! buckets and a fingerprint; it is stored in the emptier of the two ("two choices", which keeps
//! buckets evenly filled up to ~90% load). A lookup reads both buckets.
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
//! it up in RocksDB in every generation. Answers stay exact; only speed suffers. The table is
//! sized from the disk budget so that this does not happen in practice (see
//! [`IdIndex::capacity_for_budget`]); the overflowed buckets are counted in the ledger's stats.
//!
//! The table is stored when the ledger closes and after every seal, and checkpoints carry it
//! (`index_file.rs`); opening loads it, and reads from disk only the generations the stored table
//! cannot vouch for.

use xxhash_rust::xxh3::xxh3_128_with_seed;

use crate::identity::LedgerKey;

const BUCKET_BYTES: usize = 64;
/// Where the table starts in its allocation: a page boundary (a multiple of [`BUCKET_BYTES`]).
const TABLE_ALIGN: usize = 4096;
const SLOT_BYTES: usize = 3;
const SLOTS: usize = 21;
const FLAGS_BYTE: usize = 63;
const OVERFLOW: u8 = 1;
/// The share of slots the table is sized to fill.
const TARGET_LOAD: f64 = 0.9;
/// The fewest bytes an id takes on disk (16 key bytes less the prefix shared with its neighbour,
/// plus its value and entry overhead): sizing the table by it makes the budget run out first.
const MIN_DISK_BYTES_PER_ID: u64 = 16;
/// Tags per table: generation ids modulo this.
const TAGS: usize = 256;

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

/// Where an id lives in the table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    first: usize,
    second: usize,
    fingerprint: u16,
}

/// See the module documentation.
pub(crate) struct IdIndex {
    /// `buckets × 64` bytes starting at `offset` (aligned to 64).
    bytes: Vec<u8>,
    offset: usize,
    buckets: usize,
    seed: u64,
    live: [bool; TAGS],
    /// Slots holding each tag, dead or alive.
    slots_by_tag: [u64; TAGS],
    overflowed: u64,
    /// False for an index that was not built: every probe is [`Probe::Unknown`].
    knows: bool,
}

impl IdIndex {
    /// Ids the table should be sized for under a disk budget.
    pub(crate) fn capacity_for_budget(budget_bytes: u64) -> u64 {
        (budget_bytes / MIN_DISK_BYTES_PER_ID).max(1)
    }

    /// Bytes a table for `capacity` ids takes.
    pub(crate) fn bytes_for_capacity(capacity: u64) -> u64 {
        Self::buckets_for(capacity) as u64 * BUCKET_BYTES as u64
    }

    fn buckets_for(capacity: u64) -> usize {
        let buckets = (capacity as f64 / (SLOTS as f64 * TARGET_LOAD)).ceil() as usize;
        buckets.max(2)
    }

    /// An empty table for about `capacity` ids. Its memory is made resident at once, in huge
    /// pages where the OS allows: touched lazily instead, the first few million inserts each paid
    /// a page fault (the pipeline bench ran 14% slower on a fresh 3.4 GiB index), and random
    /// probes of a table this size miss the TLB on small pages.
    pub(crate) fn new(capacity: u64, seed: u64) -> IdIndex {
        Self::allocate(capacity, seed, true)
    }

    /// The table, made resident now (`touch`) or left to whoever fills it next (a stored table
    /// being read in touches every page anyway: a separate pass first cost a second at 1B ids).
    fn allocate(capacity: u64, seed: u64, touch: bool) -> IdIndex {
        let buckets = Self::buckets_for(capacity);
        // Room to start the table at a page boundary: a stored table is read straight into it
        // with `O_DIRECT`, which wants aligned memory.
        let mut bytes = vec![0u8; buckets * BUCKET_BYTES + TABLE_ALIGN];
        advise_huge_pages(&mut bytes);
        if touch {
            // One write per 4 KiB page faults the table in now. `black_box` keeps the compiler
            // from dropping the writes as redundant (the memory is known to be zero).
            let touched = std::hint::black_box(&mut bytes[..]);
            for i in (0..touched.len()).step_by(4096) {
                touched[i] = 0;
            }
        }
        let offset = bytes.as_ptr().align_offset(TABLE_ALIGN).min(TABLE_ALIGN);
        IdIndex {
            bytes,
            offset,
            buckets,
            seed,
            live: [false; TAGS],
            slots_by_tag: [0; TAGS],
            overflowed: 0,
            knows: true,
        }
    }

    /// A minimal index that answers every probe "unknown": for a ledger opened without building
    /// its index.
    pub(crate) fn unknowing() -> IdIndex {
        IdIndex {
            knows: false,
            ..IdIndex::new(0, 0)
        }
    }

    /// The tag of generation `id`.
    pub(crate) fn tag(generation_id: u64) -> u8 {
        (generation_id % TAGS as u64) as u8
    }

    /// Bytes of the table.
    pub(crate) fn table_bytes(&self) -> u64 {
        (self.buckets * BUCKET_BYTES) as u64
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

    /// Where `key` lives.
    pub(crate) fn place(&self, key: &LedgerKey) -> Place {
        self.placer().place(key)
    }

    /// What computing places takes, for other threads.
    pub(crate) fn placer(&self) -> Placer {
        Placer {
            seed: self.seed,
            buckets: self.buckets,
        }
    }
}

/// Computes where keys live in one index (its seed and size), apart from the table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placer {
    seed: u64,
    buckets: usize,
}

impl Placer {
    /// Where `key` lives.
    pub(crate) fn place(&self, key: &LedgerKey) -> Place {
        let h = xxh3_128_with_seed(&key.0, self.seed);
        let lo = h as u64;
        let hi = (h >> 64) as u64;
        let n = self.buckets as u128;
        let first = ((u128::from(lo) * n) >> 64) as usize;
        let second = ((u128::from(hi) * n) >> 64) as usize;
        let fingerprint = match (hi & 0xffff) as u16 {
            0 => 1,
            f => f,
        };
        Place {
            first,
            second,
            fingerprint,
        }
    }
}

impl IdIndex {
    /// Asks the CPU to start loading the buckets of `place` (lookups of a batch overlap their
    /// cache misses this way).
    pub(crate) fn prefetch(&self, place: &Place) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            for b in [place.first, place.second] {
                let start = self.offset + b * BUCKET_BYTES;
                let line = self.bytes[start..start + BUCKET_BYTES].as_ptr();
                // SAFETY: a prefetch is a hint; it never faults, and `line` points into `bytes`.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(line.cast::<i8>()) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = place;
    }

    fn bucket(&self, b: usize) -> &[u8] {
        let start = self.offset + b * BUCKET_BYTES;
        &self.bytes[start..start + BUCKET_BYTES]
    }

    fn bucket_mut(&mut self, b: usize) -> &mut [u8] {
        let start = self.offset + b * BUCKET_BYTES;
        &mut self.bytes[start..start + BUCKET_BYTES]
    }

    fn slot(bucket: &[u8], i: usize) -> (u8, u16) {
        let s = &bucket[i * SLOT_BYTES..i * SLOT_BYTES + SLOT_BYTES];
        (s[0], u16::from_le_bytes([s[1], s[2]]))
    }

    /// The generations `key` may be held in.
    pub(crate) fn probe(&self, place: &Place) -> Probe {
        if !self.knows {
            return Probe::Unknown;
        }
        let mut tags = [0u8; 4];
        let mut len = 0usize;
        let buckets = if place.first == place.second {
            &[place.first][..]
        } else {
            &[place.first, place.second][..]
        };
        for &b in buckets {
            let bucket = self.bucket(b);
            if bucket[FLAGS_BYTE] & OVERFLOW != 0 {
                return Probe::Unknown;
            }
            for i in 0..SLOTS {
                let (tag, fingerprint) = Self::slot(bucket, i);
                if fingerprint == place.fingerprint && self.live[usize::from(tag)] {
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

    fn live_in(&self, bucket: &[u8]) -> usize {
        (0..SLOTS)
            .filter(|&i| {
                let (tag, fingerprint) = Self::slot(bucket, i);
                fingerprint != 0 && self.live[usize::from(tag)]
            })
            .count()
    }

    /// Stores `place`'s fingerprint with `tag` (which must be live). Returns false when both
    /// buckets were full: the first one is then marked overflowed.
    pub(crate) fn insert(&mut self, place: &Place, tag: u8) -> bool {
        debug_assert!(self.live[usize::from(tag)], "insert into a dead tag");
        let first_live = self.live_in(self.bucket(place.first));
        let second_live = self.live_in(self.bucket(place.second));
        let target = if second_live < first_live {
            place.second
        } else {
            place.first
        };
        if first_live.min(second_live) == SLOTS {
            let bucket = self.bucket_mut(place.first);
            if bucket[FLAGS_BYTE] & OVERFLOW == 0 {
                bucket[FLAGS_BYTE] |= OVERFLOW;
                self.overflowed += 1;
            }
            return false;
        }
        let live = self.live;
        let bucket_start = self.offset + target * BUCKET_BYTES;
        let bucket = &mut self.bytes[bucket_start..bucket_start + BUCKET_BYTES];
        let free = (0..SLOTS).find(|&i| {
            let (old_tag, fingerprint) = Self::slot(bucket, i);
            fingerprint == 0 || !live[usize::from(old_tag)]
        });
        let Some(i) = free else {
            return false;
        };
        let (old_tag, old_fingerprint) = Self::slot(bucket, i);
        let [lo, hi] = place.fingerprint.to_le_bytes();
        bucket[i * SLOT_BYTES..i * SLOT_BYTES + SLOT_BYTES].copy_from_slice(&[tag, lo, hi]);
        if old_fingerprint != 0 {
            self.slots_by_tag[usize::from(old_tag)] -= 1;
        }
        self.slots_by_tag[usize::from(tag)] += 1;
        true
    }

    /// Makes `tag` live for a new generation, first clearing any slot a dead generation with the
    /// same tag left behind.
    pub(crate) fn start(&mut self, tag: u8) {
        let t = usize::from(tag);
        if self.live[t] {
            return;
        }
        if self.slots_by_tag[t] > 0 {
            for b in 0..self.buckets {
                let bucket = self.bucket_mut(b);
                for i in 0..SLOTS {
                    if Self::slot(bucket, i).0 == tag {
                        bucket[i * SLOT_BYTES..i * SLOT_BYTES + SLOT_BYTES].fill(0);
                    }
                }
            }
            self.slots_by_tag[t] = 0;
        }
        self.live[t] = true;
    }

    /// Forgets every id of `tag`'s generation at once: its slots become free.
    pub(crate) fn forget(&mut self, tag: u8) {
        self.live[usize::from(tag)] = false;
    }
}

/// The parts of an index that its file stores beside the table (see `index_file.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) seed: u64,
    pub(crate) buckets: u64,
    pub(crate) overflowed: u64,
    pub(crate) slots_by_tag: Vec<u64>,
}

impl IdIndex {
    /// Whether the index holds anything (false for one opened without `build_index`).
    pub(crate) fn knows(&self) -> bool {
        self.knows
    }

    /// What the file stores beside the table.
    pub(crate) fn header(&self) -> Header {
        Header {
            seed: self.seed,
            buckets: self.buckets as u64,
            overflowed: self.overflowed,
            slots_by_tag: self.slots_by_tag.to_vec(),
        }
    }

    /// The table's bytes.
    pub(crate) fn table(&self) -> &[u8] {
        &self.bytes[self.offset..self.offset + self.buckets * BUCKET_BYTES]
    }

    /// An index of `header`'s size and seed whose table `fill` writes, with every tag dead
    /// (the caller makes the generations it trusts live again with [`IdIndex::revive`]). `None`
    /// if `header` does not describe a table of `buckets` buckets.
    pub(crate) fn from_parts(
        header: &Header,
        buckets: usize,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<Option<IdIndex>> {
        if header.buckets != buckets as u64 || header.slots_by_tag.len() != TAGS {
            return Ok(None);
        }
        let mut index = IdIndex::allocate(Self::capacity_of_buckets(buckets), header.seed, false);
        debug_assert_eq!(index.buckets, buckets);
        let (start, len) = (index.offset, index.buckets * BUCKET_BYTES);
        fill(&mut index.bytes[start..start + len])?;
        index.overflowed = header.overflowed;
        index.slots_by_tag.copy_from_slice(&header.slots_by_tag);
        Ok(Some(index))
    }

    /// Buckets of the table for `capacity` ids (the size a stored table must have to be used).
    pub(crate) fn buckets_for_capacity(capacity: u64) -> usize {
        Self::buckets_for(capacity)
    }

    /// A capacity whose table has exactly `buckets` buckets.
    fn capacity_of_buckets(buckets: usize) -> u64 {
        ((buckets as f64 - 0.5) * SLOTS as f64 * TARGET_LOAD).floor().max(1.0) as u64
    }

    /// Makes `tag` live again without clearing its slots: for a generation whose ids a stored
    /// table holds.
    pub(crate) fn revive(&mut self, tag: u8) {
        self.live[usize::from(tag)] = true;
    }
}

/// Asks Linux to back `bytes` with transparent huge pages (when they are enabled in `madvise`
/// mode, the common default, nothing else does).
fn advise_huge_pages(bytes: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        const HUGE_PAGE: usize = 2 << 20;
        // madvise wants a page-aligned start; the allocation starts just past malloc's header.
        let start = bytes.as_ptr().align_offset(PAGE);
        let len = bytes.len().saturating_sub(start) / PAGE * PAGE;
        if len >= HUGE_PAGE {
            let aligned = &mut bytes[start..start + len];
            // SAFETY: the range is `aligned`, inside `bytes`, which this function borrows
            // mutably; MADV_HUGEPAGE changes how the kernel backs the pages, never their contents.
            // An error (THP disabled) is harmless and ignored.
            unsafe {
                libc::madvise(aligned.as_mut_ptr().cast(), aligned.len(), libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn key(n: u64) -> LedgerKey {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&n.to_le_bytes());
        k[8..].copy_from_slice(&(n.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes());
        LedgerKey(k)
    }

    fn maybe_in(probe: Probe, tag: u8) -> bool {
        match probe {
            Probe::Absent => false,
            Probe::Maybe { tags, len } => tags[..usize::from(len)].contains(&tag),
            Probe::Unknown => true,
        }
    }

    #[test]
    fn every_inserted_id_is_found_under_its_tag_and_few_others_are() {
        let mut index = IdIndex::new(100_000, 7);
        index.start(3);
        for n in 0..90_000 {
            assert!(index.insert(&index.place(&key(n)), 3), "insert {n}");
        }
        for n in 0..90_000 {
            assert!(maybe_in(index.probe(&index.place(&key(n))), 3), "lost {n}");
        }
        let false_positives = (1_000_000..1_100_000)
            .filter(|&n| index.probe(&index.place(&key(n))) != Probe::Absent)
            .count();
        // 42 slots of 16-bit fingerprints at 90% load: ~0.06% expected.
        assert!(false_positives < 200, "{false_positives} false positives in 100000");
        assert_eq!(index.live_slots(), 90_000);
        assert_eq!(index.overflowed_buckets(), 0);
    }

    #[test]
    fn forgetting_a_tag_frees_its_slots_for_reuse() {
        let mut index = IdIndex::new(10_000, 1);
        index.start(0);
        for n in 0..9_000 {
            assert!(index.insert(&index.place(&key(n)), 0));
        }
        index.forget(0);
        assert_eq!(index.probe(&index.place(&key(5))), Probe::Absent);
        index.start(1);
        // The table is as full as it can be: only reuse of the dead slots makes room.
        for n in 10_000..19_000 {
            assert!(index.insert(&index.place(&key(n)), 1), "insert {n}");
        }
        assert_eq!(index.live_slots(), 9_000);
        assert_eq!(index.overflowed_buckets(), 0);
    }

    #[test]
    fn a_reused_tag_does_not_resurrect_old_ids() {
        let mut index = IdIndex::new(1_000, 1);
        index.start(5);
        for n in 0..500 {
            index.insert(&index.place(&key(n)), 5);
        }
        index.forget(5);
        index.start(5);
        let resurrected: HashSet<u64> = (0..500)
            .filter(|&n| index.probe(&index.place(&key(n))) != Probe::Absent)
            .collect();
        assert!(resurrected.is_empty(), "{resurrected:?}");
        assert_eq!(index.live_slots(), 0);
    }

    #[test]
    fn a_full_table_overflows_into_unknown_answers_never_absent_ones() {
        let mut index = IdIndex::new(100, 1);
        index.start(0);
        let mut refused = Vec::new();
        for n in 0..1_000 {
            if !index.insert(&index.place(&key(n)), 0) {
                refused.push(n);
            }
        }
        assert!(!refused.is_empty());
        assert!(index.overflowed_buckets() > 0);
        for n in refused {
            assert_eq!(index.probe(&index.place(&key(n))), Probe::Unknown, "id {n}");
        }
    }
}

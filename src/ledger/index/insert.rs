//! Storing an id's fingerprint: in the emptier of its two buckets, or, for a bulk load, in its
//! first bucket when that has room; a bucket with no room left is marked overflowed.

use super::place::{fingerprint, BulkPlace, Place};
use super::{IdIndex, BUCKET_BYTES, FLAGS_BYTE, OVERFLOW, SLOTS, SLOT_BYTES};

/// What one pass over a bucket found: its live slots, and its first free one.
struct BucketScan {
    live: usize,
    free: Option<usize>,
}

/// What [`empty_slot`] found in a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Empty {
    /// A slot holds the fingerprint with the tag: nothing to store.
    Held,
    /// Slot `i` is empty (its fingerprint is 0), the first such.
    At(usize),
    /// No slot is empty; a slot of a dead generation may still be free (see
    /// [`IdIndex::scan`]).
    None,
}

/// Bit `3 * i` set for each slot `i`: where a slot's tag byte is in a byte mask of the bucket.
const SLOT_STARTS: u64 = {
    let mut m = 0u64;
    let mut i = 0;
    while i < SLOTS {
        m |= 1 << (i * SLOT_BYTES);
        i += 1;
    }
    m
};

/// Whether a bucket holds `held` (a tag and a fingerprint) in any slot, else its first empty
/// slot, read 16 bytes at a time: a byte mask of the bucket's zero bytes, and of the bytes equal
/// to the tag and to each byte of the fingerprint. The same answer as a slot-by-slot reading of
/// the held fingerprint and the first empty slot (the index's tests compare the two).
pub(super) fn empty_slot(bucket: &[u8], held: (u8, u16)) -> Empty {
    let (tag, f) = held;
    let [lo, hi] = f.to_le_bytes();
    let [zeros, tags, los, his] = byte_masks(bucket, [0, tag, lo, hi]);
    if tags & (los >> 1) & (his >> 2) & SLOT_STARTS != 0 {
        return Empty::Held;
    }
    let empty = (zeros >> 1) & (zeros >> 2) & SLOT_STARTS;
    match empty {
        0 => Empty::None,
        e => Empty::At(e.trailing_zeros() as usize / SLOT_BYTES),
    }
}

/// For each of `values`, the mask of the bucket's bytes equal to it (bit `j` for byte `j`).
fn byte_masks(bucket: &[u8], values: [u8; 4]) -> [u64; 4] {
    let bucket: &[u8; BUCKET_BYTES] = bucket.try_into().expect("a bucket is BUCKET_BYTES long");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
        };
        let mut masks = [0u64; 4];
        for (k, chunk) in bucket.chunks_exact(16).enumerate() {
            // SAFETY: SSE2 is part of x86_64; the load reads the 16 bytes of `chunk`, unaligned.
            let v = unsafe { _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>()) };
            for (mask, value) in masks.iter_mut().zip(values) {
                // SAFETY: as above; these work on registers only.
                let eq =
                    unsafe { _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(value as i8))) };
                *mask |= u64::from(eq as u16) << (16 * k);
            }
        }
        masks
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut masks = [0u64; 4];
        for (j, byte) in bucket.iter().enumerate() {
            for (mask, value) in masks.iter_mut().zip(values) {
                *mask |= u64::from(*byte == value) << j;
            }
        }
        masks
    }
}

impl IdIndex {
    /// One bucket as an insert sees it: `None` when a slot holds `held` (a fingerprint and its
    /// tag), else its live slots and its first free one.
    fn scan(&self, b: usize, held: Option<(u8, u16)>) -> Option<BucketScan> {
        let bucket = self.bucket(b);
        let mut scan = BucketScan {
            live: 0,
            free: None,
        };
        for i in 0..SLOTS {
            let (t, f) = Self::slot(bucket, i);
            if held == Some((t, f)) {
                return None;
            }
            if f != 0 && self.live[usize::from(t)] {
                scan.live += 1;
            } else if scan.free.is_none() {
                scan.free = Some(i);
            }
        }
        Some(scan)
    }

    /// Stores `place`'s fingerprint with `tag` (which must be live, and started at the current
    /// level). Returns false when both buckets were full: the first one is then marked overflowed.
    pub(crate) fn insert(&mut self, place: &Place, tag: u8) -> bool {
        self.store(place, tag, false)
    }

    /// [`IdIndex::insert`], except that a bucket already holding the fingerprint with `tag`
    /// takes no second slot: for an id recorded again into the generation that may hold it (a
    /// refresh, a copy past the retention limit).
    pub(crate) fn insert_once(&mut self, place: &Place, tag: u8) -> bool {
        self.store(place, tag, true)
    }

    /// Stores `place`'s fingerprint with `tag` for a bulk load, which inserts in the order of
    /// first buckets: the id goes into its first bucket when that has room, without reading the
    /// second, so the table is walked from one end to the other; only an id whose first bucket is
    /// full reads both and goes to the emptier. Lookups read both buckets either way. A load may
    /// meet an id twice (a changelog that holds an id again after it left an earlier owner's
    /// window, a load that a crash interrupted and that runs again): a bucket that already holds
    /// the fingerprint with `tag` takes no second slot, since the index only ever says "perhaps in
    /// this generation".
    pub(crate) fn insert_bulk(&mut self, place: &Place, tag: u8) -> bool {
        let base = self.geometry.base;
        let buckets = place.choices.map(|c| c.bucket(base, self.level));
        let fingerprints = place.choices.map(|c| fingerprint(c, self.level));
        self.insert_bulk_at(buckets, fingerprints, tag)
    }

    /// [`IdIndex::insert_bulk`] of a place computed at the current level; cheapest when the
    /// places come in the order of their first buckets.
    pub(crate) fn insert_bulk_place(&mut self, place: &BulkPlace, tag: u8) -> bool {
        let buckets = [place.first as usize, place.second as usize];
        self.insert_bulk_at(buckets, place.fingerprints, tag)
    }

    /// A bulk insert of an id whose buckets and fingerprints at the current level are `buckets`
    /// and `fingerprints`: into the first bucket when it has room, else into the emptier.
    fn insert_bulk_at(&mut self, buckets: [usize; 2], fingerprints: [u16; 2], tag: u8) -> bool {
        debug_assert_eq!(
            self.level_of[usize::from(tag)],
            self.level,
            "insert into a tag of another level"
        );
        let first = self.split_for_insert(buckets[0]);
        let f = fingerprints[0];
        // Most first buckets of a load have an empty slot: found without reading slot by slot.
        let found = match empty_slot(self.bucket(first), (tag, f)) {
            Empty::Held => None,
            Empty::At(i) => Some(BucketScan {
                live: 0,
                free: Some(i),
            }),
            Empty::None => self.scan(first, Some((tag, f))),
        };
        match found {
            None => true,
            Some(BucketScan { free: Some(i), .. }) => {
                self.put(first, i, tag, f);
                true
            }
            Some(BucketScan { free: None, .. }) => {
                let second = self.split_for_insert(buckets[1]);
                self.store_in([first, second], fingerprints, tag, true)
            }
        }
    }

    /// Prefetches the bucket a bulk insert of `place` reads first.
    pub(crate) fn prefetch_bulk_place(&self, place: &BulkPlace) {
        self.prefetch_bucket(place.first as usize);
    }

    /// Writes `tag` and `f` into slot `i` of bucket `b`.
    fn put(&mut self, b: usize, i: usize, tag: u8, f: u16) {
        let bucket = self.bucket_mut(b);
        let (old_tag, old_fingerprint) = Self::slot(bucket, i);
        let [lo, hi] = f.to_le_bytes();
        bucket[i * SLOT_BYTES..i * SLOT_BYTES + SLOT_BYTES].copy_from_slice(&[tag, lo, hi]);
        if old_fingerprint != 0 {
            self.slots_by_tag[usize::from(old_tag)] -= 1;
        }
        self.slots_by_tag[usize::from(tag)] += 1;
    }

    fn store(&mut self, place: &Place, tag: u8, once: bool) -> bool {
        debug_assert!(self.live[usize::from(tag)], "insert into a dead tag");
        debug_assert_eq!(
            self.level_of[usize::from(tag)],
            self.level,
            "insert into a tag of another level"
        );
        let [c0, c1] = place.choices;
        let buckets = [self.bucket_for_insert(c0), self.bucket_for_insert(c1)];
        let fingerprints = [fingerprint(c0, self.level), fingerprint(c1, self.level)];
        self.store_in(buckets, fingerprints, tag, once)
    }

    /// Stores an id in the emptier of its two `buckets` (at the current level, split), with the
    /// fingerprint of that bucket.
    fn store_in(
        &mut self,
        buckets: [usize; 2],
        fingerprints: [u16; 2],
        tag: u8,
        once: bool,
    ) -> bool {
        // Only a held fingerprint makes a scan `None`, and only an insert-once looks for one.
        let scan = |i: usize| self.scan(buckets[i], once.then_some((tag, fingerprints[i])));
        let (Some(first), Some(second)) = (scan(0), scan(1)) else {
            return true;
        };
        let (target, free, f) = if second.live < first.live {
            (buckets[1], second.free, fingerprints[1])
        } else {
            (buckets[0], first.free, fingerprints[0])
        };
        let Some(i) = free else {
            // Both buckets are full of live slots.
            let bucket = self.bucket_mut(buckets[0]);
            if bucket[FLAGS_BYTE] & OVERFLOW == 0 {
                bucket[FLAGS_BYTE] |= OVERFLOW;
                self.overflowed += 1;
            }
            return false;
        };
        self.put(target, i, tag, f);
        true
    }
}

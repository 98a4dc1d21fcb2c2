//! Where an id lives in the id index, at each of the table's sizes, and its fingerprint there.
//!
//! The table at level `l` has `base << l` buckets, from level 0 up to `max_level` (its size at
//! full capacity). An id hashes (XXH3-128 with the table's seed) to two 64-bit words; each,
//! multiplied by `base`, gives a number `P` whose bits above bit `64 - l` are the id's bucket at
//! level `l`, and whose next 16 bits are its fingerprint there. So when the table doubles, the
//! bucket gains one bit, the top bit of the fingerprint of level `l`: an entry's new bucket is
//! known from what the table holds, without its key. An entry keeps the fingerprint it was stored
//! with; after `g` doublings the bucket accounts for its top `g` bits, and the other `16 - g`
//! tell it apart from other ids in its bucket.

use xxhash_rust::xxh3::xxh3_128_with_seed;

use super::{BUCKET_BYTES, SLOTS, TARGET_LOAD};
use crate::identity::LedgerKey;

/// The fewest buckets of the table at level 0 (4 MiB, about 1.2M ids), unless the table is that
/// small at full capacity. Tests use tables that grow within a few dozen ids, so that the
/// ledger's tests (its reference model among them) grow them.
const MIN_BUCKETS: usize = if cfg!(test) { 2 } else { 1 << 16 };

/// The most doublings from level 0 to full capacity. An entry stored at level 0 keeps 16 - 6 =
/// 10 bits of fingerprint at full capacity, so while such entries live the index names a
/// generation for a new id more often (at most 64 times a full fingerprint's 1 in 65,536 per
/// slot); they leave as their generations age out.
pub(crate) const MAX_LEVELS: u8 = 6;

/// The table's sizes: `base << level` buckets, for levels `0..=max_level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) base: usize,
    pub(crate) max_level: u8,
}

impl Geometry {
    /// The sizes for a table that holds about `capacity` ids at full size.
    pub(crate) fn for_capacity(capacity: u64) -> Geometry {
        let full = buckets_for(capacity);
        let mut max_level = 0u8;
        while max_level < MAX_LEVELS && full >> (max_level + 1) >= MIN_BUCKETS {
            max_level += 1;
        }
        Geometry { base: full.div_ceil(1 << max_level).max(2), max_level }
    }

    /// Buckets at `level`.
    pub(crate) fn buckets(self, level: u8) -> usize {
        self.base << level
    }

    /// Ids the table holds at `level` at its target load.
    pub(crate) fn capacity(self, level: u8) -> u64 {
        (self.buckets(level) as f64 * SLOTS as f64 * TARGET_LOAD) as u64
    }

    /// Bytes of the table at `level`.
    pub(crate) fn bytes(self, level: u8) -> usize {
        self.buckets(level) * BUCKET_BYTES
    }

    /// The lowest level that holds `ids` at its target load (the full size if none does).
    pub(crate) fn level_for(self, ids: u64) -> u8 {
        (0..=self.max_level).find(|&l| self.capacity(l) >= ids).unwrap_or(self.max_level)
    }
}

/// Buckets for `capacity` ids at the target load.
fn buckets_for(capacity: u64) -> usize {
    let buckets = (capacity as f64 / (SLOTS as f64 * TARGET_LOAD)).ceil() as usize;
    buckets.max(2)
}

/// Where an id lives at one level: its two buckets, and the words its fingerprints come from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    pub(crate) first: usize,
    pub(crate) second: usize,
    /// The low 64 bits of `P` for the first bucket, and of the second's.
    pub(crate) first_word: u64,
    pub(crate) second_word: u64,
}

/// Computes places at one level of one table (its seed and geometry), apart from the table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placer {
    pub(crate) seed: u64,
    pub(crate) base: usize,
    pub(crate) level: u8,
}

impl Placer {
    /// Where `key` lives.
    pub(crate) fn place(&self, key: &LedgerKey) -> Place {
        let h = xxh3_128_with_seed(&key.0, self.seed);
        let (first, first_word) = self.bucket(h as u64);
        let (second, second_word) = self.bucket((h >> 64) as u64);
        Place { first, second, first_word, second_word }
    }

    fn bucket(&self, word: u64) -> (usize, u64) {
        let p = u128::from(word) * self.base as u128;
        ((p >> (64 - u32::from(self.level))) as usize, p as u64)
    }
}

/// The fingerprint of the id whose word is `word`, at `level`: the 16 bits of `P` below its
/// bucket bits (0 is kept for empty slots).
pub(crate) fn fingerprint(word: u64, level: u8) -> u16 {
    match ((word >> (48 - u32::from(level))) & 0xffff) as u16 {
        0 => 1,
        f => f,
    }
}

/// Which of the two buckets a fingerprint stored `doublings` levels ago goes to when the table
/// doubles: the bit below the bucket bits it was stored with, so far taken by the bucket.
pub(crate) fn split_bit(fingerprint: u16, doublings: u8) -> usize {
    usize::from(fingerprint >> (15 - doublings) & 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_doubling_sends_each_id_to_the_bucket_its_fingerprint_names() {
        let g = Geometry { base: 1_000, max_level: 6 };
        for n in 0..20_000u64 {
            let mut k = [0u8; 16];
            k[..8].copy_from_slice(&n.to_le_bytes());
            let key = LedgerKey(k);
            let at = |level| Placer { seed: 9, base: g.base, level }.place(&key);
            let stored = at(0);
            for level in 1..=6u8 {
                let now = at(level);
                // The same bucket, refined: the top bits of the level-0 bucket are the new one's.
                assert_eq!(now.first >> level, stored.first, "id {n} level {level}");
                assert_eq!(now.second >> level, stored.second, "id {n} level {level}");
                // Each doubling's bit is the next bit of the fingerprint stored at level 0.
                let before = at(level - 1);
                assert_eq!(now.first, 2 * before.first + split_bit(fingerprint(stored.first_word, 0), level - 1), "id {n} level {level}");
                assert_eq!(now.second, 2 * before.second + split_bit(fingerprint(stored.second_word, 0), level - 1), "id {n} level {level}");
            }
        }
    }

    #[test]
    fn sizes_grow_from_a_small_table_to_the_full_one() {
        // The default budget's 1.07 billion ids: 64 times smaller to start with.
        let g = Geometry::for_capacity(1 << 30);
        assert_eq!(g.max_level, MAX_LEVELS);
        assert!(g.capacity(g.max_level) >= 1 << 30);
        assert!(g.bytes(0) < 64 << 20, "{} bytes at level 0", g.bytes(0));
        assert_eq!(g.level_for(0), 0);
        assert_eq!(g.level_for(g.capacity(2)), 2);
        assert_eq!(g.level_for(g.capacity(2) + 1), 3);
        // A small table grows less (in tests, tables of a few buckets grow too).
        let small = Geometry::for_capacity(100);
        assert!(small.max_level < MAX_LEVELS);
        assert!(small.capacity(small.max_level) >= 100);
    }
}

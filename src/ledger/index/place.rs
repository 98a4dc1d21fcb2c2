//! Where an id lives in the id index, at each of the table's sizes, and its fingerprint there.
//!
//! The table at level `l` has `base << l` buckets, from level 0 up to `max_level` (its size at
//! full capacity). An id hashes (XXH3-128 with the table's seed) to two 64-bit words, one per
//! bucket choice. The top bits of a word, divided by `base`, give a remainder `r` and a quotient
//! `q`: the bucket at level `l` is `r + base * (q mod 2^l)`, and the fingerprint there is the
//! next 16 bits of `q`, `(q >> l) mod 2^16`. So when the table doubles from `M` buckets to `2M`,
//! an entry stays in its bucket `b` or moves to `b + M`, as the lowest bit of its stored
//! fingerprint not yet taken by the bucket says: every bucket splits on its own, in any order,
//! without the ids' keys. An entry keeps the fingerprint it was stored with; after `g` doublings
//! the bucket accounts for its low `g` bits, and the other `16 - g` tell it apart from other ids
//! in its bucket.

use strength_reduce::StrengthReducedU64;
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
        Geometry {
            base: full.div_ceil(1 << max_level).max(2),
            max_level,
        }
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
        (0..=self.max_level)
            .find(|&l| self.capacity(l) >= ids)
            .unwrap_or(self.max_level)
    }
}

/// Buckets for `capacity` ids at the target load.
fn buckets_for(capacity: u64) -> usize {
    let buckets = (capacity as f64 / (SLOTS as f64 * TARGET_LOAD)).ceil() as usize;
    buckets.max(2)
}

/// One bucket choice of an id, at every level: its bucket at level `l` is
/// `r + base * (q mod 2^l)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Choice {
    pub(crate) r: usize,
    pub(crate) q: u64,
}

impl Choice {
    /// The bucket at `level`, of a table of `base << level` buckets.
    pub(crate) fn bucket(self, base: usize, level: u8) -> usize {
        self.r + base * (self.q & ((1u64 << level) - 1)) as usize
    }
}

/// Where an id lives: its two bucket choices, and its buckets at the table's current level.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    pub(crate) first: usize,
    pub(crate) second: usize,
    pub(crate) choices: [Choice; 2],
}

/// Where a bulk load puts an id, in 12 bytes: both buckets and both fingerprints at the level it
/// was computed for. A load sorts its ids' places by first bucket before it inserts them, so
/// that the inserts walk the table from one end to the other instead of missing the cache on
/// each (a [`Place`] is 48 bytes: four times the memory to sort).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BulkPlace {
    pub(crate) first: u32,
    pub(crate) second: u32,
    pub(crate) fingerprints: [u16; 2],
}

/// Computes places at one level of one table (its seed and geometry), apart from the table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placer {
    seed: u64,
    base: StrengthReducedU64,
    /// The top bits of a hash word that are divided by `base`.
    shift: u32,
    level: u8,
}

impl Placer {
    pub(crate) fn new(seed: u64, geometry: Geometry, level: u8) -> Placer {
        // Enough bits for the remainder to be uniform (a quotient of at least 24 bits beyond
        // the bucket, so the bias is below 2^-24) and for every level's fingerprint.
        let bits =
            (usize::BITS - geometry.base.leading_zeros() + 24 + u32::from(geometry.max_level))
                .min(64);
        Placer {
            seed,
            base: StrengthReducedU64::new(geometry.base as u64),
            shift: 64 - bits,
            level,
        }
    }

    /// Where `key` lives.
    pub(crate) fn place(&self, key: &LedgerKey) -> Place {
        let h = xxh3_128_with_seed(&key.0, self.seed);
        let choices = [self.choice(h as u64), self.choice((h >> 64) as u64)];
        let base = self.base.get() as usize;
        Place {
            first: choices[0].bucket(base, self.level),
            second: choices[1].bucket(base, self.level),
            choices,
        }
    }

    /// Where a bulk load puts `key`; `None` for a table of more than 2^32 buckets (256 GiB),
    /// whose places a [`BulkPlace`] cannot hold.
    pub(crate) fn bulk_place(&self, key: &LedgerKey) -> Option<BulkPlace> {
        let place = self.place(key);
        Some(BulkPlace {
            first: u32::try_from(place.first).ok()?,
            second: u32::try_from(place.second).ok()?,
            fingerprints: place.choices.map(|c| fingerprint(c, self.level)),
        })
    }

    fn choice(&self, word: u64) -> Choice {
        let (q, r) = StrengthReducedU64::div_rem(word >> self.shift, self.base);
        Choice { r: r as usize, q }
    }
}

/// The fingerprint of a choice stored at `level`: the 16 bits of its quotient above the bucket's.
/// A fingerprint of 0 marks an empty slot, so an id whose bits are all 0 takes 0x8000 instead:
/// its low bits, which later doublings take, stay as they are.
pub(crate) fn fingerprint(choice: Choice, level: u8) -> u16 {
    match ((choice.q >> level) & 0xffff) as u16 {
        0 => 0x8000,
        f => f,
    }
}

/// Whether a fingerprint stored `doublings` levels ago moves, when the table doubles, to the
/// bucket in the new half: its lowest bit not yet taken by the bucket.
pub(crate) fn moves(fingerprint: u16, doublings: u8) -> bool {
    fingerprint >> doublings & 1 == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_doubling_keeps_each_id_in_its_bucket_or_sends_it_to_the_new_half_as_its_fingerprint_says()
    {
        let g = Geometry {
            base: 1_000,
            max_level: 6,
        };
        for n in 0..20_000u64 {
            let mut k = [0u8; 16];
            k[..8].copy_from_slice(&n.to_le_bytes());
            let key = LedgerKey(k);
            let at = |level| Placer::new(9, g, level).place(&key);
            let stored = at(0);
            for level in 1..=6u8 {
                let (now, before) = (at(level), at(level - 1));
                for c in 0..2 {
                    let (b_now, b_before) = if c == 0 {
                        (now.first, before.first)
                    } else {
                        (now.second, before.second)
                    };
                    let moved = moves(fingerprint(stored.choices[c], 0), level - 1);
                    assert_eq!(
                        b_now,
                        b_before + if moved { g.buckets(level - 1) } else { 0 },
                        "id {n} level {level}"
                    );
                    assert!(b_now < g.buckets(level));
                }
            }
        }
    }

    #[test]
    fn buckets_are_filled_evenly() {
        let g = Geometry {
            base: 97,
            max_level: 2,
        };
        let placer = Placer::new(5, g, 2);
        let mut counts = vec![0u32; g.buckets(2)];
        for n in 0..388_000u64 {
            let mut k = [0u8; 16];
            k[8..].copy_from_slice(&n.to_le_bytes());
            counts[placer.place(&LedgerKey(k)).first] += 1;
        }
        // 1,000 ids a bucket on average: within 15% everywhere.
        assert!(
            counts.iter().all(|&c| (850..1150).contains(&c)),
            "{:?}",
            counts.iter().min().zip(counts.iter().max())
        );
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

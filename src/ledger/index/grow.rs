//! Doubling the table in place, a bucket at a time: bucket `b` of a table of `M` buckets keeps
//! the entries whose next fingerprint bit is 0 and sends the others to bucket `b + M`, in the
//! memory after the table (see `place.rs`); dead entries are left behind. A bucket holds at most
//! 21 entries, so neither half can overflow; a bucket marked overflowed passes the mark to both.
//!
//! Buckets split independently, so the doubling goes on while the index is used: the table is at
//! its new level at once (new ids go in at it), a lookup reads a bucket not yet split where the old
//! level puts it, an insert splits the buckets it needs first, and [`IdIndex::split_some`] splits
//! the rest in steps short enough not to hold the ledger up (the largest doubling, of a table of
//! 1.8 GB, took 1.2 s in one piece here).

use super::place::{moves, Choice};
use super::{IdIndex, BUCKET_BYTES, DEAD, FLAGS_BYTE, SLOTS, SLOT_BYTES};

/// A doubling under way: which buckets of the old size are split.
pub(super) struct Splitting {
    /// One bit per bucket of the old size.
    done: Vec<u64>,
    /// Buckets before this are split (others past it may be too, split on demand).
    next: usize,
    left: usize,
}

impl Splitting {
    fn is_done(&self, b: usize) -> bool {
        self.done[b / 64] >> (b % 64) & 1 == 1
    }
}

impl IdIndex {
    /// Starts doubling the table: from now on it is at the next level. The caller has sealed the
    /// generation being filled, since a tag's entries are all stored at one level; a doubling still
    /// under way is finished first.
    pub(crate) fn grow(&mut self) {
        assert!(
            self.level < self.geometry.max_level,
            "the id index is at its full size"
        );
        self.finish_growth();
        let old = self.buckets();
        let empty = self.live_slots() == 0 && self.overflowed == 0;
        if !empty {
            // The new half's memory, resident before it is written (usually made so in the
            // background already: see `needs_growth`).
            self.region
                .populate(old * BUCKET_BYTES, 2 * old * BUCKET_BYTES);
            self.splitting = Some(Splitting {
                done: vec![0; old.div_ceil(64)],
                next: 0,
                left: old,
            });
        }
        // Otherwise there is nothing to move (dead slots read as free where they are), and the
        // new half's memory faults in as ids arrive.
        self.level += 1;
        for t in 0..self.live.len() {
            if self.live[t] {
                self.gap[t] += 1;
            }
        }
    }

    /// Whether a doubling is under way.
    pub(crate) fn growing(&self) -> bool {
        self.splitting.is_some()
    }

    /// Splits up to `buckets` buckets of a doubling under way; true when none is left.
    pub(crate) fn split_some(&mut self, buckets: usize) -> bool {
        let Some(splitting) = self.splitting.as_mut() else {
            return true;
        };
        let old = splitting.done.len() * 64;
        let mut todo = Vec::with_capacity(buckets.min(splitting.left));
        let mut b = splitting.next;
        while todo.len() < buckets && b < old {
            if !splitting.is_done(b) {
                todo.push(b);
            }
            b += 1;
        }
        splitting.next = b;
        for b in todo {
            self.split(b);
        }
        self.splitting.as_ref().is_none_or(|s| s.left == 0)
    }

    /// Finishes a doubling under way.
    pub(crate) fn finish_growth(&mut self) {
        self.split_some(usize::MAX);
    }

    /// The bucket a choice of an id is in now: at the current level, or at the one before if
    /// its bucket there is not split yet.
    pub(super) fn bucket_of(&self, choice: Choice) -> usize {
        let base = self.geometry.base;
        if let Some(splitting) = &self.splitting {
            let old = choice.bucket(base, self.level - 1);
            if !splitting.is_done(old) {
                return old;
            }
        }
        choice.bucket(base, self.level)
    }

    /// The bucket a choice of an id is stored in at the current level, its bucket at the level
    /// before split first if it is not yet.
    pub(super) fn bucket_for_insert(&mut self, choice: Choice) -> usize {
        let base = self.geometry.base;
        if let Some(splitting) = &self.splitting {
            let old = choice.bucket(base, self.level - 1);
            if !splitting.is_done(old) {
                self.split(old);
            }
        }
        choice.bucket(base, self.level)
    }

    /// [`IdIndex::bucket_for_insert`] of a bucket `b` at the current level: its bucket at the
    /// level before (`b` modulo that level's size) is split first if it is not yet.
    pub(super) fn split_for_insert(&mut self, b: usize) -> usize {
        if let Some(splitting) = &self.splitting {
            let old = b % self.geometry.buckets(self.level - 1);
            if !splitting.is_done(old) {
                self.split(old);
            }
        }
        b
    }

    /// Splits bucket `b` of the old size into `b` and `b + old size`.
    fn split(&mut self, b: usize) {
        let Some(splitting) = self.splitting.as_mut() else {
            return;
        };
        splitting.done[b / 64] |= 1 << (b % 64);
        splitting.left -= 1;
        let finished = splitting.left == 0;
        let half = self.geometry.buckets(self.level - 1);
        let mut src = [0u8; BUCKET_BYTES];
        src.copy_from_slice(self.bucket(b));
        let mut halves = [[0u8; BUCKET_BYTES]; 2];
        let mut filled = [0usize; 2];
        for i in 0..SLOTS {
            let slot = &src[i * SLOT_BYTES..(i + 1) * SLOT_BYTES];
            let (tag, f) = (slot[0], u16::from_le_bytes([slot[1], slot[2]]));
            // Doublings since the entry was stored, before this one.
            let doublings = self.gap[usize::from(tag)].wrapping_sub(1);
            if f == 0 || self.gap[usize::from(tag)] == DEAD {
                if f != 0 {
                    self.slots_by_tag[usize::from(tag)] -= 1;
                }
                continue;
            }
            let h = usize::from(moves(f, doublings));
            halves[h][filled[h] * SLOT_BYTES..(filled[h] + 1) * SLOT_BYTES].copy_from_slice(slot);
            filled[h] += 1;
        }
        for h in &mut halves {
            h[FLAGS_BYTE] = src[FLAGS_BYTE];
        }
        if src[FLAGS_BYTE] & super::OVERFLOW != 0 {
            self.overflowed += 1;
        }
        self.bucket_mut(b).copy_from_slice(&halves[0]);
        self.bucket_mut(b + half).copy_from_slice(&halves[1]);
        if finished {
            self.splitting = None;
        }
    }
}

//! Doubling the table in place: each bucket splits into two, each live entry going to the half
//! the next bit of its stored fingerprint names (see `place.rs`), dead entries left behind.
//!
//! The table at its next level occupies the first twice-as-many buckets of the same memory, so
//! the split runs from the last bucket down: bucket `b`'s halves land at `2b` and `2b + 1`, which
//! hold buckets already split (or `b` itself, copied first). A bucket holds at most 21 entries,
//! so neither half can overflow; a bucket marked overflowed passes the mark to both halves.

use super::place::split_bit;
use super::{IdIndex, BUCKET_BYTES, DEAD, FLAGS_BYTE, SLOTS, SLOT_BYTES, TAGS};

impl IdIndex {
    /// Doubles the table. The caller has sealed the generation being filled: a tag's entries are
    /// all stored at one level, so from here on new ids go to tags started at the new level.
    pub(crate) fn grow(&mut self) {
        assert!(self.level < self.geometry.max_level, "the id index is at its full size");
        if self.live_slots() == 0 && self.overflowed == 0 {
            // Nothing to move (dead slots stay where they are, read as free): the next size's
            // memory is left to fault in as ids arrive, rather than all at once here.
            self.level += 1;
            self.bump_gaps();
            return;
        }
        let old = self.buckets();
        let new_len = self.geometry.bytes(self.level + 1);
        self.region.populate(old * BUCKET_BYTES, new_len);
        let gap = self.gap;
        let table = self.region.bytes_mut(new_len);
        let mut slots_by_tag = [0u64; TAGS];
        for b in (0..old).rev() {
            let mut src = [0u8; BUCKET_BYTES];
            src.copy_from_slice(&table[b * BUCKET_BYTES..(b + 1) * BUCKET_BYTES]);
            let mut halves = [[0u8; BUCKET_BYTES]; 2];
            let mut filled = [0usize; 2];
            for i in 0..SLOTS {
                let slot = &src[i * SLOT_BYTES..(i + 1) * SLOT_BYTES];
                let (tag, f) = (slot[0], u16::from_le_bytes([slot[1], slot[2]]));
                let doublings = gap[usize::from(tag)];
                if f == 0 || doublings == DEAD {
                    continue;
                }
                let half = split_bit(f, doublings);
                let j = filled[half];
                halves[half][j * SLOT_BYTES..(j + 1) * SLOT_BYTES].copy_from_slice(slot);
                filled[half] += 1;
                slots_by_tag[usize::from(tag)] += 1;
            }
            for half in &mut halves {
                half[FLAGS_BYTE] = src[FLAGS_BYTE];
            }
            table[2 * b * BUCKET_BYTES..(2 * b + 1) * BUCKET_BYTES].copy_from_slice(&halves[0]);
            table[(2 * b + 1) * BUCKET_BYTES..(2 * b + 2) * BUCKET_BYTES].copy_from_slice(&halves[1]);
        }
        self.overflowed *= 2;
        self.slots_by_tag = slots_by_tag;
        self.level += 1;
        self.bump_gaps();
    }

    /// One more doubling since every live tag's entries were stored.
    fn bump_gaps(&mut self) {
        for t in 0..TAGS {
            if self.live[t] {
                self.gap[t] += 1;
            }
        }
    }
}

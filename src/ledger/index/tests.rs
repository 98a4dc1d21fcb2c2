//! The id index's tests: what it answers for ids stored, forgotten and never seen, at one size and
//! across doublings.

use std::collections::HashSet;

use super::*;

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

/// A table that holds `capacity` ids at full size, starting at `level`.
fn table(capacity: u64, level: u8) -> IdIndex {
    IdIndex::new(Geometry::for_capacity(capacity), level, 7)
}

fn probe(index: &IdIndex, n: u64) -> Probe {
    index.probe(&index.place(&key(n)))
}

fn insert(index: &mut IdIndex, ids: std::ops::Range<u64>, tag: u8) {
    for n in ids {
        assert!(index.insert(&index.place(&key(n)), tag), "insert {n}");
    }
}

fn false_positives(index: &IdIndex) -> usize {
    (1_000_000_000..1_000_100_000)
        .filter(|&n| probe(index, n) != Probe::Absent)
        .count()
}

#[test]
fn every_inserted_id_is_found_under_its_tag_and_few_others_are() {
    let mut index = table(100_000, 0);
    while index.geometry().1 < index.geometry().0.max_level {
        index.grow();
    }
    index.start(3);
    insert(&mut index, 0..90_000, 3);
    for n in 0..90_000 {
        assert!(maybe_in(probe(&index, n), 3), "lost {n}");
    }
    // 42 slots of 16-bit fingerprints at 90% load: ~0.06% expected.
    let fp = false_positives(&index);
    assert!(fp < 200, "{fp} false positives in 100000");
    assert_eq!(index.live_slots(), 90_000);
    assert_eq!(index.overflowed_buckets(), 0);
}

#[test]
fn forgetting_a_tag_frees_its_slots_for_reuse() {
    let mut index = IdIndex::new(
        Geometry {
            base: 530,
            max_level: 0,
        },
        0,
        7,
    );
    index.start(0);
    insert(&mut index, 0..9_000, 0);
    index.forget(0);
    assert_eq!(probe(&index, 5), Probe::Absent);
    index.start(1);
    // The table is as full as it can be: only reuse of the dead slots makes room.
    insert(&mut index, 10_000..19_000, 1);
    assert_eq!(index.live_slots(), 9_000);
    assert_eq!(index.overflowed_buckets(), 0);
}

#[test]
fn a_reused_tag_does_not_resurrect_old_ids() {
    let mut index = IdIndex::new(
        Geometry {
            base: 53,
            max_level: 0,
        },
        0,
        7,
    );
    index.start(5);
    for n in 0..500 {
        index.insert(&index.place(&key(n)), 5);
    }
    index.forget(5);
    index.start(5);
    let resurrected: HashSet<u64> = (0..500)
        .filter(|&n| probe(&index, n) != Probe::Absent)
        .collect();
    assert!(resurrected.is_empty(), "{resurrected:?}");
    assert_eq!(index.live_slots(), 0);
}

#[test]
fn a_full_table_overflows_into_unknown_answers_never_absent_ones() {
    let mut index = IdIndex::new(
        Geometry {
            base: 6,
            max_level: 0,
        },
        0,
        7,
    );
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
        assert_eq!(probe(&index, n), Probe::Unknown, "id {n}");
    }
}

#[test]
fn an_id_loaded_again_takes_no_second_slot() {
    let mut index = table(100_000, 0);
    index.start(2);
    for _ in 0..3 {
        for n in 0..1_000 {
            assert!(index.insert_bulk(&index.place(&key(n)), 2));
        }
    }
    assert_eq!(index.live_slots(), 1_000);
    // Another generation's tag takes its own slot.
    index.start(3);
    assert!(index.insert_bulk(&index.place(&key(1)), 3));
    assert_eq!(index.live_slots(), 1_001);
    assert!(maybe_in(probe(&index, 1), 2) && maybe_in(probe(&index, 1), 3));
}

/// A table of `base` buckets at level 0 that may double `max_level` times.
fn growing(base: usize, max_level: u8) -> IdIndex {
    IdIndex::new(Geometry { base, max_level }, 0, 11)
}

#[test]
fn the_table_doubles_in_place_and_every_id_stays_found_under_its_tag() {
    // A table 64 times smaller than its full size to start with (1,000 buckets: 18,900 ids).
    let mut index = growing(1_000, 6);
    let (geometry, level) = index.geometry();
    assert_eq!((geometry.max_level, level), (6, 0));
    let start_bytes = index.table_bytes();
    // A generation per level, each filled to the growth threshold; one dropped on the way.
    let mut stored = Vec::new();
    let mut next = 0u64;
    for tag in 0..=geometry.max_level {
        index.start(tag);
        let mut n = 0;
        while !index.needs_growth(0) && n < 100_000 {
            assert!(index.insert(&index.place(&key(next)), tag));
            next += 1;
            n += 1;
        }
        stored.push((tag, next - n..next));
        if tag == 2 {
            index.forget(1);
        }
        if index.geometry().1 < geometry.max_level {
            index.grow();
        }
    }
    assert_eq!(index.geometry().1, 6);
    assert_eq!(index.table_bytes(), start_bytes * 64);
    assert_eq!(index.overflowed_buckets(), 0);
    for (tag, ids) in &stored {
        for n in ids.clone() {
            let found = maybe_in(probe(&index, n), *tag);
            if *tag == 1 {
                assert!(
                    !found || probe(&index, n) == Probe::Unknown,
                    "id {n} of a forgotten generation found under its tag"
                );
            } else {
                assert!(found, "id {n} lost (tag {tag})");
            }
        }
    }
    let live: u64 = stored
        .iter()
        .filter(|(t, _)| *t != 1)
        .map(|(_, r)| r.end - r.start)
        .sum();
    assert_eq!(
        index.live_slots(),
        live,
        "the split counts every live entry once and drops the dead"
    );
    // Entries stored six doublings ago compare 10 fingerprint bits; the table is sparse, so new
    // ids still rarely hit: well under 1%.
    let fp = false_positives(&index);
    assert!(fp < 1_000, "{fp} false positives in 100000");
}

#[test]
fn an_overflowed_bucket_stays_unknown_after_a_doubling() {
    let mut index = growing(1_000, 2);
    index.start(0);
    // Fill past what the first level holds, so some buckets overflow.
    let buckets = index.geometry().0.buckets(0) as u64;
    let mut refused = Vec::new();
    for n in 0..buckets * 30 {
        if !index.insert(&index.place(&key(n)), 0) {
            refused.push(n);
        }
    }
    assert!(!refused.is_empty());
    let overflowed = index.overflowed_buckets();
    index.grow();
    for n in &refused {
        assert_eq!(
            probe(&index, *n),
            Probe::Unknown,
            "id {n}, before its bucket is split"
        );
    }
    index.finish_growth();
    assert_eq!(index.overflowed_buckets(), 2 * overflowed);
    for n in refused {
        assert_eq!(probe(&index, n), Probe::Unknown, "id {n}");
    }
}

#[test]
fn a_table_stored_and_read_back_answers_alike() {
    let mut index = growing(5_000, 3);
    index.start(4);
    insert(&mut index, 0..50_000, 4);
    index.grow();
    index.start(5);
    insert(&mut index, 50_000..90_000, 5);
    index.finish_growth();
    let header = index.header();
    let table = index.table().to_vec();
    let mut back = IdIndex::from_parts(&header, index.geometry().0, |t| {
        t.copy_from_slice(&table);
        Ok(())
    })
    .unwrap()
    .unwrap();
    back.revive(4);
    back.revive(5);
    for n in (0..90_000).step_by(7) {
        assert_eq!(probe(&back, n), probe(&index, n), "id {n}");
    }
    // A header of another size is refused.
    let other = Geometry {
        base: header.geometry.base + 1,
        ..header.geometry
    };
    assert!(IdIndex::from_parts(&header, other, |_| Ok(()))
        .unwrap()
        .is_none());
}

#[test]
fn ids_stay_found_while_the_table_splits_a_few_buckets_at_a_time() {
    let mut index = growing(2_000, 3);
    index.start(1);
    insert(&mut index, 0..30_000, 1);
    for (round, tag) in [(0u64, 2u8), (1, 3), (2, 4)] {
        index.grow();
        index.start(tag);
        let base = 100_000 * (round + 1);
        let mut next = base;
        // A few buckets split, some new ids in (splitting the buckets they need), all probed.
        while !index.split_some(97) {
            insert(&mut index, next..next + 50, tag);
            next += 50;
            for n in (0..30_000).step_by(13) {
                assert!(
                    maybe_in(probe(&index, n), 1),
                    "id {n} lost in round {round}"
                );
            }
            for n in (base..next).step_by(7) {
                assert!(
                    maybe_in(probe(&index, n), tag),
                    "new id {n} lost in round {round}"
                );
            }
        }
        assert!(!index.growing());
        for n in base..next {
            assert!(
                maybe_in(probe(&index, n), tag),
                "new id {n} lost after round {round}"
            );
        }
    }
    assert_eq!(index.overflowed_buckets(), 0);
}

#[test]
fn ids_loaded_in_bulk_in_bucket_order_are_all_found_and_a_full_table_answers_unknown() {
    let mut index = IdIndex::new(
        Geometry {
            base: 1_000,
            max_level: 0,
        },
        0,
        7,
    );
    index.start(1);
    let mut places: Vec<(u64, Place)> = (0..21_000u64).map(|n| (n, index.place(&key(n)))).collect();
    places.sort_unstable_by_key(|(_, p)| p.first);
    let refused: Vec<u64> = places
        .iter()
        .filter(|(_, p)| !index.insert_bulk(p, 1))
        .map(|(n, _)| *n)
        .collect();
    // 21 ids a bucket on average into 21 slots: some buckets and their second choices fill up.
    assert!(!refused.is_empty(), "the table was meant to be over full");
    for (n, _) in &places {
        assert!(maybe_in(probe(&index, *n), 1), "id {n} lost");
    }
    for n in refused {
        assert_eq!(probe(&index, n), Probe::Unknown, "id {n}");
    }
}

/// The bucket reading of bulk inserts (`insert::empty_slot`, 16 bytes at a time) gives what a
/// slot-by-slot reading gives, on random buckets: a held fingerprint anywhere, the first empty
/// slot anywhere, none; tags and fingerprints drawn from a few values, so that they collide, and
/// any flags byte.
#[test]
fn a_bulk_insert_reads_a_bucket_as_a_slot_by_slot_reading_does() {
    use insert::{empty_slot, Empty};
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut seen = [0usize; 3];
    for _ in 0..200_000 {
        let mut bucket = [0u8; BUCKET_BYTES];
        let empty_share = next() % 23;
        for i in 0..SLOTS {
            if next() % 22 >= empty_share {
                let f = match next() % 3 {
                    0 => (next() % 4 + 1) as u16,
                    1 => ((next() % 4 + 1) << 8) as u16,
                    _ => (next() % 0xffff + 1) as u16,
                };
                let [lo, hi] = f.to_le_bytes();
                bucket[i * SLOT_BYTES..i * SLOT_BYTES + SLOT_BYTES].copy_from_slice(&[
                    (next() % 3) as u8,
                    lo,
                    hi,
                ]);
            }
        }
        bucket[FLAGS_BYTE] = next() as u8;
        let f = match next() % 2 {
            0 => (next() % 4 + 1) as u16,
            _ => ((next() % 4 + 1) << 8) as u16,
        };
        let held = ((next() % 3) as u8, f);
        let slots: Vec<(u8, u16)> = (0..SLOTS).map(|i| IdIndex::slot(&bucket, i)).collect();
        let expected = if slots.contains(&held) {
            Empty::Held
        } else {
            match slots.iter().position(|&(_, f)| f == 0) {
                Some(i) => Empty::At(i),
                None => Empty::None,
            }
        };
        assert_eq!(empty_slot(&bucket, held), expected, "{bucket:?} {held:?}");
        seen[match expected {
            Empty::Held => 0,
            Empty::At(_) => 1,
            Empty::None => 2,
        }] += 1;
    }
    assert!(
        seen.iter().all(|&n| n > 1_000),
        "every answer drawn: {seen:?}"
    );
}

//! The conformance suite of [`IdStore`]: one set of checks, each a function generic over the
//! store, run by [`conformance!`] against every implementation (the ledger in a temporary
//! directory, and [`MemoryStore`]). A rule the double keeps and the ledger does not, or the other
//! way round, fails here.

use std::path::Path;

use super::{IdStore, Looked, MemoryStore, NewId};
use crate::clock::now_ms;
use crate::identity::{ledger_key, ContentDigest, LedgerKey};
use crate::ledger::{Held, Ledger, LedgerOptions, Mark, MarkKind, MarkOrder, Verdict};

/// Makes a store in `dir` with the retention limit and refresh given.
type Make<S> = fn(&Path, Option<i64>, bool) -> S;

fn key(name: &str) -> LedgerKey {
    ledger_key(name.as_bytes()).expect("a valid id")
}

fn digest(text: &str) -> Option<ContentDigest> {
    Some(ContentDigest::of_value(text.as_bytes()))
}

/// An hour ago, on a whole second: times the stores keep exactly.
fn t0() -> i64 {
    now_ms() / 1000 * 1000 - 3_600_000
}

const SECOND: i64 = 1000;

fn dup(first_seen_ms: i64, digest: Option<ContentDigest>) -> Verdict {
    Verdict::Duplicate {
        first_seen_ms,
        digest,
    }
}

fn held(first_seen_ms: i64, digest: Option<ContentDigest>) -> Option<Held> {
    Some(Held {
        first_seen_ms,
        digest,
    })
}

fn mark(partition: i32, kind: MarkKind, changelog_offset: i64, at_ms: i64) -> Mark {
    Mark {
        partition,
        kind,
        changelog_offset,
        at_ms,
    }
}

/// Runs `check` against a store made by `make` in a fresh temporary directory.
fn with<S: IdStore>(make: Make<S>, limit_ms: Option<i64>, refresh: bool, check: impl FnOnce(&S)) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = make(dir.path(), limit_ms, refresh);
    check(&store);
}

/// An id not held is new and recorded; held, it is a duplicate with its first sighting and
/// digest; repeated in one batch, it is new once.
pub(super) fn new_then_duplicate<S: IdStore>(make: Make<S>) {
    with(make, None, false, |s| {
        let (a, b, t) = (key("a"), key("b"), t0());
        let items: [NewId; 3] = [
            (a, t, digest("A")),
            (b, t, None),
            (a, t + SECOND, digest("A")),
        ];
        let verdicts = s.record(0, &items, b"p1", &[]).unwrap();
        assert_eq!(verdicts, [Verdict::New, Verdict::New, dup(t, digest("A"))]);
        let again = s
            .record(0, &[(b, t + 2 * SECOND, digest("B"))], b"", &[])
            .unwrap();
        assert_eq!(
            again,
            [dup(t, None)],
            "the first copy's digest (none) is kept"
        );
        let looked = s.look_up(&[b, key("never"), a]).unwrap();
        assert_eq!(
            looked,
            Looked {
                held: vec![held(t, None), None, held(t, digest("A"))],
                forgotten: vec![],
            }
        );
    });
}

/// Without refresh, a later copy never moves the first sighting; a reused id keeps its first
/// content's digest.
pub(super) fn first_sighting_and_digest_kept<S: IdStore>(make: Make<S>) {
    with(make, None, false, |s| {
        let (a, t) = (key("a"), t0());
        s.record(0, &[(a, t, digest("A"))], b"", &[]).unwrap();
        let later = s
            .record(1, &[(a, t + 60 * SECOND, digest("other"))], b"", &[])
            .unwrap();
        assert_eq!(later, [dup(t, digest("A"))], "held across partitions");
        assert_eq!(s.look_up(&[a]).unwrap().held, [held(t, digest("A"))]);
    });
}

/// With refresh, a later copy records the id again at its time with the first digest, and is
/// still a duplicate; an earlier copy moves nothing.
pub(super) fn refresh_moves_forward_only<S: IdStore>(make: Make<S>) {
    with(make, None, true, |s| {
        let (a, t) = (key("a"), t0());
        s.record(0, &[(a, t + 10 * SECOND, digest("A"))], b"", &[])
            .unwrap();
        let earlier = s.record(0, &[(a, t, digest("A"))], b"", &[]).unwrap();
        assert_eq!(earlier, [dup(t + 10 * SECOND, digest("A"))]);
        assert_eq!(
            s.look_up(&[a]).unwrap().held,
            [held(t + 10 * SECOND, digest("A"))]
        );
        let later = s
            .record(0, &[(a, t + 30 * SECOND, digest("B"))], b"", &[])
            .unwrap();
        assert_eq!(later, [dup(t + 10 * SECOND, digest("A"))]);
        assert_eq!(
            s.look_up(&[a]).unwrap().held,
            [held(t + 30 * SECOND, digest("A"))]
        );
    });
}

/// With a retention limit, a copy arriving past it is new and recorded at its time; an item
/// older than the limit (by the wall clock) is new and recorded nowhere.
pub(super) fn the_retention_limit<S: IdStore>(make: Make<S>) {
    let limit = 2 * 3_600_000;
    with(make, Some(limit), false, |s| {
        let (a, old, t) = (
            key("a"),
            key("old"),
            now_ms() / 1000 * 1000 - limit + 60 * SECOND,
        );
        s.record(0, &[(a, t, digest("A"))], b"", &[]).unwrap();
        let within = s
            .record(0, &[(a, t + limit, digest("B"))], b"", &[])
            .unwrap();
        assert_eq!(within, [dup(t, digest("A"))], "at the limit, still held");
        let past = t + limit + SECOND;
        let beyond = s.record(0, &[(a, past, digest("B"))], b"", &[]).unwrap();
        assert_eq!(beyond, [Verdict::New], "past the limit: a new sighting");
        assert_eq!(s.look_up(&[a]).unwrap().held, [held(past, digest("B"))]);
        let too_old = t - 120 * SECOND;
        let verdicts = s
            .record(0, &[(old, too_old, None), (old, too_old, None)], b"", &[])
            .unwrap();
        assert_eq!(
            verdicts,
            [Verdict::New, dup(too_old, None)],
            "new once in its batch"
        );
        assert_eq!(s.look_up(&[old]).unwrap().held, [None], "recorded nowhere");
    });
}

/// A forgotten id is not held, and listed once with its forget's time and partitions, until a
/// re-send mark ends the forget (on any partition); marks read back by offset never replace a
/// newer one.
pub(super) fn forgotten_ids_and_marks<S: IdStore>(make: Make<S>) {
    with(make, None, false, |s| {
        let (a, b, t) = (key("a"), key("b"), t0());
        s.record(0, &[(a, t, None), (b, t, None)], b"", &[])
            .unwrap();
        let forget = |p| (a, mark(p, MarkKind::Forgotten, 5, t + 100 * SECOND));
        s.mark(&[forget(0), forget(3)], MarkOrder::Newest).unwrap();
        let looked = s.look_up(&[a, b, a]).unwrap();
        assert_eq!(looked.held, [None, held(t, None), None]);
        assert_eq!(looked.forgotten.len(), 1, "{looked:?}");
        assert_eq!(
            (looked.forgotten[0].key, looked.forgotten[0].at_ms),
            (a, t + 100 * SECOND)
        );
        assert_eq!(looked.forgotten[0].partitions, [0, 3]);
        // An older re-send read back from the changelog does not replace the forget.
        let stale = (a, mark(0, MarkKind::Resent, 4, t + 200 * SECOND));
        s.mark(&[stale], MarkOrder::ByOffset).unwrap();
        assert_eq!(s.look_up(&[a]).unwrap().held, [None]);
        // Its next copy is new, recorded with its re-send mark; the copy after is a duplicate.
        let resent = (a, mark(3, MarkKind::Resent, 9, t + 200 * SECOND));
        let next = s
            .record(0, &[(a, t + 150 * SECOND, None)], b"", &[resent])
            .unwrap();
        assert_eq!(next, [Verdict::New]);
        let looked = s.look_up(&[a]).unwrap();
        assert_eq!(
            (looked.held, looked.forgotten),
            (vec![held(t + 150 * SECOND, None)], vec![])
        );
        let after = s
            .record(0, &[(a, t + 160 * SECOND, None)], b"", &[])
            .unwrap();
        assert_eq!(after, [dup(t + 150 * SECOND, None)]);
    });
}

/// A batch's progress record is read back with it, per partition; an empty one leaves it as it
/// is; a batch of no ids moves it too.
pub(super) fn progress_with_its_batch<S: IdStore>(make: Make<S>) {
    with(make, None, false, |s| {
        let t = t0();
        assert_eq!(s.progress(0).unwrap(), None);
        s.record(0, &[(key("a"), t, None)], b"p0-1", &[]).unwrap();
        s.record(1, &[(key("b"), t, None)], b"p1-1", &[]).unwrap();
        s.record(0, &[(key("c"), t, None)], b"", &[]).unwrap();
        assert_eq!(s.progress(0).unwrap().as_deref(), Some(&b"p0-1"[..]));
        s.record(0, &[], b"p0-2", &[]).unwrap();
        assert_eq!(s.progress(0).unwrap().as_deref(), Some(&b"p0-2"[..]));
        assert_eq!(s.progress(1).unwrap().as_deref(), Some(&b"p1-1"[..]));
    });
}

/// Runs every check of the suite against the stores `make` makes.
macro_rules! conformance {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn new_then_duplicate() {
                super::new_then_duplicate($make);
            }
            #[test]
            fn first_sighting_and_digest_kept() {
                super::first_sighting_and_digest_kept($make);
            }
            #[test]
            fn refresh_moves_forward_only() {
                super::refresh_moves_forward_only($make);
            }
            #[test]
            fn the_retention_limit() {
                super::the_retention_limit($make);
            }
            #[test]
            fn forgotten_ids_and_marks() {
                super::forgotten_ids_and_marks($make);
            }
            #[test]
            fn progress_with_its_batch() {
                super::progress_with_its_batch($make);
            }
        }
    };
}

fn ledger_options(limit_ms: Option<i64>, refresh: bool) -> LedgerOptions {
    LedgerOptions {
        budget_bytes: 256 << 20,
        write_buffer_bytes: 1 << 20,
        block_cache_bytes: 1 << 20,
        background_jobs: 2,
        max_window_ms: limit_ms,
        refresh_on_duplicate: refresh,
        ..LedgerOptions::default()
    }
}

fn open_ledger(dir: &Path, limit_ms: Option<i64>, refresh: bool) -> Ledger {
    Ledger::open(dir.join("ledger"), ledger_options(limit_ms, refresh)).expect("the ledger opens")
}

fn memory_store(_dir: &Path, limit_ms: Option<i64>, refresh: bool) -> MemoryStore {
    MemoryStore::new(limit_ms, refresh)
}

conformance!(ledger, open_ledger);
conformance!(memory, memory_store);

/// The real store keeps what it recorded across a close and a reopen: ids, digests, marks,
/// progress records.
#[test]
fn the_ledger_keeps_everything_across_a_restart() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (a, b, t) = (key("a"), key("b"), t0());
    let forget = (b, mark(2, MarkKind::Forgotten, 7, t + SECOND));
    {
        let ledger = open_ledger(dir.path(), None, false);
        ledger
            .record(2, &[(a, t, digest("A")), (b, t, None)], b"p2", &[])
            .unwrap();
        IdStore::mark(&ledger, &[forget], MarkOrder::Newest).unwrap();
    }
    let ledger = open_ledger(dir.path(), None, false);
    let looked = ledger.look_up(&[a, b]).unwrap();
    assert_eq!(looked.held, [held(t, digest("A")), None]);
    assert_eq!(looked.forgotten.len(), 1);
    assert_eq!(
        IdStore::progress(&ledger, 2).unwrap().as_deref(),
        Some(&b"p2"[..])
    );
    // Without closing (a crash), the batch log brings the batch back.
    ledger
        .record(2, &[(key("c"), t, None)], b"p2-2", &[])
        .unwrap();
    ledger.drop_without_closing();
    let ledger = open_ledger(dir.path(), None, false);
    assert_eq!(ledger.look_up(&[key("c")]).unwrap().held, [held(t, None)]);
    assert_eq!(
        IdStore::progress(&ledger, 2).unwrap().as_deref(),
        Some(&b"p2-2"[..])
    );
}

mod random {
    //! The double against the ledger over random batches: the same verdicts, the same ids held,
    //! the same progress, with and without refresh and a retention limit.

    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;

    /// A second on either side of the wall-clock floor is left out: the two stores read the clock
    /// a moment apart.
    fn time_s(s: i64) -> i64 {
        if (298..=302).contains(&s) {
            s + 10
        } else {
            s
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn the_double_answers_as_the_ledger_does(
            refresh in any::<bool>(),
            limited in any::<bool>(),
            batches in vec(vec((0u8..12, 0i64..600, 0u8..3), 0..24), 1..8),
        ) {
            // Ten minutes ago; with a limit of five, the first half of the times are older than
            // it, and a copy more than five minutes after its sighting is past it.
            let base = now_ms() / 1000 * 1000 - 600_000;
            let limit = limited.then_some(300_000);
            let dir = tempfile::tempdir().expect("a temporary directory");
            let ledger = open_ledger(dir.path(), limit, refresh);
            let memory = memory_store(dir.path(), limit, refresh);
            for (n, batch) in batches.iter().enumerate() {
                let items: Vec<NewId> = batch
                    .iter()
                    .map(|&(k, s, d)| {
                        let digest = (d > 0).then(|| ContentDigest::of_value(&[d]));
                        (key(&format!("id-{k}")), base + time_s(s) * SECOND, digest)
                    })
                    .collect();
                let partition = (n % 2) as i32;
                let progress = (n as u64).to_le_bytes();
                let real = ledger.record(partition, &items, &progress, &[]).unwrap();
                let double = memory.record(partition, &items, &progress, &[]).unwrap();
                prop_assert_eq!(real, double, "batch {}", n);
            }
            let keys: Vec<LedgerKey> = (0..12).map(|k| key(&format!("id-{k}"))).collect();
            prop_assert_eq!(ledger.look_up(&keys).unwrap(), memory.look_up(&keys).unwrap());
            for partition in 0..2 {
                prop_assert_eq!(
                    IdStore::progress(&ledger, partition).unwrap(),
                    memory.progress(partition).unwrap()
                );
            }
        }
    }
}

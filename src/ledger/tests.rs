//! The ledger's tests: behaviour through the public API, a model-based property test, and crash
//! tests that kill a child process (this test binary, run with `--exact ledger::tests::...`).

use super::batch_log::LOG_FILE_PREFIX;
use super::format::{decode_value, encode_first_seen, encode_value, META_FORMAT_VERSION};
use super::generations::{MAX_LIVE_GENERATIONS, SEAL_BUFFER_IDS};
use super::stats::DEFAULT_BYTES_PER_ID_ESTIMATE;
use super::*;
use crate::identity::ledger_key;
use crate::identity::ContentDigest;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

fn key(n: u64) -> LedgerKey {
    ledger_key(format!("id-{n}").as_bytes()).unwrap()
}

fn small_options(durability: Durability) -> LedgerOptions {
    LedgerOptions {
        durability,
        // The id index is sized from the budget and made resident when the ledger opens.
        budget_bytes: 256 << 20,
        write_buffer_bytes: 1 << 20,
        block_cache_bytes: 1 << 20,
        background_jobs: 2,
        ..LedgerOptions::default()
    }
}

const ALL_MODES: [Durability; 3] = [Durability::SyncWal, Durability::Wal, Durability::NoWal];

/// A directory in memory (/dev/shm, when the machine has it) for the tests whose ledgers make
/// many column families or reopen many times and prove nothing about the disk: on a disk each
/// options file written and each WAL synced waits for the device, while in memory the calls
/// (and what a process that dies leaves) are the same. Tests of a process killed while it
/// writes keep a directory on disk.
fn memory_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

#[test]
fn ledger_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Ledger>();
}

#[test]
fn first_seen_round_trips_at_second_resolution() {
    for (base, t) in [
        (0, 0),
        (1_000, 999),
        (1_000, 1_001),
        (5_000, 1_234_567),
        (i64::MAX / 4, 1),
    ] {
        let mut v = Vec::new();
        encode_first_seen(TimeBase::seconds(base), t, &mut v);
        let back = decode_value(TimeBase::seconds(base), &v)
            .unwrap()
            .first_seen_ms;
        assert_eq!(back, stored_first_seen_ms(TimeBase::seconds(base), t));
        assert!(back <= t && t - back < FIRST_SEEN_RESOLUTION_MS || t < base);
    }
    // A value is at most 3 bytes for ids up to ~12 days either side of the base.
    let mut v = Vec::new();
    encode_first_seen(TimeBase::seconds(0), 12 * 24 * 3_600_000, &mut v);
    assert!(v.len() <= 3, "{} bytes", v.len());
}

#[test]
fn a_value_carries_its_digest_or_none_and_anything_else_is_corrupt() {
    let digest = ContentDigest::of_hash(0x1234 << 48);
    let mut v = Vec::new();
    encode_value(TimeBase::seconds(5_000), 9_000, Some(digest), &mut v);
    assert_eq!(
        decode_value(TimeBase::seconds(5_000), &v).unwrap(),
        Held {
            first_seen_ms: 9_000,
            digest: Some(digest)
        }
    );
    // A value written before digests: the varint alone.
    let mut old = Vec::new();
    encode_first_seen(TimeBase::seconds(5_000), 9_000, &mut old);
    assert_eq!(
        decode_value(TimeBase::seconds(5_000), &old).unwrap(),
        Held {
            first_seen_ms: 9_000,
            digest: None
        }
    );
    // One byte too many or too few after the varint, or a zero digest: corrupt, never guessed.
    for bad in [
        [old.clone(), vec![1]].concat(),
        [v.clone(), vec![1]].concat(),
        [old.clone(), vec![0, 0]].concat(),
    ] {
        assert!(
            matches!(
                decode_value(TimeBase::seconds(5_000), &bad),
                Err(LedgerError::CorruptMetadata { .. })
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn digests_are_kept_with_ids_through_buffer_commit_and_reopen() {
    let d = |n: u64| Some(ContentDigest::of_hash(n << 48));
    for durability in [Durability::Wal, Durability::NoWal] {
        let dir = tempfile::tempdir().unwrap();
        let items = [
            (key(1), 10_000, d(1)),
            (key(2), 11_000, None),
            (key(1), 12_000, d(9)),
        ];
        {
            let ledger = Ledger::open(dir.path(), small_options(durability)).unwrap();
            let v = ledger.check_and_record(0, &items, b"p").unwrap();
            // A repeat within the batch answers with the first copy's digest, not its own.
            assert_eq!(
                v[2],
                Verdict::Duplicate {
                    first_seen_ms: 10_000,
                    digest: d(1)
                }
            );
            // From the buffer, then from a committed file.
            for _ in 0..2 {
                let held = ledger.held(&[key(1), key(2), key(3)]).unwrap();
                assert_eq!(
                    held,
                    vec![
                        Some(Held {
                            first_seen_ms: 10_000,
                            digest: d(1)
                        }),
                        Some(Held {
                            first_seen_ms: 11_000,
                            digest: None
                        }),
                        None
                    ]
                );
                ledger.flush().unwrap();
            }
        }
        let ledger = Ledger::open(dir.path(), small_options(durability)).unwrap();
        let v = ledger
            .check_and_record(0, &[(key(2), 20_000, d(2)), (key(1), 20_000, d(1))], b"q")
            .unwrap();
        assert_eq!(
            v,
            vec![
                Verdict::Duplicate {
                    first_seen_ms: 11_000,
                    digest: None
                },
                Verdict::Duplicate {
                    first_seen_ms: 10_000,
                    digest: d(1)
                }
            ],
            "{durability:?}"
        );
    }
}

#[test]
fn batch_verdicts_in_order_with_repeats() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    // The third item repeats the first id, so it is a duplicate of this same batch.
    let v = ledger
        .check_and_record(
            3,
            &[(key(1), 10_000), (key(2), 10_500), (key(1), 11_000)],
            b"p1",
        )
        .unwrap();
    assert_eq!(
        v,
        vec![
            Verdict::New,
            Verdict::New,
            Verdict::Duplicate {
                first_seen_ms: 10_000,
                digest: None
            }
        ]
    );
    // The next batch re-sends id 2 (first seen at 10.5 s, stored at second resolution).
    let v = ledger
        .check_and_record(3, &[(key(2), 20_000), (key(3), 20_000)], b"p2")
        .unwrap();
    assert_eq!(
        v,
        vec![
            Verdict::Duplicate {
                first_seen_ms: 10_000,
                digest: None
            },
            Verdict::New
        ]
    );
    assert_eq!(
        ledger.check(&[key(1), key(4), key(3)]).unwrap(),
        vec![Some(10_000), None, Some(20_000)]
    );
    assert_eq!(ledger.progress(3).unwrap().as_deref(), Some(&b"p2"[..]));
    assert_eq!(ledger.progress(4).unwrap(), None);
    let stats = ledger.stats().unwrap();
    assert_eq!(stats.ids_estimate, 3);
    assert_eq!(stats.oldest_first_seen_ms, Some(10_000));
    assert_eq!(stats.newest_first_seen_ms, Some(20_000));
}

#[test]
fn everything_survives_a_clean_reopen_in_every_mode() {
    for mode in ALL_MODES {
        let dir = tempfile::tempdir().unwrap();
        {
            let ledger = Ledger::open(dir.path(), small_options(mode)).unwrap();
            ledger
                .check_and_record(0, &[(key(1), 1_000)], b"a")
                .unwrap();
            ledger
                .check_and_record(7, &[(key(2), 2_000)], b"b")
                .unwrap();
        }
        let ledger = Ledger::open(dir.path(), small_options(mode)).unwrap();
        assert_eq!(
            ledger.check(&[key(1), key(2), key(3)]).unwrap(),
            vec![Some(1_000), Some(2_000), None],
            "{mode:?}"
        );
        let all = ledger.all_progress().unwrap();
        assert_eq!(
            all,
            BTreeMap::from([(0, b"a".to_vec()), (7, b"b".to_vec())])
        );
    }
}

#[test]
fn empty_ledger_reports_no_window() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    assert_eq!(ledger.window(0, 1_000_000), None);
    assert_eq!(ledger.window_overall(1_000_000), None);
    // A batch of only progress (no ids) holds no window either.
    ledger
        .check_and_record::<(LedgerKey, i64)>(0, &[], b"x")
        .unwrap();
    assert_eq!(ledger.window(0, 1_000_000), None);
    ledger
        .check_and_record(0, &[(key(1), 400_000)], b"y")
        .unwrap();
    assert_eq!(
        ledger.window(0, 1_000_000),
        Some(Duration::from_millis(600_000))
    );
    assert_eq!(ledger.window(1, 1_000_000), None);
    assert_eq!(
        ledger.window_overall(1_000_000),
        Some(Duration::from_millis(600_000))
    );
}

#[test]
fn a_seal_waits_for_a_large_buffer_to_be_committed_in_the_background_instead_of_writing_it_under_the_lock(
) {
    let dir = tempfile::tempdir().unwrap();
    // A buffer that holds every id of the generation: the seal finds them all buffered.
    let options = LedgerOptions {
        seal_after_ids: Some(100_000),
        write_buffer_bytes: 256 << 20,
        ..small_options(Durability::Wal)
    };
    let ledger = Ledger::open(dir.path(), options).unwrap();
    let batch = |b: u64| -> Vec<(LedgerKey, i64)> {
        (0..4096).map(|i| (key(b * 4096 + i), b as i64)).collect()
    };
    let mut b = 0;
    while ledger.generations().unwrap()[0].meta.ids < 100_000 {
        ledger
            .check_and_record(0, &batch(b), &b.to_le_bytes())
            .unwrap();
        b += 1;
    }
    // The batch that filled the generation started committing its buffer and left it active.
    {
        let state = ledger.lock();
        assert_eq!(state.generations.len(), 1, "sealed at once");
        let in_flight = state
            .in_flight
            .as_ref()
            .expect("the buffer is being committed");
        assert!(
            in_flight.ids.len() >= 100_000 - 4096,
            "{} ids in flight",
            in_flight.ids.len()
        );
        assert!(state.pending.is_empty());
    }
    // A later batch seals it, once that commit is in, writing only its own ids under the lock.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while ledger.generations().unwrap().len() == 1 {
        assert!(std::time::Instant::now() < deadline, "never sealed");
        std::thread::sleep(Duration::from_millis(20));
        ledger
            .check_and_record(0, &batch(b), &b.to_le_bytes())
            .unwrap();
        b += 1;
    }
    let generations = ledger.generations().unwrap();
    assert!(generations[0].meta.sealed);
    assert_eq!(
        generations[0].meta.ids,
        b * 4096,
        "every batch up to the seal went into the sealed generation"
    );
    let keys: Vec<LedgerKey> = (0..b * 4096).map(key).collect();
    assert!(ledger.check(&keys).unwrap().iter().all(Option::is_some));
    // The next one goes into the new generation.
    ledger
        .check_and_record(0, &batch(b), &b.to_le_bytes())
        .unwrap();
    assert_eq!(ledger.generations().unwrap()[1].meta.ids, 4096);
}

/// A ledger that seals every 100 ids and has room for about three such generations.
fn aging_options() -> LedgerOptions {
    LedgerOptions {
        seal_after_ids: Some(100),
        budget_bytes: 3 * 100 * DEFAULT_BYTES_PER_ID_ESTIMATE + 10,
        generations: 3,
        ..small_options(Durability::Wal)
    }
}

#[test]
fn aging_drops_oldest_generations_whole_and_shrinks_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path(), aging_options()).unwrap();
    // Ten batches of 100 ids, one second apart: each batch fills and seals a generation.
    for b in 0..10u64 {
        let items: Vec<_> = (0..100)
            .map(|i| (key(b * 100 + i), (b as i64) * 1_000))
            .collect();
        ledger
            .check_and_record(0, &items, &b.to_le_bytes())
            .unwrap();
    }
    let generations = ledger.generations().unwrap();
    assert!(generations.len() <= 4, "{} generations", generations.len());
    let oldest = generations.iter().find(|g| g.meta.ids > 0).unwrap();
    let held_from = oldest.meta.partitions[&0].first_seen_ms;
    assert!(held_from > 0, "the first generations were forgotten");
    // Ids of forgotten generations are new again; the newest are still duplicates.
    assert_eq!(ledger.check(&[key(0)]).unwrap(), vec![None]);
    assert_eq!(ledger.check(&[key(999)]).unwrap(), vec![Some(9_000)]);
    // The window covers exactly what is held.
    assert_eq!(
        ledger.window(0, 20_000),
        Some(Duration::from_millis((20_000 - held_from) as u64))
    );
    // Generation ids are consecutive and the oldest went first.
    let ids: Vec<u64> = generations.iter().map(|g| g.meta.id).collect();
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
    assert_eq!(*ids.last().unwrap(), 11);
    // Same after reopening.
    drop(ledger);
    let ledger = Ledger::open(
        dir.path(),
        LedgerOptions {
            seal_after_ids: Some(100),
            ..small_options(Durability::Wal)
        },
    )
    .unwrap();
    assert_eq!(
        ledger
            .generations()
            .unwrap()
            .iter()
            .map(|g| g.meta.id)
            .collect::<Vec<_>>(),
        ids
    );
    assert_eq!(
        ledger.window(0, 20_000),
        Some(Duration::from_millis((20_000 - held_from) as u64))
    );
}

#[test]
fn garbage_in_current_is_an_open_error_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    drop(Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap());
    std::fs::write(dir.path().join("CURRENT"), b"garbage\n").unwrap();
    match Ledger::open(dir.path(), small_options(Durability::Wal)) {
        Err(LedgerError::Open { path, source }) => {
            assert_eq!(path, dir.path());
            assert!(!source.to_string().is_empty());
        }
        Err(other) => panic!("expected an open error, got {other}"),
        Ok(_) => panic!("a ledger with a garbage CURRENT file opened"),
    }
    // The garbage is still there: nothing was deleted or recreated.
    assert_eq!(
        std::fs::read(dir.path().join("CURRENT")).unwrap(),
        b"garbage\n"
    );
}

#[test]
fn truncated_manifest_is_an_open_error_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    {
        let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
        ledger.check_and_record(0, &[(key(1), 1)], b"p").unwrap();
        // Left as a crash leaves it (a clean close commits and flushes, and a MANIFEST that
        // then holds more edits can be cut at a record boundary that RocksDB cannot tell from
        // a torn tail: see docs/testing.md, "What was checked, and what was not").
        ledger.drop_without_closing();
    }
    let current = std::fs::read_to_string(dir.path().join("CURRENT")).unwrap();
    let manifest = dir.path().join(current.trim());
    let bytes = std::fs::read(&manifest).unwrap();
    std::fs::write(&manifest, &bytes[..bytes.len() / 3]).unwrap();
    let before = std::fs::read_dir(dir.path()).unwrap().count();
    let err = Ledger::open(dir.path(), small_options(Durability::Wal))
        .err()
        .expect("opened a truncated MANIFEST");
    // RocksDB refuses the MANIFEST, or reads a prefix of it that lacks the ledger's column
    // families: either way the ledger is refused and named.
    assert!(
        matches!(&err, LedgerError::Open { path, .. } | LedgerError::NotALedger { path, .. } if path == dir.path()),
        "{err}"
    );
    assert!(err.to_string().contains(&dir.path().display().to_string()));
    assert_eq!(std::fs::read(&manifest).unwrap().len(), bytes.len() / 3);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), before);
}

#[test]
fn a_directory_that_is_not_a_ledger_is_refused_and_untouched() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
    let err = Ledger::open(dir.path(), small_options(Durability::Wal))
        .err()
        .unwrap();
    assert!(matches!(err, LedgerError::NotALedger { .. }), "{err}");
    assert_eq!(
        std::fs::read(dir.path().join("notes.txt")).unwrap(),
        b"mine"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn a_version_1_ledger_is_read_and_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    {
        let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
        ledger.check_and_record(0, &[(key(1), 1000)], b"p").unwrap();
        ledger.flush().unwrap();
        let meta = ledger.cf(CF_META).unwrap();
        ledger
            .db
            .put_cf(&meta, META_FORMAT_VERSION, 1u32.to_le_bytes())
            .unwrap();
    }
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    assert_eq!(ledger.check(&[key(1)]).unwrap(), vec![Some(1000)]);
    assert_eq!(ledger.progress(0).unwrap(), Some(b"p".to_vec()));
    let meta = ledger.cf(CF_META).unwrap();
    let marker = ledger
        .db
        .get_cf(&meta, META_FORMAT_VERSION)
        .unwrap()
        .unwrap();
    assert_eq!(marker, SECONDS_FORMAT_VERSION.to_le_bytes());
}

#[test]
fn a_version_2_ledger_without_digests_opens_and_works() {
    // What version 2 wrote: values without digests, batch log records without them (written here
    // by hand), the marker 2. Its ids answer with no digest; new ones keep theirs.
    let dir = tempfile::tempdir().unwrap();
    {
        let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
        ledger.check_and_record(0, &[(key(1), 1000)], b"p").unwrap();
        ledger.flush().unwrap();
        let meta = ledger.cf(CF_META).unwrap();
        ledger
            .db
            .put_cf(&meta, META_FORMAT_VERSION, 2u32.to_le_bytes())
            .unwrap();
    }
    {
        let logs: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with("batches-")
            })
            .collect();
        assert_eq!(logs.len(), 1, "{logs:?}");
        let mut payload = Vec::new();
        payload.extend_from_slice(&0i32.to_le_bytes());
        payload.extend_from_slice(&1000i64.to_le_bytes());
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.extend_from_slice(b"q");
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.extend_from_slice(&key(2).0);
        payload.extend_from_slice(&2000i64.to_le_bytes());
        let mut record = (payload.len() as u32).to_le_bytes().to_vec();
        record.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&payload).to_le_bytes());
        record.extend_from_slice(&payload);
        std::fs::write(&logs[0], &record).unwrap();
    }
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    let none = |t| {
        Some(Held {
            first_seen_ms: t,
            digest: None,
        })
    };
    assert_eq!(
        ledger.held(&[key(1), key(2)]).unwrap(),
        vec![none(1000), none(2000)]
    );
    assert_eq!(ledger.progress(0).unwrap(), Some(b"q".to_vec()));
    let digest = Some(ContentDigest::of_hash(0x77 << 48));
    let v = ledger
        .check_and_record(0, &[(key(1), 3000, digest), (key(3), 3000, digest)], b"r")
        .unwrap();
    assert_eq!(
        v,
        vec![
            Verdict::Duplicate {
                first_seen_ms: 1000,
                digest: None
            },
            Verdict::New
        ]
    );
    assert_eq!(
        ledger.held(&[key(3)]).unwrap(),
        vec![Some(Held {
            first_seen_ms: 3000,
            digest
        })]
    );
    let meta = ledger.cf(CF_META).unwrap();
    assert_eq!(
        ledger
            .db
            .get_cf(&meta, META_FORMAT_VERSION)
            .unwrap()
            .unwrap(),
        SECONDS_FORMAT_VERSION.to_le_bytes()
    );
}

#[test]
fn unknown_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
        let meta = ledger.cf(CF_META).unwrap();
        ledger
            .db
            .put_cf(&meta, META_FORMAT_VERSION, 99u32.to_le_bytes())
            .unwrap();
    }
    let err = Ledger::open(dir.path(), small_options(Durability::Wal))
        .err()
        .unwrap();
    assert!(
        matches!(err, LedgerError::UnknownFormat { found: 99 }),
        "{err}"
    );
    // The refusal names both versions and what to do.
    let said = err.to_string();
    for words in [
        "format version 99",
        &format!("this build ({})", crate::VERSION),
        "reads versions 1 to",
        "move the ledger directory aside",
        "Rolling back",
    ] {
        assert!(said.contains(words), "{said}");
    }
}

#[test]
fn checkpoint_opens_and_restores() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("live"), small_options(Durability::NoWal)).unwrap();
    ledger
        .check_and_record(1, &[(key(1), 5_000)], b"one")
        .unwrap();
    let cp = dir.path().join("cp");
    let progress = ledger.checkpoint(&cp).unwrap();
    assert_eq!(progress, BTreeMap::from([(1, b"one".to_vec())]));
    // Writes after the checkpoint are not in it.
    ledger
        .check_and_record(1, &[(key(2), 6_000)], b"two")
        .unwrap();
    // Restoring refuses a non-empty target unless told.
    let target = dir.path().join("restored");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("keep"), b"x").unwrap();
    let err = Ledger::restore_from(&cp, &target, false).err().unwrap();
    assert!(matches!(err, LedgerError::TargetNotEmpty { .. }), "{err}");
    assert!(target.join("keep").exists());
    Ledger::restore_from(&cp, &target, true).unwrap();
    for path in [&cp, &target] {
        let copy = Ledger::open(path, small_options(Durability::NoWal)).unwrap();
        assert_eq!(
            copy.check(&[key(1), key(2)]).unwrap(),
            vec![Some(5_000), None]
        );
        assert_eq!(copy.progress(1).unwrap().as_deref(), Some(&b"one"[..]));
    }
}

#[test]
fn generation_tags_wrap_around_without_losing_count_of_the_index() {
    let dir = memory_dir();
    let options = LedgerOptions {
        seal_after_ids: Some(4),
        // A few small files' worth: a handful of generations stay live.
        budget_bytes: 16 << 10,
        generations: 2,
        ..small_options(Durability::NoWal)
    };
    let ledger = Ledger::open(dir.path(), options).unwrap();
    // 300 generations of 4 ids: the 256 tags are all reused once.
    for g in 0..300u64 {
        let items: Vec<_> = (0..4).map(|i| (key(g * 4 + i), g as i64 * 1000)).collect();
        let verdicts = ledger.check_and_record(0, &items, b"p").unwrap();
        assert!(
            verdicts.iter().all(|v| *v == Verdict::New),
            "generation {g}: {verdicts:?}"
        );
    }
    let stats = ledger.stats().unwrap();
    assert!(
        ledger.generations().unwrap()[0].meta.id > 256,
        "tags did not wrap"
    );
    assert_eq!(stats.index_overflowed_buckets, 0);
    assert_eq!(
        stats.index_ids, stats.ids_estimate,
        "index slots of dropped generations leaked"
    );
    // Batch g went into generation g + 1. The live generations' ids are known; the first
    // generations' ids, whose tags were reused, are not.
    let live: Vec<u64> = ledger
        .generations()
        .unwrap()
        .iter()
        .filter(|g| g.meta.ids > 0)
        .map(|g| g.meta.id)
        .collect();
    assert!(!live.is_empty());
    for id in live {
        let held = ledger
            .check(&[key((id - 1) * 4), key((id - 1) * 4 + 3)])
            .unwrap();
        assert!(
            held.iter().all(Option::is_some),
            "generation {id}: {held:?}"
        );
    }
    let oldest = ledger.check(&[key(0), key(1)]).unwrap();
    assert_eq!(oldest, vec![None, None]);
}

#[test]
fn a_ledger_opened_without_its_index_still_answers_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let options = LedgerOptions {
        seal_after_ids: Some(1_000),
        ..small_options(Durability::Wal)
    };
    let ledger = Ledger::open(dir.path(), options.clone()).unwrap();
    let items: Vec<_> = (0..3_000).map(|i| (key(i), 0)).collect();
    ledger.check_and_record(0, &items[..1_500], b"a").unwrap();
    ledger.check_and_record(0, &items[1_500..], b"b").unwrap();
    drop(ledger);
    let ledger = Ledger::open(
        dir.path(),
        LedgerOptions {
            build_index: false,
            ..options
        },
    )
    .unwrap();
    let stats = ledger.stats().unwrap();
    assert_eq!((stats.index_ids, stats.ids_estimate), (0, 3_000));
    let held = ledger
        .check(&[key(0), key(1_499), key(2_999), key(5_000)])
        .unwrap();
    assert!(held[..3].iter().all(Option::is_some), "{held:?}");
    assert_eq!(held[3], None);
    let verdicts = ledger
        .check_and_record(0, &[(key(10), 0), (key(6_000), 0)], b"c")
        .unwrap();
    assert_eq!(verdicts[1], Verdict::New);
    assert!(matches!(verdicts[0], Verdict::Duplicate { .. }));
}

#[test]
fn live_generations_stay_fewer_than_the_index_tags() {
    let dir = memory_dir();
    let options = LedgerOptions {
        seal_after_ids: Some(1),
        // Room for far more than 256 one-id generations.
        budget_bytes: 1 << 30,
        ..small_options(Durability::NoWal)
    };
    // The cap itself is below the 256 tags; a few generations past it show the cap is kept.
    // Each generation made rewrites the store's options file, whose cost grows with the live
    // generations: going only a little past the cap keeps the test short.
    const _: () = assert!(MAX_LIVE_GENERATIONS < 256);
    let made = MAX_LIVE_GENERATIONS as u64 + 10;
    let ledger = Ledger::open(dir.path(), options).unwrap();
    for n in 0..made {
        ledger.check_and_record(0, &[(key(n), 0)], b"").unwrap();
    }
    let live = ledger.generations().unwrap();
    assert!(
        live.len() <= MAX_LIVE_GENERATIONS,
        "{} live generations",
        live.len()
    );
    assert_eq!(ledger.check(&[key(made - 1)]).unwrap(), vec![Some(0)]);
    assert_eq!(ledger.check(&[key(0)]).unwrap(), vec![None]);
}

#[test]
fn new_ids_are_answered_by_the_index_without_disk_lookups() {
    let dir = tempfile::tempdir().unwrap();
    let options = LedgerOptions {
        seal_after_ids: Some(20_000),
        ..small_options(Durability::Wal)
    };
    let ledger = Ledger::open(dir.path(), options).unwrap();
    for batch in 0..25u64 {
        let items: Vec<_> = (0..4_000).map(|i| (key(batch * 4_000 + i), 0)).collect();
        ledger.check_and_record(0, &items, b"").unwrap();
    }
    assert!(ledger.generations().unwrap().len() >= 5);
    let before = ledger.stats().unwrap().disk_lookups;
    // 1,000 new ids and 100 held ones, spread over the sealed generations (the active one is
    // still buffered in memory).
    let mut items: Vec<_> = (1_000_000..1_001_000).map(|i| (key(i), 0)).collect();
    items.extend((0..100).map(|i| (key(i * 797), 0)));
    let verdicts = ledger.check_and_record(0, &items, b"").unwrap();
    assert_eq!(
        verdicts.iter().filter(|v| **v == Verdict::New).count(),
        1_000
    );
    let looked_up = ledger.stats().unwrap().disk_lookups - before;
    // The 100 held ids, each in the one generation holding it, plus a few collisions.
    assert!((100..110).contains(&looked_up), "{looked_up} disk lookups");
}

#[test]
fn filters_are_used() {
    // Explicit column family descriptors keep the table options (filters): after a flush,
    // table readers hold filter memory.
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path(), small_options(Durability::NoWal)).unwrap();
    let items: Vec<_> = (0..10_000).map(|i| (key(i), 0)).collect();
    ledger.check_and_record(0, &items, b"").unwrap();
    ledger.flush().unwrap();
    drop(ledger);
    let ledger = Ledger::open(dir.path(), small_options(Durability::NoWal)).unwrap();
    let stats = ledger.stats().unwrap();
    assert!(stats.filter_bytes >= 10_000 * 6 / 8, "{stats:?}");
}

#[test]
fn the_stored_index_is_loaded_after_a_clean_close_and_carried_by_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let options = LedgerOptions {
        seal_after_ids: Some(1_000),
        ..small_options(Durability::Wal)
    };
    let ledger = Ledger::open(dir.path().join("l"), options.clone()).unwrap();
    assert_eq!(ledger.open_report().index, IndexSource::Empty);
    // Not sealed yet: no file, so the checkpoint writes one (and links it into the live directory).
    ledger
        .check_and_record(
            0,
            &(0..500).map(|i| (key(i), 1_000)).collect::<Vec<_>>(),
            b"p",
        )
        .unwrap();
    let early = dir.path().join("checkpoint-0");
    ledger.checkpoint(&early).unwrap();
    // Seals: the index is stored after the seal, in the background.
    let items: Vec<_> = (500..5_500).map(|i| (key(i), 1_000)).collect();
    ledger.check_and_record(0, &items, b"p").unwrap();
    ledger.wait_for_index_store();
    let checkpoint = dir.path().join("checkpoint");
    ledger.checkpoint(&checkpoint).unwrap();
    assert!(
        checkpoint.join(INDEX_FILE).exists(),
        "the checkpoint carries the index"
    );
    let second = dir.path().join("checkpoint-2");
    ledger.checkpoint(&second).unwrap();
    let inode = |p: &std::path::Path| {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p.join(INDEX_FILE)).unwrap())
    };
    assert_eq!(
        inode(&checkpoint),
        inode(&dir.path().join("l")),
        "the checkpoint links the live index file, not a copy written under the lock"
    );
    assert_eq!(
        inode(&second),
        inode(&dir.path().join("l")),
        "the second checkpoint links the live index file"
    );
    drop(ledger);
    // The file the first checkpoint wrote itself vouches for every generation.
    let ledger = Ledger::open_existing(&early, options.clone()).unwrap();
    assert_eq!(ledger.open_report().index, IndexSource::Loaded);
    assert_eq!(ledger.stats().unwrap().index_ids, 500);
    assert!(ledger
        .check(&(0..500).map(key).collect::<Vec<_>>())
        .unwrap()
        .iter()
        .all(Option::is_some));
    assert!(ledger
        .check(&(500..5_500).map(key).collect::<Vec<_>>())
        .unwrap()
        .iter()
        .all(Option::is_none));
    drop(ledger);
    let expected = |path: &std::path::Path| {
        if path.ends_with("l") {
            // The close stored the whole index.
            IndexSource::Loaded
        } else {
            // The file stored after the seal names only the sealed generation; the active one
            // (empty here) is read from disk.
            IndexSource::Partial
        }
    };
    for path in [dir.path().join("l"), checkpoint, second] {
        let ledger = Ledger::open_existing(&path, options.clone()).unwrap();
        assert_eq!(
            ledger.open_report().index,
            expected(&path),
            "{}",
            path.display()
        );
        let stats = ledger.stats().unwrap();
        assert_eq!((stats.index_ids, stats.disk_lookups), (5_500, 0));
        let held: Vec<_> = (0..5_500).map(key).collect();
        assert!(ledger.check(&held).unwrap().iter().all(Option::is_some));
        let new: Vec<_> = (10_000..20_000).map(key).collect();
        assert!(ledger.check(&new).unwrap().iter().all(Option::is_none));
    }
}

#[test]
fn a_stale_index_vouches_only_for_generations_sealed_when_it_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let options = LedgerOptions {
        seal_after_ids: Some(1_000),
        ..small_options(Durability::Wal)
    };
    let batch = |from: u64, to: u64| -> Vec<(LedgerKey, i64)> {
        (from..to).map(|i| (key(i), 1_000)).collect()
    };
    let ledger = Ledger::open(dir.path(), options.clone()).unwrap();
    ledger.check_and_record(0, &batch(0, 2_500), b"1").unwrap();
    drop(ledger);
    // The file of this close: the first generation (sealed: the batch filled it) and the next,
    // active one.
    let old = std::fs::read(dir.path().join(INDEX_FILE)).unwrap();
    let ledger = Ledger::open(dir.path(), options.clone()).unwrap();
    // More ids go into the generation that was active, which seals, and a newer one starts.
    ledger
        .check_and_record(0, &batch(2_500, 4_200), b"2")
        .unwrap();
    drop(ledger);
    // As after a crash long after the first close: the stored file is the old one.
    std::fs::write(dir.path().join(INDEX_FILE), &old).unwrap();
    let ledger = Ledger::open(dir.path(), options.clone()).unwrap();
    assert_eq!(ledger.open_report().index, IndexSource::Partial);
    let held: Vec<_> = (0..4_200).map(key).collect();
    assert!(
        ledger.check(&held).unwrap().iter().all(Option::is_some),
        "every id is still held"
    );
    assert_eq!(ledger.stats().unwrap().index_ids, 4_200);
    let verdicts = ledger
        .check_and_record(0, &batch(4_100, 4_300), b"3")
        .unwrap();
    assert_eq!(verdicts.iter().filter(|v| **v == Verdict::New).count(), 100);
}

#[test]
fn the_index_stored_in_the_background_after_a_seal_never_vouches_for_ids_it_lacks() {
    // A table of ~170 MB (21 pieces), so that the batches below are recorded while the store
    // after each seal is copying it out.
    let options = LedgerOptions {
        seal_after_ids: Some(2_000),
        index_capacity_ids: Some(50_000_000),
        ..small_options(Durability::Wal)
    };
    let batch = |from: u64, to: u64| -> Vec<(LedgerKey, i64)> {
        (from..to).map(|i| (key(i), 1_000)).collect()
    };
    let storing = |dir: &std::path::Path| {
        std::fs::read_dir(dir).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("id-index.storing.")
        })
    };
    for mode in ["crash while storing", "crash after the store"] {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), options.clone()).unwrap();
        let mut next = 0;
        let mut seen_storing = 0;
        for _ in 0..3 {
            // Fills and seals the active generation: a store starts.
            ledger
                .check_and_record(0, &batch(next, next + 2_000), b"p")
                .unwrap();
            next += 2_000;
            // Its temporary file appears once it has read the header; the table takes longer.
            let started = std::time::Instant::now();
            while !storing(dir.path()) && started.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            seen_storing += usize::from(storing(dir.path()));
            // Recorded while the store copies the table (new ids in the generation now active).
            for _ in 0..4 {
                ledger
                    .check_and_record(0, &batch(next, next + 100), b"p")
                    .unwrap();
                next += 100;
            }
            if mode == "crash after the store" {
                ledger.wait_for_index_store();
                assert!(dir.path().join(INDEX_FILE).exists(), "{mode}");
            }
        }
        assert!(
            seen_storing > 0,
            "{mode}: no store was seen running while ids were recorded"
        );
        ledger
            .check_and_record(0, &batch(next, next + 300), b"p")
            .unwrap();
        next += 300;
        ledger.drop_without_closing();
        let ledger = Ledger::open(dir.path(), options.clone()).unwrap();
        if mode == "crash after the store" {
            // The active generation (ids recorded since the last seal) is read from disk.
            assert_eq!(ledger.open_report().index, IndexSource::Partial, "{mode}");
        }
        assert_eq!(
            ledger.stats().unwrap().index_ids,
            next,
            "{mode}: every id once in the index"
        );
        let held: Vec<_> = (0..next).map(key).collect();
        assert!(
            ledger.check(&held).unwrap().iter().all(Option::is_some),
            "{mode}: every id is still held"
        );
        let new: Vec<_> = (100_000..110_000).map(key).collect();
        assert!(
            ledger.check(&new).unwrap().iter().all(Option::is_none),
            "{mode}"
        );
        let verdicts = ledger
            .check_and_record(0, &batch(next - 50, next + 50), b"p")
            .unwrap();
        assert_eq!(
            verdicts.iter().filter(|v| **v == Verdict::New).count(),
            50,
            "{mode}"
        );
    }
}

#[test]
fn index_files_half_written_by_a_crash_are_removed_when_the_ledger_opens() {
    let dir = tempfile::tempdir().unwrap();
    let options = small_options(Durability::Wal);
    let ledger = Ledger::open(dir.path(), options.clone()).unwrap();
    ledger
        .check_and_record(0, &[(key(1), 1_000)], b"p")
        .unwrap();
    drop(ledger);
    for name in ["id-index.partial", "id-index.storing.7"] {
        std::fs::write(dir.path().join(name), vec![7u8; 10_000]).unwrap();
    }
    let ledger = Ledger::open(dir.path(), options).unwrap();
    assert_eq!(ledger.open_report().index, IndexSource::Loaded);
    for name in ["id-index.partial", "id-index.storing.7"] {
        assert!(!dir.path().join(name).exists(), "{name} is left");
    }
    assert!(ledger.check(&[key(1)]).unwrap()[0].is_some());
}

#[test]
fn a_corrupt_truncated_or_missing_index_file_is_rebuilt() {
    let options = small_options(Durability::Wal);
    for damage in [
        Damage::Delete,
        Damage::Truncate(0),
        Damage::Truncate(500),
        Damage::Truncate(999),
        Damage::Flip(3),
        Damage::Flip(40),
        Damage::Flip(100_000),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), options.clone()).unwrap();
        let items: Vec<_> = (0..3_000).map(|i| (key(i), 1_000)).collect();
        ledger.check_and_record(0, &items, b"p").unwrap();
        drop(ledger);
        damage_index(dir.path(), damage, None);
        let ledger = Ledger::open(dir.path(), options.clone()).unwrap();
        assert_eq!(
            ledger.open_report().index,
            IndexSource::Rebuilt,
            "{damage:?}"
        );
        assert_eq!(ledger.stats().unwrap().index_ids, 3_000, "{damage:?}");
        let held: Vec<_> = (0..3_000).map(key).collect();
        assert!(
            ledger.check(&held).unwrap().iter().all(Option::is_some),
            "{damage:?}"
        );
        let new: Vec<_> = (5_000..8_000).map(key).collect();
        assert!(
            ledger.check(&new).unwrap().iter().all(Option::is_none),
            "{damage:?}"
        );
    }
}

// ---- model-based property test -------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Batch {
        partition: Partition,
        ids: Vec<u8>,
        time_step: i64,
    },
    /// A bulk load of a partition's ids (a partition moved here), with its progress record.
    Load {
        partition: Partition,
        ids: Vec<u8>,
        time_step: i64,
    },
    Reopen,
    /// Close, do this to the stored id index, reopen.
    ReopenWith(Damage),
}

/// What happens to the id index file between a close and the next open.
#[derive(Debug, Clone, Copy)]
enum Damage {
    Delete,
    /// Cut to this many thousandths of its length.
    Truncate(u16),
    /// One byte inverted, at this position modulo the length.
    Flip(u32),
    /// The file of the first close put back: stale, as after a crash long after that close.
    Stale,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0i32..3, prop::collection::vec(0u8..80, 0..24), 0i64..3_000)
            .prop_map(|(partition, ids, time_step)| Op::Batch { partition, ids, time_step }),
        2 => (0i32..3, prop::collection::vec(0u8..80, 0..40), 0i64..3_000)
            .prop_map(|(partition, ids, time_step)| Op::Load { partition, ids, time_step }),
        1 => Just(Op::Reopen),
        1 => prop_oneof![
            Just(Damage::Delete),
            (0u16..1000).prop_map(Damage::Truncate),
            any::<u32>().prop_map(Damage::Flip),
            Just(Damage::Stale),
        ]
        .prop_map(Op::ReopenWith),
    ]
}

/// Applies `damage` to the index file in `dir`; `first` is the file of the first close.
fn damage_index(dir: &Path, damage: Damage, first: Option<&Vec<u8>>) {
    let path = dir.join(INDEX_FILE);
    let Ok(mut bytes) = std::fs::read(&path) else {
        return;
    };
    match damage {
        Damage::Delete => {
            std::fs::remove_file(&path).unwrap();
            return;
        }
        Damage::Truncate(thousandths) => {
            bytes.truncate(bytes.len() * usize::from(thousandths) / 1000)
        }
        Damage::Flip(at) => {
            let i = at as usize % bytes.len();
            bytes[i] = !bytes[i];
        }
        Damage::Stale => match first {
            Some(old) => bytes = old.clone(),
            None => return,
        },
    }
    std::fs::write(&path, bytes).unwrap();
}

fn mode() -> impl Strategy<Value = Durability> {
    prop_oneof![
        Just(Durability::SyncWal),
        Just(Durability::Wal),
        Just(Durability::NoWal)
    ]
}

/// The reference model: a set of held ids with the generation each was recorded into, and
/// the same aging rule (whole generations, oldest first, as the ledger reports them).
#[derive(Default)]
struct Model {
    held: HashMap<LedgerKey, (u64, Partition, i64)>,
    forgotten_through: HashMap<Partition, i64>,
    live: Vec<u64>,
    /// Per generation, the ids a load into it brought that were already held (earlier in the
    /// load, or before it, in any generation). Such an id is counted again in the generation's
    /// id count, and may have a second slot in the index (a load reads only an id's first
    /// bucket; the older copy may sit in its second, or under an older generation's tag) until
    /// the older copy's generation ages out. Room, never an answer.
    loaded_again: HashMap<u64, u64>,
    /// The earlier copies (generation, partition, first-seen time) of ids a load recorded again,
    /// while their generations live: a lookup may find either copy, and each is a true sighting;
    /// each also keeps its partition's window open.
    earlier: HashMap<LedgerKey, Vec<(u64, Partition, i64)>>,
}

fn run_model(
    mode: Durability,
    seal_after: u64,
    index_capacity_ids: Option<u64>,
    write_buffer_bytes: usize,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let dir = memory_dir();
    let options = LedgerOptions {
        seal_after_ids: Some(seal_after),
        // A tiny budget: a few generations' worth, so aging happens often.
        budget_bytes: 3 * seal_after * DEFAULT_BYTES_PER_ID_ESTIMATE,
        generations: 3,
        // Sometimes far too small an index: answers must stay exact when it overflows.
        index_capacity_ids,
        // Sometimes a buffer of a few batches: commits run in the background while batches
        // are recorded, and reopens find them in flight.
        write_buffer_bytes,
        ..small_options(mode)
    };
    let mut ledger = Ledger::open(dir.path(), options.clone()).unwrap();
    let mut model = Model::default();
    let mut now = 0i64;
    let mut progress: HashMap<Partition, Vec<u8>> = HashMap::new();
    let mut first_index: Option<Vec<u8>> = None;
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Reopen => {
                drop(ledger);
                first_index =
                    first_index.or_else(|| std::fs::read(dir.path().join(INDEX_FILE)).ok());
                ledger = Ledger::open(dir.path(), options.clone()).unwrap();
                // Closed cleanly: the stored index vouches for every generation.
                prop_assert!(
                    matches!(
                        ledger.open_report().index,
                        IndexSource::Loaded | IndexSource::Empty
                    ),
                    "{:?}",
                    ledger.open_report()
                );
            }
            Op::ReopenWith(damage) => {
                drop(ledger);
                first_index =
                    first_index.or_else(|| std::fs::read(dir.path().join(INDEX_FILE)).ok());
                damage_index(dir.path(), damage, first_index.as_ref());
                ledger = Ledger::open(dir.path(), options.clone()).unwrap();
                if !matches!(damage, Damage::Stale) {
                    prop_assert!(
                        matches!(
                            ledger.open_report().index,
                            IndexSource::Rebuilt | IndexSource::Empty
                        ),
                        "{:?} after {:?}",
                        ledger.open_report(),
                        damage
                    );
                }
            }
            Op::Batch {
                partition,
                ids,
                time_step,
            } => {
                now += time_step;
                let record = format!("step {step}").into_bytes();
                model.batch(&ledger, &options, partition, &ids, now, &record)?;
                progress.insert(partition, record);
            }
            Op::Load {
                partition,
                ids,
                time_step,
            } => {
                now += time_step;
                let record = format!("step {step}").into_bytes();
                model.load(&ledger, &options, partition, &ids, now, &record)?;
                progress.insert(partition, record);
            }
        }
        model.check(&ledger, &progress, now)?;
    }
    Ok(())
}

impl Model {
    /// Records a batch of `ids` at `now` with the progress record `record`: each verdict is what
    /// the model says, the model learns the new ids, and forgets what the ledger aged out.
    fn batch(
        &mut self,
        ledger: &Ledger,
        options: &LedgerOptions,
        partition: Partition,
        ids: &[u8],
        now: i64,
        record: &[u8],
    ) -> Result<(), TestCaseError> {
        let before = ledger.generations().unwrap();
        let active = before.last().unwrap();
        let base = active.meta.time_base().unwrap_or(TimeBase {
            base_ms: now,
            resolution_ms: active.meta.resolution_ms,
        });
        let bases: HashMap<u64, TimeBase> = before
            .iter()
            .filter_map(|g| g.meta.time_base().map(|b| (g.meta.id, b)))
            .collect();
        let items: Vec<_> = ids.iter().map(|&i| (key(u64::from(i)), now)).collect();
        let verdicts = ledger.check_and_record(partition, &items, record).unwrap();
        for ((k, t), verdict) in items.iter().zip(&verdicts) {
            // New, or a duplicate seen when its latest copy was, or an earlier copy a load left.
            let expected: Vec<Verdict> = match self.held.get(k) {
                Some(&(gen, _, first)) => {
                    let seen = |gen: u64, first: i64| Verdict::Duplicate {
                        first_seen_ms: stored_first_seen_ms(
                            bases.get(&gen).copied().unwrap_or(base),
                            first,
                        ),
                        digest: None,
                    };
                    let earlier = self
                        .earlier
                        .get(k)
                        .into_iter()
                        .flatten()
                        .map(|&(g, _, f)| seen(g, f));
                    std::iter::once(seen(gen, first)).chain(earlier).collect()
                }
                None => {
                    self.held.insert(*k, (active.meta.id, partition, *t));
                    vec![Verdict::New]
                }
            };
            prop_assert!(
                expected.contains(verdict),
                "{:?} for {:?}, expected one of {:?}",
                verdict,
                k,
                expected
            );
        }
        self.age(ledger, options)
    }

    /// Loads `ids` in bulk at `now` with the progress record `record`: they are held in the
    /// generation the load went into, those held before included (the newer copy is the one a
    /// lookup finds).
    fn load(
        &mut self,
        ledger: &Ledger,
        options: &LedgerOptions,
        partition: Partition,
        ids: &[u8],
        now: i64,
        record: &[u8],
    ) -> Result<(), TestCaseError> {
        let items: Vec<_> = ids.iter().map(|&i| (key(u64::from(i)), now)).collect();
        let mut load = ledger.begin_load(partition);
        load.add(&items).unwrap();
        load.reserve(items.len() as u64).unwrap();
        let into = ledger.generations().unwrap().last().unwrap().meta.id;
        load.finish(record, WindowFloor::Keep).unwrap();
        for (k, t) in items {
            if let Some((g, p, first)) = self.held.insert(k, (into, partition, t)) {
                *self.loaded_again.entry(into).or_default() += 1;
                self.earlier.entry(k).or_default().push((g, p, first));
            }
        }
        self.age(ledger, options)
    }

    /// Applies the aging the ledger did: only whole generations, oldest first.
    fn age(&mut self, ledger: &Ledger, options: &LedgerOptions) -> Result<(), TestCaseError> {
        let after: Vec<u64> = ledger
            .generations()
            .unwrap()
            .iter()
            .map(|g| g.meta.id)
            .collect();
        prop_assert!(
            after.windows(2).all(|w| w[1] == w[0] + 1),
            "gaps in {:?}",
            after
        );
        if let (Some(first_before), Some(first_after)) = (self.live.first(), after.first()) {
            prop_assert!(first_after >= first_before);
        }
        prop_assert!(
            after.len() <= options.generations as usize + 2,
            "{:?}",
            after
        );
        self.live = after;
        let live: HashSet<u64> = self.live.iter().copied().collect();
        self.loaded_again.retain(|g, _| live.contains(g));
        for copies in self.earlier.values_mut() {
            for &(_, p, t) in copies.iter().filter(|(g, _, _)| !live.contains(g)) {
                let f = self.forgotten_through.entry(p).or_insert(t);
                *f = (*f).max(t);
            }
            copies.retain(|(g, _, _)| live.contains(g));
        }
        self.earlier.retain(|_, copies| !copies.is_empty());
        let forgotten: Vec<_> = self
            .held
            .iter()
            .filter(|(_, (g, _, _))| !live.contains(g))
            .map(|(k, v)| (*k, *v))
            .collect();
        for (k, (_, p, t)) in forgotten {
            self.held.remove(&k);
            let f = self.forgotten_through.entry(p).or_insert(t);
            *f = (*f).max(t);
        }
        Ok(())
    }

    /// Checks the ledger against the model after a step: windows, progress records, id counts.
    fn check(
        &self,
        ledger: &Ledger,
        progress: &HashMap<Partition, Vec<u8>>,
        now: i64,
    ) -> Result<(), TestCaseError> {
        // The window never claims an id it forgot, and exists exactly when ids are held.
        for p in 0..3 {
            let window = ledger.window(p, now);
            let holds = self.held.values().any(|(_, q, _)| *q == p)
                || self.earlier.values().flatten().any(|(_, q, _)| *q == p);
            prop_assert_eq!(window.is_some(), holds, "partition {}", p);
            if let (Some(w), Some(f)) = (window, self.forgotten_through.get(&p)) {
                prop_assert!(now - w.as_millis() as i64 >= *f);
            }
            prop_assert_eq!(ledger.progress(p).unwrap(), progress.get(&p).cloned());
        }
        let stats = ledger.stats().unwrap();
        // Every held id is counted and has its slot; only an id a load met again may count twice.
        let again: u64 = self.loaded_again.values().sum();
        let held = self.held.len() as u64;
        prop_assert!(
            held <= stats.ids_estimate && stats.ids_estimate <= held + again,
            "{} counted for {} held, {} loaded again",
            stats.ids_estimate,
            held,
            again
        );
        if stats.index_overflowed_buckets == 0 {
            prop_assert!(
                held <= stats.index_ids && stats.index_ids <= held + again,
                "index {} for {} held, {} loaded again",
                stats.index_ids,
                held,
                again
            );
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn ledger_matches_reference_model(
        mode in mode(),
        seal_after in 4u64..40,
        index_capacity_ids in prop_oneof![3 => Just(None), 1 => (1u64..64).prop_map(Some)],
        write_buffer_bytes in prop_oneof![Just(1usize << 20), 300usize..2_000],
        ops in prop::collection::vec(op(), 1..40),
    ) {
        run_model(mode, seal_after, index_capacity_ids, write_buffer_bytes, ops)?;
    }
}

// ---- crash safety ---------------------------------------------------------------------

const CRASH_DIR_ENV: &str = "DEDUPE_LEDGER_CRASH_DIR";
const CRASH_MODE_ENV: &str = "DEDUPE_LEDGER_CRASH_MODE";
const CRASH_BATCH_IDS: u64 = 64;
const CRASH_KILLS_PER_MODE: usize = 12;

fn crash_options(mode: Durability) -> LedgerOptions {
    LedgerOptions {
        durability: mode,
        // Small buffers and generations: flushes, seals and new column families happen
        // within the child's short life, so kills land in all of them.
        write_buffer_bytes: 256 << 10,
        max_write_buffers: 2,
        seal_after_ids: Some(20_000),
        block_cache_bytes: 1 << 20,
        budget_bytes: 256 << 20,
        ..LedgerOptions::default()
    }
}

fn crash_key(batch: u64, i: u64) -> LedgerKey {
    ledger_key(format!("batch-{batch}-id-{i}").as_bytes()).unwrap()
}

fn parse_mode(s: &str) -> Durability {
    match s {
        "SyncWal" => Durability::SyncWal,
        "Wal" => Durability::Wal,
        _ => Durability::NoWal,
    }
}

/// The child side of the crash test, run by it (hence ignored in the suite): writes batches
/// forever. Batch n holds ids derived from n, repeats the first id of batch n - 1, and its
/// progress record is n.
#[test]
#[ignore = "the crash tests' child process; they run it"]
fn crash_child_writer() {
    let dir =
        std::env::var(CRASH_DIR_ENV).expect("run by the crash tests, which set the directory");
    let mode = std::env::var(CRASH_MODE_ENV).expect("run by the crash tests, which set the mode");
    let _failpoints = fail::FailScenario::setup();
    let ledger = Ledger::open(&dir, crash_options(parse_mode(&mode))).unwrap();
    let mut batch = ledger
        .progress(0)
        .unwrap()
        .map_or(0, |p| u64::from_le_bytes(p.try_into().unwrap()));
    loop {
        batch += 1;
        let mut items: Vec<_> = (0..CRASH_BATCH_IDS)
            .map(|i| (crash_key(batch, i), batch as i64 * 1000))
            .collect();
        if batch > 1 {
            items.push((crash_key(batch - 1, 0), batch as i64 * 1000));
        }
        ledger
            .check_and_record(0, &items, &batch.to_le_bytes())
            .unwrap();
    }
}

/// The child side of the creation crash test, run by it: opens a fresh ledger with the default
/// options (the default budget's 3.4 GiB id index included), then writes batches forever.
#[test]
#[ignore = "the crash tests' child process; they run it"]
fn crash_child_creator() {
    let dir =
        std::env::var(CRASH_DIR_ENV).expect("run by the crash tests, which set the directory");
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    for batch in 1.. {
        let items: Vec<_> = (0..CRASH_BATCH_IDS)
            .map(|i| (crash_key(batch, i), batch as i64 * 1000))
            .collect();
        ledger
            .check_and_record(0, &items, &batch.to_le_bytes())
            .unwrap();
    }
}

/// Opens the crash test's ledger and checks that batches 1..=n are entirely there, n + 1 is
/// entirely absent and the metadata counts exactly their ids. Returns n.
fn check_crashed_ledger(dir: &Path, mode: Durability, what: &str) -> u64 {
    check_crashed_ledger_with(dir, crash_options(mode), what)
}

fn check_crashed_ledger_with(dir: &Path, options: LedgerOptions, what: &str) -> u64 {
    let ledger = Ledger::open(dir, options)
        .unwrap_or_else(|e| panic!("{what}: the ledger does not open again: {e}"));
    let n = ledger
        .progress(0)
        .unwrap()
        .map_or(0, |p| u64::from_le_bytes(p.try_into().unwrap()));
    for b in 1..=n {
        let keys: Vec<_> = (0..CRASH_BATCH_IDS).map(|i| crash_key(b, i)).collect();
        let found = ledger.check(&keys).unwrap();
        assert!(
            found.iter().all(|f| *f == Some(b as i64 * 1000)),
            "{what}: batch {b} of {n} is incomplete"
        );
    }
    let next: Vec<_> = (0..CRASH_BATCH_IDS).map(|i| crash_key(n + 1, i)).collect();
    assert!(
        ledger.check(&next).unwrap().iter().all(Option::is_none),
        "{what}: batch {} is there without its progress record {n}",
        n + 1
    );
    assert_eq!(
        ledger.stats().unwrap().ids_estimate,
        n * CRASH_BATCH_IDS,
        "{what}"
    );
    n
}

/// With a WAL, buffered batches are replayed from the batch log on open; a torn record at
/// its end (a crash mid-append) ends the replay, and later batches append after the good part.
#[test]
fn batch_log_replays_a_prefix_and_drops_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let items = |b: u64| -> Vec<(LedgerKey, i64)> {
        (0..10)
            .map(|i| (key(b * 100 + i), b as i64 * 1000))
            .collect()
    };
    for mode in [Durability::Wal, Durability::SyncWal] {
        let dir = dir.path().join(format!("{mode:?}"));
        {
            let ledger = Ledger::open(&dir, small_options(mode)).unwrap();
            for b in 1..=3 {
                ledger
                    .check_and_record(0, &items(b), &b.to_le_bytes())
                    .unwrap();
            }
            // As a crash leaves it: the batches only in the log (a clean close commits them).
            ledger.drop_without_closing();
        }
        let logs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with(LOG_FILE_PREFIX)
            })
            .collect();
        assert_eq!(logs.len(), 1, "{logs:?}");
        let mut bytes = std::fs::read(&logs[0]).unwrap();
        let whole = bytes.len();
        bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3]);
        std::fs::write(&logs[0], &bytes).unwrap();
        assert!(whole > 0);
        {
            let ledger = Ledger::open(&dir, small_options(mode)).unwrap();
            assert_eq!(
                ledger.progress(0).unwrap(),
                Some(3u64.to_le_bytes().to_vec())
            );
            assert_eq!(ledger.stats().unwrap().ids_estimate, 30);
            let verdicts = ledger
                .check_and_record(0, &items(3), &4u64.to_le_bytes())
                .unwrap();
            assert!(
                verdicts.iter().all(|v| *v
                    == Verdict::Duplicate {
                        first_seen_ms: 3000,
                        digest: None
                    }),
                "{verdicts:?}"
            );
            ledger
                .check_and_record(0, &items(5), &5u64.to_le_bytes())
                .unwrap();
        }
        let ledger = Ledger::open(&dir, small_options(mode)).unwrap();
        assert_eq!(
            ledger.progress(0).unwrap(),
            Some(5u64.to_le_bytes().to_vec())
        );
        assert_eq!(ledger.stats().unwrap().ids_estimate, 40);
        for b in [1, 2, 3, 5] {
            assert!(ledger
                .check(&items(b).iter().map(|(k, _)| *k).collect::<Vec<_>>())
                .unwrap()
                .iter()
                .all(|f| *f == Some(b as i64 * 1000)));
        }
    }
}

/// Without a WAL, buffered ids become durable when their file is ingested; a crash right
/// after the ingestion, before the metadata and progress records are written, must still
/// leave exactly the committed batches with their progress record.
#[test]
#[cfg(feature = "failpoints")]
fn a_crash_between_ingestion_and_bookkeeping_keeps_the_commit() {
    let exe = std::env::current_exe().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut last = 0u64;
    for crash in 0..3 {
        let status = std::process::Command::new(&exe)
            .args([
                "--exact",
                "ledger::tests::crash_child_writer",
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CRASH_DIR_ENV, dir.path())
            .env(CRASH_MODE_ENV, "NoWal")
            .env("FAILPOINTS", "ledger-after-ingest=return")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(
            !status.success(),
            "crash {crash}: the child was meant to abort"
        );
        let n = check_crashed_ledger(dir.path(), Durability::NoWal, &format!("crash {crash}"));
        assert!(
            n > last,
            "crash {crash}: the ingested batches were lost (progress {n}, before {last})"
        );
        last = n;
    }
}

/// A worker killed during its first start, with the default budget, at any moment from the
/// very first: the ledger always opens again, and holds a prefix of the batches.
#[test]
fn a_kill_at_any_moment_of_creation_never_bricks_the_ledger() {
    let exe = std::env::current_exe().unwrap();
    let root = tempfile::tempdir().unwrap();
    let check = LedgerOptions {
        build_index: false,
        ..LedgerOptions::default()
    };
    let mut survived = 0;
    // Kills at fixed moments of the creation (which takes seconds: the index is made
    // resident), then at moments after it finished, while batches are written.
    let during = [
        0u64, 1, 3, 8, 15, 30, 60, 100, 160, 250, 400, 600, 900, 1300, 1800, 2500,
    ]
    .map(|ms| (ms, false));
    let after = [0u64, 50, 300].map(|ms| (ms, true));
    for (n, (delay_ms, after_creation)) in during.into_iter().chain(after).enumerate() {
        let dir = root.path().join(format!("kill-{n}"));
        let mut child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "ledger::tests::crash_child_creator",
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CRASH_DIR_ENV, &dir)
            .env(CRASH_MODE_ENV, "default")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        if after_creation {
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            while !dir.join("CURRENT").exists() || dir.join(CREATING_MARKER).exists() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the child never finished creating its ledger"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        if !dir.exists() {
            continue; // Killed before it made anything.
        }
        let batches = check_crashed_ledger_with(
            &dir,
            check.clone(),
            &format!("killed {delay_ms} ms into its first start"),
        );
        survived += usize::from(batches > 0);
        // Opened once, it opens again: the creation is over.
        assert!(
            !dir.join(CREATING_MARKER).exists(),
            "killed at {delay_ms} ms: the creation marker is still there"
        );
    }
    assert!(
        survived > 0,
        "no kill landed after the ledger was created and written; the test proves nothing"
    );
}

#[test]
fn an_interrupted_creation_is_started_again_and_maintenance_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    // What a kill during creation leaves: the marker, and some of RocksDB's files.
    std::fs::write(dir.path().join(CREATING_MARKER), b"").unwrap();
    std::fs::write(dir.path().join("CURRENT"), b"MANIFEST-000005\n").unwrap();
    std::fs::write(dir.path().join("000004.log"), b"torn").unwrap();
    match Ledger::open_existing(dir.path(), small_options(Durability::Wal)) {
        Err(LedgerError::NotALedger { reason, .. }) => {
            assert!(reason.contains("never finished"), "{reason}")
        }
        other => panic!(
            "maintenance opened a half-created ledger: {:?}",
            other.map(|_| ())
        ),
    }
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    assert!(!dir.path().join(CREATING_MARKER).exists());
    assert!(!dir.path().join("000004.log").exists());
    ledger.check_and_record(0, &[(key(1), 1000)], b"p").unwrap();
    drop(ledger);
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    assert_eq!(ledger.check(&[key(1)]).unwrap(), vec![Some(1000)]);
}

#[test]
fn a_ledger_without_its_format_marker_is_initialized_only_if_it_holds_nothing() {
    for mode in [Durability::NoWal, Durability::Wal] {
        // Empty: what an older build left when killed before writing the marker.
        let dir = tempfile::tempdir().unwrap();
        {
            let ledger = Ledger::open(dir.path(), small_options(mode)).unwrap();
            let meta = ledger.cf(CF_META).unwrap();
            ledger.db.delete_cf(&meta, META_FORMAT_VERSION).unwrap();
            ledger.flush_cfs(&[CF_META], true).unwrap();
        }
        let ledger = Ledger::open(dir.path(), small_options(mode)).unwrap();
        drop(ledger);
        // Holding a batch: a missing marker is damage, refused and left alone.
        let ledger = Ledger::open(dir.path(), small_options(mode)).unwrap();
        ledger.check_and_record(0, &[(key(1), 1000)], b"p").unwrap();
        ledger.flush().unwrap();
        let meta = ledger.cf(CF_META).unwrap();
        ledger.db.delete_cf(&meta, META_FORMAT_VERSION).unwrap();
        ledger.flush_cfs(&[CF_META], true).unwrap();
        drop(meta);
        drop(ledger);
        match Ledger::open(dir.path(), small_options(mode)) {
            Err(LedgerError::CorruptMetadata { what }) => {
                assert!(what.contains("format version marker is missing"), "{what}")
            }
            other => panic!(
                "{mode:?}: a ledger holding ids without its marker opened: {:?}",
                other.map(|_| ())
            ),
        }
    }
}

#[test]
fn batches_are_all_or_nothing_and_a_prefix_after_sigkill() {
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rng();
    for mode in [Durability::NoWal, Durability::Wal, Durability::SyncWal] {
        let dir = tempfile::tempdir().unwrap();
        let mut last = 0u64;
        for kill in 0..CRASH_KILLS_PER_MODE {
            let mut child = std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "ledger::tests::crash_child_writer",
                    "--ignored",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(CRASH_DIR_ENV, dir.path())
                .env(CRASH_MODE_ENV, format!("{mode:?}"))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(rand::Rng::random_range(
                &mut rng,
                40..400,
            )));
            // Child::kill sends SIGKILL.
            child.kill().unwrap();
            child.wait().unwrap();

            // Every batch up to n is entirely there; batch n + 1 is entirely absent; the
            // generation metadata counts exactly their ids.
            let n = check_crashed_ledger(dir.path(), mode, &format!("{mode:?} kill {kill}"));
            // Batches never go back: a batch seen after one reopen survives (closing the
            // ledger flushes, so this holds without a WAL too).
            assert!(
                n >= last,
                "{mode:?} kill {kill}: progress went back from {last} to {n}"
            );
            last = n;
        }
        assert!(
            last > 0,
            "{mode:?}: no batch ever survived a kill; the test proves nothing"
        );
    }
}

#[test]
fn an_empty_progress_record_leaves_the_partitions_as_it_is_across_a_reopen() {
    for durability in Durability::ALL {
        let dir = tempfile::tempdir().unwrap();
        {
            let ledger = Ledger::open(dir.path(), small_options(durability)).unwrap();
            ledger
                .check_and_record(3, &[(key(1), 1_000)], b"pipeline")
                .unwrap();
            // Older ids loaded in the background: no progress of their own.
            ledger
                .check_and_record(3, &[(key(2), 500), (key(3), 400)], b"")
                .unwrap();
            assert_eq!(
                ledger.progress(3).unwrap().as_deref(),
                Some(&b"pipeline"[..])
            );
            ledger.flush().unwrap();
            ledger.check_and_record(3, &[(key(4), 300)], b"").unwrap();
        }
        let ledger = Ledger::open(dir.path(), small_options(durability)).unwrap();
        assert_eq!(
            ledger.progress(3).unwrap().as_deref(),
            Some(&b"pipeline"[..]),
            "{durability}"
        );
        let held = ledger.check(&[key(1), key(2), key(3)]).unwrap();
        assert!(held.iter().all(Option::is_some), "{durability}: {held:?}");
    }
}

#[test]
fn the_index_grows_in_time_when_ids_come_faster_than_a_background_commit() {
    // Ids as fast as the ledger takes them, past the first growth of the id index (at 80% of
    // its first size, 2.1M ids here). A growth seals the active generation; putting that seal
    // off while the id buffer is committed in the background let the full-speed batches fill
    // the first size to overflowing, and the overflowed buckets then sent every later lookup
    // that hit them to every generation on disk (6M ids took 60 s instead of 4).
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(
        dir.path(),
        LedgerOptions {
            budget_bytes: 1 << 30,
            ..LedgerOptions::default()
        },
    )
    .unwrap();
    let n: u64 = 3_000_000;
    let mut batch = Vec::with_capacity(4096);
    let mut i = 0u64;
    while i < n {
        batch.clear();
        batch.extend((i..i + 4096).map(|j| (key(j), 1_000_000 + j as i64)));
        i += 4096;
        ledger.check_and_record(0, &batch, b"p").unwrap();
    }
    let stats = ledger.stats().unwrap();
    assert_eq!(
        (stats.index_overflowed_buckets, stats.index_ids),
        (0, i),
        "the index overflowed"
    );
}

#[test]
fn near_a_growth_of_the_id_index_the_buffer_is_committed_ahead_so_the_growths_seal_writes_little() {
    // A buffer of a write buffer's ids (700K here) is more than the index's first size takes
    // before it grows (210K). Without committing ahead, the growth's seal found every id since the
    // start buffered and wrote them under the lock, unless a background commit it started was done
    // before the table filled past where the growth cannot wait (at full speed, it was not: 0.4 s
    // batches in the ledger bench). Each batch here waits for background commits, so the test
    // sees what each batch leaves buffered, not how fast a commit runs.
    let dir = tempfile::tempdir().unwrap();
    let options = LedgerOptions {
        write_buffer_bytes: 16 << 20,
        ..small_options(Durability::Wal)
    };
    let ledger = Ledger::open(dir.path(), options).unwrap();
    let first_level = ledger.lock().index.geometry().1;
    let (mut i, mut near) = (0u64, 0u64);
    while ledger.lock().index.geometry().1 == first_level {
        assert!(i < 2_000_000, "the id index did not grow");
        let batch: Vec<_> = (i..i + 4096)
            .map(|j| (key(j), 1_000_000 + j as i64))
            .collect();
        i += 4096;
        ledger.check_and_record(0, &batch, b"p").unwrap();
        loop {
            let state = ledger.lock();
            if state.in_flight.as_ref().is_none_or(|f| f.written()) {
                break;
            }
            drop(state);
            std::thread::sleep(Duration::from_millis(1));
        }
        let state = ledger.lock();
        if state.index.growth_near(2 * ledger.buffer_capacity_ids()) {
            near += 1;
            assert!(
                state.pending.len() <= SEAL_BUFFER_IDS,
                "{} ids buffered near the growth, at {i} ids",
                state.pending.len()
            );
        }
    }
    assert!(near > 10, "only {near} batches came near the growth");
    assert_eq!(ledger.stats().unwrap().index_ids, i);
}

#[test]
fn an_open_that_grows_the_index_keeps_answering_for_the_active_generation() {
    // After a crash, the open that replays the batch log can leave the index file stored fuller
    // than its level's capacity; the next open grows the table as it loads it. The active
    // generation's entries stayed compared at the old level while its new ids went in at the
    // new one: every id recorded after that open was answered "absent" (found by the SIGKILL
    // test above: whole batches missing, about one run in eight). The ids to reach the first
    // size's capacity differ by a few batches with the ledger's settings, so a range of crash
    // points is tried; at least one of them must grow the table at the open. Each crash point
    // writes its ledger from the start, so the suite stops after the first one that grew the
    // table (the case this test is about) and has been checked; DEDUPE_LEDGER_GROWTH_ALL_STOPS=1
    // tries every point.
    let all_stops =
        std::env::var("DEDUPE_LEDGER_GROWTH_ALL_STOPS").is_ok_and(|v| !v.is_empty() && v != "0");
    let mut grew_at_open = 0;
    for stop in (4_080..4_120).step_by(3) {
        if grew_at_open > 0 && !all_stops {
            break;
        }
        let dir = memory_dir();
        let items = |b: u64| -> Vec<(LedgerKey, i64)> {
            let mut items: Vec<_> = (0..CRASH_BATCH_IDS)
                .map(|i| (crash_key(b, i), b as i64 * 1000))
                .collect();
            if b > 1 {
                items.push((crash_key(b - 1, 0), b as i64 * 1000));
            }
            items
        };
        {
            let ledger = Ledger::open(dir.path(), crash_options(Durability::Wal)).unwrap();
            for b in 1..=stop {
                ledger
                    .check_and_record(0, &items(b), &b.to_le_bytes())
                    .unwrap();
            }
            ledger.drop_without_closing();
        }
        let stored_level = {
            let ledger = Ledger::open(dir.path(), crash_options(Durability::Wal)).unwrap();
            let level = ledger.lock().index.geometry().1;
            level
        };
        let ledger = Ledger::open(dir.path(), crash_options(Durability::Wal)).unwrap();
        if ledger.lock().index.geometry().1 > stored_level {
            grew_at_open += 1;
        }
        for b in stop + 1..=stop + 40 {
            let verdicts = ledger
                .check_and_record(0, &items(b), &b.to_le_bytes())
                .unwrap();
            assert!(
                matches!(verdicts.last(), Some(Verdict::Duplicate { .. })),
                "crash at batch {stop}: batch {b} found the repeated id of batch {} new",
                b - 1
            );
        }
        for b in 1..=stop + 40 {
            let keys: Vec<_> = (0..CRASH_BATCH_IDS).map(|i| crash_key(b, i)).collect();
            assert!(
                ledger
                    .check(&keys)
                    .unwrap()
                    .iter()
                    .all(|f| *f == Some(b as i64 * 1000)),
                "crash at batch {stop}: batch {b} is incomplete"
            );
        }
    }
    assert!(
        grew_at_open > 0,
        "no open grew the index: the test no longer reaches the case it is about"
    );
}

/// A commit thread that panics is a bug, not damage: its error says so and is worth a retry, the
/// batch that met it is not recorded, and the next call writes the commit again on its own thread.
#[cfg(feature = "failpoints")]
#[test]
fn a_commit_thread_that_panics_is_reported_as_a_bug_and_its_commit_is_written_again() {
    let scenario = fail::FailScenario::setup();
    fail::cfg("ledger-commit-thread", "1*panic(a bug)").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    let batch = |b: u64| -> Vec<(LedgerKey, i64)> {
        (0..1000).map(|i| (key(b * 1000 + i), b as i64)).collect()
    };
    let mut recorded = Vec::new();
    let mut failed = None;
    for b in 0..2000 {
        match ledger.check_and_record(0, &batch(b), &b.to_le_bytes()) {
            Ok(_) => recorded.push(b),
            Err(e) => {
                failed = Some((b, e));
                break;
            }
        }
        // Let a commit's thread run (and panic) before the next call looks at it.
        std::thread::sleep(Duration::from_millis(1));
    }
    let (b, error) = failed.expect("a commit started in the background, and its thread panicked");
    assert!(
        matches!(error, LedgerError::Panicked { thread: "commit", ref message } if message == "a bug"),
        "{error:?}"
    );
    assert!(error.is_retryable());
    assert!(
        error.to_string().contains("not a damaged ledger"),
        "{error}"
    );
    // The batch that met the error was not recorded; sent again, it is.
    assert!(ledger.held(&[batch(b)[0].0]).unwrap()[0].is_none());
    ledger
        .check_and_record(0, &batch(b), &b.to_le_bytes())
        .unwrap();
    recorded.push(b);
    ledger.flush().unwrap();
    drop(ledger);
    scenario.teardown();
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    for b in recorded {
        let keys: Vec<LedgerKey> = batch(b).into_iter().map(|(k, _)| k).collect();
        assert!(
            ledger.held(&keys).unwrap().iter().all(Option::is_some),
            "batch {b} lost"
        );
    }
}

fn mark(kind: MarkKind, changelog_offset: i64) -> Mark {
    Mark {
        partition: 3,
        kind,
        changelog_offset,
        at_ms: 9_000,
    }
}

#[test]
fn a_forgotten_id_is_not_held_until_marked_resent_and_marks_survive_a_crash() {
    for mode in ALL_MODES {
        let dir = tempfile::tempdir().unwrap();
        {
            let ledger = Ledger::open(dir.path(), small_options(mode)).unwrap();
            ledger
                .check_and_record(3, &[(key(1), 1_000), (key(2), 1_000)], b"a")
                .unwrap();
            ledger
                .mark(&[(key(1), mark(MarkKind::Forgotten, 5))], MarkOrder::Newest)
                .unwrap();
            let (held, forgotten) = ledger.held_in(&[key(1), key(2)]).unwrap();
            assert!(held[0].is_none() && held[1].is_some());
            assert_eq!(
                forgotten,
                [Forgotten {
                    key: key(1),
                    at_ms: 9_000,
                    partitions: vec![3]
                }]
            );
            // Killed without closing: the mark was made durable when it was written.
            ledger.drop_without_closing();
        }
        let ledger = Ledger::open(dir.path(), small_options(mode)).unwrap();
        assert_eq!(
            ledger.marks_of(&key(1)),
            [mark(MarkKind::Forgotten, 5)],
            "{mode:?}"
        );
        assert!(
            ledger.held_in(&[key(1)]).unwrap().0[0].is_none(),
            "{mode:?}"
        );
        // Published again: judged new, recorded at its new time, and held from then on.
        let verdicts = ledger
            .check_and_record_marked(
                3,
                &[(key(1), 4_000)],
                b"b",
                &[(key(1), mark(MarkKind::Resent, 8))],
            )
            .unwrap();
        assert_eq!(verdicts, [Verdict::New]);
        assert_eq!(ledger.check(&[key(1)]).unwrap(), [Some(4_000)], "{mode:?}");
        assert_eq!(ledger.mark_counts(), (0, 1));
    }
}

#[test]
fn marks_read_back_from_the_log_apply_in_offset_order_and_a_rebuild_clears_them() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    ledger
        .check_and_record(3, &[(key(1), 1_000)], b"a")
        .unwrap();
    // The first load read a re-send at offset 20; a back-fill then reads the older forget.
    ledger
        .mark(&[(key(1), mark(MarkKind::Resent, 20))], MarkOrder::ByOffset)
        .unwrap();
    ledger
        .mark(
            &[(key(1), mark(MarkKind::Forgotten, 10))],
            MarkOrder::ByOffset,
        )
        .unwrap();
    assert!(ledger.held_in(&[key(1)]).unwrap().0[0].is_some());
    // In one read, the later of two marks wins.
    ledger
        .mark(
            &[
                (key(2), mark(MarkKind::Forgotten, 30)),
                (key(2), mark(MarkKind::Resent, 31)),
                (key(3), mark(MarkKind::Resent, 32)),
                (key(3), mark(MarkKind::Forgotten, 33)),
            ],
            MarkOrder::ByOffset,
        )
        .unwrap();
    assert_eq!(ledger.marks_of(&key(2))[0].kind, MarkKind::Resent);
    assert_eq!(ledger.marks_of(&key(3))[0].kind, MarkKind::Forgotten);
    ledger.clear_marks(3).unwrap();
    assert_eq!(ledger.mark_counts(), (0, 0));
    drop(ledger);
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    assert_eq!(ledger.mark_counts(), (0, 0), "cleared for good");
}

#[test]
fn the_marks_of_ids_that_aged_out_are_dropped_with_their_generations() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path(), aging_options()).unwrap();
    let batch = |b: u64| -> Vec<(LedgerKey, i64)> {
        (0..100)
            .map(|i| (key(b * 100 + i), (b as i64) * 1_000))
            .collect()
    };
    ledger.check_and_record(0, &batch(0), b"0").unwrap();
    // Forgotten: an id of the first generation, and an id never held.
    ledger
        .mark(
            &[
                (
                    key(5),
                    Mark {
                        partition: 0,
                        ..mark(MarkKind::Forgotten, 1)
                    },
                ),
                (
                    key(100_000),
                    Mark {
                        partition: 0,
                        ..mark(MarkKind::Forgotten, 2)
                    },
                ),
            ],
            MarkOrder::Newest,
        )
        .unwrap();
    assert_eq!(ledger.mark_counts(), (2, 0));
    for b in 1..10u64 {
        ledger
            .check_and_record(0, &batch(b), &b.to_le_bytes())
            .unwrap();
    }
    assert_eq!(ledger.check(&[key(5)]).unwrap(), vec![None], "aged out");
    assert_eq!(ledger.mark_counts(), (0, 0), "nothing left to mark");
    drop(ledger);
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    assert_eq!(ledger.mark_counts(), (0, 0), "dropped for good");
}

#[test]
fn a_forget_on_two_partitions_is_ended_by_the_first_copy_through_on_either() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    ledger
        .check_and_record(3, &[(key(1), 1_000)], b"a")
        .unwrap();
    let on = |partition: i32, kind: MarkKind, changelog_offset: i64, at_ms: i64| Mark {
        partition,
        kind,
        changelog_offset,
        at_ms,
    };
    // One forget, written to the changelogs of partitions 3 and 4 (the id's two partitioners'),
    // at one time.
    ledger
        .mark(
            &[
                (key(1), on(3, MarkKind::Forgotten, 10, 5_000)),
                (key(1), on(4, MarkKind::Forgotten, 70, 5_000)),
            ],
            MarkOrder::Newest,
        )
        .unwrap();
    let forgotten = |at_ms: i64, partitions: Vec<i32>| Forgotten {
        key: key(1),
        at_ms,
        partitions,
    };
    assert_eq!(
        ledger.held_in(&[key(1)]).unwrap().1,
        [forgotten(5_000, vec![3, 4])]
    );
    assert_eq!(ledger.mark_counts(), (1, 0), "one id forgotten");
    // Its copy arrives on partition 4 and is published: the forget is over on 3 as well, so a
    // copy on either is dropped from now on.
    let verdicts = ledger
        .check_and_record_marked(
            4,
            &[(key(1), 6_000)],
            b"b",
            &[(key(1), on(4, MarkKind::Resent, 71, 6_000))],
        )
        .unwrap();
    assert_eq!(verdicts, [Verdict::New]);
    let (held, now_forgotten) = ledger.held_in(&[key(1)]).unwrap();
    assert!(held[0].is_some() && now_forgotten.is_empty());
    assert_eq!(ledger.mark_counts(), (0, 1), "no forget left in force");
    // The changelog of partition 3 read again (a crash, a reload) brings back its forget marker:
    // older than the re-send, it stays over.
    ledger
        .mark(
            &[(key(1), on(3, MarkKind::Forgotten, 10, 5_000))],
            MarkOrder::ByOffset,
        )
        .unwrap();
    assert!(ledger.held_in(&[key(1)]).unwrap().1.is_empty());
    // A later forget is in force again, until its own copy.
    ledger
        .mark(
            &[(key(1), on(3, MarkKind::Forgotten, 12, 7_000))],
            MarkOrder::Newest,
        )
        .unwrap();
    assert_eq!(
        ledger.held_in(&[key(1)]).unwrap().1,
        [forgotten(7_000, vec![3])]
    );
    assert_eq!(ledger.newest_resent_ms(&[key(1), key(2)]), Some(6_000));
    drop(ledger);
    let ledger = Ledger::open(dir.path(), small_options(Durability::Wal)).unwrap();
    assert_eq!(ledger.marks_of(&key(1)).len(), 2, "one per partition");
    assert_eq!(ledger.held_in(&[key(1)]).unwrap().1[0].at_ms, 7_000);
}

#[test]
fn an_id_is_forgotten_while_its_newest_forget_is_newer_than_its_newest_resend() {
    let m = |partition: i32, kind: MarkKind, at_ms: i64| Mark {
        partition,
        kind,
        changelog_offset: 0,
        at_ms,
    };
    use MarkKind::{Forgotten, Resent};
    let cases: &[(&str, Vec<Mark>, Option<i64>)] = &[
        ("no marks", vec![], None),
        ("forgotten on one", vec![m(0, Forgotten, 5)], Some(5)),
        (
            "forgotten on two",
            vec![m(0, Forgotten, 5), m(1, Forgotten, 5)],
            Some(5),
        ),
        (
            "re-sent on the other partition",
            vec![m(0, Forgotten, 5), m(1, Resent, 6)],
            None,
        ),
        (
            "re-sent in the forget's millisecond",
            vec![m(0, Forgotten, 5), m(1, Resent, 5)],
            None,
        ),
        (
            "forgotten again after a re-send",
            vec![m(0, Resent, 6), m(1, Forgotten, 7)],
            Some(7),
        ),
        (
            "an old forget on one partition, a re-send and a newer forget on another",
            vec![m(0, Forgotten, 5), m(1, Resent, 6), m(2, Forgotten, 9)],
            Some(9),
        ),
        ("re-sent only", vec![m(0, Resent, 6)], None),
    ];
    for (what, marks, expected) in cases {
        assert_eq!(forgotten_since(marks), *expected, "{what}");
    }
}

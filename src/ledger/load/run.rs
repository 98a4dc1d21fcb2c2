//! A load's runs: how the ids of one run are collected, sorted and written as an SST file.
//!
//! A run's ids are spread over [`SHARDS`] shards by their key's first byte as they are added, so
//! the consumer's one pass over them does the sort's first step. A writer then sorts one shard at
//! a time (about 32K ids, 0.8 MB: within a core's cache, where a whole run's 200 MB is not) and
//! writes it while it is still there. Shards are key ranges in key order, so a run split at a
//! shard's edge is two runs of disjoint keys.

use std::path::PathBuf;

use rocksdb::{Options, SstFileWriter};

use super::super::error::{rocks, Doing};
use super::super::format::{encode_value, TimeBase};
use super::super::Result;
use crate::identity::LedgerKey;

/// Shards of a run: one per value of a key's first byte. Keys made from UUIDv4s or hashes spread
/// evenly; keys that do not (time-ordered UUIDs) are sorted as correctly, in fewer, larger shards.
const SHARDS: usize = 256;

/// The ids of a run, each with a first-seen time, by shard (see the module docs).
pub(super) struct Run {
    shards: Vec<Vec<(LedgerKey, i64)>>,
    len: usize,
    /// The time of the first id added.
    first_time: Option<i64>,
}

impl Run {
    /// An empty run with room for about `ids` evenly spread ids.
    pub(super) fn with_capacity(ids: usize) -> Run {
        let per_shard = ids / SHARDS;
        // An even spread leaves a shard of 32K ids within about 1% of its share; the rest of
        // the slack saves a shard's copy when it grows.
        let room = per_shard + per_shard / 16 + 16;
        Run {
            shards: (0..SHARDS).map(|_| Vec::with_capacity(room)).collect(),
            len: 0,
            first_time: None,
        }
    }

    pub(super) fn push(&mut self, key: LedgerKey, time: i64) {
        self.first_time.get_or_insert(time);
        self.shards[usize::from(key.0[0])].push((key, time));
        self.len += 1;
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn first_time(&self) -> Option<i64> {
        self.first_time
    }

    /// The keys, shard by shard.
    pub(super) fn keys(&self) -> impl Iterator<Item = LedgerKey> + '_ {
        self.shards.iter().flatten().map(|(k, _)| *k)
    }

    /// Every id's time, to be changed in place.
    pub(super) fn times_mut(&mut self) -> impl Iterator<Item = &mut i64> + '_ {
        self.shards.iter_mut().flatten().map(|(_, t)| t)
    }

    /// Splits the run into at most `pieces` runs of about equal size, each a range of whole
    /// shards, in key order: no key is in two of them.
    pub(super) fn split(self, pieces: usize) -> Vec<Run> {
        let share = self.len.div_ceil(pieces.max(1)).max(1);
        let mut runs: Vec<Run> = Vec::with_capacity(pieces);
        for shard in self.shards {
            let full = runs.len() >= pieces;
            match runs.last_mut() {
                Some(last) if last.len < share || full => {
                    last.len += shard.len();
                    last.shards.push(shard);
                }
                _ => runs.push(Run {
                    len: shard.len(),
                    shards: vec![shard],
                    first_time: self.first_time,
                }),
            }
        }
        runs.retain(|r| !r.is_empty());
        runs
    }
}

/// Sorts ids by key, equal keys by first-seen time (the last one is kept). Keys are random, so
/// a radix sort by their first 4 bytes orders all but the few keys that share them, which are
/// then ordered among themselves: cheaper than a comparison sort, whose comparisons were a large
/// part of a load's CPU time. Within a shard the first byte is the same for all, and the radix
/// sort skips it.
pub(super) fn sort_run(ids: &mut [(LedgerKey, i64)]) {
    let prefix = |k: &LedgerKey| u32::from_be_bytes([k.0[0], k.0[1], k.0[2], k.0[3]]);
    radsort::sort_by_key(ids, |(k, _)| prefix(k));
    let mut start = 0;
    while start < ids.len() {
        let p = prefix(&ids[start].0);
        let end = start
            + ids[start..]
                .iter()
                .take_while(|(k, _)| prefix(k) == p)
                .count();
        if end - start > 1 {
            ids[start..end].sort_unstable_by_key(|&(k, t)| (u128::from_be_bytes(k.0), t));
        }
        start = end;
    }
}

/// Writes one run: its ids sorted, each key once (the copy with the latest first-seen time), as an
/// SST file of the generation's table format. Needs nothing of the open database, so it runs on a
/// thread of its own.
pub(super) struct RunWriter {
    pub(super) file: PathBuf,
    pub(super) options: Options,
    pub(super) base: TimeBase,
    pub(super) run: Run,
}

impl RunWriter {
    pub(super) fn write(mut self) -> Result<PathBuf> {
        let written = (|| {
            let mut writer = SstFileWriter::create(&self.options);
            writer.open(&self.file)?;
            let mut value = Vec::with_capacity(4);
            for shard in &mut self.run.shards {
                sort_run(shard);
                for (i, (key, t)) in shard.iter().enumerate() {
                    if shard.get(i + 1).is_some_and(|(next, _)| next == key) {
                        continue;
                    }
                    value.clear();
                    // The changelog carries no digests: a loaded id's copies get the verdict
                    // `unknown`.
                    encode_value(self.base, *t, None, &mut value);
                    writer.put(key.0, &value)?;
                }
            }
            writer.finish()
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&self.file);
        }
        written.map_err(rocks(Doing::Write))?;
        read_back(&self.file);
        Ok(self.file)
    }
}

/// Asks the kernel to read a run back into the page cache, in the background. RocksDB's
/// `SstFileWriter` drops the pages of the file it writes as it goes, so without this every lookup
/// that reaches the loaded generation before its compaction reads a block of each run from disk:
/// at 200M ids (25 runs) the first batch after a take-over, with 2,000 copies of old ids, took
/// seconds. Read back (1.2 GB/s here, beside a load bound by the CPU), the same lookups are page
/// cache reads. Only a hint: without it the lookups are slower, never wrong.
fn read_back(file: &std::path::Path) {
    use std::os::fd::AsRawFd;
    /// Linux reads at most a device's readahead size per hint, so the file is hinted in steps.
    const STEP: i64 = 4 << 20;
    let Ok(opened) = std::fs::File::open(file) else {
        return;
    };
    let Ok(len) = opened.metadata().map(|m| m.len() as i64) else {
        return;
    };
    for offset in (0..len).step_by(STEP as usize) {
        // SAFETY: the descriptor is open for the call's duration; fadvise reads no memory of ours.
        let advised = unsafe {
            libc::posix_fadvise(opened.as_raw_fd(), offset, STEP, libc::POSIX_FADV_WILLNEED)
        };
        if advised != 0 {
            tracing::debug!(
                code = advised,
                "Could not ask for a load's run to be read back into the page cache."
            );
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::ledger_key;
    use crate::ledger::tuning::load_run_options;
    use crate::ledger::LedgerOptions;

    fn key(n: u64) -> LedgerKey {
        ledger_key(format!("loaded-{n}").as_bytes()).unwrap()
    }

    fn run_of(ids: &[(LedgerKey, i64)]) -> Run {
        let mut run = Run::with_capacity(ids.len());
        for &(k, t) in ids {
            run.push(k, t);
        }
        run
    }

    /// The share of `file`'s pages in the page cache.
    fn resident_share(file: &std::path::Path) -> f64 {
        use std::os::fd::AsRawFd;
        let opened = std::fs::File::open(file).unwrap();
        let len = opened.metadata().unwrap().len() as usize;
        let pages = len.div_ceil(4096);
        let mut vec = vec![0u8; pages];
        // SAFETY: a read-only shared mapping of the whole file, unmapped before returning; mincore
        // writes one byte per page into `vec`, which has one per page.
        unsafe {
            let map = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                opened.as_raw_fd(),
                0,
            );
            assert_ne!(map, libc::MAP_FAILED);
            assert_eq!(libc::mincore(map, len, vec.as_mut_ptr()), 0);
            libc::munmap(map, len);
        }
        vec.iter().filter(|&&v| v & 1 == 1).count() as f64 / pages as f64
    }

    #[test]
    fn a_written_run_is_read_back_into_the_page_cache_whole() {
        // About 10 MB: more than Linux reads for one readahead hint.
        let dir = tempfile::tempdir().unwrap();
        let cache = rocksdb::Cache::new_lru_cache(1 << 20);
        let ids: Vec<(LedgerKey, i64)> = (0..350_000).map(|i| (key(i), i as i64)).collect();
        let writer = RunWriter {
            file: dir.path().join("run.sst"),
            options: load_run_options(&LedgerOptions::default(), &cache),
            base: TimeBase::seconds(0),
            run: run_of(&ids),
        };
        let file = writer.write().unwrap();
        assert!(std::fs::metadata(&file).unwrap().len() > 8 << 20);
        // The reads were asked for; they finish in the background.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut share = resident_share(&file);
        while share < 0.99 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
            share = resident_share(&file);
        }
        assert!(
            share >= 0.99,
            "{:.0}% of the run is in the page cache",
            share * 100.0
        );
    }

    #[test]
    fn a_run_is_sorted_by_key_and_equal_keys_by_time_whatever_their_prefix() {
        let k = |prefix: u8, last: u8| {
            let mut b = [prefix; 16];
            b[15] = last;
            LedgerKey(b)
        };
        let mut ids = vec![
            (k(9, 1), 5),
            (k(1, 7), 3),
            (k(9, 0), 8),
            (k(1, 7), 1),
            (k(1, 2), 9),
            (k(9, 1), 2),
        ];
        sort_run(&mut ids);
        assert_eq!(
            ids,
            vec![
                (k(1, 2), 9),
                (k(1, 7), 1),
                (k(1, 7), 3),
                (k(9, 0), 8),
                (k(9, 1), 2),
                (k(9, 1), 5)
            ]
        );
    }

    #[test]
    fn a_runs_shards_hold_every_id_and_a_split_is_disjoint_key_ranges_in_order() {
        let ids: Vec<(LedgerKey, i64)> = (0..10_000).map(|i| (key(i), i as i64)).collect();
        let run = run_of(&ids);
        assert_eq!(run.len(), 10_000);
        assert_eq!(run.first_time(), Some(0));
        let mut keys: Vec<LedgerKey> = run.keys().collect();
        keys.sort_unstable();
        let mut expected: Vec<LedgerKey> = ids.iter().map(|(k, _)| *k).collect();
        expected.sort_unstable();
        assert_eq!(keys, expected);

        let pieces = run.split(3);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces.iter().map(Run::len).sum::<usize>(), 10_000);
        for piece in &pieces {
            // About a third each: whole shards of about 40 ids.
            assert!((3_000..3_700).contains(&piece.len()), "{}", piece.len());
            assert_eq!(piece.keys().count(), piece.len());
        }
        for pair in pieces.windows(2) {
            let last = pair[0].keys().max().unwrap();
            let first = pair[1].keys().min().unwrap();
            assert!(last < first, "pieces overlap");
        }
    }

    #[test]
    fn keys_all_in_one_shard_still_split_and_sort() {
        // Time-ordered keys share their first byte: one shard holds them all.
        let k = |n: u32| {
            let mut b = [7u8; 16];
            b[12..].copy_from_slice(&n.to_be_bytes());
            LedgerKey(b)
        };
        let mut run = Run::with_capacity(1_000);
        for n in (0..1_000).rev() {
            run.push(k(n), i64::from(n));
        }
        let mut pieces = run.split(2);
        assert_eq!(pieces.len(), 1, "a shard is never cut");
        let shard = &mut pieces[0].shards[7];
        sort_run(shard);
        assert!(shard.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(shard.len(), 1_000);
    }
}

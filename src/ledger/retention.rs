//! The retention limit ([`LedgerOptions::max_window_ms`](super::LedgerOptions::max_window_ms)):
//! time, not only the disk budget, bounds what the ledger holds.
//!
//! - **Lookups, exactly.** A copy arriving more than the limit after its id's last recorded
//!   sighting is judged as if the id were not held ([`past_limit`]), whatever generation still
//!   holds its bytes: each id's sighting is stored, so this does not wait for a generation to go.
//!   The copy is then recorded again, as a first sighting.
//! - **On the input's own clock.** An id whose sighting is older than the limit before the latest
//!   time its partition has reached (its watermark: the latest time recorded for it, or read in
//!   the batch or the load so far; never past the wall clock) is neither recorded by a batch nor
//!   loaded by a handover, and counted as late. A worker catching up after an outage longer than
//!   the limit therefore still holds the ids its waiting records repeat: copies within the limit
//!   of each other, by their record times, are dropped however late they are read.
//! - **Bytes, by the generation.** The active generation is sealed once it spans a generation's
//!   share of the limit (`limit / generations`), and a sealed generation is dropped whole once its
//!   newest id is older than the limit: no id's bytes outlive the limit by more than one
//!   generation's span (plus the time until the next [`Ledger::expire`], which the worker calls
//!   every few seconds). Expiry runs on the input's clock too ([`Ledger::expire_behind`]): a
//!   partition that has not read all its input holds it at its watermark. A caught-up, quiet
//!   ledger shrinks to what its limit holds on the wall clock.
//! - **The window** never exceeds the limit.

use std::time::Duration;

use super::error::{rocks, Doing};
use super::format::{parse_json, to_json, META_RETENTION_LIMIT};
use super::{Ledger, Result, State, CF_META};
use crate::Partition;

/// Whether a copy arriving at `at_ms` is past the limit after the sighting at `sighted_ms`: then it
/// is not a duplicate of that sighting. The one definition, for the ledger's verdicts, the
/// pipeline's decision and `explain`.
pub fn past_limit(limit_ms: Option<i64>, sighted_ms: i64, at_ms: i64) -> bool {
    limit_ms.is_some_and(|limit| at_ms.saturating_sub(sighted_ms) > limit)
}

/// What one [`Ledger::expire`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expired {
    /// The active generation was sealed because it spanned its share of the limit.
    pub sealed: bool,
    /// Sealed generations dropped because their newest id was past the limit.
    pub dropped: usize,
}

impl Ledger {
    /// The retention limit, if one is set.
    pub fn retention_limit(&self) -> Option<Duration> {
        self.options
            .max_window_ms
            .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
    }

    /// Applies the retention limit at wall-clock time `now_ms`: seals the active generation once
    /// it spans its share of the limit, and drops the sealed generations whose newest id is past
    /// it. Does nothing without a limit. Cheap when there is nothing to do (it reads the
    /// generations' metadata in memory); the worker calls it every few seconds, with traffic or
    /// without, so a quiet ledger shrinks too.
    pub fn expire(&self, now_ms: i64) -> Result<Expired> {
        self.expire_behind(now_ms, &[])
    }

    /// [`Ledger::expire`] on the input's own clock: `behind` are the partitions that have not
    /// read all their input (catching up after an outage, loading, stalled, or not known to be
    /// caught up), and each holds the ledger's clock at the latest time recorded for it (its
    /// [`watermark`](Ledger::watermark)), so the ids their waiting records may repeat stay
    /// until those records are judged. With every partition caught up the clock is `now_ms`, and
    /// a quiet ledger shrinks on time.
    pub fn expire_behind(&self, now_ms: i64, behind: &[Partition]) -> Result<Expired> {
        let mut state = self.lock();
        let clock = behind
            .iter()
            .filter_map(|&p| state.watermark(p))
            .fold(now_ms, i64::min);
        self.expire_locked(&mut state, clock)
    }

    /// The latest time recorded for `partition`'s ids, whether the ledger still holds them or
    /// forgot them since: how far the partition's input has been read, on its own clock.
    pub fn watermark(&self, partition: Partition) -> Option<i64> {
        self.lock().watermark(partition)
    }

    pub(super) fn expire_locked(&self, state: &mut State, now_ms: i64) -> Result<Expired> {
        let Some(limit) = self.options.max_window_ms else {
            return Ok(Expired::default());
        };
        // A bulk load's fingerprints name the active generation: nothing is sealed under it.
        if state.generations.is_empty() || state.loads > 0 {
            return Ok(Expired::default());
        }
        let mut expired = Expired::default();
        let span = generation_span_ms(limit, self.options.generations);
        let active_base = state.generations.last().and_then(|g| g.meta.base_ms);
        let active_holds = state
            .generations
            .last()
            .is_some_and(|g| g.meta.ids > 0 || !state.pending.is_empty());
        if active_holds && active_base.is_some_and(|base| now_ms.saturating_sub(base) >= span) {
            self.seal_active(state, None)?;
            expired.sealed = true;
        }
        let floor = now_ms.saturating_sub(limit);
        let sealed = state.generations.len().saturating_sub(1);
        // Any sealed generation, not only the oldest: a handover's load makes a newer generation
        // of older ids.
        let past: Vec<usize> = state.generations[..sealed]
            .iter()
            .enumerate()
            .filter(|(_, g)| newest_ms(&g.meta).is_none_or(|newest| newest < floor))
            .map(|(position, _)| position)
            .collect();
        if !past.is_empty() {
            self.drop_generations(state, &past)?;
            expired.dropped = past.len();
        }
        Ok(expired)
    }

    /// The retention limit the ledger was last opened for writing under, as its metadata says
    /// (a checkpoint's says which limit its snapshot was taken under).
    pub fn recorded_limit(&self) -> Result<Option<i64>> {
        let meta = self.cf(CF_META)?;
        match self
            .db
            .get_cf(&meta, META_RETENTION_LIMIT)
            .map_err(rocks(Doing::Read))?
        {
            Some(bytes) => parse_json("retention limit", &bytes),
            None => Ok(None),
        }
    }

    /// Records the limit this open runs under, when it differs from the one recorded (a ledger
    /// opened only to read, by a maintenance command, records nothing). Ids kept under a longer
    /// limit, or none, are past the new one at their next lookup, and their generations go at the
    /// next [`Ledger::expire`].
    pub(super) fn record_limit(&self) -> Result<()> {
        let before = self.recorded_limit()?;
        if !self.options.build_index || before == self.options.max_window_ms {
            return Ok(());
        }
        let meta = self.cf(CF_META)?;
        self.db
            .put_cf_opt(
                &meta,
                META_RETENTION_LIMIT,
                to_json(&self.options.max_window_ms),
                &self.write_options(),
            )
            .map_err(rocks(Doing::Write))?;
        crate::metrics::events::RetentionLimitChanged {
            path: &self.path,
            before_ms: before,
            now_ms: self.options.max_window_ms,
        }
        .emit();
        Ok(())
    }
}

impl State {
    /// See [`Ledger::watermark`].
    pub(super) fn watermark(&self, partition: Partition) -> Option<i64> {
        self.generations
            .iter()
            .filter_map(|g| g.meta.partitions.get(&partition))
            .map(|s| s.last_seen_ms)
            .chain(self.forgotten.get(&partition).copied())
            .max()
    }
}

/// The floor below which an id is not taken in (not recorded, not loaded), on the input's own
/// clock: `limit_ms` before the latest time the partition has reached (its watermark, or a later
/// time just read), never past `now_ms`. An id older than that is past the limit for every copy
/// still to come after the records already read, so holding it would serve nothing.
pub fn retention_floor(limit_ms: Option<i64>, reached_ms: Option<i64>, now_ms: i64) -> Option<i64> {
    let limit = limit_ms?;
    Some(reached_ms?.min(now_ms).saturating_sub(limit))
}

/// A generation's share of the limit: the active one is sealed once it spans this.
pub fn generation_span_ms(limit_ms: i64, generations: u32) -> i64 {
    (limit_ms / i64::from(generations.max(1))).max(1)
}

/// The newest event time of any id in a generation, if it holds any.
fn newest_ms(meta: &super::GenerationMeta) -> Option<i64> {
    meta.partitions.values().map(|s| s.last_seen_ms).max()
}

impl State {
    /// The window, capped at the retention limit.
    pub(super) fn capped(window: Option<Duration>, limit_ms: Option<i64>) -> Option<Duration> {
        match (window, limit_ms) {
            (Some(w), Some(limit)) => {
                Some(w.min(Duration::from_millis(u64::try_from(limit).unwrap_or(0))))
            }
            (w, _) => w,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::load::WindowFloor;
    use super::super::{Durability, LedgerOptions, Verdict};
    use super::*;
    use crate::clock::now_ms;
    use crate::identity::{ledger_key, LedgerKey};

    const LIMIT_MS: i64 = 20_000;

    fn key(n: u64) -> LedgerKey {
        ledger_key(format!("id-{n}").as_bytes()).unwrap()
    }

    fn options(limit_ms: Option<i64>, refresh: bool) -> LedgerOptions {
        LedgerOptions {
            budget_bytes: 256 << 20,
            write_buffer_bytes: 1 << 20,
            block_cache_bytes: 1 << 20,
            durability: Durability::Wal,
            max_window_ms: limit_ms,
            refresh_on_duplicate: refresh,
            ..LedgerOptions::default()
        }
    }

    fn is_new(ledger: &Ledger, n: u64, at_ms: i64) -> bool {
        ledger
            .check_and_record(0, &[(key(n), at_ms)], b"p")
            .unwrap()[0]
            == Verdict::New
    }

    #[test]
    fn a_copy_past_the_limit_is_new_exactly_one_within_it_a_duplicate_also_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = now_ms() - 15_000;
        {
            let ledger = Ledger::open(dir.path(), options(Some(LIMIT_MS), false)).unwrap();
            assert!(is_new(&ledger, 1, t0));
            assert!(!is_new(&ledger, 1, t0 + 10_000), "10 s after: a duplicate");
            assert!(!is_new(&ledger, 1, t0 + 20_000), "20 s after: still one");
            assert!(
                is_new(&ledger, 1, t0 + 25_000),
                "25 s after: past the limit"
            );
            assert!(
                !is_new(&ledger, 1, t0 + 30_000),
                "5 s after the new sighting"
            );
            assert!(is_new(&ledger, 2, t0));
            ledger.flush().unwrap();
        }
        let ledger = Ledger::open(dir.path(), options(Some(LIMIT_MS), false)).unwrap();
        assert!(
            !is_new(&ledger, 1, t0 + 40_000),
            "the sighting at +25 s holds it"
        );
        assert!(
            is_new(&ledger, 2, t0 + 21_000),
            "past the limit after the reopen too"
        );
        assert_eq!(ledger.stats().unwrap().retention_limit_ms, Some(LIMIT_MS));
    }

    #[test]
    fn a_copy_at_the_limit_is_a_duplicate_and_one_a_millisecond_later_is_new_at_any_record_time() {
        let now = now_ms();
        // First sightings at odd milliseconds, and at a generation base that is not theirs.
        for t0 in [now - 15_000 + 757, now - 15_000 + 1, now - 14_001] {
            let dir = tempfile::tempdir().unwrap();
            let ledger = Ledger::open(dir.path(), options(Some(LIMIT_MS), false)).unwrap();
            assert!(is_new(&ledger, 9, t0 - 333), "another id sets the base");
            assert!(is_new(&ledger, 1, t0));
            assert!(is_new(&ledger, 2, t0));
            assert!(is_new(&ledger, 3, t0));
            assert!(!is_new(&ledger, 1, t0 + LIMIT_MS - 1), "1 ms within");
            assert!(
                !is_new(&ledger, 2, t0 + LIMIT_MS),
                "at the limit: a duplicate"
            );
            assert!(is_new(&ledger, 3, t0 + LIMIT_MS + 1), "1 ms past: new");
            // The same after the buffered ids are committed to disk and the ledger reopened.
            assert!(is_new(&ledger, 4, t0));
            assert!(is_new(&ledger, 5, t0));
            ledger.flush().unwrap();
            drop(ledger);
            let ledger = Ledger::open(dir.path(), options(Some(LIMIT_MS), false)).unwrap();
            assert!(
                !is_new(&ledger, 4, t0 + LIMIT_MS),
                "at the limit, from disk"
            );
            assert!(
                is_new(&ledger, 5, t0 + LIMIT_MS + 1),
                "1 ms past, from disk"
            );
        }
    }

    #[test]
    fn a_ledger_with_a_millisecond_generation_is_marked_so_and_one_without_stays_readable_by_older_builds(
    ) {
        let marker = |ledger: &Ledger| {
            let meta = ledger.cf(CF_META).unwrap();
            let bytes = ledger
                .db
                .get_cf(&meta, super::super::format::META_FORMAT_VERSION)
                .unwrap()
                .unwrap();
            u32::from_le_bytes(bytes.as_slice().try_into().unwrap())
        };
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), options(None, false)).unwrap();
        assert_eq!(marker(&ledger), super::super::SECONDS_FORMAT_VERSION);
        let now = now_ms();
        assert!(is_new(&ledger, 1, now));
        drop(ledger);
        // A limit set on a ledger of seconds: its active generation stays in seconds, and so
        // does the marker, until the next generation starts.
        let ledger = Ledger::open(dir.path(), options(Some(LIMIT_MS), false)).unwrap();
        assert_eq!(marker(&ledger), super::super::SECONDS_FORMAT_VERSION);
        assert!(ledger.expire(now + LIMIT_MS).unwrap().sealed);
        assert_eq!(marker(&ledger), super::super::FORMAT_VERSION);
        // A ledger made under a limit is millisecond from its first generation.
        let fresh = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(fresh.path(), options(Some(LIMIT_MS), false)).unwrap();
        assert_eq!(marker(&ledger), super::super::FORMAT_VERSION);
    }

    #[test]
    fn nothing_older_than_the_limit_before_its_partitions_clock_is_recorded_or_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), options(Some(LIMIT_MS), false)).unwrap();
        let now = now_ms();
        let old = now - 60_000;
        // Read after an outage, an old id is its partition's clock: taken in, so a copy within
        // the limit after it is still caught.
        assert!(is_new(&ledger, 1, old));
        assert!(!is_new(&ledger, 1, old + 5_000), "5 s after it, read later");
        assert_eq!(ledger.watermark(0), Some(old));
        // The partition reaches now: an id older than the limit before that is late, not taken
        // in (a copy of it still to come would be past the limit of every record read since).
        assert!(is_new(&ledger, 2, now));
        assert!(is_new(&ledger, 3, now - LIMIT_MS - 1));
        assert_eq!(
            ledger.check(&[key(3)]).unwrap(),
            [None],
            "late: not recorded"
        );
        assert!(is_new(&ledger, 4, now - LIMIT_MS), "at the limit: taken in");
        assert!(ledger.check(&[key(4)]).unwrap()[0].is_some());
        // Within one batch the clock moves with its items: the first taken in, the third late.
        let batch = [(key(5), old), (key(6), now), (key(7), old + 1)];
        let dir2 = tempfile::tempdir().unwrap();
        let fresh = Ledger::open(dir2.path(), options(Some(LIMIT_MS), false)).unwrap();
        fresh.check_and_record(0, &batch, b"p").unwrap();
        let held = fresh.check(&[key(5), key(6), key(7)]).unwrap();
        assert!(
            held[0].is_some() && held[1].is_some() && held[2].is_none(),
            "{held:?}"
        );
        // The clock is per partition: partition 1 has reached nothing yet.
        assert!(fresh
            .check_and_record(1, &[(key(8), old)], b"p")
            .is_ok_and(|v| v == [Verdict::New]));
        assert!(fresh.check(&[key(8)]).unwrap()[0].is_some());
        // And never runs past the wall clock: an id stamped an hour ahead moves it to now only.
        fresh
            .check_and_record(2, &[(key(9), now + 3_600_000)], b"p")
            .unwrap();
        fresh
            .check_and_record(2, &[(key(10), now - 10_000)], b"p")
            .unwrap();
        assert!(fresh.check(&[key(10)]).unwrap()[0].is_some());
        // A load keeps its own clock: the newest time it read.
        let mut load = ledger.begin_load(3);
        load.add(&[(key(11), old), (key(12), now)]).unwrap();
        load.finish(b"p", WindowFloor::Keep).unwrap();
        let held = ledger.check(&[key(11), key(12)]).unwrap();
        assert!(held[0].is_none() && held[1].is_some(), "{held:?}");
        let mut load = ledger.begin_load(4);
        load.add(&[(key(13), old)]).unwrap();
        load.finish(b"p", WindowFloor::Keep).unwrap();
        assert!(
            ledger.check(&[key(13)]).unwrap()[0].is_some(),
            "a load read after an outage keeps what its partition may repeat"
        );
    }

    #[test]
    fn expiry_waits_for_the_partitions_behind_and_a_caught_up_ledger_expires_on_the_wall_clock() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), options(Some(LIMIT_MS), false)).unwrap();
        let now = now_ms();
        let t0 = now - 60_000;
        // Partition 0 read ids at t0, then the worker stopped for a minute, three limits.
        let ids: Vec<(LedgerKey, i64)> = (0..100).map(|n| (key(n), t0)).collect();
        ledger.check_and_record(0, &ids, b"p").unwrap();
        // Behind, partition 0 holds the clock at its watermark (t0): nothing is sealed or
        // dropped, whatever the wall clock says.
        assert_eq!(ledger.expire_behind(now, &[0]).unwrap(), Expired::default());
        assert!(ledger.check(&[key(1)]).unwrap()[0].is_some());
        // A partition behind with nothing recorded holds nothing back.
        assert_eq!(
            ledger.expire_behind(now, &[0, 7]).unwrap(),
            Expired::default()
        );
        // Caught up: the wall clock, and the ids go.
        let expired = ledger.expire_behind(now, &[7]).unwrap();
        assert_eq!(
            expired,
            Expired {
                sealed: true,
                dropped: 1
            }
        );
        assert!(ledger.check(&[key(1)]).unwrap()[0].is_none());
    }

    #[test]
    fn generations_are_sealed_by_span_and_dropped_past_the_limit_and_the_window_never_exceeds_it() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), options(Some(LIMIT_MS), false)).unwrap();
        let t0 = now_ms();
        let ids: Vec<(LedgerKey, i64)> = (0..1000).map(|n| (key(n), t0)).collect();
        ledger.check_and_record(0, &ids, b"p").unwrap();
        assert_eq!(ledger.expire(t0 + 1_000).unwrap(), Expired::default());
        let span = generation_span_ms(LIMIT_MS, 8);
        assert_eq!(span, 2_500);
        let sealed = ledger.expire(t0 + span).unwrap();
        assert_eq!(
            sealed,
            Expired {
                sealed: true,
                dropped: 0
            }
        );
        assert_eq!(ledger.generations().unwrap().len(), 2);
        // The window, asked long after, is the limit at most.
        let window = ledger.window(0, t0 + 100_000).unwrap();
        assert_eq!(window, Duration::from_millis(LIMIT_MS as u64));
        // Within the limit the generation stays; past it, it goes whole.
        assert_eq!(ledger.expire(t0 + LIMIT_MS).unwrap().dropped, 0);
        let dropped = ledger.expire(t0 + LIMIT_MS + 1).unwrap();
        assert_eq!(dropped.dropped, 1);
        let stats = ledger.stats().unwrap();
        assert_eq!(stats.ids_estimate, 0);
        assert_eq!(stats.generations, 1, "the empty active generation");
        assert_eq!(ledger.check(&[key(1)]).unwrap(), [None]);
        // An empty active generation is not sealed, however old the ledger.
        assert_eq!(
            ledger.expire(t0 + 10 * LIMIT_MS).unwrap(),
            Expired::default()
        );
    }

    #[test]
    fn without_a_limit_expire_does_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), options(None, false)).unwrap();
        assert!(is_new(&ledger, 1, 1_000));
        assert_eq!(ledger.expire(i64::MAX / 2).unwrap(), Expired::default());
        assert!(!is_new(&ledger, 1, i64::MAX / 4));
        assert_eq!(ledger.stats().unwrap().retention_limit_ms, None);
    }

    #[test]
    fn a_refreshed_id_stays_held_while_copies_keep_coming_and_goes_the_limit_after_the_last() {
        let t0 = now_ms() - 10_000;
        for refresh in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let ledger = Ledger::open(dir.path(), options(Some(LIMIT_MS), refresh)).unwrap();
            assert!(is_new(&ledger, 1, t0));
            // A copy every 5 s for 60 s: with refresh every one is a duplicate; without, the
            // copies past 20 s after the last recorded sighting are new (at +25 s and +50 s).
            let new_at: Vec<i64> = (1..=12)
                .map(|i| t0 + i * 5_000)
                .filter(|&at| is_new(&ledger, 1, at))
                .map(|at| (at - t0) / 1000)
                .collect();
            if refresh {
                assert!(new_at.is_empty(), "{new_at:?}");
                // The held time is the last copy's; a copy 21 s after it is new.
                let last = t0 + 60_000;
                assert_eq!(ledger.check(&[key(1)]).unwrap(), [Some(last)]);
                assert!(is_new(&ledger, 1, last + 21_000));
            } else {
                assert_eq!(new_at, [25, 50]);
            }
        }
    }
}

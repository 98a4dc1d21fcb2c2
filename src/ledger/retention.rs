//! The retention limit ([`LedgerOptions::max_window_ms`](super::LedgerOptions::max_window_ms)):
//! time, not only the disk budget, bounds what the ledger holds.
//!
//! - **Lookups, exactly.** A copy arriving more than the limit after its id's last recorded
//!   sighting is judged as if the id were not held ([`past_limit`]), whatever generation still
//!   holds its bytes: each id's sighting is stored, so this does not wait for a generation to go.
//!   The copy is then recorded again, as a first sighting.
//! - **Nothing older is taken in.** An id whose sighting is already older than the limit at the
//!   wall clock is neither recorded by a batch nor loaded by a handover.
//! - **Bytes, by the generation.** The active generation is sealed once it spans a generation's
//!   share of the limit (`limit / generations`), and a sealed generation is dropped whole once its
//!   newest id is older than the limit: no id's bytes outlive the limit by more than one
//!   generation's span (plus the time until the next [`Ledger::expire`], which the worker calls
//!   every few seconds). A quiet ledger shrinks to what its limit holds.
//! - **The window** never exceeds the limit.

use std::time::Duration;

use super::error::{rocks, Doing};
use super::format::{parse_json, to_json, META_RETENTION_LIMIT};
use super::{Ledger, Result, State, CF_META};

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
        let mut state = self.lock();
        self.expire_locked(&mut state, now_ms)
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

    /// The wall-clock floor below which nothing is recorded or loaded, if there is a limit.
    pub(super) fn retention_floor(&self, now_ms: i64) -> Option<i64> {
        self.options
            .max_window_ms
            .map(|limit| now_ms.saturating_sub(limit))
    }
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
    fn nothing_older_than_the_limit_is_recorded_or_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), options(Some(LIMIT_MS), false)).unwrap();
        let old = now_ms() - 60_000;
        assert!(is_new(&ledger, 1, old));
        assert_eq!(ledger.check(&[key(1)]).unwrap(), [None], "not recorded");
        let mut load = ledger.begin_load(0);
        load.add(&[(key(2), old), (key(3), now_ms())]).unwrap();
        load.finish(b"p", WindowFloor::Keep).unwrap();
        let held = ledger.check(&[key(2), key(3)]).unwrap();
        assert!(held[0].is_none() && held[1].is_some(), "{held:?}");
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

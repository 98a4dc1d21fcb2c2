//! [`MemoryStore`]: an [`IdStore`] in memory, for tests of what is written against the trait.
//! One map of ids and one generation: it keeps the ledger's rules (verdicts, first sightings
//! rounded as the ledger stores them, digests, refresh, the retention limit, marks, progress),
//! not its costs or its forgetting by budget. The conformance suite holds it to the ledger.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use super::{IdStore, Looked, NewId};
use crate::identity::LedgerKey;
use crate::ledger::{
    forgotten_since, past_limit, retention_floor, stored_first_seen_ms, Forgotten, Held,
    LedgerError, Mark, MarkKind, MarkOrder, Result, TimeBase, Verdict, FIRST_SEEN_RESOLUTION_MS,
};
use crate::Partition;

/// Ids, marks and progress records in memory (see the module docs).
#[derive(Debug, Default)]
pub struct MemoryStore {
    /// The retention limit, ms (`ledger.max_window_secs`).
    limit_ms: Option<i64>,
    /// `ledger.refresh_on_duplicate`.
    refresh: bool,
    state: Mutex<MemoryState>,
}

#[derive(Debug, Default)]
struct MemoryState {
    /// The one generation's base: the time of the first id recorded.
    base_ms: Option<i64>,
    held: HashMap<LedgerKey, Held>,
    /// Per key, at most one mark per partition.
    marks: HashMap<LedgerKey, Vec<Mark>>,
    progress: BTreeMap<Partition, Vec<u8>>,
    /// Per partition, the latest time recorded (see `dedupe::ledger::Ledger::watermark`).
    watermarks: BTreeMap<Partition, i64>,
    /// The next call fails with this error, once (a test's injected fault).
    fail_next: Option<LedgerError>,
}

impl MemoryStore {
    /// A store with the retention limit `limit_ms` and, with `refresh`, ids refreshed by their
    /// later copies (as a ledger opened with those options).
    pub fn new(limit_ms: Option<i64>, refresh: bool) -> Self {
        Self {
            limit_ms,
            refresh,
            state: Mutex::default(),
        }
    }

    /// Its one generation's time base: to the millisecond under a retention limit, in seconds
    /// otherwise, as the ledger starts its generations.
    fn time_base(&self, base_ms: i64) -> TimeBase {
        TimeBase {
            base_ms,
            resolution_ms: if self.limit_ms.is_some() {
                1
            } else {
                FIRST_SEEN_RESOLUTION_MS
            },
        }
    }

    /// Makes the next call fail with `error`, having done nothing.
    pub fn fail_next(&self, error: LedgerError) {
        self.lock().fail_next = Some(error);
    }

    /// Every id held, with what is held of it (marks aside).
    pub fn held_ids(&self) -> HashMap<LedgerKey, Held> {
        self.lock().held.clone()
    }

    /// The marks of `key`, by partition.
    pub fn marks_of(&self, key: &LedgerKey) -> Vec<Mark> {
        let mut marks = self.lock().marks.get(key).cloned().unwrap_or_default();
        marks.sort_by_key(|m| m.partition);
        marks
    }

    fn lock(&self) -> MutexGuard<'_, MemoryState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The state, unless a fault was injected for this call.
    fn enter(&self) -> Result<MutexGuard<'_, MemoryState>> {
        let mut state = self.lock();
        match state.fail_next.take() {
            Some(error) => Err(error),
            None => Ok(state),
        }
    }
}

impl MemoryState {
    /// What a partition's pipeline sees of `key`: nothing while it is forgotten.
    fn seen(&self, key: &LedgerKey) -> Option<Held> {
        let forgotten = self.marks.get(key).and_then(|marks| forgotten_since(marks));
        self.held.get(key).copied().filter(|_| forgotten.is_none())
    }

    fn apply_marks(&mut self, marks: &[(LedgerKey, Mark)], order: MarkOrder) {
        for (key, mark) in marks {
            let held = self.marks.entry(*key).or_default();
            match held.iter_mut().find(|m| m.partition == mark.partition) {
                Some(m)
                    if order == MarkOrder::Newest || mark.changelog_offset > m.changelog_offset =>
                {
                    *m = *mark
                }
                Some(_) => {}
                None => held.push(*mark),
            }
        }
    }
}

impl IdStore for MemoryStore {
    fn look_up(&self, keys: &[LedgerKey]) -> Result<Looked> {
        let state = self.enter()?;
        let mut distinct = keys.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let forgotten = distinct
            .iter()
            .filter_map(|key| {
                let marks = state.marks.get(key)?;
                let at_ms = forgotten_since(marks)?;
                let partitions = marks
                    .iter()
                    .filter(|m| m.kind == MarkKind::Forgotten && m.at_ms == at_ms)
                    .map(|m| m.partition)
                    .collect();
                Some(Forgotten {
                    key: *key,
                    at_ms,
                    partitions,
                })
            })
            .collect();
        Ok(Looked {
            held: keys.iter().map(|k| state.seen(k)).collect(),
            forgotten,
        })
    }

    fn record(
        &self,
        partition: Partition,
        items: &[NewId],
        progress: &[u8],
        marks: &[(LedgerKey, Mark)],
    ) -> Result<Vec<Verdict>> {
        let mut state = self.enter()?;
        let base_ms = state
            .base_ms
            .or_else(|| items.first().map(|i| i.1))
            .unwrap_or(0);
        let now_ms = crate::clock::now_ms();
        let mut reached = state.watermarks.get(&partition).copied();
        // What each key is held or recorded as so far in this batch, and what to record.
        let mut seen: HashMap<LedgerKey, Option<Held>> = HashMap::new();
        let mut recorded: Vec<(LedgerKey, Held)> = Vec::new();
        // The latest exact time recorded (the ledger's spans keep exact times).
        let mut recorded_latest: Option<i64> = None;
        let mut note =
            |t: i64| recorded_latest = Some(recorded_latest.map_or(t, |r: i64| r.max(t)));
        let mut verdicts = Vec::with_capacity(items.len());
        for &(key, time_ms, digest) in items {
            reached = Some(reached.map_or(time_ms, |r| r.max(time_ms)));
            let held = *seen.entry(key).or_insert_with(|| state.seen(&key));
            let stored = stored_first_seen_ms(self.time_base(base_ms), time_ms);
            let live = held.filter(|h| !past_limit(self.limit_ms, h.first_seen_ms, time_ms));
            if let Some(h) = live {
                verdicts.push(Verdict::Duplicate {
                    first_seen_ms: h.first_seen_ms,
                    digest: h.digest,
                });
                if self.refresh && stored > h.first_seen_ms {
                    let refreshed = Held {
                        first_seen_ms: stored,
                        digest: h.digest,
                    };
                    seen.insert(key, Some(refreshed));
                    recorded.push((key, refreshed));
                    note(time_ms);
                }
                continue;
            }
            verdicts.push(Verdict::New);
            let new = Held {
                first_seen_ms: stored,
                digest,
            };
            seen.insert(key, Some(new));
            let floor = retention_floor(self.limit_ms, reached, now_ms);
            if floor.is_some_and(|floor| time_ms < floor) {
                // Older than the limit already: judged new, recorded nowhere.
                continue;
            }
            recorded.push((key, new));
            note(time_ms);
        }
        state.apply_marks(marks, MarkOrder::Newest);
        if !recorded.is_empty() {
            state.base_ms = Some(base_ms);
        }
        // The partition's watermark: the latest time recorded for it (as the ledger's generation
        // spans keep it), whatever it holds now.
        if let Some(latest) = recorded_latest {
            let w = state.watermarks.entry(partition).or_insert(latest);
            *w = (*w).max(latest);
        }
        state.held.extend(recorded);
        if !progress.is_empty() {
            state.progress.insert(partition, progress.to_vec());
        }
        Ok(verdicts)
    }

    fn mark(&self, marks: &[(LedgerKey, Mark)], order: MarkOrder) -> Result<()> {
        self.enter()?.apply_marks(marks, order);
        Ok(())
    }

    fn progress(&self, partition: Partition) -> Result<Option<Vec<u8>>> {
        Ok(self.enter()?.progress.get(&partition).cloned())
    }
}

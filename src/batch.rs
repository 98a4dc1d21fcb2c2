//! The per-batch decision that exactly-once rests on, apart from any I/O: given a batch's ids in
//! input order and what the ledger answered for them, which records are published, which are
//! dropped as duplicates, which are dead-lettered or forwarded for want of an id, and which ids
//! are recorded with which first-seen time.
//!
//! Guarantees (each a test below):
//! - a record is published only if its id is neither in the ledger nor earlier in the batch, so
//!   an id is published at most once per batch and never again once recorded;
//! - the first copy of an id is the one published, and published records keep input order;
//! - exactly the published ids are recorded, each with its record's timestamp (never later than
//!   `now`, so a client clock in the future cannot stretch the window);
//! - records without a usable id follow the unkeyed policy and are never recorded.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use crate::config::UnkeyedPolicy;
use crate::identity::LedgerKey;
use crate::identity::Unkeyed;

/// One input record, as far as the decision is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The record's id, or why it has none.
    pub id: Result<LedgerKey, Unkeyed>,
    /// The record's timestamp, if it has one.
    pub timestamp_ms: Option<i64>,
}

/// What happens to one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Published, and its id recorded.
    Publish,
    /// Dropped: its id was first seen at `first_seen_ms`, `age_ms` before this record's time (0
    /// if its clock is behind); `in_batch`: the first copy is earlier in this batch.
    Duplicate { first_seen_ms: i64, age_ms: i64, in_batch: bool },
    /// No usable id: published without being recorded (policy `forward`).
    Forward(Unkeyed),
    /// No usable id: written to the dead-letter topic (policy `dead-letter`).
    DeadLetter(Unkeyed),
    /// No usable id: dropped (policy `drop`).
    Drop(Unkeyed),
}

/// The decision for a whole batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchDecision {
    /// One fate per record, in input order.
    pub fates: Vec<Fate>,
    /// The ids to record, with their first-seen times, in input order.
    pub new_ids: Vec<(LedgerKey, i64)>,
    /// The oldest timestamp among the published new ids (for the end-to-end latency).
    pub oldest_new_ms: Option<i64>,
}

impl BatchDecision {
    /// Records dropped as duplicates.
    pub fn duplicates(&self) -> usize {
        self.fates.iter().filter(|f| matches!(f, Fate::Duplicate { .. })).count()
    }
}

/// Decides a batch. `found` holds the ledger's answer (first-seen ms, if held) for each keyed
/// candidate, in order: one entry per candidate whose id is `Ok`.
///
/// # Panics
/// If `found` has fewer entries than the batch has keyed candidates: the ledger answers one per id.
pub fn decide(candidates: &[Candidate], found: &[Option<i64>], policy: UnkeyedPolicy, now_ms: i64) -> BatchDecision {
    let mut found = found.iter().copied();
    let mut seen_in_batch: HashMap<LedgerKey, i64> = HashMap::with_capacity(candidates.len());
    let mut fates = Vec::with_capacity(candidates.len());
    let mut new_ids = Vec::with_capacity(candidates.len());
    let mut oldest_new_ms: Option<i64> = None;
    for candidate in candidates {
        let ts = candidate.timestamp_ms.unwrap_or(now_ms);
        let fate = match candidate.id {
            Ok(key) => {
                let in_ledger = found.next().expect("the ledger answers once per keyed record");
                if let Some(first_seen) = in_ledger {
                    Fate::Duplicate { first_seen_ms: first_seen, age_ms: (ts - first_seen).max(0), in_batch: false }
                } else {
                    match seen_in_batch.entry(key) {
                        Entry::Occupied(first) => {
                            let first_seen = *first.get();
                            Fate::Duplicate { first_seen_ms: first_seen, age_ms: (ts - first_seen).max(0), in_batch: true }
                        }
                        Entry::Vacant(slot) => {
                            let first_seen = ts.min(now_ms);
                            slot.insert(first_seen);
                            oldest_new_ms = Some(oldest_new_ms.map_or(ts, |o| o.min(ts)));
                            new_ids.push((key, first_seen));
                            Fate::Publish
                        }
                    }
                }
            }
            Err(reason) => match policy {
                UnkeyedPolicy::Forward => Fate::Forward(reason),
                UnkeyedPolicy::DeadLetter => Fate::DeadLetter(reason),
                UnkeyedPolicy::Drop => Fate::Drop(reason),
            },
        };
        fates.push(fate);
    }
    BatchDecision { fates, new_ids, oldest_new_ms }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(n: u8) -> LedgerKey {
        crate::identity::ledger_key(&[b'k', n]).unwrap()
    }

    fn keyed(n: u8, ts: i64) -> Candidate {
        Candidate { id: Ok(key(n)), timestamp_ms: Some(ts) }
    }

    const NOW: i64 = 1_000_000;

    #[test]
    fn new_ids_are_published_once_and_repeats_in_the_batch_dropped() {
        // The third record repeats the first id: dropped, 20 ms after the first copy, which is
        // published.
        let batch = [keyed(1, 10), keyed(2, 20), keyed(1, 30)];
        let d = decide(&batch, &[None, None, None], UnkeyedPolicy::Forward, NOW);
        assert_eq!(d.fates, [Fate::Publish, Fate::Publish, Fate::Duplicate { first_seen_ms: 10, age_ms: 20, in_batch: true }]);
        assert_eq!(d.new_ids, [(key(1), 10), (key(2), 20)]);
        assert_eq!(d.oldest_new_ms, Some(10));
        assert_eq!(d.duplicates(), 1);
    }

    #[test]
    fn ids_the_ledger_holds_are_dropped_with_their_age() {
        // The ledger first saw id 2 at 5; this copy is stamped 500.
        let d = decide(&[keyed(1, 100), keyed(2, 500)], &[None, Some(5)], UnkeyedPolicy::Forward, NOW);
        assert_eq!(d.fates, [Fate::Publish, Fate::Duplicate { first_seen_ms: 5, age_ms: 495, in_batch: false }]);
        assert_eq!(d.new_ids, [(key(1), 100)]);
    }

    #[test]
    fn first_seen_times_never_lie_in_the_future() {
        // A record stamped after `now` (a client clock ahead) is recorded at `now`; a record
        // without a timestamp is stamped `now`.
        let batch = [keyed(1, NOW + 60_000), Candidate { id: Ok(key(2)), timestamp_ms: None }];
        let d = decide(&batch, &[None, None], UnkeyedPolicy::Forward, NOW);
        assert_eq!(d.new_ids, [(key(1), NOW), (key(2), NOW)]);
    }

    #[test]
    fn records_without_an_id_follow_the_policy_and_are_never_recorded() {
        let batch = [Candidate { id: Err(Unkeyed::Missing), timestamp_ms: Some(1) }, keyed(1, 2)];
        for (policy, fate) in [
            (UnkeyedPolicy::Forward, Fate::Forward(Unkeyed::Missing)),
            (UnkeyedPolicy::DeadLetter, Fate::DeadLetter(Unkeyed::Missing)),
            (UnkeyedPolicy::Drop, Fate::Drop(Unkeyed::Missing)),
        ] {
            // The ledger is asked only about the keyed record.
            let d = decide(&batch, &[None], policy, NOW);
            assert_eq!(d.fates, [fate, Fate::Publish]);
            assert_eq!(d.new_ids, [(key(1), 2)]);
        }
    }

    proptest! {
        /// Against a set as the ledger: every id published at most once over many batches, the
        /// first copy published, and exactly the published ids recorded.
        #[test]
        fn over_many_batches_each_id_is_published_exactly_once(
            batches in proptest::collection::vec(proptest::collection::vec(0u8..40, 0..30), 1..20),
        ) {
            let mut ledger = std::collections::HashMap::new();
            let mut published = Vec::new();
            let mut all_ids = std::collections::BTreeSet::new();
            for (b, ids) in batches.iter().enumerate() {
                let batch: Vec<Candidate> = ids.iter().map(|&n| keyed(n, b as i64)).collect();
                let found: Vec<Option<i64>> = ids.iter().map(|n| ledger.get(&key(*n)).copied()).collect();
                let d = decide(&batch, &found, UnkeyedPolicy::Forward, NOW);
                for (i, fate) in d.fates.iter().enumerate() {
                    if *fate == Fate::Publish {
                        published.push(ids[i]);
                    }
                }
                let recorded: Vec<LedgerKey> = d.new_ids.iter().map(|(k, _)| *k).collect();
                let publishes: Vec<LedgerKey> = d.fates.iter().zip(ids).filter(|(f, _)| **f == Fate::Publish).map(|(_, n)| key(*n)).collect();
                prop_assert_eq!(recorded, publishes);
                for (k, ts) in d.new_ids {
                    ledger.insert(k, ts);
                }
                all_ids.extend(ids.iter().copied());
            }
            let mut sorted = published.clone();
            sorted.sort_unstable();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), published.len(), "an id was published twice");
            prop_assert_eq!(sorted, all_ids.into_iter().collect::<Vec<_>>(), "an id was never published");
        }
    }
}

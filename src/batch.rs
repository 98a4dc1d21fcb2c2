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
//! - records without a usable id follow the unkeyed policy and are never recorded;
//! - a copy is a `retry` when its content digest and the first copy's agree, `reused_id` when
//!   they differ, `unknown` when either has none; a reused id follows its policy, and is never
//!   recorded again;
//! - a copy from a source whose mode is `flag` or `off` is published (not recorded again), the
//!   first copy of an id is recorded whatever its source's mode.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::identity::{ContentDigest, LedgerKey, Unkeyed};
use crate::ledger::{past_limit, Held};
use crate::wire::{HEADER_DUPLICATE, HEADER_INPUT_DUPLICATE};

/// One input record, as far as the decision is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The record's id, or why it has none.
    pub id: Result<LedgerKey, Unkeyed>,
    /// The record's timestamp, if it has one.
    pub timestamp_ms: Option<i64>,
    /// The digest of its content (see [`crate::identity::DigestSource`]), if it has one.
    pub digest: Option<ContentDigest>,
    /// What its source's copies of seen ids get (`worker.source_modes`).
    pub mode: SourceMode,
}

/// Renames the [`HEADER_DUPLICATE`] headers a record came in with to [`HEADER_INPUT_DUPLICATE`]
/// (same values, same places), so that a record published as a first copy carries no header
/// claiming it is a duplicate, and a copy the worker flags carries exactly one: its own. Called on
/// every record the worker publishes to the output, before its own flag is added; the number
/// renamed is counted. Dead letters and audit records keep the input's headers as they were.
pub fn rename_input_duplicate_headers(headers: &mut [(String, Option<Vec<u8>>)]) -> usize {
    let mut renamed = 0;
    for (name, _) in headers
        .iter_mut()
        .filter(|(name, _)| name.as_str() == HEADER_DUPLICATE)
    {
        *name = HEADER_INPUT_DUPLICATE.to_string();
        renamed += 1;
    }
    renamed
}

/// What happens to a copy of an id already seen, per source (`worker.source_modes`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SourceMode {
    /// Dropped (the service's purpose; the default).
    #[default]
    Drop,
    /// Published with a `dedupe-duplicate` header holding its verdict, for teams that want to see
    /// their duplicates downstream.
    Flag,
    /// Published as it is: deduplication off for the source (its copies are still counted).
    Off,
}

impl SourceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceMode::Drop => "drop",
            SourceMode::Flag => "flag",
            SourceMode::Off => "off",
        }
    }

    /// The mode written `text`, or what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "drop" => Ok(SourceMode::Drop),
            "flag" => Ok(SourceMode::Flag),
            "off" => Ok(SourceMode::Off),
            other => Err(format!("`{other}` is not a mode: drop, flag or off")),
        }
    }
}

/// What a copy of an id already seen is, by its content against the first copy's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The same content: a retry.
    Retry,
    /// Other content under the same id: a client reusing ids (or a collision of ids).
    ReusedId,
    /// One of the two copies has no digest (recorded before digests, loaded from the
    /// changelog, or `worker.content_digest` does not give one).
    Unknown,
}

impl Verdict {
    /// All verdicts, in the order the metrics list them.
    pub const ALL: [Verdict; 3] = [Verdict::Retry, Verdict::ReusedId, Verdict::Unknown];

    fn of(first: Option<ContentDigest>, this: Option<ContentDigest>) -> Verdict {
        match (first, this) {
            (Some(a), Some(b)) if a == b => Verdict::Retry,
            (Some(_), Some(_)) => Verdict::ReusedId,
            _ => Verdict::Unknown,
        }
    }

    /// The `verdict` label and the audit record's field.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Retry => "retry",
            Verdict::ReusedId => "reused_id",
            Verdict::Unknown => "unknown",
        }
    }
}

/// Where an id was seen before: when, and how this copy compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The first copy's first-seen time, ms.
    pub first_seen_ms: i64,
    /// This copy's time less the first copy's (0 if its clock is behind).
    pub age_ms: i64,
    /// The first copy is earlier in this batch.
    pub in_batch: bool,
    pub verdict: Verdict,
    /// The drop recorded the id again at this copy's time ([`Rules::refresh`]).
    pub refreshed: bool,
}

/// What happens to one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Published, and its id recorded.
    Publish,
    /// Dropped: its id was seen before (a retry, a reused id under the policy `drop`, or
    /// unknown).
    Duplicate(Seen),
    /// A reused id published or dead-lettered by the policy, and not recorded again.
    Reused(Seen, ReusedIdPolicy),
    /// A copy of a seen id from a source whose mode is `flag` or `off`: published, not recorded
    /// again.
    Passed(Seen, SourceMode),
    /// No usable id: published without being recorded (policy `forward`).
    Forward(Unkeyed),
    /// No usable id: written to the dead-letter topic (policy `dead-letter`).
    DeadLetter(Unkeyed),
    /// No usable id: dropped (policy `drop`).
    Drop(Unkeyed),
}

impl Fate {
    /// Whether the record is published to the output topic (not dropped, dead-lettered or only
    /// audited).
    pub fn reaches_output(&self) -> bool {
        match self {
            Fate::Publish | Fate::Passed(..) | Fate::Forward(_) => true,
            Fate::Reused(_, policy) => *policy != ReusedIdPolicy::DeadLetter,
            Fate::Duplicate(_) | Fate::DeadLetter(_) | Fate::Drop(_) => false,
        }
    }

    /// Whether the record is written anywhere as itself: to the output, or to the dead-letter
    /// topic (a record the output then refuses goes to the dead-letter topic in its place).
    pub fn reaches_output_or_dead_letter(&self) -> bool {
        match self {
            Fate::DeadLetter(_) | Fate::Reused(_, ReusedIdPolicy::DeadLetter) => true,
            other => other.reaches_output(),
        }
    }
}

/// The decision for a whole batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchDecision {
    /// One fate per record, in input order.
    pub fates: Vec<Fate>,
    /// The ids to record, with their first-seen times and digests, in input order.
    pub new_ids: Vec<(LedgerKey, i64, Option<ContentDigest>)>,
    /// The oldest timestamp among the published new ids (for the end-to-end latency).
    pub oldest_new_ms: Option<i64>,
    /// Where in `new_ids` the refreshes are, ascending: ids of dropped copies recorded again at
    /// the copy's time (with [`Rules::refresh`]), not published records.
    pub refreshes: Vec<usize>,
}

impl BatchDecision {
    /// Records dropped as duplicates.
    pub fn duplicates(&self) -> usize {
        self.fates
            .iter()
            .filter(|f| matches!(f, Fate::Duplicate(_)))
            .count()
    }
}

/// What happens to a record whose id is missing, empty, longer than 1 KiB or unreadable.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum UnkeyedPolicy {
    /// Publish it to the output unchecked: never lose data (the default).
    Forward,
    /// Drop it, counted and logged.
    Drop,
    /// Publish it to `worker.dead_letter_topic`, in the same transaction.
    DeadLetter,
}

/// What happens to a record whose id the ledger holds for other content.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ReusedIdPolicy {
    /// Dropped as a duplicate (verdict `reused_id`), counted and audited.
    Drop,
    /// Published; its id stays recorded for the first copy.
    Publish,
    /// Published to `worker.dead_letter_topic`, in the same transaction.
    DeadLetter,
}

/// How a batch is decided: the policies, and the time.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    pub unkeyed: UnkeyedPolicy,
    pub reused_id: ReusedIdPolicy,
    /// Now, ms: no first-seen time is later.
    pub now_ms: i64,
    /// The retention limit, ms (`ledger.max_window_secs`): a copy arriving more than this after
    /// the sighting held is published as new ([`crate::ledger::past_limit`]).
    pub limit_ms: Option<i64>,
    /// `ledger.refresh_on_duplicate`: a dropped copy's id is recorded again at the copy's time.
    pub refresh: bool,
}

/// Decides a batch. `found` holds the ledger's answer (what it holds, if anything) for each
/// keyed candidate, in order: one entry per candidate whose id is `Ok`.
///
/// # Panics
/// If `found` has fewer entries than the batch has keyed candidates: the ledger answers one per id.
pub fn decide(candidates: &[Candidate], found: &[Option<Held>], rules: Rules) -> BatchDecision {
    let mut found = found.iter().copied();
    let mut decided = Decided::with_capacity(candidates.len());
    let fates = candidates
        .iter()
        .map(|candidate| match candidate.id {
            Ok(key) => {
                let in_ledger = found
                    .next()
                    .expect("the ledger answers once per keyed record");
                decided.keyed(candidate, key, in_ledger, rules)
            }
            Err(reason) => match rules.unkeyed {
                UnkeyedPolicy::Forward => Fate::Forward(reason),
                UnkeyedPolicy::DeadLetter => Fate::DeadLetter(reason),
                UnkeyedPolicy::Drop => Fate::Drop(reason),
            },
        })
        .collect();
    BatchDecision {
        fates,
        new_ids: decided.new_ids,
        oldest_new_ms: decided.oldest_new_ms,
        refreshes: ascending(decided.refreshed_at.into_values()),
    }
}

/// What a batch's decision has gathered so far, record by record.
struct Decided {
    /// The first copy in the batch of each id the ledger did not hold.
    seen_in_batch: HashMap<LedgerKey, Held>,
    /// Where in `new_ids` each refreshed key is, so a later copy in the batch moves it on.
    refreshed_at: HashMap<LedgerKey, usize>,
    new_ids: Vec<(LedgerKey, i64, Option<ContentDigest>)>,
    oldest_new_ms: Option<i64>,
}

impl Decided {
    fn with_capacity(records: usize) -> Self {
        Self {
            seen_in_batch: HashMap::with_capacity(records),
            refreshed_at: HashMap::new(),
            new_ids: Vec::with_capacity(records),
            oldest_new_ms: None,
        }
    }

    /// The fate of a keyed record, given what the ledger holds of its id. A sighting past the
    /// retention limit counts as none. A record whose id the ledger holds is a copy of that
    /// sighting (and, dropped with [`Rules::refresh`], records its id again at its own time);
    /// else one whose id an earlier record of the batch holds is a copy of that; else it is new:
    /// published, its id recorded at its time.
    fn keyed(
        &mut self,
        candidate: &Candidate,
        key: LedgerKey,
        in_ledger: Option<Held>,
        rules: Rules,
    ) -> Fate {
        let ts = candidate.timestamp_ms.unwrap_or(rules.now_ms);
        // The copy's time as the ledger records it: never later than now.
        let arrival = ts.min(rules.now_ms);
        let live = |held: Option<Held>| {
            held.filter(|h| !past_limit(rules.limit_ms, h.first_seen_ms, arrival))
        };
        if let Some(first) = live(in_ledger) {
            let mut fate = copy_of(first, false, candidate, ts, rules);
            if let (true, Fate::Duplicate(seen), true) =
                (rules.refresh, &mut fate, arrival > first.first_seen_ms)
            {
                seen.refreshed = true;
                self.refresh((key, arrival, first.digest));
            }
            return fate;
        }
        if let Some(first) = live(self.seen_in_batch.get(&key).copied()) {
            return copy_of(first, true, candidate, ts, rules);
        }
        self.seen_in_batch.insert(
            key,
            Held {
                first_seen_ms: arrival,
                digest: candidate.digest,
            },
        );
        self.oldest_new_ms = Some(self.oldest_new_ms.map_or(ts, |o| o.min(ts)));
        self.new_ids.push((key, arrival, candidate.digest));
        Fate::Publish
    }

    /// Records a dropped copy's id again at its time: once per id, a later copy moving it on.
    fn refresh(&mut self, refresh: (LedgerKey, i64, Option<ContentDigest>)) {
        match self.refreshed_at.entry(refresh.0) {
            Entry::Occupied(at) => self.new_ids[*at.get()] = refresh,
            Entry::Vacant(slot) => {
                slot.insert(self.new_ids.len());
                self.new_ids.push(refresh);
            }
        }
    }
}

/// The fate of a record, stamped `ts`, whose id is held by `first` (in the ledger, or earlier
/// `in_batch`): dropped as a duplicate, unless its source passes it or its content differs and
/// the reused-id policy publishes it.
fn copy_of(first: Held, in_batch: bool, candidate: &Candidate, ts: i64, rules: Rules) -> Fate {
    let verdict = Verdict::of(first.digest, candidate.digest);
    let seen = Seen {
        first_seen_ms: first.first_seen_ms,
        age_ms: (ts - first.first_seen_ms).max(0),
        in_batch,
        verdict,
        refreshed: false,
    };
    match (verdict, rules.reused_id) {
        _ if candidate.mode != SourceMode::Drop => Fate::Passed(seen, candidate.mode),
        (Verdict::ReusedId, ReusedIdPolicy::Publish | ReusedIdPolicy::DeadLetter) => {
            Fate::Reused(seen, rules.reused_id)
        }
        _ => Fate::Duplicate(seen),
    }
}

fn ascending(positions: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut positions: Vec<usize> = positions.collect();
    positions.sort_unstable();
    positions
}

/// How many ids a batch published as new the store then recorded as duplicates: `verdicts` are
/// the store's answers on the batch's `new_ids` as it recorded them, `refreshes` where in them the
/// refreshes are (a refresh is a duplicate by design). A published id held already by the time
/// it is recorded was recorded in between by a copy on another of the worker's partitions, which
/// published it too: both copies reached the output. A refresh found not held (forgotten, or
/// dropped with its generation, in between) is recorded as a new sighting, which is what a copy
/// of an id not held is; it is not counted.
pub fn published_twice(refreshes: &[usize], verdicts: &[crate::ledger::Verdict]) -> usize {
    verdicts
        .iter()
        .enumerate()
        .filter(|(i, v)| {
            matches!(v, crate::ledger::Verdict::Duplicate { .. })
                && refreshes.binary_search(i).is_err()
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_input_duplicate_header_is_renamed_with_its_value_and_place() {
        let header = |name: &str, value: &str| (name.to_string(), Some(value.as_bytes().to_vec()));
        // A producer set the worker's own header twice (one without a value), among others.
        let mut headers = vec![
            header("dedupe-source", "web"),
            header(HEADER_DUPLICATE, "retry"),
            (HEADER_DUPLICATE.to_string(), None),
            header("Dedupe-Duplicate", "other case: another header"),
        ];
        assert_eq!(rename_input_duplicate_headers(&mut headers), 2);
        assert_eq!(
            headers,
            vec![
                header("dedupe-source", "web"),
                header(HEADER_INPUT_DUPLICATE, "retry"),
                (HEADER_INPUT_DUPLICATE.to_string(), None),
                header("Dedupe-Duplicate", "other case: another header"),
            ]
        );
        // Nothing is left to rename: a record without the header is unchanged.
        assert_eq!(rename_input_duplicate_headers(&mut headers), 0);
    }

    fn key(n: u8) -> LedgerKey {
        crate::identity::ledger_key(&[b'k', n]).unwrap()
    }

    fn keyed(n: u8, ts: i64) -> Candidate {
        Candidate {
            id: Ok(key(n)),
            timestamp_ms: Some(ts),
            digest: None,
            mode: SourceMode::Drop,
        }
    }

    fn digested(n: u8, ts: i64, content: u64) -> Candidate {
        Candidate {
            digest: Some(ContentDigest::of_hash(content << 48)),
            ..keyed(n, ts)
        }
    }

    fn held(first_seen_ms: i64) -> Option<Held> {
        Some(Held {
            first_seen_ms,
            digest: None,
        })
    }

    fn dup(first_seen_ms: i64, age_ms: i64, in_batch: bool, verdict: Verdict) -> Seen {
        Seen {
            first_seen_ms,
            age_ms,
            in_batch,
            verdict,
            refreshed: false,
        }
    }

    const NOW: i64 = 1_000_000;
    const FORWARD: Rules = Rules {
        unkeyed: UnkeyedPolicy::Forward,
        reused_id: ReusedIdPolicy::Drop,
        now_ms: NOW,
        limit_ms: None,
        refresh: false,
    };

    #[test]
    fn a_copy_past_the_retention_limit_is_published_and_recorded_again_one_within_it_dropped() {
        let rules = Rules {
            limit_ms: Some(20_000),
            ..FORWARD
        };
        let first = 900_000;
        // 10 s after the first sighting: a duplicate; 20 s exactly: still one; 25 s: new.
        for (at, published) in [
            (first + 10_000, false),
            (first + 20_000, false),
            (first + 25_000, true),
        ] {
            let d = decide(&[keyed(1, at)], &[held(first)], rules);
            assert_eq!(
                d.fates[0] == Fate::Publish,
                published,
                "copy at +{} ms",
                at - first
            );
            let recorded: Vec<_> = d.new_ids.iter().map(|(_, t, _)| *t).collect();
            assert_eq!(recorded, if published { vec![at] } else { vec![] });
        }
        // Inside one batch too: the second copy is 25 s after the first, the third 5 s after it.
        let d = decide(
            &[keyed(2, 900_000), keyed(2, 925_000), keyed(2, 930_000)],
            &[None, None, None],
            rules,
        );
        assert!(
            matches!(
                d.fates[..],
                [Fate::Publish, Fate::Publish, Fate::Duplicate(_)]
            ),
            "{:?}",
            d.fates
        );
        // Without a limit nothing ever ages out of the decision.
        let d = decide(&[keyed(1, NOW)], &[held(0)], FORWARD);
        assert!(matches!(d.fates[0], Fate::Duplicate(_)));
    }

    #[test]
    fn a_dropped_copy_refreshes_its_id_once_per_batch_at_its_latest_time_with_the_first_digest() {
        let rules = Rules {
            refresh: true,
            ..FORWARD
        };
        let first = Some(Held {
            first_seen_ms: 100_000,
            digest: Some(ContentDigest::of_hash(7 << 48)),
        });
        let d = decide(
            &[
                digested(1, 200_000, 7),
                keyed(2, 150_000),
                digested(1, 300_000, 7),
            ],
            &[first, None, first],
            rules,
        );
        assert!(matches!(
            d.fates[..],
            [Fate::Duplicate(_), Fate::Publish, Fate::Duplicate(_)]
        ));
        assert_eq!(d.refreshes, [0]);
        assert_eq!(
            d.new_ids,
            [
                (key(1), 300_000, Some(ContentDigest::of_hash(7 << 48))),
                (key(2), 150_000, None)
            ]
        );
        // A copy from a pass-through source, or one whose clock is behind the sighting, refreshes
        // nothing; neither does a drop without `refresh`.
        let passed = Candidate {
            mode: SourceMode::Flag,
            ..keyed(1, 200_000)
        };
        assert!(decide(&[passed], &[first], rules).refreshes.is_empty());
        assert_eq!(decide(&[keyed(1, 50_000)], &[first], rules).new_ids, []);
        assert_eq!(decide(&[keyed(1, 200_000)], &[first], FORWARD).new_ids, []);
        // Refreshed past the limit: the refresh is what the limit counts from.
        let both = Rules {
            limit_ms: Some(20_000),
            ..rules
        };
        let refreshed = Some(Held {
            first_seen_ms: 300_000,
            digest: None,
        });
        assert!(matches!(
            decide(&[keyed(1, 315_000)], &[refreshed], both).fates[0],
            Fate::Duplicate(_)
        ));
    }

    #[test]
    fn new_ids_are_published_once_and_repeats_in_the_batch_dropped() {
        // The third record repeats the first id: dropped, 20 ms after the first copy, which is
        // published.
        let batch = [keyed(1, 10), keyed(2, 20), keyed(1, 30)];
        let d = decide(&batch, &[None, None, None], FORWARD);
        assert_eq!(
            d.fates,
            [
                Fate::Publish,
                Fate::Publish,
                Fate::Duplicate(dup(10, 20, true, Verdict::Unknown))
            ]
        );
        assert_eq!(d.new_ids, [(key(1), 10, None), (key(2), 20, None)]);
        assert_eq!(d.oldest_new_ms, Some(10));
        assert_eq!(d.duplicates(), 1);
    }

    #[test]
    fn ids_the_ledger_holds_are_dropped_with_their_age() {
        // The ledger first saw id 2 at 5; this copy is stamped 500.
        let d = decide(&[keyed(1, 100), keyed(2, 500)], &[None, held(5)], FORWARD);
        assert_eq!(
            d.fates,
            [
                Fate::Publish,
                Fate::Duplicate(dup(5, 495, false, Verdict::Unknown))
            ]
        );
        assert_eq!(d.new_ids, [(key(1), 100, None)]);
    }

    #[test]
    fn first_seen_times_never_lie_in_the_future() {
        // A record stamped after `now` (a client clock ahead) is recorded at `now`; a record
        // without a timestamp is stamped `now`.
        let batch = [
            keyed(1, NOW + 60_000),
            Candidate {
                timestamp_ms: None,
                ..keyed(2, 0)
            },
        ];
        let d = decide(&batch, &[None, None], FORWARD);
        assert_eq!(d.new_ids, [(key(1), NOW, None), (key(2), NOW, None)]);
    }

    #[test]
    fn records_without_an_id_follow_the_policy_and_are_never_recorded() {
        let batch = [
            Candidate {
                id: Err(Unkeyed::Missing),
                timestamp_ms: Some(1),
                digest: None,
                mode: SourceMode::Drop,
            },
            keyed(1, 2),
        ];
        for (policy, fate) in [
            (UnkeyedPolicy::Forward, Fate::Forward(Unkeyed::Missing)),
            (
                UnkeyedPolicy::DeadLetter,
                Fate::DeadLetter(Unkeyed::Missing),
            ),
            (UnkeyedPolicy::Drop, Fate::Drop(Unkeyed::Missing)),
        ] {
            // The ledger is asked only about the keyed record.
            let d = decide(
                &batch,
                &[None],
                Rules {
                    unkeyed: policy,
                    ..FORWARD
                },
            );
            assert_eq!(d.fates, [fate, Fate::Publish]);
            assert_eq!(d.new_ids, [(key(1), 2, None)]);
        }
    }

    #[test]
    fn a_copy_is_a_retry_a_reused_id_or_unknown_by_its_digest() {
        let first = |content: u64| {
            Some(Held {
                first_seen_ms: 5,
                digest: Some(ContentDigest::of_hash(content << 48)),
            })
        };
        // Held with digest 7: the same content is a retry, other content a reused id; a copy
        // without a digest, or an id held without one, is unknown.
        let batch = [
            digested(1, 10, 7),
            digested(2, 10, 8),
            keyed(3, 10),
            digested(4, 10, 7),
        ];
        let d = decide(&batch, &[first(7), first(7), first(7), held(5)], FORWARD);
        let verdicts: Vec<Verdict> = d
            .fates
            .iter()
            .map(|f| match f {
                Fate::Duplicate(s) => s.verdict,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            verdicts,
            [
                Verdict::Retry,
                Verdict::ReusedId,
                Verdict::Unknown,
                Verdict::Unknown
            ]
        );
        assert_eq!(d.duplicates(), 4);
        // Within a batch, against the first copy's digest; the first copy is recorded with it.
        let d = decide(
            &[digested(1, 10, 1), digested(1, 20, 1), digested(1, 30, 2)],
            &[None, None, None],
            FORWARD,
        );
        assert_eq!(
            d.fates[1..],
            [
                Fate::Duplicate(dup(10, 10, true, Verdict::Retry)),
                Fate::Duplicate(dup(10, 20, true, Verdict::ReusedId))
            ]
        );
        assert_eq!(
            d.new_ids,
            [(key(1), 10, Some(ContentDigest::of_hash(1 << 48)))]
        );
    }

    #[test]
    fn a_reused_id_follows_its_policy_and_is_never_recorded_again() {
        let first = Some(Held {
            first_seen_ms: 5,
            digest: Some(ContentDigest::of_hash(1 << 48)),
        });
        for policy in [ReusedIdPolicy::Publish, ReusedIdPolicy::DeadLetter] {
            let rules = Rules {
                reused_id: policy,
                ..FORWARD
            };
            let d = decide(
                &[digested(1, 10, 2), digested(1, 10, 1)],
                &[first, first],
                rules,
            );
            // The reused id goes where the policy says; a retry is dropped whatever it says.
            assert_eq!(
                d.fates,
                [
                    Fate::Reused(dup(5, 5, false, Verdict::ReusedId), policy),
                    Fate::Duplicate(dup(5, 5, false, Verdict::Retry))
                ]
            );
            assert!(d.new_ids.is_empty());
            assert_eq!(d.duplicates(), 1);
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
                let found: Vec<Option<Held>> = ids.iter().map(|n| ledger.get(&key(*n)).copied()).collect();
                let d = decide(&batch, &found, FORWARD);
                for (i, fate) in d.fates.iter().enumerate() {
                    if *fate == Fate::Publish {
                        published.push(ids[i]);
                    }
                }
                let recorded: Vec<LedgerKey> = d.new_ids.iter().map(|(k, _, _)| *k).collect();
                let publishes: Vec<LedgerKey> = d.fates.iter().zip(ids).filter(|(f, _)| **f == Fate::Publish).map(|(_, n)| key(*n)).collect();
                prop_assert_eq!(recorded, publishes);
                for (k, ts, digest) in d.new_ids {
                    ledger.insert(k, Held { first_seen_ms: ts, digest });
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

    #[test]
    fn copies_from_a_flagged_or_unchecked_source_are_published_and_first_copies_recorded() {
        let mode = |c: Candidate, mode| Candidate { mode, ..c };
        let batch = [
            mode(keyed(1, 100), SourceMode::Flag),
            mode(keyed(1, 110), SourceMode::Flag),
            mode(keyed(2, 120), SourceMode::Off),
            keyed(2, 130),
            mode(keyed(3, 140), SourceMode::Off),
        ];
        let d = decide(&batch, &[None, None, None, None, held(50)], FORWARD);
        assert_eq!(
            d.fates,
            [
                Fate::Publish,
                Fate::Passed(dup(100, 10, true, Verdict::Unknown), SourceMode::Flag),
                Fate::Publish,
                // A dropping source's copy of an id an unchecked source sent first is dropped.
                Fate::Duplicate(dup(120, 10, true, Verdict::Unknown)),
                Fate::Passed(dup(50, 90, false, Verdict::Unknown), SourceMode::Off),
            ]
        );
        // Each id recorded once, by its first copy, whatever the source's mode.
        assert_eq!(d.new_ids, [(key(1), 100, None), (key(2), 120, None)]);
        assert_eq!(d.duplicates(), 1);
    }

    #[test]
    fn an_id_published_then_recorded_as_a_duplicate_was_published_twice() {
        use crate::ledger::Verdict as Recorded;
        let dup = Recorded::Duplicate {
            first_seen_ms: 5,
            digest: None,
        };
        // Ids 0 and 2 were published, id 1 is a refresh.
        let refreshes = [1];
        assert_eq!(
            published_twice(&refreshes, &[Recorded::New, dup, Recorded::New]),
            0
        );
        // Id 2 was recorded by another partition in between; a refresh found gone is no error.
        assert_eq!(
            published_twice(&refreshes, &[Recorded::New, Recorded::New, dup]),
            1
        );
        assert_eq!(published_twice(&[], &[dup, dup]), 2);
    }
}

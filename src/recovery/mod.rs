//! Recovery of one partition: bring the ledger up to date with what was published for it before
//! anything new is published. Used after a crash, and whenever a partition is assigned to this
//! worker (at start, or when the consumer group moves it here).
//!
//! The ledger records a batch's ids only after the batch's output transaction committed, so after
//! a crash the ledger may lack the ids of the last few committed transactions (and, with
//! `durability = "no-wal"`, of every batch since the last memtable flush); after a partition moved
//! here, it lacks everything the other owners published. It never holds more than was published:
//! its progress record says where the tail it has not seen begins.
//!
//! Which log is replayed ([`Source`]): the **id changelog** ([`crate::changelog`]), written in the
//! same transactions as the output and about 19 bytes per id; or, for a partition whose progress
//! record predates the changelog, the **output** itself, once (its ids are read from the records).
//! Replay reads `read_committed`, after `init_transactions` fenced any older producer, so nothing
//! is pending.
//!
//! The cases ([`plan_recovery`]; the recovery table in docs/architecture.md is its unit tests):
//! - **ledger behind the log** (crash after publish; a partition that comes back): replay from
//!   the progress record's offset to the end: only what was missed.
//! - **ledger missing** (new volume, lost disk, a partition this ledger never held): load the
//!   changelog's whole retention, newest first, so the window reported grows honestly while it
//!   loads. The window becomes at most the changelog's retention.
//! - **ledger ahead of the log** (the ledger says it saw offsets the topic no longer has: the topic
//!   was recreated, or the cluster restored from an older state): the ledger holds ids that are
//!   not in the output, so re-reading input would drop messages that never reached the output.
//!   Recovery refuses ([`RecoveryError::LedgerAhead`]) unless the operator chooses otherwise
//!   (`--accept-ledger-ahead`), because silently losing messages is worse than stopping.
//! - **log tail lost to retention** (the worker was down longer than the retention): replay
//!   from what is retained and warn: ids in the gap cannot be recovered.
//! - **empty topics**: nothing to replay; the input starts at its beginning.
//!
//! The input resumes at the consumer group's committed offset (committed by the transactions),
//! never at a stale progress record's: a partition that comes back cannot skip what another owner
//! published meanwhile.

mod ends;
mod replay;

pub use replay::{backfill, recover_partition, Backfill, LoadMeter};

use std::time::Duration;

use rdkafka::error::KafkaError;

use crate::identity::IdSource;
use crate::kafka::KafkaConfig;
use crate::ledger::LedgerError;
use crate::progress::Progress;

#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error("reading {topic} partition {partition}: {source}")]
    Kafka {
        topic: String,
        partition: i32,
        source: KafkaError,
    },
    #[error("changelog {topic} partition {partition} offset {offset}: {source}")]
    Changelog {
        topic: String,
        partition: i32,
        offset: i64,
        source: crate::changelog::ChangelogFormatError,
    },
    #[error(
        "the ledger is ahead of the {log} on partition {partition}: it has seen it up to offset \
         {ledger_next_output}, but it ends at {output_end}. The topic was recreated or restored \
         from an older state; the ledger holds ids the output lacks. Restore a matching ledger snapshot, move \
         the ledger aside to rebuild it from the output, or start with --accept-ledger-ahead to trust the ledger"
    )]
    LedgerAhead {
        log: Source,
        partition: i32,
        ledger_next_output: i64,
        output_end: i64,
    },
    #[error("recording replayed ids of partition {partition}: {source}")]
    Record { partition: i32, source: LedgerError },
    #[error(
        "replaying partition {partition} did not reach offset {target} within {seconds}s (at {at})"
    )]
    Timeout {
        partition: i32,
        target: i64,
        at: i64,
        seconds: u64,
    },
    #[error("loading partition {partition} stopped: the partition was taken away or the worker is stopping")]
    Stopped { partition: i32 },
}

impl RecoveryError {
    /// Whether another attempt may succeed (the brokers were away), as opposed to a state it
    /// meets again (the ledger ahead of the log, a changelog record it cannot read, a failing
    /// ledger) or a stop that was asked for.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Kafka { .. } | Self::Timeout { .. } => true,
            Self::Record { source, .. } => source.is_retryable(),
            Self::Changelog { .. } | Self::LedgerAhead { .. } | Self::Stopped { .. } => false,
        }
    }
}

/// The log a partition's ids are replayed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The id changelog: the ids alone.
    Changelog,
    /// The output topic: whole messages, for a progress record written before the changelog.
    Output,
}

impl Source {
    /// The id changelog, unless the ledger's progress record predates it (it names an output
    /// offset and no changelog offset): then the output, once.
    pub fn for_progress(progress: Option<Progress>) -> Source {
        match progress {
            Some(p) if p.next_changelog_offset < 0 && p.next_output_offset >= 0 => Source::Output,
            _ => Source::Changelog,
        }
    }

    /// Where in `progress` this log's position is kept.
    pub fn position(self, progress: &Progress) -> i64 {
        match self {
            Source::Changelog => progress.next_changelog_offset,
            Source::Output => progress.next_output_offset,
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Changelog => "id changelog",
            Source::Output => "output topic",
        })
    }
}

/// What recovering one partition did.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveryReport {
    pub partition: i32,
    /// The log replayed.
    pub source: Source,
    /// Ids loaded into the ledger.
    pub ids_loaded: u64,
    /// Offsets of the log replayed into the ledger: [from, to).
    pub replayed_from: i64,
    pub replayed_to: i64,
    /// Log records read.
    pub replayed_records: u64,
    /// The ledger held nothing for this partition: it was rebuilt from the output's retention.
    pub rebuilt: bool,
    /// Output offsets [ledger's, first retained) were lost to retention before replay.
    pub retention_gap: Option<(i64, i64)>,
    /// Where the input resumes.
    pub resume_input_at: Option<i64>,
    /// The progress written at the end of recovery.
    pub progress: Progress,
    /// Where the replay's time went.
    pub times: ReplayTimes,
}

/// Where a replay's time went on the thread that ran it, in seconds: waiting for the log's
/// records, reading ids out of them, and the ledger's share.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReplayTimes {
    pub fetch_secs: f64,
    pub decode_secs: f64,
    pub load: crate::ledger::LoadTimes,
}

/// What recovery needs to know about one partition.
pub struct RecoveryInput<'a> {
    pub kafka: &'a KafkaConfig,
    pub output_topic: &'a str,
    pub changelog_topic: &'a str,
    pub partition: i32,
    pub id_source: &'a IdSource,
    /// The ledger's progress record for the partition, if it has one.
    pub ledger_progress: Option<Progress>,
    /// The consumer group's committed input offset (committed with the output transactions).
    pub committed_input: Option<i64>,
    /// Proceed when the ledger is ahead of the output, trusting the ledger.
    pub accept_ledger_ahead: bool,
    /// A partition the ledger holds nothing for resumes once the ids published within this
    /// much time are loaded; the older rest back-fills (see [`Backfill`]).
    pub ready_window: Duration,
    pub timeout: Duration,
    /// Set when the load should stop (the partition was taken away, the worker is stopping).
    pub stop: &'a std::sync::atomic::AtomicBool,
}

/// What recovery knows about a partition before it reads anything: the plain data the
/// [`plan_recovery`] decision is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryFacts {
    /// The ledger's progress record for the partition, if it has one.
    pub ledger_progress: Option<Progress>,
    /// The consumer group's committed input offset.
    pub committed_input: Option<i64>,
    /// The log to replay ([`Source::for_progress`]).
    pub source: Source,
    /// The log partition's first retained offset and its end (high watermark).
    pub log_low: i64,
    pub log_high: i64,
    /// The output partition's end: whatever the log, a ledger that has seen output beyond it is
    /// ahead of the source of truth.
    pub output_high: i64,
    /// The operator trusts a ledger that is ahead of the output.
    pub accept_ledger_ahead: bool,
    /// For a partition the ledger holds nothing for: the first log offset published within the
    /// handover window (`None`: not looked up, or the whole log is within it). What comes before
    /// it back-fills after the partition resumes.
    pub window_start: Option<i64>,
}

/// What recovery will do: which range of the log to replay into the ledger and where input resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryPlan {
    /// Log offsets [replay_from, replay_to) are replayed (empty when equal).
    pub replay_from: i64,
    pub replay_to: i64,
    /// The ledger holds nothing for the partition: it is rebuilt from the log's retention,
    /// newest first.
    pub rebuild: bool,
    /// Log offsets the ledger had not recorded that retention deleted: [from, to).
    pub retention_gap: Option<(i64, i64)>,
    /// The ledger was ahead of the log (at this offset) and is trusted, as asked.
    pub ledger_ahead_accepted: Option<i64>,
    /// Where the input resumes: the committed offset, else the ledger's, else its beginning (None).
    pub resume_input_at: Option<i64>,
    /// Log offsets [from, to) older than the handover window, loaded after the partition resumed
    /// (a rebuild only).
    pub backfill: Option<(i64, i64)>,
}

/// Why recovery refuses to plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanRefusal {
    /// The ledger has seen offsets of `log` that it no longer has (see [`RecoveryError::LedgerAhead`]).
    LedgerAhead {
        log: Source,
        ledger_next_output: i64,
        output_end: i64,
    },
}

/// The recovery decision, apart from any I/O: one row of docs/architecture.md's recovery table per case,
/// each a unit test of the same name below.
pub fn plan_recovery(facts: &RecoveryFacts) -> Result<RecoveryPlan, PlanRefusal> {
    let (low, high) = (facts.log_low, facts.log_high.max(facts.log_low));
    let mut ledger_ahead_accepted = None;
    // The output is the source of truth: a ledger that saw output it no longer has is ahead,
    // whichever log is replayed.
    let ledger_output = facts
        .ledger_progress
        .map(|pr| pr.next_output_offset)
        .filter(|&o| o >= 0);
    if let Some(seen) = ledger_output.filter(|&o| o > facts.output_high) {
        if !facts.accept_ledger_ahead {
            return Err(PlanRefusal::LedgerAhead {
                log: Source::Output,
                ledger_next_output: seen,
                output_end: facts.output_high,
            });
        }
        ledger_ahead_accepted = Some(seen);
    }
    let ledger_next_output = facts
        .ledger_progress
        .map(|pr| facts.source.position(&pr))
        .filter(|&o| o >= 0);
    let rebuild = ledger_next_output.is_none();
    let mut from = ledger_next_output.unwrap_or(low);
    if from > high {
        if !facts.accept_ledger_ahead {
            return Err(PlanRefusal::LedgerAhead {
                log: facts.source,
                ledger_next_output: from,
                output_end: high,
            });
        }
        ledger_ahead_accepted = Some(from);
        from = high;
    }
    let mut retention_gap = None;
    if from < low {
        retention_gap = Some((from, low));
        from = low;
    }
    let resume_input_at = facts.committed_input.filter(|&o| o >= 0).or(facts
        .ledger_progress
        .map(|pr| pr.next_input_offset)
        .filter(|&o| o >= 0));
    // A rebuild loads the handover window before the partition resumes, and the older rest after.
    let mut backfill = None;
    if let Some(start) = facts
        .window_start
        .filter(|_| rebuild)
        .map(|s| s.clamp(from, high))
    {
        if start > from {
            backfill = Some((from, start));
            from = start;
        }
    }
    Ok(RecoveryPlan {
        replay_from: from,
        replay_to: high.max(from),
        rebuild,
        retention_gap,
        ledger_ahead_accepted,
        resume_input_at,
        backfill,
    })
}

impl RecoveryPlan {
    /// Logs what the plan means for the dedupe window, once, when it is not the plain case.
    pub(crate) fn warn(&self, partition: i32, facts: &RecoveryFacts) {
        use crate::metrics::events::{LedgerAheadTrusted, PartitionRebuilt, RetentionGap};
        if let Some(ledger_next_output) = self.ledger_ahead_accepted {
            LedgerAheadTrusted {
                partition,
                ledger_next_output,
                end: facts.log_high,
                source: &facts.source,
            }
            .emit();
        }
        if let Some((ledger_next, first_retained)) = self.retention_gap {
            RetentionGap {
                partition,
                ledger_next,
                first_retained,
                source: &facts.source,
            }
            .emit();
        }
        if self.rebuild && self.replay_to > self.replay_from {
            PartitionRebuilt {
                partition,
                from: self.replay_from,
                to: self.replay_to,
                backfill: self.backfill,
                source: &facts.source,
            }
            .emit();
        }
    }
}

#[cfg(test)]
mod tests {
    //! The recovery table of docs/architecture.md, row by row.
    use super::*;
    use proptest::prelude::*;

    /// Facts about replaying the output (a progress record without a changelog offset).
    fn facts(
        ledger: Option<(i64, i64)>,
        committed_input: Option<i64>,
        output: (i64, i64),
    ) -> RecoveryFacts {
        let ledger_progress = ledger.map(|(next_input_offset, next_output_offset)| Progress {
            next_input_offset,
            next_output_offset,
            next_changelog_offset: -1,
        });
        RecoveryFacts {
            ledger_progress,
            committed_input,
            source: Source::Output,
            log_low: output.0,
            log_high: output.1,
            output_high: output.1,
            accept_ledger_ahead: false,
            window_start: None,
        }
    }

    /// Facts about replaying the changelog: progress (input, changelog offset).
    fn changelog_facts(
        ledger: Option<(i64, i64)>,
        committed_input: Option<i64>,
        changelog: (i64, i64),
    ) -> RecoveryFacts {
        let ledger_progress = ledger.map(|(next_input_offset, next_changelog_offset)| Progress {
            next_input_offset,
            next_output_offset: 1_000_000,
            next_changelog_offset,
        });
        RecoveryFacts {
            ledger_progress,
            committed_input,
            source: Source::for_progress(ledger_progress),
            log_low: changelog.0,
            log_high: changelog.1,
            output_high: 2_000_000,
            accept_ledger_ahead: false,
            window_start: None,
        }
    }

    #[test]
    fn a_partition_that_comes_back_loads_only_what_it_missed() {
        // Owned here until changelog offset 40; another worker published 40..65 meanwhile.
        let f = changelog_facts(Some((900, 40)), Some(1500), (0, 65));
        assert_eq!(f.source, Source::Changelog);
        let plan = plan_recovery(&f).unwrap();
        assert_eq!((plan.replay_from, plan.replay_to), (40, 65));
        assert!(!plan.rebuild);
        // The stale progress record (input 900) never decides where input resumes.
        assert_eq!(plan.resume_input_at, Some(1500));
    }

    #[test]
    fn a_partition_new_to_this_ledger_loads_the_changelogs_retention() {
        let mut interrupted = changelog_facts(None, Some(77), (10, 65));
        interrupted.ledger_progress = Some(Progress::NONE);
        interrupted.source = Source::for_progress(interrupted.ledger_progress);
        for f in [changelog_facts(None, Some(77), (10, 65)), interrupted] {
            assert_eq!(
                f.source,
                Source::Changelog,
                "no progress, or a load that a crash interrupted"
            );
            let plan = plan_recovery(&f).unwrap();
            assert!(plan.rebuild);
            assert_eq!((plan.replay_from, plan.replay_to), (10, 65));
            assert_eq!(plan.resume_input_at, Some(77));
        }
    }

    #[test]
    fn a_partition_new_to_this_ledger_loads_its_window_first_and_back_fills_the_rest() {
        // Records from offset 40 on were published within the handover window.
        let mut f = changelog_facts(None, Some(77), (10, 65));
        f.window_start = Some(40);
        let plan = plan_recovery(&f).unwrap();
        assert_eq!(
            (plan.replay_from, plan.replay_to),
            (40, 65),
            "the window, before the partition resumes"
        );
        assert_eq!(plan.backfill, Some((10, 40)), "the older rest, after");
        // The whole log within the window, or a window start before what is retained: no back-fill.
        for start in [Some(10), Some(3), None] {
            f.window_start = start;
            let plan = plan_recovery(&f).unwrap();
            assert_eq!(
                (plan.replay_from, plan.replay_to, plan.backfill),
                (10, 65, None),
                "window start {start:?}"
            );
        }
        // Nothing published within the window: everything back-fills, nothing holds the partition.
        f.window_start = Some(65);
        let plan = plan_recovery(&f).unwrap();
        assert_eq!(
            (plan.replay_from, plan.replay_to, plan.backfill),
            (65, 65, Some((10, 65)))
        );
        // A partition the ledger holds (a tail to catch up on) never back-fills.
        let mut behind = changelog_facts(Some((900, 40)), Some(1500), (0, 65));
        behind.window_start = Some(50);
        let plan = plan_recovery(&behind).unwrap();
        assert_eq!(
            (plan.replay_from, plan.replay_to, plan.backfill),
            (40, 65, None)
        );
    }

    #[test]
    fn a_progress_record_from_before_the_changelog_replays_the_output_once() {
        let legacy = Progress {
            next_input_offset: 5,
            next_output_offset: 3,
            next_changelog_offset: -1,
        };
        assert_eq!(Source::for_progress(Some(legacy)), Source::Output);
        let current = Progress {
            next_changelog_offset: 0,
            ..legacy
        };
        assert_eq!(Source::for_progress(Some(current)), Source::Changelog);
        assert_eq!(Source::for_progress(None), Source::Changelog);
    }

    #[test]
    fn ledger_ahead_of_the_changelog_refuses_to_start() {
        let refused =
            plan_recovery(&changelog_facts(Some((500, 70)), Some(500), (0, 65))).unwrap_err();
        assert_eq!(
            refused,
            PlanRefusal::LedgerAhead {
                log: Source::Changelog,
                ledger_next_output: 70,
                output_end: 65
            }
        );
    }

    #[test]
    fn ledger_ahead_of_the_output_refuses_whichever_log_is_replayed() {
        // The changelog is intact but the output was recreated: the output is the source of truth.
        let mut f = changelog_facts(Some((500, 40)), Some(500), (0, 65));
        f.output_high = 10;
        let refused = plan_recovery(&f).unwrap_err();
        assert_eq!(
            refused,
            PlanRefusal::LedgerAhead {
                log: Source::Output,
                ledger_next_output: 1_000_000,
                output_end: 10
            }
        );
        f.accept_ledger_ahead = true;
        assert_eq!(
            plan_recovery(&f).unwrap().ledger_ahead_accepted,
            Some(1_000_000)
        );
    }

    #[test]
    fn ledger_behind_the_output_replays_the_tail() {
        // The ledger recorded output up to 90; the last committed transactions reach 100.
        let plan = plan_recovery(&facts(Some((500, 90)), Some(520), (0, 100))).unwrap();
        assert_eq!((plan.replay_from, plan.replay_to), (90, 100));
        assert!(!plan.rebuild && plan.retention_gap.is_none());
        // The input resumes at the group's committed offset, which the transactions advanced.
        assert_eq!(plan.resume_input_at, Some(520));
    }

    #[test]
    fn ledger_missing_rebuilds_from_the_retained_range() {
        let plan = plan_recovery(&facts(None, Some(700), (40, 100))).unwrap();
        assert!(plan.rebuild);
        assert_eq!((plan.replay_from, plan.replay_to), (40, 100));
        assert_eq!(
            plan.retention_gap, None,
            "a missing ledger has no gap: the window is the retention"
        );
        assert_eq!(plan.resume_input_at, Some(700));
    }

    #[test]
    fn ledger_ahead_of_the_output_refuses_to_start() {
        let refused = plan_recovery(&facts(Some((500, 120)), Some(500), (0, 100))).unwrap_err();
        assert_eq!(
            refused,
            PlanRefusal::LedgerAhead {
                log: Source::Output,
                ledger_next_output: 120,
                output_end: 100
            }
        );
    }

    #[test]
    fn ledger_ahead_of_the_output_is_trusted_with_accept_ledger_ahead() {
        let mut f = facts(Some((500, 120)), Some(500), (0, 100));
        f.accept_ledger_ahead = true;
        let plan = plan_recovery(&f).unwrap();
        assert_eq!(
            (plan.replay_from, plan.replay_to),
            (100, 100),
            "nothing to replay"
        );
        assert_eq!(plan.ledger_ahead_accepted, Some(120));
        assert_eq!(plan.resume_input_at, Some(500));
    }

    #[test]
    fn output_tail_deleted_by_retention_before_replay_replays_what_is_retained() {
        let plan = plan_recovery(&facts(Some((500, 30)), Some(600), (50, 100))).unwrap();
        assert_eq!(plan.retention_gap, Some((30, 50)));
        assert_eq!((plan.replay_from, plan.replay_to), (50, 100));
        assert!(!plan.rebuild);
    }

    #[test]
    fn empty_topics_replay_nothing_and_input_starts_at_its_beginning() {
        let plan = plan_recovery(&facts(None, None, (0, 0))).unwrap();
        assert_eq!((plan.replay_from, plan.replay_to), (0, 0));
        assert_eq!(plan.resume_input_at, None);
    }

    #[test]
    fn without_a_committed_offset_input_resumes_where_the_ledger_says() {
        let plan = plan_recovery(&facts(Some((321, 10)), None, (0, 10))).unwrap();
        assert_eq!(plan.resume_input_at, Some(321));
        // A negative offset ("none yet") in either place is no offset.
        let plan = plan_recovery(&facts(Some((-1, -1)), Some(-1001), (0, 0))).unwrap();
        assert_eq!(plan.resume_input_at, None);
        assert!(plan.rebuild);
    }

    proptest! {
        /// Whatever the facts: the replay range lies within what the log retains, and every
        /// offset the ledger lacks is replayed, back-filled after the partition resumes, or
        /// reported as a retention gap.
        #[test]
        fn the_plan_never_skips_output_the_ledger_lacks(
            low in 0i64..1000, len in 0i64..1000, ledger in proptest::option::of(-1i64..2500),
            accept in any::<bool>(), window_start in proptest::option::of(0i64..2500),
        ) {
            let high = low + len;
            let mut f = facts(ledger.map(|o| (0, o)), None, (low, high));
            f.accept_ledger_ahead = accept;
            f.window_start = window_start;
            match plan_recovery(&f) {
                Err(PlanRefusal::LedgerAhead { ledger_next_output, output_end, .. }) => {
                    prop_assert!(!accept && ledger_next_output > output_end);
                }
                Ok(plan) => {
                    prop_assert!(low <= plan.replay_from && plan.replay_from <= plan.replay_to && plan.replay_to == high);
                    // Where the ranges the ledger gets (back-fill, then replay) begin.
                    let loaded_from = match plan.backfill {
                        Some((from, to)) => {
                            prop_assert!(plan.rebuild && from < to && to == plan.replay_from);
                            from
                        }
                        None => plan.replay_from,
                    };
                    let lacks_from = ledger.filter(|&o| o >= 0).unwrap_or(low);
                    match plan.retention_gap {
                        Some((from, to)) => prop_assert!(from == lacks_from && to == loaded_from),
                        None => prop_assert!(loaded_from <= lacks_from.max(low) || plan.ledger_ahead_accepted.is_some()),
                    }
                }
            }
        }
    }
}

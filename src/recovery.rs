//! Recovery of one partition from the output topic, the source of truth.
//!
//! The ledger records a batch's ids only after the batch's output transaction committed, so after
//! a crash the ledger may lack the ids of the last few committed transactions (and, with
//! `durability = "no-wal"`, of every batch since the last memtable flush). It never holds more
//! than the output: its progress record says where the output tail it has not seen begins.
//! Recovery reads that tail (`read_committed`, after `init_transactions` fenced any older
//! producer, so nothing is pending) and records its ids, then says where the input resumes.
//!
//! The cases:
//! - **ledger behind the output** (crash after publish): replay from the progress record's
//!   output offset to the end.
//! - **ledger missing** (new volume, lost disk): rebuild from the output's first retained offset;
//!   the window becomes the output's retention, and a warning says so.
//! - **ledger ahead of the output** (the ledger says it saw output offsets the topic no longer
//!   has: the topic was recreated, or the cluster restored from an older state): the ledger holds
//!   ids that are not in the output, so re-reading input would drop messages that never reached
//!   the output. Recovery refuses ([`RecoveryError::LedgerAhead`]) unless the operator chooses
//!   otherwise (`--accept-ledger-ahead`), because silently losing messages is worse than stopping.
//! - **output tail lost to retention** (the worker was down longer than the retention): replay
//!   from what is retained and warn: ids in the gap cannot be recovered.
//! - **empty topics**: nothing to replay; the input starts at its beginning.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::{IdSource, KafkaConfig};
use crate::identity::LedgerKey;
use crate::ledger::LedgerError;
use crate::kafka::client_config;
use crate::identity::{message_key, RecordView};
use crate::progress::Progress;

/// How many replayed ids are recorded per ledger write.
pub const REPLAY_BATCH: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error("reading output partition {partition}: {source}")]
    Kafka { partition: i32, source: KafkaError },
    #[error(
        "the ledger is ahead of the output topic on partition {partition}: it has seen output up to offset \
         {ledger_next_output}, but the output ends at {output_end}. The output topic was recreated or restored \
         from an older state; the ledger holds ids the output lacks. Restore a matching ledger snapshot, move \
         the ledger aside to rebuild it from the output, or start with --accept-ledger-ahead to trust the ledger"
    )]
    LedgerAhead { partition: i32, ledger_next_output: i64, output_end: i64 },
    #[error("recording replayed ids of partition {partition}: {source}")]
    Record { partition: i32, source: RecordFailure },
    #[error("replaying output partition {partition} did not reach offset {target} within {seconds}s (at {at})")]
    Timeout { partition: i32, target: i64, at: i64, seconds: u64 },
}

/// Records replayed ids (with their first-seen times) and the progress to store with them.
pub type RecordReplayed<'a> = dyn FnMut(&[(LedgerKey, i64)], Progress) -> Result<(), RecordFailure> + 'a;

/// Why the replayed ids could not be recorded.
#[derive(Debug, thiserror::Error)]
pub enum RecordFailure {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("the ledger's owner stopped before answering")]
    LedgerGone,
}

/// What recovering one partition did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    pub partition: i32,
    /// Output offsets replayed into the ledger: [from, to).
    pub replayed_from: i64,
    pub replayed_to: i64,
    /// Output records whose ids were recorded.
    pub replayed_records: u64,
    /// The ledger held nothing for this partition: it was rebuilt from the output's retention.
    pub rebuilt: bool,
    /// Output offsets [ledger's, first retained) were lost to retention before replay.
    pub retention_gap: Option<(i64, i64)>,
    /// Where the input resumes.
    pub resume_input_at: Option<i64>,
    /// The progress written at the end of recovery.
    pub progress: Progress,
}

/// What recovery needs to know about one partition.
pub struct RecoveryInput<'a> {
    pub kafka: &'a KafkaConfig,
    pub output_topic: &'a str,
    pub partition: i32,
    pub id_source: &'a IdSource,
    /// The ledger's progress record for the partition, if it has one.
    pub ledger_progress: Option<Progress>,
    /// The consumer group's committed input offset (committed with the output transactions).
    pub committed_input: Option<i64>,
    /// Proceed when the ledger is ahead of the output, trusting the ledger.
    pub accept_ledger_ahead: bool,
    pub timeout: Duration,
}

/// Replays the output tail into the ledger through `record` (ids with their first-seen time, and
/// the progress to store with them), and returns where the input resumes.
pub fn recover_partition(
    input: &RecoveryInput<'_>,
    record: &mut RecordReplayed<'_>,
    on_progress: &mut dyn FnMut(u64, i64, i64),
) -> Result<RecoveryReport, RecoveryError> {
    let p = input.partition;
    let kerr = |source| RecoveryError::Kafka { partition: p, source };
    let consumer: BaseConsumer = client_config(input.kafka)
        .set("group.id", format!("dedupe-recovery-{}", input.output_topic))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("fetch.max.bytes", "52428800")
        .create()
        .map_err(kerr)?;
    let (low, high) = consumer
        .fetch_watermarks(input.output_topic, p, Duration::from_secs(30))
        .map_err(kerr)?;

    let facts = RecoveryFacts {
        ledger_progress: input.ledger_progress,
        committed_input: input.committed_input,
        output_low: low,
        output_high: high,
        accept_ledger_ahead: input.accept_ledger_ahead,
    };
    let plan = plan_recovery(&facts).map_err(|PlanRefusal::LedgerAhead { ledger_next_output, output_end }| {
        RecoveryError::LedgerAhead { partition: p, ledger_next_output, output_end }
    })?;
    plan.warn(p, &facts);
    let RecoveryPlan { replay_from: from, rebuild: rebuilt, retention_gap, resume_input_at, .. } = plan;
    let next_input = resume_input_at.unwrap_or(-1);

    let mut replayed = 0u64;
    let mut next_output = from;
    if from < high {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(input.output_topic, p, Offset::Offset(from)).map_err(kerr)?;
        consumer.assign(&tpl).map_err(kerr)?;
        let started = Instant::now();
        let mut batch: Vec<(LedgerKey, i64)> = Vec::with_capacity(REPLAY_BATCH);
        let mut flush = |batch: &mut Vec<(LedgerKey, i64)>, next_output: i64| -> Result<(), RecoveryError> {
            record(batch, Progress { next_input_offset: next_input, next_output_offset: next_output })
                .map_err(|source| RecoveryError::Record { partition: p, source })?;
            batch.clear();
            Ok(())
        };
        loop {
            if next_output >= high {
                break;
            }
            if started.elapsed() > input.timeout {
                return Err(RecoveryError::Timeout {
                    partition: p,
                    target: high,
                    at: next_output,
                    seconds: input.timeout.as_secs(),
                });
            }
            match consumer.poll(Duration::from_millis(500)) {
                None => {}
                Some(Err(KafkaError::PartitionEOF(_))) => {
                    // With read_committed the end is the last stable offset; after fencing that
                    // is the high watermark, up to trailing transaction markers.
                    next_output = high;
                }
                Some(Err(e)) => return Err(kerr(e)),
                Some(Ok(m)) => {
                    next_output = m.offset() + 1;
                    let headers = m.headers();
                    let view = RecordView {
                        key: m.key(),
                        header: |name: &str| {
                            headers.and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
                        },
                        value: m.payload(),
                    };
                    // Records forwarded without a usable id have nothing to record.
                    if let Ok(key) = message_key(&view, input.id_source) {
                        let ts = m.timestamp().to_millis().unwrap_or_else(now_ms);
                        batch.push((key, ts));
                        replayed += 1;
                    }
                    if batch.len() >= REPLAY_BATCH {
                        flush(&mut batch, next_output)?;
                        on_progress(replayed, next_output, high);
                    }
                }
            }
        }
        flush(&mut batch, next_output.max(high))?;
        on_progress(replayed, high, high);
    } else {
        record(&[], Progress { next_input_offset: next_input, next_output_offset: from })
            .map_err(|source| RecoveryError::Record { partition: p, source })?;
    }
    let progress = Progress { next_input_offset: next_input, next_output_offset: from.max(high) };
    Ok(RecoveryReport {
        partition: p,
        replayed_from: from,
        replayed_to: high.max(from),
        replayed_records: replayed,
        rebuilt,
        retention_gap,
        resume_input_at,
        progress,
    })
}

/// What recovery knows about a partition before it reads anything: the plain data the
/// [`plan_recovery`] decision is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryFacts {
    /// The ledger's progress record for the partition, if it has one.
    pub ledger_progress: Option<Progress>,
    /// The consumer group's committed input offset.
    pub committed_input: Option<i64>,
    /// The output partition's first retained offset and its end (high watermark).
    pub output_low: i64,
    pub output_high: i64,
    /// The operator trusts a ledger that is ahead of the output.
    pub accept_ledger_ahead: bool,
}

/// What recovery will do: which output range to replay into the ledger and where input resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryPlan {
    /// Output offsets [replay_from, replay_to) are replayed (empty when equal).
    pub replay_from: i64,
    pub replay_to: i64,
    /// The ledger holds nothing for the partition: it is rebuilt from the output's retention.
    pub rebuild: bool,
    /// Output offsets the ledger had not recorded that retention deleted: [from, to).
    pub retention_gap: Option<(i64, i64)>,
    /// The ledger was ahead of the output (at this offset) and is trusted, as asked.
    pub ledger_ahead_accepted: Option<i64>,
    /// Where the input resumes: the committed offset, else the ledger's, else its beginning (None).
    pub resume_input_at: Option<i64>,
}

/// Why recovery refuses to plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanRefusal {
    /// The ledger has seen output offsets the output no longer has (see [`RecoveryError::LedgerAhead`]).
    LedgerAhead { ledger_next_output: i64, output_end: i64 },
}

/// The recovery decision, apart from any I/O: one row of the README's recovery table per case,
/// each a unit test of the same name below.
pub fn plan_recovery(facts: &RecoveryFacts) -> Result<RecoveryPlan, PlanRefusal> {
    let (low, high) = (facts.output_low, facts.output_high.max(facts.output_low));
    let ledger_next_output = facts.ledger_progress.map(|pr| pr.next_output_offset).filter(|&o| o >= 0);
    let rebuild = ledger_next_output.is_none();
    let mut from = ledger_next_output.unwrap_or(low);
    let mut ledger_ahead_accepted = None;
    if from > high {
        if !facts.accept_ledger_ahead {
            return Err(PlanRefusal::LedgerAhead { ledger_next_output: from, output_end: high });
        }
        ledger_ahead_accepted = Some(from);
        from = high;
    }
    let mut retention_gap = None;
    if from < low {
        retention_gap = Some((from, low));
        from = low;
    }
    let resume_input_at = facts
        .committed_input
        .filter(|&o| o >= 0)
        .or(facts.ledger_progress.map(|pr| pr.next_input_offset).filter(|&o| o >= 0));
    Ok(RecoveryPlan { replay_from: from, replay_to: high.max(from), rebuild, retention_gap, ledger_ahead_accepted, resume_input_at })
}

impl RecoveryPlan {
    /// Logs what the plan means for the dedupe window, once, when it is not the plain case.
    fn warn(&self, partition: i32, facts: &RecoveryFacts) {
        if let Some(ledger_next_output) = self.ledger_ahead_accepted {
            tracing::warn!(
                partition,
                ledger_next_output,
                output_end = facts.output_high,
                "The ledger is ahead of the output topic; trusting the ledger as --accept-ledger-ahead asks."
            );
        }
        if let Some((from, first_retained)) = self.retention_gap {
            tracing::warn!(
                partition,
                ledger_next_output = from,
                first_retained,
                "Output records the ledger had not recorded were deleted by retention before recovery; ids in that gap cannot be recovered."
            );
        }
        if self.rebuild && self.replay_to > self.replay_from {
            tracing::warn!(
                partition,
                from = self.replay_from,
                to = self.replay_to,
                "The ledger holds nothing for this partition: rebuilding it from the output topic. The dedupe window is now the output's retention."
            );
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    //! The README's recovery table, row by row.
    use super::*;
    use proptest::prelude::*;

    fn facts(ledger: Option<(i64, i64)>, committed_input: Option<i64>, output: (i64, i64)) -> RecoveryFacts {
        RecoveryFacts {
            ledger_progress: ledger.map(|(next_input_offset, next_output_offset)| Progress { next_input_offset, next_output_offset }),
            committed_input,
            output_low: output.0,
            output_high: output.1,
            accept_ledger_ahead: false,
        }
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
        assert_eq!(plan.retention_gap, None, "a missing ledger has no gap: the window is the retention");
        assert_eq!(plan.resume_input_at, Some(700));
    }

    #[test]
    fn ledger_ahead_of_the_output_refuses_to_start() {
        let refused = plan_recovery(&facts(Some((500, 120)), Some(500), (0, 100))).unwrap_err();
        assert_eq!(refused, PlanRefusal::LedgerAhead { ledger_next_output: 120, output_end: 100 });
    }

    #[test]
    fn ledger_ahead_of_the_output_is_trusted_with_accept_ledger_ahead() {
        let mut f = facts(Some((500, 120)), Some(500), (0, 100));
        f.accept_ledger_ahead = true;
        let plan = plan_recovery(&f).unwrap();
        assert_eq!((plan.replay_from, plan.replay_to), (100, 100), "nothing to replay");
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
        /// Whatever the facts: the replay range lies within what the output retains, and every
        /// output offset the ledger lacks is either replayed or reported as a retention gap.
        #[test]
        fn the_plan_never_skips_output_the_ledger_lacks(
            low in 0i64..1000, len in 0i64..1000, ledger in proptest::option::of(-1i64..2500),
            accept in any::<bool>(),
        ) {
            let high = low + len;
            let mut f = facts(ledger.map(|o| (0, o)), None, (low, high));
            f.accept_ledger_ahead = accept;
            match plan_recovery(&f) {
                Err(PlanRefusal::LedgerAhead { ledger_next_output, output_end }) => {
                    prop_assert!(!accept && ledger_next_output > output_end);
                }
                Ok(plan) => {
                    prop_assert!(low <= plan.replay_from && plan.replay_from <= plan.replay_to && plan.replay_to == high);
                    let lacks_from = ledger.filter(|&o| o >= 0).unwrap_or(low);
                    match plan.retention_gap {
                        Some((from, to)) => prop_assert!(from == lacks_from && to == plan.replay_from),
                        None => prop_assert!(plan.replay_from <= lacks_from.max(low) || plan.ledger_ahead_accepted.is_some()),
                    }
                }
            }
        }
    }
}

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
use crate::kafka::client_config;
use crate::message_id::{message_key, RecordView};
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
    #[error("recording replayed ids of partition {partition}: {message}")]
    Ledger { partition: i32, message: String },
    #[error("replaying output partition {partition} did not reach offset {target} within {seconds}s (at {at})")]
    Timeout { partition: i32, target: i64, at: i64, seconds: u64 },
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
    record: &mut dyn FnMut(&[(LedgerKey, i64)], Progress) -> Result<(), String>,
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

    let ledger_next_output = input.ledger_progress.map(|pr| pr.next_output_offset).filter(|&o| o >= 0);
    let rebuilt = ledger_next_output.is_none();
    let mut from = ledger_next_output.unwrap_or(low);
    if from > high {
        if !input.accept_ledger_ahead {
            return Err(RecoveryError::LedgerAhead { partition: p, ledger_next_output: from, output_end: high });
        }
        tracing::warn!(
            partition = p,
            ledger_next_output = from,
            output_end = high,
            "The ledger is ahead of the output topic; trusting the ledger as --accept-ledger-ahead asks."
        );
        from = high;
    }
    let mut retention_gap = None;
    if from < low {
        tracing::warn!(
            partition = p,
            ledger_next_output = from,
            first_retained = low,
            "Output records the ledger had not recorded were deleted by retention before recovery; ids in that gap cannot be recovered."
        );
        retention_gap = Some((from, low));
        from = low;
    }
    if rebuilt && high > low {
        tracing::warn!(
            partition = p,
            from = low,
            to = high,
            "The ledger holds nothing for this partition: rebuilding it from the output topic. The dedupe window is now the output's retention."
        );
    }

    let resume_input_at = input
        .committed_input
        .or(input.ledger_progress.map(|pr| pr.next_input_offset).filter(|&o| o >= 0));
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
                .map_err(|message| RecoveryError::Ledger { partition: p, message })?;
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
            .map_err(|message| RecoveryError::Ledger { partition: p, message })?;
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

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

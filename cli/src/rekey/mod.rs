//! `dedupe rekey`: copies a source topic keyed any way (by a user, a device, nothing) into the
//! worker's input topic keyed by each record's message id, read as `worker.id_source` says, and
//! partitioned as `worker.input_partitioner` says; so every copy of an id lands on one partition,
//! where one worker's ledger sees them all.
//!
//! Each batch is one Kafka transaction: its records and the source offsets that follow them
//! (`sendOffsetsToTransaction`, with the consumer group's metadata, so a member that lost its
//! partitions in a rebalance is fenced by the group's generation). A kill at any moment leaves
//! either the whole batch and its offsets or neither: the next run resumes from the committed
//! offsets and the input holds each source record once. Kafka Streams' repartition topic works
//! the same way (a consume-produce-commit loop under exactly-once); this stage differs in that
//! the target is the worker's own input, keyed by the id itself rather than by a mapped key, and a
//! record without an id is copied with its own key (counted) instead of being dropped.
//!
//! Fencing comes first (KIP-447): the producer's `init_transactions`, which fences an older
//! instance with the same transactional id and waits for its open transaction to end, runs before
//! the consumer is assigned its partitions or joins the group, so the committed offsets it
//! resumes from can no longer move under it. Two instances started one after the other (a
//! rolling update) copy each record once: the older one is fenced at its next transaction and
//! exits (code 3) without committing anything more.
//!
//! The loop runs on one thread: records are polled into a batch (up to `batch_max_records`, or
//! `batch_linger` after the first), then produced and committed; a rebalance, which librdkafka
//! reports only inside a poll, drops the batch being gathered and seeks its partitions back to
//! its first records, so no transaction ever spans one.
//!
//! A record larger than the input topic accepts is never retried: with `worker.dead_letter_topic`
//! its position and size (with its key and headers) go there in the transaction that copies its
//! neighbours; without one, the records before it are committed and the stage stops at it (exit
//! 2), naming it, so the committed offset points at it.
//!
//! Its parts: [`start`] (the topics checked, the partitions owned, the clients made fencing
//! first), [`clients`] (the consumer's and the producer's contexts), [`reading`] (polling a batch,
//! rewinding), and here the loop and its transactions.

mod clients;
mod events;
mod reading;
mod start;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use dedupe::config::Config;
use dedupe::identity::{copied_view, message_id};
use dedupe::wire::{HEADER_REKEY_BYTES, HEADER_REKEY_REASON, HEADER_REKEY_SOURCE};
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, PurgeConfig};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use clients::{is_too_large, InputProducer, SourceConsumer};
use dedupe_actors::coordinator::exit;
use events::{
    RekeyAborted, RekeyBatch, RekeyDeadLettered, RekeyFenced, RekeyRecordTooLarge, RekeyStopped,
    SourceRecord,
};
use reading::Polled;

/// How `dedupe rekey` runs, beside the configuration's Kafka, topics and id source.
#[derive(Debug, Clone)]
pub struct RekeyOptions {
    /// The topic to copy from.
    pub source_topic: String,
    /// The consumer group whose committed offsets say how far the copy is: by default
    /// `dedupe-rekey.<input_topic>`.
    pub group_id: Option<String>,
    pub batch_max_records: usize,
    pub batch_linger: Duration,
}

/// The exit code of a stage stopped at a record larger than the input topic accepts, without a
/// dead-letter topic: like a configuration error, it cannot go on until a setting changes.
pub const EXIT_RECORD_TOO_LARGE: i32 = 2;

/// The value of [`HEADER_REKEY_REASON`] for a record larger than the input topic accepts: the
/// core's reason for a record too large, as the worker's dead letters say it.
pub use dedupe::output::REASON_TOO_LARGE;

/// How long a transaction call may take before the stage gives up on it (and exits, to be
/// restarted from the committed offsets).
const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the stage until a signal (exit 0), a fenced producer (exit 3), a record larger than the
/// input accepts without a dead-letter topic ([`EXIT_RECORD_TOO_LARGE`]) or an error.
pub fn run(config: &Config, options: &RekeyOptions, stop: &AtomicBool) -> anyhow::Result<i32> {
    let Some(mut stage) = start::start(config, options, stop)? else {
        return Ok(exit::OK);
    };
    let mut all_committed = true;
    while !stop.load(Ordering::Relaxed) {
        let batch = stage.gather(stop)?;
        if batch.is_empty() {
            continue;
        }
        match stage.copy(&batch)? {
            Outcome::Committed => all_committed = true,
            Outcome::StoppedAt(i) => {
                let r = &batch[i];
                RekeyRecordTooLarge {
                    record: stage.source_record(r),
                    input_topic: &config.worker.input_topic,
                    limit_bytes: stage.limit_bytes,
                }
                .emit();
                return Ok(EXIT_RECORD_TOO_LARGE);
            }
            Outcome::Fenced(e) => {
                RekeyFenced { error: &e }.emit();
                return Ok(exit::FENCED);
            }
            Outcome::Aborted { from } => {
                all_committed = false;
                stage.rewind(&batch[from..])?;
            }
        }
    }
    RekeyStopped { all_committed }.emit();
    Ok(exit::OK)
}

/// What became of a batch.
enum Outcome {
    /// Every record copied (or dead-lettered) and committed.
    Committed,
    /// The records before this index are committed; this one is larger than the input accepts
    /// and there is no dead-letter topic.
    StoppedAt(usize),
    /// The records from this index on were not committed (their transaction was aborted).
    Aborted { from: usize },
    /// The producer was fenced; nothing more can be committed.
    Fenced(KafkaError),
}

/// What became of one transaction over the records of a batch from some index on.
enum Transacted {
    /// The records up to this index are committed.
    Through(usize),
    /// The records before this index are committed; it is too large and has nowhere to go.
    StoppedAt(usize),
}

struct Stage<'a> {
    config: &'a Config,
    options: &'a RekeyOptions,
    consumer: SourceConsumer,
    producer: InputProducer,
    rebalanced: Arc<AtomicBool>,
    limit_bytes: usize,
    /// The group's metadata when the batch being copied began to be read (see
    /// `commit_with_offsets`).
    gathered_under: Option<ConsumerGroupMetadata>,
}

impl Stage<'_> {
    /// Copies the batch in as few transactions as it takes (one, unless the brokers refuse a
    /// record for its size), each with the source offsets after its records. Aborts what fails;
    /// fails only when an abort does.
    fn copy(&mut self, batch: &[Polled]) -> anyhow::Result<Outcome> {
        let mut start = 0;
        // Records the brokers refused for their size in an earlier try: not sent again.
        let mut refused = BTreeSet::new();
        while start < batch.len() {
            let error = match self.transact(batch, start, &refused) {
                Ok(Transacted::Through(end)) => {
                    start = end;
                    continue;
                }
                Ok(Transacted::StoppedAt(i)) => return Ok(Outcome::StoppedAt(i)),
                Err(e) => e,
            };
            if self.is_fenced(&error) {
                return Ok(Outcome::Fenced(error));
            }
            RekeyAborted { error: &error }.emit();
            if let Err(abort) = self.abort() {
                if self.is_fenced(&abort) {
                    return Ok(Outcome::Fenced(abort));
                }
                bail!("aborting a failed rekey transaction ({error}): {abort}");
            }
            // A record the brokers refused for its size is handled as one the client refused,
            // and the rest tried again; anything else is read again.
            let new: Vec<usize> = self
                .producer
                .context()
                .take()
                .into_iter()
                .filter(|i| *i >= start && !refused.contains(i))
                .collect();
            if new.is_empty() {
                return Ok(Outcome::Aborted { from: start });
            }
            refused.extend(new);
        }
        Ok(Outcome::Committed)
    }

    /// One transaction: the records of `batch` from `start` on, keyed by id, and the source
    /// offsets after them. A record larger than the input accepts (refused by the client, or
    /// named in `refused`) goes to the dead-letter topic in the same transaction; without one,
    /// the transaction ends before it and commits the records before it.
    fn transact(
        &mut self,
        batch: &[Polled],
        start: usize,
        refused: &BTreeSet<usize>,
    ) -> Result<Transacted, KafkaError> {
        let input = &self.config.worker.input_topic;
        let dead_letter_topic = self.config.worker.dead_letter_topic.as_deref();
        self.producer.context().take();
        self.producer.begin_transaction()?;
        let (mut rekeyed, mut unkeyed) = (0u64, 0u64);
        let mut dead_lettered = Vec::new();
        let mut end = batch.len();
        for (i, r) in batch.iter().enumerate().skip(start) {
            let sent = if refused.contains(&i) {
                Err(KafkaError::MessageProduction(
                    RDKafkaErrorCode::MessageSizeTooLarge,
                ))
            } else {
                let view = copied_view(r.key.as_deref(), &r.headers, r.value.as_deref());
                let id = message_id(&view, &self.config.worker.id_source).ok();
                let keyed = id.is_some();
                let key = id.as_deref().or(r.key.as_deref());
                let record = copied(input, i, r, key, r.value.as_deref(), &[]);
                self.send(record).map(|()| keyed)
            };
            match sent {
                Ok(true) => rekeyed += 1,
                Ok(false) => unkeyed += 1,
                Err(e) if is_too_large(&e) => {
                    if self.dead_letter(i, r)? {
                        dead_lettered.push(i);
                        continue;
                    }
                    end = i;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if end == start {
            // Stopped at its first record: nothing to commit.
            self.producer.abort_transaction(TRANSACTION_CALL_TIMEOUT)?;
            return Ok(Transacted::StoppedAt(end));
        }
        self.commit_with_offsets(&batch[start..end])?;
        RekeyBatch { rekeyed, unkeyed }.emit();
        for &i in &dead_lettered {
            RekeyDeadLettered {
                record: self.source_record(&batch[i]),
                limit_bytes: self.limit_bytes,
                dead_letter_topic: dead_letter_topic.unwrap_or_default(),
            }
            .emit();
        }
        Ok(if end < batch.len() {
            Transacted::StoppedAt(end)
        } else {
            Transacted::Through(end)
        })
    }

    /// Sends record `i` of the batch, larger than the input accepts, to the dead-letter topic:
    /// its key and headers, and headers naming its position and size. False when there is no
    /// dead-letter topic, or its key and headers alone are too large: it has nowhere to go.
    fn dead_letter(&self, i: usize, r: &Polled) -> Result<bool, KafkaError> {
        let Some(dlq) = self.config.worker.dead_letter_topic.as_deref() else {
            return Ok(false);
        };
        let source = format!("{}:{}:{}", self.options.source_topic, r.partition, r.offset);
        let bytes = r.bytes().to_string();
        let extra = [
            (HEADER_REKEY_REASON, REASON_TOO_LARGE.as_bytes()),
            (HEADER_REKEY_SOURCE, source.as_bytes()),
            (HEADER_REKEY_BYTES, bytes.as_bytes()),
        ];
        let record = copied(dlq, i, r, r.key.as_deref(), None, &extra);
        match self.send(record) {
            Ok(()) => Ok(true),
            Err(e) if is_too_large(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Aborts the open transaction. An abort waits for the delivery reports of every record sent
    /// in it; records still queued for a node that died meanwhile keep it waiting past its
    /// timeout (seen under the cluster tests' broker kills: "Failed to flush all outstanding
    /// messages within the API timeout"), so they are purged and the abort asked again: an
    /// aborted transaction's records are never visible anyway.
    fn abort(&self) -> Result<(), KafkaError> {
        match self.producer.abort_transaction(TRANSACTION_CALL_TIMEOUT) {
            Err(e) if !self.is_fenced(&e) => {
                self.producer
                    .purge(PurgeConfig::default().queue().inflight());
                self.producer.abort_transaction(TRANSACTION_CALL_TIMEOUT)
            }
            other => other,
        }
    }

    /// Adds the source offsets after `records` to the open transaction and commits it.
    fn commit_with_offsets(&self, records: &[Polled]) -> Result<(), KafkaError> {
        let mut offsets = TopicPartitionList::new();
        for (p, o) in offsets_after(records) {
            offsets.add_partition_offset(&self.options.source_topic, p, Offset::Offset(o))?;
        }
        // The group's metadata as it was when the batch began to be read, not as it is now: a
        // member fenced meanwhile (frozen past its session, cut off) rejoins in librdkafka's own
        // thread with a new member epoch before the loop's next poll tells it that its
        // partitions were lost, and the broker would take these offsets under that new epoch
        // while the partitions' new owner copies the same records. Under the epoch the records
        // were read with, the broker refuses them (and the transaction aborts) once the member
        // was fenced or its partitions moved.
        let metadata = self
            .gathered_under
            .as_ref()
            .ok_or(KafkaError::ConsumerCommit(RDKafkaErrorCode::State))?;
        self.producer
            .send_offsets_to_transaction(&offsets, metadata, TRANSACTION_CALL_TIMEOUT)?;
        self.commit()
    }

    /// Commits the open transaction, trying again while librdkafka says the commit may still
    /// succeed (a timeout: the commit may be under way, so it is not aborted).
    fn commit(&self) -> Result<(), KafkaError> {
        let mut tries = 0;
        loop {
            match self.producer.commit_transaction(TRANSACTION_CALL_TIMEOUT) {
                Err(KafkaError::Transaction(e)) if e.is_retriable() && tries < 3 => tries += 1,
                result => return result,
            }
        }
    }

    /// Whether the producer can commit nothing more: fenced by a newer instance with its
    /// transactional id, or another fatal error.
    fn is_fenced(&self, e: &KafkaError) -> bool {
        matches!(e, KafkaError::Transaction(t) if t.is_fatal())
            || self.producer.client().fatal_error().is_some()
    }

    fn source_record<'r>(&'r self, r: &Polled) -> SourceRecord<'r> {
        SourceRecord {
            topic: &self.options.source_topic,
            partition: r.partition,
            offset: r.offset,
            bytes: r.bytes(),
        }
    }

    /// Enqueues one record, waiting while the producer's queue is full.
    fn send(&self, mut record: BaseRecord<'_, [u8], [u8], usize>) -> Result<(), KafkaError> {
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
}

/// A copy of the source record `r` (its headers, timestamp and the given key and value, plus
/// `extra` headers) to `topic`, tagged with its index in the batch.
fn copied<'r>(
    topic: &'r str,
    index: usize,
    r: &'r Polled,
    key: Option<&'r [u8]>,
    value: Option<&'r [u8]>,
    extra: &[(&str, &[u8])],
) -> BaseRecord<'r, [u8], [u8], usize> {
    let mut headers = OwnedHeaders::new_with_capacity(r.headers.len() + extra.len());
    for (name, value) in &r.headers {
        headers = headers.insert(Header {
            key: name,
            value: value.as_deref(),
        });
    }
    for (name, value) in extra {
        headers = headers.insert(Header {
            key: name,
            value: Some(*value),
        });
    }
    let mut record = BaseRecord::with_opaque_to(topic, index).headers(headers);
    if let Some(key) = key {
        record = record.key(key);
    }
    if let Some(value) = value {
        record = record.payload(value);
    }
    if let Some(t) = r.timestamp_ms {
        record = record.timestamp(t);
    }
    record
}

/// The source offsets a transaction of these records commits: on each partition, the offset after
/// its last record (records come in offset order per partition).
fn offsets_after(records: &[Polled]) -> BTreeMap<i32, i64> {
    let mut next = BTreeMap::new();
    for r in records {
        next.insert(r.partition, r.offset + 1);
    }
    next
}

#[cfg(test)]
mod tests {
    use super::reading::tests::polled;
    use super::*;

    #[test]
    fn a_transaction_commits_the_offset_after_each_partitions_last_record() {
        // Two partitions interleaved; a gap on partition 1 (a transaction marker in the source).
        let batch = [polled(0, 5), polled(1, 7), polled(0, 6), polled(1, 9)];
        assert_eq!(offsets_after(&batch), BTreeMap::from([(0, 7), (1, 10)]));
        // A batch cut before its third record commits only what comes before it.
        assert_eq!(offsets_after(&batch[..2]), BTreeMap::from([(0, 6), (1, 8)]));
    }
}

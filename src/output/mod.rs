//! The output writer: one transactional producer per owned partition. A batch's new records and
//! the input offset that follows it are committed in one Kafka transaction, so the output and the
//! consumer group's position never disagree.
//!
//! Each transaction that publishes new ids also writes them to the id changelog
//! ([`crate::changelog`]), partition for partition, so the changelog is exactly as committed as
//! the output. The one record it writes to another partition's changelog is a re-send marker: a
//! forgotten id published here ends the forget written to its other partition's changelog too
//! ([`Batch::other_marks`]).
//!
//! Fencing: the `transactional.id` is derived from the output topic and the partition
//! ([`transactional_id`]). A newer worker that starts for the same partition calls
//! `init_transactions`, which aborts the older one's open transaction and fences it: the older
//! one's next transactional call fails with a fatal "fenced" error, and it stops.
//!
//! All calls block; the actor layer runs this on a thread of its own.

#[doc(hidden)]
pub mod conformance;
mod dead_letter;
mod delivery;
mod error;
mod init;
pub mod owner;
mod refused;
mod sink;

pub use dead_letter::{find_dead_letter, DeadLetterAt, SEARCH_BEFORE_MS};
pub use sink::{MemorySink, Published, Sink};

use std::sync::atomic::Ordering;
use std::time::Duration;

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, PurgeConfig};
use rdkafka::{Offset, TopicPartitionList};

use delivery::{DeliveryTracker, Slot};
use error::{classify, timed_out};
pub use error::{PublishError, RefusedIn, RefusedRecord};
use init::init_transactions;
pub use refused::{
    is_refusal, refusal_reason, refused_dead_letter, ReadAt, REASON_INVALID_RECORD,
    REASON_INVALID_TIMESTAMP, REASON_TOO_LARGE,
};

use crate::identity::{ContentDigest, LedgerKey};
use crate::kafka::{client_config, KafkaConfig};
use crate::retry::Backoff;

/// A record to publish, owned (copied out of the consumer's buffers).
#[derive(Debug, Clone, Default)]
pub struct OutRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp_ms: Option<i64>,
}

impl OutRecord {
    /// Its size as the broker counts it against a topic's limit, less the batch's framing: key,
    /// value and headers.
    pub fn size(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
            .sum();
        self.key.as_ref().map_or(0, Vec::len) + self.value.as_ref().map_or(0, Vec::len) + headers
    }
}

/// What one committed transaction wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// Output offset of the last record written to the partition, if any was.
    pub last_output_offset: Option<i64>,
    /// Offset of the changelog record written, if the batch had new ids.
    pub changelog_offset: Option<i64>,
}

/// One batch to commit: its new records, its dead letters, its new ids (for the changelog) and
/// the input offset that follows it.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    pub records: &'a [OutRecord],
    pub dead_letters: &'a [OutRecord],
    /// Audit records, sent to the audit topic's partition of the input partition's number.
    pub audit: &'a [OutRecord],
    /// The batch's new ids, with first-seen times and content digests.
    pub new_ids: &'a [(LedgerKey, i64, Option<ContentDigest>)],
    /// Marker records for the id changelog, after the ids' record (see
    /// [`crate::changelog::encode_mark`]).
    pub marks: &'a [Vec<u8>],
    /// Marker records for other partitions' changelogs, each with its partition: a forgotten id
    /// published on this partition ends the forget written to the changelogs of its other
    /// partitions too, so a partition loaded alone elsewhere reads it ended. They are not this
    /// partition's changelog position ([`Committed::changelog_offset`]).
    pub other_marks: &'a [(i32, Vec<u8>)],
    pub input_topic: &'a str,
    pub input_partition: i32,
    /// The input offset committed with the batch; negative: none (a transaction of its own).
    pub next_input_offset: i64,
}

/// The topics one output producer writes.
#[derive(Debug, Clone, Copy)]
pub struct OutputTopics<'a> {
    pub output: &'a str,
    pub changelog: &'a str,
    pub dead_letter: Option<&'a str>,
    /// The duplicate audit (`worker.audit_topic`), when on.
    pub audit: Option<&'a str>,
}

/// The transactional id of the producer that owns `partition` of `output_topic`.
pub fn transactional_id(output_topic: &str, partition: i32) -> String {
    format!("dedupe-{output_topic}-{partition}")
}

/// The partition a [`transactional_id`] of `output_topic` names.
pub fn partition_of(output_topic: &str, transactional_id: &str) -> Option<i32> {
    transactional_id
        .strip_prefix("dedupe-")?
        .strip_prefix(output_topic)?
        .strip_prefix('-')?
        .parse()
        .ok()
}

/// How long one blocking transactional call (a flush, sending the offsets, a commit, an abort)
/// may take: a sixth of the transaction's timeout, between 10 s and 15 s. A call to a node that
/// hangs fails after the clients' `socket.timeout.ms` (10 s here) and librdkafka asks the next
/// leader or coordinator; the call's own timeout bounds the rest, so a partition stalled by a
/// fault aborts and tries its batch again, or (a commit) calls again, within seconds, well inside
/// the transaction's timeout. The watchdog takes a call 2 s past this for hung.
pub fn call_timeout(transaction_timeout_ms: u64) -> Duration {
    Duration::from_millis(transaction_timeout_ms / 6)
        .clamp(Duration::from_secs(10), Duration::from_secs(15))
}

/// The longest a new producer waits for its first broker connection before init_transactions
/// (see [`OutputWriter::open`]).
const CONNECT_WAIT: Duration = Duration::from_secs(2);

/// The transactional producer of one output partition.
pub struct OutputWriter {
    producer: BaseProducer<DeliveryTracker>,
    topic: String,
    partition: i32,
    changelog_topic: String,
    dead_letter_topic: Option<String>,
    audit_topic: Option<String>,
    transactional_id: String,
    timeout: Duration,
}

impl OutputWriter {
    /// Creates the producer and calls `init_transactions`, which fences any older producer of
    /// the same partition and aborts its open transaction.
    pub fn open(
        kafka: &KafkaConfig,
        topics: &OutputTopics<'_>,
        partition: i32,
        transaction_timeout_ms: u64,
    ) -> Result<Self, PublishError> {
        let topic = topics.output;
        let transactional_id = transactional_id(topic, partition);
        let producer: BaseProducer<DeliveryTracker> = client_config(kafka)
            .set("transactional.id", &transactional_id)
            .set("transaction.timeout.ms", transaction_timeout_ms.to_string())
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("batch.size", "1000000")
            .set("compression.type", "lz4")
            .set("queue.buffering.max.kbytes", "262144")
            .create_with_context(DeliveryTracker::new(topic, topics.changelog, partition))
            .map_err(|source| PublishError::Fatal { source })?;
        let timeout = call_timeout(transaction_timeout_ms);
        // A new producer's InitProducerId that finds no broker connected yet is tried again only
        // by librdkafka's 500 ms timer: 3 of 8 fresh producers here waited that long (init 505
        // ms against 55). One metadata request first waits for the connection instead (12 of 12
        // at 55 to 59 ms). Its failure is init_transactions' to report.
        let _ = producer
            .client()
            .fetch_metadata(None, timeout.min(CONNECT_WAIT));
        init_transactions(&producer, &transactional_id, timeout)?;
        Ok(Self {
            producer,
            topic: topic.to_string(),
            partition,
            changelog_topic: topics.changelog.to_string(),
            dead_letter_topic: topics.dead_letter.map(str::to_string),
            audit_topic: topics.audit.map(str::to_string),
            transactional_id,
            timeout,
        })
    }

    pub fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    /// Publishes the batch's records to the output partition, its dead letters to the dead-letter
    /// topic and its new ids to the changelog partition, and commits them with the next input
    /// offset for the input partition, in one transaction. On any error the transaction is
    /// aborted (or the producer is declared unusable).
    pub fn publish(
        &mut self,
        batch: &Batch<'_>,
        group: &ConsumerGroupMetadata,
    ) -> Result<Committed, PublishError> {
        self.producer.context().reset();
        self.producer
            .begin_transaction()
            .map_err(|e| classify(e, &self.transactional_id))?;
        let result = self.fill_and_commit(batch, group);
        match result {
            Ok(c) => Ok(c),
            // A call that timed out waited on a node that answers nothing (hung, paused or cut
            // off). This producer keeps asking that node (librdkafka looks up a transaction
            // coordinator again only on an error, and a silent node gives none), so every retry
            // would wait as long. A new producer looks everything up afresh, and fences this one
            // and aborts its transaction as it starts.
            Err(PublishError::Aborted { source }) if timed_out(&source) => {
                Err(PublishError::Fatal { source })
            }
            Err(PublishError::Aborted { source }) => Err(self.refused(self.abort(source))),
            Err(e) => Err(e),
        }
    }

    /// An aborted transaction's error, naming the records refused for good if any were.
    fn refused(&self, aborted: PublishError) -> PublishError {
        let refused = self.producer.context().take_refused();
        match aborted {
            PublishError::Aborted { source } if !refused.is_empty() => {
                PublishError::Refused { refused, source }
            }
            other => other,
        }
    }

    /// Aborts the open transaction so the next batch starts clean, and answers why the batch was
    /// not committed: `source`, or what made the producer unusable.
    fn abort(&self, source: KafkaError) -> PublishError {
        // Records sent before a record the producer refused itself wait in its queue, and the
        // abort waits for their delivery reports, which only a poll serves: purged and served
        // here, the abort finds none (unserved, the abort would time out and lose the producer).
        self.producer
            .purge(PurgeConfig::default().queue().inflight());
        let _ = self.producer.flush(self.timeout);
        let watched =
            crate::watchdog::arm("abort_transaction", &self.transactional_id, self.timeout);
        let aborted = self.producer.abort_transaction(self.timeout);
        drop(watched);
        match aborted {
            Ok(()) => PublishError::Aborted { source },
            Err(e) if timed_out(&e) => PublishError::Fatal { source: e },
            Err(e) => classify(e, &self.transactional_id),
        }
    }

    fn fill_and_commit(
        &mut self,
        batch: &Batch<'_>,
        group: &ConsumerGroupMetadata,
    ) -> Result<Committed, PublishError> {
        fail::fail_point!("output-before-produce", |_| Err(PublishError::Aborted {
            source: KafkaError::MessageProduction(RDKafkaErrorCode::Fail),
        }));
        self.produce(batch)?;
        // One budget for the transaction's waits (flush, offsets, commit), not one each: with a
        // node just killed, each step can use most of its own timeout in turn (seen in the kill
        // test: a flush that waited 9 s for the leader to move, then a commit that timed out
        // after 10 s more). Past the budget a new producer is quicker than asking on.
        let mut budget = TransactionBudget::new(self.timeout);
        self.flush(&mut budget)
            .map_err(|e| classify(e, &self.transactional_id))?;
        self.all_delivered()?;
        // A transaction of its own (a forget) commits no input offset.
        if batch.next_input_offset >= 0 {
            self.send_offsets(batch, group, &budget)?;
            fail::fail_point!("output-before-commit", |_| {
                eprintln!("failpoint output-before-commit: exiting");
                std::process::exit(86)
            });
        }
        self.commit_with_retries(&budget)?;
        Ok(self.committed())
    }

    /// Sends every record of the batch into the open transaction: its output records, dead
    /// letters, audit records, new ids and marks. A record the producer refuses for good (over
    /// its own `message.max.bytes`) is noted and the rest sent on, so one attempt names every
    /// such record; the transaction is then aborted.
    fn produce(&self, batch: &Batch<'_>) -> Result<(), PublishError> {
        let mut refused = None;
        let mut tracked = |sent: Result<(), PublishError>| match sent {
            Err(PublishError::Aborted { source })
                if source.rdkafka_error_code().is_some_and(is_refusal) =>
            {
                refused.get_or_insert(source);
                Ok(())
            }
            other => other,
        };
        for (i, r) in batch.records.iter().enumerate() {
            let slot = Slot::of(RefusedIn::Output, i);
            tracked(self.send(&self.topic, Some(self.partition), r, slot))?;
        }
        if let Some(dlq) = &self.dead_letter_topic {
            for (i, r) in batch.dead_letters.iter().enumerate() {
                tracked(self.send(dlq, None, r, Slot::of(RefusedIn::DeadLetter, i)))?;
            }
        }
        if let Some(source) = refused {
            return Err(PublishError::Aborted { source });
        }
        let untracked = Slot::UNTRACKED;
        if let Some(audit) = &self.audit_topic {
            for r in batch.audit {
                self.send(audit, Some(batch.input_partition), r, untracked)?;
            }
        }
        let changelog = |value: Vec<u8>| OutRecord {
            value: Some(value),
            ..OutRecord::default()
        };
        if let Some(value) = crate::changelog::encode(batch.new_ids) {
            self.send(
                &self.changelog_topic,
                Some(self.partition),
                &changelog(value),
                untracked,
            )?;
        }
        for mark in batch.marks {
            self.send(
                &self.changelog_topic,
                Some(self.partition),
                &changelog(mark.clone()),
                untracked,
            )?;
        }
        for (partition, mark) in batch.other_marks {
            self.send(
                &self.changelog_topic,
                Some(*partition),
                &changelog(mark.clone()),
                untracked,
            )?;
        }
        Ok(())
    }

    /// Refuses the transaction when one of its records was not delivered; the abort names the
    /// first failed record's topic and its error.
    fn all_delivered(&self) -> Result<(), PublishError> {
        if self.producer.context().failures.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        let (topic, code) = self
            .producer
            .context()
            .take_first_failure()
            .unwrap_or_else(|| (String::new(), RDKafkaErrorCode::Fail));
        crate::metrics::events::OutputRecordUndelivered {
            topic: &topic,
            code: &code,
        }
        .emit();
        Err(PublishError::Aborted {
            source: KafkaError::MessageProduction(code),
        })
    }

    /// Adds the batch's next input offset, naming this pipeline, to the transaction.
    fn send_offsets(
        &self,
        batch: &Batch<'_>,
        group: &ConsumerGroupMetadata,
        budget: &TransactionBudget,
    ) -> Result<(), PublishError> {
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset(
                batch.input_topic,
                batch.input_partition,
                Offset::Offset(batch.next_input_offset),
            )
            .map_err(|source| PublishError::Fatal { source })?;
        // The offset names the pipeline it belongs to (see [`owner`]).
        if let Some(mut committed) =
            offsets.find_partition(batch.input_topic, batch.input_partition)
        {
            committed.set_metadata(owner::offset_metadata(&self.topic));
        }
        let wait = budget.left();
        let watched =
            crate::watchdog::arm("send_offsets_to_transaction", &self.transactional_id, wait);
        self.producer
            .send_offsets_to_transaction(&offsets, group, wait)
            .map_err(|e| classify(e, &self.transactional_id))?;
        drop(watched);
        Ok(())
    }

    /// What the transaction just committed wrote last.
    fn committed(&self) -> Committed {
        let tracker = self.producer.context();
        let last = tracker.last_output.load(Ordering::Relaxed);
        let changelog = tracker.last_changelog.load(Ordering::Relaxed);
        Committed {
            last_output_offset: (last >= 0).then_some(last),
            changelog_offset: (changelog >= 0).then_some(changelog),
        }
    }

    /// Waits until every record of the transaction is acknowledged, within `budget`. If the wait
    /// times out soon after a node closed or refused this producer's connection (it died or
    /// stops), the budget is extended once by [`LEADER_MOVE_GRACE`]: waiting for the cluster to
    /// move that node's leaderships is quicker than a new producer's fence and a second send.
    fn flush(&self, budget: &mut TransactionBudget) -> KafkaResult<()> {
        let mut extended = false;
        loop {
            let wait = budget.left();
            let watched = crate::watchdog::arm("flush", &self.transactional_id, wait);
            let flushed = self.producer.flush(wait);
            drop(watched);
            match flushed {
                Err(e)
                    if !extended
                        && timed_out(&e)
                        && self
                            .producer
                            .context()
                            .node_lost_within(LEADER_MOVE_GRACE + self.timeout) =>
                {
                    tracing::info!(transactional_id = %self.transactional_id, grace_secs = LEADER_MOVE_GRACE.as_secs(), "The flush timed out after a node closed or refused the producer's connection; waiting for its leaderships to move.");
                    budget.extend(LEADER_MOVE_GRACE);
                    extended = true;
                }
                other => return other,
            }
        }
    }

    /// Sends one record; `slot` names its place in the batch for the delivery report (a record
    /// the producer refuses at once is noted under it here).
    fn send(
        &self,
        topic: &str,
        partition: Option<i32>,
        r: &OutRecord,
        slot: Slot,
    ) -> Result<(), PublishError> {
        loop {
            let mut rec: BaseRecord<'_, [u8], [u8], usize> =
                BaseRecord::with_opaque_to(topic, slot.0);
            if let Some(p) = partition {
                rec = rec.partition(p);
            }
            if let Some(k) = &r.key {
                rec = rec.key(k.as_slice());
            }
            if let Some(v) = &r.value {
                rec = rec.payload(v.as_slice());
            }
            if let Some(ts) = r.timestamp_ms {
                rec = rec.timestamp(ts);
            }
            if !r.headers.is_empty() {
                let mut h = OwnedHeaders::new_with_capacity(r.headers.len());
                for (key, value) in &r.headers {
                    h = h.insert(Header {
                        key,
                        value: value.as_deref(),
                    });
                }
                rec = rec.headers(h);
            }
            match self.producer.send(rec) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    // Room comes as records are delivered, or as they time out (then the
                    // transaction aborts): the wait is bounded by librdkafka's message timeout.
                    crate::metrics::events::OutputQueueFull {
                        partition: self.partition,
                    }
                    .emit();
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => {
                    if let Some(code) = e.rdkafka_error_code() {
                        self.producer.context().note_refused(slot, code);
                    }
                    return Err(classify(e, &self.transactional_id));
                }
            }
        }
    }

    /// Commits, calling `commit_transaction` again on a retriable error, as librdkafka requires:
    /// the commit may have reached the broker, so the transaction must not be aborted then. A
    /// commit that timed out is not asked again on this producer: it waited on a coordinator that
    /// died or went silent, and this producer would keep asking the same one (seen in the kill
    /// test: a second 10 s wait, while a new producer took 0.7 s). The caller makes a new
    /// producer, whose `init_transactions` has the coordinator finish the transaction either
    /// way (committed if the commit reached it, else aborted) before recovery reads the logs,
    /// as after a crash at this point. This is the commit's only retry; an aborted transaction
    /// is a different failure, retried by the caller as a whole batch.
    fn commit_with_retries(&mut self, budget: &TransactionBudget) -> Result<(), PublishError> {
        let mut backoff = COMMIT_RETRIES;
        loop {
            let wait = budget.left();
            let watched = crate::watchdog::arm("commit_transaction", &self.transactional_id, wait);
            // The tests hang a commit here (`sleep(MS)`), as librdkafka's known hangs do.
            fail::fail_point!("output-commit-hangs");
            let committed = self.producer.commit_transaction(wait);
            drop(watched);
            match committed {
                Ok(()) => return Ok(()),
                Err(e) if timed_out(&e) => return Err(PublishError::Fatal { source: e }),
                Err(e) => {
                    let retriable = matches!(&e, KafkaError::Transaction(t) if t.is_retriable());
                    match backoff.next_delay().filter(|_| retriable) {
                        Some(delay) => {
                            crate::metrics::events::CommitRetried {
                                retries: backoff.retries(),
                                error: &e,
                            }
                            .emit();
                            std::thread::sleep(delay);
                        }
                        None => return Err(classify(e, &self.transactional_id)),
                    }
                }
            }
        }
    }
}

/// What is left of a transaction's time for its next wait: its call timeout from the first
/// wait's start (extended once when a node is lost, see [`OutputWriter::flush`]), and never less
/// than [`TransactionBudget::FLOOR`] (a healthy step takes
/// milliseconds; one that needs more than what is left would rather fail into a new producer).
struct TransactionBudget {
    deadline: std::time::Instant,
}

impl TransactionBudget {
    const FLOOR: Duration = Duration::from_secs(1);

    fn new(total: Duration) -> Self {
        Self {
            deadline: std::time::Instant::now() + total,
        }
    }

    fn extend(&mut self, by: Duration) {
        self.deadline += by;
    }

    fn left(&self) -> Duration {
        self.deadline
            .saturating_duration_since(std::time::Instant::now())
            .max(Self::FLOOR)
    }
}

/// How much longer a transaction may wait for its records when a node closed or refused the
/// producer's connection (it died or stops): the cluster moves a dead node's leaderships about
/// 9 s after its death (`broker.session.timeout.ms`) and the producer learns of it at its next
/// metadata lookup (every 3 s, [`crate::kafka::METADATA_REFRESH_MS`]), so a flush that began just
/// before the death needs up to about 13 s, past the call timeout. Only then: a node that hangs
/// or is cut off gives no such failure, and waiting longer on it only delays the new producer
/// that asks elsewhere.
const LEADER_MOVE_GRACE: Duration = Duration::from_secs(5);

/// Retries of a commit refused for now (a retriable error other than a timeout): at once, five
/// times.
const COMMIT_RETRIES: Backoff = Backoff::new(Duration::ZERO, Duration::ZERO, 5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transactional_id_names_its_partition_and_no_other_topics() {
        let id = transactional_id("events.out", 7);
        assert_eq!(partition_of("events.out", &id), Some(7));
        assert_eq!(
            partition_of("events", &id),
            None,
            "a topic whose name is a prefix of the output's"
        );
        assert_eq!(partition_of("events.out", "dedupe-events.out-x"), None);
        assert_eq!(partition_of("events.out", "other-events.out-1"), None);
    }

    #[test]
    fn a_calls_timeout_is_a_sixth_of_the_transactions_within_bounds() {
        assert_eq!(call_timeout(60_000), Duration::from_secs(10));
        assert_eq!(call_timeout(72_000), Duration::from_secs(12));
        assert_eq!(call_timeout(5_000), Duration::from_secs(10));
        assert_eq!(call_timeout(900_000), Duration::from_secs(15));
    }
}

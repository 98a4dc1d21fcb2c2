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

mod events;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use dedupe::config::{Assignment, Config, InputPartitioner};
use dedupe::identity::{copied_view, message_id};
use dedupe::wire::{HEADER_REKEY_BYTES, HEADER_REKEY_REASON, HEADER_REKEY_SOURCE};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::signals::unless_stopped;
use dedupe_actors::coordinator::exit;
use events::{
    RekeyAborted, RekeyBatch, RekeyDeadLettered, RekeyFenced, RekeyReadFailed, RekeyRecordTooLarge,
    RekeyRewound, RekeyStopped, SourceRecord,
};

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

/// The value of [`HEADER_REKEY_REASON`] for a record larger than the input topic accepts.
pub const REASON_TOO_LARGE: &str = "too_large";

/// How long a transaction call may take before the stage gives up on it (and exits, to be
/// restarted from the committed offsets).
const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long reading the topics' metadata and settings may take at start.
const METADATA_TIMEOUT: Duration = Duration::from_secs(30);

/// librdkafka's default `message.max.bytes`, the largest record its producer sends.
const LIBRDKAFKA_MESSAGE_MAX_BYTES: usize = 1_000_000;

/// A record batch's own framing (Kafka's v2 batch header): what a topic's `max.message.bytes`
/// counts beside the records.
const RECORD_BATCH_OVERHEAD_BYTES: usize = 61;

/// The consumer's context: notes every rebalance, which the loop answers by dropping the batch it
/// is gathering.
struct RebalanceFlag(Arc<AtomicBool>);

impl ClientContext for RebalanceFlag {}

impl ConsumerContext for RebalanceFlag {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, _: &Rebalance<'_>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

type SourceConsumer = BaseConsumer<RebalanceFlag>;

/// The producer's context: notes which records of the open transaction the brokers refused for
/// their size, by their index in the batch (a limit the client's own check did not see).
#[derive(Default)]
struct Deliveries {
    too_large: Mutex<BTreeSet<usize>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
        if let Err((e, _)) = result {
            if is_too_large(e) {
                if let Ok(mut refused) = self.too_large.lock() {
                    refused.insert(index);
                }
            }
        }
    }
}

impl Deliveries {
    fn take(&self) -> BTreeSet<usize> {
        self.too_large
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default()
    }
}

type InputProducer = ThreadedProducer<Deliveries>;

/// A record polled from the source, owned until its batch is produced.
struct Polled {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp_ms: Option<i64>,
}

impl Polled {
    fn of(m: &BorrowedMessage<'_>) -> Polled {
        Polled {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers: m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
            timestamp_ms: m.timestamp().to_millis(),
        }
    }

    /// Its key, value and headers, in bytes.
    fn bytes(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len)
            + self.value.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
    }
}

/// Which source partitions this instance copies, and the name its transactional id ends with.
enum Owned {
    /// Shared with the group's other members (`worker.assignment = "group"`).
    Group { member: String },
    /// Fixed partitions.
    Static(Vec<i32>),
}

impl Owned {
    fn member(&self) -> String {
        match self {
            Owned::Group { member } => member.clone(),
            Owned::Static(owned) => format!("p{}", dedupe::config::PartitionSet(owned.clone())),
        }
    }
}

/// Runs the stage until a signal (exit 0), a fenced producer (exit 3), a record larger than the
/// input accepts without a dead-letter topic ([`EXIT_RECORD_TOO_LARGE`]) or an error.
pub fn run(config: &Config, options: &RekeyOptions, stop: &AtomicBool) -> anyhow::Result<i32> {
    let w = &config.worker;
    if options.source_topic == w.input_topic {
        bail!(
            "the source topic and the input topic are both {}: rekey copies one into the other",
            w.input_topic
        );
    }
    if let Some(dlq) = &w.dead_letter_topic {
        if *dlq == options.source_topic || *dlq == w.input_topic {
            bail!("worker.dead_letter_topic ({dlq}) must differ from the source and input topics");
        }
    }
    let brokers = &config.kafka.brokers;
    // The topics' metadata, on a thread of its own: a stop while the brokers do not answer is
    // taken at once.
    let counted = {
        let (kafka, source, input, dlq) = (
            config.kafka.clone(),
            options.source_topic.clone(),
            w.input_topic.clone(),
            w.dead_letter_topic.clone(),
        );
        unless_stopped(stop, "rekey-topics", move || {
            let count =
                |topic: &str| dedupe::kafka::partition_count(&kafka, topic, METADATA_TIMEOUT);
            let dlq = dlq.as_deref().map(count).transpose()?;
            Ok::<_, dedupe::kafka::ConnectError>((count(&source)?, count(&input)?, dlq))
        })
        .context("starting the thread that checks the topics")?
    };
    let Some(counted) = counted else {
        return Ok(stopped_while_starting("checking the topics"));
    };
    let (source_partitions, input_partitions, dlq_partitions) = counted.with_context(|| {
        format!("reading the metadata of the topics from the brokers {brokers} (kafka.brokers)")
    })?;
    let source_partitions = source_partitions
        .with_context(|| format!("the source topic {} does not exist", options.source_topic))?;
    input_partitions
        .with_context(|| format!("the input topic {} does not exist", w.input_topic))?;
    if let (Some(dlq), Some(partitions)) = (&w.dead_letter_topic, dlq_partitions) {
        partitions.with_context(|| format!("the dead-letter topic {dlq} does not exist"))?;
    }
    let limit_bytes = record_limit_bytes(config);
    let group = options
        .group_id
        .clone()
        .unwrap_or_else(|| format!("dedupe-rekey.{}", w.input_topic));
    let owned = owned(config, options, source_partitions)?;
    // Fence first: until init_transactions returns, an older instance with this transactional
    // id may still commit, and offsets read before then would be copied again.
    let transactional_id = format!("dedupe-rekey.{}.{}", w.input_topic, owned.member());
    let producer = producer(config, &transactional_id, limit_bytes)?;
    if stop.load(Ordering::Relaxed) {
        return Ok(stopped_while_starting("making its producer"));
    }
    // Not abandoned on a stop: it fences the previous instance and waits for its transaction to
    // end, at most its timeout; the stop is taken right after.
    producer
        .init_transactions(TRANSACTION_CALL_TIMEOUT)
        .with_context(|| {
            format!("initializing the rekey producer's transactions ({transactional_id}) with the brokers {brokers}")
        })?;
    if stop.load(Ordering::Relaxed) {
        return Ok(stopped_while_starting("initializing its transactions"));
    }
    let rebalanced = Arc::new(AtomicBool::new(false));
    let consumer = consumer(config, options, &group, &owned, &rebalanced)?;
    tracing::info!(source = %options.source_topic, input = %w.input_topic, group = %group, transactional_id = %transactional_id, id_source = %w.id_source, limit_bytes, "Re-keying the source topic into the input topic by message id.");
    let mut stage = Stage {
        config,
        options,
        consumer,
        producer,
        rebalanced,
        limit_bytes,
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
                    input_topic: &w.input_topic,
                    limit_bytes,
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

/// The stage was asked to stop before it copied anything: logs it, and the exit code.
fn stopped_while_starting(phase: &str) -> i32 {
    tracing::info!(
        phase,
        "Received a stop signal while starting; stopped before copying anything."
    );
    exit::OK
}

/// The largest record the input topic takes: the producer's `message.max.bytes` (librdkafka's
/// default unless `kafka.properties` sets it), lowered to the topic's `max.message.bytes` less a
/// batch's framing when that is smaller, so the client refuses such a record when it is produced.
/// When the brokers do not describe the topic, the producer's limit alone; a record the brokers
/// then refuse is found by its delivery report.
fn record_limit_bytes(config: &Config) -> usize {
    let client = config
        .kafka
        .properties
        .get("message.max.bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(LIBRDKAFKA_MESSAGE_MAX_BYTES);
    let topic = futures::executor::block_on(dedupe::kafka::topic_max_message_bytes(
        &config.kafka,
        &config.worker.input_topic,
    ))
    .ok()
    .flatten()
    .map(|b| (b as usize).saturating_sub(RECORD_BATCH_OVERHEAD_BYTES));
    // librdkafka refuses a message.max.bytes under 1,000.
    topic.map_or(client, |t| client.min(t)).max(1_000)
}

fn is_too_large(e: &KafkaError) -> bool {
    e.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageSizeTooLarge)
}

/// Which source partitions this instance copies (`worker.assignment`, `worker.partitions`,
/// `worker_index`/`worker_count`, or all of them).
fn owned(
    config: &Config,
    options: &RekeyOptions,
    source_partitions: usize,
) -> anyhow::Result<Owned> {
    let w = &config.worker;
    if w.assignment == Assignment::Group {
        let member = w.member_id().unwrap_or_else(|| "rekey".into());
        return Ok(Owned::Group { member });
    }
    let owned: Vec<i32> = match (&w.partitions, w.worker_index, w.worker_count) {
        (Some(set), _, _) => set.0.clone(),
        (None, Some(i), Some(n)) => (0..source_partitions as i32)
            .filter(|p| (*p as u32) % n == i)
            .collect(),
        _ => (0..source_partitions as i32).collect(),
    };
    if let Some(p) = owned.iter().find(|&&p| p as usize >= source_partitions) {
        bail!("worker.partitions names partition {p}, but the source topic {} has only {source_partitions}", options.source_topic);
    }
    Ok(Owned::Static(owned))
}

/// The source consumer, subscribed (group mode) or assigned the owned partitions at their
/// committed offsets (static mode). Made only after the producer is initialised: it reads the
/// committed offsets as soon as it has partitions.
fn consumer(
    config: &Config,
    options: &RekeyOptions,
    group: &str,
    owned: &Owned,
    rebalanced: &Arc<AtomicBool>,
) -> anyhow::Result<SourceConsumer> {
    let consumer: SourceConsumer = dedupe_actors::membership::exactly_once_reader(config, group)
        .create_with_context(RebalanceFlag(Arc::clone(rebalanced)))
        .context("creating the rekey consumer")?;
    match owned {
        Owned::Group { .. } => consumer
            .subscribe(&[&options.source_topic])
            .context("joining the rekey consumer group")?,
        Owned::Static(partitions) => {
            let mut tpl = TopicPartitionList::new();
            for &p in partitions {
                tpl.add_partition_offset(&options.source_topic, p, Offset::Stored)?;
            }
            consumer
                .assign(&tpl)
                .context("assigning the source partitions")?;
        }
    }
    Ok(consumer)
}

/// The transactional producer of the input topic, partitioning as the input's producers do.
fn producer(
    config: &Config,
    transactional_id: &str,
    limit_bytes: usize,
) -> anyhow::Result<InputProducer> {
    let partitioner = match config.worker.input_partitioner {
        InputPartitioner::Murmur2Random => "murmur2_random",
        InputPartitioner::ConsistentRandom => "consistent_random",
    };
    dedupe::kafka::client_config(&config.kafka)
        .set("transactional.id", transactional_id)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", partitioner)
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set("message.max.bytes", limit_bytes.to_string())
        .set(
            "transaction.timeout.ms",
            config.worker.transaction_timeout_ms.to_string(),
        )
        .create_with_context(Deliveries::default())
        .context("creating the rekey producer")
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
}

impl Stage<'_> {
    /// Polls up to a batch of records; a rebalance drops what it gathered and rewinds.
    fn gather(&mut self, stop: &AtomicBool) -> anyhow::Result<Vec<Polled>> {
        let mut batch = Vec::new();
        let mut deadline: Option<Instant> = None;
        while batch.len() < self.options.batch_max_records && !stop.load(Ordering::Relaxed) {
            let wait = deadline.map_or(Duration::from_millis(100), |d| {
                d.saturating_duration_since(Instant::now())
            });
            if deadline.is_some() && wait.is_zero() {
                break;
            }
            let polled = self.consumer.poll(wait);
            if self.rebalanced.swap(false, Ordering::SeqCst) {
                // What was read before the rebalance, this record included, is read again (on
                // the partitions still assigned; the others start from their committed offsets
                // wherever they go).
                if let Some(Ok(m)) = &polled {
                    batch.push(Polled::of(m));
                }
                drop(polled);
                self.rewind(&batch)?;
                batch.clear();
                deadline = None;
                continue;
            }
            match polled {
                Some(Ok(m)) => {
                    deadline.get_or_insert_with(|| Instant::now() + self.options.batch_linger);
                    batch.push(Polled::of(&m));
                }
                Some(Err(e)) => RekeyReadFailed { error: &e }.emit(),
                None if deadline.is_none() => break,
                None => {}
            }
        }
        Ok(batch)
    }

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
            if let Err(abort) = self.producer.abort_transaction(TRANSACTION_CALL_TIMEOUT) {
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
                    if let Some(dlq) = dead_letter_topic {
                        let source =
                            format!("{}:{}:{}", self.options.source_topic, r.partition, r.offset);
                        let bytes = r.bytes().to_string();
                        let extra = [
                            (HEADER_REKEY_REASON, REASON_TOO_LARGE.as_bytes()),
                            (HEADER_REKEY_SOURCE, source.as_bytes()),
                            (HEADER_REKEY_BYTES, bytes.as_bytes()),
                        ];
                        let record = copied(dlq, i, r, r.key.as_deref(), None, &extra);
                        match self.send(record) {
                            Ok(()) => {
                                dead_lettered.push(i);
                                continue;
                            }
                            // Its key and headers alone are too large: it has nowhere to go.
                            Err(e) if is_too_large(&e) => {}
                            Err(e) => return Err(e),
                        }
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
        let mut offsets = TopicPartitionList::new();
        for (p, o) in offsets_after(&batch[start..end]) {
            offsets.add_partition_offset(&self.options.source_topic, p, Offset::Offset(o))?;
        }
        // The group's current metadata: a member that lost these partitions in a rebalance
        // (a stale generation or member epoch) cannot commit them.
        let metadata = self
            .consumer
            .group_metadata()
            .ok_or(KafkaError::ConsumerCommit(RDKafkaErrorCode::State))?;
        self.producer
            .send_offsets_to_transaction(&offsets, &metadata, TRANSACTION_CALL_TIMEOUT)?;
        self.commit()?;
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

    /// Seeks each source partition that `uncommitted` holds records of, and that is still
    /// assigned, back to its first record there: every record read since the last commit is
    /// in the batch, so that is where the committed offset points (past any transaction
    /// markers between them). Fails if a seek does: the stage must not read on past records it
    /// did not copy (a restart resumes from the committed offsets).
    fn rewind(&self, uncommitted: &[Polled]) -> anyhow::Result<()> {
        let assignment = self
            .consumer
            .assignment()
            .context("reading the rekey consumer's assignment to rewind it")?;
        let topic = &self.options.source_topic;
        let mut partitions = 0;
        for (p, offset) in first_offsets(uncommitted) {
            if assignment.find_partition(topic, p).is_none() {
                // Revoked: whoever takes it starts from its committed offset.
                continue;
            }
            self.consumer
                .seek(topic, p, Offset::Offset(offset), Duration::from_secs(10))
                .with_context(|| format!("seeking the source partition {topic}/{p} back to offset {offset}, the first record not committed"))?;
            partitions += 1;
        }
        RekeyRewound { partitions }.emit();
        Ok(())
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

/// Where a rewind seeks each partition of these uncommitted records: its first record among them.
fn first_offsets(records: &[Polled]) -> BTreeMap<i32, i64> {
    let mut first = BTreeMap::new();
    for r in records {
        first.entry(r.partition).or_insert(r.offset);
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polled(partition: i32, offset: i64) -> Polled {
        Polled {
            partition,
            offset,
            key: Some(b"k".to_vec()),
            value: Some(b"value".to_vec()),
            headers: vec![("h".into(), Some(b"v".to_vec())), ("n".into(), None)],
            timestamp_ms: None,
        }
    }

    #[test]
    fn a_transaction_commits_the_offset_after_each_partitions_last_record() {
        // Two partitions interleaved; a gap on partition 1 (a transaction marker in the source).
        let batch = [polled(0, 5), polled(1, 7), polled(0, 6), polled(1, 9)];
        assert_eq!(offsets_after(&batch), BTreeMap::from([(0, 7), (1, 10)]));
        // A batch cut before its third record commits only what comes before it.
        assert_eq!(offsets_after(&batch[..2]), BTreeMap::from([(0, 6), (1, 8)]));
    }

    #[test]
    fn a_rewind_goes_back_to_each_partitions_first_uncommitted_record() {
        let batch = [polled(0, 5), polled(1, 7), polled(0, 6), polled(1, 9)];
        assert_eq!(first_offsets(&batch), BTreeMap::from([(0, 5), (1, 7)]));
        // After the first two are committed, the rest start where they stand.
        assert_eq!(first_offsets(&batch[2..]), BTreeMap::from([(0, 6), (1, 9)]));
        assert!(first_offsets(&[]).is_empty());
    }

    #[test]
    fn a_records_size_is_its_key_value_and_headers() {
        // 1 (key) + 5 (value) + 1 + 1 (h: v) + 1 (n, no value).
        assert_eq!(polled(0, 0).bytes(), 9);
    }
}

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
//! The loop runs on one thread: records are polled into a batch (up to `batch_max_records`, or
//! `batch_linger` after the first), then produced and committed; a rebalance, which librdkafka
//! reports only inside a poll, drops the batch being gathered and rewinds to the committed
//! offsets, so no transaction ever spans one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use dedupe::config::{Assignment, Config, InputPartitioner};
use dedupe::identity::{message_id, RecordView};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::actors::coordinator::exit;
use crate::actors::events::rekey::{RekeyAborted, RekeyBatch, RekeyRewound};
use crate::signals::unless_stopped;

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

/// How long a transaction call may take before the stage gives up on it (and exits, to be
/// restarted from the committed offsets).
const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(30);

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

/// A record polled from the source, owned until its batch is produced.
struct Polled {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp_ms: Option<i64>,
}

/// Runs the stage until a signal (exit 0), a fenced producer (exit 3) or an error.
pub fn run(config: &Config, options: &RekeyOptions, stop: &AtomicBool) -> anyhow::Result<i32> {
    let w = &config.worker;
    if options.source_topic == w.input_topic {
        bail!(
            "the source topic and the input topic are both {}: rekey copies one into the other",
            w.input_topic
        );
    }
    let timeout = Duration::from_secs(30);
    let counted = {
        let (kafka, source, input) = (
            config.kafka.clone(),
            options.source_topic.clone(),
            w.input_topic.clone(),
        );
        unless_stopped(stop, "rekey-topics", move || {
            let source = dedupe::kafka::partition_count(&kafka, &source, timeout)?;
            let input = dedupe::kafka::partition_count(&kafka, &input, timeout)?;
            Ok::<_, anyhow::Error>((source, input))
        })
        .context("starting the thread that checks the topics")?
    };
    let Some(counted) = counted else {
        return Ok(stopped_while_starting("checking the topics"));
    };
    let (source_partitions, input_partitions) = counted?;
    let source_partitions = source_partitions
        .with_context(|| format!("the source topic {} does not exist", options.source_topic))?;
    input_partitions
        .with_context(|| format!("the input topic {} does not exist", w.input_topic))?;
    let group = options
        .group_id
        .clone()
        .unwrap_or_else(|| format!("dedupe-rekey.{}", w.input_topic));
    let rebalanced = Arc::new(AtomicBool::new(false));
    let (consumer, member) = consumer(config, options, &group, source_partitions, &rebalanced)?;
    let producer = producer(config, &format!("dedupe-rekey.{}.{member}", w.input_topic))?;
    if stop.load(Ordering::Relaxed) {
        return Ok(stopped_while_starting(
            "joining the source's consumer group",
        ));
    }
    // Not abandoned on a stop: it fences the previous instance and waits for its transaction to
    // end, at most its timeout; the stop is taken right after.
    producer
        .init_transactions(TRANSACTION_CALL_TIMEOUT)
        .context("initializing the rekey producer's transactions")?;
    if stop.load(Ordering::Relaxed) {
        return Ok(stopped_while_starting("initializing its transactions"));
    }
    tracing::info!(source = %options.source_topic, input = %w.input_topic, group = %group, id_source = %w.id_source, "Re-keying the source topic into the input topic by message id.");
    let mut stage = Stage {
        config,
        options,
        consumer,
        producer,
        rebalanced,
    };
    while !stop.load(Ordering::Relaxed) {
        let batch = stage.gather(stop);
        if batch.is_empty() {
            continue;
        }
        match stage.copy(&batch) {
            Ok(()) => {}
            Err(e) if is_fenced(&e) => {
                tracing::error!(error = %e, "The rekey producer was fenced: another instance took its place; exiting.");
                return Ok(exit::FENCED);
            }
            Err(e) => {
                RekeyAborted { error: &e }.emit();
                if let Err(abort) = stage.producer.abort_transaction(TRANSACTION_CALL_TIMEOUT) {
                    bail!("aborting a failed rekey transaction ({e}): {abort}");
                }
                stage.rewind();
            }
        }
    }
    tracing::info!("Received a stop signal; the last batch is committed. Exiting.");
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

fn is_fenced(e: &KafkaError) -> bool {
    matches!(e, KafkaError::Transaction(t) if t.is_fatal())
}

/// The source consumer, subscribed (group mode) or assigned the owned partitions (static mode),
/// and the name this instance's transactional id ends with.
fn consumer(
    config: &Config,
    options: &RekeyOptions,
    group: &str,
    source_partitions: usize,
    rebalanced: &Arc<AtomicBool>,
) -> anyhow::Result<(SourceConsumer, String)> {
    let w = &config.worker;
    let consumer: SourceConsumer = crate::actors::membership::exactly_once_reader(config, group)
        .create_with_context(RebalanceFlag(Arc::clone(rebalanced)))
        .context("creating the rekey consumer")?;
    if w.assignment == Assignment::Group {
        consumer
            .subscribe(&[&options.source_topic])
            .context("joining the rekey consumer group")?;
        let member = w.member_id().unwrap_or_else(|| "rekey".into());
        return Ok((consumer, member));
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
    let mut tpl = TopicPartitionList::new();
    for &p in &owned {
        tpl.add_partition_offset(&options.source_topic, p, Offset::Stored)?;
    }
    consumer
        .assign(&tpl)
        .context("assigning the source partitions")?;
    let member = format!("p{}", dedupe::config::PartitionSet(owned));
    Ok((consumer, member))
}

/// The transactional producer of the input topic, partitioning as the input's producers do.
fn producer(
    config: &Config,
    transactional_id: &str,
) -> anyhow::Result<ThreadedProducer<DefaultProducerContext>> {
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
        .set(
            "transaction.timeout.ms",
            config.worker.transaction_timeout_ms.to_string(),
        )
        .create()
        .context("creating the rekey producer")
}

struct Stage<'a> {
    config: &'a Config,
    options: &'a RekeyOptions,
    consumer: SourceConsumer,
    producer: ThreadedProducer<DefaultProducerContext>,
    rebalanced: Arc<AtomicBool>,
}

impl Stage<'_> {
    /// Polls up to a batch of records; a rebalance drops what it gathered and rewinds.
    fn gather(&mut self, stop: &AtomicBool) -> Vec<Polled> {
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
                // What was read before the rebalance, this record included, is read again from
                // the committed offsets.
                drop(polled);
                batch.clear();
                deadline = None;
                self.rewind();
                continue;
            }
            match polled {
                Some(Ok(m)) => {
                    deadline.get_or_insert_with(|| Instant::now() + self.options.batch_linger);
                    batch.push(Polled {
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
                    });
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "Reading the source topic failed; retrying.");
                }
                None if deadline.is_none() => break,
                None => {}
            }
        }
        batch
    }

    /// Produces the batch keyed by id, with the source offsets after it, in one transaction.
    fn copy(&mut self, batch: &[Polled]) -> Result<(), KafkaError> {
        let input = &self.config.worker.input_topic;
        self.producer.begin_transaction()?;
        let mut unkeyed = 0u64;
        for r in batch {
            let view = RecordView {
                key: r.key.as_deref(),
                header: |name: &str| {
                    r.headers
                        .iter()
                        .find(|(k, _)| k == name)
                        .and_then(|(_, v)| v.as_deref())
                },
                value: r.value.as_deref(),
            };
            let id = message_id(&view, &self.config.worker.id_source).ok();
            if id.is_none() {
                unkeyed += 1;
            }
            let key = id.as_deref().or(r.key.as_deref());
            let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
            for (name, value) in &r.headers {
                headers = headers.insert(Header {
                    key: name,
                    value: value.as_deref(),
                });
            }
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(input).headers(headers);
            if let Some(key) = key {
                record = record.key(key);
            }
            if let Some(value) = r.value.as_deref() {
                record = record.payload(value);
            }
            if let Some(t) = r.timestamp_ms {
                record = record.timestamp(t);
            }
            self.send(record)?;
        }
        let mut next: std::collections::BTreeMap<i32, i64> = std::collections::BTreeMap::new();
        for r in batch {
            next.insert(r.partition, r.offset + 1);
        }
        let mut offsets = TopicPartitionList::new();
        for (p, o) in next {
            offsets.add_partition_offset(&self.options.source_topic, p, Offset::Offset(o))?;
        }
        let metadata = self
            .consumer
            .group_metadata()
            .ok_or(KafkaError::ConsumerCommit(
                rdkafka::types::RDKafkaErrorCode::State,
            ))?;
        self.producer
            .send_offsets_to_transaction(&offsets, &metadata, TRANSACTION_CALL_TIMEOUT)?;
        self.producer.commit_transaction(TRANSACTION_CALL_TIMEOUT)?;
        RekeyBatch {
            records: batch.len() as u64,
            unkeyed,
        }
        .emit();
        Ok(())
    }

    /// Enqueues one record, waiting while the producer's queue is full.
    fn send<'r>(&self, mut record: BaseRecord<'r, [u8], [u8]>) -> Result<(), KafkaError> {
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((
                    KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    r,
                )) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Seeks every assigned source partition back to its committed offset (its beginning when it
    /// has none): what a dropped batch or an aborted transaction had read is read again.
    fn rewind(&self) {
        let assignment = match self.consumer.assignment() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "Could not read the rekey consumer's assignment to rewind it.");
                return;
            }
        };
        let committed = match self
            .consumer
            .committed_offsets(assignment, Duration::from_secs(10))
        {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "Could not read the committed source offsets to rewind to.");
                return;
            }
        };
        let mut partitions = 0;
        for e in committed.elements() {
            let to = match e.offset() {
                Offset::Offset(o) => Offset::Offset(o),
                _ => Offset::Beginning,
            };
            // A partition assigned a moment ago has not started fetching and cannot be sought;
            // it starts at its committed offset anyway.
            if self
                .consumer
                .seek(e.topic(), e.partition(), to, Duration::from_secs(10))
                .is_ok()
            {
                partitions += 1;
            }
        }
        RekeyRewound { partitions }.emit();
    }
}

//! The rekey stage's start (`super`): the topics checked, the source partitions this instance
//! owns, and its clients made in the order KIP-447 asks. The producer's `init_transactions`
//! fences an older instance with the same transactional id and waits for its open transaction
//! to end; only then is the consumer made, which reads the committed offsets as soon as it has
//! partitions, so they can no longer move under it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use dedupe::config::{Assignment, Config, InputPartitioner};
use rdkafka::consumer::Consumer;
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

use super::clients::{Deliveries, InputProducer, RebalanceFlag, SourceConsumer};
use super::{RekeyOptions, Stage, TRANSACTION_CALL_TIMEOUT};
use crate::signals::{stopped_while_starting, unless_stopped};

/// How long reading the topics' metadata and settings may take at start.
const METADATA_TIMEOUT: Duration = Duration::from_secs(30);

/// librdkafka's default `message.max.bytes`, the largest record its producer sends.
const LIBRDKAFKA_MESSAGE_MAX_BYTES: usize = 1_000_000;

/// A record batch's own framing (Kafka's v2 batch header): what a topic's `max.message.bytes`
/// counts beside the records.
const RECORD_BATCH_OVERHEAD_BYTES: usize = 61;

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

/// Checks the topics, then makes the stage's clients, fencing first: the stage ready to copy, or
/// None when a stop came while it started (logged).
pub(super) fn start<'a>(
    config: &'a Config,
    options: &'a RekeyOptions,
    stop: &AtomicBool,
) -> anyhow::Result<Option<Stage<'a>>> {
    let w = &config.worker;
    let brokers = &config.kafka.brokers;
    let Some(source_partitions) = check_topics(config, options, stop)? else {
        return Ok(None);
    };
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
        stopped_while_starting("making its producer", "copying");
        return Ok(None);
    }
    // Not abandoned on a stop: it fences the previous instance and waits for its transaction to
    // end, at most its timeout; the stop is taken right after.
    producer
        .init_transactions(TRANSACTION_CALL_TIMEOUT)
        .with_context(|| {
            format!("initializing the rekey producer's transactions ({transactional_id}) with the brokers {brokers}")
        })?;
    if stop.load(Ordering::Relaxed) {
        stopped_while_starting("initializing its transactions", "copying");
        return Ok(None);
    }
    let rebalanced = Arc::new(AtomicBool::new(false));
    let consumer = consumer(config, options, &group, &owned, &rebalanced)?;
    tracing::info!(source = %options.source_topic, input = %w.input_topic, group = %group, transactional_id = %transactional_id, id_source = %w.id_source, limit_bytes, "Re-keying the source topic into the input topic by message id.");
    Ok(Some(Stage {
        config,
        options,
        consumer,
        producer,
        rebalanced,
        limit_bytes,
        gathered_under: None,
    }))
}

/// Checks that the source, input and dead-letter topics differ and exist: the source topic's
/// partition count, or None when a stop came first (logged).
fn check_topics(
    config: &Config,
    options: &RekeyOptions,
    stop: &AtomicBool,
) -> anyhow::Result<Option<usize>> {
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
        stopped_while_starting("checking the topics", "copying");
        return Ok(None);
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
    Ok(Some(source_partitions))
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

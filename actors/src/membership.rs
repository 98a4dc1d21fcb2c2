//! The worker's input consumer and how it learns which partitions it owns.
//!
//! - `static`: the coordinator assigns the configured partitions itself, once each is recovered.
//! - `group`: the consumer subscribes to the input topic in the consumer group
//!   (`group.protocol = "consumer"`, KIP-848: the broker's group coordinator assigns partitions,
//!   incrementally); a static member (`group.instance.id`) when `worker.member_id` is set, else a
//!   dynamic one, which leaves the group as it closes. The rebalance callback runs on
//!   the poller thread of this module and hands each change to the [`Coordinator`]:
//!   - **assigned**: before librdkafka assigns a partition its queue is split off (so no record of
//!     it can reach the main queue), and right after, the partition is paused. It is resumed once
//!     the coordinator has fenced the previous owner and loaded the partition's ids.
//!   - **revoked** (or lost): the callback waits, up to `worker.shutdown_timeout_ms`, until the
//!     coordinator has finished or abandoned each revoked partition's batch in flight, stopped its
//!     pipeline and released its producer. Only then does the rebalance complete.
//!
//! The poller thread is the only caller of the main queue, so the callback may block there
//! without stalling any actor.
//!
//! [`Coordinator`]: crate::coordinator::Coordinator

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use actix::prelude::*;
use dedupe::config::{Assignment, Config};
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientContext, TopicPartitionList};
use tokio::sync::watch;

use crate::events::group::{
    AssignedNotPaused, CoordinatorGone, InputCloseSlow, InputCloseThreadNotStarted, InputClosed,
    InputConsumerError, InputPollerNotStarted, QueueNotSplit, RebalanceError, RecordOnMainQueue,
    RevokeTimedOut,
};

/// The input consumer.
pub type Input = StreamConsumer<GroupContext>;
/// One input partition's queue, split from the input consumer.
pub type Queue = StreamPartitionQueue<GroupContext>;

/// Partitions the group assigned, each with its queue (split before the assignment took effect,
/// and paused until [`resume`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Assigned {
    pub partitions: Vec<(i32, Queue)>,
}

/// Partitions the group takes away. `done` is answered (or dropped) once every one of them is
/// stopped and its producer released; the rebalance waits for it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Revoking {
    pub partitions: Vec<i32>,
    /// The group gave them away without this worker's consent (its membership expired).
    pub lost: bool,
    pub done: std::sync::mpsc::Sender<()>,
}

/// The input consumer failed in a way that needs a new consumer (e.g. another live member holds
/// this worker's `group.instance.id`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ConsumerFailed {
    pub error: KafkaError,
    /// The client's fatal error: its code and reason.
    pub fatal: String,
}

/// Why the input consumer could not start or do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("creating the input consumer: {source}")]
    Create { source: KafkaError },
    #[error("joining consumer group {group} on {topic}: {source}")]
    Join {
        group: String,
        topic: String,
        source: Box<KafkaError>,
    },
    #[error("starting the input poller thread: {source}")]
    Poller { source: std::io::Error },
    #[error("resuming input partition {partition}: {source}")]
    Resume { partition: i32, source: KafkaError },
    #[error("rewinding input partition {partition} to offset {offset:?}: {source}")]
    Seek {
        partition: i32,
        offset: Option<i64>,
        source: KafkaError,
    },
}

/// The consumer's context: the rebalance callback.
pub struct GroupContext {
    topic: String,
    consumer: OnceLock<Weak<Input>>,
    assigned: Recipient<Assigned>,
    revoking: Recipient<Revoking>,
    /// The worker is closing the consumer: revocations need no waiting (nothing is running).
    closing: AtomicBool,
    revoke_timeout: Duration,
    /// Queues split in `pre_rebalance`, handed over in `post_rebalance`.
    split: Mutex<HashMap<i32, Queue>>,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let Some(consumer) = self.consumer.get().and_then(Weak::upgrade) else {
                    return;
                };
                let mut split = self.split.lock().unwrap_or_else(|e| e.into_inner());
                for p in partitions_of(tpl, &self.topic) {
                    match consumer.split_partition_queue(&self.topic, p) {
                        Some(q) => {
                            split.insert(p, q);
                        }
                        None => QueueNotSplit { partition: p }.emit(),
                    }
                }
            }
            Rebalance::Revoke(tpl) => {
                let partitions = partitions_of(tpl, &self.topic);
                if partitions.is_empty() || self.closing.load(Ordering::Relaxed) {
                    return;
                }
                let lost = base.assignment_lost();
                let (done, wait) = std::sync::mpsc::channel();
                if self
                    .revoking
                    .try_send(Revoking {
                        partitions: partitions.clone(),
                        lost,
                        done,
                    })
                    .is_err()
                {
                    return;
                }
                // Wait for the partitions to stop; give up when the worker closes the consumer
                // (nothing runs any more) or after the shutdown timeout.
                let deadline = std::time::Instant::now() + self.revoke_timeout;
                loop {
                    match wait.recv_timeout(Duration::from_millis(100)) {
                        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    }
                    if self.closing.load(Ordering::Relaxed) {
                        break;
                    }
                    if std::time::Instant::now() > deadline {
                        RevokeTimedOut {
                            partitions: &partitions,
                        }
                        .emit();
                        break;
                    }
                }
            }
            Rebalance::Error(e) => RebalanceError { error: e }.emit(),
        }
    }

    fn post_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Assign(tpl) = rebalance else {
            return;
        };
        let partitions = partitions_of(tpl, &self.topic);
        if partitions.is_empty() {
            return;
        }
        // Nothing is fetched for them until the coordinator resumes them, after the handover.
        if let Err(e) = base.pause(tpl) {
            AssignedNotPaused { error: &e }.emit();
        }
        let mut split = self.split.lock().unwrap_or_else(|e| e.into_inner());
        let queues: Vec<(i32, Queue)> = partitions
            .iter()
            .filter_map(|p| split.remove(p).map(|q| (*p, q)))
            .collect();
        drop(split);
        if self
            .assigned
            .try_send(Assigned { partitions: queues })
            .is_err()
        {
            CoordinatorGone.emit();
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList, topic: &str) -> Vec<i32> {
    tpl.elements()
        .iter()
        .filter(|e| e.topic() == topic)
        .map(|e| e.partition())
        .collect()
}

/// The settings of a consumer whose offsets are committed only with the output of what it read
/// (in the producer's transaction): no automatic commits or offset stores, committed input only,
/// from the beginning when the group has no offset; in group mode, the broker's group protocol
/// (KIP-848). The worker's input and the rekey stage's source are read this way.
pub fn exactly_once_reader(config: &Config, group: &str) -> rdkafka::ClientConfig {
    let mut client = dedupe::kafka::client_config(&config.kafka);
    client
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "10");
    if config.worker.assignment == Assignment::Group {
        client.set("group.protocol", "consumer");
    }
    client
}

/// The input consumer and the thread that polls its main queue.
pub struct Membership {
    pub consumer: Arc<Input>,
    stop: watch::Sender<bool>,
    poller: Option<std::thread::JoinHandle<()>>,
}

impl Membership {
    /// Creates the input consumer; in `group` mode it subscribes (joining the group).
    pub fn start(
        config: &Config,
        assigned: Recipient<Assigned>,
        revoking: Recipient<Revoking>,
        failed: Recipient<ConsumerFailed>,
    ) -> Result<Membership, MembershipError> {
        let w = &config.worker;
        let mut client = exactly_once_reader(config, &w.group_id());
        client.set("queued.max.messages.kbytes", "32768");
        if w.assignment == Assignment::Group {
            if let Some(id) = w.static_member_id() {
                client.set("group.instance.id", id);
            }
        }
        let context = GroupContext {
            topic: w.input_topic.clone(),
            consumer: OnceLock::new(),
            assigned,
            revoking,
            closing: AtomicBool::new(false),
            revoke_timeout: Duration::from_millis(w.shutdown_timeout_ms),
            split: Mutex::new(HashMap::new()),
        };
        let consumer: Input = client
            .create_with_context(context)
            .map_err(|source| MembershipError::Create { source })?;
        let consumer = Arc::new(consumer);
        let _ = consumer.context().consumer.set(Arc::downgrade(&consumer));
        if w.assignment == Assignment::Group {
            consumer
                .subscribe(&[&w.input_topic])
                .map_err(|source| MembershipError::Join {
                    group: w.group_id(),
                    topic: w.input_topic.clone(),
                    source: Box::new(source),
                })?;
        }
        let (stop, stop_rx) = watch::channel(false);
        let poller = {
            let consumer = consumer.clone();
            std::thread::Builder::new()
                .name("input-poller".into())
                .spawn(move || poll_main_queue(consumer, stop_rx, failed))
                .map_err(|source| MembershipError::Poller { source })?
        };
        Ok(Membership {
            consumer,
            stop,
            poller: Some(poller),
        })
    }

    /// Lets a loaded partition's records flow (group mode; static mode assigns instead).
    pub fn resume(&self, topic: &str, partition: i32) -> Result<(), MembershipError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, partition);
        self.consumer
            .resume(&tpl)
            .map_err(|source| MembershipError::Resume { partition, source })
    }

    /// Starts a partition's fetches at once after [`Membership::resume`] by seeking it to `offset`,
    /// where its input resumes anyway (the group's committed offset, read again after the fence).
    /// librdkafka resumes a partition on its main thread without waking the broker's thread, which
    /// waits up to a second for its next fetch when it has nothing else to fetch; a seek ends in a
    /// change of the partition's fetch state, which wakes it. A failed seek only costs that wait.
    pub fn wake_fetcher(&self, topic: &str, partition: i32, offset: i64) {
        let seek = self.consumer.seek(
            topic,
            partition,
            rdkafka::Offset::Offset(offset),
            Duration::from_secs(10),
        );
        if let Err(e) = seek {
            tracing::debug!(partition, offset, error = %e, "Could not seek a resumed partition; its first fetch may wait up to a second.");
        }
    }

    /// Stops fetching a partition whose pipeline failed, until it is taken over again.
    pub fn pause(&self, topic: &str, partition: i32) -> Result<(), MembershipError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, partition);
        self.consumer
            .pause(&tpl)
            .map_err(|source| MembershipError::Resume { partition, source })
    }

    /// Rewinds a partition taken over again to `offset` (its beginning when `None`): what its
    /// failed pipeline had fetched past the last committed batch is dropped and fetched again.
    pub fn rewind(
        &self,
        topic: &str,
        partition: i32,
        offset: Option<i64>,
    ) -> Result<(), MembershipError> {
        let to = offset.map_or(rdkafka::Offset::Beginning, rdkafka::Offset::Offset);
        self.consumer
            .seek(topic, partition, to, Duration::from_secs(10))
            .map_err(|source| MembershipError::Seek {
                partition,
                offset,
                source,
            })
    }

    /// Stops polling and closes the consumer: its partitions are revoked (each one's batch in
    /// flight committed or abandoned first), then it leaves the group. A dynamic member's
    /// partitions go to the other members at once; a static member keeps them for the session
    /// timeout, so that a quick restart gets them back.
    ///
    /// librdkafka's consumer close blocks until the group coordinator answers, which it cannot
    /// while the brokers are down: it runs on a thread of its own, and the caller (the
    /// coordinator, restarting a failed pipeline) waits for it at most [`CLOSE_WAIT`].
    pub fn close(mut self) {
        self.consumer
            .context()
            .closing
            .store(true, Ordering::Relaxed);
        let _ = self.stop.send(true);
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
        let consumer = Arc::clone(&self.consumer);
        drop(self);
        close_consumer(consumer, CLOSE_WAIT);
    }
}

/// How long closing the input consumer may hold up its caller.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Drops `consumer` (librdkafka's blocking close, when this is its last reference) on a thread of
/// its own, waiting for it up to `wait`.
fn close_consumer(consumer: Arc<Input>, wait: Duration) {
    let (done, closed) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("input-close".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            drop(consumer);
            let _ = done.send(());
            if started.elapsed() > wait {
                InputClosed {
                    seconds: started.elapsed().as_secs(),
                }
                .emit();
            }
        });
    match spawned {
        Ok(_) => {
            if closed.recv_timeout(wait).is_err() {
                InputCloseSlow {
                    wait_secs: wait.as_secs(),
                }
                .emit();
            }
        }
        Err(e) => InputCloseThreadNotStarted { error: &e }.emit(),
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.consumer
            .context()
            .closing
            .store(true, Ordering::Relaxed);
        let _ = self.stop.send(true);
    }
}

/// Polls the main queue: it serves the rebalance callback, errors and events. Every owned
/// partition's records go to its own split queue.
fn poll_main_queue(
    consumer: Arc<Input>,
    mut stop: watch::Receiver<bool>,
    failed: Recipient<ConsumerFailed>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            InputPollerNotStarted { error: &e }.emit();
            return;
        }
    };
    let polled = consumer.clone();
    runtime.block_on(async move {
        let consumer = polled;
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                got = consumer.recv() => match got {
                    Ok(_) => RecordOnMainQueue.emit(),
                    Err(e) => {
                        if let Some((code, reason)) = consumer.client().fatal_error() {
                            // The coordinator reports it (`InputConsumerFailed`), with this cause.
                            failed.do_send(ConsumerFailed {
                                error: e,
                                fatal: format!("{code:?}: {reason}"),
                            });
                            break;
                        }
                        InputConsumerError { error: &e }.emit();
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                },
            }
        }
    });
    // Closing happens where the last reference is dropped; mark it so a revocation during the
    // close does not wait for a coordinator that may be gone.
    consumer.context().closing.store(true, Ordering::Relaxed);
}

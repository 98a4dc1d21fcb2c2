//! `PartitionConsumer` owns one input partition's queue (split from the worker's consumer). It
//! never hands a batch on before the previous one is recorded: per batch it looks the ids up in
//! the ledger, publishes the new records (and their ids, to the id changelog) with the next input
//! offset in one output transaction, then records the ids with the partition's progress. Order
//! within the partition is kept, and at most one batch per partition is in flight.
//!
//! Why this order (look up → publish → record): the output topic is the source of truth. If the
//! process dies after the publish and before the record, the ledger lacks ids the output has, and
//! recovery replays them from the output tail named by the progress record. If it dies before the
//! commit, the transaction is aborted when the next producer fences this one, the input offset
//! was not committed, and the batch is read again. Recording before publishing would instead
//! leave ids in the ledger whose messages never reached the output: silent loss.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use dedupe::batch::{self, Candidate, Fate};
use dedupe::config::{IdSource, UnkeyedPolicy};
use dedupe::identity::LedgerKey;
use dedupe::ledger::LedgerError;
use dedupe::identity::{message_key, RecordView, Unkeyed};
use dedupe::metrics as m;
use dedupe::output::{OutRecord, PublishError};
use dedupe::progress::Progress;
use dedupe::recovery::now_ms;
use dedupe::retry::Backoff;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use tokio::sync::watch;
use tracing::Instrument;

use crate::actors::ledger::{CheckAndRecord, LedgerActor, Lookup};
use crate::actors::producer::{Publish, Publisher};

/// How often, and after how long, a batch whose output transaction was aborted is sent again
/// (nothing of an aborted transaction is visible): 0.2, 0.4, 0.8, 1.6 and 3.2 s.
const ABORTED_BATCH_RETRIES_ALLOWED: u32 = 5;
const ABORTED_BATCH_RETRIES: Backoff =
    Backoff::new(Duration::from_millis(200), Duration::from_millis(3200), ABORTED_BATCH_RETRIES_ALLOWED);

/// How long a partition's reader waits for a wakeup before it looks at its queue itself.
const LOST_WAKEUP_CHECK: Duration = Duration::from_secs(1);

/// Settings every partition pipeline shares.
#[derive(Debug, Clone)]
pub struct PipelineSettings {
    pub id_source: IdSource,
    pub unkeyed_policy: UnkeyedPolicy,
    pub batch_max_records: usize,
    pub batch_max_bytes: usize,
    pub batch_linger: Duration,
    /// Bench baseline only: copy every record with the same consumer, producer and transactions,
    /// without the ledger.
    pub passthrough: bool,
}

/// Why a partition pipeline ended.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("partition {partition}: {source}")]
    Publish { partition: i32, source: PublishError },
    #[error("partition {partition}: the ledger failed: {source}")]
    Ledger { partition: i32, source: LedgerError },
    #[error("partition {partition}: an actor is gone: {source}")]
    Mailbox { partition: i32, source: MailboxError },
}

impl PipelineError {
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Publish { source, .. } if source.is_fenced())
    }

    /// Whether restarting the pipeline in process may help (transient trouble: the ledger's own
    /// retry hint, an actor gone because the pipeline is being torn down), as opposed to a state
    /// that a restart repeats (a corrupt ledger, a fenced producer).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Publish { source, .. } => !source.is_fenced(),
            Self::Ledger { source, .. } => source.is_retryable(),
            Self::Mailbox { .. } => true,
        }
    }
}

/// Told to the coordinator when a partition pipeline ends.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PartitionStopped {
    pub partition: i32,
    /// The take-over that started the pipeline: a pipeline told to stop may end after a restart
    /// took its partition over again, and its end is then not the new owner's.
    pub epoch: u64,
    pub result: Result<(), PipelineError>,
}

use crate::actors::membership::Queue;

pub struct PartitionConsumer {
    pub partition: i32,
    /// The coordinator's take-over epoch of this pipeline, echoed in [`PartitionStopped`].
    pub epoch: u64,
    pub queue: Option<Queue>,
    pub ledger: Addr<LedgerActor>,
    pub publisher: Addr<Publisher>,
    pub settings: Arc<PipelineSettings>,
    pub progress: Progress,
    pub stop: watch::Receiver<bool>,
    pub report_to: Recipient<PartitionStopped>,
}

impl Actor for PartitionConsumer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let Some(queue) = self.queue.take() else {
            ctx.stop();
            return;
        };
        let pipeline = Pipeline {
            partition: self.partition,
            ledger: self.ledger.clone(),
            publisher: self.publisher.clone(),
            settings: self.settings.clone(),
            next_output_offset: self.progress.next_output_offset,
            next_changelog_offset: self.progress.next_changelog_offset,
            unkeyed_warned_at: None,
        };
        let stop = self.stop.clone();
        let fut = async move { pipeline.run(queue, stop).await };
        ctx.spawn(fut.into_actor(self).map(|result, act, ctx| {
            act.report_to.do_send(PartitionStopped { partition: act.partition, epoch: act.epoch, result });
            ctx.stop();
        }));
    }
}

/// The end of a pipeline told to stop. With the `failpoints` feature, `worker-stopped-late`
/// (`return(MS)`) holds the end back MS milliseconds, so that a test can make it arrive after
/// a restart took the partition over again.
async fn stopped() -> Result<(), PipelineError> {
    #[cfg(feature = "failpoints")]
    if let Some(Some(ms)) = fail::eval("worker-stopped-late", |v| v.and_then(|v| v.parse::<u64>().ok())) {
        eprintln!("failpoint worker-stopped-late: the end of a stopped pipeline waits {ms} ms");
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    Ok(())
}

struct Pipeline {
    partition: i32,
    ledger: Addr<LedgerActor>,
    publisher: Addr<Publisher>,
    settings: Arc<PipelineSettings>,
    next_output_offset: i64,
    next_changelog_offset: i64,
    unkeyed_warned_at: Option<Instant>,
}

/// One input record, copied out of the consumer's buffer, with its id (or why it has none).
struct InRecord {
    offset: i64,
    id: Result<LedgerKey, Unkeyed>,
    out: OutRecord,
}

impl Pipeline {
    async fn run(mut self, queue: Queue, mut stop: watch::Receiver<bool>) -> Result<(), PipelineError> {
        loop {
            if *stop.borrow() {
                return stopped().await;
            }
            let batch = tokio::select! {
                batch = self.collect(&queue) => batch,
                _ = stop.changed() => return stopped().await,
            };
            if batch.is_empty() {
                continue;
            }
            let first = batch[0].offset;
            let last = batch[batch.len() - 1].offset;
            let span = tracing::info_span!("batch", partition = self.partition, first_offset = first, last_offset = last);
            if self.settings.passthrough {
                self.copy_through(batch).instrument(span).await?;
            } else {
                self.process(batch).instrument(span).await?;
            }
        }
    }

    /// Waits for the first record, then gathers more until the batch is full or the linger ends.
    async fn collect(&self, queue: &Queue) -> Vec<InRecord> {
        let s = &self.settings;
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        let mut deadline = None;
        while batch.len() < s.batch_max_records && bytes < s.batch_max_bytes {
            let next = match deadline {
                None => Ok(self.next_record(queue).await),
                Some(d) => tokio::time::timeout_at(d, queue.recv()).await,
            };
            match next {
                Err(_) => break,
                Ok(Ok(msg)) => {
                    bytes += msg.key_len() + msg.payload_len();
                    batch.push(self.copy(&msg));
                    if deadline.is_none() {
                        deadline = Some(tokio::time::Instant::now() + s.batch_linger);
                    }
                }
                Ok(Err(e)) => {
                    crate::actors::events::InputReadFailed { partition: self.partition, error: &e }.emit();
                    if batch.is_empty() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    break;
                }
            }
        }
        batch
    }

    /// Waits for the partition's next record, looking at its queue at least every
    /// [`LOST_WAKEUP_CHECK`]. rdkafka wakes a waiting split-queue reader only when the queue turns
    /// from empty to non-empty, and that edge can be missed (rust-rdkafka issue 665, pull request
    /// 840 for split queues): events the library consumes itself can leave records queued with
    /// no wakeup to come. Seen here after broker restarts: one partition stopped for good, with
    /// no error, while the others went on.
    async fn next_record<'q>(&self, queue: &'q Queue) -> rdkafka::error::KafkaResult<BorrowedMessage<'q>> {
        loop {
            if let Ok(next) = tokio::time::timeout(LOST_WAKEUP_CHECK, queue.recv()).await {
                return next;
            }
            // A fresh receive looks at the queue before it waits: anything there now had been
            // queued without waking the reader.
            if let Ok(next) = tokio::time::timeout(Duration::ZERO, queue.recv()).await {
                metrics::counter!(m::INPUT_WAKEUPS_RECOVERED, m::LABEL_PARTITION => self.partition.to_string()).increment(1);
                return next;
            }
        }
    }

    fn copy(&self, msg: &BorrowedMessage<'_>) -> InRecord {
        let headers = msg.headers();
        let view = RecordView {
            key: msg.key(),
            header: |name: &str| headers.and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value)),
            value: msg.payload(),
        };
        let id = message_key(&view, &self.settings.id_source);
        let out = OutRecord {
            key: msg.key().map(<[u8]>::to_vec),
            value: msg.payload().map(<[u8]>::to_vec),
            headers: headers
                .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec))).collect())
                .unwrap_or_default(),
            timestamp_ms: msg.timestamp().to_millis(),
        };
        InRecord { offset: msg.offset(), id, out }
    }

    /// The bench's baseline (`--passthrough`): every record copied in the same transactions,
    /// without the ledger.
    async fn copy_through(&mut self, batch: Vec<InRecord>) -> Result<(), PipelineError> {
        let label = self.partition.to_string();
        let next_input_offset = batch[batch.len() - 1].offset + 1;
        metrics::counter!(m::RECORDS_IN, m::LABEL_PARTITION => label.clone()).increment(batch.len() as u64);
        let records: Vec<OutRecord> = batch.into_iter().map(|r| r.out).collect();
        let out_count = records.len() as u64;
        self.publish(records, Vec::new(), Vec::new(), next_input_offset).await?;
        metrics::counter!(m::RECORDS_OUT, m::LABEL_PARTITION => label).increment(out_count);
        Ok(())
    }

    async fn process(&mut self, batch: Vec<InRecord>) -> Result<(), PipelineError> {
        let p = self.partition;
        let label = p.to_string();
        let n = batch.len();
        let next_input_offset = batch[n - 1].offset + 1;
        metrics::counter!(m::RECORDS_IN, m::LABEL_PARTITION => label.clone()).increment(n as u64);
        metrics::histogram!(m::BATCH_RECORDS, m::LABEL_PARTITION => label.clone()).record(n as f64);

        // 1. Look the ids up.
        let t = Instant::now();
        let keys: Vec<LedgerKey> = batch.iter().filter_map(|r| r.id.ok()).collect();
        let found = if keys.is_empty() {
            Vec::new()
        } else {
            self.ledger
                .send(Lookup { keys })
                .await
                .map_err(|source| PipelineError::Mailbox { partition: p, source })?
                .map_err(|source| PipelineError::Ledger { partition: p, source })?
        };
        metrics::histogram!(m::STAGE_SECONDS, "stage" => "lookup").record(t.elapsed().as_secs_f64());

        // 2. Decide, in input order: new ids are published once, repeats are dropped.
        let candidates: Vec<Candidate> =
            batch.iter().map(|r| Candidate { id: r.id, timestamp_ms: r.out.timestamp_ms }).collect();
        let decision = batch::decide(&candidates, &found, self.settings.unkeyed_policy, now_ms());
        let mut records = Vec::with_capacity(n);
        let mut dead_letters = Vec::new();
        for (r, fate) in batch.into_iter().zip(&decision.fates) {
            match *fate {
                Fate::Publish => records.push(r.out),
                Fate::Duplicate { age_ms } => metrics::histogram!(m::DUPLICATE_AGE_SECONDS).record(age_ms as f64 / 1000.0),
                Fate::Forward(reason) => {
                    self.unkeyed(reason, UnkeyedPolicy::Forward);
                    records.push(r.out);
                }
                Fate::DeadLetter(reason) => {
                    self.unkeyed(reason, UnkeyedPolicy::DeadLetter);
                    dead_letters.push(r.out);
                }
                Fate::Drop(reason) => self.unkeyed(reason, UnkeyedPolicy::Drop),
            }
        }
        let duplicates = decision.duplicates() as u64;
        if duplicates > 0 {
            metrics::counter!(m::DUPLICATES_DROPPED, m::LABEL_PARTITION => label.clone()).increment(duplicates);
        }
        let new_ids = decision.new_ids;
        let oldest_ts = decision.oldest_new_ms.unwrap_or(i64::MAX);

        // 3. Publish the new records and the input offset in one transaction.
        let t = Instant::now();
        let out_count = records.len() as u64;
        let committed = self.publish(records, dead_letters, new_ids.clone(), next_input_offset).await?;
        metrics::histogram!(m::STAGE_SECONDS, "stage" => "publish").record(t.elapsed().as_secs_f64());
        metrics::counter!(m::TRANSACTIONS, "outcome" => "committed").increment(1);
        metrics::counter!(m::RECORDS_OUT, m::LABEL_PARTITION => label.clone()).increment(out_count);
        if let Some(last) = committed.last_output_offset {
            self.next_output_offset = last + 1;
        }
        if let Some(at) = committed.changelog_offset {
            self.next_changelog_offset = at + 1;
            metrics::counter!(m::CHANGELOG_RECORDS, m::LABEL_PARTITION => label.clone()).increment(1);
        }
        if oldest_ts != i64::MAX {
            metrics::histogram!(m::END_TO_END_SECONDS, m::LABEL_PARTITION => label.clone())
                .record(((now_ms() - oldest_ts).max(0) as f64) / 1000.0);
        }
        fail::fail_point!("worker-after-publish", |_| {
            eprintln!("failpoint worker-after-publish: exiting");
            std::process::exit(86)
        });

        // 4. Record the ids with the progress that follows this batch.
        let t = Instant::now();
        let progress = Progress {
            next_input_offset,
            next_output_offset: self.next_output_offset,
            next_changelog_offset: self.next_changelog_offset,
        };
        self.ledger
            .send(CheckAndRecord { partition: p, items: new_ids, progress: Some(progress) })
            .await
            .map_err(|source| PipelineError::Mailbox { partition: p, source })?
            .map_err(|source| PipelineError::Ledger { partition: p, source })?;
        metrics::histogram!(m::STAGE_SECONDS, "stage" => "record").record(t.elapsed().as_secs_f64());
        fail::fail_point!("worker-after-record", |_| {
            eprintln!("failpoint worker-after-record: exiting");
            std::process::exit(86)
        });
        Ok(())
    }

    /// Publishes, retrying aborted transactions a few times (nothing of an aborted one is visible).
    async fn publish(
        &self,
        records: Vec<OutRecord>,
        dead_letters: Vec<OutRecord>,
        new_ids: Vec<(LedgerKey, i64)>,
        next_input_offset: i64,
    ) -> Result<dedupe::output::Committed, PipelineError> {
        let p = self.partition;
        let mut backoff = ABORTED_BATCH_RETRIES;
        loop {
            let result = self
                .publisher
                .send(Publish {
                    records: records.clone(),
                    dead_letters: dead_letters.clone(),
                    new_ids: new_ids.clone(),
                    next_input_offset,
                })
                .await
                .map_err(|source| PipelineError::Mailbox { partition: p, source })?;
            match result {
                Ok(c) => return Ok(c),
                Err(PublishError::Aborted { source }) if backoff.retries() < ABORTED_BATCH_RETRIES_ALLOWED => {
                    let delay = backoff.next_delay().unwrap_or_default();
                    metrics::counter!(m::TRANSACTIONS, "outcome" => "aborted").increment(1);
                    tracing::warn!(partition = p, attempt = backoff.retries(), error = %source, "The output transaction was aborted; retrying the batch.");
                    tokio::time::sleep(delay).await;
                }
                Err(source) => {
                    if source.is_fenced() {
                        metrics::counter!(m::TRANSACTIONS, "outcome" => "fenced").increment(1);
                    } else {
                        metrics::counter!(m::TRANSACTIONS, "outcome" => "aborted").increment(1);
                    }
                    return Err(PipelineError::Publish { partition: p, source });
                }
            }
        }
    }

    /// Counts a record without a usable id, and warns at most once a minute per partition.
    fn unkeyed(&mut self, reason: Unkeyed, policy: UnkeyedPolicy) {
        let policy_label = match policy {
            UnkeyedPolicy::Forward => "forward",
            UnkeyedPolicy::Drop => "drop",
            UnkeyedPolicy::DeadLetter => "dead-letter",
        };
        metrics::counter!(m::UNKEYED, m::LABEL_PARTITION => self.partition.to_string(), "reason" => reason.label(), "policy" => policy_label)
            .increment(1);
        if self.unkeyed_warned_at.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
            self.unkeyed_warned_at = Some(Instant::now());
            tracing::warn!(
                partition = self.partition,
                reason = reason.label(),
                policy = policy_label,
                "A record has no usable message id; applying the unkeyed policy (further ones are counted, and warned about once a minute)."
            );
        }
    }
}

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

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use actix::prelude::*;
use dedupe::audit::{self, Admission, DroppedCopy, Sampler};
use dedupe::batch::{self, Candidate, Fate, Rules, Seen, SourceMode, Verdict};
use dedupe::clock::now_ms;
use dedupe::config::{DigestSource, IdSource, ReusedIdPolicy, SourceModes, UnkeyedPolicy};
use dedupe::identity::{identify, ContentDigest, LedgerKey, RecordView, Unkeyed};
use dedupe::ledger::{Held, LedgerError, Mark};
use dedupe::output::{OutRecord, PublishError};
use dedupe::progress::Progress;
use dedupe::retry::Backoff;
use dedupe::wire::HEADER_DUPLICATE;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use crate::actors::events::partition::{source_header, PartitionMetrics, ReusedAction};
use crate::actors::events::{
    InputReadFailed, MisroutedIds, TransactionFailed, TransactionRetried, UnkeyedRecord,
};
use crate::actors::ledger::{LedgerActor, Looked};
use crate::actors::membership::Queue;
use crate::actors::producer::{Outgoing, Publisher};
use seams::{IdStore, Sink};

pub use forget::{ForgetId, ForgetReport, ForgetRequest};

mod forget;
mod seams;
#[cfg(test)]
mod tests;

/// How often, and after how long, a batch whose output transaction was aborted is sent again
/// (nothing of an aborted transaction is visible): 0.2, 0.4, 0.8, 1.6 and 3.2 s.
const ABORTED_BATCH_RETRIES_ALLOWED: u32 = 5;
const ABORTED_BATCH_RETRIES: Backoff = Backoff::new(
    Duration::from_millis(200),
    Duration::from_millis(3200),
    ABORTED_BATCH_RETRIES_ALLOWED,
);

/// How long a partition's reader waits for a wakeup before it looks at its queue itself.
const LOST_WAKEUP_CHECK: Duration = Duration::from_secs(1);

/// Settings every partition pipeline shares.
#[derive(Debug, Clone)]
pub struct PipelineSettings {
    pub id_source: IdSource,
    pub unkeyed_policy: UnkeyedPolicy,
    /// Where a record's content digest is read (`worker.content_digest`).
    pub content_digest: DigestSource,
    pub reused_id: ReusedIdPolicy,
    pub batch_max_records: usize,
    pub batch_max_bytes: usize,
    pub batch_linger: Duration,
    /// Bench baseline only: copy every record with the same consumer, producer and transactions,
    /// without the ledger. Built with the `tools` feature only.
    #[cfg(feature = "tools")]
    pub passthrough: bool,
    /// The input topic, named in audit records.
    pub input_topic: String,
    /// The duplicate audit, when on (`worker.audit_topic`).
    pub audit: Option<AuditSettings>,
    /// The sources counted apart in `dedupe_source_records_total`.
    pub sources: Vec<String>,
    /// The input topic's partitions, which tell where an id belongs (`dedupe_misrouted_ids_total`).
    pub input_partitions: i32,
    /// `worker.source_modes`, replaced when the configuration is reloaded (SIGHUP).
    pub source_modes: Arc<RwLock<SourceModes>>,
}

/// How dropped duplicates are audited (see `dedupe::audit`).
#[derive(Debug, Clone)]
pub struct AuditSettings {
    pub payloads: bool,
    pub sample: f64,
    pub max_per_sec: u32,
}

/// Why a partition pipeline ended.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("partition {partition}: {source}")]
    Publish {
        partition: i32,
        source: PublishError,
    },
    #[error("partition {partition}: the ledger failed: {source}")]
    Ledger { partition: i32, source: LedgerError },
    #[error("partition {partition}: an actor is gone: {source}")]
    Mailbox {
        partition: i32,
        source: MailboxError,
    },
    #[error("partition {partition}: a forget's transaction committed without telling its changelog offset; the partition is taken over again, and recovery applies the forget from the changelog")]
    ForgetUnconfirmed { partition: i32 },
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
            Self::Mailbox { .. } | Self::ForgetUnconfirmed { .. } => true,
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
    /// Forgets for this partition, done between two batches.
    pub forgets: Option<mpsc::UnboundedReceiver<ForgetRequest>>,
    pub report_to: Recipient<PartitionStopped>,
}

impl Actor for PartitionConsumer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let (Some(queue), Some(forgets)) = (self.queue.take(), self.forgets.take()) else {
            ctx.stop();
            return;
        };
        let pipeline = Pipeline {
            partition: self.partition,
            ledger: self.ledger.clone(),
            publisher: self.publisher.clone(),
            settings: self.settings.clone(),
            metrics: PartitionMetrics::new(self.partition, &self.settings.sources),
            next_output_offset: self.progress.next_output_offset,
            next_changelog_offset: self.progress.next_changelog_offset,
            unkeyed_warned_at: None,
            misrouted_warned_at: None,
            misrouted_since_warned: 0,
            live_since: Some(Instant::now()),
            sampler: self
                .settings
                .audit
                .as_ref()
                .map(|a| Sampler::new(a.sample, a.max_per_sec)),
        };
        let stop = self.stop.clone();
        let fut = async move { pipeline.run(queue, stop, forgets).await };
        ctx.spawn(fut.into_actor(self).map(|result, act, ctx| {
            act.report_to.do_send(PartitionStopped {
                partition: act.partition,
                epoch: act.epoch,
                result,
            });
            ctx.stop();
        }));
    }
}

/// One partition's per-batch protocol, over its id store (the ledger actor in the worker) and its
/// sink (the producer actor).
struct Pipeline<S = Addr<LedgerActor>, K = Addr<Publisher>> {
    partition: i32,
    ledger: S,
    publisher: K,
    settings: Arc<PipelineSettings>,
    metrics: PartitionMetrics,
    next_output_offset: i64,
    next_changelog_offset: i64,
    unkeyed_warned_at: Option<Instant>,
    /// When misrouted ids were last warned about, and how many came since.
    misrouted_warned_at: Option<Instant>,
    misrouted_since_warned: u64,
    /// When the pipeline started, until its first batch is through (logged with its steps' times:
    /// what a partition's resume after a take-over costs).
    live_since: Option<Instant>,
    /// Chooses the drops the audit records; `None` when the audit is off.
    sampler: Option<Sampler>,
}

/// One input record, copied out of the consumer's buffer, with its id (or why it has none).
struct InRecord {
    offset: i64,
    id: Result<LedgerKey, Unkeyed>,
    /// Its id belongs on another partition (see `dedupe::kafka::is_home`).
    misrouted: bool,
    digest: Option<ContentDigest>,
    out: OutRecord,
}

/// A new id as recorded: its key, first-seen time and content digest.
pub(crate) type NewId = (LedgerKey, i64, Option<ContentDigest>);

/// What a batch publishes, decided: its new records, its dead letters, its new ids.
struct Decided {
    outgoing: Outgoing,
    /// The timestamp of the oldest new record, for the end-to-end latency.
    oldest_new_ms: Option<i64>,
}

impl Pipeline {
    async fn run(
        mut self,
        queue: Queue,
        mut stop: watch::Receiver<bool>,
        mut forgets: mpsc::UnboundedReceiver<ForgetRequest>,
    ) -> Result<(), PipelineError> {
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            // A forget waits for the batch under way, never for the next record: while the
            // partition waits for its first record, nothing was taken from the queue yet.
            let first = tokio::select! {
                first = self.next_record(&queue) => first,
                Some(request) = forgets.recv() => {
                    self.forget(request).await?;
                    continue;
                }
                _ = stop.changed() => return Ok(()),
            };
            let batch = tokio::select! {
                batch = self.collect(&queue, first) => batch,
                _ = stop.changed() => return Ok(()),
            };
            if batch.is_empty() {
                continue;
            }
            let first = batch[0].offset;
            let last = batch[batch.len() - 1].offset;
            let span = tracing::info_span!(
                "batch",
                partition = self.partition,
                first_offset = first,
                last_offset = last
            );
            #[cfg(feature = "tools")]
            if self.settings.passthrough {
                self.copy_through(batch).instrument(span).await?;
                continue;
            }
            self.process(batch).instrument(span).await?;
        }
    }

    /// From the partition's first record (or the error read instead), gathers more until the
    /// batch is full or the linger ends.
    async fn collect<'q>(
        &self,
        queue: &'q Queue,
        first: rdkafka::error::KafkaResult<BorrowedMessage<'q>>,
    ) -> Vec<InRecord> {
        let s = &self.settings;
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        let mut deadline = None;
        let mut first = Some(first);
        while batch.len() < s.batch_max_records && bytes < s.batch_max_bytes {
            let next = match (first.take(), deadline) {
                (Some(first), _) => Ok(first),
                (None, None) => Ok(self.next_record(queue).await),
                (None, Some(d)) => tokio::time::timeout_at(d, queue.recv()).await,
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
                    InputReadFailed {
                        partition: self.partition,
                        error: &e,
                    }
                    .emit();
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
    async fn next_record<'q>(
        &self,
        queue: &'q Queue,
    ) -> rdkafka::error::KafkaResult<BorrowedMessage<'q>> {
        loop {
            if let Ok(next) = tokio::time::timeout(LOST_WAKEUP_CHECK, queue.recv()).await {
                return next;
            }
            // A fresh receive looks at the queue before it waits: anything there now had been
            // queued without waking the reader.
            if let Ok(next) = tokio::time::timeout(Duration::ZERO, queue.recv()).await {
                self.metrics.wakeups_recovered.increment(1);
                return next;
            }
        }
    }

    fn copy(&self, msg: &BorrowedMessage<'_>) -> InRecord {
        let headers = msg.headers();
        let view = RecordView {
            key: msg.key(),
            header: |name: &str| {
                headers.and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
            },
            value: msg.payload(),
        };
        // The id and the content digest, from one strict read of the value.
        let identity = identify(
            &view,
            &self.settings.id_source,
            self.settings.content_digest,
        );
        let misrouted = identity.id.as_ref().is_ok_and(|id| {
            !dedupe::kafka::is_home(&id.bytes, self.partition, self.settings.input_partitions)
        });
        let id = identity.id.map(|id| id.key);
        let digest = identity.digest;
        let out = OutRecord {
            key: msg.key().map(<[u8]>::to_vec),
            value: msg.payload().map(<[u8]>::to_vec),
            headers: headers
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
            timestamp_ms: msg.timestamp().to_millis(),
        };
        InRecord {
            offset: msg.offset(),
            id,
            misrouted,
            digest,
            out,
        }
    }

    #[cfg(feature = "tools")]
    /// The bench's baseline (`--passthrough`): every record copied in the same transactions,
    /// without the ledger.
    async fn copy_through(&mut self, batch: Vec<InRecord>) -> Result<(), PipelineError> {
        let next_input_offset = batch[batch.len() - 1].offset + 1;
        self.metrics.records_in.increment(batch.len() as u64);
        let records: Vec<OutRecord> = batch.into_iter().map(|r| r.out).collect();
        let out_count = records.len() as u64;
        let outgoing = Arc::new(Outgoing {
            records,
            dead_letters: Vec::new(),
            audit: Vec::new(),
            new_ids: Vec::new(),
            marks: Vec::new(),
            other_marks: Vec::new(),
        });
        self.publish(&outgoing, next_input_offset).await?;
        self.metrics.records_out.increment(out_count);
        Ok(())
    }
}

impl<S: IdStore, K: Sink> Pipeline<S, K> {
    /// One batch: look its ids up, decide, publish the new records with the next input offset in
    /// one transaction, then record the new ids with the progress that follows the batch.
    async fn process(&mut self, batch: Vec<InRecord>) -> Result<(), PipelineError> {
        let n = batch.len();
        let next_input_offset = batch[n - 1].offset + 1;
        self.metrics.records_in.increment(n as u64);
        self.metrics.batch_records.record(n as f64);
        self.count_misrouted(&batch);
        let started = Instant::now();
        let looked = self.look_up(&batch).await?;
        let looked_up = started.elapsed();
        let mut decided = self.decide(batch, &looked.held);
        let resent = self.resent(&mut decided, &looked.forgotten);
        let (new_ids, committed) = self.publish_decided(decided, next_input_offset).await?;
        let published = started.elapsed();
        fail::fail_point!("worker-after-publish", |_| {
            eprintln!("failpoint worker-after-publish: exiting");
            std::process::exit(86)
        });
        let marks = resent.marks(committed.changelog_offset);
        let resent_ids = marks.len() as u64;
        self.record(new_ids, next_input_offset, marks).await?;
        if resent_ids > 0 {
            self.metrics.resent.increment(resent_ids);
        }
        fail::fail_point!("worker-after-record", |_| {
            eprintln!("failpoint worker-after-record: exiting");
            std::process::exit(86)
        });
        if let Some(live_since) = self.live_since.take() {
            let ms = |d: Duration| d.as_millis() as u64;
            tracing::info!(
                partition = self.partition,
                records = n,
                waited_ms = ms(started.duration_since(live_since)),
                lookup_ms = ms(looked_up),
                publish_ms = ms(published - looked_up),
                record_ms = ms(started.elapsed() - published),
                "The partition's first batch is through."
            );
        }
        Ok(())
    }

    /// Step 1: looks the batch's ids up in the ledger: what it holds of each keyed record's id (its
    /// first-seen time and digest), if anything.
    async fn look_up(&self, batch: &[InRecord]) -> Result<Looked, PipelineError> {
        let p = self.partition;
        let t = Instant::now();
        let keys: Vec<LedgerKey> = batch.iter().filter_map(|r| r.id.ok()).collect();
        let found = if keys.is_empty() {
            Looked::default()
        } else {
            self.ledger.look_up(p, keys).await?
        };
        self.metrics
            .lookup_seconds
            .record(t.elapsed().as_secs_f64());
        Ok(found)
    }

    /// Step 2: decides, in input order: new ids are published once, repeats are dropped, records
    /// without an id follow the unkeyed policy.
    fn decide(&mut self, batch: Vec<InRecord>, found: &[Option<Held>]) -> Decided {
        let candidates: Vec<Candidate> = {
            let modes = self
                .settings
                .source_modes
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            batch
                .iter()
                .map(|r| Candidate {
                    id: r.id,
                    timestamp_ms: r.out.timestamp_ms,
                    digest: r.digest,
                    mode: modes.of(source_header(&r.out).flatten()),
                })
                .collect()
        };
        let rules = Rules {
            unkeyed: self.settings.unkeyed_policy,
            reused_id: self.settings.reused_id,
            now_ms: now_ms(),
        };
        let decision = batch::decide(&candidates, found, rules);
        let mut records = Vec::with_capacity(batch.len());
        let mut dead_letters = Vec::new();
        let mut audit = Vec::new();
        let now = Instant::now();
        for (mut r, fate) in batch.into_iter().zip(&decision.fates) {
            if fate.reaches_output() {
                // Only the worker's own flag, added below, says on the output that a copy is a
                // duplicate.
                let renamed = batch::rename_input_duplicate_headers(&mut r.out.headers);
                if renamed > 0 {
                    self.metrics
                        .input_duplicate_headers
                        .increment(renamed as u64);
                }
            }
            match *fate {
                Fate::Publish => {
                    self.metrics
                        .of_source(source_header(&r.out))
                        .published
                        .increment(1);
                    records.push(r.out);
                }
                Fate::Duplicate(seen) => {
                    let source = source_header(&r.out);
                    self.metrics.of_source(source).duplicate.increment(1);
                    self.metrics
                        .duplicate_age
                        .record(seen.age_ms as f64 / 1000.0);
                    self.metrics.dropped(seen.verdict).increment(1);
                    if seen.verdict == Verdict::ReusedId {
                        self.metrics.reused(ReusedAction::Dropped).increment(1);
                        self.metrics.of_source(source).reused.increment(1);
                    }
                    if let (Some(sampler), Ok(key)) = (self.sampler.as_mut(), r.id) {
                        match sampler.admit(&key, now) {
                            Admission::Audited => {
                                let source =
                                    source.flatten().and_then(|v| std::str::from_utf8(v).ok());
                                audit.push(self.audit_record(&r, key, source, seen));
                            }
                            Admission::SampledOut => self.metrics.audit_sampled_out.increment(1),
                            Admission::OverCap => self.metrics.audit_over_cap.increment(1),
                        }
                    }
                }
                Fate::Reused(_, ReusedIdPolicy::DeadLetter) => {
                    self.metrics.reused(ReusedAction::DeadLettered).increment(1);
                    self.metrics
                        .of_source(source_header(&r.out))
                        .reused
                        .increment(1);
                    dead_letters.push(r.out);
                }
                Fate::Reused(..) => {
                    self.metrics.reused(ReusedAction::Published).increment(1);
                    let counters = self.metrics.of_source(source_header(&r.out));
                    counters.published.increment(1);
                    counters.reused.increment(1);
                    records.push(r.out);
                }
                Fate::Passed(seen, mode) => {
                    let counters = self.metrics.of_source(source_header(&r.out));
                    let mut out = r.out;
                    if mode == SourceMode::Flag {
                        counters.flagged.increment(1);
                        out.headers.push((
                            HEADER_DUPLICATE.to_string(),
                            Some(seen.verdict.as_str().as_bytes().to_vec()),
                        ));
                    } else {
                        counters.passed.increment(1);
                    }
                    records.push(out);
                }
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
        Decided {
            outgoing: Outgoing {
                records,
                dead_letters,
                audit,
                new_ids: decision.new_ids,
                marks: Vec::new(),
                other_marks: Vec::new(),
            },
            oldest_new_ms: decision.oldest_new_ms,
        }
    }

    /// The audit record of a dropped copy from `source`.
    fn audit_record(
        &self,
        r: &InRecord,
        key: LedgerKey,
        source: Option<&str>,
        seen: Seen,
    ) -> OutRecord {
        let drop = DroppedCopy {
            key,
            record: &r.out,
            source,
            input_topic: &self.settings.input_topic,
            input_partition: self.partition,
            input_offset: r.offset,
            first_seen_ms: seen.first_seen_ms,
            age_ms: seen.age_ms,
            in_batch: seen.in_batch,
            verdict: seen.verdict,
        };
        audit::encode(
            &drop,
            self.settings.audit.as_ref().is_some_and(|a| a.payloads),
        )
    }

    /// Step 3: publishes the new records and the input offset in one transaction; returns the new
    /// ids, to record, and what the transaction committed.
    async fn publish_decided(
        &mut self,
        decided: Decided,
        next_input_offset: i64,
    ) -> Result<(Vec<NewId>, dedupe::output::Committed), PipelineError> {
        let t = Instant::now();
        let out_count = decided.outgoing.records.len() as u64;
        let audited = decided.outgoing.audit.len() as u64;
        let outgoing = Arc::new(decided.outgoing);
        let committed = self.publish(&outgoing, next_input_offset).await?;
        self.metrics
            .publish_seconds
            .record(t.elapsed().as_secs_f64());
        self.metrics.committed.increment(1);
        self.metrics.records_out.increment(out_count);
        if audited > 0 {
            self.metrics.audit_written.increment(audited);
        }
        if let Some(last) = committed.last_output_offset {
            self.next_output_offset = last + 1;
        }
        if let Some(at) = committed.changelog_offset {
            self.next_changelog_offset = at + 1;
            self.metrics.changelog_records.increment(1);
        }
        if let Some(oldest) = decided.oldest_new_ms {
            self.metrics
                .end_to_end
                .record(((now_ms() - oldest).max(0) as f64) / 1000.0);
        }
        // The publisher let go of the batch when it answered; a copy only if it still holds it.
        let new_ids =
            Arc::try_unwrap(outgoing).map_or_else(|shared| shared.new_ids.clone(), |o| o.new_ids);
        Ok((new_ids, committed))
    }

    /// Step 4: records the new ids with the progress that follows this batch.
    async fn record(
        &self,
        new_ids: Vec<NewId>,
        next_input_offset: i64,
        marks: Vec<(LedgerKey, Mark)>,
    ) -> Result<(), PipelineError> {
        let p = self.partition;
        let t = Instant::now();
        let progress = Progress {
            next_input_offset,
            next_output_offset: self.next_output_offset,
            next_changelog_offset: self.next_changelog_offset,
        };
        self.ledger.record(p, new_ids, progress, marks).await?;
        self.metrics
            .record_seconds
            .record(t.elapsed().as_secs_f64());
        Ok(())
    }

    /// Publishes, retrying aborted transactions a few times (nothing of an aborted one is
    /// visible). Every attempt sends the same shared batch: nothing is copied.
    async fn publish(
        &self,
        outgoing: &Arc<Outgoing>,
        next_input_offset: i64,
    ) -> Result<dedupe::output::Committed, PipelineError> {
        let p = self.partition;
        let mut backoff = ABORTED_BATCH_RETRIES;
        loop {
            let result = self
                .publisher
                .publish(p, Arc::clone(outgoing), next_input_offset)
                .await?;
            match result {
                Ok(c) => return Ok(c),
                Err(PublishError::Aborted { source })
                    if backoff.retries() < ABORTED_BATCH_RETRIES_ALLOWED =>
                {
                    let delay = backoff.next_delay().unwrap_or_default();
                    TransactionRetried {
                        partition: p,
                        attempt: backoff.retries(),
                        error: &source,
                    }
                    .emit();
                    tokio::time::sleep(delay).await;
                }
                Err(source) => {
                    TransactionFailed {
                        fenced: source.is_fenced(),
                    }
                    .emit();
                    return Err(PipelineError::Publish {
                        partition: p,
                        source,
                    });
                }
            }
        }
    }

    /// Counts the batch's records whose id belongs on another partition, and warns at most once a
    /// minute per partition.
    fn count_misrouted(&mut self, batch: &[InRecord]) {
        let records = batch.iter().filter(|r| r.misrouted).count() as u64;
        if records == 0 {
            return;
        }
        self.misrouted_since_warned += records;
        let warn = self
            .misrouted_warned_at
            .is_none_or(|t| t.elapsed() > Duration::from_secs(60));
        let since = warn.then_some(self.misrouted_since_warned);
        if warn {
            self.misrouted_warned_at = Some(Instant::now());
            self.misrouted_since_warned = 0;
        }
        MisroutedIds {
            partition: self.partition,
            counter: &self.metrics.misrouted,
            records,
            warn: since,
        }
        .emit();
    }

    /// Counts a record without a usable id, and warns at most once a minute per partition.
    fn unkeyed(&mut self, reason: Unkeyed, policy: UnkeyedPolicy) {
        let warn = self
            .unkeyed_warned_at
            .is_none_or(|t| t.elapsed() > Duration::from_secs(60));
        if warn {
            self.unkeyed_warned_at = Some(Instant::now());
        }
        UnkeyedRecord {
            partition: self.partition,
            label: &self.metrics.label,
            reason,
            policy,
        }
        .emit(warn);
    }
}

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
use dedupe::audit::Sampler;
use dedupe::config::{DigestSource, IdSource, ReusedIdPolicy, SourceModes, UnkeyedPolicy};
use dedupe::identity::{ContentDigest, LedgerKey, Unkeyed};
use dedupe::ledger::LedgerError;
use dedupe::output::{OutRecord, PublishError, RefusedIn, RefusedRecord};
use dedupe::progress::Progress;
use rdkafka::types::RDKafkaErrorCode;
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use crate::events::partition::PartitionMetrics;
use crate::ledger::LedgerActor;
use crate::membership::Queue;
use crate::producer::{Outgoing, Publisher};
use refusal::Processed;
use stall::Stall;

pub use audit_record::AuditSettings;
pub use board::Board;
pub use forget_transaction::{ForgetId, ForgetReport, ForgetRequest};

// The per-batch protocol's steps in `protocol`, what they read from the queue in `intake`, and
// one file for each concern a batch may meet on the way.
mod audit_record;
mod board;
mod forget_transaction;
mod intake;
mod misrouted;
#[cfg(feature = "passthrough")]
mod passthrough;
mod protocol;
mod refusal;
mod seams;
mod stall;
mod tally;
#[cfg(test)]
mod tests;
mod unkeyed;

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
    /// without the ledger. Built with the `passthrough` feature only.
    #[cfg(feature = "passthrough")]
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
    /// The retention limit, ms (`ledger.max_window_secs`).
    pub retention_limit_ms: Option<i64>,
    /// `ledger.refresh_on_duplicate`.
    pub refresh_on_duplicate: bool,
    /// The output topic, named where it refuses a record.
    pub output_topic: String,
    /// `worker.dead_letter_topic`: where a record the output refuses for good goes instead.
    pub dead_letter_topic: Option<String>,
    /// What the pipelines show the coordinator of their partitions: where a stalled one stops,
    /// which wait on an empty queue.
    pub board: Arc<Board>,
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
    /// A transaction that is not a batch's (a forget's, the bench's copy) had records refused for
    /// good: nothing of it is visible.
    #[error("partition {partition}: the {} refused {records} records of a transaction for good ({code})", .refused_by.name())]
    Refused {
        partition: i32,
        records: usize,
        code: RDKafkaErrorCode,
        refused_by: RefusedIn,
    },
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
            Self::Mailbox { .. } | Self::ForgetUnconfirmed { .. } | Self::Refused { .. } => true,
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
            twice_warned_at: None,
            twice_since_warned: 0,
            live_since: Some(Instant::now()),
            sampler: self
                .settings
                .audit
                .as_ref()
                .map(|a| Sampler::new(a.sample, a.max_per_sec)),
        };
        let stop = self.stop.clone();
        let board = Arc::clone(&self.settings.board);
        let partition = self.partition;
        let fut = async move {
            let result = pipeline.run(queue, stop, forgets).await;
            board.clear(partition);
            result
        };
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
/// sink (the producer actor): see `seams.rs`.
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
    /// When ids published twice were last warned about, and how many came since.
    twice_warned_at: Option<Instant>,
    twice_since_warned: u64,
    /// When the pipeline started, until its first batch is through (logged with its steps' times:
    /// what a partition's resume after a take-over costs).
    live_since: Option<Instant>,
    /// Chooses the drops the audit records; `None` when the audit is off.
    sampler: Option<Sampler>,
}

/// One input record, copied out of the consumer's buffer, with its id (or why it has none).
#[derive(Debug, Clone)]
struct InRecord {
    offset: i64,
    id: Result<LedgerKey, Unkeyed>,
    /// Its id belongs on another partition (see `dedupe::kafka::is_home`).
    misrouted: bool,
    digest: Option<ContentDigest>,
    out: OutRecord,
}

pub(crate) use dedupe::store::NewId;

impl<S, K> Pipeline<S, K> {
    /// A transaction that is not a batch's had records refused for good.
    fn refused(&self, refused: &[RefusedRecord]) -> PipelineError {
        let first = refused.first();
        PipelineError::Refused {
            partition: self.partition,
            records: refused.len(),
            code: first.map_or(RDKafkaErrorCode::Fail, |r| r.code),
            refused_by: first.map_or(RefusedIn::Output, |r| r.topic),
        }
    }
}

/// What a batch publishes, decided: its new records, its dead letters, its new ids.
struct Decided {
    outgoing: Outgoing,
    /// Where in the new ids the refreshes are (see `dedupe::batch::BatchDecision::refreshes`).
    refreshes: Vec<usize>,
    /// The timestamp of the oldest new record, for the end-to-end latency.
    oldest_new_ms: Option<i64>,
    /// What the decision counts, once its transaction commits.
    tally: tally::Tally,
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
            // A record already queued is read at once: the partition is still catching up.
            // Otherwise it waits on an empty queue, caught up, which the board shows (the
            // retention limit's clock runs on the wall clock only for caught-up partitions).
            let first = match tokio::time::timeout(Duration::ZERO, queue.recv()).await {
                Ok(first) => first,
                Err(_) => {
                    self.settings.board.set_idle(self.partition, true);
                    // A forget waits for the batch under way, never for the next record: while
                    // the partition waits for its first record, nothing was taken from the queue
                    // yet.
                    let first = tokio::select! {
                        first = self.next_record(&queue) => first,
                        Some(request) = forgets.recv() => {
                            self.forget(request).await?;
                            continue;
                        }
                        _ = stop.changed() => return Ok(()),
                    };
                    self.settings.board.set_idle(self.partition, false);
                    first
                }
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
            #[cfg(feature = "passthrough")]
            if self.settings.passthrough {
                self.copy_through(batch).instrument(span).await?;
                continue;
            }
            let processed = self.process(batch).instrument(span).await?;
            if let Processed::StoppedAt {
                rest,
                code,
                refused_by,
            } = processed
            {
                let stall = Stall::new(rest, code, refused_by);
                if self.wait_out(stall, &mut stop, &mut forgets).await? {
                    return Ok(());
                }
            }
        }
    }
}

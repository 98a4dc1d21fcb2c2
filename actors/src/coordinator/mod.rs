//! `Coordinator` supervises the worker: it owns the input consumer's membership, takes over each
//! partition it is given (fence, load, then process: see [`handover`](crate::handover)),
//! starts one `Publisher` and one `PartitionConsumer` per partition, stops them when a partition
//! is revoked, exports the ledger's window, restarts the pipeline when a partition fails, takes
//! snapshots, and drives graceful shutdown. It keeps one guarantee above all: no input is
//! processed for a partition until its previous owner is fenced and the ledger is up to date for
//! it.
//!
//! Which partitions it owns comes from the configuration (`worker.assignment = "static"`: all are
//! taken over together, then assigned) or from the consumer group (`"group"`: each assignment is
//! taken over as it comes, while the others keep running).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use dedupe::config::{Assignment, Config};
use dedupe::ledger::Ledger;
use dedupe::snapshot::{SnapshotError, SnapshotPace, Trigger};
use dedupe::window::{HourRate, IdRate};
use rdkafka::error::KafkaError;
use tokio::sync::watch;

use crate::consumer::{AuditSettings, ForgetRequest, PipelineSettings};
use crate::events::coordinator::{LedgerBudget, PartitionCounts, PromiseDeclared, RetentionLimit};
use crate::events::PipelineStartFailed;
use crate::handover::{TakeOverError, TakenOver};
use crate::ledger::LedgerActor;
use crate::membership::{Membership, MembershipError, Queue};
use policy::{RestartPolicy, RetakePolicy, StopPolicy, Verdict};
pub use shutdown::Shutdown;

// One file per concern; the state they share is declared here. `policy` holds the rules they act
// on, as plain state machines.
mod failures;
pub mod policy;
mod retake;
mod revocation;
mod shutdown;
mod snapshots;
mod stats;
mod takeover;

/// Liveness and readiness, shared with the HTTP endpoints.
#[derive(Default)]
pub struct Health {
    pub owned: AtomicUsize,
    pub ready: AtomicUsize,
    pub stopping: AtomicBool,
    /// Group mode, joined: owning no partition (more workers than partitions) is a ready state.
    pub idle_ok: AtomicBool,
}

impl Health {
    pub fn is_ready(&self) -> bool {
        let owned = self.owned.load(Ordering::Relaxed);
        let some = owned > 0 || self.idle_ok.load(Ordering::Relaxed);
        some && self.ready.load(Ordering::Relaxed) == owned
            && !self.stopping.load(Ordering::Relaxed)
    }
}

/// Why the pipeline could not start, or could not take a partition over.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Membership(#[from] MembershipError),
    #[error("taking over partition {partition}: {source}")]
    TakeOver {
        partition: i32,
        source: Box<TakeOverError>,
    },
    #[error("splitting the queue of input partition {partition} failed (the consumer no longer knows the partition)")]
    SplitQueue { partition: i32 },
    #[error("assigning the input partitions: {source}")]
    Assign { source: KafkaError },
}

impl StartError {
    /// Whether starting again may succeed (the brokers or the group coordinator were away), as
    /// opposed to a state a new start meets again (the ledger ahead of the output, a progress
    /// record it cannot read).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::TakeOver { source, .. } => source.is_retryable(),
            Self::Membership(_) | Self::SplitQueue { .. } | Self::Assign { .. } => true,
        }
    }
}

/// Choices made on the command line rather than in the configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Start even when the ledger is ahead of the output topic, trusting the ledger.
    pub accept_ledger_ahead: bool,
    /// Bench baseline: copy every record without the ledger (the `passthrough` feature only,
    /// which `dedupe-cli`'s `tools` enables).
    #[cfg(feature = "passthrough")]
    pub passthrough: bool,
}

/// Exit codes the worker ends with.
pub mod exit {
    pub const OK: i32 = 0;
    pub const FAILED: i32 = 1;
    /// Another worker took over a partition (this one was fenced, or lost it to the group).
    pub const FENCED: i32 = 3;
    /// A Kafka client call hung past its timeout (see `dedupe::watchdog`).
    pub const STUCK: i32 = dedupe::watchdog::STUCK_EXIT_CODE;
}

/// Where one owned partition stands.
enum Stage {
    /// Being taken over (fence, load). `queue` is its split input queue (group mode).
    Loading { queue: Option<Queue> },
    /// Taken over; waiting for the others before the static assignment.
    Loaded { taken: Box<TakenOver> },
    /// Processing.
    Live {
        stop: watch::Sender<bool>,
        arbiter: Arbiter,
        /// Forgets for the pipeline, done between its batches.
        forgets: tokio::sync::mpsc::UnboundedSender<ForgetRequest>,
    },
    /// Told to stop (revoked, or shutting down); its batch in flight finishes first.
    Stopping { arbiter: Arbiter },
}

struct Owned {
    stage: Stage,
    assigned_at: Instant,
    /// Which take-over this is, so a late result for an earlier one is ignored.
    epoch: u64,
    /// Taken over again after its pipeline failed (see `retake.rs`): its input is rewound to the
    /// committed offset before it flows.
    retake: bool,
    /// Stops the partition's take-over (its load, or its back-fill) once the partition is no
    /// longer owned: read by its `Drop`.
    #[allow(dead_code)]
    stop: StopOnDrop,
}

impl Owned {
    /// Tells a live partition's pipeline to stop after its batch in flight (a revocation, or
    /// the shutdown): true while it still runs, now `Stopping`; false for a partition still
    /// being taken over, which the caller drops (the take-over's result is ignored when it
    /// arrives, its producer dropped).
    fn stop(&mut self) -> bool {
        match std::mem::replace(&mut self.stage, Stage::Loading { queue: None }) {
            Stage::Live { stop, arbiter, .. } => {
                let _ = stop.send(true);
                self.stage = Stage::Stopping { arbiter };
                true
            }
            Stage::Stopping { arbiter } => {
                self.stage = Stage::Stopping { arbiter };
                true
            }
            Stage::Loading { .. } | Stage::Loaded { .. } => false,
        }
    }
}

/// A flag a take-over thread reads, set when this is dropped.
#[derive(Default)]
struct StopOnDrop(Arc<AtomicBool>);

impl StopOnDrop {
    fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One running membership: torn down whole when the pipeline restarts.
struct Running {
    membership: Membership,
    owned: BTreeMap<i32, Owned>,
    /// The input consumer has its partitions: in group mode from the start, in static mode once
    /// every partition is loaded and assigned.
    assigned: bool,
    /// Revocations waiting for their partitions to stop.
    revocations: Vec<(Vec<i32>, std::sync::mpsc::Sender<()>)>,
}

pub struct Coordinator {
    pub(crate) config: Arc<Config>,
    /// `static` assignment: the configured partitions.
    static_partitions: Vec<i32>,
    pub(crate) ledger: Addr<LedgerActor>,
    /// The ledger itself, for take-overs' bulk loads (see [`handover`](crate::handover)).
    store: Arc<Ledger>,
    /// Per partition, held by its take-over thread while it runs: one take-over at a time.
    takeover_turns: HashMap<i32, Arc<Mutex<()>>>,
    health: Arc<Health>,
    options: RunOptions,
    settings: Arc<PipelineSettings>,
    running: Option<Running>,
    next_epoch: u64,
    /// The whole pipeline's restarts, and when to give up on them.
    restart_policy: RestartPolicy,
    /// Partitions taken over again in process (see `retake.rs`), and when to give up on them.
    retake_policy: RetakePolicy,
    /// A restart of the pipeline is scheduled: further failures (of the pipelines it tears down)
    /// are covered by it.
    restart_pending: bool,
    /// Whether the worker stops, and why (its exit code).
    stop: StopPolicy,
    last_stats_at: Option<Instant>,
    id_rate: IdRate,
    /// The id rate over the last hour, and whether the budget held the promise at it last time.
    hour_rate: HourRate,
    promise_held: Option<bool>,
    /// A snapshot (checkpoint, prune, hook) is under way: one at a time.
    pub(crate) snapshot_running: bool,
    /// When the last snapshot started: one per `snapshots.min_interval_secs`.
    pub(crate) snapshot_pace: SnapshotPace,
}

impl Coordinator {
    /// `worker.source_modes` as the pipelines read them: what a configuration reload replaces.
    pub fn source_modes(&self) -> Arc<std::sync::RwLock<dedupe::config::SourceModes>> {
        Arc::clone(&self.settings.source_modes)
    }

    pub fn new(
        config: Arc<Config>,
        static_partitions: Vec<i32>,
        input_partitions: i32,
        ledger: Addr<LedgerActor>,
        store: Arc<Ledger>,
        health: Arc<Health>,
        options: RunOptions,
    ) -> Self {
        LedgerBudget {
            bytes: config.ledger.budget_bytes.0,
        }
        .emit();
        PromiseDeclared {
            input_topic: &config.worker.input_topic,
            secs: config.worker.promised_window_secs,
        }
        .emit();
        if let Some(secs) = config.ledger.max_window_secs {
            RetentionLimit { secs }.emit();
        }
        let w = &config.worker;
        let settings = Arc::new(PipelineSettings {
            id_source: w.id_source.clone(),
            unkeyed_policy: w.unkeyed_policy,
            content_digest: w.content_digest,
            reused_id: w.on_reused_id,
            batch_max_records: w.batch_max_records,
            batch_max_bytes: w.batch_max_bytes.0 as usize,
            batch_linger: Duration::from_millis(w.batch_linger_ms),
            #[cfg(feature = "passthrough")]
            passthrough: options.passthrough,
            input_topic: w.input_topic.clone(),
            audit: w.audit_topic().map(|_| AuditSettings {
                payloads: w.audit_payloads,
                sample: w.audit_sample,
                max_per_sec: w.audit_max_per_sec,
            }),
            sources: counted_sources(&config),
            input_partitions,
            source_modes: Arc::new(std::sync::RwLock::new(w.source_modes.clone())),
            retention_limit_ms: config.ledger.options().max_window_ms,
            refresh_on_duplicate: config.ledger.refresh_on_duplicate,
            output_topic: w.output_topic.clone(),
            dead_letter_topic: w.dead_letter_topic.clone(),
            board: Arc::default(),
        });
        let snapshot_pace =
            SnapshotPace::new(Duration::from_secs(config.snapshots.min_interval_secs));
        Self {
            config,
            static_partitions,
            ledger,
            store,
            takeover_turns: HashMap::new(),
            health,
            options,
            settings,
            running: None,
            next_epoch: 0,
            restart_policy: RestartPolicy::default(),
            retake_policy: RetakePolicy::default(),
            restart_pending: false,
            stop: StopPolicy::default(),
            last_stats_at: None,
            id_rate: IdRate::default(),
            hour_rate: HourRate::default(),
            promise_held: None,
            snapshot_running: false,
            snapshot_pace,
        }
    }

    /// The worker is stopping (a signal, or its membership lost): nothing new is started.
    fn shutting_down(&self) -> bool {
        self.stop.stopping()
    }

    fn group_mode(&self) -> bool {
        self.config.worker.assignment == Assignment::Group
    }

    /// Creates the input consumer; in static mode takes every configured partition over.
    fn start_pipeline(&mut self, ctx: &mut Context<Self>) {
        // Never two pipelines at once: a leftover one would be fenced by the new take-overs.
        if self.running.is_some() {
            self.teardown();
        }
        let me = ctx.address();
        let membership = match Membership::start(
            &self.config,
            me.clone().recipient(),
            me.clone().recipient(),
            me.recipient(),
        ) {
            Ok(m) => m,
            Err(e) => return self.fail_start(&e.into(), ctx),
        };
        let assigned = self.group_mode();
        self.running = Some(Running {
            membership,
            owned: BTreeMap::new(),
            assigned,
            revocations: Vec::new(),
        });
        if self.group_mode() {
            self.health.idle_ok.store(true, Ordering::Relaxed);
            crate::events::coordinator::GroupJoined {
                group: &self.config.worker.group_id(),
                member: self.config.worker.member_id().as_deref(),
            }
            .emit();
        } else {
            let partitions: Vec<(i32, Option<Queue>)> =
                self.static_partitions.iter().map(|&p| (p, None)).collect();
            self.take_over(partitions, false, ctx);
        }
        self.publish_health();
    }

    /// Starting the pipeline, or a partition of it, failed: a failure another attempt may mend
    /// restarts the pipeline after a backoff (as many times as [`Coordinator::restart`] allows);
    /// any other ends the worker.
    fn fail_start(&mut self, e: &StartError, ctx: &mut Context<Self>) {
        PipelineStartFailed {
            error: e,
            again: e.is_retryable(),
        }
        .emit();
        if e.is_retryable() && !self.shutting_down() {
            self.restart(ctx);
            return;
        }
        self.teardown();
        System::current().stop_with_code(exit::FAILED);
    }

    fn publish_health(&self) {
        let (owned, live, loading, oldest) = match &self.running {
            None => (0, 0, 0, 0.0),
            Some(r) => {
                let live = r
                    .owned
                    .values()
                    .filter(|o| matches!(o.stage, Stage::Live { .. }))
                    .count();
                let loading: Vec<&Owned> = r
                    .owned
                    .values()
                    .filter(|o| matches!(o.stage, Stage::Loading { .. } | Stage::Loaded { .. }))
                    .collect();
                let oldest = loading
                    .iter()
                    .map(|o| o.assigned_at.elapsed().as_secs_f64())
                    .fold(0.0, f64::max);
                (r.owned.len(), live, loading.len(), oldest)
            }
        };
        self.health.owned.store(owned, Ordering::Relaxed);
        self.health.ready.store(live, Ordering::Relaxed);
        PartitionCounts {
            owned,
            live,
            loading,
            oldest_handover_secs: oldest,
        }
        .emit();
    }

    /// Stops everything: every partition, then the membership (leaving the group).
    fn teardown(&mut self) {
        if let Some(mut running) = self.running.take() {
            // Dropping the senders releases a rebalance callback that waits on them.
            running.revocations.clear();
            for (_, owned) in std::mem::take(&mut running.owned) {
                match owned.stage {
                    Stage::Live { stop, arbiter, .. } => {
                        let _ = stop.send(true);
                        arbiter.stop();
                    }
                    Stage::Stopping { arbiter } => {
                        arbiter.stop();
                    }
                    Stage::Loading { .. } | Stage::Loaded { .. } => {}
                }
            }
            running.membership.close();
        }
        self.health.idle_ok.store(false, Ordering::Relaxed);
        self.publish_health();
    }

    /// A failure a restart in process may mend: tear down, and start again after a backoff.
    fn restart(&mut self, ctx: &mut Context<Self>) {
        self.teardown();
        if self.restart_pending {
            return;
        }
        let backoff = match self.restart_policy.failed(Instant::now()) {
            Verdict::Retake(backoff) => backoff,
            Verdict::Exit(why) => {
                self.give_up(why);
                return;
            }
        };
        self.restart_pending = true;
        ctx.run_later(backoff, |act, ctx| {
            act.restart_pending = false;
            if !act.shutting_down() {
                act.start_pipeline(ctx);
            }
        });
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.rescue_hung_calls(ctx);
        self.start_pipeline(ctx);
        ctx.run_interval(Duration::from_secs(5), |act, ctx| act.export_stats(ctx));
        let snapshots = &self.config.snapshots;
        if snapshots.dir.is_some() && snapshots.interval_secs > 0 {
            ctx.run_interval(Duration::from_secs(snapshots.interval_secs), |_, ctx| {
                ctx.notify(TakeSnapshot {
                    trigger: Trigger::Scheduled,
                    reply: None,
                });
            });
        }
    }
}

/// The sources counted apart per record: `worker.sources`, or else those `worker.source_modes`
/// names as the worker starts. Both are the worker's own settings: the front door's write keys
/// are its secret, which the worker never reads.
fn counted_sources(config: &Config) -> Vec<String> {
    if !config.worker.sources.is_empty() {
        return config.worker.sources.clone();
    }
    config.worker.source_modes.0.keys().cloned().collect()
}

/// Take a ledger snapshot now: checkpoint, prune to `snapshots.keep`, run the hook (handled in
/// `actors::snapshots`). One at a time: a request while one is under way is refused with
/// [`SnapshotError::Busy`] (a scheduled one is skipped), so no prune ever runs under a running
/// hook. One started per `snapshots.min_interval_secs`: a request sooner is refused with
/// [`SnapshotError::TooSoon`] (a scheduled one is skipped). Failures are counted and logged and
/// never stop the pipeline.
#[derive(Message)]
#[rtype(result = "()")]
pub struct TakeSnapshot {
    /// Who asks: an operator's request, or the schedule.
    pub trigger: Trigger,
    /// Where to send the snapshot's directory, or why there is none.
    pub reply: Option<tokio::sync::oneshot::Sender<Result<std::path::PathBuf, SnapshotError>>>,
}

/// Ids of one partition to forget: handed to its pipeline, which answers on the request's reply;
/// answered here when the partition is not live on this worker.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Forget {
    pub partition: i32,
    pub request: ForgetRequest,
}

impl Handler<Forget> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Forget, _: &mut Self::Context) {
        let Forget { partition, request } = msg;
        let owned = self.running.as_ref().and_then(|r| r.owned.get(&partition));
        let refused = match owned.map(|o| &o.stage) {
            Some(Stage::Live { forgets, .. }) => match forgets.send(request) {
                Ok(()) => return,
                Err(returned) => (returned.0, "its pipeline is stopping"),
            },
            Some(_) => (
                request,
                "it is being taken over or stopping; try again shortly",
            ),
            None => (request, "this worker does not own it"),
        };
        let (request, why) = refused;
        let _ = request
            .reply
            .send(Err(format!("partition {partition}: {why}")));
    }
}

/// The input partitions this worker owns now (taken over, loading or live); in static mode before
/// the pipeline runs, the configured ones.
#[derive(Message)]
#[rtype(result = "Vec<i32>")]
pub struct OwnedPartitions;

impl Handler<OwnedPartitions> for Coordinator {
    type Result = Vec<i32>;

    fn handle(&mut self, _: OwnedPartitions, _: &mut Self::Context) -> Vec<i32> {
        match &self.running {
            Some(running) => running.owned.keys().copied().collect(),
            None => self.static_partitions.clone(),
        }
    }
}

//! `Coordinator` supervises the worker: it owns the input consumer's membership, takes over each
//! partition it is given (fence, load, then process: see [`handover`](crate::actors::handover)),
//! starts one `Publisher` and one `PartitionConsumer` per partition, stops them when a partition
//! is revoked, exports the ledger's window, restarts the pipeline when a partition fails, takes
//! snapshots, and drives graceful shutdown. It keeps one guarantee above all: no input is
//! processed for a partition until its previous owner is fenced and the ledger is up to date for
//! it.
//!
//! Which partitions it owns comes from the configuration (`worker.assignment = "static"`: all are
//! taken over together, then assigned) or from the consumer group (`"group"`: each assignment is
//! taken over as it comes, while the others keep running).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use anyhow::Context as _;
use dedupe::config::{Assignment, Config, PartitionSet};
use dedupe::metrics as m;
use dedupe::recovery::now_ms;
use dedupe::retry::Backoff;
use dedupe::snapshot::{SnapshotPace, Trigger};
use dedupe::window::{forecast_seconds, IdRate, LedgerFill};
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use crate::actors::consumer::{PartitionConsumer, PartitionStopped, PipelineSettings};
use crate::actors::events::{Fenced, PipelineFailed, PipelineFatal, PipelineStartFailed};
use crate::actors::handover::{decode_progress, take_over, TakenOver};
use crate::actors::ledger::{AllProgress, LedgerActor, Stats};
use crate::actors::membership::{Assigned, ConsumerFailed, Input, Membership, Queue, Revoking};
use crate::actors::producer::Publisher;
pub use crate::actors::snapshots::TakeSnapshot;
pub use shutdown::Shutdown;
use shutdown::Finish;

mod shutdown;

/// Waits before restarting a failed pipeline: 2, 4, 8, 16, 32 s for the restarts within ten
/// minutes (after five the worker exits instead).
const PIPELINE_RESTARTS: Backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(32), 5);

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
        some && self.ready.load(Ordering::Relaxed) == owned && !self.stopping.load(Ordering::Relaxed)
    }
}

/// Choices made on the command line rather than in the configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Start even when the ledger is ahead of the output topic, trusting the ledger.
    pub accept_ledger_ahead: bool,
    /// Bench baseline: copy every record without the ledger.
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
    Live { stop: watch::Sender<bool>, arbiter: Arbiter },
    /// Told to stop (revoked, or shutting down); its batch in flight finishes first.
    Stopping { arbiter: Arbiter },
}

struct Owned {
    stage: Stage,
    assigned_at: Instant,
    /// Which take-over this is, so a late result for an earlier one is ignored.
    epoch: u64,
}

/// A take-over finished.
#[derive(Message)]
#[rtype(result = "()")]
struct Loaded {
    partition: i32,
    epoch: u64,
    result: anyhow::Result<TakenOver>,
}

/// One running membership: torn down whole when the pipeline restarts.
struct Running {
    membership: Membership,
    owned: BTreeMap<i32, Owned>,
    /// Revocations waiting for their partitions to stop.
    revocations: Vec<(Vec<i32>, std::sync::mpsc::Sender<()>)>,
}

pub struct Coordinator {
    pub(crate) config: Arc<Config>,
    /// `static` assignment: the configured partitions.
    static_partitions: Vec<i32>,
    pub(crate) ledger: Addr<LedgerActor>,
    health: Arc<Health>,
    options: RunOptions,
    settings: Arc<PipelineSettings>,
    running: Option<Running>,
    next_epoch: u64,
    restarts: Vec<Instant>,
    /// A restart of the pipeline is scheduled: further failures (of the pipelines it tears down)
    /// are covered by it.
    restart_pending: bool,
    shutting_down: bool,
    /// The group took partitions away without this worker's consent: exit once they stopped.
    exit_when_revoked: Option<i32>,
    last_stats_at: Option<Instant>,
    id_rate: IdRate,
    /// A snapshot (checkpoint, prune, hook) is under way: one at a time.
    pub(crate) snapshot_running: bool,
    /// When the last snapshot started: one per `snapshots.min_interval_secs`.
    pub(crate) snapshot_pace: SnapshotPace,
}

impl Coordinator {
    pub fn new(
        config: Arc<Config>,
        static_partitions: Vec<i32>,
        ledger: Addr<LedgerActor>,
        health: Arc<Health>,
        options: RunOptions,
    ) -> Self {
        metrics::gauge!(m::LEDGER_BUDGET_BYTES).set(config.ledger.budget_bytes.0 as f64);
        let w = &config.worker;
        let settings = Arc::new(PipelineSettings {
            id_source: w.id_source.clone(),
            unkeyed_policy: w.unkeyed_policy,
            batch_max_records: w.batch_max_records,
            batch_max_bytes: w.batch_max_bytes.0 as usize,
            batch_linger: Duration::from_millis(w.batch_linger_ms),
            passthrough: options.passthrough,
        });
        let snapshot_pace = SnapshotPace::new(Duration::from_secs(config.snapshots.min_interval_secs));
        Self {
            config,
            static_partitions,
            ledger,
            health,
            options,
            settings,
            running: None,
            next_epoch: 0,
            restarts: Vec::new(),
            restart_pending: false,
            shutting_down: false,
            exit_when_revoked: None,
            last_stats_at: None,
            id_rate: IdRate::default(),
            snapshot_running: false,
            snapshot_pace,
        }
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
        let membership = match Membership::start(&self.config, me.clone().recipient(), me.clone().recipient(), me.recipient()) {
            Ok(m) => m,
            Err(e) => return self.fail_start(&e),
        };
        self.running = Some(Running { membership, owned: BTreeMap::new(), revocations: Vec::new() });
        if self.group_mode() {
            self.health.idle_ok.store(true, Ordering::Relaxed);
            tracing::info!(group = %self.config.worker.group_id, member = ?self.config.worker.member_id(), "Joined the consumer group; waiting for partitions.");
        } else {
            let partitions: Vec<(i32, Option<Queue>)> = self.static_partitions.iter().map(|&p| (p, None)).collect();
            self.take_over(partitions, ctx);
        }
        self.publish_health();
    }

    fn fail_start(&mut self, e: &anyhow::Error) {
        PipelineStartFailed { error: e }.emit();
        self.teardown();
        System::current().stop_with_code(exit::FAILED);
    }

    /// Starts taking each partition over, on blocking threads, after reading the ledger's progress.
    fn take_over(&mut self, partitions: Vec<(i32, Option<Queue>)>, ctx: &mut Context<Self>) {
        let Some(running) = self.running.as_mut() else { return };
        let mut started = Vec::new();
        for (p, queue) in partitions {
            metrics::counter!(m::PARTITION_ASSIGNMENTS, m::LABEL_PARTITION => p.to_string()).increment(1);
            self.next_epoch += 1;
            running.owned.insert(p, Owned { stage: Stage::Loading { queue }, assigned_at: Instant::now(), epoch: self.next_epoch });
            started.push((p, self.next_epoch));
        }
        let (config, ledger, accept) = (self.config.clone(), self.ledger.clone(), self.options.accept_ledger_ahead);
        let consumer = running.membership.consumer.clone();
        let me = ctx.address();
        actix_rt::spawn(async move {
            let progress = match ledger.send(AllProgress).await {
                Ok(Ok(all)) => all,
                Ok(Err(e)) => {
                    let error = anyhow::Error::new(e).context("reading the ledger's progress records");
                    return me.do_send(Loaded { partition: started.first().map_or(-1, |s| s.0), epoch: started.first().map_or(0, |s| s.1), result: Err(error) });
                }
                Err(_) => return,
            };
            for (p, epoch) in started {
                let (config, ledger, consumer, me) = (config.clone(), ledger.clone(), consumer.clone(), me.clone());
                let progress = decode_progress(&progress, p);
                actix_rt::task::spawn_blocking(move || {
                    let ready = |taken| me.do_send(Loaded { partition: p, epoch, result: Ok(taken) });
                    let result = progress.and_then(|progress| take_over(&config, &consumer, &ledger, p, progress, accept, ready));
                    if let Err(error) = result {
                        me.do_send(Loaded { partition: p, epoch, result: Err(error) });
                    }
                });
            }
        });
    }

    /// Starts the partition's publisher and consumer actor.
    fn go_live(&mut self, p: i32, taken: TakenOver, queue: Queue, report_to: Recipient<PartitionStopped>) {
        let Some(running) = self.running.as_mut() else { return };
        let Some(owned) = running.owned.get_mut(&p) else { return };
        let epoch = owned.epoch;
        let arbiter = Arbiter::new();
        let w = &self.config.worker;
        let publisher = Publisher::new(taken.writer, w.input_topic.clone(), p, running.membership.consumer.clone());
        let publisher = Publisher::start_in_arbiter(&arbiter.handle(), move |_| publisher);
        let (stop, stop_rx) = watch::channel(false);
        PartitionConsumer {
            partition: p,
            epoch,
            queue: Some(queue),
            ledger: self.ledger.clone(),
            publisher,
            settings: self.settings.clone(),
            progress: taken.report.progress,
            stop: stop_rx,
            report_to,
        }
        .start();
        let seconds = owned.assigned_at.elapsed().as_secs_f64();
        metrics::gauge!(m::HANDOVER_SECONDS, m::LABEL_PARTITION => p.to_string()).set(seconds);
        owned.stage = Stage::Live { stop, arbiter };
        tracing::info!(partition = p, seconds, "The partition is live: processing input.");
    }

    /// Static mode: once every partition is taken over, split their queues, assign them at their
    /// resume offsets, and start them.
    fn assign_static_when_loaded(&mut self, report_to: Recipient<PartitionStopped>) -> anyhow::Result<()> {
        let Some(running) = self.running.as_mut() else { return Ok(()) };
        if !running.owned.values().all(|o| matches!(o.stage, Stage::Loaded { .. })) {
            return Ok(());
        }
        let topic = self.config.worker.input_topic.clone();
        let consumer = running.membership.consumer.clone();
        let mut tpl = TopicPartitionList::new();
        let mut ready = Vec::new();
        let partitions: Vec<i32> = running.owned.keys().copied().collect();
        for p in partitions {
            let Some(Owned { stage: Stage::Loaded { .. }, .. }) = running.owned.get(&p) else { continue };
            let queue = consumer.split_partition_queue(&topic, p).with_context(|| format!("splitting the queue of input partition {p}"))?;
            let Some(owned) = running.owned.get_mut(&p) else { continue };
            let Stage::Loaded { taken } = std::mem::replace(&mut owned.stage, Stage::Loading { queue: None }) else { continue };
            let offset = taken.report.resume_input_at.map(Offset::Offset).unwrap_or(Offset::Beginning);
            tpl.add_partition_offset(&topic, p, offset)?;
            ready.push((p, taken, queue));
        }
        consumer.assign(&tpl).context("assigning the input partitions")?;
        for (p, taken, queue) in ready {
            self.go_live(p, *taken, queue, report_to.clone());
        }
        tracing::info!(partitions = %PartitionSet(self.static_partitions.clone()), "Every owned partition is recovered; processing input.");
        Ok(())
    }

    fn publish_health(&self) {
        let (owned, live, loading, oldest) = match &self.running {
            None => (0, 0, 0, 0.0),
            Some(r) => {
                let live = r.owned.values().filter(|o| matches!(o.stage, Stage::Live { .. })).count();
                let loading: Vec<&Owned> = r.owned.values().filter(|o| matches!(o.stage, Stage::Loading { .. } | Stage::Loaded { .. })).collect();
                let oldest = loading.iter().map(|o| o.assigned_at.elapsed().as_secs_f64()).fold(0.0, f64::max);
                (r.owned.len(), live, loading.len(), oldest)
            }
        };
        self.health.owned.store(owned, Ordering::Relaxed);
        self.health.ready.store(live, Ordering::Relaxed);
        metrics::gauge!(m::PARTITIONS_OWNED).set(owned as f64);
        metrics::gauge!(m::PARTITIONS_READY).set(live as f64);
        metrics::gauge!(m::PARTITIONS_LOADING).set(loading as f64);
        metrics::gauge!(m::HANDOVER_IN_PROGRESS_SECONDS).set(oldest);
    }

    /// Stops everything: every partition, then the membership (leaving the group).
    fn teardown(&mut self) {
        if let Some(mut running) = self.running.take() {
            // Dropping the senders releases a rebalance callback that waits on them.
            running.revocations.clear();
            for (_, owned) in std::mem::take(&mut running.owned) {
                match owned.stage {
                    Stage::Live { stop, arbiter } => {
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

    /// Removes a stopped partition and answers the revocations that waited for it.
    fn forget(&mut self, p: i32) {
        let Some(running) = self.running.as_mut() else { return };
        if let Some(Owned { stage: Stage::Stopping { arbiter } | Stage::Live { arbiter, .. }, .. }) = running.owned.remove(&p) {
            arbiter.stop();
        }
        self.settle_revocations();
    }

    /// Answers the revocations whose partitions have all stopped; exits if one of them asked to.
    fn settle_revocations(&mut self) {
        let Some(running) = self.running.as_mut() else { return };
        let owned = &running.owned;
        running.revocations.retain(|(partitions, done)| {
            let waiting = partitions.iter().any(|p| owned.contains_key(p));
            if !waiting {
                let _ = done.send(());
            }
            waiting
        });
        if running.revocations.is_empty() {
            if let Some(code) = self.exit_when_revoked.take() {
                self.teardown();
                System::current().stop_with_code(code);
            }
        }
    }

    fn export_stats(&mut self, ctx: &mut Context<Self>) {
        self.publish_health();
        let partitions: Vec<i32> = self.running.as_ref().map(|r| r.owned.keys().copied().collect()).unwrap_or_default();
        let msg = Stats { partitions: partitions.clone(), now_ms: now_ms() };
        let budget = self.config.ledger.budget_bytes.0;
        ctx.spawn(self.ledger.send(msg).into_actor(self).map(move |res, act, _| {
            let Ok(Ok(report)) = res else { return };
            let s = &report.stats;
            metrics::gauge!(m::LEDGER_BYTES).set(s.live_sst_bytes as f64);
            metrics::gauge!(m::LEDGER_IDS).set(s.ids_estimate as f64);
            metrics::gauge!(m::LEDGER_GENERATIONS).set(s.generations as f64);
            metrics::gauge!(m::LEDGER_FILTER_BYTES).set(s.filter_bytes as f64);
            metrics::gauge!(m::LEDGER_INDEX_BYTES).set(s.index_bytes as f64);
            metrics::gauge!(m::LEDGER_INDEX_OVERFLOWED_BUCKETS).set(s.index_overflowed_buckets as f64);
            metrics::counter!(m::LEDGER_DISK_LOOKUPS).absolute(s.disk_lookups);
            let now = Instant::now();
            let elapsed = act.last_stats_at.map(|t| now.duration_since(t)).unwrap_or_default();
            act.last_stats_at = Some(now);
            act.id_rate.observe(elapsed, s.ids_estimate);
            let fill = LedgerFill { budget_bytes: budget, bytes: s.live_sst_bytes, ids: s.ids_estimate };
            for (p, window) in &report.windows {
                let label = p.to_string();
                // No id held: no window to report (the ledger never reports one it does not hold).
                let Some(w) = window else { continue };
                metrics::gauge!(m::WINDOW_SECONDS, m::LABEL_PARTITION => label.clone()).set(w.as_secs_f64());
                let forecast = forecast_seconds(fill, act.id_rate.per_sec(), *w);
                metrics::gauge!(m::WINDOW_FORECAST_SECONDS, m::LABEL_PARTITION => label).set(forecast);
            }
        }));
        if let Some(running) = &self.running {
            let consumer = running.membership.consumer.clone();
            let topic = self.config.worker.input_topic.clone();
            actix_rt::task::spawn_blocking(move || export_lag(&consumer, &topic, &partitions));
        }
    }

    /// A failure a restart in process may mend: tear down, and start again after a backoff.
    fn restart(&mut self, ctx: &mut Context<Self>) {
        self.teardown();
        if self.restart_pending {
            return;
        }
        let now = Instant::now();
        self.restarts.retain(|t| now.duration_since(*t) < Duration::from_secs(600));
        self.restarts.push(now);
        if self.restarts.len() > 5 {
            tracing::error!("The pipeline failed more than 5 times in 10 minutes; exiting so the orchestrator restarts the worker.");
            System::current().stop_with_code(exit::FAILED);
            return;
        }
        let backoff = PIPELINE_RESTARTS.delay(self.restarts.len() as u32);
        self.restart_pending = true;
        ctx.run_later(backoff, |act, ctx| {
            act.restart_pending = false;
            if !act.shutting_down {
                act.start_pipeline(ctx);
            }
        });
    }
}

fn export_lag(consumer: &Input, topic: &str, partitions: &[i32]) {
    let Ok(positions) = consumer.position() else { return };
    for &p in partitions {
        let Some(Offset::Offset(pos)) = positions.find_partition(topic, p).map(|e| e.offset()) else { continue };
        if let Ok((_, high)) = consumer.fetch_watermarks(topic, p, Duration::from_secs(5)) {
            metrics::gauge!(m::CONSUMER_LAG, m::LABEL_PARTITION => p.to_string()).set((high - pos).max(0) as f64);
        }
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.start_pipeline(ctx);
        ctx.run_interval(Duration::from_secs(5), |act, ctx| act.export_stats(ctx));
        let snapshots = &self.config.snapshots;
        if snapshots.dir.is_some() && snapshots.interval_secs > 0 {
            ctx.run_interval(Duration::from_secs(snapshots.interval_secs), |_, ctx| {
                ctx.notify(TakeSnapshot { trigger: Trigger::Scheduled, reply: None });
            });
        }
    }
}

impl Handler<Assigned> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Assigned, ctx: &mut Self::Context) {
        if self.shutting_down {
            return;
        }
        let partitions: Vec<i32> = msg.partitions.iter().map(|(p, _)| *p).collect();
        tracing::info!(partitions = %PartitionSet(partitions), "The group assigned partitions; taking them over.");
        self.take_over(msg.partitions.into_iter().map(|(p, q)| (p, Some(q))).collect(), ctx);
        self.publish_health();
    }
}

impl Handler<Loaded> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Loaded, ctx: &mut Self::Context) {
        let p = msg.partition;
        let current = self.running.as_ref().and_then(|r| r.owned.get(&p)).is_some_and(|o| o.epoch == msg.epoch && matches!(o.stage, Stage::Loading { .. }));
        if !current {
            // Revoked (or torn down) while loading: the producer is dropped with the result.
            return;
        }
        let taken = match msg.result {
            Ok(taken) => taken,
            Err(e) => return self.fail_start(&e.context(format!("taking over partition {p}"))),
        };
        if self.group_mode() {
            let Some(running) = self.running.as_mut() else { return };
            let Some(owned) = running.owned.get_mut(&p) else { return };
            let Stage::Loading { queue } = &mut owned.stage else { return };
            let Some(queue) = queue.take() else { return };
            if let Err(e) = running.membership.resume(&self.config.worker.input_topic, p) {
                return self.fail_start(&e);
            }
            self.go_live(p, taken, queue, ctx.address().recipient());
        } else {
            if let Some(owned) = self.running.as_mut().and_then(|r| r.owned.get_mut(&p)) {
                owned.stage = Stage::Loaded { taken: Box::new(taken) };
            }
            if let Err(e) = self.assign_static_when_loaded(ctx.address().recipient()) {
                return self.fail_start(&e);
            }
        }
        // The window the partition has now, at once rather than at the next tick.
        self.export_stats(ctx);
    }
}

impl Handler<Revoking> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Revoking, _ctx: &mut Self::Context) {
        let reason = if msg.lost { "lost" } else { "revoked" };
        tracing::info!(partitions = %PartitionSet(msg.partitions.clone()), reason, "The group takes partitions away; stopping them.");
        let Some(running) = self.running.as_mut() else { return };
        for &p in &msg.partitions {
            let label = p.to_string();
            metrics::counter!(m::PARTITION_REVOCATIONS, m::LABEL_PARTITION => label.clone(), m::LABEL_REASON => reason).increment(1);
            // This worker no longer vouches for the partition: its per-partition gauges become
            // NaN ("no value"), which the alerts' min() and max() skip, instead of freezing at
            // their last value.
            for gauge in [m::WINDOW_SECONDS, m::WINDOW_FORECAST_SECONDS, m::CONSUMER_LAG] {
                metrics::gauge!(gauge, m::LABEL_PARTITION => label.clone()).set(f64::NAN);
            }
            let Some(owned) = running.owned.get_mut(&p) else { continue };
            match std::mem::replace(&mut owned.stage, Stage::Loading { queue: None }) {
                Stage::Live { stop, arbiter } => {
                    let _ = stop.send(true);
                    owned.stage = Stage::Stopping { arbiter };
                }
                Stage::Stopping { arbiter } => owned.stage = Stage::Stopping { arbiter },
                // Loading: the take-over's result is ignored when it arrives (its producer dropped).
                Stage::Loading { .. } | Stage::Loaded { .. } => {
                    running.owned.remove(&p);
                }
            }
        }
        if msg.lost {
            // Another member may already be publishing them: this worker's membership expired.
            tracing::error!("The group gave this worker's partitions away (its membership expired); exiting once they stopped.");
            metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_FENCED).increment(1);
            self.exit_when_revoked = Some(exit::FENCED);
        }
        running.revocations.push((msg.partitions, msg.done));
        // Answers at once when nothing was running.
        self.settle_revocations();
        self.publish_health();
    }
}

impl Handler<ConsumerFailed> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: ConsumerFailed, ctx: &mut Self::Context) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_KAFKA).increment(1);
        tracing::error!(error = %msg.error, "The input consumer failed; starting a new one after a backoff.");
        if !self.shutting_down {
            self.restart(ctx);
        }
    }
}

impl Handler<PartitionStopped> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: PartitionStopped, ctx: &mut Self::Context) {
        let p = msg.partition;
        let owner = self.running.as_ref().and_then(|r| r.owned.get(&p)).filter(|o| o.epoch == msg.epoch);
        let stopping = owner.is_some_and(|o| matches!(o.stage, Stage::Stopping { .. }));
        let current = owner.is_some();
        match msg.result {
            Err(e) if e.is_fenced() => {
                Fenced { partition: p, error: &e }.emit();
                self.teardown();
                System::current().stop_with_code(exit::FENCED);
                return;
            }
            Err(e) if !e.is_retryable() => {
                // A state a restart in process would only repeat (a corrupt or unreadable
                // ledger): exit for the orchestrator, which restarts the process or pages.
                PipelineFatal { partition: p, error: &e }.emit();
                self.teardown();
                System::current().stop_with_code(exit::FAILED);
                return;
            }
            // A pipeline torn down for a restart (several partitions fail together when the
            // brokers go away), ending before or after the restart took its partition over
            // again: the partition, if owned, is another pipeline's now.
            Err(e) if !current => {
                tracing::info!(partition = p, error = %e, "A partition pipeline that a restart replaced ended with an error.");
            }
            Ok(()) if !current => tracing::info!(partition = p, "A partition pipeline that a restart replaced ended."),
            Err(e) if !stopping && !self.shutting_down => {
                PipelineFailed { partition: p, error: &e }.emit();
                self.restart(ctx);
            }
            Err(e) => tracing::warn!(partition = p, error = %e, "A stopping partition's last batch failed; the next owner re-reads it."),
            Ok(()) => {}
        }
        if current {
            self.forget(p);
        }
        self.publish_health();
        if self.shutting_down && self.running.as_ref().is_none_or(|r| r.owned.is_empty()) {
            ctx.notify(Finish);
        }
    }
}

//! `Coordinator` supervises the worker: it checks the topics, recovers every owned partition from
//! the output topic before any input is read, starts one `Publisher` and one `PartitionConsumer`
//! per partition, exports the ledger's window, restarts the pipeline when a partition fails, and
//! drives graceful shutdown. It keeps one guarantee above all: no input is processed for a
//! partition until that partition's ledger has been repaired against the output.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use anyhow::{bail, Context as _};
use dedupe::config::Config;
use dedupe::metrics as m;
use dedupe::output::OutputWriter;
use dedupe::progress::Progress;
use dedupe::recovery::{now_ms, recover_partition, RecordFailure, RecoveryInput};
use dedupe::retry::Backoff;
use dedupe::snapshot::{prune, run_hook, SnapshotError, SnapshotSlot};
use dedupe::window::{forecast_seconds, IdRate, LedgerFill};
use rdkafka::consumer::{Consumer, DefaultConsumerContext, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use crate::actors::consumer::{PartitionConsumer, PartitionStopped, PipelineSettings};
use crate::actors::events::{Fenced, PipelineFailed, PipelineFatal, PipelineStartFailed};
use crate::actors::ledger::{AllProgress, CheckAndRecord, Flush, LedgerActor, Stats};
use crate::actors::producer::Publisher;

/// Waits before restarting a failed pipeline: 2, 4, 8, 16, 32 s for the restarts within ten
/// minutes (after five the worker exits instead).
const PIPELINE_RESTARTS: Backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(32), 5);

/// Liveness and readiness, shared with the HTTP endpoints.
#[derive(Default)]
pub struct Health {
    pub owned: AtomicUsize,
    pub ready: AtomicUsize,
    pub stopping: AtomicBool,
}

impl Health {
    pub fn is_ready(&self) -> bool {
        let owned = self.owned.load(Ordering::Relaxed);
        owned > 0 && self.ready.load(Ordering::Relaxed) == owned && !self.stopping.load(Ordering::Relaxed)
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
    /// Another worker took over a partition (this one was fenced).
    pub const FENCED: i32 = 3;
}

type Input = StreamConsumer<DefaultConsumerContext>;

/// One running generation of the pipeline: torn down whole when a partition fails.
struct Running {
    consumer: Arc<Input>,
    stop: watch::Sender<bool>,
    arbiters: Vec<Arbiter>,
    poller: tokio::task::JoinHandle<()>,
    live: usize,
}

pub struct Coordinator {
    config: Arc<Config>,
    partitions: Vec<i32>,
    ledger: Addr<LedgerActor>,
    health: Arc<Health>,
    options: RunOptions,
    running: Option<Running>,
    restarts: Vec<Instant>,
    shutting_down: bool,
    last_stats_at: Option<Instant>,
    id_rate: IdRate,
    /// A snapshot (checkpoint, prune, hook) is under way: one at a time.
    snapshot_running: bool,
}

impl Coordinator {
    pub fn new(
        config: Arc<Config>,
        partitions: Vec<i32>,
        ledger: Addr<LedgerActor>,
        health: Arc<Health>,
        options: RunOptions,
    ) -> Self {
        health.owned.store(partitions.len(), Ordering::Relaxed);
        metrics::gauge!(m::PARTITIONS_OWNED).set(partitions.len() as f64);
        metrics::gauge!(m::LEDGER_BUDGET_BYTES).set(config.ledger.budget_bytes.0 as f64);
        Self {
            config,
            partitions,
            ledger,
            health,
            options,
            running: None,
            restarts: Vec::new(),
            shutting_down: false,
            last_stats_at: None,
            id_rate: IdRate::default(),
            snapshot_running: false,
        }
    }

    fn start_pipeline(&mut self, ctx: &mut Context<Self>) {
        let fut = start_pipeline(
            self.config.clone(),
            self.partitions.clone(),
            self.ledger.clone(),
            self.options,
            ctx.address().recipient(),
        );
        ctx.wait(fut.into_actor(self).map(|result, act, _ctx| match result {
            Ok(running) => {
                act.health.ready.store(running.live, Ordering::Relaxed);
                metrics::gauge!(m::PARTITIONS_READY).set(running.live as f64);
                tracing::info!(partitions = %dedupe::config::PartitionSet(act.partitions.clone()), "Every owned partition is recovered; processing input.");
                act.running = Some(running);
            }
            Err(e) => {
                PipelineStartFailed { error: &e }.emit();
                System::current().stop_with_code(exit::FAILED);
            }
        }));
    }

    fn teardown(&mut self) {
        if let Some(running) = self.running.take() {
            let _ = running.stop.send(true);
            running.poller.abort();
            for a in running.arbiters {
                a.stop();
            }
            drop(running.consumer);
        }
        self.health.ready.store(0, Ordering::Relaxed);
        metrics::gauge!(m::PARTITIONS_READY).set(0.0);
    }

    fn export_stats(&mut self, ctx: &mut Context<Self>) {
        let partitions = self.partitions.clone();
        let msg = Stats { partitions, now_ms: now_ms() };
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
            let consumer = running.consumer.clone();
            let topic = self.config.worker.input_topic.clone();
            let partitions = self.partitions.clone();
            actix_rt::task::spawn_blocking(move || export_lag(&consumer, &topic, &partitions));
        }
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
                ctx.notify(TakeSnapshot { reply: None });
            });
        }
    }
}

/// Take a ledger snapshot now: checkpoint, prune to `snapshots.keep`, run the hook. One at a
/// time: a request while one is under way is refused with [`SnapshotError::Busy`] (a scheduled
/// one is skipped), so no prune ever runs under a running hook. Failures are counted and logged
/// and never stop the pipeline.
#[derive(Message)]
#[rtype(result = "()")]
pub struct TakeSnapshot {
    /// Where to send the snapshot's directory, or why there is none.
    pub reply: Option<tokio::sync::oneshot::Sender<Result<PathBuf, SnapshotError>>>,
}

impl Handler<TakeSnapshot> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: TakeSnapshot, ctx: &mut Self::Context) {
        fn answer(reply: Option<tokio::sync::oneshot::Sender<Result<PathBuf, SnapshotError>>>, result: Result<PathBuf, SnapshotError>) {
            if let Some(reply) = reply {
                let _ = reply.send(result);
            }
        }
        let snapshots = self.config.snapshots.clone();
        let Some(root) = snapshots.dir.clone() else {
            return answer(msg.reply, Err(SnapshotError::NotConfigured));
        };
        if self.snapshot_running {
            tracing::info!("A snapshot is already under way; this request is refused.");
            return answer(msg.reply, Err(SnapshotError::Busy));
        }
        self.snapshot_running = true;
        let ledger = self.ledger.clone();
        let fut = async move {
            let slot = SnapshotSlot::reserve(&root)?;
            let checkpoint = ledger.send(crate::actors::ledger::Checkpoint { dir: slot.partial.clone() }).await;
            let progress = match checkpoint {
                Ok(Ok(progress)) => progress,
                Ok(Err(source)) => {
                    slot.discard();
                    return Err(SnapshotError::Checkpoint { dir: slot.dir, source });
                }
                Err(_mailbox) => {
                    slot.discard();
                    return Err(SnapshotError::Stopping);
                }
            };
            slot.publish()?;
            let partitions: Vec<u32> = progress.keys().copied().collect();
            let dir = slot.dir.clone();
            actix_rt::task::spawn_blocking(move || -> Result<(), SnapshotError> {
                prune(&root, snapshots.keep)?;
                if let Some(hook) = &snapshots.hook {
                    let timeout = Duration::from_secs(snapshots.hook_timeout_secs);
                    run_hook(hook, &dir, &partitions, &snapshots.hook_env, timeout)?;
                }
                Ok(())
            })
            .await
            .map_err(|_join| SnapshotError::Stopping)??;
            Ok::<_, SnapshotError>(slot.dir)
        };
        ctx.spawn(fut.into_actor(self).map(|result, act, _| {
            act.snapshot_running = false;
            match &result {
                Ok(dir) => {
                    metrics::gauge!(m::SNAPSHOT_LAST_SUCCESS).set(now_ms() as f64 / 1000.0);
                    tracing::info!(dir = %dir.display(), "Took a ledger snapshot.");
                }
                Err(SnapshotError::Stopping) => tracing::info!("A ledger snapshot was abandoned: the worker is stopping."),
                Err(e) => {
                    metrics::counter!(m::SNAPSHOT_FAILURES, "stage" => e.stage()).increment(1);
                    tracing::error!("A ledger snapshot failed; the pipeline goes on: {e}");
                }
            }
            answer(msg.reply, result);
        }));
    }
}

impl Handler<PartitionStopped> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: PartitionStopped, ctx: &mut Self::Context) {
        if let Some(r) = &mut self.running {
            r.live = r.live.saturating_sub(1);
            self.health.ready.store(r.live, Ordering::Relaxed);
        }
        match msg.result {
            Ok(()) => {}
            Err(e) if e.is_fenced() => {
                Fenced { partition: msg.partition, error: &e }.emit();
                self.teardown();
                System::current().stop_with_code(exit::FENCED);
            }
            Err(e) if !e.is_retryable() => {
                // A state a restart in process would only repeat (a corrupt or unreadable
                // ledger): exit for the orchestrator, which restarts the process or pages.
                PipelineFatal { partition: msg.partition, error: &e }.emit();
                self.teardown();
                System::current().stop_with_code(exit::FAILED);
            }
            Err(e) => {
                PipelineFailed { partition: msg.partition, error: &e }.emit();
                self.teardown();
                let now = Instant::now();
                self.restarts.retain(|t| now.duration_since(*t) < Duration::from_secs(600));
                self.restarts.push(now);
                if self.restarts.len() > 5 {
                    tracing::error!("The pipeline failed more than 5 times in 10 minutes; exiting so the orchestrator restarts the worker.");
                    System::current().stop_with_code(exit::FAILED);
                    return;
                }
                let backoff = PIPELINE_RESTARTS.delay(self.restarts.len() as u32);
                ctx.run_later(backoff, |act, ctx| {
                    if !act.shutting_down {
                        act.start_pipeline(ctx);
                    }
                });
            }
        }
        if self.shutting_down && self.running.as_ref().is_none_or(|r| r.live == 0) {
            ctx.notify(Finish);
        }
    }
}

/// Stop gracefully: finish the batch in flight, flush the ledger, exit 0.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

#[derive(Message)]
#[rtype(result = "()")]
struct Finish;

impl Handler<Shutdown> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Self::Context) {
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        self.health.stopping.store(true, Ordering::Relaxed);
        tracing::info!("Shutting down: finishing the batches in flight.");
        match &self.running {
            Some(r) if r.live > 0 => {
                let _ = r.stop.send(true);
                let timeout = Duration::from_millis(self.config.worker.shutdown_timeout_ms);
                ctx.run_later(timeout, |_, ctx| {
                    tracing::warn!("Shutdown timed out; exiting with batches in flight (their transactions are aborted when the next worker starts).");
                    ctx.notify(Finish);
                });
            }
            _ => ctx.notify(Finish),
        }
    }
}

impl Handler<Finish> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: Finish, ctx: &mut Self::Context) {
        self.teardown();
        ctx.spawn(self.ledger.send(Flush).into_actor(self).map(|res, _, _| {
            match res {
                Ok(Ok(())) => {
                    tracing::info!("The ledger is flushed; exiting.");
                    System::current().stop_with_code(exit::OK)
                }
                Ok(Err(e)) => {
                    tracing::error!("Flushing the ledger failed: {e}");
                    System::current().stop_with_code(exit::FAILED)
                }
                Err(e) => {
                    tracing::error!("The ledger actor is gone: {e}");
                    System::current().stop_with_code(exit::FAILED)
                }
            }
        }));
    }
}

/// The consumer group's committed offset for one input partition (committed with the output
/// transactions), retrying while the group coordinator is not yet known or offsets are unstable.
fn committed_offset(consumer: &Input, topic: &str, partition: i32) -> anyhow::Result<Option<i64>> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let deadline = Instant::now() + Duration::from_secs(120);
    let got = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Ok(got) => break got,
            Err(e) if Instant::now() < deadline && is_retriable(&e) => {
                tracing::debug!(partition, error = %e, "Reading the committed offset failed; retrying.");
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => return Err(e).with_context(|| format!("reading the committed offset of input partition {partition}")),
        }
    };
    Ok(got.find_partition(topic, partition).and_then(|e| match e.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }))
}

/// Errors that go away by themselves: the coordinator moved or is loading, a timeout.
fn is_retriable(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::NotCoordinator
                | C::CoordinatorNotAvailable
                | C::CoordinatorLoadInProgress
                | C::RequestTimedOut
                | C::OperationTimedOut
                | C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
        )
    )
}

/// Recovers every partition (in parallel), then starts the publishers and consumers.
async fn start_pipeline(
    config: Arc<Config>,
    partitions: Vec<i32>,
    ledger: Addr<LedgerActor>,
    options: RunOptions,
    report_to: Recipient<PartitionStopped>,
) -> anyhow::Result<Running> {
    let accept_ledger_ahead = options.accept_ledger_ahead;
    let w = &config.worker;
    let consumer: Input = dedupe::kafka::client_config(&config.kafka)
        .set("group.id", &w.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false")
        .set("queued.max.messages.kbytes", "32768")
        .set("fetch.wait.max.ms", "10")
        .create()
        .context("creating the input consumer")?;
    let consumer = Arc::new(consumer);
    let group = Arc::new(consumer.group_metadata().context("the input consumer has no group metadata")?);

    let progress = ledger.send(AllProgress).await?.context("reading the ledger's progress records")?;

    // Recover every partition in parallel: fence older producers, replay the output tail.
    let mut tasks = Vec::new();
    for &p in &partitions {
        let config = config.clone();
        let ledger = ledger.clone();
        let ledger_progress = match progress.get(&(p as u32)) {
            Some(bytes) => Some(Progress::decode(bytes).with_context(|| format!("partition {p}'s progress record"))?),
            None => None,
        };
        let consumer = consumer.clone();
        tasks.push(actix_rt::task::spawn_blocking(move || -> anyhow::Result<(i32, OutputWriter, dedupe::recovery::RecoveryReport)> {
            let started = Instant::now();
            let w = &config.worker;
            // Fence first: init_transactions aborts an older producer's open transaction, whose
            // pending offsets would otherwise keep the group's committed offset unstable.
            let writer = OutputWriter::open(&config.kafka, &w.output_topic, p, w.dead_letter_topic.as_deref(), w.transaction_timeout_ms)
                .with_context(|| format!("opening the output producer of partition {p}"))?;
            let committed_input = committed_offset(&consumer, &w.input_topic, p)?;
            let input = RecoveryInput {
                kafka: &config.kafka,
                output_topic: &w.output_topic,
                partition: p,
                id_source: &w.id_source,
                ledger_progress,
                committed_input,
                accept_ledger_ahead,
                timeout: Duration::from_secs(3600),
            };
            let mut record = |items: &[(dedupe::identity::LedgerKey, i64)], progress: Progress| -> Result<(), RecordFailure> {
                fail::fail_point!("recovery-mid-replay", !items.is_empty(), |_| {
                    eprintln!("failpoint recovery-mid-replay: exiting");
                    std::process::exit(86)
                });
                futures::executor::block_on(ledger.send(CheckAndRecord { partition: p, items: items.to_vec(), progress }))
                    .map_err(|_mailbox| RecordFailure::LedgerGone)??;
                Ok(())
            };
            let bar = indicatif::ProgressBar::hidden();
            let mut on_progress = |done: u64, at: i64, end: i64| {
                if bar.is_hidden() && end - at > 100_000 {
                    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                    bar.set_style(indicatif::ProgressStyle::with_template("recovering partition {msg} {bar:40} {pos}/{len}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
                    bar.set_message(p.to_string());
                }
                bar.set_length(end.max(0) as u64);
                bar.set_position(at.max(0) as u64);
                let _ = done;
            };
            let report = recover_partition(&input, &mut record, &mut on_progress)?;
            bar.finish_and_clear();
            let label = p.to_string();
            metrics::counter!(m::RECOVERY_REPLAYED, m::LABEL_PARTITION => label.clone()).increment(report.replayed_records);
            metrics::gauge!(m::RECOVERY_SECONDS, m::LABEL_PARTITION => label).set(started.elapsed().as_secs_f64());
            tracing::info!(
                partition = p,
                replayed = report.replayed_records,
                from = report.replayed_from,
                to = report.replayed_to,
                resume_input_at = report.resume_input_at,
                seconds = started.elapsed().as_secs_f64(),
                "Recovered the partition from the output topic."
            );
            Ok((p, writer, report))
        }));
    }
    let mut recovered = Vec::new();
    for t in tasks {
        recovered.push(t.await??);
    }

    // Publishers, each on its own thread; then split queues and assign at the resume offsets.
    let settings = Arc::new(PipelineSettings {
        id_source: w.id_source.clone(),
        unkeyed_policy: w.unkeyed_policy,
        batch_max_records: w.batch_max_records,
        batch_max_bytes: w.batch_max_bytes.0 as usize,
        batch_linger: Duration::from_millis(w.batch_linger_ms),
        passthrough: options.passthrough,
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tpl = TopicPartitionList::new();
    let mut arbiters = Vec::new();
    let mut starts = Vec::new();
    for (p, writer, report) in recovered {
        let queue = consumer
            .split_partition_queue(&w.input_topic, p)
            .with_context(|| format!("splitting the queue of input partition {p}"))?;
        let offset = report.resume_input_at.map(Offset::Offset).unwrap_or(Offset::Beginning);
        tpl.add_partition_offset(&w.input_topic, p, offset)?;
        let arbiter = Arbiter::new();
        let publisher = Publisher::new(writer, w.input_topic.clone(), p, group.clone());
        let publisher = Publisher::start_in_arbiter(&arbiter.handle(), move |_| publisher);
        arbiters.push(arbiter);
        starts.push((p, queue, publisher, report.progress));
    }
    consumer.assign(&tpl).context("assigning the input partitions")?;
    let poller = {
        let consumer = consumer.clone();
        actix_rt::spawn(async move {
            // Every owned partition is split off; the main queue only carries errors and events.
            loop {
                match consumer.recv().await {
                    Ok(_) => tracing::warn!("A record arrived on the main queue of the input consumer; it is not processed here."),
                    Err(e) => {
                        tracing::warn!(error = %e, "The input consumer reported an error.");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        })
    };
    let live = starts.len();
    for (p, queue, publisher, progress) in starts {
        PartitionConsumer {
            partition: p,
            queue: Some(queue),
            ledger: ledger.clone(),
            publisher,
            settings: settings.clone(),
            progress,
            stop: stop_rx.clone(),
            report_to: report_to.clone(),
        }
        .start();
    }
    if live == 0 {
        bail!("no partition to process");
    }
    Ok(Running { consumer, stop: stop_tx, arbiters, poller, live })
}

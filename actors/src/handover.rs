//! Taking over one input partition, at start or when the group assigns it: fence the previous
//! owner, bring the ledger up to date for the partition, and only then let its records flow.
//!
//! Runs on a blocking thread: every step blocks.
//! 1. `init_transactions` with the partition's `transactional.id` fences whichever producer
//!    wrote the partition before (a worker that has not noticed it lost the partition, paused or
//!    cut off from the network) and aborts its open transaction; its next commit fails as fenced.
//! 2. The group's committed input offset is read (stable now that nothing is pending).
//! 3. Recovery replays what the ledger lacks, from the id changelog (see `dedupe::recovery`).
//!    A partition the ledger holds nothing for loads every id published within
//!    `worker.handover_min_window_secs` (by default the promised window) before it is handed
//!    over; older ids back-fill on this thread while the partition runs, and
//!    `dedupe_window_seconds` only ever reports what is held.
//!
//! The load writes into the ledger through its own handle on this thread, not through the ledger
//! actor: its work (sorting and writing runs of ids) must not occupy the actor's threads, which
//! every live partition's batches go through. The ledger serializes on its own lock.
//!
//! A take-over stops at its next record when its `stop` flag is set (the partition was taken away
//! again, or the worker is stopping).

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use dedupe::config::Config;
use dedupe::ledger::{Ledger, LedgerError};
use dedupe::output::{OutputTopics, OutputWriter, PublishError};
use dedupe::progress::{Progress, ProgressFormatError};
use dedupe::recovery::{
    backfill, recover_partition, Backfill, RecoveryError, RecoveryInput, RecoveryReport,
};
use metrics::Counter;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use crate::events::coordinator::BackfillEnded;
use crate::events::{self, BackfillStopped};
use crate::membership::Input;

/// A partition ready to process: its fenced producer and what recovery found.
pub struct TakenOver {
    pub writer: OutputWriter,
    pub report: RecoveryReport,
}

/// Why a partition could not be taken over.
#[derive(Debug, thiserror::Error)]
pub enum TakeOverError {
    #[error("reading the ledger's progress records: {source}")]
    ReadProgress { source: LedgerError },
    #[error("the ledger actor stopped before it answered")]
    LedgerGone,
    #[error("partition {partition}'s progress record: {source}")]
    Progress {
        partition: i32,
        source: ProgressFormatError,
    },
    #[error("opening the output producer of partition {partition}: {source}")]
    OpenProducer {
        partition: i32,
        source: PublishError,
    },
    #[error("reading the committed offset of input partition {partition}: {source}")]
    CommittedOffset { partition: i32, source: KafkaError },
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
}

impl TakeOverError {
    /// Whether taking the partition over again may succeed (the brokers or the group coordinator
    /// were away), as opposed to a state another attempt meets again (the ledger ahead of the
    /// output, a progress record or changelog it cannot read, a failing ledger).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::ReadProgress { source } => source.is_retryable(),
            Self::LedgerGone | Self::OpenProducer { .. } | Self::CommittedOffset { .. } => true,
            Self::Progress { .. } => false,
            Self::Recovery(e) => e.is_retryable(),
        }
    }
}

/// One partition to take over, and what taking it over needs.
pub struct TakeOver<'a> {
    pub config: &'a Config,
    pub consumer: &'a Input,
    /// The worker's ledger (see the module docs).
    pub ledger: &'a Ledger,
    pub partition: i32,
    /// The ledger's progress record of the partition, if it has one.
    pub ledger_progress: Option<Progress>,
    /// Start even when the ledger is ahead of the output topic (`--accept-ledger-ahead`).
    pub accept_ledger_ahead: bool,
    /// Set when the take-over should stop.
    pub stop: &'a AtomicBool,
}

impl TakeOver<'_> {
    /// Fences the partition's previous producer and loads what the ledger lacks; hands the
    /// partition to `ready` as soon as it may run, then loads the older ids that were left to
    /// back-fill.
    pub fn run(&self, ready: impl FnOnce(TakenOver)) -> Result<(), TakeOverError> {
        let p = self.partition;
        let started = Instant::now();
        let w = &self.config.worker;
        let changelog = w.changelog_topic();
        if self.stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(RecoveryError::Stopped { partition: p }.into());
        }
        // The tests hold a take-over here (`sleep(MS)`), as a slow `init_transactions` would, so
        // that its partition can be taken away and given back meanwhile.
        fail::fail_point!("takeover-before-fence");
        // 1. Fence first: init_transactions aborts an older producer's open transaction, whose
        // pending offsets would otherwise keep the group's committed offset unstable.
        let audit = w.audit_topic();
        let topics = OutputTopics {
            output: &w.output_topic,
            changelog: &changelog,
            dead_letter: w.dead_letter_topic.as_deref(),
            audit: audit.as_deref(),
        };
        let writer = OutputWriter::open(&self.config.kafka, &topics, p, w.transaction_timeout_ms)
            .map_err(|source| TakeOverError::OpenProducer {
            partition: p,
            source,
        })?;
        let fenced_secs = started.elapsed().as_secs_f64();
        // 2. The committed input offset, stable now that nothing is pending.
        let committed_input = committed_offset(self.consumer, &w.input_topic, p)?;
        let committed_secs = started.elapsed().as_secs_f64();
        // 3. Replay what the ledger lacks.
        let input = RecoveryInput {
            kafka: &self.config.kafka,
            output_topic: &w.output_topic,
            changelog_topic: &changelog,
            partition: p,
            id_source: &w.id_source,
            ledger_progress: self.ledger_progress,
            committed_input,
            accept_ledger_ahead: self.accept_ledger_ahead,
            ready_window: w.handover_window(),
            timeout: Duration::from_secs(3600),
            stop: self.stop,
        };
        let mut load = LoadProgress::new(p);
        let (report, rest) = recover_partition(&input, self.ledger, &mut |ids, done, total| {
            load.update(ids, done, total)
        })?;
        load.finish();
        events::coordinator::TakenOver {
            report: &report,
            fenced_secs,
            committed_secs,
            seconds: started.elapsed().as_secs_f64(),
            backfill: !rest.is_empty(),
        }
        .emit();
        ready(TakenOver { writer, report });
        if !rest.is_empty() {
            run_backfill(&input, self.ledger, rest);
        }
        Ok(())
    }
}

/// How a partition's load is going: the ids-loaded counter, and a progress bar on stderr for a
/// load of more than a thousand records.
struct LoadProgress {
    label: String,
    ids_loaded: Counter,
    loaded: u64,
    bar: indicatif::ProgressBar,
}

impl LoadProgress {
    fn new(p: i32) -> Self {
        let label = p.to_string();
        let ids_loaded = events::coordinator::ids_loaded(p);
        Self {
            label,
            ids_loaded,
            loaded: 0,
            bar: indicatif::ProgressBar::hidden(),
        }
    }

    /// `ids` loaded so far; `done` of `total` records read.
    fn update(&mut self, ids: u64, done: i64, total: i64) {
        self.ids_loaded.increment(ids.saturating_sub(self.loaded));
        self.loaded = ids;
        let bar = &self.bar;
        if bar.is_hidden() && total > 1000 {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "loading partition {msg} {bar:40} {pos}/{len} records",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_message(self.label.clone());
        }
        bar.set_length(total.max(0) as u64);
        bar.set_position(done.max(0) as u64);
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Loads the ids older than the handover window that a new partition left, counting them; its
/// end is logged, never fatal (the window is what was loaded, and grows with new traffic).
fn run_backfill(input: &RecoveryInput<'_>, ledger: &Ledger, rest: Backfill) {
    let p = input.partition;
    let ids_loaded = events::coordinator::ids_loaded(p);
    let backfill_started = Instant::now();
    // The back-fill counts its own ids from zero.
    let mut loaded_before = 0;
    let mut on_backfill = |ids: u64, _done: i64, _total: i64| {
        ids_loaded.increment(ids.saturating_sub(loaded_before));
        loaded_before = ids;
    };
    match backfill(input, ledger, rest, &mut on_backfill) {
        Ok(ids) => {
            ids_loaded.increment(ids.saturating_sub(loaded_before));
            BackfillEnded {
                partition: p,
                ids: Some(ids),
                seconds: backfill_started.elapsed().as_secs_f64(),
            }
            .emit();
        }
        Err(RecoveryError::Stopped { .. }) => {
            BackfillEnded {
                partition: p,
                ids: None,
                seconds: backfill_started.elapsed().as_secs_f64(),
            }
            .emit();
        }
        Err(error) => BackfillStopped {
            partition: p,
            error: &error,
        }
        .emit(),
    }
}

/// The consumer group's committed offset for one input partition (committed with the output
/// transactions), retrying while the group coordinator is not yet known or offsets are unstable.
fn committed_offset(
    consumer: &Input,
    topic: &str,
    partition: i32,
) -> Result<Option<i64>, TakeOverError> {
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
            Err(source) => return Err(TakeOverError::CommittedOffset { partition, source }),
        }
    };
    Ok(got
        .find_partition(topic, partition)
        .and_then(|e| match e.offset() {
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
                | C::UnstableOffsetCommit
        )
    )
}

/// The ledger's progress record of `partition`, decoded.
pub fn decode_progress(
    bytes: Option<&[u8]>,
    partition: i32,
) -> Result<Option<Progress>, TakeOverError> {
    bytes
        .map(|bytes| {
            Progress::decode(bytes).map_err(|source| TakeOverError::Progress { partition, source })
        })
        .transpose()
}

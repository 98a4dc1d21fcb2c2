//! The coordinator's events: partitions assigned, live, taken over again, revoked; the worker's
//! gauges of what it owns; the ledger's figures; the promised window and whether the budget holds
//! it; and the worker giving up.

use std::path::Path;

use dedupe::ledger::LedgerStats;
use dedupe::metrics as m;
use dedupe::recovery::RecoveryReport;

use crate::reasons::{GiveUp, Retake};

/// The ledger's disk budget, set once at start.
pub struct LedgerBudget {
    pub bytes: u64,
}

impl LedgerBudget {
    pub fn emit(&self) {
        metrics::gauge!(m::LEDGER_BUDGET_BYTES).set(self.bytes as f64);
    }
}

/// The window the pipeline promises (`worker.promised_window_secs`), set once at start.
pub struct PromiseDeclared<'a> {
    pub input_topic: &'a str,
    pub secs: u64,
}

impl PromiseDeclared<'_> {
    pub fn emit(&self) {
        metrics::gauge!(m::PROMISED_WINDOW_SECONDS, m::LABEL_INPUT_TOPIC => self.input_topic.to_string())
            .set(self.secs as f64);
    }
}

/// The retention limit (`ledger.max_window_secs`), set once at start when there is one.
pub struct RetentionLimit {
    pub secs: u64,
}

impl RetentionLimit {
    pub fn emit(&self) {
        metrics::gauge!(m::RETENTION_LIMIT_SECONDS).set(self.secs as f64);
    }
}

/// What the retention limit's periodic pass did to the ledger (see `dedupe::ledger::Expired`).
pub struct LimitApplied {
    pub expired: dedupe::ledger::Expired,
    pub limit_secs: u64,
}

impl LimitApplied {
    pub fn emit(&self) {
        let dropped = self.expired.dropped;
        if dropped > 0 {
            metrics::counter!(m::EXPIRED_GENERATIONS).increment(dropped as u64);
            tracing::info!(
                event = "LimitApplied",
                generations = dropped,
                limit_secs = self.limit_secs,
                "Dropped ledger generations whose newest id is past the retention limit."
            );
        }
    }
}

/// The retention limit's periodic pass failed (RocksDB could not seal or drop a generation): the
/// ledger keeps what it holds, lookups still apply the limit exactly, and the next pass tries
/// again.
pub struct LimitFailed<'a> {
    pub error: &'a dedupe::ledger::LedgerError,
}

impl LimitFailed<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_RETENTION).increment(1);
        tracing::warn!(event = "LimitFailed", error = %self.error, "Could not apply the retention limit to the ledger; the next pass tries again (lookups apply the limit all the same).");
    }
}

/// Whether the ledger's budget holds the promised window at the last hour's id rate, exported
/// every few seconds; logged when the answer changes (see `dedupe::window::budget_holds_promise`).
pub struct PromiseHeld {
    pub holds: bool,
    /// The answer changed with this reading (the first answer counts as a change only when the
    /// budget does not hold the promise).
    pub changed: bool,
    pub ids_per_sec: f64,
    pub promise_secs: u64,
    pub budget_bytes: u64,
}

impl PromiseHeld {
    pub fn emit(&self) {
        metrics::gauge!(m::BUDGET_HOLDS_PROMISE).set(if self.holds { 1.0 } else { 0.0 });
        if !self.changed {
            return;
        }
        if self.holds {
            tracing::info!(
                event = "PromiseHeld",
                ids_per_sec = self.ids_per_sec,
                promise_secs = self.promise_secs,
                budget_bytes = self.budget_bytes,
                "The ledger's budget holds the promised window again at the last hour's id rate."
            );
        } else {
            tracing::warn!(
                event = "PromiseHeld",
                ids_per_sec = self.ids_per_sec,
                promise_secs = self.promise_secs,
                budget_bytes = self.budget_bytes,
                "The ledger's budget cannot hold the promised window at the last hour's id rate: once the ledger is full, the window will be shorter than the promise. Raise ledger.budget_bytes or spread the ids over more workers (docs/operations.md, The promise, and what it costs)."
            );
        }
    }
}

/// How many partitions the worker owns, has live and is still loading, and how long its oldest
/// handover in progress has been under way.
pub struct PartitionCounts {
    pub owned: usize,
    pub live: usize,
    pub loading: usize,
    pub oldest_handover_secs: f64,
}

impl PartitionCounts {
    pub fn emit(&self) {
        metrics::gauge!(m::PARTITIONS_OWNED).set(self.owned as f64);
        metrics::gauge!(m::PARTITIONS_READY).set(self.live as f64);
        metrics::gauge!(m::PARTITIONS_LOADING).set(self.loading as f64);
        metrics::gauge!(m::HANDOVER_IN_PROGRESS_SECONDS).set(self.oldest_handover_secs);
    }
}

/// The ledger's figures, exported every few seconds.
pub struct LedgerFigures<'a> {
    pub stats: &'a LedgerStats,
}

impl LedgerFigures<'_> {
    pub fn emit(&self) {
        let s = self.stats;
        metrics::gauge!(m::LEDGER_BYTES).set(s.live_sst_bytes as f64);
        metrics::gauge!(m::LEDGER_IDS).set(s.ids_estimate as f64);
        metrics::gauge!(m::LEDGER_GENERATIONS).set(s.generations as f64);
        metrics::gauge!(m::LEDGER_FILTER_BYTES).set(s.filter_bytes as f64);
        metrics::gauge!(m::LEDGER_INDEX_BYTES).set(s.index_bytes as f64);
        metrics::gauge!(m::LEDGER_INDEX_OVERFLOWED_BUCKETS).set(s.index_overflowed_buckets as f64);
        metrics::counter!(m::LEDGER_DISK_LOOKUPS).absolute(s.disk_lookups);
    }
}

/// A partition's window and what it will be once the ledger is full.
pub struct PartitionWindow {
    pub partition: i32,
    pub window_secs: f64,
    pub forecast_secs: f64,
}

impl PartitionWindow {
    pub fn emit(&self) {
        let label = self.partition.to_string();
        metrics::gauge!(m::WINDOW_SECONDS, m::LABEL_PARTITION => label.clone())
            .set(self.window_secs);
        metrics::gauge!(m::WINDOW_FORECAST_SECONDS, m::LABEL_PARTITION => label)
            .set(self.forecast_secs);
    }
}

/// Whether only the retention limit bounds a partition's window (1), or the budget may (0): the
/// page on a window under its promise is not for a window the limit alone keeps there.
pub struct WindowLimited {
    pub partition: i32,
    pub limited: bool,
}

impl WindowLimited {
    pub fn emit(&self) {
        metrics::gauge!(m::WINDOW_LIMITED, m::LABEL_PARTITION => self.partition.to_string())
            .set(if self.limited { 1.0 } else { 0.0 });
    }
}

/// Input records of a partition not yet processed.
pub struct ConsumerLag {
    pub partition: i32,
    pub records: i64,
}

impl ConsumerLag {
    pub fn emit(&self) {
        metrics::gauge!(m::CONSUMER_LAG, m::LABEL_PARTITION => self.partition.to_string())
            .set(self.records.max(0) as f64);
    }
}

/// The group assigned a partition to this worker; its take-over starts.
pub struct PartitionAssigned {
    pub partition: i32,
}

impl PartitionAssigned {
    pub fn emit(&self) {
        metrics::counter!(m::PARTITION_ASSIGNMENTS, m::LABEL_PARTITION => self.partition.to_string())
            .increment(1);
    }
}

/// A partition is live: its handover took `seconds` from its assignment.
pub struct PartitionLive {
    pub partition: i32,
    pub seconds: f64,
}

impl PartitionLive {
    pub fn emit(&self) {
        metrics::gauge!(m::HANDOVER_SECONDS, m::LABEL_PARTITION => self.partition.to_string())
            .set(self.seconds);
        tracing::info!(
            event = "PartitionLive",
            partition = self.partition,
            seconds = self.seconds,
            "The partition is live: processing input."
        );
    }
}

/// A partition is taken over again, in process, after `delay_ms`.
pub struct PartitionRetaken {
    pub partition: i32,
    pub why: Retake,
    pub delay_ms: u64,
}

impl PartitionRetaken {
    pub fn emit(&self) {
        let reason = match self.why {
            Retake::Failed => m::REASON_FAILED,
            Retake::Fenced => m::REASON_FENCED,
            Retake::Hung => m::REASON_HUNG,
        };
        metrics::counter!(m::PARTITION_RETAKES, m::LABEL_PARTITION => self.partition.to_string(), m::LABEL_REASON => reason)
            .increment(1);
        tracing::warn!(
            event = "PartitionRetaken",
            partition = self.partition,
            reason,
            delay_ms = self.delay_ms,
            "Taking the partition over again, in process."
        );
    }
}

/// The group takes a partition away: handed over cleanly (`lost` false) or given away. This
/// worker stops vouching for it: its per-partition gauges become NaN ("no value"), which the
/// alerts' min() and max() skip, instead of freezing at their last value.
pub struct PartitionRevoked {
    pub partition: i32,
    pub lost: bool,
}

impl PartitionRevoked {
    pub fn reason(lost: bool) -> &'static str {
        if lost {
            m::REASON_LOST
        } else {
            m::REASON_REVOKED
        }
    }

    pub fn emit(&self) {
        let label = self.partition.to_string();
        metrics::counter!(m::PARTITION_REVOCATIONS, m::LABEL_PARTITION => label.clone(), m::LABEL_REASON => Self::reason(self.lost))
            .increment(1);
        for gauge in [
            m::WINDOW_SECONDS,
            m::WINDOW_FORECAST_SECONDS,
            m::CONSUMER_LAG,
        ] {
            metrics::gauge!(gauge, m::LABEL_PARTITION => label.clone()).set(f64::NAN);
        }
    }
}

/// The worker gives up and exits, for the orchestrator to restart it or page.
pub struct WorkerGivesUp {
    pub why: GiveUp,
}

impl WorkerGivesUp {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_FATAL).increment(1);
        match self.why {
            GiveUp::FencedAgain { partition } => tracing::error!(
                event = "WorkerGivesUp",
                partition,
                "Fenced again soon after a fence: another worker writes this partition; exiting."
            ),
            GiveUp::TooManyHungCalls { abandoned } => tracing::error!(
                event = "WorkerGivesUp",
                abandoned,
                "Too many hung client calls hold their threads; exiting so that a restart recovers."
            ),
            GiveUp::TooManyRetakes { partition } => tracing::error!(
                event = "WorkerGivesUp",
                partition,
                "The partition was taken over again more than {} times in 10 minutes; exiting so the orchestrator restarts the worker.",
                crate::reasons::MAX_RETAKES
            ),
            GiveUp::TooManyRestarts => tracing::error!(
                event = "WorkerGivesUp",
                "The pipeline failed more than {} times in 10 minutes; exiting so the orchestrator restarts the worker.",
                crate::reasons::MAX_RESTARTS
            ),
        }
    }
}

/// The worker could not flush its ledger before exiting: it exits with a failure, and the next
/// start repairs the ledger from the output topic.
pub struct FinalFlushFailed<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl FinalFlushFailed<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_FATAL).increment(1);
        tracing::error!(
            event = "FinalFlushFailed",
            "Flushing the ledger failed: {}",
            self.error
        );
    }
}

/// A partition was taken over: its previous producer fenced, its ledger up to date. Counts the
/// ids replayed, the recovery's time and each phase of the load, and logs them in one line.
pub struct TakenOver<'a> {
    pub report: &'a RecoveryReport,
    pub fenced_secs: f64,
    pub committed_secs: f64,
    pub seconds: f64,
    pub backfill: bool,
}

impl TakenOver<'_> {
    pub fn emit(&self) {
        let report = self.report;
        let label = report.partition.to_string();
        // One id per output record: what recovery replayed, whichever log it read.
        metrics::counter!(m::RECOVERY_REPLAYED, m::LABEL_PARTITION => label.clone())
            .increment(report.ids_loaded);
        metrics::gauge!(m::RECOVERY_SECONDS, m::LABEL_PARTITION => label.clone()).set(self.seconds);
        let t = &report.times;
        let phases = [
            (m::PHASE_FENCE, self.committed_secs),
            (m::PHASE_PREPARE, t.load.reserve_secs),
            (m::PHASE_FETCH, t.fetch_secs),
            (m::PHASE_DECODE, t.decode_secs),
            (m::PHASE_INDEX, t.load.index_secs),
            (m::PHASE_RUN_WAIT, t.load.run_wait_secs),
            (m::PHASE_COMMIT, t.load.commit_secs),
        ];
        for (phase, seconds) in phases {
            metrics::gauge!(m::HANDOVER_LOAD_SECONDS, m::LABEL_PARTITION => label.clone(), m::LABEL_PHASE => phase).set(seconds);
        }
        tracing::info!(
            event = "TakenOver",
            partition = report.partition,
            source = %report.source,
            records = report.replayed_records,
            ids = report.ids_loaded,
            from = report.replayed_from,
            to = report.replayed_to,
            resume_input_at = report.resume_input_at,
            fenced_secs = self.fenced_secs,
            committed_secs = self.committed_secs,
            reserve_secs = t.load.reserve_secs,
            fetch_secs = t.fetch_secs,
            decode_secs = t.decode_secs,
            index_secs = t.load.index_secs,
            run_wait_secs = t.load.run_wait_secs,
            commit_secs = t.load.commit_secs,
            runs = t.load.runs,
            seconds = self.seconds,
            backfill = self.backfill,
            "Took the partition over: previous producer fenced, ledger up to date."
        );
    }
}

/// The counter of ids a partition's take-over (or back-fill) loaded, to move as they come.
pub fn ids_loaded(partition: i32) -> metrics::Counter {
    metrics::counter!(m::HANDOVER_IDS_LOADED, m::LABEL_PARTITION => partition.to_string())
}

/// A ledger snapshot was taken.
pub struct SnapshotTaken<'a> {
    pub dir: &'a Path,
    pub at_ms: i64,
}

impl SnapshotTaken<'_> {
    pub fn emit(&self) {
        metrics::gauge!(m::SNAPSHOT_LAST_SUCCESS).set(self.at_ms as f64 / 1000.0);
        tracing::info!(event = "SnapshotTaken", dir = %self.dir.display(), "Took a ledger snapshot.");
    }
}

/// Taking a partition over failed in a way another attempt may mend (the brokers or the group
/// coordinator were away): it is taken over again (`PartitionRetaken`).
pub struct TakeOverRetried<'a> {
    pub partition: i32,
    pub error: &'a dyn std::fmt::Display,
}

impl TakeOverRetried<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_PIPELINE).increment(1);
        tracing::warn!(event = "TakeOverRetried", partition = self.partition, error = %self.error, "Taking the partition over failed; trying again.");
    }
}

/// A partition's pipeline ended while it stopped (revoked, or the worker shutting down): its last
/// batch failed, and the next owner reads it again.
pub struct StoppingBatchFailed<'a> {
    pub partition: i32,
    pub error: &'a dyn std::fmt::Display,
}

impl StoppingBatchFailed<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_PIPELINE).increment(1);
        tracing::warn!(event = "StoppingBatchFailed", partition = self.partition, error = %self.error, "A stopping partition's last batch failed; the next owner re-reads it.");
    }
}

/// A pipeline that a retake, a restart or a new take-over had replaced ended: whatever its end,
/// the partition is another pipeline's now, so nothing is counted.
pub struct ReplacedPipelineEnded<'a> {
    pub partition: i32,
    pub error: Option<&'a dyn std::fmt::Display>,
}

impl ReplacedPipelineEnded<'_> {
    pub fn emit(&self) {
        match self.error {
            Some(error) => {
                tracing::info!(event = "ReplacedPipelineEnded", partition = self.partition, error = %error, "A partition pipeline that was replaced ended with an error.")
            }
            None => tracing::info!(
                event = "ReplacedPipelineEnded",
                partition = self.partition,
                "A partition pipeline that was replaced ended."
            ),
        }
    }
}

/// A stopped partition's input could not be paused: it is rewound when taken over again.
pub struct PauseFailed<'a> {
    pub partition: i32,
    pub error: &'a dyn std::fmt::Display,
}

impl PauseFailed<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_KAFKA).increment(1);
        tracing::warn!(event = "PauseFailed", partition = self.partition, error = %self.error, "Could not pause the input partition; it is rewound when taken over again.");
    }
}

/// The worker's stop outlasted `worker.shutdown_timeout_ms`: it exits with batches in flight.
pub struct ShutdownTimedOut;

impl ShutdownTimedOut {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_SHUTDOWN).increment(1);
        tracing::warn!(event = "ShutdownTimedOut", "Shutdown timed out; exiting with batches in flight (their transactions are aborted when the next worker starts).");
    }
}

/// The worker joined its consumer group (`worker.assignment = "group"`); partitions come with the
/// group's assignments.
pub struct GroupJoined<'a> {
    pub group: &'a str,
    pub member: Option<&'a str>,
}

impl GroupJoined<'_> {
    pub fn emit(&self) {
        tracing::info!(event = "GroupJoined", group = %self.group, member = ?self.member, "Joined the consumer group; waiting for partitions.");
    }
}

/// Every configured partition is taken over (`worker.assignment = "static"`): input flows.
pub struct StaticPartitionsLive<'a> {
    pub partitions: &'a [i32],
}

impl StaticPartitionsLive<'_> {
    pub fn emit(&self) {
        tracing::info!(event = "StaticPartitionsLive", partitions = %dedupe::config::PartitionSet(self.partitions.to_vec()), "Every owned partition is recovered; processing input.");
    }
}

/// A stop was asked for: the batches in flight finish first.
pub struct ShutdownStarted;

impl ShutdownStarted {
    pub fn emit(&self) {
        tracing::info!(
            event = "ShutdownStarted",
            "Shutting down: finishing the batches in flight."
        );
    }
}

/// The ledger is flushed after the stop: the worker exits with `code`.
pub struct WorkerExiting {
    pub code: i32,
}

impl WorkerExiting {
    pub fn emit(&self) {
        tracing::info!(
            event = "WorkerExiting",
            code = self.code,
            "The ledger is flushed; exiting."
        );
    }
}

/// A partition's back-fill of older ids ended: all of them loaded (`ids`, in `seconds`), or
/// stopped with the partition (`ids` None: the window is what was loaded).
pub struct BackfillEnded {
    pub partition: i32,
    pub ids: Option<u64>,
    pub seconds: f64,
}

impl BackfillEnded {
    pub fn emit(&self) {
        match self.ids {
            Some(ids) => tracing::info!(
                event = "BackfillEnded",
                partition = self.partition,
                ids,
                seconds = self.seconds,
                "Back-filled the partition's older ids."
            ),
            None => tracing::info!(event = "BackfillEnded", partition = self.partition, "The back-fill of older ids stopped with the partition (the window is what was loaded)."),
        }
    }
}

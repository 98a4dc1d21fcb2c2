//! The worker's instrumentation: what happens to it that an operator must see, each an event
//! struct whose `emit` writes the log line and the count together, so they never drift apart.
//! Log lines never carry payloads or secrets. Every `metrics` call of the worker is in this
//! module and its children ([`coordinator`]: partitions, handovers, the ledger's figures, giving
//! up; [`partition`]: one pipeline's cached handles); the names and labels they use are declared
//! once, in `dedupe::metrics`. A test of the core crate checks that no other module calls the
//! `metrics` macros.

pub mod coordinator;
pub mod group;
pub mod partition;

use dedupe::config::UnkeyedPolicy;
use dedupe::identity::Unkeyed;
use dedupe::metrics as m;
use dedupe::recovery::RecoveryError;
use dedupe::snapshot::SnapshotError;
use metrics::SharedString;
use rdkafka::error::KafkaError;

/// The pipeline, or a partition of it, could not start (topics missing, recovery refused, the
/// broker unreachable); `again` when it is started again after a backoff rather than the worker
/// exiting.
pub struct PipelineStartFailed<'a> {
    pub error: &'a dyn std::fmt::Display,
    pub again: bool,
}

impl PipelineStartFailed<'_> {
    pub fn emit(&self) {
        if self.again {
            metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_PIPELINE).increment(1);
            tracing::warn!(
                event = "PipelineStartFailed",
                "Starting the pipeline failed; starting it again after a backoff: {}",
                self.error
            );
        } else {
            metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_FATAL).increment(1);
            tracing::error!(
                event = "PipelineStartFailed",
                "Starting the pipeline failed; exiting: {}",
                self.error
            );
        }
    }
}

/// The group gave this worker's partitions away without its consent (its membership expired):
/// another member may already be publishing them. `exiting`: the worker stops for it (exit 3);
/// otherwise it was already stopping, and exits as that stop says.
pub struct PartitionsLost<'a> {
    pub partitions: &'a [i32],
    pub exiting: bool,
}

impl PartitionsLost<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_FENCED).increment(1);
        let partitions = dedupe::config::PartitionSet(self.partitions.to_vec());
        if self.exiting {
            tracing::error!(event = "PartitionsLost", partitions = %partitions, "The group gave this worker's partitions away (its membership expired); stopping them and exiting with status 3, for a restart to rejoin the group.");
        } else {
            tracing::error!(event = "PartitionsLost", partitions = %partitions, "The group gave this worker's partitions away (its membership expired) while it was stopping; it exits as that stop says.");
        }
    }
}

/// The input consumer failed fatally (`fatal`: the client's code and reason); a new one starts
/// after a backoff.
pub struct InputConsumerFailed<'a> {
    pub error: &'a KafkaError,
    pub fatal: &'a str,
}

impl InputConsumerFailed<'_> {
    /// Whether another live member of the group holds this worker's `group.instance.id`: the
    /// previous instance of this worker has not left yet (a restart), or two workers were given
    /// one id (two on a host that take its name, the default).
    pub fn member_id_in_use(&self) -> bool {
        self.fatal.starts_with("UnreleasedInstanceId")
    }

    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_KAFKA).increment(1);
        if self.member_id_in_use() {
            tracing::error!(event = "MemberIdInUse", error = %self.error, fatal = self.fatal, "Another member of the consumer group holds this worker's group.instance.id (worker.member_id): the previous instance of this worker has not left yet, or two workers were given one id and each needs its own (--member-id); starting a new consumer after a backoff.");
        } else {
            tracing::error!(event = "InputConsumerFailed", error = %self.error, fatal = self.fatal, "The input consumer failed; starting a new one after a backoff.");
        }
    }
}

/// Back-filling a partition's older ids stopped before the end: its window is what was loaded.
pub struct BackfillStopped<'a> {
    pub partition: i32,
    pub error: &'a RecoveryError,
}

impl BackfillStopped<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_KAFKA).increment(1);
        tracing::warn!(
            event = "BackfillStopped",
            partition = self.partition,
            error = %self.error,
            "Back-filling the partition's older ids stopped; its window is what was loaded, and grows with new traffic."
        );
    }
}

/// An output transaction was aborted; the batch is sent again after a backoff.
pub struct TransactionRetried<'a> {
    pub partition: i32,
    pub attempt: u32,
    pub error: &'a KafkaError,
}

impl TransactionRetried<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::TRANSACTIONS, m::LABEL_OUTCOME => m::OUTCOME_ABORTED).increment(1);
        tracing::warn!(event = "TransactionRetried", partition = self.partition, attempt = self.attempt, error = %self.error, "The output transaction was aborted; retrying the batch.");
    }
}

/// An output transaction failed for good (fenced, or aborted once too often); the pipeline ends
/// with the error, which the coordinator reports.
pub struct TransactionFailed {
    pub fenced: bool,
}

impl TransactionFailed {
    pub fn emit(&self) {
        let outcome = if self.fenced {
            m::OUTCOME_FENCED
        } else {
            m::OUTCOME_ABORTED
        };
        metrics::counter!(m::TRANSACTIONS, m::LABEL_OUTCOME => outcome).increment(1);
        // Logged at debug only: the coordinator reports the pipeline's end (`Fenced`,
        // `PipelineFailed`).
        tracing::debug!(
            event = "TransactionFailed",
            fenced = self.fenced,
            "The output transaction failed for good; the pipeline ends with its error."
        );
    }
}

/// A record without a usable id, handled by the unkeyed policy. Every one is counted; the caller
/// says whether this one is also logged (at most once a minute per partition).
pub struct UnkeyedRecord<'a> {
    pub partition: i32,
    /// The partition as a label value.
    pub label: &'a SharedString,
    pub reason: Unkeyed,
    pub policy: UnkeyedPolicy,
}

impl UnkeyedRecord<'_> {
    pub fn emit(&self, log: bool) {
        let policy = match self.policy {
            UnkeyedPolicy::Forward => m::POLICY_FORWARD,
            UnkeyedPolicy::Drop => m::POLICY_DROP,
            UnkeyedPolicy::DeadLetter => m::POLICY_DEAD_LETTER,
        };
        let reason = self.reason.label();
        metrics::counter!(m::UNKEYED, m::LABEL_PARTITION => self.label.clone(), m::LABEL_REASON => reason, m::LABEL_POLICY => policy)
            .increment(1);
        if log {
            tracing::warn!(
                event = "UnkeyedRecord",
                partition = self.partition,
                reason,
                policy,
                "A record has no usable message id; applying the unkeyed policy (further ones are counted, and warned about once a minute)."
            );
        } else {
            tracing::trace!(
                event = "UnkeyedRecord",
                partition = self.partition,
                reason,
                policy,
                "A record has no usable message id."
            );
        }
    }
}

/// A batch held records whose id belongs on another partition (see `dedupe::kafka::is_home`).
pub struct MisroutedIds<'a> {
    pub partition: i32,
    pub counter: &'a metrics::Counter,
    /// Such records in the batch.
    pub records: u64,
    /// When it is time to warn again: such records since the last warning, this batch's included.
    pub warn: Option<u64>,
}

impl MisroutedIds<'_> {
    pub fn emit(&self) {
        self.counter.increment(self.records);
        if let Some(since) = self.warn {
            tracing::warn!(
                event = "MisroutedIds",
                partition = self.partition,
                records = since,
                "Records arrive on a partition their id does not belong in: the input is not partitioned by the id, so a copy on another partition passes unseen. Key the input by the id (dedupe rekey); see docs/operations.md, \"DedupeMisroutedIds\" (counted in dedupe_misrouted_ids_total, warned about once a minute)."
            );
        } else {
            tracing::trace!(
                event = "MisroutedIds",
                partition = self.partition,
                records = self.records,
                "Records arrive on a partition their id does not belong in."
            );
        }
    }
}

/// Ids a batch published as new were found held when it recorded them: a copy on another of the
/// worker's partitions was published in between (see `dedupe::batch::published_twice`).
pub struct PublishedTwice<'a> {
    pub partition: i32,
    pub counter: &'a metrics::Counter,
    pub ids: usize,
    /// When it is time to warn again: such ids since the last warning, this batch's included.
    pub warn: Option<u64>,
}

impl PublishedTwice<'_> {
    pub fn emit(&self) {
        self.counter.increment(self.ids as u64);
        if let Some(since) = self.warn {
            tracing::warn!(
                event = "PublishedTwice",
                partition = self.partition,
                ids = since,
                "Ids this partition published were published by another of the worker's partitions at the same time: both copies reached the output. Copies of an id meet on two partitions only when the input is not partitioned by the id; key it by the id (dedupe rekey); see docs/operations.md, \"Where the id comes from\" (counted in dedupe_published_twice_ids_total, warned about once a minute)."
            );
        } else {
            tracing::trace!(
                event = "PublishedTwice",
                partition = self.partition,
                ids = self.ids,
                "Ids this partition published were published by another of the worker's partitions at the same time."
            );
        }
    }
}

/// An operator's forget committed: the ids answer "not held" until their next copy.
pub struct IdsForgotten<'a> {
    pub partition: i32,
    pub counter: &'a metrics::Counter,
    pub ids: usize,
    pub held_by_worker: usize,
    pub by: &'a str,
    pub changelog_offset: i64,
}

impl IdsForgotten<'_> {
    pub fn emit(&self) {
        self.counter.increment(self.ids as u64);
        tracing::info!(
            event = "IdsForgotten",
            partition = self.partition,
            ids = self.ids,
            held_by_worker = self.held_by_worker,
            by = self.by,
            changelog_offset = self.changelog_offset,
            "Forgot ids on request: each one's next copy is published."
        );
    }
}

/// A forget could not be done; the request is answered with the cause.
pub struct ForgetFailed<'a> {
    pub partition: i32,
    pub ids: usize,
    pub error: &'a dyn std::fmt::Display,
}

impl ForgetFailed<'_> {
    pub fn emit(&self) {
        tracing::warn!(
            event = "ForgetFailed",
            partition = self.partition,
            ids = self.ids,
            error = %self.error,
            "A forget failed: nothing of it took effect."
        );
    }
}

/// SIGHUP: the configuration was read again and what changes without a restart applied.
pub struct ConfigReloaded<'a> {
    pub source_modes: &'a dedupe::config::SourceModes,
}

impl ConfigReloaded<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::CONFIG_RELOADS, m::LABEL_OUTCOME => m::OUTCOME_APPLIED).increment(1);
        let modes: Vec<String> = self
            .source_modes
            .0
            .iter()
            .map(|(source, mode)| format!("{source}={}", mode.as_str()))
            .collect();
        tracing::info!(
            event = "ConfigReloaded",
            source_modes = %modes.join(","),
            "Reloaded the configuration: worker.source_modes applied (other settings take effect at the next start)."
        );
    }
}

/// SIGHUP: the configuration could not be read again; nothing changed.
pub struct ConfigReloadRefused<'a> {
    pub error: &'a anyhow::Error,
}

impl ConfigReloadRefused<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::CONFIG_RELOADS, m::LABEL_OUTCOME => m::OUTCOME_REFUSED).increment(1);
        tracing::error!(
            event = "ConfigReloadRefused",
            "The configuration could not be reloaded; the worker goes on as it was: {:#}",
            self.error
        );
    }
}

/// A ledger snapshot failed; the pipeline goes on.
pub struct SnapshotFailed<'a> {
    pub error: &'a SnapshotError,
}

impl SnapshotFailed<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::SNAPSHOT_FAILURES, m::LABEL_STAGE => self.error.stage()).increment(1);
        tracing::error!(
            event = "SnapshotFailed",
            "A ledger snapshot failed; the pipeline goes on: {}",
            self.error
        );
    }
}

/// This worker's producer on a partition was fenced: another worker took the partition over, or
/// the broker aborted a transaction that outlived `transaction.timeout.ms` (a broker that hung or
/// a cluster that was down longer than that) and bumped the producer's epoch. The partition is
/// taken over again in process (a new producer fences in turn and recovers from the changelog);
/// a second fence soon after is another writer's, and ends the worker.
pub struct Fenced<'a> {
    pub partition: i32,
    pub error: &'a dyn std::fmt::Display,
}

impl Fenced<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_FENCED).increment(1);
        tracing::error!(
            event = "Fenced",
            partition = self.partition,
            "Partition {}'s producer was fenced (the broker aborted a transaction older than worker.transaction_timeout_ms, or another worker took the partition over): {}",
            self.partition,
            self.error
        );
    }
}

/// A partition's pipeline failed in a way a restart in process would only repeat.
pub struct PipelineFatal<'a> {
    pub partition: i32,
    pub error: &'a dyn std::fmt::Display,
}

impl PipelineFatal<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_FATAL).increment(1);
        tracing::error!(
            event = "PipelineFatal",
            partition = self.partition,
            "A partition pipeline failed in a way a restart cannot mend; exiting: {}",
            self.error
        );
    }
}

/// A partition's pipeline failed; the partition is taken over again.
pub struct PipelineFailed<'a> {
    pub partition: i32,
    pub error: &'a dyn std::fmt::Display,
}

impl PipelineFailed<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_PIPELINE).increment(1);
        tracing::error!(
            event = "PipelineFailed",
            partition = self.partition,
            "A partition pipeline failed; taking the partition over again: {}",
            self.error
        );
    }
}

/// Reading an input partition failed; librdkafka retries.
pub struct InputReadFailed<'a> {
    pub partition: i32,
    pub error: &'a KafkaError,
}

impl InputReadFailed<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_KAFKA).increment(1);
        tracing::warn!(event = "InputReadFailed", partition = self.partition, error = %self.error, "Reading the input partition failed; librdkafka retries.");
    }
}

/// An admin request was refused before it did anything.
pub struct AdminRefused<'a> {
    pub peer: Option<std::net::IpAddr>,
    pub why: &'a str,
}

impl AdminRefused<'_> {
    /// Counts every refusal; logs at most one line per 10 s, with the count of those not
    /// logged, so a page or a script posting in a loop cannot fill the disk.
    pub fn emit(&self, logs: &dedupe::log_limit::LogLimiter) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_ADMIN_UNAUTHORIZED).increment(1);
        if let dedupe::log_limit::LogVerdict::Log { suppressed } =
            logs.check(m::KIND_ADMIN_UNAUTHORIZED, std::time::Instant::now())
        {
            tracing::warn!(event = "AdminRefused", peer = ?self.peer, suppressed, "Refused an admin request: {}.", self.why);
        }
    }
}

#[cfg(test)]
mod tests {
    use actix::prelude::*;
    use dedupe::metrics::recorder;

    struct Emitter;

    impl Actor for Emitter {
        type Context = Context<Self>;
    }

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Emit;

    impl Handler<Emit> for Emitter {
        type Result = ();

        fn handle(&mut self, _: Emit, _: &mut Self::Context) {
            super::group::CoordinatorGone.emit();
        }
    }

    #[test]
    fn a_consumer_failed_for_a_group_instance_id_in_use_says_so() {
        use rdkafka::error::KafkaError;
        use rdkafka::types::RDKafkaErrorCode;
        let recording = recorder::record();
        let error = KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::UnreleasedInstanceId);
        let in_use = super::InputConsumerFailed {
            error: &error,
            fatal: "UnreleasedInstanceId: Broker: The instance ID is still used by another member in the consumer group",
        };
        assert!(in_use.member_id_in_use());
        in_use.emit();
        let error = KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::Fenced);
        super::InputConsumerFailed {
            error: &error,
            fatal: "Fenced: the member was fenced",
        }
        .emit();
        assert_eq!(recording.count("MemberIdInUse"), 1);
        assert_eq!(recording.count("InputConsumerFailed"), 1);
    }

    #[test]
    fn an_actor_s_events_are_recorded_on_the_thread_that_runs_its_system_only() {
        let recording = recorder::record();
        System::new().block_on(async {
            // An actor of the test's own System runs on the test's thread: its event is seen.
            Emitter.start().send(Emit).await.expect("handled");
            // One on an arbiter of its own runs on another thread: its event is not.
            let arbiter = Arbiter::new();
            let elsewhere = Emitter::start_in_arbiter(&arbiter.handle(), |_| Emitter);
            elsewhere.send(Emit).await.expect("handled");
            arbiter.stop();
        });
        assert_eq!(recording.count("CoordinatorGone"), 1);
    }
}

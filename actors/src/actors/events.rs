//! What happens to the worker that an operator must see, each emitted once from one place: the
//! log line and the `dedupe_errors_total{kind}` count come from the same struct, so they never
//! drift apart. Log lines never carry payloads or secrets.

use dedupe::metrics as m;

use crate::actors::consumer::PipelineError;

/// The pipeline could not start (topics missing, recovery refused, the broker unreachable).
pub struct PipelineStartFailed<'a> {
    pub error: &'a anyhow::Error,
}

impl PipelineStartFailed<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_FATAL).increment(1);
        tracing::error!("Starting the pipeline failed; exiting: {:#}", self.error);
    }
}

/// This worker's producer on a partition was fenced: another worker took the partition over, or
/// the broker aborted a transaction that outlived `transaction.timeout.ms` (a broker that hung or
/// a cluster that was down longer than that) and bumped the producer's epoch. Either way it must
/// stop publishing; a restart fences in turn and recovers from the output.
pub struct Fenced<'a> {
    pub partition: i32,
    pub error: &'a PipelineError,
}

impl Fenced<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_FENCED).increment(1);
        tracing::error!(
            partition = self.partition,
            "Partition {}'s producer was fenced (another worker took the partition over, or the broker aborted a transaction older than worker.transaction_timeout_ms); this worker stops: {}",
            self.partition,
            self.error
        );
    }
}

/// A partition's pipeline failed in a way a restart in process would only repeat.
pub struct PipelineFatal<'a> {
    pub partition: i32,
    pub error: &'a PipelineError,
}

impl PipelineFatal<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_FATAL).increment(1);
        tracing::error!(
            partition = self.partition,
            "A partition pipeline failed in a way a restart cannot mend; exiting: {}",
            self.error
        );
    }
}

/// A partition's pipeline failed; the pipeline restarts from recovery.
pub struct PipelineFailed<'a> {
    pub partition: i32,
    pub error: &'a PipelineError,
}

impl PipelineFailed<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_PIPELINE).increment(1);
        tracing::error!(
            partition = self.partition,
            "A partition pipeline failed; restarting the pipeline from recovery: {}",
            self.error
        );
    }
}

/// Reading an input partition failed; librdkafka retries.
pub struct InputReadFailed<'a> {
    pub partition: i32,
    pub error: &'a rdkafka::error::KafkaError,
}

impl InputReadFailed<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_KAFKA).increment(1);
        tracing::warn!(partition = self.partition, error = %self.error, "Reading the input partition failed; librdkafka retries.");
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
        if let dedupe::log_limit::LogVerdict::Log { suppressed } = logs.check(m::KIND_ADMIN_UNAUTHORIZED, std::time::Instant::now()) {
            tracing::warn!(peer = ?self.peer, suppressed, "Refused an admin request: {}.", self.why);
        }
    }
}

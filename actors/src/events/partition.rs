//! The metric handles of one partition's pipeline (`consumer.rs`), registered once when it
//! starts, and the source header they are counted by.

use dedupe::batch::Verdict;
use dedupe::metrics as m;
use dedupe::output::{refusal_reason, OutRecord};
use dedupe::wire::HEADER_SOURCE;
use metrics::{Counter, Histogram, SharedString};
use rdkafka::types::RDKafkaErrorCode;

/// The metric handles of one partition's pipeline, registered once when it starts, so a batch
/// formats no label and looks no series up.
pub(crate) struct PartitionMetrics {
    /// The partition as a label value, for the rare series registered as they come (unkeyed
    /// records, by reason and policy).
    pub(crate) label: SharedString,
    pub(crate) records_in: Counter,
    pub(crate) records_out: Counter,
    /// Per verdict, in the order of [`Verdict::ALL`].
    pub(crate) duplicates: [Counter; 3],
    /// Reused ids dropped, published, dead-lettered: see [`Self::reused`].
    reused: [Counter; 3],
    pub(crate) changelog_records: Counter,
    pub(crate) wakeups_recovered: Counter,
    pub(crate) misrouted: Counter,
    pub(crate) published_twice: Counter,
    /// `dedupe-duplicate` headers of input records, renamed on the output.
    pub(crate) input_duplicate_headers: Counter,
    /// Ids forgotten, and forgotten ids published again.
    pub(crate) forgotten: Counter,
    pub(crate) resent: Counter,
    pub(crate) refreshed: Counter,
    pub(crate) batch_records: Histogram,
    pub(crate) end_to_end: Histogram,
    pub(crate) duplicate_age: Histogram,
    pub(crate) lookup_seconds: Histogram,
    pub(crate) publish_seconds: Histogram,
    pub(crate) record_seconds: Histogram,
    pub(crate) committed: Counter,
    pub(crate) audit_written: Counter,
    pub(crate) audit_sampled_out: Counter,
    pub(crate) audit_over_cap: Counter,
    /// Per counted source (its header value), then `other` and `none`.
    pub(crate) by_source: Vec<(Vec<u8>, SourceCounters)>,
    pub(crate) other_source: SourceCounters,
    pub(crate) no_source: SourceCounters,
}

/// What `worker.on_reused_id` did with a record whose id the ledger holds for other content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReusedAction {
    Dropped = 0,
    Published = 1,
    DeadLettered = 2,
}

/// One source's records: published, dropped as duplicates, and with an id reused for other
/// content (whatever `worker.on_reused_id` did with them).
pub(crate) struct SourceCounters {
    pub(crate) published: Counter,
    pub(crate) duplicate: Counter,
    pub(crate) reused: Counter,
    /// Copies of seen ids published by the source's mode: `flag`, `off`.
    pub(crate) flagged: Counter,
    pub(crate) passed: Counter,
}

impl PartitionMetrics {
    pub(crate) fn new(partition: i32, sources: &[String]) -> Self {
        let label = SharedString::from(partition.to_string());
        let source = |name: &str| {
            let counter = |outcome: &'static str| metrics::counter!(m::SOURCE_RECORDS, m::LABEL_SOURCE => name.to_string(), m::LABEL_OUTCOME => outcome);
            SourceCounters {
                published: counter(m::OUTCOME_PUBLISHED),
                duplicate: counter(m::OUTCOME_DUPLICATE),
                flagged: counter(m::OUTCOME_FLAGGED),
                passed: counter(m::OUTCOME_PASSED),
                reused: metrics::counter!(m::SOURCE_REUSED_IDS, m::LABEL_SOURCE => name.to_string()),
            }
        };
        let counter =
            |name: &'static str| metrics::counter!(name, m::LABEL_PARTITION => label.clone());
        let histogram =
            |name: &'static str| metrics::histogram!(name, m::LABEL_PARTITION => label.clone());
        let stage =
            |stage: &'static str| metrics::histogram!(m::STAGE_SECONDS, m::LABEL_STAGE => stage);
        Self {
            records_in: counter(m::RECORDS_IN),
            records_out: counter(m::RECORDS_OUT),
            duplicates: Verdict::ALL.map(|v| metrics::counter!(m::DUPLICATES_DROPPED, m::LABEL_PARTITION => label.clone(), m::LABEL_VERDICT => v.as_str())),
            reused: [m::ACTION_DROPPED, m::ACTION_PUBLISHED, m::ACTION_DEAD_LETTERED].map(|a| metrics::counter!(m::REUSED_IDS, m::LABEL_PARTITION => label.clone(), m::LABEL_ACTION => a)),
            changelog_records: counter(m::CHANGELOG_RECORDS),
            wakeups_recovered: counter(m::INPUT_WAKEUPS_RECOVERED),
            misrouted: counter(m::MISROUTED_IDS),
            published_twice: counter(m::PUBLISHED_TWICE_IDS),
            input_duplicate_headers: counter(m::INPUT_DUPLICATE_HEADERS),
            forgotten: metrics::counter!(m::FORGOTTEN_IDS, m::LABEL_PARTITION => label.clone(), m::LABEL_OUTCOME => "forgotten"),
            resent: metrics::counter!(m::FORGOTTEN_IDS, m::LABEL_PARTITION => label.clone(), m::LABEL_OUTCOME => "resent"),
            refreshed: metrics::counter!(m::REFRESHED_IDS, m::LABEL_PARTITION => label.clone()),
            batch_records: histogram(m::BATCH_RECORDS),
            end_to_end: histogram(m::END_TO_END_SECONDS),
            duplicate_age: metrics::histogram!(m::DUPLICATE_AGE_SECONDS),
            lookup_seconds: stage(m::STAGE_LOOKUP),
            publish_seconds: stage(m::STAGE_PUBLISH),
            record_seconds: stage(m::STAGE_RECORD),
            committed: metrics::counter!(m::TRANSACTIONS, m::LABEL_OUTCOME => m::OUTCOME_COMMITTED),
            audit_written: metrics::counter!(m::AUDIT_RECORDS, m::LABEL_PARTITION => label.clone(), m::LABEL_OUTCOME => m::AUDIT_WRITTEN),
            audit_sampled_out: metrics::counter!(m::AUDIT_RECORDS, m::LABEL_PARTITION => label.clone(), m::LABEL_OUTCOME => m::AUDIT_SAMPLED_OUT),
            audit_over_cap: metrics::counter!(m::AUDIT_RECORDS, m::LABEL_PARTITION => label.clone(), m::LABEL_OUTCOME => m::AUDIT_OVER_CAP),
            by_source: sources
                .iter()
                .map(|s| (s.as_bytes().to_vec(), source(s)))
                .collect(),
            other_source: source(m::SOURCE_OTHER),
            no_source: source(m::SOURCE_NONE),
            label,
        }
    }
}

/// A record's `dedupe-source` header (the front door's source): `None` without one, else its
/// value (`None` for a header without a value).
pub(crate) fn source_header(record: &OutRecord) -> Option<Option<&[u8]>> {
    record
        .headers
        .iter()
        .find(|(k, _)| k == HEADER_SOURCE)
        .map(|(_, v)| v.as_deref())
}

impl PartitionMetrics {
    /// The counter of reused ids that `worker.on_reused_id` handled as `action`.
    pub(crate) fn reused(&self, action: ReusedAction) -> &Counter {
        &self.reused[action as usize]
    }

    /// The drop counter of `verdict`.
    pub(crate) fn dropped(&self, verdict: Verdict) -> &Counter {
        let at = Verdict::ALL
            .iter()
            .position(|v| *v == verdict)
            .unwrap_or(Verdict::ALL.len() - 1);
        &self.duplicates[at]
    }

    /// The counters of a record's source header.
    pub(crate) fn of_source(&self, header: Option<Option<&[u8]>>) -> &SourceCounters {
        match header {
            None => &self.no_source,
            Some(value) => {
                let value = value.unwrap_or_default();
                self.by_source
                    .iter()
                    .find(|(s, _)| s == value)
                    .map_or(&self.other_source, |(_, counters)| counters)
            }
        }
    }
}

/// A record the output refused for good, alone in its transaction, written to the dead-letter
/// topic instead (with its value, or without it when the dead-letter topic refused that too), in
/// a transaction that committed.
pub struct RecordDeadLettered<'a> {
    pub partition: i32,
    pub input_topic: &'a str,
    pub offset: i64,
    pub bytes: usize,
    pub code: RDKafkaErrorCode,
    pub dead_letter_topic: &'a str,
    pub with_value: bool,
}

impl RecordDeadLettered<'_> {
    pub fn emit(&self) {
        let reason = refusal_reason(self.code);
        metrics::counter!(m::DEAD_LETTERED, m::LABEL_PARTITION => self.partition.to_string(), m::LABEL_REASON => reason).increment(1);
        tracing::warn!(
            event = "RecordDeadLettered",
            partition = self.partition,
            offset = self.offset,
            bytes = self.bytes,
            reason,
            with_value = self.with_value,
            "The output topic refused the record {}/{} at offset {} ({} bytes: {}); it was written to the dead-letter topic {}{} instead, and its id is held, so its copies are dropped as duplicates.",
            self.input_topic,
            self.partition,
            self.offset,
            self.bytes,
            self.code,
            self.dead_letter_topic,
            if self.with_value { "" } else { " without its value, which the dead-letter topic refused too" },
        );
    }
}

/// A partition stops at a record its output topic refuses for good, with no dead-letter topic
/// to take it: nothing after it is published until the output accepts it. Logged when the stall
/// begins and again at each backoff's longest step; the gauge holds while it lasts.
pub struct PartitionStalled<'a> {
    pub partition: i32,
    pub input_topic: &'a str,
    pub offset: i64,
    pub bytes: usize,
    pub code: RDKafkaErrorCode,
    pub refused_by: &'a str,
    pub retry_in: std::time::Duration,
    pub log: bool,
}

impl PartitionStalled<'_> {
    pub fn emit(&self) {
        metrics::gauge!(m::PARTITION_STALLED, m::LABEL_PARTITION => self.partition.to_string())
            .set(1.0);
        if !self.log {
            return;
        }
        tracing::error!(
            event = "PartitionStalled",
            partition = self.partition,
            offset = self.offset,
            bytes = self.bytes,
            reason = refusal_reason(self.code),
            "The {} refuses the record {}/{} at offset {} ({} bytes: {}), alone in its transaction, and no dead-letter topic is set: partition {} stops at it (nothing is dropped; the other partitions go on) and tries it again in {:?}. Raise the topic's max.message.bytes (for a record over the producer's own 1,000,000 bytes, kafka.properties' message.max.bytes too), or set worker.dead_letter_topic and restart.",
            self.refused_by,
            self.input_topic,
            self.partition,
            self.offset,
            self.bytes,
            self.code,
            self.partition,
            self.retry_in,
        );
    }
}

/// A stalled partition's record went through at last: the partition publishes again.
pub struct PartitionHealed {
    pub partition: i32,
    pub offset: i64,
    pub stalled_for: std::time::Duration,
}

impl PartitionHealed {
    pub fn emit(&self) {
        metrics::gauge!(m::PARTITION_STALLED, m::LABEL_PARTITION => self.partition.to_string())
            .set(0.0);
        tracing::info!(
            event = "PartitionHealed",
            partition = self.partition,
            offset = self.offset,
            stalled_secs = self.stalled_for.as_secs_f64(),
            "The output took the record at offset {} of partition {} after {:.1} s: the partition publishes again.",
            self.offset,
            self.partition,
            self.stalled_for.as_secs_f64(),
        );
    }
}

/// A partition's pipeline ended (revoked, taken over again, the worker stopping) while stalled:
/// this worker no longer stops at the record, whoever runs the partition next.
pub struct StallEnded {
    pub partition: i32,
}

impl StallEnded {
    pub fn emit(&self) {
        metrics::gauge!(m::PARTITION_STALLED, m::LABEL_PARTITION => self.partition.to_string())
            .set(0.0);
        tracing::debug!(
            event = "StallEnded",
            partition = self.partition,
            "The stalled partition's pipeline ended."
        );
    }
}

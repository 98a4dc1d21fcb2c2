//! Where a partition's logs end (the output's and the id changelog's watermarks, and the first
//! changelog offset within the handover window): the facts recovery is planned on, asked of the
//! broker patiently while leaderships move.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use super::{RecoveryError, RecoveryFacts, RecoveryInput, Source};
use crate::clock::now_ms;
use crate::kafka::{client_config, Reader, ReaderContext};

/// How long the log's ends are asked for while leaderships move (a node killed or restarted): a
/// transient refusal is asked again, each attempt waiting at most [`LOOKUP_ATTEMPT`].
const LOOKUP_PATIENCE: Duration = Duration::from_secs(60);
const LOOKUP_ATTEMPT: Duration = Duration::from_secs(5);
const LOOKUP_PAUSE: Duration = Duration::from_millis(250);

/// Runs `ask` (given the time it may wait) until it answers or fails with more than a passing
/// cluster state (see [`crate::kafka::is_transient`]), for at most [`LOOKUP_PATIENCE`]. A failed
/// take-over would instead start again from the fence, after a backoff.
fn ask_patiently<T>(
    mut ask: impl FnMut(Duration) -> Result<T, KafkaError>,
) -> Result<T, KafkaError> {
    let deadline = Instant::now() + LOOKUP_PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ask(left.min(LOOKUP_ATTEMPT).max(Duration::from_millis(100))) {
            Err(e) if crate::kafka::is_transient(&e) && left > LOOKUP_PAUSE => {
                tracing::debug!(error = %e, "A log's ends could not be read for now; asking again.");
                std::thread::sleep(LOOKUP_PAUSE);
            }
            answer => return answer,
        }
    }
}

/// Where the partition's logs end, and the facts recovery is planned on.
pub(super) struct LogEnds {
    pub(super) facts: RecoveryFacts,
    pub(super) changelog_high: i64,
    /// The time the handover window starts at (ms), when it was looked up.
    pub(super) window_start_ms: i64,
}

impl LogEnds {
    /// Reads both logs' watermarks (one client for both) and picks the log to replay; for a
    /// partition the ledger holds nothing for, also the first changelog offset published within
    /// the handover window.
    pub(super) fn read(input: &RecoveryInput<'_>) -> Result<Self, RecoveryError> {
        let p = input.partition;
        let kerr = |topic: &str| {
            let topic = topic.to_string();
            move |source| RecoveryError::Kafka {
                topic,
                partition: p,
                source,
            }
        };
        let consumer = replay_consumer(input).map_err(kerr(input.changelog_topic))?;
        let watermarks = |topic: &str| {
            ask_patiently(|wait| consumer.fetch_watermarks(topic, p, wait)).map_err(kerr(topic))
        };
        let source = Source::for_progress(input.ledger_progress);
        let (output_low, output_high) = watermarks(input.output_topic)?;
        let (changelog_low, changelog_high) = watermarks(input.changelog_topic)?;
        let (log_low, log_high) = match source {
            Source::Changelog => (changelog_low, changelog_high),
            Source::Output => (output_low, output_high),
        };
        let window_start_ms = now_ms().saturating_sub(input.ready_window.as_millis() as i64);
        let holds_nothing = input
            .ledger_progress
            .is_none_or(|pr| pr.next_changelog_offset < 0);
        let window_start = if source == Source::Changelog && holds_nothing && log_high > log_low {
            first_offset_since(&consumer, input.changelog_topic, p, window_start_ms)
                .map_err(kerr(input.changelog_topic))?
        } else {
            None
        };
        let facts = RecoveryFacts {
            ledger_progress: input.ledger_progress,
            committed_input: input.committed_input,
            source,
            log_low,
            log_high,
            output_high,
            accept_ledger_ahead: input.accept_ledger_ahead,
            window_start,
        };
        Ok(LogEnds {
            facts,
            changelog_high,
            window_start_ms,
        })
    }

    /// The topic of the log replayed.
    pub(super) fn topic<'a>(&self, input: &RecoveryInput<'a>) -> &'a str {
        match self.facts.source {
            Source::Changelog => input.changelog_topic,
            Source::Output => input.output_topic,
        }
    }
}

/// The first offset of `topic`'s partition whose record was written at `since_ms` or later
/// (`None`: Kafka does not say, so everything is loaded first).
fn first_offset_since(
    consumer: &Reader,
    topic: &str,
    partition: i32,
    since_ms: i64,
) -> Result<Option<i64>, KafkaError> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(since_ms))?;
    let found = ask_patiently(|wait| consumer.offsets_for_times(tpl.clone(), wait))?;
    Ok(found
        .find_partition(topic, partition)
        .and_then(|e| match e.offset() {
            Offset::Offset(o) => Some(o),
            // No record that recent: everything is older than the window.
            Offset::End => Some(i64::MAX),
            _ => None,
        }))
}

/// A consumer for reading a log partition's ends and its ranges, tuned for throughput.
pub(super) fn replay_consumer(input: &RecoveryInput<'_>) -> Result<Reader, KafkaError> {
    client_config(input.kafka)
        .set(
            "group.id",
            format!("dedupe-recovery-{}", input.output_topic),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        // Large fetches and a deep queue: the changelog is read as fast as the broker sends it.
        .set("fetch.max.bytes", "104857600")
        .set("max.partition.fetch.bytes", "52428800")
        .set("queued.max.messages.kbytes", "262144")
        // The end of the range is found by an empty fetch: do not let the broker hold it.
        .set("fetch.wait.max.ms", "10")
        .create_with_context(ReaderContext)
}

//! The I/O half of recovery: read the planned range of the log into the ledger.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::{
    now_ms, plan_recovery, PlanRefusal, RecordReplayed, RecoveryError, RecoveryFacts, RecoveryInput, RecoveryPlan, RecoveryReport, Source,
};
use crate::changelog;
use crate::config::IdSource;
use crate::identity::{message_key, LedgerKey, RecordView};
use crate::kafka::{client_config, Reader, ReaderContext};
use crate::progress::Progress;

/// How many replayed ids are recorded per ledger write.
pub const REPLAY_BATCH: usize = 16_384;

/// Changelog records in the newest chunk of a newest-first load; each older chunk is twice the
/// size of the one before, so a load takes few passes whatever the records hold.
const FIRST_CHUNK_RECORDS: i64 = 32;

/// What a newest-first load left to do once the partition could resume: older ranges of the
/// changelog, loaded in the background with [`backfill`].
#[derive(Debug, Default)]
pub struct Backfill {
    ranges: Vec<(i64, i64)>,
}

impl Backfill {
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

/// Replays the planned tail of the partition's log (the id changelog, or the output for a
/// progress record that predates it) into the ledger through `record`, and returns where the
/// input resumes. `on_progress(ids, records_done, records_total)` is called as it goes.
///
/// A partition the ledger holds nothing for is loaded newest first; once what is loaded covers
/// `input.ready_window` (every id first seen since then is held), the rest is returned as a
/// [`Backfill`] and the partition may resume while it loads.
pub fn recover_partition(
    input: &RecoveryInput<'_>,
    record: &mut RecordReplayed<'_>,
    on_progress: &mut dyn FnMut(u64, i64, i64),
) -> Result<(RecoveryReport, Backfill), RecoveryError> {
    let p = input.partition;
    let ends = LogEnds::read(input)?;
    let plan = plan_recovery(&ends.facts).map_err(|PlanRefusal::LedgerAhead { log, ledger_next_output, output_end }| {
        RecoveryError::LedgerAhead { log, partition: p, ledger_next_output, output_end }
    })?;
    plan.warn(p, &ends.facts);
    let source = ends.facts.source;
    let next_input = plan.resume_input_at.unwrap_or(-1);
    let before = input.ledger_progress.unwrap_or(Progress::NONE);
    // The progress stored with each replayed batch. Forward, it says how far the replay got; a
    // newest-first load stores none until it is complete, so a crash mid-load starts it over.
    let progress_at = |next: i64| {
        Some(match (source, plan.rebuild) {
            (_, true) => Progress::NONE,
            (Source::Changelog, false) => Progress { next_input_offset: next_input, next_changelog_offset: next, ..before },
            (Source::Output, false) => Progress { next_input_offset: next_input, next_output_offset: next, next_changelog_offset: -1 },
        })
    };
    let (replay, done, rest) = load(input, &plan, ends.topic(input), source, record, &progress_at, on_progress)?;
    // Done: the ledger holds every id of the partition's retained log. From here on every
    // transaction writes the changelog, so its position is the changelog's end.
    let progress = Progress {
        next_input_offset: next_input,
        next_output_offset: ends.facts.output_high.max(if source == Source::Output { plan.replay_to } else { -1 }),
        next_changelog_offset: ends.changelog_high,
    };
    record(&[], Some(progress)).map_err(|source| RecoveryError::Record { partition: p, source })?;
    on_progress(replay.ids, done, plan.replay_to - plan.replay_from);
    let report = RecoveryReport {
        partition: p,
        source,
        ids_loaded: replay.ids,
        replayed_from: plan.replay_from,
        replayed_to: plan.replay_to,
        replayed_records: replay.records,
        rebuilt: plan.rebuild,
        retention_gap: plan.retention_gap,
        resume_input_at: plan.resume_input_at,
        progress,
    };
    Ok((report, rest))
}

/// Where the partition's logs end, and the facts recovery is planned on.
struct LogEnds {
    facts: RecoveryFacts,
    changelog_high: i64,
}

impl LogEnds {
    /// Reads both logs' watermarks (one client for both) and picks the log to replay.
    fn read(input: &RecoveryInput<'_>) -> Result<Self, RecoveryError> {
        let p = input.partition;
        let kerr = |topic: &str| {
            let topic = topic.to_string();
            move |source| RecoveryError::Kafka { topic, partition: p, source }
        };
        let consumer = replay_consumer(input).map_err(kerr(input.changelog_topic))?;
        let watermarks = |topic: &str| consumer.fetch_watermarks(topic, p, Duration::from_secs(30)).map_err(kerr(topic));
        let source = Source::for_progress(input.ledger_progress);
        let (output_low, output_high) = watermarks(input.output_topic)?;
        let (changelog_low, changelog_high) = watermarks(input.changelog_topic)?;
        let (log_low, log_high) = match source {
            Source::Changelog => (changelog_low, changelog_high),
            Source::Output => (output_low, output_high),
        };
        let facts = RecoveryFacts {
            ledger_progress: input.ledger_progress,
            committed_input: input.committed_input,
            source,
            log_low,
            log_high,
            output_high,
            accept_ledger_ahead: input.accept_ledger_ahead,
        };
        Ok(LogEnds { facts, changelog_high })
    }

    /// The topic of the log replayed.
    fn topic<'a>(&self, input: &RecoveryInput<'a>) -> &'a str {
        match self.facts.source {
            Source::Changelog => input.changelog_topic,
            Source::Output => input.output_topic,
        }
    }
}

/// Replays the planned range: forward, or for a rebuild from the changelog newest first, until
/// what is loaded covers `input.ready_window`. Returns the replay, the records read, and the
/// ranges left to back-fill.
fn load<'i, 'a>(
    input: &'i RecoveryInput<'a>,
    plan: &RecoveryPlan,
    topic: &'i str,
    source: Source,
    record: &mut RecordReplayed<'_>,
    progress_at: &dyn Fn(i64) -> Option<Progress>,
    on_progress: &mut dyn FnMut(u64, i64, i64),
) -> Result<(Replay<'i, 'a>, i64, Backfill), RecoveryError> {
    let newest_first_load = plan.rebuild && source == Source::Changelog;
    let mut ranges = if newest_first_load {
        newest_first(plan.replay_from, plan.replay_to, FIRST_CHUNK_RECORDS)
    } else {
        vec![(plan.replay_from, plan.replay_to)]
    };
    ranges.retain(|(from, to)| from < to);
    ranges.reverse();
    let total = plan.replay_to - plan.replay_from;
    let mut replay = Replay::new(input, topic, source);
    let mut done = 0;
    while let Some((from, to)) = ranges.pop() {
        replay.read_range(from, to, record, progress_at, &mut |ids, at| on_progress(ids, done + at, total))?;
        done += to - from;
        let covered = replay.oldest_ms.map(|oldest| now_ms().saturating_sub(oldest)).unwrap_or(0);
        if newest_first_load && covered >= input.ready_window.as_millis() as i64 {
            break;
        }
    }
    ranges.reverse();
    Ok((replay, done, Backfill { ranges }))
}

/// Loads what a newest-first load left, newest first, leaving the partition's progress record to
/// its running pipeline. Returns the ids loaded. A crash part way leaves the window at what was
/// loaded: a contiguous newest part, so what `dedupe_window_seconds` reports still holds.
pub fn backfill(
    input: &RecoveryInput<'_>,
    backfill: Backfill,
    record: &mut RecordReplayed<'_>,
    on_progress: &mut dyn FnMut(u64),
) -> Result<u64, RecoveryError> {
    let mut replay = Replay::new(input, input.changelog_topic, Source::Changelog);
    for (from, to) in backfill.ranges {
        replay.read_range(from, to, record, &|_| None, &mut |ids, _| on_progress(ids))?;
        on_progress(replay.ids);
    }
    Ok(replay.ids)
}

/// `[from, to)` cut into ranges from the newest: `first` records, then twice as many, and so on.
fn newest_first(from: i64, to: i64, first: i64) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let (mut end, mut size) = (to, first.max(1));
    while end > from {
        let start = end.saturating_sub(size).max(from);
        out.push((start, end));
        end = start;
        size = size.saturating_mul(2);
    }
    out
}

fn replay_consumer(input: &RecoveryInput<'_>) -> Result<Reader, KafkaError> {
    client_config(input.kafka)
        .set("group.id", format!("dedupe-recovery-{}", input.output_topic))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "16777216")
        // The end of each range is found by an empty fetch: do not let the broker hold it.
        .set("fetch.wait.max.ms", "10")
        .create_with_context(ReaderContext)
}

struct Replay<'i, 'a> {
    input: &'i RecoveryInput<'a>,
    topic: &'i str,
    source: Source,
    started: Instant,
    ids: u64,
    records: u64,
    /// The oldest first-seen time among the ids loaded.
    oldest_ms: Option<i64>,
    batch: Vec<(LedgerKey, i64)>,
}

impl<'i, 'a> Replay<'i, 'a> {
    fn new(input: &'i RecoveryInput<'a>, topic: &'i str, source: Source) -> Self {
        let batch = Vec::with_capacity(REPLAY_BATCH);
        Replay { input, topic, source, started: Instant::now(), ids: 0, records: 0, oldest_ms: None, batch }
    }

    /// Reads `[from, to)` of the log, recording its ids in batches of [`REPLAY_BATCH`]. Each range
    /// gets a consumer of its own, so nothing fetched for another range can be taken for this one.
    fn read_range(
        &mut self,
        from: i64,
        to: i64,
        record: &mut RecordReplayed<'_>,
        progress_at: &dyn Fn(i64) -> Option<Progress>,
        on_progress: &mut dyn FnMut(u64, i64),
    ) -> Result<(), RecoveryError> {
        let p = self.input.partition;
        let kerr = |source| RecoveryError::Kafka { topic: self.topic.to_string(), partition: p, source };
        let consumer = replay_consumer(self.input).map_err(kerr)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(self.topic, p, Offset::Offset(from)).map_err(kerr)?;
        consumer.assign(&tpl).map_err(kerr)?;
        let mut next = from;
        while next < to {
            if self.started.elapsed() > self.input.timeout {
                let seconds = self.input.timeout.as_secs();
                return Err(RecoveryError::Timeout { partition: p, target: to, at: next, seconds });
            }
            match consumer.poll(Duration::from_millis(500)) {
                None => {}
                // With read_committed the end is the last stable offset; after fencing that is
                // the high watermark, up to trailing transaction markers.
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) if crate::kafka::is_reader_group_refusal(&e) => {}
                Some(Err(e)) => return Err(kerr(e)),
                Some(Ok(m)) if m.offset() >= to => break,
                Some(Ok(m)) => {
                    next = m.offset() + 1;
                    self.records += 1;
                    self.take_ids(&m)?;
                    if self.batch.len() >= REPLAY_BATCH {
                        self.flush(record, progress_at(next))?;
                        on_progress(self.ids, next - from);
                    }
                }
            }
        }
        self.flush(record, progress_at(to))
    }

    /// Appends the ids a log record holds to the batch.
    fn take_ids(&mut self, m: &BorrowedMessage<'_>) -> Result<(), RecoveryError> {
        let before = self.batch.len();
        match self.source {
            Source::Changelog => {
                changelog::decode_into(m.payload().unwrap_or_default(), &mut self.batch).map_err(|source| {
                    RecoveryError::Changelog { topic: self.topic.to_string(), partition: self.input.partition, offset: m.offset(), source }
                })?;
            }
            Source::Output => {
                // Records forwarded without a usable id have nothing to record.
                if let Ok(key) = output_record_key(m, self.input.id_source) {
                    self.batch.push((key, m.timestamp().to_millis().unwrap_or_else(now_ms)));
                }
            }
        }
        let taken = &self.batch[before..];
        self.ids += taken.len() as u64;
        if let Some(oldest) = taken.iter().map(|(_, t)| *t).min() {
            self.oldest_ms = Some(self.oldest_ms.map_or(oldest, |o| o.min(oldest)));
        }
        Ok(())
    }

    fn flush(&mut self, record: &mut RecordReplayed<'_>, progress: Option<Progress>) -> Result<(), RecoveryError> {
        record(&self.batch, progress).map_err(|source| RecoveryError::Record { partition: self.input.partition, source })?;
        self.batch.clear();
        Ok(())
    }
}

fn output_record_key(m: &BorrowedMessage<'_>, id_source: &IdSource) -> Result<LedgerKey, crate::identity::Unkeyed> {
    let headers = m.headers();
    let view = RecordView {
        key: m.key(),
        header: |name: &str| headers.and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value)),
        value: m.payload(),
    };
    message_key(&view, id_source)
}

#[cfg(test)]
mod tests {
    use super::newest_first;

    #[test]
    fn newest_first_covers_the_range_once_from_the_end_in_growing_chunks() {
        assert_eq!(newest_first(0, 100, 8), vec![(92, 100), (76, 92), (44, 76), (0, 44)]);
        assert_eq!(newest_first(5, 5, 8), vec![]);
        assert_eq!(newest_first(10, 12, 8), vec![(10, 12)]);
        for (from, to) in [(0, 1), (3, 1000), (1000, 123_457)] {
            let chunks = newest_first(from, to, 32);
            assert_eq!(chunks.first().map(|c| c.1), Some(to));
            assert_eq!(chunks.last().map(|c| c.0), Some(from));
            assert!(chunks.windows(2).all(|w| w[1].1 == w[0].0), "contiguous, newest first");
        }
    }
}

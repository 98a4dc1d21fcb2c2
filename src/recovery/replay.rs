//! The I/O half of recovery: read the planned range of the log into the ledger.
//!
//! A range is read by one consumer tuned for throughput (large fetches, a deep prefetch queue, no
//! wait at the end of the log). Its ids go into the ledger as a bulk load
//! ([`crate::ledger::Load`]: sorted runs ingested with one commit, the id index filled as they
//! arrive) unless the range is a short tail of a partition the ledger holds (a crash's last few
//! batches), which is recorded batch by batch.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::ends::{replay_consumer, LogEnds};
use super::{
    plan_recovery, PlanRefusal, RecoveryError, RecoveryInput, RecoveryPlan, RecoveryReport,
    ReplayTimes, Source,
};
use crate::changelog;
use crate::clock::now_ms;
use crate::identity::{message_key, message_view, IdSource, LedgerKey};
use crate::kafka::Reader;
use crate::ledger::{Ledger, LedgerError, Load, LoadTimes, Mark, MarkOrder, WindowFloor};
use crate::progress::Progress;

/// A tail of a partition the ledger holds is recorded batch by batch up to this many ids; a longer
/// one becomes a bulk load.
const SHORT_TAIL_IDS: usize = 1 << 18;

/// Ids per `check_and_record` call when a short tail is recorded.
const TAIL_BATCH: usize = 16_384;

/// How far an id's first-seen time (its input record's timestamp, set by a client's or a
/// producer's clock) may be ahead of the time the worker published it. Records published before a
/// load's start hold ids first seen up to this much later.
const CLOCK_SKEW_MS: i64 = 5 * 60 * 1000;

/// Reports a load's headway: ids loaded so far, records read, records in all.
pub type LoadMeter<'a> = dyn FnMut(u64, i64, i64) + 'a;

/// What a rebuild left to load once the partition could resume: the changelog's records older
/// than the handover window, and the window floor the first load set for them.
#[derive(Debug, Default)]
pub struct Backfill {
    range: Option<(i64, i64)>,
    floor_ms: i64,
}

impl Backfill {
    pub fn is_empty(&self) -> bool {
        self.range.is_none()
    }
}

/// Replays the planned tail of the partition's log (the id changelog, or the output for a
/// progress record that predates it) into the ledger, and returns where the input resumes.
///
/// A partition the ledger holds nothing for is loaded up to the handover window
/// (`input.ready_window`) before it resumes; what is older is returned as a [`Backfill`], and
/// until it is loaded the ledger's window for the partition says that ids first seen before the
/// handover window may be missing.
pub fn recover_partition(
    input: &RecoveryInput<'_>,
    ledger: &Ledger,
    meter: &mut LoadMeter<'_>,
) -> Result<(RecoveryReport, Backfill), RecoveryError> {
    let p = input.partition;
    let ends = LogEnds::read(input)?;
    let plan = plan_for(&ends, p)?;
    plan.warn(p, &ends.facts);
    let source = ends.facts.source;
    let (progress, backfill, floor) = resume_point(&plan, &ends);
    let total = plan.replay_to - plan.replay_from;
    let mut read = RangeRead::new(input, ends.topic(input), source);
    let record_error = |source| RecoveryError::Record {
        partition: p,
        source,
    };
    let mut sink = if plan.rebuild {
        // The partition's marks come back from the changelog read whole (its marker records).
        ledger.clear_marks(p).map_err(record_error)?;
        Sink::Bulk(Box::new(ledger.begin_load(p)))
    } else {
        Sink::Tail {
            ledger,
            partition: p,
            ids: Vec::new(),
        }
    };
    read.read(
        plan.replay_from,
        plan.replay_to,
        &mut sink,
        &mut |ids, at| meter(ids, at, total),
    )?;
    // Marks before the progress record that covers them: a crash in between reads them again.
    ledger
        .mark(&read.marks, MarkOrder::ByOffset)
        .map_err(record_error)?;
    let (_, load) = sink
        .finish(&progress.encode(), floor)
        .map_err(record_error)?;
    meter(read.ids, total, total);
    let times = ReplayTimes {
        fetch_secs: read.fetch_secs,
        decode_secs: read.decode_secs,
        load,
    };
    let report = RecoveryReport {
        partition: p,
        source,
        ids_loaded: read.ids,
        replayed_from: plan.replay_from,
        replayed_to: plan.replay_to,
        replayed_records: read.records,
        rebuilt: plan.rebuild,
        retention_gap: plan.retention_gap,
        resume_input_at: plan.resume_input_at,
        progress,
        times,
    };
    Ok((report, backfill))
}

/// The recovery plan for the partition's logs, or the refusal of a ledger ahead of them.
fn plan_for(ends: &LogEnds, partition: i32) -> Result<RecoveryPlan, RecoveryError> {
    plan_recovery(&ends.facts).map_err(
        |PlanRefusal::LedgerAhead {
             log,
             ledger_next_output,
             output_end,
         }| {
            RecoveryError::LedgerAhead {
                log,
                partition,
                ledger_next_output,
                output_end,
            }
        },
    )
}

/// Where the partition stands once the plan's range is replayed (its progress record), what a
/// rebuild leaves to back-fill, and the window floor the load sets meanwhile.
fn resume_point(plan: &RecoveryPlan, ends: &LogEnds) -> (Progress, Backfill, WindowFloor) {
    let source = ends.facts.source;
    // Done: the ledger holds every id of the partition's log from the replayed range's start
    // on. From here on every transaction writes the changelog, so its position is its end.
    let progress = Progress {
        next_input_offset: plan.resume_input_at.unwrap_or(-1),
        next_output_offset: ends.facts.output_high.max(if source == Source::Output {
            plan.replay_to
        } else {
            -1
        }),
        next_changelog_offset: ends.changelog_high,
    };
    let backfill = match plan.backfill {
        Some(range) => Backfill {
            range: Some(range),
            floor_ms: ends.window_start_ms - CLOCK_SKEW_MS,
        },
        None => Backfill::default(),
    };
    let floor = if backfill.is_empty() {
        WindowFloor::Keep
    } else {
        WindowFloor::Raise(backfill.floor_ms)
    };
    (progress, backfill, floor)
}

/// Loads what a rebuild left (the changelog's records older than the handover window) in one bulk
/// load, leaving the partition's progress record to its running pipeline, and lowers the window
/// floor the first load raised. Returns the ids loaded. A stop or a crash part way leaves the
/// floor raised: the window then says what is held.
pub fn backfill(
    input: &RecoveryInput<'_>,
    ledger: &Ledger,
    backfill: Backfill,
    meter: &mut LoadMeter<'_>,
) -> Result<u64, RecoveryError> {
    let Some((from, to)) = backfill.range else {
        return Ok(0);
    };
    let p = input.partition;
    let mut read = RangeRead::new(input, input.changelog_topic, Source::Changelog);
    let mut sink = Sink::Bulk(Box::new(ledger.begin_load(p)));
    read.read(from, to, &mut sink, &mut |ids, at| {
        meter(ids, at, to - from)
    })?;
    // Older than anything the first load read: a mark here counts only where none newer is held.
    ledger
        .mark(&read.marks, MarkOrder::ByOffset)
        .map_err(|source| RecoveryError::Record {
            partition: p,
            source,
        })?;
    let floor = WindowFloor::Lower {
        expected: backfill.floor_ms,
        with: None,
    };
    let (ids, _) = sink
        .finish(&[], floor)
        .map_err(|source| RecoveryError::Record {
            partition: p,
            source,
        })?;
    Ok(ids)
}

/// Where the ids read go: the ledger, batch by batch for a short tail, else in bulk.
enum Sink<'l> {
    Tail {
        ledger: &'l Ledger,
        partition: i32,
        ids: Vec<(LedgerKey, i64)>,
    },
    Bulk(Box<Load<'l>>),
}

/// Records a bulk load reads before it says how many ids it expects, from them and the share of
/// the range they took (the id index makes room for that many before any is put in it).
const RECORDS_BEFORE_RESERVING: u64 = 64;

impl Sink<'_> {
    /// Adds the ids of the `records`-th record read, `done` of the range read so far (0..=1).
    fn add(
        &mut self,
        ids: &[(LedgerKey, i64)],
        records: u64,
        done: f64,
    ) -> Result<(), LedgerError> {
        fail::fail_point!("recovery-mid-replay", !ids.is_empty(), |_| {
            eprintln!("failpoint recovery-mid-replay: exiting");
            std::process::exit(86)
        });
        match self {
            Sink::Tail {
                ledger,
                partition,
                ids: held,
            } if held.len() + ids.len() > SHORT_TAIL_IDS => {
                let mut load = ledger.begin_load(*partition);
                load.add(held)?;
                load.add(ids)?;
                load.reserve(expected(load.ids(), done))?;
                *self = Sink::Bulk(Box::new(load));
            }
            Sink::Tail { ids: held, .. } => held.extend_from_slice(ids),
            Sink::Bulk(load) => {
                load.add(ids)?;
                if !load.reserved() && records >= RECORDS_BEFORE_RESERVING {
                    load.reserve(expected(load.ids(), done))?;
                }
            }
        }
        Ok(())
    }

    /// Records what was added with `progress` (empty: leave the partition's as it is). Returns
    /// the ids recorded and where the ledger's time went.
    fn finish(self, progress: &[u8], floor: WindowFloor) -> Result<(u64, LoadTimes), LedgerError> {
        match self {
            Sink::Tail {
                ledger,
                partition,
                ids,
            } => {
                let started = Instant::now();
                for batch in ids.chunks(TAIL_BATCH) {
                    ledger.check_and_record(partition, batch, &[])?;
                }
                ledger.check_and_record::<(LedgerKey, i64)>(partition, &[], progress)?;
                Ok((
                    ids.len() as u64,
                    LoadTimes {
                        commit_secs: started.elapsed().as_secs_f64(),
                        ..LoadTimes::default()
                    },
                ))
            }
            Sink::Bulk(load) => (*load).finish(progress, floor),
        }
    }
}

/// About how many ids a range holds in all, when `ids` came in its first `done` (0..=1): a tenth
/// more than that share says. The id index grows before it is 80% full, so a load up to a
/// further quarter larger still fits.
fn expected(ids: u64, done: f64) -> u64 {
    (ids as f64 / done.max(1e-6) * 1.1) as u64
}

/// Reads ranges of one log partition.
struct RangeRead<'i, 'a> {
    input: &'i RecoveryInput<'a>,
    topic: &'i str,
    source: Source,
    started: Instant,
    ids: u64,
    records: u64,
    batch: Vec<(LedgerKey, i64)>,
    /// The changelog's marker records read (forgets, and re-sends after them), in offset order.
    marks: Vec<(LedgerKey, Mark)>,
    /// Waiting for records from the broker.
    fetch_secs: f64,
    /// Reading ids out of the records.
    decode_secs: f64,
}

impl<'i, 'a> RangeRead<'i, 'a> {
    fn new(input: &'i RecoveryInput<'a>, topic: &'i str, source: Source) -> Self {
        RangeRead {
            input,
            topic,
            source,
            started: Instant::now(),
            ids: 0,
            records: 0,
            batch: Vec::new(),
            marks: Vec::new(),
            fetch_secs: 0.0,
            decode_secs: 0.0,
        }
    }

    /// Reads `[from, to)` of the log into `sink`; `meter(ids, records read)` as it goes.
    fn read(
        &mut self,
        from: i64,
        to: i64,
        sink: &mut Sink<'_>,
        meter: &mut dyn FnMut(u64, i64),
    ) -> Result<(), RecoveryError> {
        if from >= to {
            return Ok(());
        }
        let p = self.input.partition;
        let kerr = |source| RecoveryError::Kafka {
            topic: self.topic.to_string(),
            partition: p,
            source,
        };
        let consumer = replay_consumer(self.input).map_err(kerr)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(self.topic, p, Offset::Offset(from))
            .map_err(kerr)?;
        consumer.assign(&tpl).map_err(kerr)?;
        let mut next = from;
        let mut metered = Instant::now();
        while next < to {
            self.may_go_on(next, to)?;
            let polled = Instant::now();
            let message = consumer.poll(Duration::from_millis(500));
            self.fetch_secs += polled.elapsed().as_secs_f64();
            match message {
                None => {}
                // With read_committed the end is the last stable offset; after fencing that is
                // the high watermark. An end of partition is the range's end only if the
                // consumer's position (past every record and transaction marker it read) reached
                // it: a leader that took over without an error the consumer saw may serve a
                // high watermark not yet caught up, and that end would leave ids out of the
                // ledger. Short of it, the read goes on until the leader catches up (or the
                // take-over's time runs out).
                Some(Err(KafkaError::PartitionEOF(_))) => {
                    let at = position(&consumer, self.topic, p);
                    if reached(at, to) {
                        break;
                    }
                    crate::metrics::events::ReadEndedEarly {
                        partition: p,
                        topic: self.topic,
                        at,
                        end: to,
                    }
                    .emit();
                }
                Some(Err(e)) if crate::kafka::is_reader_group_refusal(&e) => {}
                // Even a passing error (a leader that moved) ends the read: the consumer would go
                // on at the new leader, whose first fetches may end at a high watermark not yet
                // caught up, and an end of partition there would pass for the range's end, leaving
                // ids out of the ledger (seen once in the kill test: two ids published twice). The
                // take-over starts again, and asks for the log's ends until the new leader has
                // caught up (ListOffsets answers OFFSET_NOT_AVAILABLE until then).
                Some(Err(e)) => return Err(kerr(e)),
                Some(Ok(m)) if m.offset() >= to => break,
                Some(Ok(m)) => {
                    next = m.offset() + 1;
                    self.add(&m, (next - from) as f64 / (to - from) as f64, sink)?;
                    if metered.elapsed() >= Duration::from_millis(250) {
                        meter(self.ids, next - from);
                        metered = Instant::now();
                    }
                }
            }
        }
        Ok(())
    }

    /// Ends the read if the take-over is stopped or its time is up (at `next`, short of `to`).
    fn may_go_on(&self, next: i64, to: i64) -> Result<(), RecoveryError> {
        let partition = self.input.partition;
        if self.input.stop.load(Ordering::Relaxed) {
            return Err(RecoveryError::Stopped { partition });
        }
        if self.started.elapsed() > self.input.timeout {
            return Err(RecoveryError::Timeout {
                partition,
                target: to,
                at: next,
                seconds: self.input.timeout.as_secs(),
            });
        }
        Ok(())
    }

    /// Adds the ids of record `m` to `sink`, `done` of the range read with it (0..=1).
    fn add(
        &mut self,
        m: &BorrowedMessage<'_>,
        done: f64,
        sink: &mut Sink<'_>,
    ) -> Result<(), RecoveryError> {
        self.records += 1;
        let decoding = Instant::now();
        self.take_ids(m)?;
        self.decode_secs += decoding.elapsed().as_secs_f64();
        sink.add(&self.batch, self.records, done)
            .map_err(|source| RecoveryError::Record {
                partition: self.input.partition,
                source,
            })
    }

    /// The ids a log record holds, in `self.batch`.
    fn take_ids(&mut self, m: &BorrowedMessage<'_>) -> Result<(), RecoveryError> {
        self.batch.clear();
        match self.source {
            Source::Changelog => {
                let bytes = m.payload().unwrap_or_default();
                let error = |source| RecoveryError::Changelog {
                    topic: self.topic.to_string(),
                    partition: self.input.partition,
                    offset: m.offset(),
                    source,
                };
                if changelog::is_mark(bytes) {
                    let record = changelog::decode_mark(bytes).map_err(error)?;
                    let mark = Mark {
                        partition: self.input.partition,
                        kind: record.kind,
                        changelog_offset: m.offset(),
                        at_ms: record.at_ms,
                    };
                    self.marks
                        .extend(record.keys.into_iter().map(|k| (k, mark)));
                    return Ok(());
                }
                changelog::decode_into(bytes, &mut self.batch).map_err(error)?;
            }
            Source::Output => {
                // Records forwarded without a usable id have nothing to record.
                if let Ok(key) = output_record_key(m, self.input.id_source) {
                    self.batch
                        .push((key, m.timestamp().to_millis().unwrap_or_else(now_ms)));
                }
            }
        }
        self.ids += self.batch.len() as u64;
        Ok(())
    }
}

/// The next offset `consumer` reads of `topic`'s partition (`None`: it has read nothing yet).
fn position(consumer: &Reader, topic: &str, partition: i32) -> Option<i64> {
    let positions = consumer.position().ok()?;
    match positions.find_partition(topic, partition)?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// Whether a read whose consumer stands at `at` has read the range ending before `to`.
fn reached(at: Option<i64>, to: i64) -> bool {
    at.is_some_and(|at| at >= to)
}

fn output_record_key(
    m: &BorrowedMessage<'_>,
    id_source: &IdSource,
) -> Result<LedgerKey, crate::identity::Unkeyed> {
    message_key(&message_view(m), id_source)
}

#[cfg(test)]
mod tests {
    //! Against the broker of `deploy/local/kafka.sh` (the suite starts it).
    use std::sync::atomic::AtomicBool;

    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    use super::*;
    use crate::config::KafkaConfig;
    use crate::kafka::client_config;
    use crate::ledger::{Ledger, LedgerOptions};

    #[test]
    fn a_read_whose_log_ends_short_of_its_range_reads_on_instead_of_ending_there() {
        let kafka = KafkaConfig::default();
        let topic = format!("dedupe-replay-early-end-{}", uuid::Uuid::new_v4().simple());
        futures::executor::block_on(crate::kafka::create_topic(&kafka, &topic, 1, 1, &[])).unwrap();
        let producer: BaseProducer = client_config(&kafka).create().unwrap();
        let ids: Vec<(LedgerKey, i64)> = (0..6)
            .map(|n| {
                (
                    crate::identity::ledger_key(format!("id-{n}").as_bytes()).unwrap(),
                    1_000 * n,
                )
            })
            .collect();
        for pair in ids.chunks(2) {
            let value = changelog::encode(pair).unwrap();
            producer
                .send(BaseRecord::<(), _>::to(&topic).partition(0).payload(&value))
                .unwrap();
        }
        producer.flush(Duration::from_secs(30)).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let options = LedgerOptions {
            budget_bytes: 64 << 20,
            write_buffer_bytes: 1 << 20,
            block_cache_bytes: 1 << 20,
            ..LedgerOptions::default()
        };
        let ledger = Ledger::open(dir.path(), options).unwrap();
        let stop = AtomicBool::new(false);
        let input = RecoveryInput {
            kafka: &kafka,
            output_topic: &topic,
            changelog_topic: &topic,
            partition: 0,
            id_source: &IdSource::Key,
            ledger_progress: None,
            committed_input: None,
            accept_ledger_ahead: false,
            ready_window: Duration::from_secs(300),
            timeout: Duration::from_secs(4),
            stop: &stop,
        };

        // The log holds offsets 0..3; a leader not caught up answers with that end for a range
        // to 5. Ending there would leave the ids of offsets 3 and 4 out of the ledger.
        let mut sink = Sink::Tail {
            ledger: &ledger,
            partition: 0,
            ids: Vec::new(),
        };
        let mut read = RangeRead::new(&input, &topic, Source::Changelog);
        let early = read.read(0, 5, &mut sink, &mut |_, _| {});
        assert!(
            matches!(
                early,
                Err(RecoveryError::Timeout {
                    target: 5,
                    at: 3,
                    ..
                })
            ),
            "{early:?}"
        );

        // The range the log holds is read whole.
        let mut sink = Sink::Tail {
            ledger: &ledger,
            partition: 0,
            ids: Vec::new(),
        };
        let mut read = RangeRead::new(&input, &topic, Source::Changelog);
        read.read(0, 3, &mut sink, &mut |_, _| {}).unwrap();
        assert_eq!(read.ids, 6);
        match sink {
            Sink::Tail { ids: read_ids, .. } => assert_eq!(read_ids, ids),
            Sink::Bulk(_) => panic!("six ids are a short tail"),
        }
    }
}

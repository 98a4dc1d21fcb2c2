//! The per-batch protocol against the core's in-memory doubles of its seams
//! (`dedupe::store::MemoryStore` for the ledger, `dedupe::output::MemorySink` for the output),
//! called in place and logged in the order the pipeline calls them. What they check is the
//! design's core: look up, then publish, then record; nothing recorded that was not committed;
//! duplicates dropped; the progress that follows each batch; aborted transactions sent again,
//! whole.

use std::cell::{Ref, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

use dedupe::clock::now_ms;
use dedupe::config::{DigestSource, IdSource, ReusedIdPolicy, UnkeyedPolicy};
use dedupe::identity::{ContentDigest, LedgerKey, Unkeyed, LEDGER_KEY_BYTES};
use dedupe::ledger::{Held, Mark, MarkKind, MarkOrder, Result as LedgerResult, Verdict};
use dedupe::metrics::recorder;
use dedupe::output::{Batch, Committed, MemorySink, OutRecord, PublishError, Published, Sink};
use dedupe::progress::Progress;
use dedupe::store::{IdStore, Looked, MemoryStore, NewId};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use tracing::Level;

use super::seams::InPlace;
use super::{InRecord, Pipeline, PipelineError, PipelineSettings};
use crate::events::partition::PartitionMetrics;

/// One call a double saw, in the order the pipeline made them.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    LookUp(usize),
    Publish {
        records: usize,
        next_input_offset: i64,
    },
    Record {
        ids: usize,
        progress: Progress,
    },
    Forget(usize),
}

type Log = std::rc::Rc<RefCell<Vec<Step>>>;

/// A double that logs each call, then passes it on.
struct Logged<T> {
    inner: T,
    log: Log,
}

impl<S: IdStore> IdStore for Logged<S> {
    fn look_up(&self, keys: &[LedgerKey]) -> LedgerResult<Looked> {
        self.log.borrow_mut().push(Step::LookUp(keys.len()));
        self.inner.look_up(keys)
    }

    fn record(
        &self,
        partition: i32,
        items: &[NewId],
        progress: &[u8],
        marks: &[(LedgerKey, Mark)],
    ) -> LedgerResult<Vec<Verdict>> {
        self.log.borrow_mut().push(Step::Record {
            ids: items.len(),
            progress: Progress::decode(progress).expect("a progress record"),
        });
        self.inner.record(partition, items, progress, marks)
    }

    fn mark(&self, marks: &[(LedgerKey, Mark)], order: MarkOrder) -> LedgerResult<()> {
        self.log.borrow_mut().push(Step::Forget(marks.len()));
        self.inner.mark(marks, order)
    }

    fn progress(&self, partition: i32) -> LedgerResult<Option<Vec<u8>>> {
        self.inner.progress(partition)
    }
}

impl<K: Sink<Group = ()>> Sink for Logged<K> {
    type Group = ();

    fn publish(&mut self, batch: &Batch<'_>, group: &()) -> Result<Committed, PublishError> {
        self.log.borrow_mut().push(Step::Publish {
            records: batch.records.len(),
            next_input_offset: batch.next_input_offset,
        });
        self.inner.publish(batch, group)
    }
}

type TestPipeline<S = MemoryStore> = Pipeline<InPlace<Logged<S>>, InPlace<Logged<MemorySink>>>;

impl<S: IdStore> TestPipeline<S> {
    /// The store's double.
    fn store(&self) -> Ref<'_, S> {
        Ref::map(self.ledger.inner.borrow(), |l| &l.inner)
    }

    /// The progress last recorded for the pipeline's partition.
    fn progress(&self) -> Option<Progress> {
        let bytes = self.store().progress(self.partition).expect("read");
        bytes.map(|b| Progress::decode(&b).expect("a progress record"))
    }

    /// The transactions committed, in order.
    fn committed(&self) -> Ref<'_, Vec<Published>> {
        Ref::map(self.publisher.inner.borrow(), |l| &l.inner.committed)
    }

    /// Makes the sink refuse, for good, output records and dead letters over `limit` bytes.
    fn refuse_larger_than(&self, limit: Option<usize>) {
        self.publisher.inner.borrow_mut().inner.refuse_larger_than = limit;
    }

    /// Sets `worker.dead_letter_topic` (the tests' default is `dlq`).
    fn dead_letter_topic(&mut self, topic: Option<&str>) {
        let mut settings = (*self.settings).clone();
        settings.dead_letter_topic = topic.map(str::to_string);
        self.settings = Arc::new(settings);
    }

    /// Makes the next publishes fail, in order.
    fn fail_publishes(&self, failures: impl IntoIterator<Item = PublishError>) {
        let mut sink = self.publisher.inner.borrow_mut();
        sink.inner.failures.extend(failures);
    }
}

impl TestPipeline {
    /// The ids held.
    fn held(&self) -> HashMap<LedgerKey, Held> {
        self.store().held_ids()
    }
}

fn settings(unkeyed: UnkeyedPolicy, reused_id: ReusedIdPolicy) -> Arc<PipelineSettings> {
    Arc::new(PipelineSettings {
        id_source: IdSource::Key,
        unkeyed_policy: unkeyed,
        content_digest: DigestSource::HeaderOrValue,
        reused_id,
        batch_max_records: 100,
        batch_max_bytes: 1 << 20,
        batch_linger: std::time::Duration::from_millis(1),
        #[cfg(feature = "passthrough")]
        passthrough: false,
        input_topic: "in".to_string(),
        audit: None,
        sources: Vec::new(),
        input_partitions: 1,
        source_modes: Default::default(),
        retention_limit_ms: None,
        refresh_on_duplicate: false,
        output_topic: "out".to_string(),
        dead_letter_topic: Some("dlq".to_string()),
        board: Arc::default(),
    })
}

/// A pipeline of partition 0 over `store`, and the log of the calls its doubles see.
fn pipeline_over<S: IdStore>(
    store: S,
    unkeyed: UnkeyedPolicy,
    reused_id: ReusedIdPolicy,
) -> (TestPipeline<S>, Log) {
    let log = Log::default();
    let settings = settings(unkeyed, reused_id);
    let pipeline = Pipeline {
        partition: 0,
        ledger: InPlace::new(Logged {
            inner: store,
            log: log.clone(),
        }),
        publisher: InPlace::new(Logged {
            inner: MemorySink::default(),
            log: log.clone(),
        }),
        metrics: PartitionMetrics::new(0, &settings.sources),
        settings,
        next_output_offset: 0,
        next_changelog_offset: 0,
        unkeyed_warned_at: None,
        misrouted_warned_at: None,
        misrouted_since_warned: 0,
        twice_warned_at: None,
        twice_since_warned: 0,
        live_since: None,
        sampler: None,
    };
    (pipeline, log)
}

fn pipeline(unkeyed: UnkeyedPolicy, reused_id: ReusedIdPolicy) -> (TestPipeline, Log) {
    pipeline_over(MemoryStore::default(), unkeyed, reused_id)
}

fn key(n: u8) -> LedgerKey {
    LedgerKey([n; LEDGER_KEY_BYTES])
}

/// A record at `offset` with id `n` (or none) and the given value.
fn record(offset: i64, id: Option<u8>, value: &str) -> InRecord {
    InRecord {
        offset,
        id: id.map(key).ok_or(Unkeyed::Missing),
        misrouted: false,
        digest: Some(ContentDigest::of_value(value.as_bytes())),
        out: OutRecord {
            key: id.map(|n| vec![n]),
            value: Some(value.as_bytes().to_vec()),
            headers: Vec::new(),
            timestamp_ms: Some(1_000 + offset),
        },
    }
}

fn values(records: &[OutRecord]) -> Vec<&str> {
    records
        .iter()
        .map(|r| std::str::from_utf8(r.value.as_deref().unwrap_or_default()).unwrap_or("?"))
        .collect()
}

fn aborted() -> PublishError {
    PublishError::Aborted {
        source: KafkaError::MessageProduction(RDKafkaErrorCode::OperationTimedOut),
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_is_looked_up_then_published_then_recorded_with_the_progress_after_it() {
    let (mut p, log) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.process(vec![record(10, Some(1), "a"), record(11, Some(2), "b")])
        .await
        .expect("processed");
    let progress = Progress {
        next_input_offset: 12,
        next_output_offset: 2,
        next_changelog_offset: 1,
    };
    assert_eq!(
        *log.borrow(),
        vec![
            Step::LookUp(2),
            Step::Publish {
                records: 2,
                next_input_offset: 12
            },
            Step::Record { ids: 2, progress },
        ]
    );
    assert_eq!(p.progress(), Some(progress));
    assert_eq!(p.held().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn repeats_are_dropped_within_a_batch_and_across_batches() {
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.process(vec![
        record(0, Some(1), "a"),
        record(1, Some(1), "a"),
        record(2, Some(2), "b"),
    ])
    .await
    .expect("first batch");
    p.process(vec![record(3, Some(2), "b"), record(4, Some(3), "c")])
        .await
        .expect("second batch");
    let committed = p.committed();
    assert_eq!(values(&committed[0].records), ["a", "b"]);
    assert_eq!(values(&committed[1].records), ["c"]);
    assert_eq!(committed[0].new_ids.len(), 2);
    assert_eq!(committed[1].new_ids.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn nothing_is_recorded_when_the_transaction_fails() {
    let (mut p, log) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.fail_publishes([PublishError::Fenced {
        transactional_id: "t".to_string(),
        source: KafkaError::MessageProduction(RDKafkaErrorCode::Fenced),
    }]);
    let result = p.process(vec![record(0, Some(1), "a")]).await;
    assert!(matches!(result, Err(ref e) if e.is_fenced()), "{result:?}");
    assert!(p.held().is_empty());
    assert_eq!(p.progress(), None);
    assert!(!log
        .borrow()
        .iter()
        .any(|s| matches!(s, Step::Record { .. })));
}

#[tokio::test(start_paused = true)]
async fn an_aborted_transaction_is_sent_again_whole_and_recorded_once() {
    let (mut p, log) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.fail_publishes([aborted(), aborted()]);
    p.process(vec![record(5, Some(1), "a"), record(6, Some(2), "b")])
        .await
        .expect("processed after two aborts");
    let publishes: Vec<Step> = log
        .borrow()
        .iter()
        .filter(|s| matches!(s, Step::Publish { .. }))
        .cloned()
        .collect();
    let attempt = Step::Publish {
        records: 2,
        next_input_offset: 7,
    };
    assert_eq!(publishes, vec![attempt.clone(), attempt.clone(), attempt]);
    let records: Vec<Step> = log
        .borrow()
        .iter()
        .filter(|s| matches!(s, Step::Record { .. }))
        .cloned()
        .collect();
    assert_eq!(records.len(), 1);
    assert_eq!(p.committed().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_transaction_that_keeps_aborting_ends_the_pipeline_without_recording() {
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.fail_publishes((0..=super::protocol::ABORTED_BATCH_RETRIES_ALLOWED).map(|_| aborted()));
    let result = p.process(vec![record(0, Some(1), "a")]).await;
    assert!(
        matches!(result, Err(PipelineError::Publish { .. })),
        "{result:?}"
    );
    assert!(result.as_ref().is_err_and(|e| e.is_retryable()));
    assert!(p.held().is_empty());
}

#[tokio::test(start_paused = true)]
async fn records_without_an_id_follow_the_unkeyed_policy() {
    for (policy, published, dead) in [
        (UnkeyedPolicy::Forward, vec!["a", "x"], vec![]),
        (UnkeyedPolicy::Drop, vec!["a"], vec![]),
        (UnkeyedPolicy::DeadLetter, vec!["a"], vec!["x"]),
    ] {
        let (mut p, _) = pipeline(policy, ReusedIdPolicy::Drop);
        p.process(vec![record(0, Some(1), "a"), record(1, None, "x")])
            .await
            .expect("processed");
        let committed = p.committed();
        assert_eq!(values(&committed[0].records), published, "{policy:?}");
        assert_eq!(values(&committed[0].dead_letters), dead, "{policy:?}");
        // Only the keyed record's id is looked up and recorded.
        assert_eq!(committed[0].new_ids.len(), 1, "{policy:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_reused_id_follows_its_policy() {
    for (policy, published, dead) in [
        (ReusedIdPolicy::Drop, vec!["a"], vec![]),
        (ReusedIdPolicy::Publish, vec!["a", "other"], vec![]),
        (ReusedIdPolicy::DeadLetter, vec!["a"], vec!["other"]),
    ] {
        let (mut p, _) = pipeline(UnkeyedPolicy::Forward, policy);
        p.process(vec![record(0, Some(1), "a")])
            .await
            .expect("first");
        p.process(vec![record(1, Some(1), "other")])
            .await
            .expect("second");
        let committed = p.committed();
        let all: Vec<&str> = committed.iter().flat_map(|o| values(&o.records)).collect();
        let dead_letters: Vec<&str> = committed
            .iter()
            .flat_map(|o| values(&o.dead_letters))
            .collect();
        assert_eq!(all, published, "{policy:?}");
        assert_eq!(dead_letters, dead, "{policy:?}");
        // The id is recorded once, with its first content.
        assert_eq!(p.held().len(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_of_repeats_publishes_nothing_but_still_moves_the_progress() {
    let (mut p, log) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.process(vec![record(0, Some(1), "a")])
        .await
        .expect("first");
    p.process(vec![record(1, Some(1), "a"), record(2, Some(1), "a")])
        .await
        .expect("second");
    let last = log.borrow().last().cloned();
    assert_eq!(
        last,
        Some(Step::Record {
            ids: 0,
            progress: Progress {
                next_input_offset: 3,
                next_output_offset: 1,
                next_changelog_offset: 1,
            }
        })
    );
    // The input offset is committed with the (empty) transaction: the repeats are not read again.
    assert!(log.borrow().contains(&Step::Publish {
        records: 0,
        next_input_offset: 3
    }));
}

/// A forget to send the pipeline, and where its answer comes.
fn forget_request(
    ids: &[u8],
) -> (
    super::ForgetRequest,
    tokio::sync::oneshot::Receiver<Result<super::ForgetReport, String>>,
) {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let request = super::ForgetRequest {
        ids: ids
            .iter()
            .map(|&n| super::ForgetId {
                id: n.to_string(),
                key: key(n),
                // Id 1 is recorded by the test's first batch; 9 never is.
                held_by_worker: n == 1,
            })
            .collect(),
        by: "alice".to_string(),
        reason: Some("ticket 7".to_string()),
        at_ms: 1_000,
        reply,
    };
    (request, answer)
}

#[tokio::test(start_paused = true)]
async fn a_forgotten_id_is_published_once_more_then_held_again() {
    let (mut p, log) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.process(vec![record(0, Some(1), "a"), record(1, Some(2), "b")])
        .await
        .expect("first batch");
    let (request, answer) = forget_request(&[1, 9]);
    p.forget(request).await.expect("forget");
    let report = answer.await.expect("answered").expect("done");
    assert_eq!((report.ids, report.held_by_worker), (2, 1), "{report:?}");
    {
        // The forget's own transaction: a marker record, no input offset, no records.
        let committed = p.committed();
        let forget = committed.last().unwrap();
        assert!(forget.records.is_empty() && forget.new_ids.is_empty());
        let marker = dedupe::changelog::decode_mark(&forget.marks[0]).expect("a marker");
        assert_eq!(marker.kind, MarkKind::Forgotten);
        assert_eq!(marker.keys, [key(1), key(9)]);
        assert!(log.borrow().contains(&Step::Publish {
            records: 0,
            next_input_offset: -1
        }));
        assert_eq!(log.borrow().last(), Some(&Step::Forget(2)));
    }
    // Its next copy is published, with a resent marker in the same transaction; the copy
    // after that is dropped, and an id never forgotten stays dropped.
    p.process(vec![record(2, Some(1), "a"), record(3, Some(2), "b")])
        .await
        .expect("second batch");
    p.process(vec![record(4, Some(1), "a")])
        .await
        .expect("third batch");
    let committed = p.committed();
    let resent = &committed[committed.len() - 2];
    assert_eq!(values(&resent.records), ["a"]);
    let marker = dedupe::changelog::decode_mark(&resent.marks[0]).expect("a marker");
    assert_eq!(
        (marker.kind, marker.keys.as_slice()),
        (MarkKind::Resent, &[key(1)][..])
    );
    assert!(committed.last().unwrap().records.is_empty(), "held again");
    let kinds =
        |n| -> Vec<MarkKind> { p.store().marks_of(&key(n)).iter().map(|m| m.kind).collect() };
    assert_eq!(kinds(1), [MarkKind::Resent]);
    assert_eq!(kinds(9), [MarkKind::Forgotten]);
}

#[tokio::test(start_paused = true)]
async fn a_resend_ends_the_forget_in_the_changelog_of_each_partition_it_was_written_to() {
    let (mut p, _log) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.process(vec![record(0, Some(1), "a")])
        .await
        .expect("first batch");
    // Id 1 forgotten on partition 0 (this pipeline's) and on partition 3 (the id's other
    // partitioner's), at a time ahead of this machine's clock (another worker's, or a clock
    // stepped back since).
    let ahead = now_ms() + 3_600_000;
    let forget = Mark {
        partition: 3,
        kind: MarkKind::Forgotten,
        changelog_offset: 40,
        at_ms: ahead,
    };
    p.store()
        .mark(&[(key(1), forget)], MarkOrder::Newest)
        .expect("marked");
    p.process(vec![record(1, Some(1), "a")])
        .await
        .expect("the copy after the forget");
    let committed = p.committed();
    let resent = committed.last().unwrap();
    assert_eq!(values(&resent.records), ["a"], "published once more");
    // The re-send's marker, in this partition's changelog and in partition 3's, is not older
    // than the forget it ends.
    let own = dedupe::changelog::decode_mark(&resent.marks[0]).expect("a marker");
    assert_eq!((own.kind, own.at_ms), (MarkKind::Resent, ahead));
    let [(3, other)] = resent.other_marks.as_slice() else {
        panic!("one marker for partition 3: {:?}", resent.other_marks.len());
    };
    let other = dedupe::changelog::decode_mark(other).expect("a marker");
    assert_eq!(
        (other.kind, other.at_ms, other.keys.as_slice()),
        (MarkKind::Resent, ahead, &[key(1)][..])
    );
}

/// A store where another of the worker's partitions records every id right after it is looked
/// up: copies of one id on two partitions, racing.
struct Racing(MemoryStore);

impl IdStore for Racing {
    fn look_up(&self, keys: &[LedgerKey]) -> LedgerResult<Looked> {
        let looked = self.0.look_up(keys)?;
        let other: Vec<NewId> = keys.iter().map(|k| (*k, 1_000, None)).collect();
        self.0.record(1, &other, b"", &[])?;
        Ok(looked)
    }

    fn record(
        &self,
        partition: i32,
        items: &[NewId],
        progress: &[u8],
        marks: &[(LedgerKey, Mark)],
    ) -> LedgerResult<Vec<Verdict>> {
        self.0.record(partition, items, progress, marks)
    }

    fn mark(&self, marks: &[(LedgerKey, Mark)], order: MarkOrder) -> LedgerResult<()> {
        self.0.mark(marks, order)
    }

    fn progress(&self, partition: i32) -> LedgerResult<Option<Vec<u8>>> {
        self.0.progress(partition)
    }
}

#[tokio::test(start_paused = true)]
async fn an_id_the_ledger_holds_by_the_time_it_is_recorded_is_counted_as_published_twice() {
    // The copy is published (the look-up found nothing), and the other partition's copy was
    // published too: the record finds the id held, and says so.
    let recording = recorder::record();
    let (mut p, _) = pipeline_over(
        Racing(MemoryStore::default()),
        UnkeyedPolicy::Forward,
        ReusedIdPolicy::Drop,
    );
    p.process(vec![record(0, Some(1), "a")])
        .await
        .expect("processed");
    assert_eq!(values(&p.committed()[0].records), ["a"]);
    assert!(p.twice_warned_at.is_some(), "the race was reported");
    assert_eq!(recording.count_at("PublishedTwice", Level::WARN), 1);
    // Without a race, repeats and new ids are no such thing.
    recording.clear();
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.process(vec![record(0, Some(1), "a"), record(1, Some(1), "a")])
        .await
        .expect("first");
    p.process(vec![record(2, Some(1), "a"), record(3, Some(2), "b")])
        .await
        .expect("second");
    assert!(p.twice_warned_at.is_none());
    assert_eq!(recording.count("PublishedTwice"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_refresh_is_recorded_as_a_duplicate_and_is_not_published_twice() {
    let recording = recorder::record();
    let mut refreshing = (*settings(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop)).clone();
    refreshing.refresh_on_duplicate = true;
    let (mut p, _) = pipeline_over(
        MemoryStore::new(None, true),
        UnkeyedPolicy::Forward,
        ReusedIdPolicy::Drop,
    );
    p.settings = Arc::new(refreshing);
    p.process(vec![record(0, Some(1), "a")])
        .await
        .expect("first");
    // Five seconds on, the copy is dropped and refreshes its id.
    p.process(vec![record(5_000, Some(1), "a")])
        .await
        .expect("second");
    assert!(p.committed()[1].records.is_empty());
    assert_eq!(p.held()[&key(1)].first_seen_ms, 6_000);
    assert!(p.twice_warned_at.is_none());
    assert_eq!(recording.count("PublishedTwice"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_ledger_that_fails_ends_the_pipeline_before_anything_is_published() {
    let (mut p, log) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.process(vec![record(0, Some(1), "a")])
        .await
        .expect("first");
    p.process(vec![record(1, Some(2), "b")])
        .await
        .expect("second");
    // The look-up of the third batch fails: nothing is published.
    p.store()
        .fail_next(dedupe::ledger::LedgerError::CorruptMetadata {
            what: "a test's fault".to_string(),
        });
    let result = p.process(vec![record(2, Some(3), "c")]).await;
    assert!(
        matches!(result, Err(PipelineError::Ledger { partition: 0, .. })),
        "{result:?}"
    );
    assert_eq!(p.committed().len(), 2);
    assert_eq!(log.borrow().last(), Some(&Step::LookUp(1)));
}

// What the pipeline reports: the events its instrumentation emits, recorded on the test's thread
// (the pipeline runs on it), by name and by the level of their log line.

fn fenced() -> PublishError {
    PublishError::Fenced {
        transactional_id: "t".to_string(),
        source: KafkaError::MessageProduction(RDKafkaErrorCode::Fenced),
    }
}

#[tokio::test(start_paused = true)]
async fn an_aborted_transaction_reports_each_retry_and_no_failure() {
    let recording = recorder::record();
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.fail_publishes([aborted(), aborted()]);
    p.process(vec![record(5, Some(1), "a")])
        .await
        .expect("processed after two aborts");
    // Each abort is warned about once; the third attempt commits, so nothing failed for good.
    assert_eq!(recording.count_at("TransactionRetried", Level::WARN), 2);
    assert_eq!(recording.count("TransactionFailed"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_transaction_that_keeps_aborting_reports_its_retries_then_one_failure() {
    let recording = recorder::record();
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    let allowed = super::protocol::ABORTED_BATCH_RETRIES_ALLOWED;
    p.fail_publishes((0..=allowed).map(|_| aborted()));
    let result = p.process(vec![record(0, Some(1), "a")]).await;
    assert!(result.is_err(), "{result:?}");
    assert_eq!(recording.count("TransactionRetried"), allowed as usize);
    assert_eq!(recording.count("TransactionFailed"), 1);
    // The failure comes last: nothing is retried after it.
    assert_eq!(
        recording.names().last().map(String::as_str),
        Some("TransactionFailed")
    );
}

#[tokio::test(start_paused = true)]
async fn a_fenced_transaction_is_one_failure_and_never_retried() {
    let recording = recorder::record();
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.fail_publishes([fenced()]);
    let result = p.process(vec![record(0, Some(1), "a")]).await;
    assert!(matches!(result, Err(ref e) if e.is_fenced()), "{result:?}");
    assert_eq!(recording.count("TransactionFailed"), 1);
    assert_eq!(recording.count("TransactionRetried"), 0);
}

#[tokio::test(start_paused = true)]
async fn each_unkeyed_record_is_reported_and_warned_about_once_a_minute() {
    let recording = recorder::record();
    let (mut p, _) = pipeline(UnkeyedPolicy::DeadLetter, ReusedIdPolicy::Drop);
    // Two records without an id in the first batch, one in the second.
    p.process(vec![
        record(0, None, "x"),
        record(1, Some(1), "a"),
        record(2, None, "y"),
    ])
    .await
    .expect("first batch");
    p.process(vec![record(3, None, "z")])
        .await
        .expect("second batch");
    assert_eq!(recording.count("UnkeyedRecord"), 3);
    // Only the first is warned about: the others come within the minute.
    assert_eq!(recording.count_at("UnkeyedRecord", Level::WARN), 1);
    // A batch where every record has its id reports none.
    recording.clear();
    p.process(vec![record(4, Some(2), "b")])
        .await
        .expect("keyed batch");
    assert_eq!(recording.count("UnkeyedRecord"), 0);
}

#[tokio::test(start_paused = true)]
async fn misrouted_records_are_reported_per_batch_warned_about_once_and_still_deduplicated() {
    let recording = recorder::record();
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    let misrouted = |offset, id, value| InRecord {
        misrouted: true,
        ..record(offset, Some(id), value)
    };
    // The first batch holds two misrouted records and a home one; the second repeats one of
    // them; the third holds none.
    p.process(vec![
        misrouted(0, 1, "m"),
        record(1, Some(2), "b"),
        misrouted(2, 3, "n"),
    ])
    .await
    .expect("first batch");
    p.process(vec![misrouted(3, 1, "m")])
        .await
        .expect("second batch");
    p.process(vec![record(4, Some(4), "c")])
        .await
        .expect("third batch");
    assert_eq!(recording.count("MisroutedIds"), 2);
    assert_eq!(recording.count_at("MisroutedIds", Level::WARN), 1);
    // Misrouted or not, a repeat is dropped.
    let committed = p.committed();
    let all: Vec<&str> = committed.iter().flat_map(|o| values(&o.records)).collect();
    assert_eq!(all, ["m", "b", "n", "c"]);
}

#[tokio::test(start_paused = true)]
async fn a_forget_reports_what_it_forgot_or_why_it_failed() {
    let recording = recorder::record();
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.process(vec![record(0, Some(1), "a")])
        .await
        .expect("first batch");
    let (request, answer) = forget_request(&[1, 9]);
    p.forget(request).await.expect("forget");
    answer.await.expect("answered").expect("done");
    assert_eq!(recording.count_at("IdsForgotten", Level::INFO), 1);
    assert_eq!(recording.count("ForgetFailed"), 0);
    // A forget whose transaction is fenced takes no effect, and says so.
    p.fail_publishes([fenced()]);
    let (request, answer) = forget_request(&[2]);
    assert!(p.forget(request).await.is_err());
    assert!(answer.await.expect("answered").is_err());
    assert_eq!(recording.count_at("ForgetFailed", Level::WARN), 1);
    assert_eq!(recording.count("IdsForgotten"), 1);
}

/// A record of `size` bytes of value at `offset` with id `n`.
fn large(offset: i64, n: u8, size: usize) -> InRecord {
    let mut r = record(offset, Some(n), "");
    r.out.value = Some(vec![b'x'; size]);
    r
}

fn next_offsets(committed: &[Published]) -> Vec<i64> {
    committed.iter().map(|p| p.next_input_offset).collect()
}

/// A transaction refused for its first record's size.
fn too_large() -> PublishError {
    PublishError::Refused {
        refused: vec![dedupe::output::RefusedRecord {
            topic: dedupe::output::RefusedIn::Output,
            index: 0,
            code: RDKafkaErrorCode::MessageSizeTooLarge,
        }],
        source: KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge),
    }
}

#[tokio::test(start_paused = true)]
async fn a_refused_record_is_dead_lettered_alone_and_the_records_around_it_are_published() {
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    let events = recorder::record();
    // The sink refuses records over 300 bytes, as the output's and the dead-letter topic's
    // max.message.bytes would: the second record of three is over it, and so is its dead letter
    // with its value.
    p.refuse_larger_than(Some(300));
    let processed = p
        .process(vec![
            record(0, Some(1), "a"),
            large(1, 2, 500),
            record(2, Some(3), "c"),
        ])
        .await
        .expect("processed");
    assert!(matches!(processed, super::refusal::Processed::Through));
    // The record before it committed on its own; the refused one alone, as a dead letter without
    // its value (the dead-letter topic refused it with its value too); the one after it on its
    // own.
    let committed = p.committed().clone();
    assert_eq!(next_offsets(&committed), [1, 2, 3]);
    assert_eq!(values(&committed[0].records), ["a"]);
    assert!(committed[1].records.is_empty());
    let dead = &committed[1].dead_letters;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].value, None, "without its value");
    let header = |name: &str| {
        dead[0]
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.clone())
    };
    assert_eq!(
        header(dedupe::wire::HEADER_REFUSED_SOURCE),
        Some(b"in:0:1".to_vec())
    );
    assert_eq!(
        header(dedupe::wire::HEADER_REASON),
        Some(b"too_large".to_vec())
    );
    assert_eq!(values(&committed[2].records), ["c"]);
    // Its id is held, so its copy is a duplicate: dropped, never dead-lettered again.
    assert_eq!(p.held().len(), 3);
    p.process(vec![large(3, 2, 500)]).await.expect("the copy");
    let last = p.committed().last().cloned().expect("a batch");
    assert!(last.records.is_empty() && last.dead_letters.is_empty());
    assert_eq!(last.next_input_offset, 4);
    assert_eq!(
        events.count_at("RecordDeadLettered", Level::WARN),
        1,
        "counted and logged once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_record_the_dead_letter_topic_takes_keeps_its_value() {
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    // Refused by the output only, once, for its timestamp (the double's size limit would refuse
    // its dead letter too).
    p.fail_publishes([PublishError::Refused {
        refused: vec![dedupe::output::RefusedRecord {
            topic: dedupe::output::RefusedIn::Output,
            index: 0,
            code: RDKafkaErrorCode::InvalidTimestamp,
        }],
        source: KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTimestamp),
    }]);
    p.process(vec![record(0, Some(1), "a")])
        .await
        .expect("processed");
    // Refused alone at once (a batch of one): dead-lettered with its value and its reason.
    let committed = p.committed().clone();
    assert_eq!(committed.len(), 1);
    let dead = &committed[0].dead_letters;
    assert_eq!(values(dead), ["a"]);
    assert!(dead[0]
        .headers
        .iter()
        .any(|(k, v)| k == dedupe::wire::HEADER_REASON
            && v.as_deref() == Some(&b"invalid_timestamp"[..])));
}

#[tokio::test(start_paused = true)]
async fn without_a_dead_letter_topic_the_partition_stops_at_the_refused_record_and_heals() {
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.dead_letter_topic(None);
    p.refuse_larger_than(Some(100));
    let processed = p
        .process(vec![
            record(0, Some(1), "a"),
            large(1, 2, 500),
            record(2, Some(3), "c"),
        ])
        .await
        .expect("processed");
    // The record before it is committed; the partition stops at it, nothing after it published.
    let super::refusal::Processed::StoppedAt { rest, code, .. } = processed else {
        panic!("stopped at the refused record: {processed:?}");
    };
    assert_eq!(rest.iter().map(|r| r.offset).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(code, RDKafkaErrorCode::MessageSizeTooLarge);
    assert_eq!(next_offsets(&p.committed()), [1]);
    assert_eq!(p.progress().map(|g| g.next_input_offset), Some(1));

    // Waiting out the stall: refused at its next three tries (as by a topic whose limit is
    // raised only then), then the record and the one after it go through.
    let events = recorder::record();
    p.refuse_larger_than(None);
    p.fail_publishes((0..3).map(|_| too_large()));
    let board = Arc::clone(&p.settings.board);
    let stall = super::stall::Stall::new(rest, code, dedupe::output::RefusedIn::Output);
    let (_stop_tx, mut stop) = tokio::sync::watch::channel(false);
    let (_forget_tx, mut forgets) = tokio::sync::mpsc::unbounded_channel();
    let waited = {
        let wait = p.wait_out(stall, &mut stop, &mut forgets);
        tokio::pin!(wait);
        tokio::select! {
            _ = &mut wait => panic!("healed while still refused"),
            _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
        }
        assert_eq!(board.stalled_at(0), Some(1), "the lag counts from it");
        wait.await.expect("healed")
    };
    assert!(!waited, "healed, not stopped");
    assert_eq!(next_offsets(&p.committed()), [1, 2, 3]);
    assert_eq!(p.held().len(), 3);
    assert_eq!(p.settings.board.stalled_at(0), None);
    assert!(events.count_at("PartitionStalled", Level::ERROR) >= 1);
    assert_eq!(events.count_at("PartitionHealed", Level::INFO), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_partition_stops_when_told_and_clears_its_stall() {
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.dead_letter_topic(None);
    p.refuse_larger_than(Some(100));
    let stall = super::stall::Stall::new(
        vec![large(0, 1, 500)],
        RDKafkaErrorCode::MessageSizeTooLarge,
        dedupe::output::RefusedIn::Output,
    );
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    let (_forget_tx, mut forgets) = tokio::sync::mpsc::unbounded_channel();
    let stopper = async {
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        stop_tx.send(true).expect("the pipeline listens");
        std::future::pending::<()>().await;
    };
    let stopped = tokio::select! {
        r = p.wait_out(stall, &mut stop, &mut forgets) => r.expect("stopped"),
        _ = stopper => unreachable!(),
    };
    assert!(stopped);
    assert!(p.committed().is_empty(), "nothing published past it");
    assert_eq!(p.settings.board.stalled_at(0), None);
}

/// The value of the counter `name` whose labels include each of `labels` (`key="value"`), from
/// the text a Prometheus recorder renders.
fn counter_value(rendered: &str, name: &str, labels: &[&str]) -> Option<u64> {
    rendered
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|label| l.contains(label)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(start_paused = true)]
async fn a_batch_split_by_a_refusal_counts_each_record_once() {
    // A recorder of the test's own, on this thread, before the pipeline registers its counters.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    p.refuse_larger_than(Some(300));
    // Decided five times in parts (the whole, the two before the refused record, the refused one
    // three times, the two after it): each record counts once, in the part that committed.
    p.process(vec![
        record(0, Some(1), "a"),
        record(1, Some(1), "a"),
        large(2, 2, 500),
        record(3, Some(3), "c"),
        record(4, None, "u"),
    ])
    .await
    .expect("processed");
    assert_eq!(next_offsets(&p.committed()), [2, 3, 5]);
    let rendered = handle.render();
    let source = |outcome: &str| {
        counter_value(
            &rendered,
            dedupe::metrics::SOURCE_RECORDS,
            &["source=\"none\"", &format!("outcome=\"{outcome}\"")],
        )
    };
    assert_eq!(source("published"), Some(2), "a and c:\n{rendered}");
    assert_eq!(source("duplicate"), Some(1), "a's copy:\n{rendered}");
    let dropped = counter_value(
        &rendered,
        dedupe::metrics::DUPLICATES_DROPPED,
        &["verdict=\"retry\""],
    );
    assert_eq!(dropped, Some(1), "{rendered}");
    let unkeyed = counter_value(&rendered, dedupe::metrics::UNKEYED, &[]);
    assert_eq!(unkeyed, Some(1), "{rendered}");
}

#[tokio::test(start_paused = true)]
async fn a_dead_lettered_record_is_in_the_audit_and_its_copy_is_audited_as_a_drop() {
    let (mut p, _) = pipeline(UnkeyedPolicy::Forward, ReusedIdPolicy::Drop);
    let mut auditing = (*p.settings).clone();
    auditing.audit = Some(super::AuditSettings {
        payloads: false,
        sample: 1.0,
        max_per_sec: 1_000,
    });
    p.settings = Arc::new(auditing);
    p.sampler = Some(dedupe::audit::Sampler::new(1.0, 1_000));
    p.refuse_larger_than(Some(300));
    p.process(vec![record(0, Some(1), "a"), large(1, 2, 500)])
        .await
        .expect("processed");
    let committed = p.committed().clone();
    assert_eq!(next_offsets(&committed), [1, 2]);
    // In the transaction of its dead letter, one audit record says where it went and why.
    assert_eq!(committed[1].dead_letters.len(), 1);
    let audit = &committed[1].audit;
    assert_eq!(audit.len(), 1);
    let value: serde_json::Value =
        serde_json::from_slice(audit[0].value.as_deref().expect("a value")).expect("JSON");
    assert_eq!(value["event"], "dead_letter");
    assert_eq!(value["ledger_key"], key(2).hex());
    assert_eq!(value["input_topic"], "in");
    assert_eq!(value["input_offset"], 1);
    assert_eq!(value["reason"], "too_large");
    assert_eq!(value["dead_letter_topic"], "dlq");
    assert_eq!(value["with_value"], false);
    assert_eq!(value["bytes"], large(1, 2, 500).out.size());
    assert_eq!(audit[0].key, Some(vec![2]), "keyed like the input record");
    // Its copy is a duplicate, dropped and audited as one.
    p.process(vec![large(2, 2, 500)]).await.expect("the copy");
    let last = p.committed().last().cloned().expect("a batch");
    assert!(last.records.is_empty() && last.dead_letters.is_empty());
    let value: serde_json::Value =
        serde_json::from_slice(last.audit[0].value.as_deref().expect("a value")).expect("JSON");
    assert_eq!(value["verdict"], "retry");
    assert_eq!(value["input_offset"], 2);
}

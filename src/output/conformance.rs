//! The rules every [`Sink`] keeps, as one run of batches generic over the sink: run against
//! [`MemorySink`](super::MemorySink) by the unit tests and against
//! [`OutputWriter`](super::OutputWriter) on a real broker by the workspace's `tests/sink.rs`, so
//! the double cannot promise what the transactional producer does not keep.

use super::{Batch, OutRecord, PublishError, RefusedIn, Sink};
use crate::identity::ledger_key;
use crate::store::NewId;

/// The input partition the run's batches commit their offsets for.
pub const INPUT_PARTITION: i32 = 0;

/// What a run committed, for each sink's own reading of what it holds: the output's values in
/// order, the changelog's records (the ids' record and the marks), the input offset committed
/// last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub output_values: Vec<Vec<u8>>,
    pub changelog_records: usize,
    pub next_input_offset: i64,
}

/// An output record with `value` and nothing else.
pub fn record(value: &[u8]) -> OutRecord {
    OutRecord {
        value: Some(value.to_vec()),
        ..OutRecord::default()
    }
}

/// A batch of `records`, `new_ids` and `marks` on [`INPUT_PARTITION`] of `input_topic`, committing
/// `next_input_offset`.
pub fn batch<'a>(
    input_topic: &'a str,
    records: &'a [OutRecord],
    new_ids: &'a [NewId],
    marks: &'a [Vec<u8>],
    next_input_offset: i64,
) -> Batch<'a> {
    Batch {
        records,
        dead_letters: &[],
        audit: &[],
        new_ids,
        marks,
        other_marks: &[],
        input_topic,
        input_partition: INPUT_PARTITION,
        next_input_offset,
    }
}

/// Publishes a run of batches on one fresh partition and checks what the sink answers: the
/// offset of the last record written (none for a batch without records), ever higher; the
/// changelog's offset when the batch wrote ids or marks, ever higher; a batch with a record
/// `poison` adds that the sink cannot write is refused naming that record, changes neither, and
/// is committed when sent again without it, at the latest at its second attempt: after a record the broker refused, the
/// transactional producer's next transaction fails on the sequence numbers the refused records
/// took, and only its abort bumps the producer's epoch (librdkafka's way). Kafka gives no
/// contiguous offsets (transaction markers take one each), so only the order is checked.
/// `poison` adds a record the sink cannot write to the batch's records (and may set the sink up
/// to refuse it).
pub fn run<K: Sink>(
    sink: &mut K,
    group: &K::Group,
    input_topic: &str,
    poison: impl FnOnce(&mut K, &mut Vec<OutRecord>),
) -> Expected {
    let id = [(ledger_key(b"a").expect("a valid id"), 1_000, None)];
    let two = [record(b"a"), record(b"b")];
    let first = publish(sink, &batch(input_topic, &two, &id, &[], 10), group);
    let (Some(out), Some(changelog)) = (first.last_output_offset, first.changelog_offset) else {
        panic!("records and ids written: {first:?}");
    };

    let empty = publish(sink, &batch(input_topic, &[], &[], &[], 11), group);
    assert_eq!(
        (empty.last_output_offset, empty.changelog_offset),
        (None, None),
        "a batch without records or ids"
    );

    let marks = [b"mark".to_vec()];
    let next = publish(sink, &batch(input_topic, &two[..1], &[], &marks, 12), group);
    let out = next
        .last_output_offset
        .filter(|&o| o > out)
        .unwrap_or_else(|| panic!("the output's offset after {out}: {next:?}"));
    assert!(
        next.changelog_offset.is_some_and(|o| o > changelog),
        "the changelog's offset after {changelog}: {next:?}"
    );

    let mut poisoned = vec![record(b"c")];
    poison(sink, &mut poisoned);
    let refused = sink.publish(&batch(input_topic, &poisoned, &[], &[], 13), group);
    let last = poisoned.len() - 1;
    match &refused {
        // The record that cannot be written is named, by its place in the batch (the records
        // that shared its request with the broker may be named too).
        Err(PublishError::Refused { refused, .. }) => assert!(
            refused
                .iter()
                .any(|r| r.topic == RefusedIn::Output && r.index == last),
            "the refusal names record {last}: {refused:?}"
        ),
        other => panic!("a batch with a record that cannot be written is refused: {other:?}"),
    }
    let resent = batch(input_topic, &poisoned[..1], &[], &[], 13);
    let again = match sink.publish(&resent, group) {
        Err(PublishError::Aborted { .. }) => publish(sink, &resent, group),
        first => first.unwrap_or_else(|e| panic!("the aborted batch sent again: {e}")),
    };
    assert!(
        again.last_output_offset.is_some_and(|o| o > out),
        "the aborted batch sent again, after {out}: {again:?}"
    );
    assert_eq!(again.changelog_offset, None, "a batch without ids or marks");

    Expected {
        output_values: [b"a", b"b", b"a", b"c"].map(|v| v.to_vec()).to_vec(),
        changelog_records: 2,
        next_input_offset: 13,
    }
}

fn publish<K: Sink>(sink: &mut K, batch: &Batch<'_>, group: &K::Group) -> super::Committed {
    sink.publish(batch, group)
        .unwrap_or_else(|e| panic!("batch up to input offset {}: {e}", batch.next_input_offset))
}

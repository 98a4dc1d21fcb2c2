//! The output's seam: [`Sink`], where a batch is published with the input offset that follows
//! it in one transaction. Implemented by [`OutputWriter`] (the transactional producer) and by
//! [`MemorySink`], a double that keeps the committed batches in memory for tests.

use std::collections::VecDeque;

use rdkafka::consumer::ConsumerGroupMetadata;

use super::{Batch, Committed, OutRecord, OutputWriter, PublishError};
use crate::store::NewId;

/// Where batches are published: all of a batch and its input offset are committed, or none.
pub trait Sink {
    /// What ties a transaction's input offset to its consumer (the group metadata, KIP-447:
    /// the broker refuses the offsets of a member that is no longer current).
    type Group: ?Sized;

    /// Publishes `batch` and its input offset in one transaction. An aborted transaction left
    /// nothing visible and may be sent again; a fenced sink must stop.
    fn publish(
        &mut self,
        batch: &Batch<'_>,
        group: &Self::Group,
    ) -> Result<Committed, PublishError>;
}

impl Sink for OutputWriter {
    type Group = ConsumerGroupMetadata;

    fn publish(
        &mut self,
        batch: &Batch<'_>,
        group: &ConsumerGroupMetadata,
    ) -> Result<Committed, PublishError> {
        OutputWriter::publish(self, batch, group)
    }
}

/// A batch a [`MemorySink`] committed, copied.
#[derive(Debug, Clone, Default)]
pub struct Published {
    pub records: Vec<OutRecord>,
    pub dead_letters: Vec<OutRecord>,
    pub audit: Vec<OutRecord>,
    pub new_ids: Vec<NewId>,
    pub marks: Vec<Vec<u8>>,
    pub other_marks: Vec<(i32, Vec<u8>)>,
    pub next_input_offset: i64,
}

/// A sink in memory (tests): the batches committed, in order, and the failures the next
/// attempts meet. Offsets follow Kafka's for one partition written by no one else: each record
/// takes one, and each committed transaction's marker one more.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct MemorySink {
    pub committed: Vec<Published>,
    /// Answered, in order, instead of committing (nothing of the batch is kept).
    pub failures: VecDeque<PublishError>,
    next_output_offset: i64,
    next_changelog_offset: i64,
}

impl Sink for MemorySink {
    type Group = ();

    fn publish(&mut self, batch: &Batch<'_>, _: &()) -> Result<Committed, PublishError> {
        if let Some(failure) = self.failures.pop_front() {
            return Err(failure);
        }
        let written = batch.records.len() as i64;
        let last_output_offset = (written > 0).then(|| self.next_output_offset + written - 1);
        self.next_output_offset += written + 1;
        // The ids' record, then the marker records; the offset answered is the last one's.
        let to_changelog = i64::from(!batch.new_ids.is_empty()) + batch.marks.len() as i64;
        let changelog_offset =
            (to_changelog > 0).then(|| self.next_changelog_offset + to_changelog - 1);
        if to_changelog > 0 {
            self.next_changelog_offset += to_changelog + 1;
        }
        self.committed.push(Published {
            records: batch.records.to_vec(),
            dead_letters: batch.dead_letters.to_vec(),
            audit: batch.audit.to_vec(),
            new_ids: batch.new_ids.to_vec(),
            marks: batch.marks.to_vec(),
            other_marks: batch.other_marks.to_vec(),
            next_input_offset: batch.next_input_offset,
        });
        Ok(Committed {
            last_output_offset,
            changelog_offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;

    use super::*;
    use crate::identity::ledger_key;

    fn record(value: &str) -> OutRecord {
        OutRecord {
            value: Some(value.as_bytes().to_vec()),
            ..OutRecord::default()
        }
    }

    fn batch<'a>(
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
            input_topic: "in",
            input_partition: 0,
            next_input_offset,
        }
    }

    /// What any sink answers for a run of batches on one fresh partition: the offset of the
    /// last record written (none for a batch without records), ever higher; the changelog's
    /// offset when the batch wrote ids or marks, ever higher; an aborted transaction changes
    /// neither. Kafka gives no contiguous offsets (transaction markers take one each), so only
    /// the order is checked.
    fn keeps_the_sink_rules<K: Sink>(sink: &mut K, group: &K::Group) {
        let id = [(ledger_key(b"a").unwrap(), 1_000, None)];
        let two = [record("a"), record("b")];
        let first = sink.publish(&batch(&two, &id, &[], 10), group).unwrap();
        let (Some(out), Some(changelog)) = (first.last_output_offset, first.changelog_offset)
        else {
            panic!("records and ids written: {first:?}");
        };
        let empty = sink.publish(&batch(&[], &[], &[], 11), group).unwrap();
        assert_eq!(
            (empty.last_output_offset, empty.changelog_offset),
            (None, None)
        );
        let marks = [b"mark".to_vec()];
        let next = sink
            .publish(&batch(&two[..1], &[], &marks, 12), group)
            .unwrap();
        assert!(next.last_output_offset.is_some_and(|o| o > out), "{next:?}");
        assert!(
            next.changelog_offset.is_some_and(|o| o > changelog),
            "{next:?}"
        );
    }

    #[test]
    fn the_memory_sink_keeps_the_sink_rules_and_what_it_committed() {
        let mut sink = MemorySink::default();
        keeps_the_sink_rules(&mut sink, &());
        assert_eq!(
            sink.committed
                .iter()
                .map(|p| p.next_input_offset)
                .collect::<Vec<_>>(),
            [10, 11, 12]
        );
        // An aborted transaction leaves nothing.
        sink.failures.push_back(PublishError::Aborted {
            source: KafkaError::MessageProduction(RDKafkaErrorCode::Fail),
        });
        let failed = sink.publish(&batch(&[record("c")], &[], &[], 13), &());
        assert!(matches!(failed, Err(PublishError::Aborted { .. })));
        assert_eq!(sink.committed.len(), 3);
    }
}

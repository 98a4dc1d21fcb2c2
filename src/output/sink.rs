//! The output's seam: [`Sink`], where a batch is published with the input offset that follows
//! it in one transaction. Implemented by [`OutputWriter`] (the transactional producer) and by
//! [`MemorySink`], a double that keeps the committed batches in memory for tests. Both are held
//! to one run of checks, `conformance.rs`.

use std::collections::VecDeque;

use rdkafka::consumer::ConsumerGroupMetadata;

use super::{Batch, Committed, OutRecord, OutputWriter, PublishError, RefusedIn, RefusedRecord};
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
    /// Output records and dead letters whose key, value and headers together are larger than
    /// this are refused for good, as a topic's `max.message.bytes` refuses them.
    pub refuse_larger_than: Option<usize>,
    next_output_offset: i64,
    next_changelog_offset: i64,
}

impl Sink for MemorySink {
    type Group = ();

    fn publish(&mut self, batch: &Batch<'_>, _: &()) -> Result<Committed, PublishError> {
        if let Some(failure) = self.failures.pop_front() {
            return Err(failure);
        }
        if let Some(refused) = self.refused(batch) {
            return Err(refused);
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

impl MemorySink {
    /// The batch's records over [`MemorySink::refuse_larger_than`], as a refusal.
    fn refused(&self, batch: &Batch<'_>) -> Option<PublishError> {
        let limit = self.refuse_larger_than?;
        let code = rdkafka::types::RDKafkaErrorCode::MessageSizeTooLarge;
        let over = |topic: RefusedIn, records: &[OutRecord]| {
            records
                .iter()
                .enumerate()
                .filter(|(_, r)| r.size() > limit)
                .map(|(index, _)| RefusedRecord { topic, index, code })
                .collect::<Vec<_>>()
        };
        let mut refused = over(RefusedIn::Output, batch.records);
        refused.extend(over(RefusedIn::DeadLetter, batch.dead_letters));
        (!refused.is_empty()).then(|| PublishError::Refused {
            refused,
            source: rdkafka::error::KafkaError::MessageProduction(code),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::conformance::{self, Expected};

    #[test]
    fn the_memory_sink_keeps_the_sink_rules_and_what_it_committed() {
        let mut sink = MemorySink::default();
        let expected = conformance::run(&mut sink, &(), "in", |sink, records| {
            sink.refuse_larger_than = Some(100);
            records.push(conformance::record(&[7; 101]));
        });
        // The aborted attempt left nothing, and the double commits the batch at its first
        // attempt again: four batches committed, in order.
        assert_eq!(
            sink.committed
                .iter()
                .map(|p| p.next_input_offset)
                .collect::<Vec<_>>(),
            [10, 11, 12, 13]
        );
        let held = Expected {
            output_values: sink
                .committed
                .iter()
                .flat_map(|p| &p.records)
                .map(|r| r.value.clone().unwrap_or_default())
                .collect(),
            changelog_records: sink
                .committed
                .iter()
                .map(|p| usize::from(!p.new_ids.is_empty()) + p.marks.len())
                .sum(),
            next_input_offset: sink.committed.last().map_or(-1, |p| p.next_input_offset),
        };
        assert_eq!(held, expected);
    }
}

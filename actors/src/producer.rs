//! `Publisher` owns one output partition's transactional producer. It runs alone on its own
//! arbiter thread, because every transactional call blocks. It handles one batch at a time:
//! a batch's records and its input offset are committed in one transaction, or not at all.
//!
//! Each transaction carries the input consumer's group metadata as it is at that moment (KIP-447):
//! under the group protocol a member's epoch changes with every assignment change, and the broker
//! refuses the offsets of a member that is no longer current, aborting the whole transaction.

use std::sync::Arc;

use actix::prelude::*;
use dedupe::output::{Batch, Committed, OutRecord, OutputWriter, PublishError, Sink};
use dedupe::store::NewId;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::membership::Input;

pub struct Publisher {
    writer: OutputWriter,
    input_topic: String,
    partition: i32,
    consumer: Arc<Input>,
}

impl Publisher {
    pub fn new(
        writer: OutputWriter,
        input_topic: String,
        partition: i32,
        consumer: Arc<Input>,
    ) -> Self {
        Self {
            writer,
            input_topic,
            partition,
            consumer,
        }
    }
}

impl Actor for Publisher {
    type Context = Context<Self>;
}

/// What one batch publishes: its new records, its dead letters, and its new ids (for the
/// changelog).
pub struct Outgoing {
    pub records: Vec<OutRecord>,
    pub dead_letters: Vec<OutRecord>,
    /// Audit records of the batch's dropped duplicates (see `dedupe::audit`).
    pub audit: Vec<OutRecord>,
    /// With their first-seen times and content digests.
    pub new_ids: Vec<NewId>,
    /// Marker records for the id changelog (forgets, and re-sends after them).
    pub marks: Vec<Vec<u8>>,
    /// Re-send markers for other partitions' changelogs (see `dedupe::output::Batch::other_marks`).
    pub other_marks: Vec<(i32, Vec<u8>)>,
    /// Each output record's place among the input records it was decided from, and each dead
    /// letter's: what a refusal's index names (empty where nothing is refused, a forget's).
    pub positions: Vec<usize>,
    pub dead_letter_positions: Vec<usize>,
}

impl Outgoing {
    /// The batch to commit, with the input position that follows it.
    pub fn batch<'a>(
        &'a self,
        input_topic: &'a str,
        input_partition: i32,
        next_input_offset: i64,
    ) -> Batch<'a> {
        Batch {
            records: &self.records,
            dead_letters: &self.dead_letters,
            audit: &self.audit,
            new_ids: &self.new_ids,
            marks: &self.marks,
            other_marks: &self.other_marks,
            input_topic,
            input_partition,
            next_input_offset,
        }
    }
}

/// Publish a batch with the input offset that follows it. The batch is shared, so an attempt
/// sent again after an aborted transaction copies nothing.
#[derive(Message)]
#[rtype(result = "Result<Committed, PublishError>")]
pub struct Publish {
    pub outgoing: Arc<Outgoing>,
    pub next_input_offset: i64,
}

impl Handler<Publish> for Publisher {
    type Result = Result<Committed, PublishError>;
    fn handle(&mut self, msg: Publish, _: &mut Self::Context) -> Self::Result {
        let Some(group) = self.consumer.group_metadata() else {
            return Err(PublishError::Aborted {
                source: KafkaError::MessageProduction(RDKafkaErrorCode::State),
            });
        };
        let batch = msg
            .outgoing
            .batch(&self.input_topic, self.partition, msg.next_input_offset);
        Sink::publish(&mut self.writer, &batch, &group)
    }
}

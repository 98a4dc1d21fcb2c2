//! `Publisher` owns one output partition's transactional producer. It runs alone on its own
//! arbiter thread, because every transactional call blocks. It handles one batch at a time:
//! a batch's records and its input offset are committed in one transaction, or not at all.

use std::sync::Arc;

use actix::prelude::*;
use dedupe::output::{Committed, OutRecord, OutputWriter, PublishError};
use rdkafka::consumer::ConsumerGroupMetadata;

pub struct Publisher {
    writer: OutputWriter,
    input_topic: String,
    partition: i32,
    group: Arc<ConsumerGroupMetadata>,
}

impl Publisher {
    pub fn new(writer: OutputWriter, input_topic: String, partition: i32, group: Arc<ConsumerGroupMetadata>) -> Self {
        Self { writer, input_topic, partition, group }
    }
}

impl Actor for Publisher {
    type Context = Context<Self>;
}

/// Publish a batch's new records (and dead letters) with the input offset that follows it.
#[derive(Message)]
#[rtype(result = "Result<Committed, PublishError>")]
pub struct Publish {
    pub records: Vec<OutRecord>,
    pub dead_letters: Vec<OutRecord>,
    pub next_input_offset: i64,
}

impl Handler<Publish> for Publisher {
    type Result = Result<Committed, PublishError>;
    fn handle(&mut self, msg: Publish, _: &mut Self::Context) -> Self::Result {
        self.writer.publish(
            &msg.records,
            &msg.dead_letters,
            &self.input_topic,
            self.partition,
            msg.next_input_offset,
            &self.group,
        )
    }
}

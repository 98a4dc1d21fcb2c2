//! The output's [`Sink`] on the real broker: the transactional producer held to the run of checks
//! the in-memory double keeps (`src/output/conformance.rs`), once with a batch the broker refuses
//! and once with one the producer refuses itself, and what only a broker shows: the committed
//! batches are what a `read_committed` reader sees, the input offset is committed with them, an
//! aborted batch leaves none of its records, and a producer fenced by a newer one of its partition
//! publishes nothing more.

use std::time::Duration;

use dedupe::output::conformance::{self, Expected, INPUT_PARTITION};
use dedupe::output::{OutputTopics, OutputWriter, PublishError};
use kit::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

/// The output topic's `max.message.bytes`: a record over it (compressed) is refused by the
/// broker, which aborts its transaction.
const OUTPUT_MAX_BYTES: usize = 10_000;

/// Over the producer's own `message.max.bytes` (librdkafka's default, 1,000,000): refused as it
/// is sent, before the broker sees it.
const OVER_THE_PRODUCERS_LIMIT: usize = 1_100_000;

const TRANSACTION_TIMEOUT_MS: u64 = 60_000;

/// A consumer of `group` that reads nothing: it only gives its group's metadata to the
/// transactions and reads the group's committed offsets.
fn group_consumer(group: &str) -> BaseConsumer {
    client_config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer")
}

fn committed_offset(consumer: &BaseConsumer, topic: &str) -> Offset {
    let mut partitions = TopicPartitionList::new();
    partitions.add_partition(topic, INPUT_PARTITION);
    let committed = consumer
        .committed_offsets(partitions, Duration::from_secs(10))
        .expect("the group's committed offsets");
    committed.elements()[0].offset()
}

fn values(topic: &str) -> Vec<Vec<u8>> {
    consume_all(topic, true)
        .into_iter()
        .map(|r| r.value.unwrap_or_default())
        .collect()
}

/// Bytes that do not compress: the producer compresses (lz4), and the topic's limit is on the
/// compressed batch.
fn noise(len: usize) -> Vec<u8> {
    (0..len).map(|_| rand::random()).collect()
}

/// A pipeline's topics on the broker (one partition each), and a consumer of its group.
struct Topics {
    input: TestTopic,
    output: TestTopic,
    changelog: TestTopic,
    consumer: BaseConsumer,
}

impl Topics {
    fn create() -> Self {
        let output = TestTopic::create_with(
            "sink-out",
            1,
            &[("max.message.bytes", &OUTPUT_MAX_BYTES.to_string())],
        );
        Self {
            input: TestTopic::create("sink-in", 1),
            changelog: TestTopic::create("sink-out-ids", 1),
            consumer: group_consumer(&format!("sink-{}", output.name)),
            output,
        }
    }

    fn open(&self) -> OutputWriter {
        let topics = OutputTopics {
            output: &self.output.name,
            changelog: &self.changelog.name,
            dead_letter: None,
            audit: None,
        };
        OutputWriter::open(&kafka_config(), &topics, 0, TRANSACTION_TIMEOUT_MS)
            .expect("the output producer")
    }

    /// Runs the sink's conformance run on `writer` with a last batch carrying `poison`, and checks
    /// that the broker holds what the run committed and nothing of the aborted batch.
    fn run(&self, writer: &mut OutputWriter, poison: Vec<u8>) -> Expected {
        let group = self
            .consumer
            .group_metadata()
            .expect("the group's metadata");
        let expected = conformance::run(writer, &group, &self.input.name, |_, records| {
            records.push(conformance::record(&poison))
        });
        let held = Expected {
            output_values: values(&self.output.name),
            changelog_records: consume_all(&self.changelog.name, true).len(),
            next_input_offset: match committed_offset(&self.consumer, &self.input.name) {
                Offset::Offset(o) => o,
                other => panic!("no input offset committed: {other:?}"),
            },
        };
        assert_eq!(held, expected, "what the broker holds after the run");
        expected
    }
}

#[test]
fn the_output_writer_keeps_the_sink_rules_on_the_broker_and_a_fenced_one_publishes_nothing() {
    let topics = Topics::create();
    let mut writer = topics.open();
    let expected = topics.run(&mut writer, noise(2 * OUTPUT_MAX_BYTES));

    // A newer producer of the partition fences this one: its next batch is refused as fenced,
    // and nothing of it, nor its input offset, is committed.
    let mut newer = topics.open();
    let group = topics
        .consumer
        .group_metadata()
        .expect("the group's metadata");
    let input = &topics.input.name;
    let zombie = [conformance::record(b"zombie")];
    let refused = writer.publish(&conformance::batch(input, &zombie, &[], &[], 20), &group);
    assert!(
        matches!(refused, Err(PublishError::Fenced { .. })),
        "a fenced producer's batch: {refused:?}"
    );
    let current = [conformance::record(b"d")];
    newer
        .publish(&conformance::batch(input, &current, &[], &[], 14), &group)
        .expect("the newer producer's batch");
    let mut all = expected.output_values;
    all.push(b"d".to_vec());
    assert_eq!(values(&topics.output.name), all);
    assert_eq!(
        committed_offset(&topics.consumer, input),
        Offset::Offset(14)
    );
}

#[test]
fn a_record_the_producer_refuses_itself_aborts_its_batch_and_the_batch_sent_again_commits() {
    let topics = Topics::create();
    let mut writer = topics.open();
    topics.run(&mut writer, noise(OVER_THE_PRODUCERS_LIMIT));
}

//! Which pipeline a consumer group's committed offsets belong to. Every output transaction
//! commits its input offset with metadata naming the output topic ([`offset_metadata`]); a worker
//! about to start reads its group's committed offsets and refuses to run when they name another
//! output ([`check_owner`]): two pipelines on one input that shared a group would each resume at
//! the other's position and skip the records it had not read.
//!
//! Offsets committed without the metadata (by a release before it, or by another tool) name no
//! pipeline and are taken as this one's.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::TopicPartitionList;

use crate::kafka::{client_config, KafkaConfig};

/// What the metadata of a committed offset starts with; the output topic follows.
const PREFIX: &str = "dedupe output=";

/// The metadata every committed input offset of the pipeline writing `output_topic` carries.
pub fn offset_metadata(output_topic: &str) -> String {
    format!("{PREFIX}{output_topic}")
}

/// The output topic a committed offset's metadata names, if it is one of ours.
pub fn output_named(metadata: &str) -> Option<&str> {
    metadata.strip_prefix(PREFIX)
}

/// A group already committing for another pipeline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "consumer group `{group}` already commits offsets of {input_topic} for the output topic `{other_output}` (input partition {partition}), and this worker writes `{output}`: two pipelines sharing a group move each other's restart point and skip records; give this pipeline its own worker.group_id (unset, it is dedupe.<output_topic>)"
)]
pub struct GroupConflict {
    pub group: String,
    pub input_topic: String,
    pub partition: i32,
    pub other_output: String,
    pub output: String,
}

/// Refuses a group whose committed offsets (partition and metadata, as read) name an output
/// other than `output`.
pub fn check_owner(
    group: &str,
    input_topic: &str,
    output: &str,
    committed: &[(i32, String)],
) -> Result<(), GroupConflict> {
    match committed
        .iter()
        .find_map(|(p, m)| output_named(m).filter(|o| *o != output).map(|o| (*p, o)))
    {
        None => Ok(()),
        Some((partition, other)) => Err(GroupConflict {
            group: group.to_string(),
            input_topic: input_topic.to_string(),
            partition,
            other_output: other.to_string(),
            output: output.to_string(),
        }),
    }
}

/// The metadata of `group`'s committed offsets for `partitions` of `topic` (partitions with no
/// committed offset are left out). Retries while the group's coordinator is loading or moving,
/// up to `timeout`.
///
/// Reads `read_uncommitted`: a `read_committed` client asks for stable offsets only, and a crashed
/// worker's open transaction keeps its partition's offset unstable until a new producer fences it
/// (which happens after this check) or the transaction times out. The committed offset before it
/// carries the same metadata.
pub fn committed_metadata(
    kafka: &KafkaConfig,
    group: &str,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
) -> Result<Vec<(i32, String)>, KafkaError> {
    let consumer: BaseConsumer = client_config(kafka)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_uncommitted")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        tpl.add_partition(topic, p);
    }
    let deadline = Instant::now() + timeout;
    let got = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Ok(got) => break got,
            Err(e) if Instant::now() < deadline && passing(&e) => {
                std::thread::sleep(Duration::from_millis(250))
            }
            Err(e) => return Err(e),
        }
    };
    Ok(got
        .elements()
        .iter()
        .filter(|e| matches!(e.offset(), rdkafka::Offset::Offset(_)))
        .map(|e| (e.partition(), e.metadata().to_string()))
        .collect())
}

/// Errors of an offset fetch that go away by themselves: the coordinator moving or loading, a
/// transaction in flight on the group's offsets, a broker's transient refusal.
fn passing(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    crate::kafka::is_transient(e)
        || matches!(
            e.rdkafka_error_code(),
            Some(
                C::NotCoordinator
                    | C::CoordinatorNotAvailable
                    | C::CoordinatorLoadInProgress
                    | C::UnstableOffsetCommit
            )
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(rows: &[(i32, &str)]) -> Vec<(i32, String)> {
        rows.iter().map(|(p, m)| (*p, m.to_string())).collect()
    }

    #[test]
    fn a_group_committing_for_another_output_is_refused_naming_both() {
        // Partition 1's offset was committed by the pipeline writing `a.out`; this one writes `b.out`.
        let rows = committed(&[
            (0, &offset_metadata("b.out")),
            (1, &offset_metadata("a.out")),
        ]);
        let e = check_owner("dedupe", "in", "b.out", &rows).unwrap_err();
        assert_eq!((e.partition, e.other_output.as_str()), (1, "a.out"));
        let line = e.to_string();
        assert!(
            line.contains("`dedupe`")
                && line.contains("`a.out`")
                && line.contains("`b.out`")
                && line.contains("worker.group_id"),
            "{line}"
        );
    }

    #[test]
    fn a_group_of_this_pipeline_or_with_offsets_naming_none_is_taken() {
        // Its own offsets, none yet, and offsets committed before the metadata existed.
        assert_eq!(
            check_owner(
                "g",
                "in",
                "b.out",
                &committed(&[(0, &offset_metadata("b.out"))])
            ),
            Ok(())
        );
        assert_eq!(check_owner("g", "in", "b.out", &[]), Ok(()));
        assert_eq!(
            check_owner(
                "g",
                "in",
                "b.out",
                &committed(&[(0, ""), (1, "written by a tool")])
            ),
            Ok(())
        );
    }

    #[test]
    fn an_output_topic_with_the_prefix_in_its_name_reads_back_whole() {
        assert_eq!(
            output_named(&offset_metadata("dedupe output=x")),
            Some("dedupe output=x")
        );
        assert_eq!(output_named("other"), None);
    }
}

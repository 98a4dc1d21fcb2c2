//! Which partition a keyed record goes to, as the producers choose it: what tells the worker that
//! an id arrived on a partition it does not belong in, and `dedupe explain` which partition an id
//! is in.

use serde::{Deserialize, Serialize};

/// A Kafka producer's partitioner for keyed records (librdkafka's names).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum InputPartitioner {
    /// `murmur2(key) & 0x7fffffff % partitions`: the Java client's default, and the front door's.
    Murmur2Random,
    /// `crc32(key) % partitions`: librdkafka's default (confluent-kafka for Python, Go, .NET).
    ConsistentRandom,
}

impl InputPartitioner {
    /// Both: the partitioners nearly every producer uses.
    pub const ALL: [InputPartitioner; 2] = [Self::Murmur2Random, Self::ConsistentRandom];

    /// The other common partitioner.
    pub fn other(self) -> Self {
        match self {
            Self::Murmur2Random => Self::ConsistentRandom,
            Self::ConsistentRandom => Self::Murmur2Random,
        }
    }

    /// The partition this partitioner chooses for a record keyed `key` in a topic of `partitions`
    /// partitions (librdkafka's own implementations); `None` for an empty key or no partitions.
    pub fn partition(self, key: &[u8], partitions: i32) -> Option<i32> {
        if key.is_empty() || partitions <= 0 {
            return None;
        }
        let choose = match self {
            Self::Murmur2Random => rdkafka::bindings::rd_kafka_msg_partitioner_murmur2_random,
            Self::ConsistentRandom => rdkafka::bindings::rd_kafka_msg_partitioner_consistent_random,
        };
        // SAFETY: with a key that is not null, these partitioners read `keylen` bytes of `key` and
        // nothing else (the topic and opaque pointers are used only for a null key).
        let p = unsafe {
            choose(
                std::ptr::null(),
                key.as_ptr().cast(),
                key.len(),
                partitions,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        Some(p)
    }
}

/// Whether a record whose id is `id` is on a partition that id belongs in: one that a producer
/// keying the record by its id would have chosen with either common partitioner. An id elsewhere
/// was keyed by something else (or the topic has gained partitions since it was written): its
/// copies may be on other partitions, where another worker's ledger sees them.
pub fn is_home(id: &[u8], partition: i32, partitions: i32) -> bool {
    partitions <= 1
        || InputPartitioner::ALL.iter().any(|p| {
            p.partition(id, partitions)
                .is_none_or(|home| home == partition)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partitioners_choose_as_the_clients_do() {
        // Known vectors, from the Java client's murmur2 and zlib's crc32 computed apart.
        assert_eq!(InputPartitioner::Murmur2Random.partition(b"a", 6), Some(4));
        assert_eq!(
            InputPartitioner::ConsistentRandom.partition(b"a", 6),
            Some(3)
        );
        let uuid = b"6ba7b810-9dad-11d1-80b4-00c04fd430c8";
        assert_eq!(InputPartitioner::Murmur2Random.partition(uuid, 6), Some(1));
        assert_eq!(
            InputPartitioner::ConsistentRandom.partition(uuid, 6),
            Some(0)
        );
        assert_eq!(InputPartitioner::Murmur2Random.partition(b"", 6), None);
        assert_eq!(InputPartitioner::Murmur2Random.partition(b"a", 0), None);
    }

    #[test]
    fn an_id_is_home_where_either_partitioner_puts_it() {
        let id = b"6ba7b810-9dad-11d1-80b4-00c04fd430c8";
        let murmur = InputPartitioner::Murmur2Random.partition(id, 8).unwrap();
        let crc = InputPartitioner::ConsistentRandom.partition(id, 8).unwrap();
        assert!(is_home(id, murmur, 8));
        assert!(is_home(id, crc, 8));
        let elsewhere = (0..8).find(|p| *p != murmur && *p != crc).unwrap();
        assert!(!is_home(id, elsewhere, 8));
        // One partition: every id is home.
        assert!(is_home(id, 0, 1));
    }
}

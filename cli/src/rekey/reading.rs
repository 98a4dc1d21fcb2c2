//! The reading side of the rekey stage's loop (`super`): records polled from the source into a
//! batch, and the rewind that sends each partition back to its first record not committed when a
//! rebalance or an aborted transaction leaves records uncopied.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::consumer::Consumer;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::Offset;

use super::events::{RekeyReadFailed, RekeyRewound};
use super::Stage;

/// A record polled from the source, owned until its batch is produced.
pub struct Polled {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp_ms: Option<i64>,
}

impl Polled {
    fn of(m: &BorrowedMessage<'_>) -> Polled {
        Polled {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers: m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
            timestamp_ms: m.timestamp().to_millis(),
        }
    }

    /// Its key, value and headers, in bytes.
    pub fn bytes(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len)
            + self.value.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
    }
}

impl Stage<'_> {
    /// Polls up to a batch of records; a rebalance drops what it gathered and rewinds.
    pub(super) fn gather(&mut self, stop: &AtomicBool) -> anyhow::Result<Vec<Polled>> {
        let mut batch = Vec::new();
        let mut deadline: Option<Instant> = None;
        // Taken before the first poll: the epoch the batch's records are read under.
        self.gathered_under = self.consumer.group_metadata();
        while batch.len() < self.options.batch_max_records && !stop.load(Ordering::Relaxed) {
            let wait = deadline.map_or(Duration::from_millis(100), |d| {
                d.saturating_duration_since(Instant::now())
            });
            if deadline.is_some() && wait.is_zero() {
                break;
            }
            let polled = self.consumer.poll(wait);
            if self.rebalanced.swap(false, Ordering::SeqCst) {
                // What was read before the rebalance, this record included, is read again (on
                // the partitions still assigned; the others start from their committed offsets
                // wherever they go).
                if let Some(Ok(m)) = &polled {
                    batch.push(Polled::of(m));
                }
                drop(polled);
                self.rewind(&batch)?;
                batch.clear();
                deadline = None;
                self.gathered_under = self.consumer.group_metadata();
                continue;
            }
            match polled {
                Some(Ok(m)) => {
                    deadline.get_or_insert_with(|| Instant::now() + self.options.batch_linger);
                    batch.push(Polled::of(&m));
                }
                Some(Err(e)) => RekeyReadFailed { error: &e }.emit(),
                None if deadline.is_none() => break,
                None => {}
            }
            if batch.is_empty() {
                // Nothing read yet: the next poll's records are read under the epoch as it is
                // now (a first join, or a rejoin, has given the member its epoch meanwhile).
                self.gathered_under = self.consumer.group_metadata();
            }
        }
        Ok(batch)
    }

    /// Seeks each source partition that `uncommitted` holds records of, and that is still
    /// assigned, back to its first record there: every record read since the last commit is
    /// in the batch, so that is where the committed offset points (past any transaction
    /// markers between them). Fails if a seek does: the stage must not read on past records it
    /// did not copy (a restart resumes from the committed offsets).
    pub(super) fn rewind(&self, uncommitted: &[Polled]) -> anyhow::Result<()> {
        let assignment = self
            .consumer
            .assignment()
            .context("reading the rekey consumer's assignment to rewind it")?;
        let topic = &self.options.source_topic;
        let mut partitions = 0;
        for (p, offset) in first_offsets(uncommitted) {
            if assignment.find_partition(topic, p).is_none() {
                // Revoked: whoever takes it starts from its committed offset.
                continue;
            }
            self.consumer
                .seek(topic, p, Offset::Offset(offset), Duration::from_secs(10))
                .with_context(|| format!("seeking the source partition {topic}/{p} back to offset {offset}, the first record not committed"))?;
            partitions += 1;
        }
        RekeyRewound { partitions }.emit();
        Ok(())
    }
}

/// Where a rewind seeks each partition of these uncommitted records: its first record among them.
fn first_offsets(records: &[Polled]) -> BTreeMap<i32, i64> {
    let mut first = BTreeMap::new();
    for r in records {
        first.entry(r.partition).or_insert(r.offset);
    }
    first
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub fn polled(partition: i32, offset: i64) -> Polled {
        Polled {
            partition,
            offset,
            key: Some(b"k".to_vec()),
            value: Some(b"value".to_vec()),
            headers: vec![("h".into(), Some(b"v".to_vec())), ("n".into(), None)],
            timestamp_ms: None,
        }
    }

    #[test]
    fn a_rewind_goes_back_to_each_partitions_first_uncommitted_record() {
        let batch = [polled(0, 5), polled(1, 7), polled(0, 6), polled(1, 9)];
        assert_eq!(first_offsets(&batch), BTreeMap::from([(0, 5), (1, 7)]));
        // After the first two are committed, the rest start where they stand.
        assert_eq!(first_offsets(&batch[2..]), BTreeMap::from([(0, 6), (1, 9)]));
        assert!(first_offsets(&[]).is_empty());
    }

    #[test]
    fn a_records_size_is_its_key_value_and_headers() {
        // 1 (key) + 5 (value) + 1 + 1 (h: v) + 1 (n, no value).
        assert_eq!(polled(0, 0).bytes(), 9);
    }
}

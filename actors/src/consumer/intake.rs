//! Reading one partition's queue into a batch: the records, copied out of the consumer's
//! buffer, each with its id (or why it has none) and whether it belongs on this partition.

use std::time::Duration;

use dedupe::identity::{identify, message_view};
use dedupe::output::OutRecord;
use rdkafka::message::{BorrowedMessage, Headers, Message};

use super::{InRecord, Pipeline};
use crate::events::InputReadFailed;
use crate::membership::Queue;

/// How long a partition's reader waits for a wakeup before it looks at its queue itself.
const LOST_WAKEUP_CHECK: Duration = Duration::from_secs(1);

impl Pipeline {
    /// From the partition's first record (or the error read instead), gathers more until the
    /// batch is full or the linger ends.
    pub(super) async fn collect<'q>(
        &self,
        queue: &'q Queue,
        first: rdkafka::error::KafkaResult<BorrowedMessage<'q>>,
    ) -> Vec<InRecord> {
        let s = &self.settings;
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        let mut deadline = None;
        let mut first = Some(first);
        while batch.len() < s.batch_max_records && bytes < s.batch_max_bytes {
            let next = match (first.take(), deadline) {
                (Some(first), _) => Ok(first),
                (None, None) => Ok(self.next_record(queue).await),
                (None, Some(d)) => tokio::time::timeout_at(d, queue.recv()).await,
            };
            match next {
                Err(_) => break,
                Ok(Ok(msg)) => {
                    bytes += msg.key_len() + msg.payload_len();
                    batch.push(self.copy(&msg));
                    if deadline.is_none() {
                        deadline = Some(tokio::time::Instant::now() + s.batch_linger);
                    }
                }
                Ok(Err(e)) => {
                    InputReadFailed {
                        partition: self.partition,
                        error: &e,
                    }
                    .emit();
                    if batch.is_empty() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    break;
                }
            }
        }
        batch
    }

    /// Waits for the partition's next record, looking at its queue at least every
    /// [`LOST_WAKEUP_CHECK`]. rdkafka wakes a waiting split-queue reader only when the queue turns
    /// from empty to non-empty, and that edge can be missed (rust-rdkafka issue 665, pull request
    /// 840 for split queues): events the library consumes itself can leave records queued with
    /// no wakeup to come. Seen here after broker restarts: one partition stopped for good, with
    /// no error, while the others went on.
    pub(super) async fn next_record<'q>(
        &self,
        queue: &'q Queue,
    ) -> rdkafka::error::KafkaResult<BorrowedMessage<'q>> {
        loop {
            if let Ok(next) = tokio::time::timeout(LOST_WAKEUP_CHECK, queue.recv()).await {
                return next;
            }
            // A fresh receive looks at the queue before it waits: anything there now had been
            // queued without waking the reader.
            if let Ok(next) = tokio::time::timeout(Duration::ZERO, queue.recv()).await {
                self.metrics.wakeups_recovered.increment(1);
                return next;
            }
        }
    }

    pub(super) fn copy(&self, msg: &BorrowedMessage<'_>) -> InRecord {
        let headers = msg.headers();
        let view = message_view(msg);
        // The id and the content digest, from one strict read of the value.
        let identity = identify(
            &view,
            &self.settings.id_source,
            self.settings.content_digest,
        );
        let misrouted = identity.id.as_ref().is_ok_and(|id| {
            !dedupe::kafka::is_home(&id.bytes, self.partition, self.settings.input_partitions)
        });
        let id = identity.id.map(|id| id.key);
        let digest = identity.digest;
        let out = OutRecord {
            key: msg.key().map(<[u8]>::to_vec),
            value: msg.payload().map(<[u8]>::to_vec),
            headers: headers
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
            timestamp_ms: msg.timestamp().to_millis(),
        };
        InRecord {
            offset: msg.offset(),
            id,
            misrouted,
            digest,
            out,
        }
    }
}

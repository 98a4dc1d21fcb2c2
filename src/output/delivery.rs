//! What a transactional producer reports besides its calls' results: where each delivered record
//! landed, why one was not delivered, and when a node last closed or refused its connection.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryResult, ProducerContext};
use rdkafka::ClientContext;

use super::error::{RefusedIn, RefusedRecord};
use super::refused::is_refusal;

/// Counts delivery results so a transaction knows where its output records and its changelog
/// record landed, and why one was not delivered.
pub(super) struct DeliveryTracker {
    output_topic: String,
    changelog_topic: String,
    /// The partition of both this producer writes for: a marker it writes to another partition's
    /// changelog (a re-send's, see [`super::Batch::other_marks`]) is not its changelog's position.
    partition: i32,
    pub(super) last_output: AtomicI64,
    pub(super) last_changelog: AtomicI64,
    pub(super) failures: AtomicU64,
    /// The first failed delivery since the last reset: its topic, and the broker's or
    /// librdkafka's reason (a missing ACL on the dead-letter topic, say).
    first_failure: Mutex<Option<(String, RDKafkaErrorCode)>>,
    /// When a node last closed or refused this producer's connection ([`node_gone`]): it died or
    /// stops, and the cluster moves its leaderships soon.
    last_node_lost: Mutex<Option<Instant>>,
    /// The records of the open transaction refused for good ([`is_refusal`]), by their place in
    /// the batch ([`Slot`]).
    refused: Mutex<Vec<RefusedRecord>>,
}

/// A record's place in its batch, carried as its delivery opaque: an output record's index, a
/// dead letter's index with [`Slot::DEAD_LETTER`] set, or [`Slot::UNTRACKED`] (changelog and
/// audit records, whose refusal is not one record's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot(pub(super) usize);

impl Slot {
    const DEAD_LETTER: usize = 1 << (usize::BITS - 2);
    pub(super) const UNTRACKED: Slot = Slot(usize::MAX);

    pub(super) fn of(topic: RefusedIn, index: usize) -> Self {
        match topic {
            RefusedIn::Output => Self(index),
            RefusedIn::DeadLetter => Self(index | Self::DEAD_LETTER),
        }
    }

    fn refused(self, code: RDKafkaErrorCode) -> Option<RefusedRecord> {
        if self == Self::UNTRACKED {
            return None;
        }
        let (topic, index) = if self.0 & Self::DEAD_LETTER != 0 {
            (RefusedIn::DeadLetter, self.0 & !Self::DEAD_LETTER)
        } else {
            (RefusedIn::Output, self.0)
        };
        Some(RefusedRecord { topic, index, code })
    }
}

impl DeliveryTracker {
    pub(super) fn new(output_topic: &str, changelog_topic: &str, partition: i32) -> Self {
        Self {
            output_topic: output_topic.to_string(),
            changelog_topic: changelog_topic.to_string(),
            partition,
            last_output: AtomicI64::new(-1),
            last_changelog: AtomicI64::new(-1),
            failures: AtomicU64::new(0),
            first_failure: Mutex::new(None),
            last_node_lost: Mutex::new(None),
            refused: Mutex::new(Vec::new()),
        }
    }

    /// Notes that the record in `slot` was refused for good with `code`, if it is one the batch
    /// tracks and the code is a refusal.
    pub(super) fn note_refused(&self, slot: Slot, code: RDKafkaErrorCode) {
        if let Some(r) = slot.refused(code).filter(|_| is_refusal(code)) {
            self.refused
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(r);
        }
    }

    /// The records of the transaction refused for good, in batch order, each once.
    pub(super) fn take_refused(&self) -> Vec<RefusedRecord> {
        let mut refused = std::mem::take(
            &mut *self
                .refused
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        refused.sort_by_key(|r| (r.topic, r.index));
        refused.dedup_by_key(|r| (r.topic, r.index));
        refused
    }

    /// Whether a node closed or refused this producer's connection within `within`.
    pub(super) fn node_lost_within(&self, within: Duration) -> bool {
        let last = *self
            .last_node_lost
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        last.is_some_and(|at| at.elapsed() <= within)
    }

    pub(super) fn reset(&self) {
        self.last_output.store(-1, Ordering::Relaxed);
        self.last_changelog.store(-1, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
        self.take_first_failure();
        self.take_refused();
    }

    pub(super) fn take_first_failure(&self) -> Option<(String, RDKafkaErrorCode)> {
        self.first_failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }
}

/// Whether librdkafka's words for a failed connection say that the node is gone (its process
/// died or stops): the peer closed or reset the connection, or refused a new one. A node cut off
/// by the network ("Invalid argument", "No route to host", a timed-out connect) or one that hangs
/// (requests timed out) is not: the cluster may still run it, and its leaderships stay.
fn node_gone(message: &str) -> bool {
    message.contains("by peer") || message.contains("Connection refused")
}

impl ClientContext for DeliveryTracker {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::BrokerTransportFailure)
            && node_gone(reason)
        {
            *self
                .last_node_lost
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Instant::now());
        }
        // As rdkafka's default: every global error is logged.
        crate::metrics::events::KafkaClientError {
            role: crate::metrics::events::ClientRole::Output,
            error: &error,
            reason,
        }
        .emit();
    }
}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, slot: usize) {
        match result {
            Ok(m) => {
                let topic = rdkafka::Message::topic(m);
                let offset = rdkafka::Message::offset(m);
                if topic == self.output_topic {
                    self.last_output.fetch_max(offset, Ordering::Relaxed);
                } else if topic == self.changelog_topic
                    && rdkafka::Message::partition(m) == self.partition
                {
                    self.last_changelog.fetch_max(offset, Ordering::Relaxed);
                }
            }
            Err((e, m)) => {
                let code = e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
                self.note_refused(Slot(slot), code);
                if self.failures.fetch_add(1, Ordering::Relaxed) == 0 {
                    let topic = rdkafka::Message::topic(m).to_string();
                    *self
                        .first_failure
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((topic, code));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refused_or_dropped_connection_marks_a_node_as_gone() {
        let tracker = DeliveryTracker::new("out", "out.ids", 0);
        let within = Duration::from_secs(15);
        tracker.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "all brokers down",
        );
        tracker.error(
            KafkaError::Global(RDKafkaErrorCode::RequestTimedOut),
            "a silent node",
        );
        assert!(
            !tracker.node_lost_within(within),
            "a timeout is not a node gone"
        );
        tracker.error(
            KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            "127.0.0.1:9092/1: 1 request(s) timed out: disconnect",
        );
        tracker.error(
            KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            "10.213.0.11:29095/1: Failed to connect to broker at 10.213.0.11:29095: Invalid argument (after 0ms in state CONNECT)",
        );
        assert!(
            !tracker.node_lost_within(within),
            "a silent or cut-off node is not a node gone"
        );
        tracker.error(
            KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            "Connect to ipv4#127.0.0.1:9092 failed: Connection refused",
        );
        assert!(tracker.node_lost_within(within));
        *tracker.last_node_lost.lock().unwrap() = Some(Instant::now() - Duration::from_secs(20));
        assert!(
            !tracker.node_lost_within(within),
            "a failure older than the window is not this transaction's"
        );
    }
}

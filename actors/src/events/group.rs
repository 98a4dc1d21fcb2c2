//! The input consumer's and the consumer group's events: rebalance steps that failed, the input
//! consumer's errors, and its close.

use dedupe::config::PartitionSet;
use dedupe::metrics as m;

fn count(kind: &'static str) {
    metrics::counter!(m::ERRORS, m::LABEL_KIND => kind).increment(1);
}

/// An assigned partition's queue could not be split off: its records are not read until the
/// partition is assigned again.
pub struct QueueNotSplit {
    pub partition: i32,
}

impl QueueNotSplit {
    pub fn emit(&self) {
        count(m::KIND_REBALANCE);
        tracing::error!(
            event = "QueueNotSplit",
            partition = self.partition,
            "Could not split the queue of an assigned input partition."
        );
    }
}

/// Revoked partitions did not stop within `worker.shutdown_timeout_ms`: the rebalance goes on.
pub struct RevokeTimedOut<'a> {
    pub partitions: &'a [i32],
}

impl RevokeTimedOut<'_> {
    pub fn emit(&self) {
        count(m::KIND_REBALANCE);
        tracing::warn!(event = "RevokeTimedOut", partitions = ?self.partitions, "Revoked partitions did not stop in time; letting the rebalance go on (the next owner fences their producers).");
    }
}

/// The consumer group reported an error in a rebalance.
pub struct RebalanceError<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl RebalanceError<'_> {
    pub fn emit(&self) {
        count(m::KIND_REBALANCE);
        tracing::warn!(event = "RebalanceError", error = %self.error, "The consumer group reported a rebalance error.");
    }
}

/// Newly assigned partitions could not be paused: they may be fetched before their take-over.
pub struct AssignedNotPaused<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl AssignedNotPaused<'_> {
    pub fn emit(&self) {
        count(m::KIND_REBALANCE);
        tracing::error!(event = "AssignedNotPaused", error = %self.error, "Pausing newly assigned partitions failed.");
    }
}

/// The group assigned partitions while the coordinator was gone: nobody takes them over.
pub struct CoordinatorGone;

impl CoordinatorGone {
    pub fn emit(&self) {
        count(m::KIND_REBALANCE);
        tracing::error!(
            event = "CoordinatorGone",
            "The coordinator is gone; newly assigned partitions stay paused."
        );
    }
}

/// The group assigned partitions to this worker; their take-over starts.
pub struct PartitionsAssigned<'a> {
    pub partitions: &'a [i32],
}

impl PartitionsAssigned<'_> {
    pub fn emit(&self) {
        tracing::info!(event = "PartitionsAssigned", partitions = %PartitionSet(self.partitions.to_vec()), "The group assigned partitions; taking them over.");
    }
}

/// The group takes partitions away (`lost`: without this worker's consent). Logged here only when
/// handed over cleanly: a loss is `PartitionsLost`'s to report.
pub struct PartitionsTaken<'a> {
    pub partitions: &'a [i32],
    pub lost: bool,
}

impl PartitionsTaken<'_> {
    pub fn emit(&self) {
        if !self.lost {
            tracing::info!(event = "PartitionsTaken", partitions = %PartitionSet(self.partitions.to_vec()), "The group takes partitions away; stopping them.");
        }
    }
}

/// Closing the input consumer takes longer than the caller waits: it goes on in the background.
pub struct InputCloseSlow {
    pub wait_secs: u64,
}

impl InputCloseSlow {
    pub fn emit(&self) {
        count(m::KIND_KAFKA);
        tracing::warn!(
            event = "InputCloseSlow",
            wait_secs = self.wait_secs,
            "Closing the input consumer takes longer than this (its brokers or group coordinator are unreachable); it goes on in the background while a new consumer starts."
        );
    }
}

/// A slow close of the input consumer ended.
pub struct InputClosed {
    pub seconds: u64,
}

impl InputClosed {
    pub fn emit(&self) {
        tracing::info!(
            event = "InputClosed",
            seconds = self.seconds,
            "The input consumer closed."
        );
    }
}

/// No thread could be started to close the input consumer: it closes with its last user.
pub struct InputCloseThreadNotStarted<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl InputCloseThreadNotStarted<'_> {
    pub fn emit(&self) {
        count(m::KIND_THREAD);
        tracing::warn!(event = "InputCloseThreadNotStarted", error = %self.error, "Cannot start a thread to close the input consumer; it closes when its last user lets go.");
    }
}

/// The input consumer's main queue cannot be polled: rebalances and its errors go unserved.
pub struct InputPollerNotStarted<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl InputPollerNotStarted<'_> {
    pub fn emit(&self) {
        count(m::KIND_THREAD);
        tracing::error!(event = "InputPollerNotStarted", error = %self.error, "Cannot start the input poller's runtime.");
    }
}

/// A record arrived on the input consumer's main queue, where none is expected: every owned
/// partition's records go to its own split queue.
pub struct RecordOnMainQueue;

impl RecordOnMainQueue {
    pub fn emit(&self) {
        count(m::KIND_KAFKA);
        tracing::warn!(
            event = "RecordOnMainQueue",
            "A record arrived on the main queue of the input consumer; it is not processed here."
        );
    }
}

/// The input consumer reported an error it recovers from (librdkafka retries).
pub struct InputConsumerError<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl InputConsumerError<'_> {
    pub fn emit(&self) {
        count(m::KIND_KAFKA);
        tracing::warn!(event = "InputConsumerError", error = %self.error, "The input consumer reported an error.");
    }
}

//! The core's internal events: what the ledger, the output producer, recovery and the watchdog
//! report, each one struct whose `emit` writes its log line and its count together, so the two
//! never drift apart. The worker's and the front door's events live beside their code
//! (`dedupe_actors::events`, `dedupe_tracking::server::events`); every name and label
//! they use is declared once, in [`crate::metrics`].
//!
//! The fields are plain values (no ledger or recovery types), so the modules that emit them
//! depend on this one and not the other way round.

use std::path::Path;

use crate::metrics as m;

/// The ledger opened: how long it took and where its id index came from.
pub struct LedgerOpened<'a> {
    pub path: &'a Path,
    pub seconds: f64,
    pub db_seconds: f64,
    /// [`crate::ledger::IndexSource`]'s label.
    pub index: &'static str,
}

impl LedgerOpened<'_> {
    pub fn emit(&self) {
        metrics::gauge!(m::LEDGER_OPEN_SECONDS, m::LABEL_INDEX => self.index).set(self.seconds);
        tracing::info!(
            path = %self.path.display(),
            seconds = self.seconds,
            db_seconds = self.db_seconds,
            index = self.index,
            "Opened the ledger."
        );
    }
}

/// The ledger opened under another retention limit than it was last kept under (or its first).
pub struct RetentionLimitChanged<'a> {
    pub path: &'a Path,
    pub before_ms: Option<i64>,
    pub now_ms: Option<i64>,
}

impl RetentionLimitChanged<'_> {
    pub fn emit(&self) {
        let secs = |ms: Option<i64>| ms.map_or("none".to_string(), |ms| format!("{} s", ms / 1000));
        tracing::info!(
            path = %self.path.display(),
            before = %secs(self.before_ms),
            now = %secs(self.now_ms),
            "The ledger now keeps ids under this retention limit: ids past it are not held from now on, and their generations go at the next pass."
        );
    }
}

/// A ledger's creation that a crash had interrupted is started again: nothing was in it yet.
pub struct LedgerCreationRestarted<'a> {
    pub path: &'a Path,
    /// True when the directory had no format marker and held nothing (a build whose creation
    /// was not atomic); false when the creation marker was still there.
    pub unmarked: bool,
}

impl LedgerCreationRestarted<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::LEDGER_CREATIONS_RESTARTED).increment(1);
        if self.unmarked {
            tracing::warn!(
                path = %self.path.display(),
                "The ledger has no format marker and holds nothing (a creation interrupted by a crash); initializing it."
            );
        } else {
            tracing::warn!(
                path = %self.path.display(),
                "The ledger's creation was interrupted by a crash before it held any id; creating it again."
            );
        }
    }
}

/// A record for the output transaction found its producer's queue full; it waits for room.
/// Counted only: it can happen thousands of times a second under a slow broker, and the
/// transaction's own outcome is logged.
pub struct OutputQueueFull {
    pub partition: i32,
}

impl OutputQueueFull {
    pub fn emit(&self) {
        metrics::counter!(m::OUTPUT_QUEUE_FULL, m::LABEL_PARTITION => self.partition.to_string())
            .increment(1);
    }
}

/// A read of the id changelog or the output met an end of partition before the offset it reads
/// to (a new leader whose high watermark had not caught up), and reads on.
pub struct ReadEndedEarly<'a> {
    pub partition: i32,
    pub topic: &'a str,
    pub at: Option<i64>,
    pub end: i64,
}

impl ReadEndedEarly<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::RECOVERY_EARLY_ENDS, m::LABEL_PARTITION => self.partition.to_string())
            .increment(1);
        tracing::warn!(
            partition = self.partition,
            topic = self.topic,
            at = ?self.at,
            end = self.end,
            "A read of a log ended before the range it was asked for; reading on until the leader has caught up."
        );
    }
}

/// A Kafka client call hung past its own timeout and the watchdog's grace.
pub struct ClientCallStuck<'a> {
    pub call: &'static str,
    pub owner: &'a str,
    pub past_deadline_secs: u64,
    pub grace_secs: u64,
    /// True when a rescue took it (its partition is taken over again in process); false when
    /// the process exits so that a restart recovers.
    pub rescued: bool,
}

impl ClientCallStuck<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_STUCK).increment(1);
        if self.rescued {
            tracing::error!(
                call = self.call,
                owner = %self.owner,
                past_deadline_secs = self.past_deadline_secs,
                "A Kafka client call has not returned {} s past its own timeout (a known librdkafka hang, e.g. after the consumer group's coordinator moved); leaving it to its thread and taking its partition over again with a new producer.",
                self.grace_secs
            );
        } else {
            tracing::error!(
                call = self.call,
                owner = %self.owner,
                past_deadline_secs = self.past_deadline_secs,
                "A Kafka client call has not returned {} s past its own timeout (a known librdkafka hang, e.g. after the consumer group's coordinator moved); exiting so that a restart recovers from the output topic.",
                self.grace_secs
            );
        }
    }
}

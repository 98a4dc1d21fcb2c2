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
            event = "LedgerOpened",
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
            event = "RetentionLimitChanged",
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
                event = "LedgerCreationRestarted",
                path = %self.path.display(),
                "The ledger has no format marker and holds nothing (a creation interrupted by a crash); initializing it."
            );
        } else {
            tracing::warn!(
                event = "LedgerCreationRestarted",
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
            event = "ReadEndedEarly",
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
                event = "ClientCallStuck",
                call = self.call,
                owner = %self.owner,
                past_deadline_secs = self.past_deadline_secs,
                "A Kafka client call has not returned {} s past its own timeout (a known librdkafka hang, e.g. after the consumer group's coordinator moved); leaving it to its thread and taking its partition over again with a new producer.",
                self.grace_secs
            );
        } else {
            tracing::error!(
                event = "ClientCallStuck",
                call = self.call,
                owner = %self.owner,
                past_deadline_secs = self.past_deadline_secs,
                "A Kafka client call has not returned {} s past its own timeout (a known librdkafka hang, e.g. after the consumer group's coordinator moved); exiting so that a restart recovers from the output topic.",
                self.grace_secs
            );
        }
    }
}

/// The watchdog's thread could not be started: a hung Kafka client call will not end the process.
pub struct WatchdogNotStarted<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl WatchdogNotStarted<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_THREAD).increment(1);
        tracing::error!(event = "WatchdogNotStarted", error = %self.error, "Cannot start the watchdog thread; hung client calls will not end the process.");
    }
}

/// A seal a bulk load held back failed when the load ended; the next batch tries again.
pub struct LedgerSealFailed<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl LedgerSealFailed<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_LEDGER).increment(1);
        tracing::warn!(event = "LedgerSealFailed", error = %self.error, "Could not seal the active generation after a load; the next batch tries again.");
    }
}

/// When the ledger stores its id index (see `ledger::index_file`), and why it could not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexStore {
    /// After a seal, in the background: writing the file failed.
    AfterSeal,
    /// After a seal without a WAL: the sealed generation could not be flushed first.
    SealNotFlushed,
    /// After a seal: no thread could be started to store it.
    NoThread,
    /// When the ledger closes.
    AtClose,
}

/// The id index was not stored: the ledger is correct, and a crash (or the next open) rebuilds
/// more of the index from the generations.
pub struct IdIndexNotStored<'a> {
    pub path: &'a Path,
    pub when: IndexStore,
    pub error: &'a dyn std::fmt::Display,
}

impl IdIndexNotStored<'_> {
    pub fn emit(&self) {
        let kind = match self.when {
            IndexStore::NoThread => m::KIND_THREAD,
            IndexStore::AfterSeal | IndexStore::SealNotFlushed | IndexStore::AtClose => {
                m::KIND_LEDGER
            }
        };
        metrics::counter!(m::ERRORS, m::LABEL_KIND => kind).increment(1);
        let (path, error) = (self.path.display(), self.error);
        match self.when {
            IndexStore::AfterSeal => {
                tracing::warn!(event = "IdIndexNotStored", path = %path, error = %error, "Could not store the ledger's id index after a seal; a crash now rebuilds more of it.")
            }
            IndexStore::SealNotFlushed => {
                tracing::warn!(event = "IdIndexNotStored", path = %path, error = %error, "Could not flush the sealed generation; the id index is not stored after this seal.")
            }
            IndexStore::NoThread => {
                tracing::warn!(event = "IdIndexNotStored", path = %path, error = %error, "Could not start storing the ledger's id index after a seal; a crash now rebuilds more of it.")
            }
            IndexStore::AtClose => {
                tracing::warn!(event = "IdIndexNotStored", path = %path, error = %error, "Could not store the ledger's id index; the next open rebuilds it from the generations.")
            }
        }
    }
}

/// The id index was stored: after a seal (in the background) or when the ledger closed.
pub struct IdIndexStored<'a> {
    pub path: &'a Path,
    pub elapsed_ms: u64,
    pub at_close: bool,
}

impl IdIndexStored<'_> {
    pub fn emit(&self) {
        let path = self.path.display();
        if self.at_close {
            tracing::info!(event = "IdIndexStored", path = %path, elapsed_ms = self.elapsed_ms, "Stored the ledger's id index for the next open.");
        } else {
            tracing::info!(event = "IdIndexStored", path = %path, elapsed_ms = self.elapsed_ms, "Stored the ledger's id index after sealing a generation (in the background).");
        }
    }
}

/// Why an open does not use the stored id index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredIndex {
    /// There is none (a new ledger, or one never closed cleanly).
    Missing,
    /// It could not be opened.
    Unopenable,
    /// It was made for another index size.
    OtherSize,
    /// Corrupt, truncated or of another version.
    Unusable,
}

/// The open rebuilds the id index from the generations instead of loading the stored one.
/// Counted (`ledger`) when the file was there but could not be used.
pub struct StoredIndexNotUsed<'a> {
    pub path: &'a Path,
    pub why: StoredIndex,
    pub error: Option<&'a dyn std::fmt::Display>,
}

impl StoredIndexNotUsed<'_> {
    pub fn emit(&self) {
        let path = self.path.display();
        let error = self.error.map(|e| e.to_string()).unwrap_or_default();
        match self.why {
            StoredIndex::Missing => {
                tracing::info!(event = "StoredIndexNotUsed", path = %path, "No stored id index; rebuilding it from the generations.")
            }
            StoredIndex::OtherSize => {
                tracing::info!(event = "StoredIndexNotUsed", path = %path, "The stored id index was made for another index size; rebuilding it from the generations.")
            }
            StoredIndex::Unopenable => {
                metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_LEDGER).increment(1);
                tracing::warn!(event = "StoredIndexNotUsed", path = %path, error = %error, "Cannot open the stored id index; rebuilding it from the generations.");
            }
            StoredIndex::Unusable => {
                metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_LEDGER).increment(1);
                tracing::warn!(event = "StoredIndexNotUsed", path = %path, error = %error, "The stored id index is unusable (corrupt, truncated or of another version); rebuilding it from the generations.");
            }
        }
    }
}

/// No thread could be had to grow the id index in the background: it grows at once, under the
/// ledger's lock.
pub struct IndexGrownAtOnce<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl IndexGrownAtOnce<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_THREAD).increment(1);
        tracing::warn!(event = "IndexGrownAtOnce", error = %self.error, "Could not start a thread to grow the id index; growing it at once.");
    }
}

/// A record of an output transaction was not delivered, so the transaction is aborted. Logged
/// only: the abort itself is counted where the transaction's outcome is (the worker's
/// `TransactionRetried` and `TransactionFailed`).
pub struct OutputRecordUndelivered<'a> {
    pub topic: &'a str,
    pub code: &'a dyn std::fmt::Display,
}

impl OutputRecordUndelivered<'_> {
    pub fn emit(&self) {
        tracing::warn!(event = "OutputRecordUndelivered", topic = %self.topic, error = %self.code, "A record of the output transaction was not delivered; aborting the transaction.");
    }
}

/// Committing an output transaction failed with an error the broker says is worth retrying.
pub struct CommitRetried<'a> {
    pub retries: u32,
    pub error: &'a dyn std::fmt::Display,
}

impl CommitRetried<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_KAFKA).increment(1);
        tracing::warn!(event = "CommitRetried", retries = self.retries, error = %self.error, "Committing the output transaction failed for now; retrying the commit.");
    }
}

/// Whose Kafka client reported an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientRole {
    /// The output producer (logged as librdkafka's own default does).
    Output,
    /// A client of the tools and the front door.
    Client,
    /// A consumer that reads partitions to their end.
    Reader,
}

/// A Kafka client reported an error (librdkafka's error callback); librdkafka retries on its own.
pub struct KafkaClientError<'a> {
    pub role: ClientRole,
    pub error: &'a dyn std::fmt::Display,
    pub reason: &'a str,
}

impl KafkaClientError<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_KAFKA).increment(1);
        let (error, reason) = (self.error, self.reason);
        match self.role {
            ClientRole::Output => {
                tracing::error!(event = "KafkaClientError", "librdkafka: {error}: {reason}")
            }
            ClientRole::Client => {
                tracing::warn!(event = "KafkaClientError", error = %error, reason, "The Kafka client reported an error.")
            }
            ClientRole::Reader => {
                tracing::warn!(event = "KafkaClientError", error = %error, reason, "A reader's Kafka client reported an error.")
            }
        }
    }
}

/// A log line of librdkafka itself, written at its level under the target `librdkafka`; those at
/// warning level or above are counted.
pub struct KafkaClientLog<'a> {
    pub level: rdkafka::config::RDKafkaLogLevel,
    pub facility: &'a str,
    pub message: &'a str,
}

impl KafkaClientLog<'_> {
    pub fn emit(&self) {
        use rdkafka::config::RDKafkaLogLevel as L;
        let (fac, message) = (self.facility, self.message);
        match self.level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                metrics::counter!(m::KAFKA_CLIENT_LOGS, m::LABEL_LEVEL => m::LEVEL_ERROR)
                    .increment(1);
                tracing::error!(target: "librdkafka", event = "KafkaClientLog", event = "KafkaClientLog", "librdkafka: {fac} {message}")
            }
            L::Warning => {
                metrics::counter!(m::KAFKA_CLIENT_LOGS, m::LABEL_LEVEL => m::LEVEL_WARNING)
                    .increment(1);
                tracing::warn!(target: "librdkafka", event = "KafkaClientLog", event = "KafkaClientLog", "librdkafka: {fac} {message}")
            }
            L::Notice | L::Info => {
                tracing::info!(target: "librdkafka", event = "KafkaClientLog", event = "KafkaClientLog", "librdkafka: {fac} {message}")
            }
            L::Debug => {
                tracing::debug!(target: "librdkafka", event = "KafkaClientLog", event = "KafkaClientLog", "librdkafka: {fac} {message}")
            }
        }
    }
}

/// Recovery trusts a ledger ahead of the log it recovers from, as `--accept-ledger-ahead` asks.
pub struct LedgerAheadTrusted<'a> {
    pub partition: i32,
    pub ledger_next_output: i64,
    pub end: i64,
    pub source: &'a dyn std::fmt::Display,
}

impl LedgerAheadTrusted<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_RECOVERY).increment(1);
        tracing::warn!(
            event = "LedgerAheadTrusted",
            partition = self.partition,
            ledger_next_output = self.ledger_next_output,
            end = self.end,
            source = %self.source,
            "The ledger is ahead of the log it recovers from; trusting the ledger as --accept-ledger-ahead asks."
        );
    }
}

/// Retention deleted records of the log that the ledger had not recorded: their ids cannot be
/// recovered, so their later copies pass.
pub struct RetentionGap<'a> {
    pub partition: i32,
    pub ledger_next: i64,
    pub first_retained: i64,
    pub source: &'a dyn std::fmt::Display,
}

impl RetentionGap<'_> {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_RECOVERY).increment(1);
        tracing::warn!(
            event = "RetentionGap",
            partition = self.partition,
            ledger_next = self.ledger_next,
            first_retained = self.first_retained,
            source = %self.source,
            "Records the ledger had not recorded were deleted by retention before recovery; ids in that gap cannot be recovered."
        );
    }
}

/// The ledger holds nothing for a partition: its ids are loaded from the log before it resumes.
pub struct PartitionRebuilt<'a> {
    pub partition: i32,
    pub from: i64,
    pub to: i64,
    pub backfill: Option<(i64, i64)>,
    pub source: &'a dyn std::fmt::Display,
}

impl PartitionRebuilt<'_> {
    pub fn emit(&self) {
        tracing::info!(
            event = "PartitionRebuilt",
            partition = self.partition,
            from = self.from,
            to = self.to,
            backfill = ?self.backfill,
            source = %self.source,
            "The ledger holds nothing for this partition: loading its ids before it resumes. The dedupe window is at most the log's retention."
        );
    }
}

/// The id index was loaded from its file and vouches for every generation: nothing was read.
pub struct IdIndexLoaded {
    pub ids: u64,
    pub elapsed_ms: u64,
}

impl IdIndexLoaded {
    pub fn emit(&self) {
        tracing::info!(
            event = "IdIndexLoaded",
            elapsed_ms = self.elapsed_ms,
            ids = self.ids,
            "loaded the ledger's id index from its file"
        );
    }
}

/// The id index was rebuilt, whole or in part, from the generations it could not vouch for.
pub struct IdIndexRebuilt {
    pub ids_read: u64,
    pub generations_read: usize,
    /// [`crate::ledger::IndexSource`]'s label.
    pub index: &'static str,
    pub elapsed_ms: u64,
    pub overflowed_buckets: u64,
}

impl IdIndexRebuilt {
    pub fn emit(&self) {
        tracing::info!(
            event = "IdIndexRebuilt",
            ids_read = self.ids_read,
            generations_read = self.generations_read,
            index = self.index,
            elapsed_ms = self.elapsed_ms,
            overflowed_buckets = self.overflowed_buckets,
            "rebuilt the ledger's id index"
        );
    }
}

/// The id index doubled (to `level`), for the ids the ledger is about to hold.
pub struct IdIndexGrown {
    pub level: u8,
    pub bytes: u64,
    pub capacity_ids: u64,
    pub ids: u64,
    pub elapsed_ms: u64,
}

impl IdIndexGrown {
    pub fn emit(&self) {
        tracing::info!(
            event = "IdIndexGrown",
            level = self.level,
            bytes = self.bytes,
            capacity_ids = self.capacity_ids,
            ids = self.ids,
            elapsed_ms = self.elapsed_ms,
            "Grew the id index."
        );
    }
}

/// The active generation was sealed and the next one started: each step's time.
pub struct GenerationSealed<'a> {
    pub generation: &'a str,
    pub commit_ms: u64,
    pub flush_ms: u64,
    pub age_ms: u64,
    pub elapsed_ms: u64,
}

impl GenerationSealed<'_> {
    pub fn emit(&self) {
        tracing::info!(
            event = "GenerationSealed",
            generation = %self.generation,
            commit_ms = self.commit_ms,
            flush_ms = self.flush_ms,
            age_ms = self.age_ms,
            elapsed_ms = self.elapsed_ms,
            "Sealed the active generation."
        );
    }
}

/// New ids of a batch older than the retention limit before the latest time their partition has
/// reached: published (nothing holds them), and not recorded, since no copy still to come after
/// the records already read is within the limit of them. Counted; logged at debug only (a
/// producer that stamps records late, or a topic read long after it was written, makes many).
pub struct LateRecords {
    pub partition: crate::Partition,
    pub records: u64,
}

impl LateRecords {
    pub fn emit(&self) {
        metrics::counter!(super::LATE_RECORDS, super::LABEL_PARTITION => self.partition.to_string())
            .increment(self.records);
        tracing::debug!(
            event = "LateRecords",
            partition = self.partition,
            records = self.records,
            "New records older than the retention limit before their partition's latest time: published, not recorded."
        );
    }
}

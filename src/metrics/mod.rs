//! Every metric the service exports: name, help text and labels, declared once.
//!
//! The Grafana dashboard (`deploy/grafana/`) and the alert rules (`deploy/prometheus/`) use these
//! names; a test checks that every name they use is listed in [`ALL`], so change them together.

use metrics::Unit;

pub mod events;
pub mod recorder;

/// Label: the input partition a series is about.
pub const LABEL_PARTITION: &str = "partition";
/// Label of [`STAGE_SECONDS`] and of [`SNAPSHOT_FAILURES`]: the step a series is about.
pub const LABEL_STAGE: &str = "stage";
/// Values of [`LABEL_STAGE`] on [`STAGE_SECONDS`].
pub const STAGE_LOOKUP: &str = "lookup";
pub const STAGE_PUBLISH: &str = "publish";
pub const STAGE_RECORD: &str = "record";
/// Label of [`TRANSACTIONS`], and its values.
pub const LABEL_OUTCOME: &str = "outcome";
pub const OUTCOME_COMMITTED: &str = "committed";
pub const OUTCOME_ABORTED: &str = "aborted";
pub const OUTCOME_FENCED: &str = "fenced";
/// Values of [`LABEL_OUTCOME`] for [`REKEY_RECORDS`].
pub const OUTCOME_REKEYED: &str = "rekeyed";
pub const OUTCOME_UNKEYED: &str = "unkeyed";
/// Larger than the input topic accepts: its position and size went to the dead-letter topic.
pub const OUTCOME_DEAD_LETTERED: &str = "dead_lettered";
/// Larger than the input topic accepts, without a dead-letter topic: the stage stopped at it.
pub const OUTCOME_TOO_LARGE: &str = "too_large";
/// Values of [`LABEL_OUTCOME`] for [`CONFIG_RELOADS`].
pub const OUTCOME_APPLIED: &str = "applied";
pub const OUTCOME_REFUSED: &str = "refused";
/// Label of [`UNKEYED`]: the unkeyed policy applied, and its values.
pub const LABEL_POLICY: &str = "policy";
pub const POLICY_FORWARD: &str = "forward";
pub const POLICY_DROP: &str = "drop";
pub const POLICY_DEAD_LETTER: &str = "dead-letter";
/// Label of [`LEDGER_OPEN_SECONDS`]: where the id index came from.
pub const LABEL_INDEX: &str = "index";
/// Label of [`ERRORS`], and its values.
pub const LABEL_KIND: &str = "kind";
pub const KIND_KAFKA: &str = "kafka";
pub const KIND_PIPELINE: &str = "pipeline";
pub const KIND_FENCED: &str = "fenced";
pub const KIND_FATAL: &str = "fatal";
pub const KIND_STUCK: &str = "stuck";
pub const KIND_ADMIN_UNAUTHORIZED: &str = "admin_unauthorized";
pub const KIND_RETENTION: &str = "retention";
/// A thread could not be started: the work runs on the caller's thread, later, or not at all
/// (the watchdog).
pub const KIND_THREAD: &str = "thread";
/// A step of the ledger's upkeep failed (a seal, a flush, storing or opening the id index): the
/// ledger stays correct, and the step is tried again or its work redone at the next open.
pub const KIND_LEDGER: &str = "ledger";
/// Recovery started from a ledger it cannot fully vouch for: ahead of its log (trusted on
/// request), or with ids that retention deleted before the ledger recorded them.
pub const KIND_RECOVERY: &str = "recovery";
/// A step of a consumer group rebalance failed (a queue not split, partitions not paused,
/// revoked partitions that did not stop in time, an error the group reported).
pub const KIND_REBALANCE: &str = "rebalance";
/// A stop did not finish cleanly in time: batches left in flight, or the ledger left open.
pub const KIND_SHUTDOWN: &str = "shutdown";
/// Label of [`KAFKA_CLIENT_LOGS`]: the log line's level (`error`, `warning`).
pub const LABEL_LEVEL: &str = "level";
pub const LEVEL_ERROR: &str = "error";
pub const LEVEL_WARNING: &str = "warning";

// The worker.
pub const RECORDS_IN: &str = "dedupe_records_in_total";
pub const RECORDS_OUT: &str = "dedupe_records_out_total";
pub const BUILD_INFO: &str = "dedupe_build_info";
/// Labels of [`BUILD_INFO`].
pub const LABEL_VERSION: &str = "version";
pub const LABEL_COMMIT: &str = "commit";
pub const LABEL_LEDGER_FORMAT: &str = "ledger_format";
pub const DUPLICATES_DROPPED: &str = "dedupe_duplicates_dropped_total";
pub const REUSED_IDS: &str = "dedupe_reused_ids_total";
pub const SOURCE_REUSED_IDS: &str = "dedupe_source_reused_ids_total";
pub const UNKEYED: &str = "dedupe_unkeyed_records_total";
pub const MISROUTED_IDS: &str = "dedupe_misrouted_ids_total";
pub const PUBLISHED_TWICE_IDS: &str = "dedupe_published_twice_ids_total";
pub const DEAD_LETTERED: &str = "dedupe_dead_lettered_total";
pub const PARTITION_STALLED: &str = "dedupe_partition_stalled";
pub const INPUT_DUPLICATE_HEADERS: &str = "dedupe_input_duplicate_headers_total";
pub const REKEY_RECORDS: &str = "dedupe_rekey_records_total";
pub const REKEY_TRANSACTIONS: &str = "dedupe_rekey_transactions_total";
pub const REKEY_REWINDS: &str = "dedupe_rekey_rewinds_total";
pub const CONFIG_RELOADS: &str = "dedupe_config_reloads_total";
pub const FORGOTTEN_IDS: &str = "dedupe_forgotten_ids_total";
pub const REFRESHED_IDS: &str = "dedupe_refreshed_ids_total";
pub const RETENTION_LIMIT_SECONDS: &str = "dedupe_retention_limit_seconds";
pub const EXPIRED_GENERATIONS: &str = "dedupe_ledger_expired_generations_total";
pub const LATE_RECORDS: &str = "dedupe_late_records_total";
pub const BATCH_RECORDS: &str = "dedupe_batch_records";
pub const STAGE_SECONDS: &str = "dedupe_stage_seconds";
pub const END_TO_END_SECONDS: &str = "dedupe_end_to_end_seconds";
pub const DUPLICATE_AGE_SECONDS: &str = "dedupe_duplicate_age_seconds";
pub const WINDOW_SECONDS: &str = "dedupe_window_seconds";
pub const WINDOW_FORECAST_SECONDS: &str = "dedupe_window_forecast_seconds";
pub const WINDOW_LIMITED: &str = "dedupe_window_limited";
pub const PROMISED_WINDOW_SECONDS: &str = "dedupe_promised_window_seconds";
pub const BUDGET_HOLDS_PROMISE: &str = "dedupe_budget_holds_promise";
/// Label of [`PROMISED_WINDOW_SECONDS`]: the pipeline's input topic.
pub const LABEL_INPUT_TOPIC: &str = "input_topic";
pub const CONSUMER_LAG: &str = "dedupe_consumer_lag_records";
pub const INPUT_WAKEUPS_RECOVERED: &str = "dedupe_input_wakeups_recovered_total";
pub const RECOVERY_REPLAYED: &str = "dedupe_recovery_replayed_records_total";
pub const RECOVERY_EARLY_ENDS: &str = "dedupe_recovery_early_ends_total";
pub const RECOVERY_SECONDS: &str = "dedupe_recovery_duration_seconds";
pub const TRANSACTIONS: &str = "dedupe_transactions_total";
pub const PARTITIONS_READY: &str = "dedupe_partitions_ready";
pub const PARTITIONS_OWNED: &str = "dedupe_partitions_owned";
pub const ERRORS: &str = "dedupe_errors_total";
pub const KAFKA_CLIENT_LOGS: &str = "dedupe_kafka_client_logs_total";
pub const OUTPUT_QUEUE_FULL: &str = "dedupe_output_queue_full_waits_total";
pub const AUDIT_RECORDS: &str = "dedupe_audit_records_total";
pub const SOURCE_RECORDS: &str = "dedupe_source_records_total";
/// Label of [`SOURCE_RECORDS`]: the front door's source of a record, `other`, or `none`.
pub const LABEL_SOURCE: &str = "source";
/// A duplicate's verdict: `retry`, `reused_id` or `unknown` (see `dedupe::batch::Verdict`).
pub const LABEL_VERDICT: &str = "verdict";
/// What happened to a reused id: `dropped`, `published` or `dead_lettered`.
pub const LABEL_ACTION: &str = "action";
/// Values of [`LABEL_ACTION`] on [`REUSED_IDS`].
pub const ACTION_DROPPED: &str = "dropped";
pub const ACTION_PUBLISHED: &str = "published";
pub const ACTION_DEAD_LETTERED: &str = "dead_lettered";
pub const SOURCE_OTHER: &str = "other";
pub const SOURCE_NONE: &str = "none";
/// Values of [`LABEL_OUTCOME`] on [`SOURCE_RECORDS`].
pub const OUTCOME_PUBLISHED: &str = "published";
pub const OUTCOME_DUPLICATE: &str = "duplicate";
/// Copies of seen ids published by their source's mode (`flag`, `off`).
pub const OUTCOME_FLAGGED: &str = "flagged";
pub const OUTCOME_PASSED: &str = "passed";
/// Values of [`LABEL_OUTCOME`] on [`AUDIT_RECORDS`].
pub const AUDIT_WRITTEN: &str = "written";
pub const AUDIT_SAMPLED_OUT: &str = "sampled_out";
pub const AUDIT_OVER_CAP: &str = "over_cap";

// Moving partitions between workers (`worker.assignment = "group"`).
pub const PARTITION_ASSIGNMENTS: &str = "dedupe_partition_assignments_total";
pub const PARTITION_REVOCATIONS: &str = "dedupe_partition_revocations_total";
pub const PARTITIONS_LOADING: &str = "dedupe_partitions_loading";
pub const HANDOVER_SECONDS: &str = "dedupe_handover_duration_seconds";
pub const HANDOVER_IN_PROGRESS_SECONDS: &str = "dedupe_handover_in_progress_seconds";
pub const HANDOVER_IDS_LOADED: &str = "dedupe_handover_ids_loaded_total";
pub const HANDOVER_LOAD_SECONDS: &str = "dedupe_handover_load_seconds";
pub const PARTITION_RETAKES: &str = "dedupe_partition_retakes_total";
/// Values of [`LABEL_REASON`] on [`PARTITION_RETAKES`]: why a partition was taken over again.
pub const REASON_FAILED: &str = "failed";
pub const REASON_FENCED: &str = "fenced";
pub const REASON_HUNG: &str = "hung";
/// Label of [`HANDOVER_LOAD_SECONDS`]: where a take-over's load spent its time, and its values.
pub const LABEL_PHASE: &str = "phase";
pub const PHASE_FENCE: &str = "fence";
pub const PHASE_PREPARE: &str = "prepare";
pub const PHASE_FETCH: &str = "fetch";
pub const PHASE_DECODE: &str = "decode";
pub const PHASE_INDEX: &str = "index";
pub const PHASE_RUN_WAIT: &str = "run_wait";
pub const PHASE_COMMIT: &str = "commit";
pub const CHANGELOG_RECORDS: &str = "dedupe_changelog_records_total";
/// Label of [`PARTITION_REVOCATIONS`] (its values below), [`UNKEYED`] and the tracking API's
/// refusals: why.
pub const LABEL_REASON: &str = "reason";
/// Values of [`LABEL_REASON`] on [`PARTITION_REVOCATIONS`]: handed over cleanly, or taken away.
pub const REASON_REVOKED: &str = "revoked";
pub const REASON_LOST: &str = "lost";

// The ledger.
pub const LEDGER_BYTES: &str = "dedupe_ledger_bytes";
pub const LEDGER_IDS: &str = "dedupe_ledger_ids";
pub const LEDGER_GENERATIONS: &str = "dedupe_ledger_generations";
pub const LEDGER_FILTER_BYTES: &str = "dedupe_ledger_filter_bytes";
pub const LEDGER_INDEX_BYTES: &str = "dedupe_ledger_index_bytes";
pub const LEDGER_INDEX_OVERFLOWED_BUCKETS: &str = "dedupe_ledger_index_overflowed_buckets";
pub const LEDGER_DISK_LOOKUPS: &str = "dedupe_ledger_disk_lookups_total";
pub const LEDGER_BUDGET_BYTES: &str = "dedupe_ledger_budget_bytes";
pub const LEDGER_CREATIONS_RESTARTED: &str = "dedupe_ledger_creations_restarted_total";
pub const LEDGER_OPEN_SECONDS: &str = "dedupe_ledger_open_seconds";

// Snapshots.
pub const SNAPSHOT_LAST_SUCCESS: &str = "dedupe_snapshot_last_success_timestamp_seconds";
pub const SNAPSHOT_FAILURES: &str = "dedupe_snapshot_failures_total";

// The HTTP tracking API.
pub const INGEST_REQUESTS: &str = "dedupe_ingest_requests_total";
pub const INGEST_EVENTS: &str = "dedupe_ingest_events_total";
pub const INGEST_REJECTED: &str = "dedupe_ingest_rejected_total";
pub const INGEST_ASSIGNED_IDS: &str = "dedupe_ingest_assigned_ids_total";
pub const INGEST_REQUEST_SECONDS: &str = "dedupe_ingest_request_seconds";
pub const INGEST_IN_FLIGHT: &str = "dedupe_ingest_requests_in_flight";
pub const INGEST_BODY_READS: &str = "dedupe_ingest_body_reads";
pub const INGEST_LOG_SUPPRESSED: &str = "dedupe_ingest_log_lines_suppressed_total";
pub const INGEST_READY: &str = "dedupe_ingest_ready";
/// Labels of the tracking API's metrics.
pub const LABEL_ENDPOINT: &str = "endpoint";
pub const LABEL_STATUS: &str = "status";
pub const LABEL_TYPE: &str = "type";
/// Label of [`INGEST_BODY_READS`], and its values: a known key in the `Authorization` header, or none.
pub const LABEL_KEY: &str = "key";
pub const LABEL_ORIGIN: &str = "origin";
pub const KEY_KEYED: &str = "keyed";
pub const KEY_KEYLESS: &str = "keyless";
/// Value of [`LABEL_REASON`] on [`INGEST_REJECTED`]: a settings request while the API listens on
/// every address without `ingest.public_url`, so no address is known to point browsers at.
pub const REASON_NO_PUBLIC_URL: &str = "no_public_url";

/// Kind of a metric, as Prometheus renders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One exported metric.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Option<Unit>,
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

const fn m(
    name: &'static str,
    kind: Kind,
    unit: Option<Unit>,
    labels: &'static [&'static str],
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind,
        unit,
        labels,
        help,
    }
}

use Kind::{Counter, Gauge, Histogram};
const P: &[&str] = &[LABEL_PARTITION];

/// Every metric, with its help text and labels.
pub const ALL: &[Metric] = &[
    m(BUILD_INFO, Gauge, None, &[LABEL_VERSION, LABEL_COMMIT, LABEL_LEDGER_FORMAT], "1 for the running build, labelled with its version, the commit it was built from and the ledger format it writes under a retention limit (dedupe --version lists every format): a fleet of mixed versions shows as several series."),
    m(RECORDS_IN, Counter, None, P, "Input records read."),
    m(RECORDS_OUT, Counter, None, P, "Records published to the output topic in committed transactions."),
    m(DUPLICATES_DROPPED, Counter, None, &[LABEL_PARTITION, LABEL_VERDICT], "Records dropped because their id was already in the ledger, by verdict: retry (the same content as the first copy), reused_id (other content), unknown (either copy has no content digest)."),
    m(REUSED_IDS, Counter, None, &[LABEL_PARTITION, LABEL_ACTION], "Records whose id the ledger holds for other content, by what worker.on_reused_id did with them: dropped, published or dead_lettered."),
    m(SOURCE_REUSED_IDS, Counter, None, &[LABEL_SOURCE], "Records whose id the ledger holds for other content, by the front door's source (as dedupe_source_records_total counts sources): the clients that reuse ids."),
    m(UNKEYED, Counter, None, &[LABEL_PARTITION, LABEL_REASON, LABEL_POLICY], "Records without a usable id, by reason (missing, empty, too_long, unreadable, repeated_key) and the policy applied (forward, drop, dead-letter)."),
    m(MISROUTED_IDS, Counter, None, P, "Records whose id is on a partition neither common partitioner (the Java client's murmur2, librdkafka's crc32) would key it to: the input is not partitioned by the id, so copies of an id may reach other partitions, owned by workers whose ledgers do not see each other (a worker's partitions share its one ledger); dedupe rekey keys a topic by the id."),
    m(PUBLISHED_TWICE_IDS, Counter, None, P, "Ids a batch published as new that the ledger, recording them after the commit, found held already: a copy on another of the worker's partitions was published and recorded in between, so both copies reached the output. Only an input not partitioned by the id (dedupe_misrouted_ids_total) lets copies race so."),
    m(DEAD_LETTERED, Counter, None, &[LABEL_PARTITION, LABEL_REASON], "Records the output topic refused for good and the worker wrote to worker.dead_letter_topic instead, in their batch's transaction, by reason: too_large (over the output's max.message.bytes or the producer's message.max.bytes), invalid_record, invalid_timestamp. Their ids are held, so their copies are dropped as duplicates. Unkeyed records and reused ids dead-lettered by policy are counted by dedupe_unkeyed_records_total and dedupe_reused_ids_total."),
    m(PARTITION_STALLED, Gauge, None, P, "1 while the partition stops at a record the output topic refuses for good and no dead-letter topic takes (nothing after it is published; dedupe_consumer_lag_records counts the records waiting from it), 0 otherwise. The worker tries the record again with a backoff, so raising the output's limit heals the partition without a restart."),
    m(INPUT_DUPLICATE_HEADERS, Counter, None, P, "dedupe-duplicate headers that input records came with (set by a producer, or by a dedupe pipeline upstream), published renamed to dedupe-input-duplicate with their values: on the output only this worker's flag says a copy is a duplicate."),
    m(REKEY_RECORDS, Counter, None, &[LABEL_OUTCOME], "dedupe rekey: source records by outcome: rekeyed (copied into the input topic keyed by their id), unkeyed (no usable id: copied with their own key), dead_lettered (larger than the input topic accepts: their position and size written to worker.dead_letter_topic), too_large (larger than the input topic accepts, no dead-letter topic: the stage stopped at it)."),
    m(REKEY_TRANSACTIONS, Counter, None, &[LABEL_OUTCOME], "dedupe rekey: transactions (a batch and its source offsets) by outcome: committed, aborted, fenced (another instance with the same transactional id took over; this one exits)."),
    m(REKEY_REWINDS, Counter, None, &[], "dedupe rekey: times the source partitions were sought back to the first record not committed (a rebalance, an aborted transaction)."),
    m(CONFIG_RELOADS, Counter, None, &[LABEL_OUTCOME], "Configuration reloads (SIGHUP) by outcome: applied (worker.source_modes taken), refused (the configuration did not load; nothing changed)."),
    m(FORGOTTEN_IDS, Counter, None, &[LABEL_PARTITION, LABEL_OUTCOME], "Ids an operator asked to forget (dedupe forget, POST /admin/forget), by outcome: forgotten (the forget committed: the id answers not held), resent (a forgotten id's next copy was published and the id is held again)."),
    m(REFRESHED_IDS, Counter, None, P, "Ids recorded again at a dropped copy's time (ledger.refresh_on_duplicate): a client that keeps re-sending an event keeps being caught, and the retention limit counts from its last copy."),
    m(LATE_RECORDS, Counter, None, P, "New records older than the retention limit (ledger.max_window_secs) before the latest record time their partition has reached (its watermark, never past the wall clock): published, since nothing holds their ids, and not recorded, since no copy still to come after the records already read is within the limit of them. A producer that stamps records late, or a topic read long after it was written, shows here."),
    m(EXPIRED_GENERATIONS, Counter, None, &[], "Ledger generations dropped whole because their newest id was past the retention limit (ledger.max_window_secs)."),
    m(BATCH_RECORDS, Histogram, None, P, "Records per processed batch."),
    m(STAGE_SECONDS, Histogram, Some(Unit::Seconds), &[LABEL_STAGE], "Time spent per batch in each stage: lookup (ledger), publish (the output transaction, commit included), record (ledger)."),
    m(END_TO_END_SECONDS, Histogram, Some(Unit::Seconds), P, "Time from the timestamp of a batch's oldest new input record to its output transaction's commit."),
    m(DUPLICATE_AGE_SECONDS, Histogram, Some(Unit::Seconds), &[], "Time between an id's first sighting and a duplicate of it: how large a window is really needed."),
    m(WINDOW_SECONDS, Gauge, Some(Unit::Seconds), P, "The dedupe window: now minus the first-seen time of the oldest id the ledger still holds."),
    m(WINDOW_LIMITED, Gauge, None, P, "1 when only the retention limit (ledger.max_window_secs) bounds the partition's window: no generation holding ids younger than the limit was dropped for the budget since the worker started, so every id within the limit is held (the window gauge may read a little under the limit, as expiry drops whole generations); 0 without a limit or when the budget dropped such ids. DedupeWindowUnderPromise leaves such partitions out."),
    m(WINDOW_FORECAST_SECONDS, Gauge, Some(Unit::Seconds), P, "What the window will be once the ledger is full, at the current id rate."),
    m(PROMISED_WINDOW_SECONDS, Gauge, Some(Unit::Seconds), &[LABEL_INPUT_TOPIC], "The window this pipeline promises (worker.promised_window_secs): the alerts compare dedupe_window_seconds and its forecast with it."),
    m(RETENTION_LIMIT_SECONDS, Gauge, Some(Unit::Seconds), &[], "The retention limit (ledger.max_window_secs): no copy arriving later than this after its id's last sighting is dropped, and the window never exceeds it; absent without a limit."),
    m(BUDGET_HOLDS_PROMISE, Gauge, None, &[], "1 when the ledger's budget holds the promised window at the last hour's id rate, by the arithmetic of dedupe plan (the lowest point, a generation just dropped; the plan's measured bytes per id, or the ledger's own when more), 0 when it does not (the window will fall under the promise once the ledger is full); absent until an hour's rate is known (at least a minute of readings). It agrees with dedupe plan --config at the same rate per worker."),
    m(CONSUMER_LAG, Gauge, None, P, "Input records not yet processed: the high watermark minus the position, or minus the offset of the record a stalled partition stops at (dedupe_partition_stalled)."),
    m(INPUT_WAKEUPS_RECOVERED, Counter, None, P, "Times a partition's queue held records although its reader had not been woken (a lost wakeup of the client library); the reader looks every second, so such a partition waits at most that long."),
    m(RECOVERY_REPLAYED, Counter, None, P, "Output records whose ids recovery replayed into the ledger (read from the id changelog, or from the output for a ledger older than the changelog), before the partition resumed."),
    m(RECOVERY_EARLY_ENDS, Counter, None, P, "Reads of the id changelog (or the output) for recovery or a take-over that met an end of partition before the offset they read to (a new leader whose high watermark had not caught up) and read on instead of ending there."),
    m(RECOVERY_SECONDS, Gauge, Some(Unit::Seconds), P, "How long the last recovery of the partition took."),
    m(TRANSACTIONS, Counter, None, &[LABEL_OUTCOME], "Output transactions by outcome: committed, aborted, fenced."),
    m(PARTITIONS_READY, Gauge, None, &[], "Owned partitions that finished recovery and are processing."),
    m(PARTITIONS_OWNED, Gauge, None, &[], "Partitions this worker owns."),
    m(ERRORS, Counter, None, &[LABEL_KIND], "Errors by kind (kafka, pipeline, fenced, fatal, stuck: a client call hung past its timeout, admin_unauthorized, retention: the retention limit could not seal or drop a ledger generation, thread: a thread could not be started, ledger: a step of the ledger's upkeep failed, recovery: recovery trusted a ledger ahead of its log or met ids deleted by retention, rebalance: a step of a group rebalance failed, shutdown: a stop left batches in flight or the ledger open)."),
    m(KAFKA_CLIENT_LOGS, Counter, None, &[LABEL_LEVEL], "Log lines of the Kafka client library (librdkafka) at warning level or above, by level (error, warning): its own account of connections lost, requests timed out, brokers down."),
    m(OUTPUT_QUEUE_FULL, Counter, None, P, "Times a record for the output transaction found its producer's queue full and waited 10 ms for room: the brokers take records slower than the worker hands them over. The record is not dropped; the wait ends when the queue drains or its records time out, which aborts the transaction."),
    m(AUDIT_RECORDS, Counter, None, &[LABEL_PARTITION, LABEL_OUTCOME], "Dropped duplicates and their audit records, by outcome: written (in a committed transaction, with the batch's output), sampled_out (the id is outside worker.audit_sample), over_cap (past worker.audit_max_per_sec)."),
    m(SOURCE_RECORDS, Counter, None, &[LABEL_SOURCE, LABEL_OUTCOME], "Keyed input records by the front door's source (worker.sources; other, or none without the header) and outcome: published, duplicate (dropped), or a duplicate published by the source's mode (worker.source_modes): flagged, passed. The duplicate share per source is (duplicate + flagged + passed) / all."),
    m(PARTITION_ASSIGNMENTS, Counter, None, P, "Input partitions the consumer group assigned to this worker."),
    m(PARTITION_REVOCATIONS, Counter, None, &[LABEL_PARTITION, LABEL_REASON], "Input partitions taken from this worker, by reason: revoked (its batch finished, its producer released) or lost (the group gave it away, e.g. after a session timeout)."),
    m(PARTITIONS_LOADING, Gauge, None, &[], "Assigned partitions whose ids are still being loaded into the ledger (not yet processing)."),
    m(HANDOVER_SECONDS, Gauge, Some(Unit::Seconds), P, "How long the partition's last handover took: from its assignment to its first batch being processable (fenced, ids loaded)."),
    m(HANDOVER_IN_PROGRESS_SECONDS, Gauge, Some(Unit::Seconds), &[], "How long the oldest handover still loading has been under way (0 when none is)."),
    m(HANDOVER_IDS_LOADED, Counter, None, P, "Ids loaded into the ledger from the id changelog when the partition was assigned."),
    m(PARTITION_RETAKES, Counter, None, &[LABEL_PARTITION, LABEL_REASON], "Partitions taken over again in process after their pipeline failed, by reason: failed (a transaction kept aborting, a fatal producer error), fenced (the broker bumped the producer's epoch, e.g. a transaction that outlived its timeout), hung (a client call hung past its timeout)."),
    m(HANDOVER_LOAD_SECONDS, Gauge, Some(Unit::Seconds), &[LABEL_PARTITION, LABEL_PHASE], "Where the partition's last take-over spent its time before it resumed: fence (init_transactions and the committed offset), prepare (making room in the id index for the ids a load expects), fetch (waiting for changelog records), decode, index (fingerprints into the id index), run_wait (waiting for sorted runs to be written), commit (the last runs, the index's last chunks, the ingestion). The index's phase runs on a thread of its own, beside the others."),
    m(CHANGELOG_RECORDS, Counter, None, P, "Id changelog records written (one per output transaction that published new ids)."),
    m(LEDGER_BYTES, Gauge, Some(Unit::Bytes), &[], "Bytes of SST files the ledger holds on disk."),
    m(LEDGER_IDS, Gauge, None, &[], "Ids the ledger holds (an estimate)."),
    m(LEDGER_GENERATIONS, Gauge, None, &[], "Generations (column families) the ledger holds."),
    m(LEDGER_FILTER_BYTES, Gauge, Some(Unit::Bytes), &[], "Memory used by the ledger's filters."),
    m(LEDGER_INDEX_BYTES, Gauge, Some(Unit::Bytes), &[], "Memory of the ledger's in-memory id index (sized from the disk budget)."),
    m(LEDGER_INDEX_OVERFLOWED_BUCKETS, Gauge, None, &[], "Id index buckets that overflowed; ids hashing there are looked up in every generation. Non-zero means the index is too small for the ids held."),
    m(LEDGER_DISK_LOOKUPS, Counter, None, &[], "Ids looked up in a ledger generation on disk because the id index named it (duplicates and rare fingerprint collisions)."),
    m(LEDGER_BUDGET_BYTES, Gauge, Some(Unit::Bytes), &[], "The ledger's configured disk budget."),
    m(LEDGER_OPEN_SECONDS, Gauge, Some(Unit::Seconds), &[LABEL_INDEX], "How long the last open of the ledger took, labelled by where its id index came from: loaded (its file), partial (its file, plus the generations sealed since read from disk), rebuilt (every generation read: no usable file), empty."),
    m(LEDGER_CREATIONS_RESTARTED, Counter, None, &[], "Ledger creations that a crash had interrupted (the directory still held the creation marker) and that were started again."),
    m(SNAPSHOT_LAST_SUCCESS, Gauge, Some(Unit::Seconds), &[], "Unix time of the last successful ledger snapshot."),
    m(SNAPSHOT_FAILURES, Counter, None, &[LABEL_STAGE], "Failed snapshots, by stage (checkpoint, hook, prune)."),
    m(INGEST_REQUESTS, Counter, None, &[LABEL_ENDPOINT, LABEL_STATUS], "HTTP requests to the tracking API by endpoint and status code."),
    m(INGEST_EVENTS, Counter, None, &[LABEL_TYPE], "Events accepted and acknowledged by Kafka, by type."),
    m(INGEST_ASSIGNED_IDS, Counter, None, &[LABEL_ORIGIN], "Accepted events sent without a messageId, by the id they got: derived (from their content and the client's timestamp; a retry gets the same one) or random."),
    m(INGEST_REJECTED, Counter, None, &[LABEL_REASON], "Requests refused whole, and invalid events (each dead-lettered, or refused with its request), by reason."),
    m(INGEST_IN_FLIGHT, Gauge, None, &[], "Requests being decoded and produced now (their bodies have arrived); at most ingest.max_in_flight_requests."),
    m(INGEST_BODY_READS, Gauge, None, &[LABEL_KEY], "Requests whose bodies are arriving now, keyed (a known key in the Authorization header) or keyless."),
    m(INGEST_LOG_SUPPRESSED, Counter, None, &[LABEL_REASON], "Log lines about refused requests not written, by reason: each reason logs at most one line per 10 s, with the count since the last."),
    m(INGEST_READY, Gauge, None, &[], "1 when the tracking API's input and dead-letter topics are in the brokers' metadata (/readyz answers 200), 0 when they are not or the readiness probe could not start."),
    m(INGEST_REQUEST_SECONDS, Histogram, Some(Unit::Seconds), &[LABEL_ENDPOINT], "Tracking API request latency, until Kafka acknowledged every event."),
];

/// Histogram buckets, so Prometheus gets real `_bucket` series (heatmaps, histogram_quantile).
pub fn buckets(name: &str) -> &'static [f64] {
    match name {
        DUPLICATE_AGE_SECONDS => &[
            1.0,
            10.0,
            60.0,
            300.0,
            900.0,
            3600.0,
            3.0 * 3600.0,
            6.0 * 3600.0,
            12.0 * 3600.0,
            86400.0,
            2.0 * 86400.0,
            4.0 * 86400.0,
            7.0 * 86400.0,
        ],
        BATCH_RECORDS => &[1.0, 10.0, 100.0, 500.0, 1000.0, 2000.0, 4096.0, 10000.0],
        _ => &[
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0,
        ],
    }
}

/// Registers help texts and units with the installed recorder.
pub fn describe() {
    for metric in ALL {
        match metric.kind {
            Kind::Counter => match metric.unit {
                Some(u) => metrics::describe_counter!(metric.name, u, metric.help),
                None => metrics::describe_counter!(metric.name, metric.help),
            },
            Kind::Gauge => match metric.unit {
                Some(u) => metrics::describe_gauge!(metric.name, u, metric.help),
                None => metrics::describe_gauge!(metric.name, metric.help),
            },
            Kind::Histogram => match metric.unit {
                Some(u) => metrics::describe_histogram!(metric.name, u, metric.help),
                None => metrics::describe_histogram!(metric.name, metric.help),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_prometheus_shaped() {
        let mut seen = std::collections::HashSet::new();
        for metric in ALL {
            assert!(seen.insert(metric.name), "{} declared twice", metric.name);
            assert!(metric.name.starts_with("dedupe_"), "{}", metric.name);
            assert!(metric
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
            assert_eq!(
                metric.kind == Kind::Counter,
                metric.name.ends_with("_total"),
                "{}",
                metric.name
            );
            assert!(metric.help.ends_with('.'));
        }
    }
}

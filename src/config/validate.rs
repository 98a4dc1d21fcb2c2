//! [`Config::validate`]: the rules the types cannot carry, one helper per section.
//!
//! The checks run in one fixed order and the first failure is reported, so the helpers are called
//! in that order; the snapshot and ingest checks interleave, as they always have, so that the
//! error a given file gets does not change.

use super::ledger::{MAX_RETENTION_LIMIT_SECS, MIN_BUDGET_BYTES};
use super::{
    Assignment, ByteSize, Config, ConfigError, IngestConfig, KafkaConfig, LedgerConfig,
    ReusedIdPolicy, SnapshotConfig, UnkeyedPolicy, WorkerConfig,
};

fn bad(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::invalid(key, message)
}

impl Config {
    /// Checks the rules the types cannot carry.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_kafka(&self.kafka)?;
        check_worker_topics(&self.worker)?;
        check_worker_ownership(&self.worker)?;
        check_worker_changelog(&self.worker)?;
        check_worker_unkeyed(&self.worker)?;
        check_worker_audit(&self.worker)?;
        check_worker_batches(&self.worker)?;
        check_ledger(&self.ledger)?;
        check_retention_limit(&self.ledger, &self.worker)?;
        check_snapshots_and_ingest(self)?;
        if self.log.level.trim().is_empty() {
            return Err(bad("log.level", "must not be empty"));
        }
        Ok(())
    }
}

fn check_kafka(k: &KafkaConfig) -> Result<(), ConfigError> {
    if k.brokers.trim().is_empty() {
        return Err(bad("kafka.brokers", "must name at least one broker"));
    }
    let protocol = k.security_protocol.as_librdkafka();
    if k.security_protocol.uses_sasl() {
        if k.sasl_mechanism
            .as_deref()
            .is_none_or(|m| m.trim().is_empty())
        {
            return Err(bad("kafka.sasl_mechanism", format!("must be set with security_protocol = \"{protocol}\" (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")));
        }
        if k.sasl_username
            .as_deref()
            .is_none_or(|u| u.trim().is_empty())
        {
            return Err(bad(
                "kafka.sasl_username",
                format!("must be set with security_protocol = \"{protocol}\""),
            ));
        }
        if k.sasl_password.is_none() {
            return Err(bad(
                "kafka.sasl_password",
                format!("must be set with security_protocol = \"{protocol}\", from the environment ({})", super::ENV_SASL_PASSWORD),
            ));
        }
    }
    if let Some(ca) = &k.ssl_ca_location {
        if !k.security_protocol.uses_tls() {
            return Err(bad(
                "kafka.ssl_ca_location",
                format!(
                    "is set, but security_protocol = \"{protocol}\" uses no TLS (ssl or sasl_ssl)"
                ),
            ));
        }
        if let Err(e) = std::fs::File::open(ca) {
            return Err(bad(
                "kafka.ssl_ca_location",
                format!("cannot read {}: {e}", ca.display()),
            ));
        }
    }
    Ok(())
}

/// The input, output and group names.
fn check_worker_topics(w: &WorkerConfig) -> Result<(), ConfigError> {
    if w.input_topic.trim().is_empty() {
        return Err(bad("worker.input_topic", "must not be empty"));
    }
    if w.output_topic.trim().is_empty() {
        return Err(bad("worker.output_topic", "must not be empty"));
    }
    if w.input_topic == w.output_topic {
        return Err(bad(
            "worker.output_topic",
            "must differ from worker.input_topic",
        ));
    }
    if w.group_id.as_deref().is_some_and(|g| g.trim().is_empty()) {
        return Err(bad("worker.group_id", "must not be empty"));
    }
    Ok(())
}

/// Which partitions the worker owns: `partitions`, or `worker_index` with `worker_count`.
fn check_worker_ownership(w: &WorkerConfig) -> Result<(), ConfigError> {
    if w.assignment == Assignment::Group {
        if w.partitions.is_some() {
            return Err(bad("worker.partitions", "must not be set with worker.assignment = \"group\" (the group coordinator assigns partitions)"));
        }
        if w.worker_index.is_some() || w.worker_count.is_some() {
            return Err(bad("worker.worker_index", "worker_index/worker_count must not be set with worker.assignment = \"group\" (the group coordinator assigns partitions)"));
        }
    }
    match (w.worker_index, w.worker_count) {
        (Some(_), None) => Err(bad(
            "worker.worker_count",
            "must be set with worker.worker_index",
        )),
        (None, Some(_)) => Err(bad(
            "worker.worker_index",
            "must be set with worker.worker_count",
        )),
        (Some(i), Some(n)) => {
            if n == 0 {
                return Err(bad("worker.worker_count", "must be at least 1"));
            }
            if i >= n {
                return Err(bad(
                    "worker.worker_index",
                    format!("{i} must be less than worker.worker_count ({n})"),
                ));
            }
            if w.partitions.is_some() {
                return Err(bad(
                    "worker.partitions",
                    "set either partitions or worker_index/worker_count, not both",
                ));
            }
            Ok(())
        }
        (None, None) => Ok(()),
    }
}

/// The id changelog and the window it must be able to move.
fn check_worker_changelog(w: &WorkerConfig) -> Result<(), ConfigError> {
    let changelog = w.changelog_topic();
    if changelog.trim().is_empty() {
        return Err(bad("worker.changelog_topic", "must not be empty"));
    }
    if changelog == w.input_topic
        || changelog == w.output_topic
        || w.dead_letter_topic.as_deref() == Some(changelog.as_str())
    {
        return Err(bad(
            "worker.changelog_topic",
            "must differ from the input, output and dead-letter topics",
        ));
    }
    if w.promised_window_secs == 0 {
        return Err(bad("worker.promised_window_secs", "must be positive"));
    }
    if w.changelog_retention_secs < w.promised_window_secs {
        return Err(bad(
            "worker.changelog_retention_secs",
            format!(
                "{} s is shorter than worker.promised_window_secs ({} s): a partition that moves could not take its promised window with it",
                w.changelog_retention_secs, w.promised_window_secs
            ),
        ));
    }
    if w.member_id.as_deref().is_some_and(|m| m.trim().is_empty()) {
        return Err(bad(
            "worker.member_id",
            "must not be empty (leave it unset to use the host name)",
        ));
    }
    Ok(())
}

/// `dead-letter` (for records without an id, or for reused ids) needs a topic of its own.
fn check_worker_unkeyed(w: &WorkerConfig) -> Result<(), ConfigError> {
    let needed_by = match (w.unkeyed_policy, w.on_reused_id) {
        (UnkeyedPolicy::DeadLetter, _) => Some("unkeyed_policy"),
        (_, ReusedIdPolicy::DeadLetter) => Some("on_reused_id"),
        _ => None,
    };
    if let Some(setting) = needed_by {
        match &w.dead_letter_topic {
            None => {
                return Err(bad(
                    "worker.dead_letter_topic",
                    format!("must be set when {setting} is dead-letter"),
                ))
            }
            Some(t) if t == &w.output_topic || t == &w.input_topic => {
                return Err(bad(
                    "worker.dead_letter_topic",
                    "must differ from the input and output topics",
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The duplicate audit: a topic of its own, a share between 0 and 1.
fn check_worker_audit(w: &WorkerConfig) -> Result<(), ConfigError> {
    if let Some(audit) = w.audit_topic() {
        let others = [
            Some(w.input_topic.clone()),
            Some(w.output_topic.clone()),
            Some(w.changelog_topic()),
            w.dead_letter_topic.clone(),
        ];
        if others.iter().flatten().any(|t| *t == audit) {
            return Err(bad("worker.audit_topic", "must differ from the input, output, changelog and dead-letter topics (\"\" turns the audit off)"));
        }
        if audit.trim().is_empty() {
            return Err(bad(
                "worker.audit_topic",
                "must not be blank (\"\" turns the audit off)",
            ));
        }
    }
    if !(0.0..=1.0).contains(&w.audit_sample) {
        return Err(bad(
            "worker.audit_sample",
            format!("{} is not between 0.0 and 1.0", w.audit_sample),
        ));
    }
    if w.audit_retention_secs == 0 {
        return Err(bad("worker.audit_retention_secs", "must be positive"));
    }
    Ok(())
}

/// Batch limits and timeouts.
fn check_worker_batches(w: &WorkerConfig) -> Result<(), ConfigError> {
    if w.batch_max_records == 0 || w.batch_max_records > 100_000 {
        return Err(bad(
            "worker.batch_max_records",
            "must be between 1 and 100000",
        ));
    }
    if w.batch_max_bytes.0 < 64 * ByteSize::KIB {
        return Err(bad("worker.batch_max_bytes", "must be at least 64KiB"));
    }
    if w.batch_linger_ms > 60_000 {
        return Err(bad("worker.batch_linger_ms", "must be at most 60000"));
    }
    if w.transaction_timeout_ms < 1_000 || w.transaction_timeout_ms > 900_000 {
        return Err(bad(
            "worker.transaction_timeout_ms",
            "must be between 1000 and 900000 (the broker's default max)",
        ));
    }
    if w.shutdown_timeout_ms == 0 {
        return Err(bad("worker.shutdown_timeout_ms", "must be positive"));
    }
    Ok(())
}

fn check_ledger(l: &LedgerConfig) -> Result<(), ConfigError> {
    if l.budget_bytes.0 < MIN_BUDGET_BYTES {
        return Err(bad(
            "ledger.budget_bytes",
            format!("must be at least {}", ByteSize(MIN_BUDGET_BYTES)),
        ));
    }
    if !(2..=64).contains(&l.generations) {
        return Err(bad("ledger.generations", "must be between 2 and 64"));
    }
    if l.write_buffer_bytes.0 < 4 * ByteSize::MIB {
        return Err(bad("ledger.write_buffer_bytes", "must be at least 4MiB"));
    }
    if l.write_buffer_bytes.0 > l.budget_bytes.0 / l.generations as u64 {
        return Err(bad(
            "ledger.write_buffer_bytes",
            "must not exceed one generation (ledger.budget_bytes / ledger.generations)",
        ));
    }
    Ok(())
}

/// The retention limit: positive, and never below the promise (a limit shorter than the promised
/// window would break the promise by design).
fn check_retention_limit(l: &LedgerConfig, w: &WorkerConfig) -> Result<(), ConfigError> {
    let Some(limit) = l.max_window_secs else {
        return Ok(());
    };
    if limit == 0 {
        return Err(bad(
            "ledger.max_window_secs",
            "must be positive (leave it unset for no retention limit)",
        ));
    }
    if limit > MAX_RETENTION_LIMIT_SECS {
        return Err(bad(
            "ledger.max_window_secs",
            format!("{limit} s is more than the largest limit, {MAX_RETENTION_LIMIT_SECS} s (10 years); leave it unset for none"),
        ));
    }
    if limit < w.promised_window_secs {
        return Err(bad(
            "ledger.max_window_secs",
            format!(
                "{limit} s is shorter than worker.promised_window_secs ({} s): the retention limit would forget ids the promise says are held; raise the limit or lower the promise",
                w.promised_window_secs
            ),
        ));
    }
    Ok(())
}

/// The snapshot and ingest checks, in their historical (interleaved) order.
fn check_snapshots_and_ingest(c: &Config) -> Result<(), ConfigError> {
    if c.snapshots.keep == 0 {
        return Err(bad("snapshots.keep", "must be at least 1"));
    }
    check_snapshot_pace(&c.snapshots)?;
    check_ingest_topic_and_timeouts(&c.ingest)?;
    if c.snapshots.hook_timeout_secs == 0 {
        return Err(bad("snapshots.hook_timeout_secs", "must be positive"));
    }
    if c.ingest.max_connections == 0 {
        return Err(bad("ingest.max_connections", "must be at least 1"));
    }
    check_ingest_browsers(&c.ingest)
}

/// The least interval between snapshots, and a schedule it does not skip.
fn check_snapshot_pace(s: &SnapshotConfig) -> Result<(), ConfigError> {
    if s.min_interval_secs == 0 {
        return Err(bad("snapshots.min_interval_secs", "must be at least 1"));
    }
    if s.interval_secs != 0 && s.interval_secs < s.min_interval_secs {
        return Err(bad(
            "snapshots.interval_secs",
            format!(
                "must be at least snapshots.min_interval_secs ({}), or 0 to turn the schedule off",
                s.min_interval_secs
            ),
        ));
    }
    Ok(())
}

/// The in-flight limit, CORS origins, rate limit and public URL.
fn check_ingest_browsers(i: &IngestConfig) -> Result<(), ConfigError> {
    if i.max_in_flight_requests == 0 {
        return Err(bad("ingest.max_in_flight_requests", "must be at least 1"));
    }
    check_keyless_reads(i)?;
    for origin in &i.cors_origins {
        if origin != "*" && !is_origin(origin) {
            return Err(bad(
                "ingest.cors_origins",
                format!("`{origin}` is not an origin: write scheme, host and optional port, as `https://shop.example.com` (no path, no trailing slash), or \"*\""),
            ));
        }
    }
    if i.rate_limit_events_per_sec == 0 && i.rate_limit_burst_events != 0 {
        return Err(bad(
            "ingest.rate_limit_burst_events",
            "needs ingest.rate_limit_events_per_sec (the limit is off)",
        ));
    }
    if let Some(url) = &i.public_url {
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"));
        if rest.is_none_or(|r| {
            r.is_empty()
                || r.starts_with('/')
                || r.contains(['?', '#'])
                || r.chars().any(char::is_whitespace)
        }) {
            return Err(bad("ingest.public_url", format!("`{url}` must be an http:// or https:// URL such as `https://track.example.com`")));
        }
    }
    Ok(())
}

/// The bounds on bodies read before anything vouches for them: within the connections.
fn check_keyless_reads(i: &IngestConfig) -> Result<(), ConfigError> {
    if i.keyless_body_timeout_ms == 0 {
        return Err(bad("ingest.keyless_body_timeout_ms", "must be positive"));
    }
    if i.max_keyless_body_reads
        .is_some_and(|n| n == 0 || n >= i.max_connections)
    {
        return Err(bad(
            "ingest.max_keyless_body_reads",
            format!("must be at least 1 and below ingest.max_connections ({}), so keyless clients cannot hold every connection", i.max_connections),
        ));
    }
    if i.max_keyless_body_reads_per_client
        .is_some_and(|n| n == 0 || n > i.keyless_body_reads())
    {
        return Err(bad(
            "ingest.max_keyless_body_reads_per_client",
            "must be at least 1 and at most ingest.max_keyless_body_reads",
        ));
    }
    if i.dead_letter_topic
        .as_deref()
        .is_some_and(|t| t.trim().is_empty() || t == i.topic)
    {
        return Err(bad(
            "ingest.dead_letter_topic",
            "must be a topic name other than ingest.topic",
        ));
    }
    Ok(())
}

/// `http(s)://host[:port]`: what a browser sends in `Origin`.
fn is_origin(origin: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
    else {
        return false;
    };
    let (host, port) = match rest.rsplit_once(':') {
        // `[::1]:8080` has a port; `[::1]` has none.
        Some((host, port)) if !port.contains(']') => (host, Some(port)),
        _ => (rest, None),
    };
    !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'))
        && port
            .is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
}

fn check_ingest_topic_and_timeouts(i: &IngestConfig) -> Result<(), ConfigError> {
    if i.topic.trim().is_empty() {
        return Err(bad("ingest.topic", "must not be empty"));
    }
    if i.ack_timeout_ms == 0 {
        return Err(bad("ingest.ack_timeout_ms", "must be positive"));
    }
    if i.request_timeout_ms == 0 {
        return Err(bad("ingest.request_timeout_ms", "must be positive"));
    }
    Ok(())
}

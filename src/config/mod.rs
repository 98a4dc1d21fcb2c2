//! Configuration: one TOML file, overridden by `DEDUPE_<SECTION>_<KEY>` environment variables (a
//! list key takes a comma-separated list), then by command-line flags. Unknown keys and invalid values are rejected before anything starts, with
//! an error that names the key (`ledger.budget_bytes: must be at least 64 MiB`).
//!
//! Secrets (the SASL password, the admin token) come only from the environment
//! (`DEDUPE_KAFKA_SASL_PASSWORD`, `DEDUPE_ADMIN_TOKEN`), are held in [`Secret`], and never print:
//! `Debug` and `Serialize` both write `<redacted>`. A secret mounted from a file (a Kubernetes
//! Secret made with `--from-file`) usually ends in a newline, so each is cleaned here, once, for
//! every command: the admin token loses surrounding white space (a bearer token has none) and is
//! refused when nothing is left or when it holds a character an HTTP header cannot carry; the SASL
//! password loses one trailing line ending only (a password may begin or end with spaces). The
//! front door's write keys are trimmed where they are read (`dedupe_tracking::WriteKeys`). No
//! error about a secret quotes it.
//!
//! One file per section: `worker.rs`, `ledger.rs`, `snapshots.rs`, `ingest.rs` and `telemetry.rs`
//! (`metrics` and `log`); `units.rs` has [`ByteSize`], and `validate.rs` the rules the types cannot
//! carry. This file loads and applies overrides. Every public item is re-exported here, so it is
//! named `dedupe::config::X` whichever file holds it.
//!
//! The settings the domain acts on are defined where it acts on them, and only re-exported here:
//! the `[kafka]` section ([`KafkaConfig`]) in `kafka`, [`Secret`] in `secret`, the id's source
//! ([`IdSource`], [`DigestSource`]) in `identity`, the policies ([`UnkeyedPolicy`],
//! [`ReusedIdPolicy`]) in `batch`. Configuration depends on the domain, never the reverse: the
//! module graph test (`tests/layout.rs`) holds the core's modules to no circle.
//!
//! Defaults live in each section's `Default` impl, each with a comment on where it comes from;
//! `config/dedupe.toml` documents every key and must stay in step (a test parses it).

#![warn(missing_docs)]

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod ingest;
mod ledger;
mod snapshots;
mod telemetry;
mod units;
mod validate;
mod worker;

pub use ingest::{IngestConfig, MissingMessageId, OnInvalidEvent};
pub use ledger::{LedgerConfig, MAX_RETENTION_LIMIT_SECS, MIN_BUDGET_BYTES};
pub use snapshots::SnapshotConfig;
pub use telemetry::{LogConfig, LogFormat, MetricsConfig};
pub use units::ByteSize;
// Defined by the modules that act on them (config depends on those, never the reverse).
pub use crate::kafka::{is_secret_property, KafkaConfig, SecurityProtocol};
pub use crate::secret::{Secret, SecretMatcher};
pub use worker::{
    Assignment, DigestSource, IdSource, InputPartitioner, PartitionSet, ReusedIdPolicy, SourceMode,
    SourceModes, UnkeyedPolicy, WorkerConfig,
};

#[cfg(test)]
mod tests;

/// Prefix of every environment variable that overrides a configuration key.
pub const ENV_PREFIX: &str = "DEDUPE_";
/// The one secret key, settable only from the environment.
pub const ENV_SASL_PASSWORD: &str = "DEDUPE_KAFKA_SASL_PASSWORD";
/// The bearer token the worker's admin endpoints (`POST /admin/snapshot`) require, settable only
/// from the environment. Without one, they answer loopback clients only.
pub const ENV_ADMIN_TOKEN: &str = "DEDUPE_ADMIN_TOKEN";
/// The top-level sections, in the order they are documented.
pub const SECTIONS: &[&str] = &[
    "kafka",
    "worker",
    "ledger",
    "snapshots",
    "ingest",
    "metrics",
    "log",
];

/// A whole configuration, as the service runs with it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// How to reach the Kafka cluster.
    pub kafka: KafkaConfig,
    /// The dedupe worker (`dedupe run`).
    pub worker: WorkerConfig,
    /// The RocksDB ledger of seen ids.
    pub ledger: LedgerConfig,
    /// Ledger checkpoints and the hook that snapshots them.
    pub snapshots: SnapshotConfig,
    /// The HTTP tracking API (`dedupe ingest`).
    pub ingest: IngestConfig,
    /// The Prometheus endpoint.
    pub metrics: MetricsConfig,
    /// Logging.
    pub log: LogConfig,
}

/// Values given on the command line; each wins over the file and the environment.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--brokers`: `kafka.brokers`.
    pub brokers: Option<String>,
    /// `--input-topic`: `worker.input_topic`.
    pub input_topic: Option<String>,
    /// `--output-topic`: `worker.output_topic`.
    pub output_topic: Option<String>,
    /// `--data-dir`: `worker.data_dir`.
    pub data_dir: Option<PathBuf>,
    /// `--partitions`: `worker.partitions`, parsed as a [`PartitionSet`].
    pub partitions: Option<String>,
    /// `--worker-index`: `worker.worker_index`.
    pub worker_index: Option<u32>,
    /// `--worker-count`: `worker.worker_count`.
    pub worker_count: Option<u32>,
    /// `--assignment`: `worker.assignment`, `static` or `group`.
    pub assignment: Option<String>,
    /// `--member-id`: `worker.member_id`.
    pub member_id: Option<String>,
    /// `--metrics-addr`: `metrics.addr`, parsed as a socket address.
    pub metrics_addr: Option<String>,
    /// `--log-format`: `log.format`, `human` or `json`.
    pub log_format: Option<String>,
    /// `--listen`: `ingest.listen`, parsed as a socket address.
    pub listen: Option<String>,
    /// `--topic` of `dedupe ingest`: `ingest.topic`.
    pub ingest_topic: Option<String>,
    /// `--write-keys-file`: `ingest.write_keys_file`.
    pub write_keys_file: Option<PathBuf>,
}

/// Why a configuration was refused. Every message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// The file is not TOML.
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// Where the error is and what it is; never the line itself, which may hold a secret.
        message: String,
    },
    /// A key is unknown, or its value is invalid.
    #[error("{key}: {message}")]
    Invalid {
        /// The key (`ledger.budget_bytes`), environment variable or flag.
        key: String,
        /// What is wrong with it, on one line.
        message: String,
    },
}

impl ConfigError {
    fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// The secrets taken from the environment while it is applied.
#[derive(Default)]
struct EnvSecrets {
    /// `DEDUPE_KAFKA_SASL_PASSWORD`.
    sasl_password: Option<Secret>,
    /// `DEDUPE_ADMIN_TOKEN`, unless empty.
    admin_token: Option<Secret>,
}

/// `DEDUPE_ADMIN_TOKEN` as the worker and its clients use it: trimmed of surrounding white
/// space; an empty value is no token. A value blank once trimmed (a mount of an empty file, most
/// likely a mistake) or one holding anything but visible ASCII (a control character, an inner
/// space, a non-ASCII letter: what a bearer header cannot carry unchanged) is refused, naming the
/// cause and never the value.
pub fn admin_token(value: &str) -> Result<Option<Secret>, ConfigError> {
    if value.is_empty() {
        return Ok(None);
    }
    let token = value.trim();
    if token.is_empty() {
        return Err(ConfigError::invalid(
            ENV_ADMIN_TOKEN,
            "is only white space; set a token, or unset the variable to answer loopback clients only",
        ));
    }
    if let Some(at) = token.bytes().position(|b| !b.is_ascii_graphic()) {
        return Err(ConfigError::invalid(
            ENV_ADMIN_TOKEN,
            format!(
                "holds a character an HTTP header cannot carry as a bearer token (at byte {}: a control character, a space or a non-ASCII character); use visible ASCII only",
                at + 1
            ),
        ));
    }
    Ok(Some(Secret::new(token)))
}

/// `DEDUPE_KAFKA_SASL_PASSWORD` without one trailing line ending (`\n` or `\r\n`), which a
/// password mounted from a file carries; other white space is the password's own.
pub fn sasl_password(value: &str) -> Secret {
    let value = value.strip_suffix('\n').unwrap_or(value);
    Secret::new(value.strip_suffix('\r').unwrap_or(value))
}

impl Config {
    /// Loads the file (if any), applies the environment, then the flags, then validates.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &Overrides,
    ) -> Result<Self, ConfigError> {
        let mut table = match path {
            Some(path) => read_table(path)?,
            None => toml::Table::new(),
        };
        let secrets = apply_environment(&mut table, env)?;
        reject_secrets_in_file(&table)?;
        let mut config: Config = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| {
                let key = e.path().to_string();
                ConfigError::invalid(
                    if key == "." {
                        "config".to_string()
                    } else {
                        key
                    },
                    one_line(&e.inner().to_string()),
                )
            })?;
        config.kafka.sasl_password = secrets.sasl_password;
        config.metrics.admin_token = secrets.admin_token;
        config.apply(overrides)?;
        config.validate()?;
        Ok(config)
    }

    /// Applies the flags, section by section.
    fn apply(&mut self, o: &Overrides) -> Result<(), ConfigError> {
        if let Some(v) = &o.brokers {
            self.kafka.brokers = v.clone();
        }
        apply_worker(&mut self.worker, o)?;
        apply_telemetry(&mut self.metrics, &mut self.log, o)?;
        apply_ingest(&mut self.ingest, o)
    }

    /// The effective configuration as TOML, secrets redacted.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self)
            .unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"))
    }
}

fn apply_worker(w: &mut WorkerConfig, o: &Overrides) -> Result<(), ConfigError> {
    if let Some(v) = &o.input_topic {
        w.input_topic = v.clone();
    }
    if let Some(v) = &o.output_topic {
        w.output_topic = v.clone();
    }
    if let Some(v) = &o.data_dir {
        w.data_dir = v.clone();
    }
    if let Some(v) = &o.partitions {
        w.partitions =
            Some(PartitionSet::parse(v).map_err(|m| ConfigError::invalid("--partitions", m))?);
    }
    if let Some(v) = o.worker_index {
        w.worker_index = Some(v);
    }
    if let Some(v) = o.worker_count {
        w.worker_count = Some(v);
    }
    if let Some(v) = &o.assignment {
        w.assignment = v
            .parse()
            .map_err(|m| ConfigError::invalid("--assignment", m))?;
    }
    if let Some(v) = &o.member_id {
        w.member_id = Some(v.clone());
    }
    Ok(())
}

fn apply_telemetry(
    metrics: &mut MetricsConfig,
    log: &mut LogConfig,
    o: &Overrides,
) -> Result<(), ConfigError> {
    if let Some(v) = &o.metrics_addr {
        metrics.addr = v.parse().map_err(|e| {
            ConfigError::invalid("--metrics-addr", format!("`{v}` is not an address: {e}"))
        })?;
    }
    if let Some(v) = &o.log_format {
        log.format = match v.as_str() {
            "human" => LogFormat::Human,
            "json" => LogFormat::Json,
            other => {
                return Err(ConfigError::invalid(
                    "--log-format",
                    format!("`{other}` is not human or json"),
                ))
            }
        };
    }
    Ok(())
}

fn apply_ingest(i: &mut IngestConfig, o: &Overrides) -> Result<(), ConfigError> {
    if let Some(v) = &o.listen {
        i.listen = v.parse().map_err(|e| {
            ConfigError::invalid("--listen", format!("`{v}` is not an address: {e}"))
        })?;
    }
    if let Some(v) = &o.ingest_topic {
        i.topic = v.clone();
    }
    if let Some(v) = &o.write_keys_file {
        i.write_keys_file = Some(v.clone());
    }
    Ok(())
}

/// Reads and parses the file, reporting a syntax error without quoting the line.
fn read_table(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    text.parse::<toml::Table>()
        .map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: syntax_message(&text, &e),
        })
}

/// Applies every `DEDUPE_SECTION_KEY` variable to `table`, and takes the secrets out of the
/// environment, cleaned ([`admin_token`], [`sasl_password`]).
fn apply_environment(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<EnvSecrets, ConfigError> {
    let defaults = default_table();
    let mut secrets = EnvSecrets::default();
    for (name, value) in env {
        if name == ENV_SASL_PASSWORD {
            secrets.sasl_password = Some(sasl_password(&value));
            continue;
        }
        if name == ENV_ADMIN_TOKEN {
            secrets.admin_token = admin_token(&value)?;
            continue;
        }
        apply_env(table, &defaults, &name, &value)?;
    }
    Ok(secrets)
}

/// The default configuration as TOML: what tells [`apply_env`] which keys are lists.
fn default_table() -> toml::Table {
    // Serializing the defaults cannot fail (`to_toml` prints them the same way, and the
    // environment tests would catch it); were it to, no key would be taken as a list, and a
    // comma-separated value would be refused by the key's own type, naming the key.
    toml::Table::try_from(Config::default()).unwrap_or_default()
}

/// Refuses a secret written in the file (or set through a `DEDUPE_SECTION_KEY` variable).
fn reject_secrets_in_file(table: &toml::Table) -> Result<(), ConfigError> {
    for (section, key, env) in [
        ("metrics", "admin_token", ENV_ADMIN_TOKEN),
        ("kafka", "sasl_password", ENV_SASL_PASSWORD),
    ] {
        if table
            .get(section)
            .and_then(|s| s.as_table())
            .is_some_and(|s| s.contains_key(key))
        {
            return Err(ConfigError::invalid(
                format!("{section}.{key}"),
                format!("secrets may only come from the environment ({env})"),
            ));
        }
    }
    Ok(())
}

/// Applies one `DEDUPE_SECTION_KEY=value` variable. Variables outside the config's sections (such
/// as `DEDUPE_WRITE_KEYS`) are not configuration keys and are left alone; an unknown key inside a
/// known section is an error.
///
/// A value that parses as a TOML value other than a table (a number, a bool, an array literal such
/// as `["a", "b"]`) is taken as that; anything else is a string. A key whose default (in
/// `defaults`, the default configuration as TOML) is an array also takes a comma-separated list:
/// `DEDUPE_INGEST_CORS_ORIGINS=https://a.example,https://b.example`, each item trimmed and taken
/// as a string, empty items dropped (so an empty value is an empty list). A list of anything but
/// strings needs the array literal.
fn apply_env(
    table: &mut toml::Table,
    defaults: &toml::Table,
    name: &str,
    value: &str,
) -> Result<(), ConfigError> {
    let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
        return Ok(());
    };
    let rest = rest.to_ascii_lowercase();
    let Some(section) = SECTIONS.iter().find(|s| rest.starts_with(&format!("{s}_"))) else {
        return Ok(());
    };
    let key = &rest[section.len() + 1..];
    if key.is_empty() {
        return Err(ConfigError::invalid(name, "names no key"));
    }
    let entry = table
        .entry(section.to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let Some(section_table) = entry.as_table_mut() else {
        return Err(ConfigError::invalid(*section, "must be a table"));
    };
    let parsed = format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .filter(|v| !v.is_table());
    let is_list = defaults
        .get(*section)
        .and_then(|s| s.get(key))
        .is_some_and(toml::Value::is_array);
    let value = match parsed {
        Some(v) if !is_list || v.is_array() => v,
        // A list key given anything but an array literal: the value's text, split at commas. A
        // lone value (`https://a.example`, or a quoted `"a"`) is a list of one item, its text as
        // written.
        _ if is_list => toml::Value::Array(
            value
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(|item| toml::Value::String(item.to_string()))
                .collect(),
        ),
        _ => toml::Value::String(value.to_string()),
    };
    section_table.insert(key.to_string(), value);
    Ok(())
}

/// Where a TOML syntax error is and what it is, without quoting the line: it may hold a secret.
fn syntax_message(text: &str, e: &toml::de::Error) -> String {
    let what = one_line(e.message());
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {what}")
        }
        None => what,
    }
}

/// Joins a multi-line message into one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

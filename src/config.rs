//! Configuration: one TOML file, overridden by `DEDUPE_<SECTION>_<KEY>` environment variables, then
//! by command-line flags. Unknown keys and invalid values are rejected before anything starts, with
//! an error that names the key (`ledger.budget_bytes: must be at least 64 MiB`).
//!
//! Secrets (the SASL password) come only from the environment (`DEDUPE_KAFKA_SASL_PASSWORD`), are
//! held in [`Secret`], and never print: `Debug` and `Serialize` both write `<redacted>`.
//!
//! Defaults live in the `Default` impls below, each with a comment on where it comes from;
//! `config/dedupe.toml` documents every key and must stay in step (a test parses it).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Prefix of every environment variable that overrides a configuration key.
pub const ENV_PREFIX: &str = "DEDUPE_";
/// The one secret key, settable only from the environment.
pub const ENV_SASL_PASSWORD: &str = "DEDUPE_KAFKA_SASL_PASSWORD";
/// The bearer token the worker's admin endpoints (`POST /admin/snapshot`) require, settable only
/// from the environment. Without one, they answer loopback clients only.
pub const ENV_ADMIN_TOKEN: &str = "DEDUPE_ADMIN_TOKEN";
/// The top-level sections, in the order they are documented.
pub const SECTIONS: &[&str] = &["kafka", "worker", "ledger", "snapshots", "ingest", "metrics", "log"];

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

/// Kafka connection settings shared by every client the service makes.
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap servers, comma separated (`bootstrap.servers`).
    pub brokers: String,
    /// `security.protocol`: plaintext, ssl, sasl_plaintext or sasl_ssl.
    pub security_protocol: SecurityProtocol,
    /// `sasl.mechanisms` when SASL is used (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
    pub sasl_mechanism: Option<String>,
    /// `sasl.username` when SASL is used.
    pub sasl_username: Option<String>,
    /// `sasl.password`: from `DEDUPE_KAFKA_SASL_PASSWORD` only; never in a file.
    #[serde(skip_deserializing)]
    pub sasl_password: Option<Secret>,
    /// Extra librdkafka properties passed through as given (e.g. `"ssl.ca.location"`). Values of
    /// secret-looking properties ([`is_secret_property`]) print as `<redacted>`.
    #[serde(serialize_with = "serialize_properties")]
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            // The local broker that deploy/local/kafka.sh starts.
            brokers: "127.0.0.1:9092".into(),
            security_protocol: SecurityProtocol::Plaintext,
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            properties: BTreeMap::new(),
        }
    }
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &self.sasl_password)
            .field("properties", &self.properties.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `security.protocol` values librdkafka accepts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn as_librdkafka(self) -> &'static str {
        match self {
            Self::Plaintext => "plaintext",
            Self::Ssl => "ssl",
            Self::SaslPlaintext => "sasl_plaintext",
            Self::SaslSsl => "sasl_ssl",
        }
    }
}

/// Whether a librdkafka property holds a secret (`sasl.password`, `ssl.key.password`,
/// `ssl.keystore.password`, `ssl.key.pem`, `sasl.oauthbearer.client.secret`, ...): its value is
/// never printed.
pub fn is_secret_property(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "secret", "key.pem", "oauthbearer.config", "jaas", "token", "credential"]
        .iter()
        .any(|word| name.contains(word))
}

fn serialize_properties<S: Serializer>(properties: &BTreeMap<String, String>, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(properties.len()))?;
    for (name, value) in properties {
        let shown = if is_secret_property(name) { "<redacted>" } else { value.as_str() };
        map.serialize_entry(name, shown)?;
    }
    map.end()
}

/// A value that must never be printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The secret itself, for handing to a client library. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

/// Where a record's message id is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdSource {
    /// The record key (the input topic is keyed by message id).
    Key,
    /// A record header with this name.
    Header(String),
    /// A JSON pointer (RFC 6901) into the record value, e.g. `/messageId`.
    JsonPointer(String),
}

impl IdSource {
    fn parse(text: &str) -> Result<Self, String> {
        if text == "key" {
            Ok(Self::Key)
        } else if let Some(name) = text.strip_prefix("header:") {
            if name.is_empty() {
                return Err("header: needs a header name, e.g. header:message-id".into());
            }
            Ok(Self::Header(name.to_string()))
        } else if let Some(pointer) = text.strip_prefix("json:") {
            if !pointer.starts_with('/') {
                return Err("json: needs a JSON pointer starting with '/', e.g. json:/messageId".into());
            }
            Ok(Self::JsonPointer(pointer.to_string()))
        } else {
            Err(format!("`{text}` is not one of key, header:NAME, json:/POINTER"))
        }
    }
}

impl fmt::Display for IdSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Key => f.write_str("key"),
            Self::Header(name) => write!(f, "header:{name}"),
            Self::JsonPointer(p) => write!(f, "json:{p}"),
        }
    }
}

impl Serialize for IdSource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IdSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// What happens to a record whose id is missing, empty, longer than 1 KiB or unreadable.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum UnkeyedPolicy {
    /// Publish it to the output unchecked: never lose data (the default).
    Forward,
    /// Drop it, counted and logged.
    Drop,
    /// Publish it to `worker.dead_letter_topic`, in the same transaction.
    DeadLetter,
}

/// A set of input partitions, written `0-3,7`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartitionSet(pub Vec<i32>);

impl PartitionSet {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo.trim(), hi.trim()),
                None => (part, part),
            };
            let lo: i32 = lo.parse().map_err(|_| format!("`{part}` is not a partition or range like 0-3"))?;
            let hi: i32 = hi.parse().map_err(|_| format!("`{part}` is not a partition or range like 0-3"))?;
            if lo < 0 || hi < lo {
                return Err(format!("`{part}` is not a valid range (need 0 <= low <= high)"));
            }
            out.extend(lo..=hi);
        }
        out.sort_unstable();
        out.dedup();
        if out.is_empty() {
            return Err("names no partition".into());
        }
        Ok(Self(out))
    }
}

impl fmt::Display for PartitionSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut i = 0;
        while i < self.0.len() {
            let lo = self.0[i];
            let mut hi = lo;
            while i + 1 < self.0.len() && self.0[i + 1] == hi + 1 {
                i += 1;
                hi = self.0[i];
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

impl Serialize for PartitionSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PartitionSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A size in bytes, written as an integer or as a string with a unit: `"64MiB"`, `"16GiB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const KIB: u64 = 1024;
    pub const MIB: u64 = 1024 * 1024;
    pub const GIB: u64 = 1024 * 1024 * 1024;

    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let split = text.find(|c: char| !c.is_ascii_digit() && c != '_').unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let n: u64 = digits
            .replace('_', "")
            .parse()
            .map_err(|_| format!("`{text}` is not a size like 64MiB"))?;
        let mult = match unit.trim() {
            "" | "B" => 1,
            "KiB" | "K" | "KB" => Self::KIB,
            "MiB" | "M" | "MB" => Self::MIB,
            "GiB" | "G" | "GB" => Self::GIB,
            "TiB" | "T" | "TB" => Self::GIB * 1024,
            other => return Err(format!("unknown unit `{other}` (use B, KiB, MiB, GiB, TiB)")),
        };
        n.checked_mul(mult).map(Self).ok_or_else(|| format!("`{text}` is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (unit, size) in [("TiB", Self::GIB * 1024), ("GiB", Self::GIB), ("MiB", Self::MIB), ("KiB", Self::KIB)] {
            if n >= size && n % size == 0 {
                return write!(f, "{}{unit}", n / size);
            }
        }
        write!(f, "{n}B")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(Self(n)),
            Raw::Text(t) => Self::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// The dedupe worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// The input topic, partitioned by message id.
    pub input_topic: String,
    /// The output topic: the source of truth, needs at least as many partitions as the input.
    pub output_topic: String,
    /// The consumer group whose committed offsets the transactions carry.
    pub group_id: String,
    /// The input partitions this worker owns, e.g. `0-3,7`. Unset: derived from
    /// `worker_index`/`worker_count`, or every partition of the input topic.
    pub partitions: Option<PartitionSet>,
    /// This worker's ordinal (a StatefulSet pod's ordinal); owns partitions p with p % count == index.
    pub worker_index: Option<u32>,
    /// How many workers share the input topic.
    pub worker_count: Option<u32>,
    /// The ledger's directory.
    pub data_dir: PathBuf,
    /// Where the message id is read: `key`, `header:NAME` or `json:/pointer`.
    pub id_source: IdSource,
    /// What to do with a record whose id is missing, empty, over 1 KiB or unreadable.
    pub unkeyed_policy: UnkeyedPolicy,
    /// Where `dead-letter` sends such records.
    pub dead_letter_topic: Option<String>,
    /// Most records per batch (one ledger lookup, one transaction).
    pub batch_max_records: usize,
    /// Most bytes of keys and values per batch.
    pub batch_max_bytes: ByteSize,
    /// How long a batch waits to fill before it is processed anyway.
    pub batch_linger_ms: u64,
    /// `transaction.timeout.ms` of the output producer.
    pub transaction_timeout_ms: u64,
    /// How long a graceful shutdown may take before the process exits anyway.
    pub shutdown_timeout_ms: u64,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            input_topic: "events.in".into(),
            output_topic: "events.out".into(),
            group_id: "dedupe".into(),
            partitions: None,
            worker_index: None,
            worker_count: None,
            // The volume the container image declares.
            data_dir: PathBuf::from("/var/lib/dedupe/ledger"),
            id_source: IdSource::Key,
            // Never lose data: a record without a usable id goes on unchecked.
            unkeyed_policy: UnkeyedPolicy::Forward,
            dead_letter_topic: None,
            // The batch size the ledger was measured at (FACTS: 4096-id batches).
            batch_max_records: 4096,
            // librdkafka's default message.max.bytes is 1 MB; a few of those per transaction.
            batch_max_bytes: ByteSize(4 * ByteSize::MIB),
            // Enough to fill a batch at ~200k msgs/s, short enough to keep p99 low.
            batch_linger_ms: 20,
            // librdkafka's default transaction.timeout.ms.
            transaction_timeout_ms: 60_000,
            // Kubernetes' default terminationGracePeriodSeconds is 30 s; leave it some slack.
            shutdown_timeout_ms: 25_000,
        }
    }
}

/// How much of the most recent ledger writes may be lost in a crash.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum DurabilityMode {
    /// WAL synced on every batch: nothing recorded is lost, slowest.
    SyncWal,
    /// WAL written but not synced: a process crash loses nothing, a machine crash may lose a tail.
    Wal,
    /// No WAL; memtables flushed atomically: a crash loses the unflushed tail, which recovery
    /// replays from the output topic.
    NoWal,
}

/// The RocksDB ledger.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    /// Disk budget for ids; when reached, the oldest generation is forgotten.
    pub budget_bytes: ByteSize,
    /// How many generations the budget is split into (the unit of forgetting).
    pub generations: usize,
    /// What a crash may lose of the most recent batches.
    pub durability: DurabilityMode,
    /// RocksDB block cache.
    pub block_cache_bytes: ByteSize,
    /// Ids buffered in memory between commits (each commit writes one sorted file); with
    /// `no-wal`, what a crash may lose and recovery replays from the output.
    pub write_buffer_bytes: ByteSize,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            // About 800M ids at ~20 bytes/key: days of ids at 5k/s per worker.
            budget_bytes: ByteSize(16 * ByteSize::GIB),
            // Forgetting 1/8 of the window at a time keeps the window within 12% of its maximum.
            generations: 8,
            // A process crash loses nothing; measured as fast as no-wal (README, Performance).
            durability: DurabilityMode::Wal,
            // Enough to keep filters and index blocks of a 16 GiB ledger hot.
            block_cache_bytes: ByteSize(256 * ByteSize::MIB),
            // About 2.8M ids per commit: measured in the ledger bench (README, Performance).
            write_buffer_bytes: ByteSize(64 * ByteSize::MIB),
        }
    }
}

/// Ledger checkpoints ("EBS snapshots").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SnapshotConfig {
    /// Where checkpoints are written (on the same filesystem as the ledger: they are hard links).
    pub dir: Option<PathBuf>,
    /// Seconds between scheduled checkpoints; 0 turns the schedule off.
    pub interval_secs: u64,
    /// How many checkpoints to keep.
    pub keep: usize,
    /// A command run after each checkpoint, with DEDUPE_SNAPSHOT_DIR and DEDUPE_SNAPSHOT_PARTITIONS set.
    /// It runs in a process group of its own with a clean environment: `PATH`, `HOME`, `LANG`,
    /// `TZ`, `TMPDIR` and the variables named in `hook_env`, never the worker's secrets.
    pub hook: Option<String>,
    /// Names of further environment variables the hook receives (e.g. a cloud CLI's profile).
    pub hook_env: Vec<String>,
    /// How long the hook may run before its whole process group is killed.
    pub hook_timeout_secs: u64,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        // Ten minutes: a volume snapshot API call, with retries, finishes well within it.
        Self { dir: None, interval_secs: 3600, keep: 3, hook: None, hook_env: Vec::new(), hook_timeout_secs: 600 }
    }
}

/// The HTTP tracking API.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// Listen address; loopback unless told otherwise.
    pub listen: SocketAddr,
    /// The topic every message is logged to (the worker's input topic).
    pub topic: String,
    /// File of `KEY SOURCE` lines; alternatively `DEDUPE_WRITE_KEYS=KEY=SOURCE,...`.
    pub write_keys_file: Option<PathBuf>,
    /// How long a request waits for Kafka's acknowledgement before it answers 503.
    pub ack_timeout_ms: u64,
    /// How long a client may take to send a request (head and body), on every request of a
    /// keep-alive connection. A request must also be answered within this plus `ack_timeout_ms`
    /// plus one second of its first byte, or its connection is closed.
    pub request_timeout_ms: u64,
    /// Most connections held at once, all worker threads together. Past it, new connections wait
    /// in the listen backlog. Needs as many file descriptors (plus 256), checked at start.
    pub max_connections: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            topic: "events.in".into(),
            write_keys_file: None,
            // Segment's clients time out at 10-15 s; answer before they give up.
            ack_timeout_ms: 10_000,
            request_timeout_ms: 5_000,
            // Well within the 1,024 files Debian and most container runtimes allow by default;
            // at a few ms per request this serves tens of thousands of requests per second.
            max_connections: 512,
        }
    }
}

/// The Prometheus endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Where /metrics, /healthz, /readyz and the worker's admin endpoints are served; loopback
    /// by default.
    pub addr: SocketAddr,
    /// The admin endpoints' bearer token: from `DEDUPE_ADMIN_TOKEN` only; never in a file. Without
    /// one, the admin endpoints answer only clients on loopback.
    #[serde(skip_deserializing)]
    pub admin_token: Option<Secret>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self { addr: SocketAddr::from(([127, 0, 0, 1], 9464)), admin_token: None }
    }
}

/// Log output.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// Logging.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `human` or `json`.
    pub format: LogFormat,
    /// A tracing filter, e.g. `info` or `info,dedupe=debug`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Human, level: "info".into() }
    }
}

/// Values given on the command line; each wins over the file and the environment.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub brokers: Option<String>,
    pub input_topic: Option<String>,
    pub output_topic: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub partitions: Option<String>,
    pub worker_index: Option<u32>,
    pub worker_count: Option<u32>,
    pub metrics_addr: Option<String>,
    pub log_format: Option<String>,
    pub listen: Option<String>,
    pub ingest_topic: Option<String>,
    pub write_keys_file: Option<PathBuf>,
}

/// Why a configuration was refused. Every message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
}

impl ConfigError {
    fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid { key: key.into(), message: message.into() }
    }
}

impl Config {
    /// Loads the file (if any), applies the environment, then the flags, then validates.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &Overrides,
    ) -> Result<Self, ConfigError> {
        let mut table = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
                text.parse::<toml::Table>().map_err(|e| ConfigError::Syntax {
                    path: path.to_path_buf(),
                    message: syntax_message(&text, &e),
                })?
            }
            None => toml::Table::new(),
        };
        let mut password = None;
        let mut admin_token = None;
        for (name, value) in env {
            if name == ENV_SASL_PASSWORD {
                password = Some(Secret::new(value));
                continue;
            }
            if name == ENV_ADMIN_TOKEN {
                admin_token = Some(Secret::new(value)).filter(|t| !t.expose().is_empty());
                continue;
            }
            apply_env(&mut table, &name, &value)?;
        }
        if table
            .get("metrics")
            .and_then(|k| k.as_table())
            .is_some_and(|k| k.contains_key("admin_token"))
        {
            return Err(ConfigError::invalid(
                "metrics.admin_token",
                format!("secrets may only come from the environment ({ENV_ADMIN_TOKEN})"),
            ));
        }
        if table
            .get("kafka")
            .and_then(|k| k.as_table())
            .is_some_and(|k| k.contains_key("sasl_password"))
        {
            return Err(ConfigError::invalid(
                "kafka.sasl_password",
                format!("secrets may only come from the environment ({ENV_SASL_PASSWORD})"),
            ));
        }
        let mut config: Config = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::invalid(if key == "." { "config".to_string() } else { key }, one_line(&e.inner().to_string()))
        })?;
        config.kafka.sasl_password = password;
        config.metrics.admin_token = admin_token;
        config.apply(overrides)?;
        config.validate()?;
        Ok(config)
    }

    fn apply(&mut self, o: &Overrides) -> Result<(), ConfigError> {
        if let Some(v) = &o.brokers {
            self.kafka.brokers = v.clone();
        }
        if let Some(v) = &o.input_topic {
            self.worker.input_topic = v.clone();
        }
        if let Some(v) = &o.output_topic {
            self.worker.output_topic = v.clone();
        }
        if let Some(v) = &o.data_dir {
            self.worker.data_dir = v.clone();
        }
        if let Some(v) = &o.partitions {
            self.worker.partitions =
                Some(PartitionSet::parse(v).map_err(|m| ConfigError::invalid("--partitions", m))?);
        }
        if let Some(v) = o.worker_index {
            self.worker.worker_index = Some(v);
        }
        if let Some(v) = o.worker_count {
            self.worker.worker_count = Some(v);
        }
        if let Some(v) = &o.metrics_addr {
            self.metrics.addr = v
                .parse()
                .map_err(|e| ConfigError::invalid("--metrics-addr", format!("`{v}` is not an address: {e}")))?;
        }
        if let Some(v) = &o.log_format {
            self.log.format = match v.as_str() {
                "human" => LogFormat::Human,
                "json" => LogFormat::Json,
                other => return Err(ConfigError::invalid("--log-format", format!("`{other}` is not human or json"))),
            };
        }
        if let Some(v) = &o.listen {
            self.ingest.listen =
                v.parse().map_err(|e| ConfigError::invalid("--listen", format!("`{v}` is not an address: {e}")))?;
        }
        if let Some(v) = &o.ingest_topic {
            self.ingest.topic = v.clone();
        }
        if let Some(v) = &o.write_keys_file {
            self.ingest.write_keys_file = Some(v.clone());
        }
        Ok(())
    }

    /// Checks the rules the types cannot carry.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn bad(key: &str, message: impl Into<String>) -> ConfigError {
            ConfigError::invalid(key, message)
        }
        if self.kafka.brokers.trim().is_empty() {
            return Err(bad("kafka.brokers", "must name at least one broker"));
        }
        let w = &self.worker;
        if w.input_topic.trim().is_empty() {
            return Err(bad("worker.input_topic", "must not be empty"));
        }
        if w.output_topic.trim().is_empty() {
            return Err(bad("worker.output_topic", "must not be empty"));
        }
        if w.input_topic == w.output_topic {
            return Err(bad("worker.output_topic", "must differ from worker.input_topic"));
        }
        if w.group_id.trim().is_empty() {
            return Err(bad("worker.group_id", "must not be empty"));
        }
        match (w.worker_index, w.worker_count) {
            (Some(_), None) => return Err(bad("worker.worker_count", "must be set with worker.worker_index")),
            (None, Some(_)) => return Err(bad("worker.worker_index", "must be set with worker.worker_count")),
            (Some(i), Some(n)) => {
                if n == 0 {
                    return Err(bad("worker.worker_count", "must be at least 1"));
                }
                if i >= n {
                    return Err(bad("worker.worker_index", &format!("{i} must be less than worker.worker_count ({n})")));
                }
                if w.partitions.is_some() {
                    return Err(bad("worker.partitions", "set either partitions or worker_index/worker_count, not both"));
                }
            }
            (None, None) => {}
        }
        if w.unkeyed_policy == UnkeyedPolicy::DeadLetter {
            match &w.dead_letter_topic {
                None => return Err(bad("worker.dead_letter_topic", "must be set when unkeyed_policy is dead-letter")),
                Some(t) if t == &w.output_topic || t == &w.input_topic => {
                    return Err(bad("worker.dead_letter_topic", "must differ from the input and output topics"))
                }
                Some(_) => {}
            }
        }
        if w.batch_max_records == 0 || w.batch_max_records > 100_000 {
            return Err(bad("worker.batch_max_records", "must be between 1 and 100000"));
        }
        if w.batch_max_bytes.0 < 64 * ByteSize::KIB {
            return Err(bad("worker.batch_max_bytes", "must be at least 64KiB"));
        }
        if w.batch_linger_ms > 60_000 {
            return Err(bad("worker.batch_linger_ms", "must be at most 60000"));
        }
        if w.transaction_timeout_ms < 1_000 || w.transaction_timeout_ms > 900_000 {
            return Err(bad("worker.transaction_timeout_ms", "must be between 1000 and 900000 (the broker's default max)"));
        }
        if w.shutdown_timeout_ms == 0 {
            return Err(bad("worker.shutdown_timeout_ms", "must be positive"));
        }
        let l = &self.ledger;
        if l.budget_bytes.0 < 64 * ByteSize::MIB {
            return Err(bad("ledger.budget_bytes", "must be at least 64MiB"));
        }
        if !(2..=64).contains(&l.generations) {
            return Err(bad("ledger.generations", "must be between 2 and 64"));
        }
        if l.write_buffer_bytes.0 < 4 * ByteSize::MIB {
            return Err(bad("ledger.write_buffer_bytes", "must be at least 4MiB"));
        }
        if l.write_buffer_bytes.0 > l.budget_bytes.0 / l.generations as u64 {
            return Err(bad("ledger.write_buffer_bytes", "must not exceed one generation (ledger.budget_bytes / ledger.generations)"));
        }
        if self.snapshots.keep == 0 {
            return Err(bad("snapshots.keep", "must be at least 1"));
        }
        if self.ingest.topic.trim().is_empty() {
            return Err(bad("ingest.topic", "must not be empty"));
        }
        if self.ingest.ack_timeout_ms == 0 {
            return Err(bad("ingest.ack_timeout_ms", "must be positive"));
        }
        if self.ingest.request_timeout_ms == 0 {
            return Err(bad("ingest.request_timeout_ms", "must be positive"));
        }
        if self.snapshots.hook_timeout_secs == 0 {
            return Err(bad("snapshots.hook_timeout_secs", "must be positive"));
        }
        if self.ingest.max_connections == 0 {
            return Err(bad("ingest.max_connections", "must be at least 1"));
        }
        if self.log.level.trim().is_empty() {
            return Err(bad("log.level", "must not be empty"));
        }
        Ok(())
    }

    /// The effective configuration as TOML, secrets redacted.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"))
    }
}

/// Applies one `DEDUPE_SECTION_KEY=value` variable. Variables outside the config's sections (such
/// as `DEDUPE_WRITE_KEYS`) are not configuration keys and are left alone; an unknown key inside a
/// known section is an error.
fn apply_env(table: &mut toml::Table, name: &str, value: &str) -> Result<(), ConfigError> {
    let Some(rest) = name.strip_prefix(ENV_PREFIX) else { return Ok(()) };
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
    // A value that parses as a TOML scalar (number, bool) is taken as that; anything else is a string.
    let parsed = format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .filter(|v| !v.is_table())
        .unwrap_or_else(|| toml::Value::String(value.to_string()));
    section_table.insert(key.to_string(), parsed);
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

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_str(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::load(Some(&path), env, &Overrides::default())
    }

    #[test]
    fn shipped_config_files_load() {
        for file in ["config/dedupe.toml", "config/local.toml"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
            Config::load(Some(&path), std::iter::empty(), &Overrides::default())
                .unwrap_or_else(|e| panic!("{file}: {e}"));
        }
    }

    #[test]
    fn documented_defaults_match_code_defaults() {
        // config/dedupe.toml spells out every default; it must not drift from the code.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/dedupe.toml");
        let from_file = Config::load(Some(&path), std::iter::empty(), &Overrides::default()).unwrap();
        assert_eq!(from_file, Config::default());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = load_str("[ledger]\nbudget_bytez = 5\n", &[]).unwrap_err().to_string();
        assert!(err.contains("budget_bytez"), "{err}");
        assert!(!err.contains('\n'));
    }

    #[test]
    fn bad_value_is_named() {
        let err = load_str("[ledger]\nbudget_bytes = \"12 parsecs\"\n", &[]).unwrap_err().to_string();
        assert!(err.starts_with("ledger.budget_bytes:"), "{err}");
        let err = load_str("[ledger]\nbudget_bytes = \"1MiB\"\n", &[]).unwrap_err().to_string();
        assert_eq!(err, "ledger.budget_bytes: must be at least 64MiB");
    }

    #[test]
    fn env_overrides_file_and_flags_override_env() {
        let c = load_str(
            "[worker]\ninput_topic = \"a\"\n",
            &[("DEDUPE_WORKER_INPUT_TOPIC", "b"), ("DEDUPE_LEDGER_GENERATIONS", "4")],
        )
        .unwrap();
        assert_eq!(c.worker.input_topic, "b");
        assert_eq!(c.ledger.generations, 4);
        let o = Overrides { input_topic: Some("c".into()), ..Default::default() };
        let c = Config::load(None, [("DEDUPE_WORKER_INPUT_TOPIC".to_string(), "b".to_string())], &o).unwrap();
        assert_eq!(c.worker.input_topic, "c");
    }

    #[test]
    fn unknown_env_key_in_a_section_is_an_error_but_other_vars_are_ignored() {
        let err = load_str("", &[("DEDUPE_WORKER_INPUT_TOPICS", "x")]).unwrap_err().to_string();
        assert!(err.contains("input_topics"), "{err}");
        load_str("", &[("DEDUPE_WRITE_KEYS", "k=s"), ("DEDUPE_CACHE", "/tmp")]).unwrap();
    }

    #[test]
    fn password_only_from_env_and_redacted() {
        let err = load_str("[kafka]\nsasl_password = \"hunter2\"\n", &[]).unwrap_err().to_string();
        assert!(err.starts_with("kafka.sasl_password"), "{err}");
        assert!(!err.contains("hunter2"));
        let c = load_str("", &[(ENV_SASL_PASSWORD, "hunter2")]).unwrap();
        assert_eq!(c.kafka.sasl_password.as_ref().unwrap().expose(), "hunter2");
        assert!(!c.to_toml().contains("hunter2"));
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn secret_kafka_properties_never_print() {
        let text = "[kafka.properties]\n\"sasl.password\" = \"hunter2\"\n\"ssl.key.password\" = \"k3y-pass\"\n\"sasl.oauthbearer.client.secret\" = \"oauth-s3cret\"\n\"ssl.ca.location\" = \"/etc/ca.pem\"\n";
        let c = load_str(text, &[]).unwrap();
        let shown = c.to_toml();
        for secret in ["hunter2", "k3y-pass", "oauth-s3cret"] {
            assert!(!shown.contains(secret), "{secret} printed:\n{shown}");
            assert!(!format!("{c:?}").contains(secret));
        }
        // Not secrets: shown as given, and the secrets still reach librdkafka.
        assert!(shown.contains("/etc/ca.pem"), "{shown}");
        assert_eq!(c.kafka.properties["sasl.password"], "hunter2");
        assert!(is_secret_property("ssl.keystore.password") && is_secret_property("ssl.key.pem"));
        assert!(!is_secret_property("ssl.ca.location") && !is_secret_property("bootstrap.servers"));
    }

    #[test]
    fn a_syntax_error_names_the_place_but_never_quotes_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "[kafka.properties]\n\"sasl.password\" = \"hunter2\n").unwrap();
        let err = Config::load(Some(&path), Vec::new(), &Overrides::default()).unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("bad.toml"), "{err}");
    }

    #[test]
    fn partitions_parse_and_print() {
        let p = PartitionSet::parse("7, 0-3,2").unwrap();
        assert_eq!(p.0, vec![0, 1, 2, 3, 7]);
        assert_eq!(p.to_string(), "0-3,7");
        assert!(PartitionSet::parse("3-1").is_err());
        assert!(PartitionSet::parse("x").is_err());
        assert!(PartitionSet::parse("").is_err());
    }

    #[test]
    fn worker_index_rules() {
        let err = load_str("[worker]\nworker_index = 3\nworker_count = 3\n", &[]).unwrap_err().to_string();
        assert!(err.starts_with("worker.worker_index:"), "{err}");
        let err = load_str("[worker]\nworker_index = 0\n", &[]).unwrap_err().to_string();
        assert!(err.starts_with("worker.worker_count:"), "{err}");
    }

    #[test]
    fn dead_letter_needs_a_topic() {
        let err = load_str("[worker]\nunkeyed_policy = \"dead-letter\"\n", &[]).unwrap_err().to_string();
        assert!(err.starts_with("worker.dead_letter_topic:"), "{err}");
        let c = load_str("[worker]\nunkeyed_policy = \"dead-letter\"\ndead_letter_topic = \"dlq\"\n", &[]).unwrap();
        assert_eq!(c.worker.unkeyed_policy, UnkeyedPolicy::DeadLetter);
    }

    #[test]
    fn id_source_forms() {
        let c = load_str("[worker]\nid_source = \"json:/messageId\"\n", &[]).unwrap();
        assert_eq!(c.worker.id_source, IdSource::JsonPointer("/messageId".into()));
        let err = load_str("[worker]\nid_source = \"body\"\n", &[]).unwrap_err().to_string();
        assert!(err.starts_with("worker.id_source:"), "{err}");
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(ByteSize::parse("64MiB").unwrap().0, 64 << 20);
        assert_eq!(ByteSize::parse("1_000").unwrap().0, 1000);
        assert_eq!(ByteSize(16 << 30).to_string(), "16GiB");
        assert!(ByteSize::parse("5 parsecs").is_err());
    }
}

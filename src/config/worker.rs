//! The `[worker]` section (`dedupe run`): topics, which partitions a worker owns, where a message
//! id is read, and how records are batched.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ByteSize;
// Defined where the domain decides with them (config depends on the domain, never the reverse);
// named here too because this section sets them.
pub use crate::batch::{ReusedIdPolicy, SourceMode, UnkeyedPolicy};
pub use crate::identity::{DigestSource, IdSource};
pub use crate::kafka::InputPartitioner;

/// The dedupe worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// The input topic, partitioned by message id.
    pub input_topic: String,
    /// The output topic: the source of truth, needs at least as many partitions as the input.
    pub output_topic: String,
    /// The consumer group whose committed offsets the transactions carry (and, with
    /// `assignment = "group"`, whose coordinator decides which worker owns which partition). It
    /// belongs to one pipeline: a worker refuses to start when the group commits offsets for
    /// another output topic. Unset: `dedupe.<output_topic>`.
    pub group_id: Option<String>,
    /// Who decides which input partitions this worker owns: `static` (this configuration:
    /// `partitions`, or `worker_index`/`worker_count`, or every partition) or `group` (Kafka's
    /// group coordinator, KIP-848; partitions move between workers as workers come and go).
    pub assignment: Assignment,
    /// With `assignment = "group"`, when set: this worker's `group.instance.id` (static
    /// membership), so a worker that restarts within the session timeout gets its partitions back
    /// without a move, and a stopped one keeps them, unserved, until the session timeout passes.
    /// Unset (the default): a dynamic member, which leaves the group as it stops, so its
    /// partitions move to the other workers at once.
    pub member_id: Option<String>,
    /// The id changelog: every output transaction also writes its new ids here, partition for
    /// partition, and a worker assigned a partition loads the partition's ids from it. Unset:
    /// `<output_topic>.ids`. Created when missing.
    pub changelog_topic: Option<String>,
    /// `retention.ms` (in seconds) the worker gives the changelog topic when it creates it. It
    /// bounds the longest window that can move with a partition.
    pub changelog_retention_secs: u64,
    /// The dedupe window the operators promise (the alerts page below it). The changelog must
    /// keep ids at least this long, or a moved partition could not get its window back.
    pub promised_window_secs: u64,
    /// A partition this worker's ledger holds nothing for (moved here, new volume) resumes once
    /// every id published in this many seconds is loaded from the changelog; older ids load in the
    /// background after it. Unset: `promised_window_secs`, so the whole promised window moves with
    /// the partition before it publishes anything.
    pub handover_min_window_secs: Option<u64>,
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
    /// How the input's producers choose a keyed record's partition, so that `dedupe explain`
    /// can name the partition of an id read from the key: `murmur2_random` (the Java client's and
    /// the front door's) or `consistent_random` (librdkafka's default: CRC32).
    pub input_partitioner: InputPartitioner,
    /// What to do with a record whose id is missing, empty, over 1 KiB or unreadable.
    pub unkeyed_policy: UnkeyedPolicy,
    /// Where `dead-letter` sends such records (and reused ids, with `on_reused_id = "dead-letter"`).
    pub dead_letter_topic: Option<String>,
    /// Where a record's content digest is read, which tells a retry from a reused id:
    /// `header-or-value` (the front door's `dedupe-content-digest` header, else a hash of the
    /// record's value), `header` (only the header: for producers whose retries change the value),
    /// or `none` (no digests kept: every duplicate's verdict is `unknown`).
    pub content_digest: DigestSource,
    /// What happens to a record whose id the ledger holds for other content (verdict
    /// `reused_id`): `drop` (as a retry is), `publish` (it goes out; its id stays recorded for its
    /// first copy) or `dead-letter` (to `dead_letter_topic`, in the same transaction).
    pub on_reused_id: ReusedIdPolicy,
    /// The duplicate audit: one record per dropped duplicate, written in the same transaction as
    /// its batch's output (see docs/operations.md, "The duplicate audit"). Unset:
    /// `<output_topic>.duplicates`; `""` turns the audit off. Created when missing.
    pub audit_topic: Option<String>,
    /// `retention.ms` (in seconds) the worker gives the audit topic when it creates it.
    pub audit_retention_secs: u64,
    /// Include the dropped copy's value (base64) in its audit record. Off: values may hold
    /// personal data.
    pub audit_payloads: bool,
    /// The share of ids whose drops are audited, 0.0 to 1.0, chosen by id (every drop of an id
    /// sampled in is audited).
    pub audit_sample: f64,
    /// Most audit records per second per partition; drops past it are counted, not audited, so a
    /// retry storm cannot double the output's write load.
    pub audit_max_per_sec: u32,
    /// The sources counted apart in `dedupe_source_records_total` (the front door's write keys'
    /// sources: its `dedupe-source` header). Empty: the sources `source_modes` names, as the
    /// worker starts (the worker never reads the front door's write keys). Any other source counts
    /// as `other`, a record without the header as `none`, so the series stay few.
    pub sources: Vec<String>,
    /// What a source's copies of ids already seen get, by the source's name (the records'
    /// `dedupe-source` header, which the front door writes): `drop` (every source not named),
    /// `flag` (published with a `dedupe-duplicate` header holding the verdict) or `off` (published
    /// as they are, counted). A table (`{ web = "flag" }`) or `web=flag,import=off`. Taken again on
    /// SIGHUP, without a restart.
    pub source_modes: SourceModes,
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
            // The topic names the local setup and the examples use.
            input_topic: "events.in".into(),
            output_topic: "events.out".into(),
            // One group per pipeline: two pipelines on one input never share restart points.
            group_id: None,
            // A fixed owner restarts at once after a crash; under the group protocol a killed
            // member's partitions wait for the broker's session timeout (45 s by default). See the
            // Scaling section of docs/operations.md.
            assignment: Assignment::Static,
            member_id: None,
            changelog_topic: None,
            // A week: room for an outage over a weekend on top of the promised day.
            changelog_retention_secs: 7 * 86_400,
            // The alerts page when the window falls under 24 hours.
            promised_window_secs: 86_400,
            // The promised window: a bulk load takes 0.13-0.17 s per million ids
            // (docs/performance.md, the handoff bench).
            handover_min_window_secs: None,
            // One worker owning every partition, unless told otherwise.
            partitions: None,
            worker_index: None,
            worker_count: None,
            // The volume the container image declares.
            data_dir: PathBuf::from("/var/lib/dedupe/ledger"),
            // The input topic is keyed by message id.
            id_source: IdSource::Key,
            // The Java client's, which the front door's producer uses too.
            input_partitioner: InputPartitioner::Murmur2Random,
            // Never lose data: a record without a usable id goes on unchecked.
            unkeyed_policy: UnkeyedPolicy::Forward,
            dead_letter_topic: None,
            // The front door's digest for its records, the value's for other producers' records.
            content_digest: DigestSource::HeaderOrValue,
            // As Segment does: the id decides. Counted, audited, and alerted on.
            on_reused_id: ReusedIdPolicy::Drop,
            audit_topic: None,
            // As long as the changelog: the drops of the window and a weekend's outage.
            audit_retention_secs: 7 * 86_400,
            audit_payloads: false,
            audit_sample: 1.0,
            // About 0.6% of events are duplicates: 1,000 a second per partition is the audit of
            // 160k events a second on that partition.
            audit_max_per_sec: 1000,
            sources: Vec::new(),
            // Every source's duplicates dropped.
            source_modes: SourceModes::default(),
            // The ledger bench's batch size (src/bench/ledger/), at which the ledger figures of
            // docs/performance.md were measured.
            batch_max_records: 4096,
            // librdkafka's default message.max.bytes is 1 MB; a few of those per transaction.
            batch_max_bytes: ByteSize(4 * ByteSize::MIB),
            // Enough to fill a 4096-record batch at ~200k msgs/s, short enough to keep p99 low.
            batch_linger_ms: 20,
            // librdkafka's default transaction.timeout.ms.
            transaction_timeout_ms: 60_000,
            // Kubernetes' default terminationGracePeriodSeconds is 30 s; leave it some slack.
            shutdown_timeout_ms: 25_000,
        }
    }
}

impl WorkerConfig {
    /// How much of a new partition's window is loaded before it resumes (see
    /// `handover_min_window_secs`).
    pub fn handover_window(&self) -> std::time::Duration {
        std::time::Duration::from_secs(
            self.handover_min_window_secs
                .unwrap_or(self.promised_window_secs),
        )
    }

    /// The consumer group: `group_id`, or `dedupe.<output_topic>`.
    pub fn group_id(&self) -> String {
        self.group_id
            .clone()
            .unwrap_or_else(|| format!("dedupe.{}", self.output_topic))
    }

    /// The id changelog topic: `changelog_topic`, or `<output_topic>.ids`.
    pub fn changelog_topic(&self) -> String {
        self.changelog_topic
            .clone()
            .unwrap_or_else(|| crate::changelog::default_topic(&self.output_topic))
    }

    /// The duplicate audit topic: `audit_topic`, or `<output_topic>.duplicates`; `None` when the
    /// audit is off (`audit_topic = ""`).
    pub fn audit_topic(&self) -> Option<String> {
        match &self.audit_topic {
            Some(t) if t.is_empty() => None,
            Some(t) => Some(t.clone()),
            None => Some(crate::audit::default_topic(&self.output_topic)),
        }
    }

    /// The static member id (`group.instance.id`): `member_id` when set; `None` for a dynamic
    /// member.
    pub fn static_member_id(&self) -> Option<&str> {
        self.member_id.as_deref()
    }

    /// The name this worker goes by in the group's logs and as `rekey`'s transactional id:
    /// `member_id`, or the host name.
    pub fn member_id(&self) -> Option<String> {
        self.member_id.clone().or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
        })
    }
}

/// Who decides which input partitions a worker owns.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Assignment {
    /// This worker's configuration: fixed partitions.
    Static,
    /// Kafka's consumer group coordinator (KIP-848): partitions move as workers come and go.
    Group,
}

impl std::str::FromStr for Assignment {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "static" => Ok(Self::Static),
            "group" => Ok(Self::Group),
            other => Err(format!("`{other}` is not one of static, group")),
        }
    }
}

/// `worker.source_modes`: source name -> mode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceModes(pub std::collections::BTreeMap<String, SourceMode>);

impl SourceModes {
    /// Parses `web=flag, import=off`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut modes = std::collections::BTreeMap::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((source, mode)) = item.split_once('=') else {
                return Err(format!("`{item}` is not SOURCE=MODE (e.g. web=flag)"));
            };
            let mode = SourceMode::parse(mode.trim())?;
            let source = source.trim();
            if source.is_empty() {
                return Err(format!("`{item}` names no source"));
            }
            modes.insert(source.to_string(), mode);
        }
        Ok(SourceModes(modes))
    }

    /// The mode of a record whose source header is `source` (`drop` without one).
    pub fn of(&self, source: Option<&[u8]>) -> SourceMode {
        source
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| self.0.get(s).copied())
            .unwrap_or_default()
    }
}

impl Serialize for SourceModes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for SourceModes {
    /// A table (`web = "flag"`) or its text form (`web=flag, import=off`); a mode that is not one
    /// of the three is refused naming its source and the modes there are.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Modes;
        impl<'de> serde::de::Visitor<'de> for Modes {
            type Value = SourceModes;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a table of source = mode (drop, flag or off), or `web=flag, import=off`",
                )
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<SourceModes, E> {
                SourceModes::parse(text).map_err(E::custom)
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<SourceModes, A::Error> {
                let mut modes = std::collections::BTreeMap::new();
                while let Some(source) = map.next_key::<String>()? {
                    let mode: String = map.next_value()?;
                    let mode = SourceMode::parse(&mode)
                        .map_err(|e| serde::de::Error::custom(format!("source `{source}`: {e}")))?;
                    modes.insert(source, mode);
                }
                Ok(SourceModes(modes))
            }
        }
        d.deserialize_any(Modes)
    }
}

/// A set of input partitions, written `0-3,7`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartitionSet(
    /// The partitions; [`PartitionSet::parse`] sorts them and removes repeats.
    pub Vec<i32>,
);

impl PartitionSet {
    /// Parses a comma-separated list of partitions and inclusive ranges (`7, 0-3`); it must name
    /// at least one partition.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo.trim(), hi.trim()),
                None => (part, part),
            };
            let lo: i32 = lo
                .parse()
                .map_err(|_| format!("`{part}` is not a partition or range like 0-3"))?;
            let hi: i32 = hi
                .parse()
                .map_err(|_| format!("`{part}` is not a partition or range like 0-3"))?;
            if lo < 0 || hi < lo {
                return Err(format!(
                    "`{part}` is not a valid range (need 0 <= low <= high)"
                ));
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

/// Prints runs of consecutive partitions as ranges: `0-3,7`.
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

/// A list as text (`"0-3,7"`), or one partition as a number (`3`, as `DEDUPE_WORKER_PARTITIONS=3`
/// reads).
impl<'de> Deserialize<'de> for PartitionSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Text(String),
            One(i64),
        }
        let text = match Given::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "must be a list of partitions like \"0-3,7\", or one partition",
            )
        })? {
            Given::Text(text) => text,
            Given::One(n) => n.to_string(),
        };
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

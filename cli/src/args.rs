//! The command line: every subcommand of `dedupe` and the flags that override the configuration.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use dedupe::config::Overrides;
#[cfg(feature = "tools")]
use dedupe::ledger::Durability;

#[derive(Debug, Parser)]
#[command(
    name = "dedupe",
    version = crate::release::VERSION,
    long_version = crate::release::long_version(),
    about = "Removes duplicate messages from a Kafka topic: exactly-once events from at-least-once clients."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Inspect the configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Run the dedupe worker: read the input topic, publish each message id once to the output.
    Run(RunArgs),
    /// Read the input and output topics fully (read_committed) and check that every input id is
    /// in the output exactly once. Prints a JSON summary; exits 1 on any duplicate or missing id.
    Verify(VerifyArgs),
    /// Serve the Segment-compatible HTTP tracking API and log every message to the input topic.
    Ingest(IngestArgs),
    /// Copy a topic keyed any way into the input topic keyed by each record's message id (read as
    /// worker.id_source says), each batch and its source offsets in one transaction. A new
    /// instance fences an older one with the same settings (exit 3) before it reads the offsets.
    /// A record larger than the input accepts goes to worker.dead_letter_topic, or, without one,
    /// stops the stage after the records before it (exit 2).
    Rekey(RekeyArgs),
    #[cfg(feature = "tools")]
    /// Produce keyed UUIDv4 messages, a share of them re-sent as retrying clients do, and
    /// optionally a share reusing an id for other content.
    Loadgen(LoadgenArgs),
    /// Explain one message id: whether it is in the window (a copy arriving now is dropped), when
    /// it was first seen and where it is held, how far back the window reaches, and why an id is
    /// not held. Asks the running worker at metrics.addr (GET /admin/ids/ID); reads a stopped
    /// worker's ledger when nothing answers there. Prints one JSON line, then one sentence.
    Explain(ExplainArgs),
    /// Forget message ids: each one's next copy is published (and held again). Asks the running
    /// worker at metrics.addr (POST /admin/forget), which forgets each id on every partition it
    /// may be on (the two common partitioners') and writes each forget to the id changelog and to
    /// the audit topic with who asked and when. Prints one JSON line per request. Exits 0 when
    /// every id was forgotten on every partition it may be on; 1 when some were not while others
    /// were (a partition this worker does not own, or one being taken over: ask again, or ask the
    /// worker that owns it); 2 when none was forgotten anywhere, or nothing could be asked.
    Forget(ForgetArgs),
    /// Inspect, snapshot and restore the ledger.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// What a promised window costs at an id rate (given, or measured on a topic): the ledger's
    /// budget, memory and disk, the id changelog's disk, the workers and partitions it takes and a
    /// partition's handover time, from the figures measured in docs/performance.md. Given a
    /// configuration file, says whether its budget holds the promise at that rate.
    Plan(crate::plan::PlanArgs),
    #[cfg(feature = "tools")]
    /// Benchmarks that print their figures (the last line is JSON).
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Print the ledger's stats and every partition's progress as JSON (the worker must be stopped;
    /// a running worker exports the same on /metrics).
    Stats(ConfigArgs),
    /// Take a snapshot now: asks the running worker at metrics.addr, or checkpoints a stopped
    /// worker's ledger directly into snapshots.dir.
    Snapshot(ConfigArgs),
    /// Restore a snapshot into the ledger directory (the worker must be stopped). The next start
    /// replays the output topic from the snapshot's progress records.
    Restore(RestoreArgs),
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The message id: as the client sent it, with `--source` for an event the front door
    /// took; or as the worker reads it (the record's key, e.g. `web:<messageId>`; a JSON
    /// string's text). Where the id source reads JSON (`json:/id`), a number is refused here: name
    /// it with --json-id.
    #[arg(required_unless_present = "json_id")]
    pub id: Option<String>,
    /// The id as the text of one JSON value, as a `json:` id source reads it from a record: a
    /// number (`--json-id 12345678901234567890`) or a string (`--json-id '"abc"'`), two ids.
    #[arg(long, value_name = "JSON", conflicts_with_all = ["id", "source"])]
    pub json_id: Option<String>,
    /// The front door's source that sent the id (the name its write key maps to): the front door
    /// scopes ids by source and the worker holds `<source>:<id>`.
    #[arg(long, value_name = "NAME")]
    pub source: Option<String>,
    /// When the id was first sent (RFC 3339, or ms since the epoch): tells an id that aged out of
    /// the window from one never seen.
    #[arg(long, value_name = "TIME")]
    pub sent_at: Option<String>,
}

impl ExplainArgs {
    /// The id asked about, and whether it is one JSON value's text (`--json-id`).
    pub fn id(&self) -> (&str, bool) {
        match (&self.json_id, &self.id) {
            (Some(json), _) => (json, true),
            (None, Some(id)) => (id, false),
            // clap requires one of the two.
            (None, None) => ("", false),
        }
    }

    /// `--sent-at` in ms since the epoch.
    pub fn sent_at_ms(&self) -> Result<Option<i64>, String> {
        let Some(text) = self.sent_at.as_deref() else {
            return Ok(None);
        };
        if let Ok(ms) = text.parse::<i64>() {
            return Ok(Some(ms));
        }
        let t = humantime::parse_rfc3339_weak(text).map_err(|e| {
            format!("--sent-at: `{text}` is neither ms since the epoch nor an RFC 3339 time: {e}")
        })?;
        let ms = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| format!("--sent-at: `{text}` is before 1970"))?
            .as_millis();
        Ok(Some(ms as i64))
    }
}

#[derive(Debug, Args)]
pub struct ForgetArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The message ids, as `dedupe explain` takes them.
    pub ids: Vec<String>,
    /// An id as the text of one JSON value, as `dedupe explain --json-id` takes it (a number
    /// `12345678901234567890`, a string `'"abc"'`); may be given more than once.
    #[arg(long = "json-id", value_name = "JSON", conflicts_with = "source")]
    pub json_ids: Vec<String>,
    /// Read more ids from this file, one per line (`-`: standard input); blank lines and lines
    /// starting with `#` are skipped.
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Who asks: written to the audit topic with each forget (default: the user running the
    /// command, `USER@HOST`).
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
    /// Why (a ticket, a deletion request): written to the audit topic with each forget.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// The front door's source that sent the ids (the worker holds `<source>:<id>`).
    #[arg(long, value_name = "NAME")]
    pub source: Option<String>,
    /// The ids' input partition, when the worker reads ids from a header or the value (their
    /// partition cannot be derived from the id then).
    #[arg(long, value_name = "N")]
    pub partition: Option<i32>,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The snapshot (checkpoint) directory to restore.
    #[arg(long, value_name = "DIR")]
    pub from: PathBuf,
    /// Move an existing ledger aside (never deleted) instead of refusing.
    #[arg(long)]
    pub force: bool,
}

#[cfg(feature = "tools")]
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Insert random UUIDv4 ids into the ledger, some re-sent, and compare in the same run with
    /// Segment's design (key per id + sequence index, default tuning) and an in-memory HashSet.
    Ledger(LedgerBenchArgs),
    /// The worker against a pass-through copy (same consumer, producer and transactions, no
    /// ledger) on the real broker, in one run: throughput on a backlog, then latency.
    Pipeline(PipelineBenchArgs),
    /// A partition moving between two workers (consumer group): how long until the new owner
    /// publishes, and until its window is back.
    Handoff(HandoffBenchArgs),
    /// What a ledger costs at given numbers of ids with the configured options (the service's
    /// defaults): first open, memory, close, files on disk, reopen.
    Open(OpenBenchArgs),
    /// Reads the output topic read_committed, from its end, for a while: each record's wait from
    /// the front door's receive time (its timestamp) to being readable, p50 and p99.
    Latency(LatencyBenchArgs),
}

#[cfg(feature = "tools")]
#[derive(Debug, Args)]
pub struct LatencyBenchArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// How long to read.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
}

#[cfg(feature = "tools")]
#[derive(Debug, Args)]
pub struct OpenBenchArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The numbers of ids, one ledger each, in this order (the first one's memory is the
    /// process's alone).
    #[arg(long, value_delimiter = ',', default_value = "0,10000000")]
    pub ids: Vec<u64>,
    /// Where the ledgers go (default: a temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print only the final JSON line on stdout.
    #[arg(long)]
    pub json: bool,
}

#[cfg(feature = "tools")]
#[derive(Debug, Args)]
pub struct HandoffBenchArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Ids the first worker builds the partition with.
    #[arg(long, default_value_t = 1_000_000)]
    pub ids: u64,
    /// The ids' first-seen times are spread over this many seconds, ending now (by default the
    /// promised window, 24 hours).
    #[arg(long, default_value_t = 86_400)]
    pub span_secs: u64,
    /// Bytes of each record's value. The move reads only the id changelog, whatever the values;
    /// smaller values let a large run fit the broker's disk (200M ids at 64 bytes need about
    /// 55 GB of topics and ledgers, at 8 bytes about 35 GB).
    #[arg(long, default_value_t = 64)]
    pub value_bytes: usize,
    /// Where the bench's ledgers go (default: a temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Stop the first worker with SIGKILL, not SIGTERM: the group moves its partition once the
    /// session timeout passes.
    #[arg(long)]
    pub kill: bool,
    /// Run both workers as static group members (--member-id), not dynamic ones (the default).
    #[arg(long)]
    pub static_members: bool,
    /// Print only the final JSON line on stdout (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,
}

#[cfg(feature = "tools")]
#[derive(Debug, Args)]
pub struct PipelineBenchArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Messages in the backlog.
    #[arg(long, default_value_t = 2_000_000)]
    pub messages: u64,
    /// The share of messages that re-send an earlier id.
    #[arg(long, default_value_t = 0.01)]
    pub dup_ratio: f64,
    /// Approximate value size.
    #[arg(long, default_value_t = 300)]
    pub value_bytes: usize,
    /// Where the bench's ledgers go (default: a temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print only the final JSON line on stdout (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Start even if the ledger is ahead of the output topic (trust the ledger; see README).
    #[arg(long)]
    pub accept_ledger_ahead: bool,
    #[cfg(feature = "tools")]
    /// Bench baseline only: copy every record with the same consumer, producer and transaction
    /// settings, without the ledger (no deduplication).
    #[arg(long, hide = true)]
    pub passthrough: bool,
}

#[derive(Debug, Args)]
pub struct RekeyArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The topic to copy from (keyed any way); the input topic (--input-topic) is written.
    #[arg(long, env = "DEDUPE_REKEY_SOURCE_TOPIC", value_name = "TOPIC")]
    pub source_topic: String,
    /// The consumer group that holds the copy's offsets; default `dedupe-rekey.<input topic>`.
    #[arg(long, env = "DEDUPE_REKEY_GROUP_ID", value_name = "GROUP")]
    pub group_id: Option<String>,
    /// Records per transaction, at most. A transaction's offsets and commit are round trips to
    /// the coordinators whatever its size, so larger batches copy faster (docs/performance.md,
    /// "Re-keying a topic").
    #[arg(long, env = "DEDUPE_REKEY_BATCH_MAX_RECORDS", default_value_t = 16384)]
    pub batch_max_records: usize,
    /// How long a batch waits for more records after its first, in milliseconds.
    #[arg(long, env = "DEDUPE_REKEY_BATCH_LINGER_MS", default_value_t = 20)]
    pub batch_linger_ms: u64,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Give up if either topic cannot be read to its end within this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
}

#[cfg(feature = "tools")]
#[derive(Debug, Args)]
pub struct LoadgenArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The topic to produce to.
    #[arg(long)]
    pub topic: String,
    /// How many records to produce.
    #[arg(long)]
    pub count: u64,
    /// The share of records that re-send an earlier record as it was (the same key and value),
    /// as a client retrying a lost answer does: the worker drops them as `retry`.
    #[arg(long, default_value_t = 0.01)]
    pub dup_ratio: f64,
    /// The share of records that reuse an earlier id for another value (a client bug): the worker
    /// calls them `reused_id`.
    #[arg(long, default_value_t = 0.0)]
    pub reused_ratio: f64,
    /// Re-send ids at least this old (when there are any).
    #[arg(long, default_value_t = 0)]
    pub dup_delay_ms: u64,
    /// Approximate size of each record's value.
    #[arg(long, default_value_t = 300)]
    pub value_bytes: usize,
    /// Produce at most this many records per second (default: as fast as the broker takes them).
    #[arg(long)]
    pub rate: Option<f64>,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration (file, then environment, then flags; secrets redacted),
    /// or the error that stops it.
    Check(ConfigArgs),
}

/// Where the configuration comes from, and the flags that override it.
#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// The TOML configuration file (see config/dedupe.toml).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Kafka bootstrap servers.
    #[arg(long, value_name = "HOST:PORT,...")]
    pub brokers: Option<String>,
    /// The input topic.
    #[arg(long)]
    pub input_topic: Option<String>,
    /// The output topic.
    #[arg(long)]
    pub output_topic: Option<String>,
    /// The ledger's directory.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The input partitions this worker owns, e.g. 0-3,7.
    #[arg(long, value_name = "LIST")]
    pub partitions: Option<String>,
    /// This worker's ordinal among --worker-count workers.
    #[arg(long, value_name = "I")]
    pub worker_index: Option<u32>,
    /// How many workers share the input topic.
    #[arg(long, value_name = "N")]
    pub worker_count: Option<u32>,
    /// Who assigns partitions: static (this configuration) or group (Kafka's group coordinator).
    #[arg(long, value_name = "static|group")]
    pub assignment: Option<String>,
    /// This worker's static group member id (group.instance.id): a restart within the session
    /// timeout keeps its partitions, a stop holds them until it passes. Default: none, a dynamic
    /// member whose partitions move at once when it stops.
    #[arg(long, value_name = "ID")]
    pub member_id: Option<String>,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// human or json.
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
}

impl ConfigArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            brokers: self.brokers.clone(),
            input_topic: self.input_topic.clone(),
            output_topic: self.output_topic.clone(),
            data_dir: self.data_dir.clone(),
            partitions: self.partitions.clone(),
            worker_index: self.worker_index,
            worker_count: self.worker_count,
            assignment: self.assignment.clone(),
            member_id: self.member_id.clone(),
            metrics_addr: self.metrics_addr.clone(),
            log_format: self.log_format.clone(),
            ..Overrides::default()
        }
    }

    /// Loads and validates the configuration from the file, the process environment and the flags.
    pub fn load(&self) -> Result<dedupe::config::Config, dedupe::config::ConfigError> {
        dedupe::config::Config::load(self.config.as_deref(), std::env::vars(), &self.overrides())
    }
}

/// Flags of `dedupe ingest`; each wins over the file and the environment.
#[derive(Debug, Clone, Args)]
pub struct IngestArgs {
    /// The TOML configuration file (see config/dedupe.toml).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where the HTTP API listens (ingest.listen).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Kafka bootstrap servers.
    #[arg(long, value_name = "HOST:PORT,...")]
    pub brokers: Option<String>,
    /// The topic every message is logged to (ingest.topic).
    #[arg(long)]
    pub topic: Option<String>,
    /// File of `KEY SOURCE` lines (ingest.write_keys_file); or set DEDUPE_WRITE_KEYS=KEY=SOURCE,...
    #[arg(long, value_name = "FILE")]
    pub write_keys_file: Option<PathBuf>,
    /// Where /metrics is served (metrics.addr).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// human or json.
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
}

impl IngestArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            brokers: self.brokers.clone(),
            listen: self.listen.clone(),
            ingest_topic: self.topic.clone(),
            write_keys_file: self.write_keys_file.clone(),
            metrics_addr: self.metrics_addr.clone(),
            log_format: self.log_format.clone(),
            ..Overrides::default()
        }
    }

    /// Loads and validates the configuration from the file, the process environment and the flags.
    pub fn load(&self) -> Result<dedupe::config::Config, dedupe::config::ConfigError> {
        dedupe::config::Config::load(self.config.as_deref(), std::env::vars(), &self.overrides())
    }
}

#[cfg(feature = "tools")]
#[derive(Debug, Args)]
pub struct LedgerBenchArgs {
    /// Ids to insert.
    #[arg(long)]
    pub keys: u64,
    /// Share of ids re-sent from recent batches (client retries).
    #[arg(long, default_value_t = 0.01)]
    pub dup_ratio: f64,
    /// Disk budget in bytes (default: never age).
    #[arg(long)]
    pub budget: Option<u64>,
    /// Ids per batch.
    #[arg(long, default_value_t = 4096)]
    pub batch: usize,
    /// Print only the JSON report (it is always the last stdout line).
    #[arg(long)]
    pub json: bool,
    /// Parent directory for the stores (default: the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Run the baselines on only the first M ids.
    #[arg(long)]
    pub baseline_keys: Option<u64>,
    /// Skip the baselines.
    #[arg(long)]
    pub no_baselines: bool,
    /// Ledger durability: sync-wal, wal or no-wal.
    #[arg(long)]
    pub durability: Option<Durability>,
    /// Ledger generations (G).
    #[arg(long)]
    pub generations: Option<u32>,
    /// Ledger write buffer (one memtable), MiB.
    #[arg(long)]
    pub write_buffer_mib: Option<usize>,
    /// Ledger data-block restart interval.
    #[arg(long)]
    pub restart_interval: Option<i32>,
    /// Record each id with a content digest, as the worker does by default.
    #[arg(long)]
    pub digests: bool,
    /// Refresh ids on their re-sent copies (ledger.refresh_on_duplicate).
    #[arg(long)]
    pub refresh: bool,
}

#[cfg(feature = "tools")]
impl LedgerBenchArgs {
    /// The bench configuration these flags ask for.
    pub fn bench_config(&self) -> dedupe::bench::ledger::LedgerBenchConfig {
        let defaults = dedupe::bench::ledger::LedgerBenchConfig::default();
        let mut ledger = defaults.ledger.clone();
        if let Some(mib) = self.write_buffer_mib {
            ledger.write_buffer_bytes = mib << 20;
        }
        if let Some(r) = self.restart_interval {
            ledger.block_restart_interval = r;
        }
        dedupe::bench::ledger::LedgerBenchConfig {
            keys: self.keys,
            dup_ratio: self.dup_ratio,
            budget_bytes: self.budget,
            batch: self.batch,
            dir: self.dir.clone(),
            baseline_keys: self.baseline_keys,
            skip_baselines: self.no_baselines,
            durability: self.durability.unwrap_or(defaults.durability),
            generations: self.generations.unwrap_or(defaults.generations),
            ledger,
            digests: self.digests,
            refresh: self.refresh,
            ..defaults
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn explain(flags: &[&str]) -> Result<ExplainArgs, clap::Error> {
        let argv = ["dedupe", "explain"]
            .into_iter()
            .chain(flags.iter().copied());
        match Cli::try_parse_from(argv)?.command {
            Command::Explain(args) => Ok(args),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn explain_takes_an_id_as_text_or_as_one_json_value_never_both() {
        let id = |flags: &[&str]| {
            let args = explain(flags).unwrap();
            let (id, json) = args.id();
            (id.to_string(), json)
        };
        assert_eq!(id(&["m-1"]), ("m-1".to_string(), false));
        assert_eq!(
            id(&["--json-id", "12345678901234567890"]),
            ("12345678901234567890".to_string(), true)
        );
        assert_eq!(
            id(&["--json-id", r#""abc""#]),
            (r#""abc""#.to_string(), true)
        );
        // Neither, both, or a JSON id scoped by the front door's source: refused as clap
        // refuses a bad argument (exit 2).
        for flags in [
            &[][..],
            &["m-1", "--json-id", "1"],
            &["--json-id", "1", "--source", "web"],
        ] {
            let e = explain(flags)
                .err()
                .unwrap_or_else(|| panic!("{flags:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{flags:?}");
        }
    }
}

//! The command line: every subcommand of `dedupe` and the flags that override the configuration.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use dedupe::config::Overrides;

#[derive(Debug, Parser)]
#[command(
    name = "dedupe",
    version,
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
    /// Serve the Segment-compatible HTTP tracking API and log every message to the input topic.
    Ingest(IngestArgs),
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
            log_format: self.log_format.clone(),
            ..Overrides::default()
        }
    }

    /// Loads and validates the configuration from the file, the process environment and the flags.
    pub fn load(&self) -> Result<dedupe::config::Config, dedupe::config::ConfigError> {
        dedupe::config::Config::load(self.config.as_deref(), std::env::vars(), &self.overrides())
    }
}

//! The domain core of dedupe: message identity, the ledger, the commit and recovery protocol,
//! configuration, Kafka client factories and metric names. It knows nothing of actix.

pub mod audit;
pub mod batch;
#[cfg(feature = "bench")]
pub mod bench;
pub mod changelog;
pub mod clock;
pub mod config;
pub mod explain;
pub mod formats;
pub mod identity;
pub mod json;
pub mod kafka;
pub mod ledger;
pub mod log_limit;
pub mod metrics;
pub mod output;
pub mod plan;
pub mod progress;
pub mod recovery;
pub mod retry;
pub mod secret;
pub mod snapshot;
pub mod store;
pub mod watchdog;
pub mod window;
pub mod wire;

/// A Kafka partition number, typed as Kafka's clients type it, everywhere: the ledger's API and
/// records, progress, recovery and the actors. Partitions are never negative; on disk the ledger
/// stores one as 4 bytes (big-endian in keys, little-endian in the batch log).
pub type Partition = i32;

/// This build's version (the workspace's): what `dedupe --version` and `dedupe_build_info` say,
/// and what a ledger too new for this build is refused by (the formats are in [`formats`]).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

//! The actix layer of dedupe: the actors that drive the domain core, and the command line.
//!
//! - [`consumer::PartitionConsumer`]: one per owned input partition.
//! - [`ledger::LedgerActor`]: owns the worker's one RocksDB ledger (on a `SyncArbiter`).
//! - [`producer::Publisher`]: writes the output topic, one transactional producer per partition.
//! - [`coordinator::Coordinator`]: recovery, restarts, stats, graceful shutdown.

pub mod bench_pipeline;
pub mod cli;
pub mod consumer;
pub mod coordinator;
pub mod events;
pub mod guarded_stream;
pub mod http_server;
pub mod ingest;
pub mod ledger;
pub mod producer;
pub mod run;
pub mod telemetry;
pub mod tools;

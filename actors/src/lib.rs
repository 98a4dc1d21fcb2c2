//! The worker's actors, one module per actor, each with the messages it receives:
//!
//! - [`consumer`]: [`consumer::PartitionConsumer`], one per owned input partition, and its
//!   pipeline: the per-batch protocol (look up, publish, record), split by concern.
//! - [`ledger`]: [`ledger::LedgerActor`], which owns the worker's one RocksDB ledger (on a
//!   `SyncArbiter`).
//! - [`producer`]: [`producer::Publisher`], which writes the output topic, one transactional
//!   producer per partition.
//! - [`coordinator`]: [`coordinator::Coordinator`]: take-overs, revocations, restarts, snapshots,
//!   stats and graceful shutdown, with the rules it acts on ([`coordinator::policy`]).
//! - [`membership`]: the input consumer, its group and rebalance callback; [`handover`]: fence,
//!   then load, one partition.
//! - [`events`]: the worker's instrumentation, every metric and warning it emits; [`reasons`]:
//!   why the coordinator takes a partition over again or gives up, the words its policy and its
//!   events share.
//!
//! The `dedupe` binary that starts them, its commands and the worker's HTTP server are the
//! `dedupe-cli` crate.

pub mod consumer;
pub mod coordinator;
pub mod events;
pub mod handover;
pub mod ledger;
pub mod membership;
pub mod producer;
pub mod reasons;

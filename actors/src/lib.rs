//! The actix layer of dedupe, laid out as the service is:
//!
//! - the worker's actors: [`consumer::PartitionConsumer`], one per owned input partition;
//!   [`ledger::LedgerActor`], which owns the worker's one RocksDB ledger (on a `SyncArbiter`);
//!   [`producer::Publisher`], which writes the output topic, one transactional producer per
//!   partition; [`coordinator::Coordinator`]: recovery, restarts, snapshots, stats, graceful
//!   shutdown; [`membership`] and [`handover`]; and the [`events`] they emit.
//! - [`http`]: the worker's HTTP server: metrics and health ([`http::telemetry`]), the admin
//!   endpoints and their rules ([`http::admin`], [`http::forget`]). The tracking API is the front door's crate,
//!   `dedupe-tracking`.
//! - [`cli`]: the command line and the operator's commands ([`cli::tools`]); [`explain`]: `dedupe
//!   explain`, and where an id's partition is; [`forget`]: `dedupe forget`; [`admin_client`]: what
//!   they share to call the admin endpoints and to print.
//! - [`run`]: the worker, wired together; [`rekey`]: `dedupe rekey`, which keys a topic by id;
//!   [`signals`]: the stop and reload signals of the long-running commands, caught from their start.
//! - [`bench`]: the pipeline bench.

pub mod consumer;
pub mod coordinator;
pub mod events;
pub mod handover;
pub mod ledger;
pub mod membership;
pub mod producer;

pub mod admin_client;
#[cfg(feature = "tools")]
pub mod bench {
    //! Benches that run the real worker.
    pub mod handoff;
    pub mod latency;
    pub mod pipeline;
}
pub mod cli;
pub mod explain;
pub mod forget;
pub mod http {
    //! The worker's HTTP server.
    pub mod admin;
    pub mod forget;
    pub mod telemetry;
}
pub mod rekey;
pub mod run;
pub mod signals;

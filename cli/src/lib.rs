//! The `dedupe` binary's commands, laid out as a reader looks for them (`main.rs` is the table of
//! contents; the worker's actors are the `dedupe-actors` crate, the front door `dedupe-tracking`):
//!
//! - [`args`]: the command line, every subcommand and the flags that override the configuration.
//! - [`events`]: the binary's own events (the rekey stage's are in `rekey/events.rs`).
//! - [`run`]: `dedupe run`, the worker wired together; [`http`]: its HTTP server: metrics and
//!   health ([`http::telemetry`]), the admin endpoints and their rules ([`http::admin`],
//!   [`http::forget_route`]); [`signals`]: the stop and reload signals of the long-running
//!   commands, caught from their start.
//! - [`rekey`]: `dedupe rekey`, which keys a topic by id.
//! - [`explain_client`]: `dedupe explain`, and where an id's partition is; [`forget_client`]:
//!   `dedupe forget`; [`admin_client`]: what they share to call the admin endpoints and to print.
//! - [`plan`]: `dedupe plan`; [`tools`]: `dedupe verify` and the ledger's tools; [`release`]:
//!   the version and commit `--version` prints, with the formats.
//! - Behind the `tools` feature (on by default, off in the image): [`loadgen`], and
//!   [`bench`](mod@bench), the benches that run the real worker.

pub mod admin_client;
pub mod args;
pub mod events;
#[cfg(feature = "tools")]
pub mod bench {
    //! Benches that run the real worker.
    pub mod handoff;
    pub mod latency;
    pub mod pipeline;
    mod topics;
}
pub mod explain_client;
pub mod forget_client;
pub mod http {
    //! The worker's HTTP server.
    pub mod admin;
    pub mod forget_route;
    pub mod telemetry;
}
#[cfg(feature = "tools")]
pub mod loadgen;
pub mod plan;
pub mod rekey;
pub mod release;
pub mod run;
pub mod signals;
pub mod tools;

//! Benchmarks that run inside the core, so the binary's `bench` subcommands are thin calls.

pub mod ledger;
pub mod load;
pub mod segment_baseline;
pub mod sizes;

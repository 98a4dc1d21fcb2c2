//! The actix layer of dedupe: the actors that drive the domain core, and the command line.

pub mod cli;
pub mod ingest;

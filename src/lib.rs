//! The domain core of dedupe: message identity, the ledger, the commit and recovery protocol,
//! configuration, Kafka client factories and metric names. It knows nothing of actix.

pub mod config;
pub mod kafka;
pub mod metrics;
pub mod tracking;

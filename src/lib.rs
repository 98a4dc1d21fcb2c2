//! dedupe core
pub mod bench;
pub mod identity;
pub mod ledger;

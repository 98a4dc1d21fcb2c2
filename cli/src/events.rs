//! The binary's own events, beside the rekey stage's (`rekey::events`): each a struct whose
//! `emit` writes its log line and its count together. The names and labels are declared once, in
//! `dedupe::metrics`.

use dedupe::metrics as m;

/// The running build, as `dedupe_build_info` says it (set once, when `/metrics` starts).
pub struct BuildInfo;

impl BuildInfo {
    pub fn emit(&self) {
        metrics::gauge!(
            m::BUILD_INFO,
            m::LABEL_VERSION => dedupe::formats::VERSION,
            m::LABEL_COMMIT => crate::release::COMMIT,
            m::LABEL_LEDGER_FORMAT => dedupe::ledger::FORMAT_VERSION.to_string()
        )
        .set(1.0);
    }
}

/// The worker's actors stopped but something still holds the ledger after the wait: the process
/// exits without closing it (it was flushed; the next start recovers).
pub struct LedgerStillInUse;

impl LedgerStillInUse {
    pub fn emit(&self) {
        metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_SHUTDOWN).increment(1);
        tracing::warn!(
            event = "LedgerStillInUse",
            "The ledger is still in use 10 s after the actors stopped; exiting without closing it (it was flushed; the next start recovers)."
        );
    }
}

//! The wall clock, read in the unit the service stores and compares times in: milliseconds since
//! the Unix epoch. Its own module, below both readers: the ledger (a load's first-seen times) is
//! below recovery (the ready window), and must not reach up into it for the time.

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

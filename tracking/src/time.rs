//! Times as the front door writes them: milliseconds since the epoch (record timestamps) and
//! RFC 3339 with milliseconds (`receivedAt`, the dead-letter records' `dedupe-received-at`).

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for times before it).
pub fn unix_millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `t` as RFC 3339 in UTC with milliseconds, e.g. `2024-02-29T13:05:09.042Z`.
pub fn rfc3339_millis(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

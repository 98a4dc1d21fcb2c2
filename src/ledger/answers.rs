//! What a batch gives the ledger and what the ledger answers: each id sent ([`Sent`]), the
//! verdict on it ([`Verdict`]), what is held of an id ([`Held`]) and each copy of it
//! ([`Sighting`]).

use crate::identity::{ContentDigest, LedgerKey};

/// One copy of an id the ledger holds: the generation it is in and its first-seen time. An id has
/// one copy, or two while a load's newer copy and the older one both live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sighting {
    pub generation: u64,
    pub first_seen_ms: i64,
}

/// What the ledger holds for an id: when it was first seen (rounded down to
/// [`FIRST_SEEN_RESOLUTION_MS`] relative to its generation's base) and the digest of its first
/// copy's content, when it was recorded with one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Event time of the first sighting, ms.
    pub first_seen_ms: i64,
    pub digest: Option<ContentDigest>,
}

/// The answer for one id of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not held before: now recorded.
    New,
    /// Held already; first seen at this time (rounded down to [`FIRST_SEEN_RESOLUTION_MS`]
    /// relative to its generation's base), with the first copy's digest if it was kept.
    Duplicate {
        /// Event time of the first sighting, ms.
        first_seen_ms: i64,
        digest: Option<ContentDigest>,
    },
}

/// One id of a batch to check and record: its key, its event time (ms) and, when the caller
/// has one, the digest of its content. `(key, time)` records no digest.
pub trait Sent {
    fn key(&self) -> LedgerKey;
    fn time_ms(&self) -> i64;
    fn digest(&self) -> Option<ContentDigest>;
}

impl Sent for (LedgerKey, i64) {
    fn key(&self) -> LedgerKey {
        self.0
    }
    fn time_ms(&self) -> i64 {
        self.1
    }
    fn digest(&self) -> Option<ContentDigest> {
        None
    }
}

impl Sent for (LedgerKey, i64, Option<ContentDigest>) {
    fn key(&self) -> LedgerKey {
        self.0
    }
    fn time_ms(&self) -> i64 {
        self.1
    }
    fn digest(&self) -> Option<ContentDigest> {
        self.2
    }
}

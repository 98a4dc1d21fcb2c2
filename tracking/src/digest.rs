//! The content hash of an event: what the worker compares to tell a client's retry (the same
//! event sent again) from another event under an id already seen. Sent with the record in the
//! `dedupe-content-digest` header as 16 lower-case hex digits (the core's wire contract,
//! `dedupe::wire::content_digest_header`).
//!
//! What is hashed (XXH3-64 with a fixed seed) is the event as [`crate::same_event`] defines it,
//! the definition the derived `messageId` uses too: so a retry of an event without a `messageId`
//! always gets its first copy's id and its digest (the verdict `retry`), whatever else the retry
//! changed that the definition leaves out (`context`, `sentAt`, ...), and an event that differs in
//! what the definition includes hashes otherwise.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::same_event::SameEvent;

/// Seed of the hash ("dedupesv": the same-event definition). A new definition gets a new seed;
/// a copy of an id recorded under another definition gets the verdict `reused_id` (and is dropped
/// all the same with the default `worker.on_reused_id`).
const SEED: u64 = u64::from_be_bytes(*b"dedupesv");

/// The content hash of `event`.
pub fn content_hash(event: &SameEvent) -> u64 {
    xxh3_64_with_seed(event.text(), SEED)
}

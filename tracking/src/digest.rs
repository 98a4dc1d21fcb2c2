//! The content hash of an event: what the worker compares to tell a client's retry (the same
//! event sent again) from another event under an id already seen. Sent with the record in the
//! `dedupe-content-digest` header ([`HEADER_CONTENT_DIGEST`]) as 16 lower-case hex digits.
//!
//! What is hashed (XXH3-64 with a fixed seed), in this order: the event's type, then each of its
//! top-level fields as sent (name and value, byte for byte, in the order sent) except those that
//! change between tries or that this service sets: `sentAt`, `receivedAt`, `messageId`,
//! `writeKey` and `type`; then a batch's shared `context` and `integrations` as sent. A library's
//! retry re-sends the same fields (only `sentAt` changes), so it hashes alike; an event whose
//! fields differ in any byte, even in white space or key order, hashes otherwise.

use xxhash_rust::xxh3::Xxh3;

use super::event::Shared;
use super::json::Fields;
use super::EventType;

/// The record header the hash is sent in.
pub const HEADER_CONTENT_DIGEST: &str = "dedupe-content-digest";

/// Fields left out of the hash.
pub const NOT_HASHED: [&str; 5] = ["sentAt", "receivedAt", "messageId", "writeKey", "type"];

/// Seed of the hash ("dedupedg"); changing it makes every later copy of an id recorded before
/// the change a `reused_id`.
const SEED: u64 = u64::from_be_bytes(*b"dedupedg");

/// The content hash of an event of `event_type` with `fields`, sent with `shared`.
pub fn content_hash(event_type: EventType, fields: &Fields<'_>, shared: &Shared<'_>) -> u64 {
    let mut hash = Xxh3::with_seed(SEED);
    let mut put = |bytes: &[u8]| {
        hash.update(&(bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    };
    put(event_type.as_str().as_bytes());
    for f in fields.iter().filter(|f| !NOT_HASHED.contains(&f.key)) {
        put(f.key.as_bytes());
        put(f.value.get().as_bytes());
    }
    for (name, value) in [("context", &shared.context), ("integrations", &shared.integrations)] {
        if let Some((raw, _)) = value {
            put(name.as_bytes());
            put(raw.get().as_bytes());
        }
    }
    hash.digest()
}

/// The header's value for `hash`.
pub fn header_value(hash: u64) -> String {
    format!("{hash:016x}")
}

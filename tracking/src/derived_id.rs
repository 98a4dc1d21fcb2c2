//! The `messageId` of an event sent without one, derived from what the event says, so that a
//! client that retries a request whose answer it lost sends the same ids again and the worker
//! drops the copies.
//!
//! An id is derived only when the event carries the client's own `timestamp`: without it two
//! events alike in everything else may be two real events (a button pressed twice), and a retry
//! cannot be told from a second event. Such an event gets a random UUIDv4.
//!
//! What the id is made of (docs/tracking-api.md gives the recipe for clients): the source (the
//! write key's source name) and the event as [`crate::same_event`] defines it, the definition the
//! content digest uses too. Two events that differ as sent in any of its fields get different ids;
//! a retry that changes only what that definition leaves out gets the same id. The id is the first
//! 16 bytes of the SHA-256 of that, as a version-8 UUID (RFC 9562's custom version): a client's
//! UUIDv4 can never be one, so downstream tells a derived id by its version digit, and the record
//! carries the `dedupe-message-id: derived` header as well. SHA-256 rather than a faster hash: no
//! one can make two different events share a derived id on purpose.

use sha2::{Digest, Sha256};

use super::json::{string_value, Fields, Name};
use super::same_event::SameEvent;

/// What starts the hashed text: a new derivation gets a new one, so ids never mean two things
/// (v1 read numbers as doubles, which merged events that differ as sent).
const DOMAIN: &[u8] = b"dedupe derived messageId v2\0";

/// The derived id of `event` from `source`, or `None` when it has no usable `timestamp` (a string
/// that is not blank) in `fields`.
pub fn derived_message_id(source: &str, fields: &Fields<'_>, event: &SameEvent) -> Option<String> {
    if fields
        .named(Name::Timestamp)
        .and_then(string_value)
        .is_none_or(|t| t.trim().is_empty())
    {
        return None;
    }
    let mut hash = Sha256::new();
    hash.update(DOMAIN);
    hash.update((source.len() as u64).to_be_bytes());
    hash.update(source.as_bytes());
    hash.update(event.text());
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x80; // version 8
    bytes[8] = (bytes[8] & 0x3f) | 0x80; // the RFC's variant
    Some(uuid::Uuid::from_bytes(bytes).to_string())
}

/// Whether `id` has the form of a derived id (a version-8 UUID, hyphenated, lower case).
pub fn is_derived(id: &str) -> bool {
    id.len() == 36
        && uuid::Uuid::parse_str(id).is_ok_and(|u| u.get_version_num() == 8)
        && id == id.to_ascii_lowercase()
}

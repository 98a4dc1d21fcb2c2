//! The content hash of an event: what the worker compares to tell a client's retry (the same
//! event sent again) from another event under an id already seen. Sent with the record in the
//! `dedupe-content-digest` header ([`HEADER_CONTENT_DIGEST`]) as 16 lower-case hex digits.
//!
//! What is hashed (XXH3-64 with a fixed seed) is the event as [`crate::same_event`] defines it,
//! the definition the derived `messageId` uses too: so a retry of an event without a `messageId`
//! always gets its first copy's id and its digest (the verdict `retry`), whatever else the retry
//! changed that the definition leaves out (`context`, `sentAt`, ...), and an event that differs in
//! what the definition includes hashes otherwise.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::same_event::SameEvent;

/// The record header the hash is sent in.
pub const HEADER_CONTENT_DIGEST: &str = "dedupe-content-digest";

/// Seed of the hash ("dedupesv": the same-event definition). A new definition gets a new seed;
/// a copy of an id recorded under another definition gets the verdict `reused_id` (and is dropped
/// all the same with the default `worker.on_reused_id`).
const SEED: u64 = u64::from_be_bytes(*b"dedupesv");

/// The content hash of `event`.
pub fn content_hash(event: &SameEvent) -> u64 {
    xxh3_64_with_seed(event.text(), SEED)
}

/// The header's value for `hash`.
pub fn header_value(hash: u64) -> String {
    hex(hash).iter().map(|&digit| char::from(digit)).collect()
}

/// The header's value for `hash`, without allocating: 16 lower-case hex digits.
pub fn hex(hash: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = b"0123456789abcdef"[(hash >> (60 - 4 * i) & 0xf) as usize];
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_header_is_the_hash_in_sixteen_hex_digits() {
        for hash in [0, 1, 0xdead_beef, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(super::header_value(hash), format!("{hash:016x}"));
        }
    }
}

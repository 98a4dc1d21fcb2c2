//! Message identity: how a client-made message id becomes a 16-byte ledger key.
//!
//! Guarantees:
//! - A message id is any non-empty byte string of at most [`MAX_ID_BYTES`] bytes; anything else is an
//!   [`IdError`] the caller must handle (the message cannot be deduplicated).
//! - An id that is a UUID in its 36-character hyphenated or 32-character simple ASCII form (any case)
//!   maps to the UUID's own 16 bytes, so `"6BA7B810-9DAD-11D1-80B4-00C04FD430C8"`,
//!   `"6ba7b810-9dad-11d1-80b4-00c04fd430c8"` and `"6ba7b8109dad11d180b400c04fd430c8"` are the same
//!   message. Braced and URN forms are deliberately NOT treated as UUIDs; they are hashed like any
//!   other bytes.
//! - Every other id maps to XXH3-128 of its bytes with the seed [`IDENTITY_HASH_SEED`], written
//!   big-endian. This mapping is part of the on-disk format (a change requires a new ledger format
//!   version): it is the same on every platform and never depends on partition count or anything
//!   else about the deployment. The tests pin it with known vectors.

//!
//! Where a record's id is read from (its key, a header, a JSON field, a composite of those, or a
//! fingerprint of its value), and why a record has none, is the `record` submodule's part:
//! [`identify`], [`message_id`], [`message_key`], [`IdSource`], [`RecordView`] (of a Kafka
//! message: [`message_view`]), [`Unkeyed`]; a value is read as JSON by the one exact reader
//! ([`crate::json`]). What tells a retry from a reused id is the `digest` submodule's:
//! [`ContentDigest`], [`DigestSource`]. How an operator names an id to `dedupe explain` and
//! `dedupe forget`, and which key that is (a JSON number's among them), is the `named`
//! submodule's: [`named_id`], [`NamedId`].

use std::fmt;

mod digest;
mod named;
mod record;
pub use digest::{ContentDigest, DigestSource, CONTENT_DIGEST_BYTES};
pub use named::{named_id, Named, NamedId, NamedIdError};
pub use record::{
    copied_view, identify, json_value_id, message_id, message_key, message_view, Fingerprint,
    IdSource, Identity, JsonValueError, MessageId, RecordView, Unkeyed, NUMBER_ID_TAG,
};

/// Longest message id accepted, in bytes.
pub const MAX_ID_BYTES: usize = 1024;

/// Seed of the XXH3-128 hash applied to ids that are not UUIDs. Part of the on-disk format.
/// (The ASCII bytes of "dedupeid", read as a big-endian u64.)
pub const IDENTITY_HASH_SEED: u64 = u64::from_be_bytes(*b"dedupeid");

/// Length of a ledger key in bytes.
pub const LEDGER_KEY_BYTES: usize = 16;

/// The 16-byte key under which the ledger remembers a message id.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LedgerKey(pub [u8; LEDGER_KEY_BYTES]);

impl LedgerKey {
    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; LEDGER_KEY_BYTES] {
        &self.0
    }

    /// The key as 32 lower-case hex digits (for a UUID id, the UUID's own digits).
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl AsRef<[u8]> for LedgerKey {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for LedgerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LedgerKey({})", self.hex())
    }
}

/// Why a message id cannot be turned into a ledger key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The message carries an empty id.
    #[error("the message id is empty")]
    Empty,
    /// The message id is longer than [`MAX_ID_BYTES`].
    #[error("the message id is {len} bytes long, more than the {MAX_ID_BYTES} bytes allowed")]
    TooLong {
        /// Length of the rejected id in bytes.
        len: usize,
    },
}

/// Whether `id` is a message id at all: not empty and at most [`MAX_ID_BYTES`] long. The one
/// definition of the rule, which [`ledger_key`] applies and `dedupe rekey` keys records by.
pub fn check_id(id: &[u8]) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty);
    }
    if id.len() > MAX_ID_BYTES {
        return Err(IdError::TooLong { len: id.len() });
    }
    Ok(())
}

/// The ledger key of a message id (see the module docs for the rules).
pub fn ledger_key(id: &[u8]) -> Result<LedgerKey, IdError> {
    check_id(id)?;
    if id.len() == 36 || id.len() == 32 {
        // At these lengths the parser only accepts the hyphenated and the simple form.
        if let Ok(uuid) = uuid::Uuid::try_parse_ascii(id) {
            return Ok(LedgerKey(*uuid.as_bytes()));
        }
    }
    Ok(hashed_key(id))
}

/// XXH3-128 of `id` with [`IDENTITY_HASH_SEED`], big-endian: the key of an id that is not a UUID.
pub(crate) fn hashed_key(id: &[u8]) -> LedgerKey {
    LedgerKey(xxhash_rust::xxh3::xxh3_128_with_seed(id, IDENTITY_HASH_SEED).to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_forms_map_to_the_uuid_bytes() {
        // The hyphenated, upper-case and simple forms of one UUID are one message.
        let forms: [&[u8]; 4] = [
            b"6ba7b810-9dad-11d1-80b4-00c04fd430c8",
            b"6BA7B810-9DAD-11D1-80B4-00C04FD430C8",
            b"6ba7b8109dad11d180b400c04fd430c8",
            b"6Ba7B8109dAd11D180b400C04fD430c8",
        ];
        for form in forms {
            assert_eq!(
                ledger_key(form).unwrap().hex(),
                "6ba7b8109dad11d180b400c04fd430c8"
            );
        }
    }

    #[test]
    fn other_uuid_spellings_are_hashed_not_parsed() {
        // Braced and URN forms are accepted by the uuid crate, but not by our identity rule.
        let braced = ledger_key(b"{6ba7b810-9dad-11d1-80b4-00c04fd430c8}").unwrap();
        let urn = ledger_key(b"urn:uuid:6ba7b810-9dad-11d1-80b4-00c04fd430c8").unwrap();
        let plain = ledger_key(b"6ba7b810-9dad-11d1-80b4-00c04fd430c8").unwrap();
        assert_ne!(braced, plain);
        assert_ne!(urn, plain);
        // A 36-byte string with misplaced hyphens is hashed as well.
        let odd = ledger_key(b"6ba7b8109-dad-11d1-80b4-00c04fd430c8").unwrap();
        assert_ne!(odd, plain);
        assert_eq!(odd, hashed(b"6ba7b8109-dad-11d1-80b4-00c04fd430c8"));
    }

    fn hashed(id: &[u8]) -> LedgerKey {
        LedgerKey(xxhash_rust::xxh3::xxh3_128_with_seed(id, IDENTITY_HASH_SEED).to_be_bytes())
    }

    /// Known vectors. Produced once by a throwaway program calling xxhash-rust 0.8.21's
    /// `xxh3_128_with_seed(id, 0x6465_6475_7065_6964)` and printing `to_be_bytes()` as hex, on
    /// x86_64, and hard-coded here,
    /// so any change to the hash, its seed or its byte order fails this test: such a change
    /// alters the on-disk format.
    #[test]
    fn hashed_ids_match_known_vectors() {
        assert_eq!(IDENTITY_HASH_SEED, 0x6465_6475_7065_6964);
        let vectors: [(&[u8], &str); 4] = [
            (b"a", KNOWN_A),
            (b"hello world", KNOWN_HELLO),
            (b"order-42/retry", KNOWN_ORDER),
            (&[0u8; 1024], KNOWN_ZEROS_1024),
        ];
        for (id, expected) in vectors {
            assert_eq!(ledger_key(id).unwrap().hex(), expected, "id {id:?}");
        }
    }

    const KNOWN_A: &str = "614fd4b0ec6865fae3fb7e55d9ef4813";
    const KNOWN_HELLO: &str = "33b1af61623affe6b261722ad0feb476";
    const KNOWN_ORDER: &str = "7bfdd4ca0ffdb2184366ec3872a11bbc";
    const KNOWN_ZEROS_1024: &str = "f9a2d47e7ced86bb5ba4fb3e73714747";

    #[test]
    fn empty_and_oversize_ids_are_errors() {
        assert_eq!(ledger_key(b""), Err(IdError::Empty));
        assert_eq!(
            ledger_key(&[7u8; MAX_ID_BYTES + 1]),
            Err(IdError::TooLong {
                len: MAX_ID_BYTES + 1
            })
        );
        // Exactly the limit is fine.
        assert!(ledger_key(&[7u8; MAX_ID_BYTES]).is_ok());
    }
}

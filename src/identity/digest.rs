//! Content digests: what tells a retry (the same event sent again) from a reused id (another
//! event under an id already seen).
//!
//! A record's content is hashed to 64 bits by whoever knows which of its bytes may change between
//! retries: the front door hashes the client's event without `sentAt`, `receivedAt` and
//! `messageId` and sends the hash in the [`HEADER_CONTENT_DIGEST`] header (16 hex digits); for
//! other records the worker hashes what makes the record's id, or its value's canonical JSON text
//! ([`DigestSource`], [`crate::identity::identify`]). The ledger keeps
//! [`CONTENT_DIGEST_BYTES`] of it with each id: two bytes tell a changed event from a retry but for
//! one reused id in 65,535, and cost 2 bytes per id on disk (the measurement is in
//! docs/performance.md). Part of the ledger's format (version 3).
//!
//! [`HEADER_CONTENT_DIGEST`]: crate::wire::HEADER_CONTENT_DIGEST

use std::num::NonZeroU16;

use crate::wire::read_content_digest_header;

/// Bytes of a digest the ledger stores with an id.
pub const CONTENT_DIGEST_BYTES: usize = 2;

/// Seed of the hash of a record's value (ASCII "dedupedg").
const VALUE_DIGEST_SEED: u64 = u64::from_be_bytes(*b"dedupedg");

/// The digest of a first copy's content the ledger keeps with its id. Never zero, so that
/// `Option<ContentDigest>` takes two bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContentDigest(NonZeroU16);

impl ContentDigest {
    /// The ledger's digest of a 64-bit content hash: its top 16 bits (1 where they are 0).
    pub fn of_hash(hash: u64) -> ContentDigest {
        ContentDigest(NonZeroU16::new((hash >> 48) as u16).unwrap_or(NonZeroU16::MIN))
    }

    /// The digest of a record's content: these bytes hashed whole (XXH3-64, a fixed seed).
    pub fn of_value(value: &[u8]) -> ContentDigest {
        Self::of_hash(xxhash_rust::xxh3::xxh3_64_with_seed(
            value,
            VALUE_DIGEST_SEED,
        ))
    }

    /// The digest a [`HEADER_CONTENT_DIGEST`](crate::wire::HEADER_CONTENT_DIGEST) header's value
    /// stands for; `None` if it is not 16 hex digits.
    pub fn of_header(value: &[u8]) -> Option<ContentDigest> {
        read_content_digest_header(value).map(Self::of_hash)
    }

    /// The stored bytes (little-endian).
    pub fn to_bytes(self) -> [u8; CONTENT_DIGEST_BYTES] {
        self.0.get().to_le_bytes()
    }

    /// The digest stored as `bytes`; `None` for bytes no digest is stored as.
    pub fn from_bytes(bytes: [u8; CONTENT_DIGEST_BYTES]) -> Option<ContentDigest> {
        NonZeroU16::new(u16::from_le_bytes(bytes)).map(ContentDigest)
    }

    /// The digest as 4 hex digits (for explaining an id).
    pub fn hex(self) -> String {
        format!("{:04x}", self.0.get())
    }
}

impl std::fmt::Debug for ContentDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ContentDigest({})", self.hex())
    }
}

/// Where the worker takes a record's content digest from (`worker.content_digest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DigestSource {
    /// The `dedupe-content-digest` header ([`crate::wire::HEADER_CONTENT_DIGEST`]) when the record
    /// has one (the front door's records), else what makes the record's id (a fingerprint's or a
    /// composite's fields), or the value's canonical JSON text (its bytes if it is not JSON).
    #[default]
    HeaderOrValue,
    /// Only the header: a record without one keeps no digest (its copies get the verdict
    /// `unknown`). For producers whose retries change the value.
    Header,
    /// No digest: every duplicate's verdict is `unknown`, and the ledger stores 2 bytes less per id.
    None,
}

impl DigestSource {
    /// The digest of a record with this header value (if any) whose content's digest is
    /// `content` (called only when needed; what the content is, [`crate::identity::identify`]
    /// says).
    pub fn digest(
        self,
        header: Option<&[u8]>,
        content: impl FnOnce() -> ContentDigest,
    ) -> Option<ContentDigest> {
        match self {
            DigestSource::None => None,
            DigestSource::Header => header.and_then(ContentDigest::of_header),
            DigestSource::HeaderOrValue => match header {
                Some(h) => ContentDigest::of_header(h),
                None => Some(content()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_pinned_never_zero_and_round_trip() {
        // Part of the ledger's format: these values must not change.
        assert_eq!(ContentDigest::of_hash(0xabcd_0000_0000_0001).hex(), "abcd");
        assert_eq!(ContentDigest::of_hash(0x0000_ffff_ffff_ffff).hex(), "0001");
        assert_eq!(
            ContentDigest::of_header(b"abcd000000000001"),
            Some(ContentDigest::of_hash(0xabcd_0000_0000_0001))
        );
        let d = ContentDigest::of_value(b"{\"event\":\"e\"}");
        assert_eq!(ContentDigest::from_bytes(d.to_bytes()), Some(d));
        assert_eq!(ContentDigest::from_bytes([0, 0]), None);
        assert_eq!(
            std::mem::size_of::<Option<ContentDigest>>(),
            CONTENT_DIGEST_BYTES
        );
    }

    #[test]
    fn the_digest_of_the_header_the_front_door_writes_is_the_digest_of_its_hash() {
        for hash in [0x1234_5678_9abc_def0, 0, u64::MAX] {
            let header = crate::wire::content_digest_header(hash);
            assert_eq!(
                ContentDigest::of_header(&header),
                Some(ContentDigest::of_hash(hash))
            );
        }
    }

    #[test]
    fn a_header_that_is_not_sixteen_hex_digits_gives_no_digest() {
        for bad in [
            &b""[..],
            b"abcd",
            b"abcd00000000000g",
            b"abcd0000000000011",
            b"\xff\xfe",
        ] {
            assert_eq!(ContentDigest::of_header(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn each_source_takes_the_digest_from_where_it_says() {
        let h = Some(&b"1234000000000000"[..]);
        let v = || ContentDigest::of_value(b"value");
        let from_header = ContentDigest::of_header(b"1234000000000000");
        assert_eq!(DigestSource::HeaderOrValue.digest(h, v), from_header);
        assert_eq!(DigestSource::HeaderOrValue.digest(None, v), Some(v()));
        assert_eq!(DigestSource::Header.digest(h, v), from_header);
        assert_eq!(DigestSource::Header.digest(None, v), None);
        assert_eq!(DigestSource::None.digest(h, v), None);
        // A bad header is no digest, not the value's: the front door said what its content is.
        assert_eq!(DigestSource::HeaderOrValue.digest(Some(b"x"), v), None);
    }
}

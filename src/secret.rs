//! [`Secret`]: a value that is handed to a client library but never printed; [`SecretMatcher`]:
//! one that presented values are checked against in constant time. Below both `config` and
//! `kafka`, which hold secrets; `dedupe::config` re-exports both types.

use std::fmt;

use serde::{Serialize, Serializer};

/// A value that must never be printed: `Debug` and `Serialize` both write `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(
    /// The secret itself; read it only through [`Secret::expose`].
    String,
);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for handing to a client library. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

/// A secret that presented values are checked against (the admin token), in a time that reveals
/// neither the secret's length nor how much of a guess is right.
///
/// Both sides are hashed with a seed drawn at random when the process starts, and the 16-byte
/// digests compared without stopping at the first difference: a caller can time only the hashing
/// of its own value and a comparison of fixed length, and cannot aim at the digest of a seed it
/// does not know. The bytes themselves are compared only once the digests agree.
pub struct SecretMatcher {
    secret: Secret,
    seed: u64,
    digest: [u8; 16],
}

impl SecretMatcher {
    /// Prepares `secret` for checking, with a fresh random seed.
    pub fn new(secret: Secret) -> Self {
        Self::with_seed(secret, rand::random())
    }

    fn with_seed(secret: Secret, seed: u64) -> Self {
        let digest = keyed_digest(secret.expose().as_bytes(), seed);
        Self {
            secret,
            seed,
            digest,
        }
    }

    /// Whether `given` is the secret.
    pub fn matches(&self, given: &[u8]) -> bool {
        let digest = keyed_digest(given, self.seed);
        let differ = digest
            .iter()
            .zip(&self.digest)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        // black_box keeps the optimizer from turning the fold into an early exit.
        std::hint::black_box(differ) == 0 && given == self.secret.expose().as_bytes()
    }
}

impl fmt::Debug for SecretMatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretMatcher(<redacted>)")
    }
}

fn keyed_digest(value: &[u8], seed: u64) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128_with_seed(value, seed).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matcher_accepts_the_secret_alone() {
        let matcher = SecretMatcher::new(Secret::new("s3cret-token"));
        assert!(matcher.matches(b"s3cret-token"));
        // A prefix, an extension, one byte changed, the empty value: all refused.
        for wrong in [&b"s3cret-toke"[..], b"s3cret-token!", b"s3cret-tokeN", b""] {
            assert!(
                !matcher.matches(wrong),
                "{}",
                String::from_utf8_lossy(wrong)
            );
        }
    }

    #[test]
    fn the_digest_depends_on_the_seed() {
        // Two processes hold different digests of one token, so a digest learnt from one tells
        // nothing about another; each still accepts the token.
        let a = SecretMatcher::with_seed(Secret::new("t"), 1);
        let b = SecretMatcher::with_seed(Secret::new("t"), 2);
        assert_ne!(a.digest, b.digest);
        assert!(a.matches(b"t") && b.matches(b"t"));
    }

    #[test]
    fn a_matcher_never_prints_its_secret() {
        let matcher = SecretMatcher::new(Secret::new("hunter2"));
        assert!(!format!("{matcher:?}").contains("hunter2"));
    }
}

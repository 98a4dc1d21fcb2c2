//! [`Secret`]: a value that is handed to a client library but never printed.

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

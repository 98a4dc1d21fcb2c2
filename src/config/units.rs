//! [`ByteSize`]: sizes written as an integer or with a unit (`"64MiB"`, `"16GiB"`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes, written as an integer or as a string with a unit: `"64MiB"`, `"16GiB"`.
/// It prints with the largest unit that divides it exactly (`16GiB`, `1000B`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(
    /// The size in bytes.
    pub u64,
);

impl ByteSize {
    /// Bytes in a KiB.
    pub const KIB: u64 = 1024;
    /// Bytes in a MiB.
    pub const MIB: u64 = 1024 * 1024;
    /// Bytes in a GiB.
    pub const GIB: u64 = 1024 * 1024 * 1024;

    /// Parses `1_000`, `64MiB`, `16 GiB`: digits (`_` allowed) then an optional unit: B, KiB, MiB,
    /// GiB, TiB, or K/KB, M/MB, G/GB, T/TB, which mean the same binary units.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit() && c != '_')
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let n: u64 = digits
            .replace('_', "")
            .parse()
            .map_err(|_| format!("`{text}` is not a size like 64MiB"))?;
        let mult = match unit.trim() {
            "" | "B" => 1,
            "KiB" | "K" | "KB" => Self::KIB,
            "MiB" | "M" | "MB" => Self::MIB,
            "GiB" | "G" | "GB" => Self::GIB,
            "TiB" | "T" | "TB" => Self::GIB * 1024,
            other => {
                return Err(format!(
                    "unknown unit `{other}` (use B, KiB, MiB, GiB, TiB)"
                ))
            }
        };
        n.checked_mul(mult)
            .map(Self)
            .ok_or_else(|| format!("`{text}` is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (unit, size) in [
            ("TiB", Self::GIB * 1024),
            ("GiB", Self::GIB),
            ("MiB", Self::MIB),
            ("KiB", Self::KIB),
        ] {
            if n >= size && n.is_multiple_of(size) {
                return write!(f, "{}{unit}", n / size);
            }
        }
        write!(f, "{n}B")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(Self(n)),
            Raw::Text(t) => Self::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

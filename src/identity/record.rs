//! Reading a record's message id from where [`IdSource`] says it is, and turning it into a ledger
//! key, or saying why it has none.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{ledger_key, IdError, LedgerKey};

/// Where a record's message id is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdSource {
    /// The record key (the input topic is keyed by message id).
    Key,
    /// A record header with this name.
    Header(String),
    /// A JSON pointer (RFC 6901) into the record value, e.g. `/messageId`.
    JsonPointer(String),
}

impl IdSource {
    /// Parses `key`, `header:NAME` or `json:/POINTER`.
    fn parse(text: &str) -> Result<Self, String> {
        if text == "key" {
            Ok(Self::Key)
        } else if let Some(name) = text.strip_prefix("header:") {
            if name.is_empty() {
                return Err("header: needs a header name, e.g. header:message-id".into());
            }
            Ok(Self::Header(name.to_string()))
        } else if let Some(pointer) = text.strip_prefix("json:") {
            if !pointer.starts_with('/') {
                return Err(
                    "json: needs a JSON pointer starting with '/', e.g. json:/messageId".into(),
                );
            }
            Ok(Self::JsonPointer(pointer.to_string()))
        } else {
            Err(format!(
                "`{text}` is not one of key, header:NAME, json:/POINTER"
            ))
        }
    }
}

impl fmt::Display for IdSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Key => f.write_str("key"),
            Self::Header(name) => write!(f, "header:{name}"),
            Self::JsonPointer(p) => write!(f, "json:{p}"),
        }
    }
}

impl Serialize for IdSource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IdSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Why a record has no usable id. The label values are part of the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unkeyed {
    /// No key, no such header, or no such JSON field.
    Missing,
    /// The id is empty.
    Empty,
    /// The id is longer than 1 KiB.
    TooLong,
    /// The value is not JSON, or the field is not a string or number.
    Unreadable,
}

impl Unkeyed {
    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Empty => "empty",
            Self::TooLong => "too_long",
            Self::Unreadable => "unreadable",
        }
    }
}

impl From<IdError> for Unkeyed {
    fn from(e: IdError) -> Self {
        match e {
            IdError::Empty => Unkeyed::Empty,
            IdError::TooLong { .. } => Unkeyed::TooLong,
        }
    }
}

/// The parts of a record an id can come from.
pub struct RecordView<'a, H: Fn(&str) -> Option<&'a [u8]>> {
    pub key: Option<&'a [u8]>,
    pub header: H,
    pub value: Option<&'a [u8]>,
}

/// The ledger key of a record's message id, read as `source` says.
pub fn message_key<'a, H: Fn(&str) -> Option<&'a [u8]>>(
    record: &RecordView<'a, H>,
    source: &IdSource,
) -> Result<LedgerKey, Unkeyed> {
    match source {
        IdSource::Key => Ok(ledger_key(record.key.ok_or(Unkeyed::Missing)?)?),
        IdSource::Header(name) => Ok(ledger_key((record.header)(name).ok_or(Unkeyed::Missing)?)?),
        IdSource::JsonPointer(pointer) => {
            let value = record.value.ok_or(Unkeyed::Missing)?;
            let json: serde_json::Value =
                serde_json::from_slice(value).map_err(|_| Unkeyed::Unreadable)?;
            match json.pointer(pointer) {
                None | Some(serde_json::Value::Null) => Err(Unkeyed::Missing),
                Some(serde_json::Value::String(s)) => Ok(ledger_key(s.as_bytes())?),
                Some(serde_json::Value::Number(n)) => Ok(ledger_key(n.to_string().as_bytes())?),
                Some(_) => Err(Unkeyed::Unreadable),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(
        key: Option<&'a [u8]>,
        value: Option<&'a [u8]>,
    ) -> RecordView<'a, impl Fn(&str) -> Option<&'a [u8]>> {
        RecordView {
            key,
            header: move |name: &str| (name == "id").then_some(b"hdr-id".as_slice()),
            value,
        }
    }

    #[test]
    fn key_source() {
        assert_eq!(
            message_key(&view(Some(b"abc"), None), &IdSource::Key),
            Ok(ledger_key(b"abc").unwrap())
        );
        assert_eq!(
            message_key(&view(None, None), &IdSource::Key),
            Err(Unkeyed::Missing)
        );
        assert_eq!(
            message_key(&view(Some(b""), None), &IdSource::Key),
            Err(Unkeyed::Empty)
        );
        let long = vec![b'x'; 2048];
        assert_eq!(
            message_key(&view(Some(&long), None), &IdSource::Key),
            Err(Unkeyed::TooLong)
        );
        // Non-UTF-8 bytes are a perfectly good id: they hash.
        assert!(message_key(&view(Some(&[0xff, 0xfe, 0x00]), None), &IdSource::Key).is_ok());
    }

    #[test]
    fn header_source() {
        let h = IdSource::Header("id".into());
        assert_eq!(
            message_key(&view(None, None), &h),
            Ok(ledger_key(b"hdr-id").unwrap())
        );
        let other = IdSource::Header("nope".into());
        assert_eq!(
            message_key(&view(Some(b"k"), None), &other),
            Err(Unkeyed::Missing)
        );
    }

    #[test]
    fn json_pointer_source() {
        let p = IdSource::JsonPointer("/messageId".into());
        let v = br#"{"messageId":"m-1","n":{"x":7}}"#;
        assert_eq!(
            message_key(&view(None, Some(v)), &p),
            Ok(ledger_key(b"m-1").unwrap())
        );
        let num = IdSource::JsonPointer("/n/x".into());
        assert_eq!(
            message_key(&view(None, Some(v)), &num),
            Ok(ledger_key(b"7").unwrap())
        );
        let obj = IdSource::JsonPointer("/n".into());
        assert_eq!(
            message_key(&view(None, Some(v)), &obj),
            Err(Unkeyed::Unreadable)
        );
        assert_eq!(
            message_key(&view(None, Some(b"not json")), &p),
            Err(Unkeyed::Unreadable)
        );
        assert_eq!(message_key(&view(None, None), &p), Err(Unkeyed::Missing));
        assert_eq!(
            message_key(&view(None, Some(br#"{"a":1}"#)), &p),
            Err(Unkeyed::Missing)
        );
    }
}

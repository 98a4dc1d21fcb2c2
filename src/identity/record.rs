//! Reading a record's message id from where [`IdSource`] says it is, and turning it into a ledger
//! key, or saying why it has none.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

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
    /// Several of the three above, joined: each part's bytes after their length and a colon
    /// (`13:1700000000000` then `5:alice`), so that no two different lists of parts join alike.
    /// A missing part leaves the record without an id.
    Composite(Vec<IdSource>),
    /// A hash of the record value's JSON (see [`Fingerprint`]).
    Fingerprint(Fingerprint),
}

/// What of a record value's JSON a fingerprint id hashes: the value is parsed, the fields chosen
/// (or all but the ones left out) are written again in one canonical form (object keys sorted, no
/// white space, strings and numbers as sent), and the id is `fp:` and the first 16 bytes of
/// that text's SHA-256, in hex. Two copies of an event that differ only in the fields left out
/// (a fresh id per retry, a send time) have the same id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fingerprint {
    /// The whole value.
    Whole,
    /// The value without these fields (JSON pointers; absent ones are ignored).
    Without(Vec<String>),
    /// Only these fields, in this order (JSON pointers); a record lacking one has no id.
    Of(Vec<String>),
}

impl IdSource {
    /// Parses `key`, `header:NAME`, `json:/POINTER`, `fingerprint`,
    /// `fingerprint:without:/A,/B` or `fingerprint:of:/A,/B`.
    fn parse(text: &str) -> Result<Self, String> {
        if text == "key" {
            Ok(Self::Key)
        } else if let Some(name) = text.strip_prefix("header:") {
            if name.is_empty() {
                return Err("header: needs a header name, e.g. header:message-id".into());
            }
            Ok(Self::Header(name.to_string()))
        } else if let Some(pointer) = text.strip_prefix("json:") {
            check_pointer(pointer, "json:")?;
            Ok(Self::JsonPointer(pointer.to_string()))
        } else if text == "fingerprint" {
            Ok(Self::Fingerprint(Fingerprint::Whole))
        } else if let Some(list) = text.strip_prefix("fingerprint:without:") {
            Ok(Self::Fingerprint(Fingerprint::Without(pointers(list)?)))
        } else if let Some(list) = text.strip_prefix("fingerprint:of:") {
            Ok(Self::Fingerprint(Fingerprint::Of(pointers(list)?)))
        } else {
            Err(format!(
                "`{text}` is not one of key, header:NAME, json:/POINTER, fingerprint, fingerprint:without:/A,/B, fingerprint:of:/A,/B (or a list of key, header: and json: parts)"
            ))
        }
    }

    /// A composite of `parts` (each `key`, `header:NAME` or `json:/POINTER`); one part is that
    /// part alone.
    fn composite(parts: &[String]) -> Result<Self, String> {
        let mut sources = Vec::with_capacity(parts.len());
        for part in parts {
            match Self::parse(part)? {
                s @ (Self::Key | Self::Header(_) | Self::JsonPointer(_)) => sources.push(s),
                _ => return Err(format!("`{part}` cannot be part of a composite id: only key, header:NAME and json:/POINTER can")),
            }
        }
        match sources.len() {
            0 => Err("a composite id needs at least one part".into()),
            1 => Ok(sources.remove(0)),
            _ => Ok(Self::Composite(sources)),
        }
    }

    /// Whether the id is the record key itself.
    pub fn is_key(&self) -> bool {
        *self == Self::Key
    }
}

fn check_pointer(pointer: &str, what: &str) -> Result<(), String> {
    if pointer.starts_with('/') {
        Ok(())
    } else {
        Err(format!(
            "{what} needs a JSON pointer starting with '/', e.g. {what}/messageId; `{pointer}` is not one"
        ))
    }
}

/// A comma-separated list of JSON pointers.
fn pointers(list: &str) -> Result<Vec<String>, String> {
    let pointers: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    if pointers.is_empty() {
        return Err("a fingerprint's field list needs at least one JSON pointer, e.g. fingerprint:without:/sentAt".into());
    }
    for p in &pointers {
        check_pointer(p, "a fingerprint field")?;
    }
    Ok(pointers)
}

impl fmt::Display for IdSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Key => f.write_str("key"),
            Self::Header(name) => write!(f, "header:{name}"),
            Self::JsonPointer(p) => write!(f, "json:{p}"),
            Self::Composite(parts) => {
                let parts: Vec<String> = parts.iter().map(ToString::to_string).collect();
                write!(f, "[{}]", parts.join(", "))
            }
            Self::Fingerprint(Fingerprint::Whole) => f.write_str("fingerprint"),
            Self::Fingerprint(Fingerprint::Without(p)) => {
                write!(f, "fingerprint:without:{}", p.join(","))
            }
            Self::Fingerprint(Fingerprint::Of(p)) => write!(f, "fingerprint:of:{}", p.join(",")),
        }
    }
}

impl Serialize for IdSource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Composite(parts) => s.collect_seq(parts.iter().map(ToString::to_string)),
            _ => s.collect_str(self),
        }
    }
}

impl<'de> Deserialize<'de> for IdSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Text {
            One(String),
            Parts(Vec<String>),
        }
        match Text::deserialize(d)? {
            Text::One(text) => Self::parse(&text),
            Text::Parts(parts) => Self::composite(&parts),
        }
        .map_err(serde::de::Error::custom)
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
    Ok(ledger_key(&message_id(record, source)?)?)
}

/// A record's message id, read as `source` says, if the ledger can key it (not empty, at most
/// 1 KiB: [`check_id`](super::check_id)): what `dedupe rekey` keys the record by. A record
/// without one keeps its own key there, and the worker finds it unkeyed for the same reason.
pub fn usable_message_id<'a, H: Fn(&str) -> Option<&'a [u8]>>(
    record: &RecordView<'a, H>,
    source: &IdSource,
) -> Result<Cow<'a, [u8]>, Unkeyed> {
    let id = message_id(record, source)?;
    super::check_id(&id)?;
    Ok(id)
}

/// A record's message id as bytes, read as `source` says: what the ledger key hashes, and what
/// tells the partition the id belongs in. It may be empty or too long to be one (see
/// [`usable_message_id`]).
pub fn message_id<'a, H: Fn(&str) -> Option<&'a [u8]>>(
    record: &RecordView<'a, H>,
    source: &IdSource,
) -> Result<Cow<'a, [u8]>, Unkeyed> {
    let mut value = ParsedValue::new(record.value);
    match source {
        IdSource::Composite(parts) => {
            let mut id = Vec::new();
            for part in parts {
                let bytes = part_of(record, part, &mut value)?;
                id.extend_from_slice(bytes.len().to_string().as_bytes());
                id.push(b':');
                id.extend_from_slice(&bytes);
            }
            Ok(Cow::Owned(id))
        }
        IdSource::Fingerprint(spec) => fingerprint(value.get()?, spec).map(Cow::Owned),
        part => part_of(record, part, &mut value),
    }
}

/// A record value, parsed as JSON once, when first needed.
struct ParsedValue<'a> {
    bytes: Option<&'a [u8]>,
    parsed: Option<serde_json::Value>,
}

impl<'a> ParsedValue<'a> {
    fn new(bytes: Option<&'a [u8]>) -> Self {
        ParsedValue {
            bytes,
            parsed: None,
        }
    }

    fn get(&mut self) -> Result<&mut serde_json::Value, Unkeyed> {
        if self.parsed.is_none() {
            let bytes = self.bytes.ok_or(Unkeyed::Missing)?;
            self.parsed = Some(serde_json::from_slice(bytes).map_err(|_| Unkeyed::Unreadable)?);
        }
        self.parsed.as_mut().ok_or(Unkeyed::Unreadable)
    }
}

/// One simple part of an id: the key, a header, or a JSON field (a string's text, a number as
/// written).
fn part_of<'a, H: Fn(&str) -> Option<&'a [u8]>>(
    record: &RecordView<'a, H>,
    part: &IdSource,
    value: &mut ParsedValue<'a>,
) -> Result<Cow<'a, [u8]>, Unkeyed> {
    match part {
        IdSource::Key => record.key.map(Cow::Borrowed).ok_or(Unkeyed::Missing),
        IdSource::Header(name) => (record.header)(name)
            .map(Cow::Borrowed)
            .ok_or(Unkeyed::Missing),
        IdSource::JsonPointer(pointer) => match value.get()?.pointer(pointer) {
            None | Some(serde_json::Value::Null) => Err(Unkeyed::Missing),
            Some(serde_json::Value::String(s)) => Ok(Cow::Owned(s.clone().into_bytes())),
            Some(serde_json::Value::Number(n)) => Ok(Cow::Owned(n.to_string().into_bytes())),
            Some(_) => Err(Unkeyed::Unreadable),
        },
        IdSource::Composite(_) | IdSource::Fingerprint(_) => Err(Unkeyed::Unreadable),
    }
}

/// The fingerprint id of a parsed value (see [`Fingerprint`]).
fn fingerprint(value: &mut serde_json::Value, spec: &Fingerprint) -> Result<Vec<u8>, Unkeyed> {
    let hashed = match spec {
        Fingerprint::Whole => std::mem::take(value),
        Fingerprint::Without(pointers) => {
            for p in pointers {
                remove_pointer(value, p);
            }
            std::mem::take(value)
        }
        Fingerprint::Of(pointers) => serde_json::Value::Array(
            pointers
                .iter()
                .map(|p| value.pointer(p).cloned().ok_or(Unkeyed::Missing))
                .collect::<Result<_, _>>()?,
        ),
    };
    // Object keys come out sorted: serde_json's map is ordered by key in this build (a test
    // below fails if a dependency ever turns on its insertion order).
    let canonical = serde_json::to_vec(&hashed).map_err(|_| Unkeyed::Unreadable)?;
    let digest = Sha256::digest(&canonical);
    let mut id = String::with_capacity(3 + 32);
    id.push_str("fp:");
    for b in &digest[..16] {
        id.push_str(&format!("{b:02x}"));
    }
    Ok(id.into_bytes())
}

/// Removes the field `pointer` names, if it is there.
fn remove_pointer(value: &mut serde_json::Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(parent) {
        Some(serde_json::Value::Object(map)) => {
            map.remove(&last);
        }
        Some(serde_json::Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < items.len() {
                    items.remove(i);
                }
            }
        }
        _ => {}
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
    fn a_usable_id_is_one_the_ledger_keys() {
        let json = |id: &str| serde_json::to_vec(&serde_json::json!({ "messageId": id })).unwrap();
        let source = IdSource::parse("json:/messageId").unwrap();
        // An id of 1 KiB is one; the empty id and one a byte longer are not, for the reasons
        // the worker gives them.
        let ok = "x".repeat(crate::identity::MAX_ID_BYTES);
        let value = json(&ok);
        assert_eq!(
            usable_message_id(&view(Some(b"user-1"), Some(&value)), &source).as_deref(),
            Ok(ok.as_bytes())
        );
        let value = json("");
        assert_eq!(
            usable_message_id(&view(Some(b"user-1"), Some(&value)), &source),
            Err(Unkeyed::Empty)
        );
        let value = json(&"x".repeat(crate::identity::MAX_ID_BYTES + 1));
        assert_eq!(
            usable_message_id(&view(Some(b"user-1"), Some(&value)), &source),
            Err(Unkeyed::TooLong)
        );
        // message_id itself reads them all: the rule is usable_message_id's and ledger_key's.
        assert_eq!(
            message_id(&view(Some(b"user-1"), Some(&value)), &source)
                .unwrap()
                .len(),
            crate::identity::MAX_ID_BYTES + 1
        );
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

    #[test]
    fn a_composite_joins_its_parts_so_that_no_two_lists_join_alike() {
        let source: IdSource =
            serde_json::from_str(r#"["json:/t", "json:/user", "header:id", "key"]"#).unwrap();
        let v = br#"{"t":1700000000000,"user":"alice"}"#;
        assert_eq!(
            message_id(&view(Some(b"k1"), Some(v)), &source)
                .unwrap()
                .as_ref(),
            b"13:17000000000005:alice6:hdr-id2:k1"
        );
        // "ab" + "c" and "a" + "bc" are different ids.
        let two: IdSource = serde_json::from_str(r#"["json:/a", "json:/b"]"#).unwrap();
        let ab_c = message_id(&view(None, Some(br#"{"a":"ab","b":"c"}"#)), &two).unwrap();
        let a_bc = message_id(&view(None, Some(br#"{"a":"a","b":"bc"}"#)), &two).unwrap();
        assert_ne!(ab_c, a_bc);
        // A missing part leaves the record without an id.
        assert_eq!(
            message_key(&view(None, Some(br#"{"t":1}"#)), &source),
            Err(Unkeyed::Missing)
        );
        // One part is that part alone; a fingerprint cannot be a part.
        let one: IdSource = serde_json::from_str(r#"["json:/t"]"#).unwrap();
        assert_eq!(one, IdSource::JsonPointer("/t".into()));
        assert!(serde_json::from_str::<IdSource>(r#"["json:/t", "fingerprint"]"#).is_err());
        assert!(serde_json::from_str::<IdSource>("[]").is_err());
        // It writes itself back as the list it was read from.
        assert_eq!(
            serde_json::to_string(&source).unwrap(),
            r#"["json:/t","json:/user","header:id","key"]"#
        );
    }

    #[test]
    fn a_fingerprint_ignores_the_fields_left_out_and_the_order_of_keys() {
        let without = IdSource::parse("fingerprint:without:/messageId,/sentAt").unwrap();
        let a = br#"{"messageId":"1","sentAt":"x","event":"click","p":{"b":1,"a":[1,2]}}"#;
        let b = br#"{"p":{"a":[1,2],"b":1},"event":"click","sentAt":"y","messageId":"2"}"#;
        let c = br#"{"messageId":"3","event":"click","p":{"b":2,"a":[1,2]}}"#;
        let id = |v: &[u8], s: &IdSource| message_id(&view(None, Some(v)), s).unwrap().into_owned();
        assert_eq!(id(a, &without), id(b, &without));
        assert_ne!(id(a, &without), id(c, &without));
        assert!(id(a, &without).starts_with(b"fp:"));
        assert_eq!(id(a, &without).len(), 35);
        let whole = IdSource::parse("fingerprint").unwrap();
        assert_ne!(id(a, &whole), id(b, &whole));
        let of = IdSource::parse("fingerprint:of:/event,/p/a").unwrap();
        assert_eq!(id(a, &of), id(c, &of));
        // A record lacking a chosen field has no id (else all such records would share one).
        assert_eq!(
            message_key(&view(None, Some(br#"{"event":"click"}"#)), &of),
            Err(Unkeyed::Missing)
        );
        assert_eq!(
            message_key(&view(None, Some(b"not json")), &whole),
            Err(Unkeyed::Unreadable)
        );
        // An escaped pointer removes the field it names.
        let slash = IdSource::parse("fingerprint:without:/a~1b").unwrap();
        assert_eq!(
            id(br#"{"a/b":1,"c":2}"#, &slash),
            id(br#"{"c":2}"#, &IdSource::parse("fingerprint").unwrap())
        );
        assert!(IdSource::parse("fingerprint:without:").is_err());
        assert!(IdSource::parse("fingerprint:of:event").is_err());
        assert_eq!(
            IdSource::parse("fingerprint:without:/a,/b")
                .unwrap()
                .to_string(),
            "fingerprint:without:/a,/b"
        );
    }
}

//! Reading a record's message id from where [`IdSource`] says it is, and turning it into a ledger
//! key, or saying why it has none.

use std::borrow::Cow;
use std::fmt;

use rdkafka::message::{Headers, Message};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use super::digest::{ContentDigest, DigestSource};
use super::{hashed_key, ledger_key, IdError, LedgerKey};
use crate::json::document::{id_writer, Scalar};
use crate::json::{Document, Unreadable};
use crate::wire::HEADER_CONTENT_DIGEST;

/// Where a record's message id is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdSource {
    /// The record key (the input topic is keyed by message id).
    Key,
    /// A record header with this name.
    Header(String),
    /// A JSON pointer (RFC 6901) into the record value, e.g. `/messageId`: a string's decoded
    /// text, or a number's exact text (its ledger key tagged, see [`NUMBER_ID_TAG`]).
    JsonPointer(String),
    /// Several of the three above, joined: each part's bytes after their length and a colon, or
    /// `#` for a JSON number (`13#1700000000000` then `5:alice`), so that no two different lists
    /// of parts join alike. A missing part leaves the record without an id.
    Composite(Vec<IdSource>),
    /// A hash of the record value's JSON (see [`Fingerprint`]).
    Fingerprint(Fingerprint),
}

/// What of a record value's JSON a fingerprint id hashes: the value is read strictly, the fields
/// chosen (or all but the ones left out, each named in the original document) are written again
/// in one canonical form ([`crate::json::canonical`]: object keys sorted, no white space, numbers
/// as their exact text, strings decoded and written one way), and the id is `fp:` and the first
/// 16 bytes of that text's SHA-256, in hex. Two copies of an event that differ only in the fields
/// left out (a fresh id per retry, a send time) have the same id.
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
    /// No key, no such header, or no such JSON field (or the field is `null`).
    Missing,
    /// The id is empty.
    Empty,
    /// The id is longer than 1 KiB.
    TooLong,
    /// The value is not JSON (or JSON the strict reader refuses: not UTF-8, a byte order mark, a
    /// number out of a double's range, a lone surrogate), or the field is not a string or number.
    Unreadable,
    /// The value has an object with the same key twice: it has no one meaning to read an id from.
    RepeatedKey,
}

impl Unkeyed {
    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Empty => "empty",
            Self::TooLong => "too_long",
            Self::Unreadable => "unreadable",
            Self::RepeatedKey => "repeated_key",
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

impl From<Unreadable> for Unkeyed {
    fn from(e: Unreadable) -> Self {
        match e {
            Unreadable::RepeatedKey => Unkeyed::RepeatedKey,
            Unreadable::NotUtf8 | Unreadable::NotJson(_) => Unkeyed::Unreadable,
        }
    }
}

/// The byte a JSON number id's text is hashed after, so that the number `1001` and the string
/// `"1001"` are two ids: no string's decoded text (UTF-8) starts with it.
pub const NUMBER_ID_TAG: u8 = 0xff;

/// Separates a composite part's length from its bytes: `:` for a key, a header or a JSON
/// string, `#` for a JSON number (`13#1700000000000`), so that a string part never joins like a
/// number part.
const PART_SEPARATOR: u8 = b':';
const NUMBER_PART_SEPARATOR: u8 = b'#';

/// The parts of a record an id can come from: of a Kafka message by [`message_view`], of its copy
/// by [`copied_view`].
pub struct RecordView<'a, H: Fn(&str) -> Option<&'a [u8]>> {
    pub key: Option<&'a [u8]>,
    pub header: H,
    pub value: Option<&'a [u8]>,
}

/// The parts of a Kafka message an id can come from. A header named twice is read from its
/// first occurrence, as [`copied_view`] reads it.
pub fn message_view<'a, M: Message>(
    message: &'a M,
) -> RecordView<'a, impl Fn(&str) -> Option<&'a [u8]> + 'a> {
    let headers = message.headers();
    RecordView {
        key: message.key(),
        header: move |name: &str| {
            headers.and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
        },
        value: message.payload(),
    }
}

/// The parts of a copied Kafka message (its key, its headers in order, its value) an id can come
/// from, read as [`message_view`] reads the message.
pub fn copied_view<'a>(
    key: Option<&'a [u8]>,
    headers: &'a [(String, Option<Vec<u8>>)],
    value: Option<&'a [u8]>,
) -> RecordView<'a, impl Fn(&str) -> Option<&'a [u8]> + 'a> {
    RecordView {
        key,
        header: move |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.as_deref())
        },
        value,
    }
}

/// A record's id and content digest, read once (see [`identify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity<'a> {
    /// The id, or why the record has none.
    pub id: Result<MessageId<'a>, Unkeyed>,
    /// The record's content digest, as the [`DigestSource`] asked says.
    pub digest: Option<ContentDigest>,
}

/// A record's message id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageId<'a> {
    /// The id's bytes: what `dedupe rekey` keys the record by and what tells the partition the id
    /// belongs in. A JSON number's exact text, a JSON string's decoded text.
    pub bytes: Cow<'a, [u8]>,
    /// The ledger key: of the bytes, or for a JSON number of [`NUMBER_ID_TAG`] and the bytes.
    pub key: LedgerKey,
}

/// The ledger key of a record's message id, read as `source` says.
pub fn message_key<'a, H: Fn(&str) -> Option<&'a [u8]>>(
    record: &RecordView<'a, H>,
    source: &IdSource,
) -> Result<LedgerKey, Unkeyed> {
    identify(record, source, DigestSource::None)
        .id
        .map(|id| id.key)
}

/// A record's message id as bytes, read as `source` says ([`MessageId::bytes`]): what `dedupe
/// rekey` keys the record by. Only an id the ledger can key (not empty, at most 1 KiB:
/// [`check_id`](super::check_id)) is one; a record without one keeps its own key there, and the
/// worker finds it unkeyed for the same reason.
pub fn message_id<'a, H: Fn(&str) -> Option<&'a [u8]>>(
    record: &RecordView<'a, H>,
    source: &IdSource,
) -> Result<Cow<'a, [u8]>, Unkeyed> {
    identify(record, source, DigestSource::None)
        .id
        .map(|id| id.bytes)
}

/// A record's message id, read as `source` says, and its content digest, taken as `digests`
/// says, with its value read (strictly, see [`crate::json`]) at most once.
///
/// Without a [`HEADER_CONTENT_DIGEST`] header, a record's content is what makes its id, so that
/// two copies of one event are a `retry` whatever changed between them that the id leaves out:
/// - a fingerprint: the canonical text it hashes (the value less the fields left out, or the
///   fields chosen);
/// - a composite: its joined parts;
/// - any other id: the value's canonical text when it is JSON (key order, white space and
///   escapes never make a retry look changed), else the value's bytes as they are.
pub fn identify<'a, H: Fn(&str) -> Option<&'a [u8]>>(
    record: &RecordView<'a, H>,
    source: &IdSource,
    digests: DigestSource,
) -> Identity<'a> {
    let mut value = Value::new(record.value);
    let mut content = None;
    let id = match source {
        IdSource::Composite(parts) => composite(record, parts, &mut value).and_then(|bytes| {
            content = Some(ContentDigest::of_value(&bytes));
            id_of(Cow::Owned(bytes), false)
        }),
        IdSource::Fingerprint(spec) => value.document().and_then(|doc| {
            let mut text = Vec::with_capacity(doc.text().len());
            canonical_fingerprinted(&doc, spec, &mut text)?;
            content = Some(ContentDigest::of_value(&text));
            id_of(Cow::Owned(fingerprint_id(&text)), false)
        }),
        part => part_of(record, part, &mut value).and_then(|(bytes, number)| id_of(bytes, number)),
    };
    let header = (record.header)(HEADER_CONTENT_DIGEST);
    let digest = digests.digest(header, || match content {
        Some(digest) => digest,
        None => value.content_digest(),
    });
    Identity { id, digest }
}

/// The id of `bytes`, a JSON number's text if `number`.
fn id_of(bytes: Cow<'_, [u8]>, number: bool) -> Result<MessageId<'_>, Unkeyed> {
    let key = if number {
        // The length rule is the text's; the tag only tells the key apart.
        ledger_key(&bytes)?;
        let mut tagged = Vec::with_capacity(1 + bytes.len());
        tagged.push(NUMBER_ID_TAG);
        tagged.extend_from_slice(&bytes);
        hashed_key(&tagged)
    } else {
        ledger_key(&bytes)?
    };
    Ok(MessageId { bytes, key })
}

/// A record value, read strictly once, when first needed.
struct Value<'a> {
    bytes: Option<&'a [u8]>,
    read: Option<Result<Document<'a>, Unreadable>>,
}

impl<'a> Value<'a> {
    fn new(bytes: Option<&'a [u8]>) -> Self {
        Value { bytes, read: None }
    }

    fn document(&mut self) -> Result<Document<'a>, Unkeyed> {
        let bytes = self.bytes.ok_or(Unkeyed::Missing)?;
        let read = *self.read.get_or_insert_with(|| Document::read(bytes));
        Ok(read?)
    }

    /// The digest of the whole value: of its canonical text when it is JSON, else of its bytes.
    fn content_digest(&mut self) -> ContentDigest {
        let bytes = self.bytes.unwrap_or_default();
        match self.document() {
            Ok(doc) => {
                let mut text = Vec::with_capacity(bytes.len());
                doc.canonical(&[], &mut id_writer(), &mut text);
                ContentDigest::of_value(&text)
            }
            Err(_) => ContentDigest::of_value(bytes),
        }
    }
}

/// A composite's parts joined: each part's length, its separator and its bytes.
fn composite<'a, H: Fn(&str) -> Option<&'a [u8]>>(
    record: &RecordView<'a, H>,
    parts: &[IdSource],
    value: &mut Value<'a>,
) -> Result<Vec<u8>, Unkeyed> {
    let mut id = Vec::new();
    for part in parts {
        let (bytes, number) = part_of(record, part, value)?;
        id.extend_from_slice(bytes.len().to_string().as_bytes());
        id.push(if number {
            NUMBER_PART_SEPARATOR
        } else {
            PART_SEPARATOR
        });
        id.extend_from_slice(&bytes);
    }
    Ok(id)
}

/// One simple part of an id: the key, a header, or a JSON field (a string's decoded text, a
/// number's exact text), and whether it is a JSON number.
fn part_of<'a, H: Fn(&str) -> Option<&'a [u8]>>(
    record: &RecordView<'a, H>,
    part: &IdSource,
    value: &mut Value<'a>,
) -> Result<(Cow<'a, [u8]>, bool), Unkeyed> {
    match part {
        IdSource::Key => record
            .key
            .map(|k| (Cow::Borrowed(k), false))
            .ok_or(Unkeyed::Missing),
        IdSource::Header(name) => (record.header)(name)
            .map(|h| (Cow::Borrowed(h), false))
            .ok_or(Unkeyed::Missing),
        IdSource::JsonPointer(pointer) => json_part(&value.document()?, pointer),
        IdSource::Composite(_) | IdSource::Fingerprint(_) => Err(Unkeyed::Unreadable),
    }
}

/// The id bytes of the value `pointer` names in `doc`: a string's decoded text, a number's exact
/// text (and that it is a number).
fn json_part<'a>(doc: &Document<'a>, pointer: &str) -> Result<(Cow<'a, [u8]>, bool), Unkeyed> {
    match doc.scalar(pointer) {
        None | Some(Scalar::Null) => Err(Unkeyed::Missing),
        Some(Scalar::String(Cow::Borrowed(s))) => Ok((Cow::Borrowed(s.as_bytes()), false)),
        Some(Scalar::String(Cow::Owned(s))) => Ok((Cow::Owned(s.into_bytes()), false)),
        Some(Scalar::Number(n)) => Ok((Cow::Borrowed(n.as_bytes()), true)),
        Some(Scalar::Other) => Err(Unkeyed::Unreadable),
    }
}

/// Why a text is not the id of one JSON value ([`json_value_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonValueError {
    /// Not one JSON value the strict reader takes.
    Unreadable(Unreadable),
    /// A value that is no id: `null` ([`Unkeyed::Missing`]), `true`, `false`, an object or an
    /// array ([`Unkeyed::Unreadable`]), an empty string or one longer than 1 KiB.
    NoId(Unkeyed),
}

/// The message id of `text`, the text of one JSON value (`12345678901234567890`, `"abc"`), read
/// strictly and keyed exactly as a `json:` pointer keys the value it names in a record: a
/// string's decoded text, a number's exact text under [`NUMBER_ID_TAG`]. Also whether it is a
/// number. What `dedupe explain --json-id` and `dedupe forget --json-id` ask about.
pub fn json_value_id(text: &str) -> Result<(MessageId<'_>, bool), JsonValueError> {
    let doc = Document::read(text.as_bytes()).map_err(JsonValueError::Unreadable)?;
    // The empty pointer names the whole document, as `json:/id` names the field in a record.
    let (bytes, number) = json_part(&doc, "").map_err(JsonValueError::NoId)?;
    let id = id_of(bytes, number).map_err(JsonValueError::NoId)?;
    Ok((id, number))
}

/// The canonical text a fingerprint hashes (see [`Fingerprint`]) into `out`.
fn canonical_fingerprinted(
    doc: &Document<'_>,
    spec: &Fingerprint,
    out: &mut Vec<u8>,
) -> Result<(), Unkeyed> {
    let mut writer = id_writer();
    match spec {
        Fingerprint::Whole => doc.canonical(&[], &mut writer, out),
        Fingerprint::Without(pointers) => doc.canonical(pointers, &mut writer, out),
        Fingerprint::Of(pointers) => {
            out.push(b'[');
            for (i, p) in pointers.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let field = doc.pointer(p).ok_or(Unkeyed::Missing)?;
                Document::canonical_of(field, &mut writer, out);
            }
            out.push(b']');
        }
    }
    Ok(())
}

/// A fingerprint id: `fp:` and the first 16 bytes of the canonical text's SHA-256, in hex.
fn fingerprint_id(canonical: &[u8]) -> Vec<u8> {
    let digest = Sha256::digest(canonical);
    let mut id = String::with_capacity(3 + 32);
    id.push_str("fp:");
    for b in &digest[..16] {
        id.push_str(&format!("{b:02x}"));
    }
    id.into_bytes()
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
    fn a_message_id_is_only_one_the_ledger_keys() {
        let json = |id: &str| serde_json::to_vec(&serde_json::json!({ "messageId": id })).unwrap();
        let source = IdSource::parse("json:/messageId").unwrap();
        // An id of 1 KiB is one; the empty id and one a byte longer are not, for the reasons the
        // worker gives them (what `dedupe rekey` keys a record by, or not).
        let ok = "x".repeat(crate::identity::MAX_ID_BYTES);
        let value = json(&ok);
        assert_eq!(
            message_id(&view(Some(b"user-1"), Some(&value)), &source).as_deref(),
            Ok(ok.as_bytes())
        );
        let value = json("");
        assert_eq!(
            message_id(&view(Some(b"user-1"), Some(&value)), &source),
            Err(Unkeyed::Empty)
        );
        let value = json(&"x".repeat(crate::identity::MAX_ID_BYTES + 1));
        assert_eq!(
            message_id(&view(Some(b"user-1"), Some(&value)), &source),
            Err(Unkeyed::TooLong)
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
        // A number's key is its text's, tagged: never a string's.
        let num = IdSource::JsonPointer("/n/x".into());
        assert_eq!(
            message_key(&view(None, Some(v)), &num),
            Ok(hashed_key(b"\xff7"))
        );
        assert_eq!(
            message_id(&view(None, Some(v)), &num).unwrap().as_ref(),
            b"7"
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
            b"13#17000000000005:alice6:hdr-id2:k1"
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

    /// The pairs that one number, one id or one fingerprint once hid (through a double, or a
    /// string read like a number): each pair is two values of `{"id": ...}`.
    const DISTINCT: [(&str, &str); 13] = [
        ("12345678901234567890123", "12345678901234567890124"),
        ("-99999999999999999999", "-99999999999999999998"),
        ("4004.1234567890123456", "4004.1234567890123457"),
        ("18446744073709551616", "18446744073709551617"),
        ("-9223372036854775809", "-9223372036854775810"),
        ("0.1", "0.1000000000000000055511151231257827"),
        ("1700000000.123456789", "1700000000.123456788"),
        ("1.0", "1e0"),
        ("1", "1.0"),
        ("0", "-0"),
        (r#""1001""#, "1001"),
        (r#""5""#, "5"),
        ("null", r#""null""#),
    ];

    fn id_of(value: &str, source: &IdSource) -> Result<LedgerKey, Unkeyed> {
        message_key(&view(None, Some(value.as_bytes())), source)
    }

    fn every_source() -> Vec<IdSource> {
        [
            r#""json:/id""#,
            r#"["json:/id", "json:/u"]"#,
            r#""fingerprint""#,
            r#""fingerprint:without:/sentAt""#,
            r#""fingerprint:of:/id""#,
        ]
        .iter()
        .map(|s| serde_json::from_str(s).unwrap())
        .collect()
    }

    #[test]
    fn values_that_differ_as_written_are_different_ids_under_every_source() {
        for source in every_source() {
            for (a, b) in DISTINCT {
                let a = format!(r#"{{"id":{a},"u":"a","sentAt":"1"}}"#);
                let b = format!(r#"{{"id":{b},"u":"a","sentAt":"2"}}"#);
                let (ia, ib) = (id_of(&a, &source), id_of(&b, &source));
                let part = matches!(source, IdSource::JsonPointer(_) | IdSource::Composite(_));
                if part && a.contains(":null") {
                    // A null id (or part) is no id; the string "null" is one.
                    assert_eq!(ia, Err(Unkeyed::Missing));
                    assert!(ib.is_ok());
                    continue;
                }
                assert!(ia.is_ok() && ib.is_ok(), "{source}: {a} {b}");
                assert_ne!(ia, ib, "{source}: {a} and {b} are one id");
            }
        }
    }

    #[test]
    fn key_order_white_space_and_escapes_are_one_id_under_every_source() {
        let a = r#"{"id":"é1","u":"a","sentAt":"1","p":{"x":1.50,"y":[1,{"k":"\/"}]}}"#;
        let b = "{ \"p\" : { \"y\" : [ 1 , { \"k\" : \"/\" } ] , \"x\" : 1.50 } ,\n\t\"u\":\"\\u0061\", \"sentAt\":\"1\", \"\\u0069d\":\"\\u00e91\" }";
        for source in every_source() {
            assert_eq!(id_of(a, &source), id_of(b, &source), "{source}");
            assert!(id_of(a, &source).is_ok());
        }
    }

    #[test]
    fn a_string_id_keeps_its_ledger_key_and_a_number_is_tagged() {
        // A JSON string's key is its decoded text's, as it always was: a UUID `messageId` is
        // the UUID's bytes, whether it came in the key or in the value.
        let uuid = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";
        let json = IdSource::JsonPointer("/id".into());
        assert_eq!(
            id_of(&format!(r#"{{"id":"{uuid}"}}"#), &json),
            message_key(&view(Some(uuid.as_bytes()), None), &IdSource::Key)
        );
        assert_eq!(
            id_of(r#"{"id":"m-1"}"#, &json),
            Ok(ledger_key(b"m-1").unwrap())
        );
        // A number is its exact text after the tag; the text is what partitions and rekeys.
        let big = r#"{"id":12345678901234567890123}"#;
        assert_eq!(
            id_of(big, &json),
            Ok(hashed_key(b"\xff12345678901234567890123"))
        );
        assert_eq!(
            message_id(&view(None, Some(big.as_bytes())), &json)
                .unwrap()
                .as_ref(),
            b"12345678901234567890123"
        );
        // A composite's number part says so in its separator.
        let parts: IdSource = serde_json::from_str(r#"["json:/t", "json:/u"]"#).unwrap();
        let joined = |v: &str| {
            message_id(&view(None, Some(v.as_bytes())), &parts)
                .unwrap()
                .into_owned()
        };
        assert_eq!(joined(r#"{"t":5,"u":"a"}"#), b"1#51:a");
        assert_eq!(joined(r#"{"t":"5","u":"a"}"#), b"1:51:a");
    }

    #[test]
    fn one_json_value_is_keyed_as_a_json_pointer_keys_it_in_a_record() {
        let json = IdSource::JsonPointer("/id".into());
        // The worker's key of `{"id": V}` is the key of V alone, for a number and a string.
        for (value, number) in [
            ("12345678901234567890", true),
            ("-0.5e3", true),
            (r#""12345678901234567890""#, false),
            (r#""abc""#, false),
            (r#""\u0061bc""#, false),
            (r#""6BA7B810-9DAD-11D1-80B4-00C04FD430C8""#, false),
        ] {
            let record = format!(r#"{{"id":{value}}}"#);
            let (id, is_number) = json_value_id(value).unwrap();
            assert_eq!(Ok(id.key), id_of(&record, &json), "{value}");
            assert_eq!(is_number, number, "{value}");
        }
        // The number and the string of the same digits are two ids; the string's is the bare
        // text's, as the worker keys a key or a header.
        let number = json_value_id("12345678901234567890").unwrap().0;
        let string = json_value_id(r#""12345678901234567890""#).unwrap().0;
        assert_ne!(number.key, string.key);
        assert_eq!(string.key, ledger_key(b"12345678901234567890").unwrap());
        assert_eq!(number.bytes.as_ref(), b"12345678901234567890");
        // White space around the value is the document's, not the id's.
        assert_eq!(
            json_value_id(" 42\n").unwrap().0.key,
            json_value_id("42").unwrap().0.key
        );
        assert_eq!(
            json_value_id(r#""\u0061bc""#).unwrap().0.bytes.as_ref(),
            b"abc"
        );
        // What is no id: the strict reader's refusals, and values a record's id cannot be.
        for (text, why) in [
            ("null", JsonValueError::NoId(Unkeyed::Missing)),
            ("true", JsonValueError::NoId(Unkeyed::Unreadable)),
            ("[1]", JsonValueError::NoId(Unkeyed::Unreadable)),
            (r#""""#, JsonValueError::NoId(Unkeyed::Empty)),
        ] {
            assert_eq!(json_value_id(text).map(|_| ()), Err(why), "{text}");
        }
        for text in ["abc", "1e400", "1 2", "", "'a'", "01"] {
            assert!(
                matches!(json_value_id(text), Err(JsonValueError::Unreadable(_))),
                "{text}"
            );
        }
    }

    #[test]
    fn what_the_strict_reader_refuses_follows_the_unkeyed_policy() {
        for source in every_source() {
            for (value, why) in [
                (&br#"{"id":1,"id":2}"#[..], Unkeyed::RepeatedKey),
                (
                    br#"{"id":1,"u":"a","p":{"q":1,"q":1}}"#,
                    Unkeyed::RepeatedKey,
                ),
                (b"\xef\xbb\xbf{\"id\":1,\"u\":\"a\"}", Unkeyed::Unreadable),
                (b"{\"id\":\"\xff\",\"u\":\"a\"}", Unkeyed::Unreadable),
                (br#"{"id":1e400,"u":"a"}"#, Unkeyed::Unreadable),
                (br#"{"id":"\ud800","u":"a"}"#, Unkeyed::Unreadable),
                (b"not json", Unkeyed::Unreadable),
                (b"", Unkeyed::Unreadable),
            ] {
                assert_eq!(
                    message_key(&view(None, Some(value)), &source),
                    Err(why),
                    "{source}: {value:?}"
                );
            }
        }
        // Two objects with a repeated key whose last values agree are not one fingerprint: they
        // have no fingerprint.
        assert_eq!(
            id_of(r#"{"a":1,"a":2}"#, &IdSource::parse("fingerprint").unwrap()),
            Err(Unkeyed::RepeatedKey)
        );
        // Empty, 2 KB, an object, a boolean: as before.
        let json = IdSource::JsonPointer("/id".into());
        assert_eq!(id_of(r#"{"id":""}"#, &json), Err(Unkeyed::Empty));
        let long = format!(r#"{{"id":"{}"}}"#, "x".repeat(2048));
        assert_eq!(id_of(&long, &json), Err(Unkeyed::TooLong));
        let long = format!(r#"{{"id":0.{}}}"#, "9".repeat(2048));
        assert_eq!(id_of(&long, &json), Err(Unkeyed::TooLong));
        assert_eq!(id_of(r#"{"id":{}}"#, &json), Err(Unkeyed::Unreadable));
        assert_eq!(id_of(r#"{"id":true}"#, &json), Err(Unkeyed::Unreadable));
        assert_eq!(id_of(r#"{"id":null}"#, &json), Err(Unkeyed::Missing));
        assert_eq!(id_of(r#"{}"#, &json), Err(Unkeyed::Missing));
    }

    #[test]
    fn fields_left_out_are_the_ones_named_in_the_original_document() {
        let without = IdSource::parse("fingerprint:without:/a/0,/a/1").unwrap();
        let whole = IdSource::parse("fingerprint").unwrap();
        // Elements 0 and 1 go (not 0 and 2): what is left is [2].
        assert_eq!(
            id_of(r#"{"a":[0,1,2]}"#, &without),
            id_of(r#"{"a":[2]}"#, &whole)
        );
        let reversed = IdSource::parse("fingerprint:without:/a/1,/a/0").unwrap();
        assert_eq!(
            id_of(r#"{"a":[0,1,2]}"#, &reversed),
            id_of(r#"{"a":[2]}"#, &whole)
        );
    }

    #[test]
    fn fingerprints_of_strings_integers_and_literals_are_the_ones_serde_json_made() {
        // The canonical text is serde_json's own for such values, so their fingerprints did
        // not change with the exact reading.
        let value = r#"{"messageId":"x","event":"click","userId":"é\u00e9","n":-42,"big":18446744073709551615,"ok":true,"z":null,"p":{"b":[1,"\n"],"a":{}}}"#;
        let serde =
            serde_json::to_vec(&serde_json::from_str::<serde_json::Value>(value).unwrap()).unwrap();
        assert_eq!(
            id_of(value, &IdSource::parse("fingerprint").unwrap()),
            Ok(ledger_key(&fingerprint_id(&serde)).unwrap())
        );
    }

    fn identity(value: &[u8], source: &IdSource) -> (Result<LedgerKey, Unkeyed>, ContentDigest) {
        let i = identify(
            &RecordView {
                key: Some(b"k"),
                header: |_: &str| None,
                value: Some(value),
            },
            source,
            DigestSource::HeaderOrValue,
        );
        (i.id.map(|id| id.key), i.digest.unwrap())
    }

    #[test]
    fn a_retry_has_its_first_copys_digest_under_every_source() {
        // What a retry may change: the fields a fingerprint leaves out, key order, white space,
        // escapes.
        let first =
            r#"{"messageId":"a1","sentAt":"t1","event":"click","p":{"x":"é","y":1}}"#.as_bytes();
        let retry =
            b"{ \"p\":{\"y\":1, \"x\":\"\\u00e9\"}, \"event\":\"click\", \"sentAt\":\"t2\", \"messageId\":\"a2\" }";
        let other =
            r#"{"messageId":"a3","sentAt":"t3","event":"click","p":{"x":"é","y":2}}"#.as_bytes();
        let without = IdSource::parse("fingerprint:without:/messageId,/sentAt").unwrap();
        let (id1, d1) = identity(first, &without);
        let (id2, d2) = identity(retry, &without);
        assert_eq!((id1, d1), (id2, d2));
        assert_ne!(identity(other, &without).0, id1);
        // A fingerprint of some fields: those fields make the digest.
        let of = IdSource::parse("fingerprint:of:/event,/p/x").unwrap();
        assert_eq!(identity(first, &of), identity(retry, &of));
        assert_eq!(identity(first, &of), identity(other, &of));
        // A composite: its parts make the digest.
        let parts: IdSource = serde_json::from_str(r#"["json:/event", "json:/p/x"]"#).unwrap();
        assert_eq!(identity(first, &parts), identity(other, &parts));
        // The key or a JSON field: the value's canonical text, so key order, white space and
        // escapes do not change it, and another value does.
        let same_id = |v: &[u8]| {
            String::from_utf8(v.to_vec())
                .unwrap()
                .replace("a2", "a1")
                .replace("t2", "t1")
        };
        for source in [IdSource::Key, IdSource::JsonPointer("/event".into())] {
            let (_, d1) = identity(first, &source);
            assert_eq!(identity(same_id(retry).as_bytes(), &source).1, d1);
            assert_ne!(identity(other, &source).1, d1, "{source}");
        }
        // A value that is canonical already keeps the digest of its bytes (as before this
        // reading); one that is not JSON is hashed as it is.
        let canonical = br#"{"a":1,"b":"x"}"#;
        assert_eq!(
            identity(canonical, &IdSource::Key).1,
            ContentDigest::of_value(canonical)
        );
        assert_eq!(
            identity(b"\x00not json", &IdSource::Key).1,
            ContentDigest::of_value(b"\x00not json")
        );
        // The front door's header wins, as before.
        let i = identify(
            &RecordView {
                key: Some(b"k"),
                header: |name: &str| {
                    (name == HEADER_CONTENT_DIGEST).then_some(b"abcd000000000001".as_slice())
                },
                value: Some(first),
            },
            &without,
            DigestSource::HeaderOrValue,
        );
        assert_eq!(i.digest, ContentDigest::of_header(b"abcd000000000001"));
    }
}

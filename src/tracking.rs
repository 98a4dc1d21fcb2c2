//! The Segment-compatible tracking API's pure logic: write keys and authentication, the endpoints
//! (long names and the browser and mobile libraries' one-letter ones), the content types taken as
//! JSON, body decoding (gzip, size limits), parsing and validation of
//! `track`/`identify`/`page`/`screen`/`group`/`alias` and `batch` requests, merging a batch's shared
//! fields into its messages, message identity, the record key, and the settings document
//! analytics.js loads. It knows nothing of HTTP servers or Kafka; `dedupe-actors`' `ingest` drives
//! it.
//!
//! Guarantee: a request is taken whole or not at all. [`Envelope::into_messages`] either returns
//! every message of the request ready for Kafka, or one [`Rejection`] naming the first problem;
//! one bad message rejects the whole request, so nothing is ever half-accepted.
//!
//! Merging: a batch's top-level `context` and `integrations` are deep-merged into each message
//! (objects merge key by key, recursively; wherever both have a value the message's own wins, an
//! explicit `null` included), and a top-level `sentAt` is copied into messages that have none.
//! `writeKey` is removed from every message: it is a secret and never reaches Kafka.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Most bytes of one message as the client sent it (Segment's documented limit: 32 KB).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// Most bytes of a request body, after decompression (Segment's documented limit: 500 KB).
pub const MAX_REQUEST_BYTES: usize = 500 * 1024;
/// Most messages in one request. Segment's libraries send at most a few hundred; a batch of
/// minimal valid messages under [`MAX_REQUEST_BYTES`] holds about 5,000.
pub const MAX_BATCH_EVENTS: usize = 5_000;
/// Most bytes a batch's messages may come to once its shared `context`, `integrations` and
/// `sentAt` are merged into each of them, reckoned before anything is merged: the sum over its
/// messages of their own size plus the shared fields' size. Four times [`MAX_REQUEST_BYTES`], so
/// a small shared context over a full batch passes, while a large one repeated over thousands of
/// messages is refused without being copied once.
pub const MAX_MERGED_BYTES: usize = 4 * MAX_REQUEST_BYTES;
/// Most bytes of a record value produced to Kafka: a message within [`MAX_MESSAGE_BYTES`] after
/// merging, plus the fields this service sets (`messageId` of at most [`MAX_MESSAGE_ID_BYTES`],
/// `type`, `receivedAt`).
pub const MAX_RECORD_BYTES: usize = MAX_MESSAGE_BYTES + 1024;
/// Most bytes of a client's `messageId`; with a source name of at most [`MAX_SOURCE_BYTES`] the
/// record key stays well under the 1 KiB the worker accepts as an id.
pub const MAX_MESSAGE_ID_BYTES: usize = 256;
/// Most bytes of a source name.
pub const MAX_SOURCE_BYTES: usize = 128;
/// The environment variable holding write keys as `KEY=SOURCE,KEY2=SOURCE2`.
pub const ENV_WRITE_KEYS: &str = "DEDUPE_WRITE_KEYS";
/// The record header naming the source a message came from.
pub const HEADER_SOURCE: &str = "dedupe-source";
/// Separates the source from the message id in a record key. Source names may not contain it, so
/// two sources' ids never make the same key.
pub const KEY_SEPARATOR: char = ':';

/// The kinds of message the tracking API takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Track,
    Identify,
    Page,
    Screen,
    Group,
    Alias,
}

impl EventType {
    pub const ALL: [EventType; 6] = [Self::Track, Self::Identify, Self::Page, Self::Screen, Self::Group, Self::Alias];

    /// The name used in the `type` field and in the endpoint's path.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Track => "track",
            Self::Identify => "identify",
            Self::Page => "page",
            Self::Screen => "screen",
            Self::Group => "group",
            Self::Alias => "alias",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }
}

/// The endpoint a request was posted to: `/v1/<type>` for one message, `/v1/batch` for many.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Single(EventType),
    Batch,
}

impl Endpoint {
    /// The endpoint for the last path segment: `track`, ..., `batch`, the one-letter names
    /// Segment's browser library (`t`, `i`, `p`, `s`, `g`, `a`: the type's first letter) and its
    /// batching mode and the mobile libraries (`b`) post to, or `import`, the batch endpoint's
    /// older name, which the Java, Ruby and .NET libraries post to.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "batch" | "b" | "import" => Some(Self::Batch),
            "t" => Some(Self::Single(EventType::Track)),
            "i" => Some(Self::Single(EventType::Identify)),
            "p" => Some(Self::Single(EventType::Page)),
            "s" => Some(Self::Single(EventType::Screen)),
            "g" => Some(Self::Single(EventType::Group)),
            "a" => Some(Self::Single(EventType::Alias)),
            _ => EventType::parse(name).map(Self::Single),
        }
    }

    /// The endpoint's name, as used in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Single(t) => t.as_str(),
            Self::Batch => "batch",
        }
    }
}

/// Where in a request a problem is: the single message, or one item of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location(pub Option<usize>);

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(i) => write!(f, "batch[{i}]"),
            None => f.write_str("the message"),
        }
    }
}

/// Why a request is refused with 400. The message names the problem and where it is; it never
/// quotes the payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("the request body is over the limit of {limit} bytes")]
    RequestTooLarge { limit: usize },
    #[error("Content-Type `{0}` is not supported (send JSON as application/json or text/plain, or no Content-Type)")]
    UnsupportedContentType(String),
    #[error("Content-Encoding `{0}` is not supported (send gzip or no encoding)")]
    UnsupportedEncoding(String),
    #[error("the gzip body cannot be decompressed: {0}")]
    BadGzip(String),
    #[error("the body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("the body must be a JSON object")]
    NotAnObject,
    #[error("`writeKey` must be a string")]
    BadWriteKey,
    #[error("`batch` is missing or is not an array")]
    BatchNotArray,
    #[error("`batch` is empty")]
    EmptyBatch,
    #[error("{at}: is not a JSON object")]
    MessageNotObject { at: Location },
    #[error("{at}: `type` is missing")]
    MissingType { at: Location },
    #[error("{at}: `type` is not one of track, identify, page, screen, group, alias")]
    UnknownType { at: Location },
    #[error("{at}: a track message needs an `event` name")]
    MissingEvent { at: Location },
    #[error("{at}: needs a `userId` or an `anonymousId`")]
    MissingIdentity { at: Location },
    #[error("{at}: an alias message needs `previousId` and `userId`")]
    MissingAliasIds { at: Location },
    #[error("{at}: a group message needs a `groupId`")]
    MissingGroupId { at: Location },
    #[error("{at}: `messageId` must be a non-empty string of at most {MAX_MESSAGE_ID_BYTES} bytes without control characters")]
    BadMessageId { at: Location },
    #[error("{at}: is {bytes} bytes; the limit per message is {MAX_MESSAGE_BYTES} bytes")]
    MessageTooLarge { at: Location, bytes: usize },
    #[error("{at}: is {bytes} bytes once the batch's `context`, `integrations` and `sentAt` are merged into it; the limit per message is {MAX_MESSAGE_BYTES} bytes")]
    MergedMessageTooLarge { at: Location, bytes: usize },
    #[error("`batch` has {count} messages; the limit is {MAX_BATCH_EVENTS}")]
    TooManyEvents { count: usize },
    #[error("the batch's messages would come to at least {bytes} bytes once its shared `context`, `integrations` and `sentAt` are merged into each; the limit is {MAX_MERGED_BYTES} bytes")]
    MergedBatchTooLarge { bytes: usize },
}

impl Rejection {
    /// A short stable name for the problem: the `reason` label of the rejection counter and the
    /// `code` field of the error body.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::RequestTooLarge { .. } => "request_too_large",
            Self::UnsupportedContentType(_) => "unsupported_content_type",
            Self::UnsupportedEncoding(_) => "unsupported_encoding",
            Self::BadGzip(_) => "bad_gzip",
            Self::MalformedJson(_) => "malformed_json",
            Self::NotAnObject => "not_an_object",
            Self::BadWriteKey => "bad_write_key",
            Self::BatchNotArray => "batch_not_array",
            Self::EmptyBatch => "empty_batch",
            Self::MessageNotObject { .. } => "message_not_object",
            Self::MissingType { .. } => "missing_type",
            Self::UnknownType { .. } => "unknown_type",
            Self::MissingEvent { .. } => "missing_event",
            Self::MissingIdentity { .. } => "missing_identity",
            Self::MissingAliasIds { .. } => "missing_alias_ids",
            Self::MissingGroupId { .. } => "missing_group_id",
            Self::BadMessageId { .. } => "bad_message_id",
            Self::MessageTooLarge { .. } => "message_too_large",
            Self::MergedMessageTooLarge { .. } => "merged_message_too_large",
            Self::TooManyEvents { .. } => "too_many_events",
            Self::MergedBatchTooLarge { .. } => "merged_batch_too_large",
        }
    }
}

/// Why a request is refused with 401. Never names the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("a write key is required: HTTP Basic auth with the key as user name, or `writeKey` in the body")]
    Missing,
    #[error("the Authorization header is not HTTP Basic auth with a write key as user name")]
    Malformed,
    #[error("the write key is not known")]
    Unknown,
}

impl AuthError {
    /// The `reason` label and `code` field for this refusal.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing => "missing_write_key",
            Self::Malformed => "malformed_authorization",
            Self::Unknown => "unknown_write_key",
        }
    }
}

/// Why the write keys could not be loaded. Never quotes a key.
#[derive(Debug, thiserror::Error)]
pub enum WriteKeysError {
    #[error("cannot read the write keys file {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{origin}, entry {entry}: {message}")]
    Invalid { origin: String, entry: usize, message: String },
    #[error("no write keys: set ingest.write_keys_file (--write-keys-file) or {ENV_WRITE_KEYS}")]
    Empty,
}

/// The write keys and the source each one stands for. `Debug` lists sources, never keys.
#[derive(Clone, Default)]
pub struct WriteKeys {
    sources: HashMap<String, String>,
}

impl fmt::Debug for WriteKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sources: Vec<&str> = self.sources.values().map(String::as_str).collect();
        sources.sort_unstable();
        f.debug_struct("WriteKeys").field("keys", &self.sources.len()).field("sources", &sources).finish()
    }
}

impl WriteKeys {
    /// Loads keys from the file (`KEY SOURCE` per line, `#` comments, blank lines ignored) and
    /// from the environment's `KEY=SOURCE,...`; both may be given. Having none is an error.
    pub fn load(file: Option<&Path>, env: Option<&str>) -> Result<Self, WriteKeysError> {
        let mut keys = Self::default();
        if let Some(path) = file {
            let text =
                std::fs::read_to_string(path).map_err(|source| WriteKeysError::Read { path: path.to_path_buf(), source })?;
            keys.add_file(&path.display().to_string(), &text)?;
        }
        if let Some(text) = env {
            keys.add_env(text)?;
        }
        if keys.sources.is_empty() {
            return Err(WriteKeysError::Empty);
        }
        Ok(keys)
    }

    /// Adds the `KEY SOURCE` lines of a write keys file; `origin` names it in errors.
    pub fn add_file(&mut self, origin: &str, text: &str) -> Result<(), WriteKeysError> {
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(key), Some(source), None) = (words.next(), words.next(), words.next()) else {
                return Err(invalid(origin, i + 1, "must be `KEY SOURCE`"));
            };
            self.add(origin, i + 1, key, source)?;
        }
        Ok(())
    }

    /// Adds `KEY=SOURCE,KEY2=SOURCE2` as `DEDUPE_WRITE_KEYS` holds them.
    pub fn add_env(&mut self, text: &str) -> Result<(), WriteKeysError> {
        for (i, entry) in text.split(',').map(str::trim).enumerate().filter(|(_, e)| !e.is_empty()) {
            let Some((key, source)) = entry.split_once('=') else {
                return Err(invalid(ENV_WRITE_KEYS, i + 1, "must be `KEY=SOURCE`"));
            };
            self.add(ENV_WRITE_KEYS, i + 1, key.trim(), source.trim())?;
        }
        Ok(())
    }

    fn add(&mut self, origin: &str, entry: usize, key: &str, source: &str) -> Result<(), WriteKeysError> {
        if key.is_empty() {
            return Err(invalid(origin, entry, "the key is empty"));
        }
        if source.is_empty() || source.len() > MAX_SOURCE_BYTES {
            return Err(invalid(origin, entry, format!("the source must be 1 to {MAX_SOURCE_BYTES} bytes")));
        }
        if source.contains(KEY_SEPARATOR) || source.chars().any(char::is_control) {
            return Err(invalid(origin, entry, format!("the source must not contain `{KEY_SEPARATOR}` or control characters")));
        }
        if self.sources.insert(key.to_string(), source.to_string()).is_some() {
            return Err(invalid(origin, entry, "repeats a write key given earlier"));
        }
        Ok(())
    }

    /// The source `key` stands for, if it is known.
    pub fn source(&self, key: &str) -> Option<&str> {
        self.sources.get(key).map(String::as_str)
    }

    /// Every source a key stands for (a source with two keys appears twice).
    pub fn sources(&self) -> impl Iterator<Item = &str> {
        self.sources.values().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.sources.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// The source a request is from: the key in the `Authorization` header (HTTP Basic, key as
    /// user name; the password is ignored) if there is one, else `writeKey` from the body.
    pub fn authenticate(&self, authorization: Option<&str>, body_key: Option<&str>) -> Result<&str, AuthError> {
        let key = match authorization {
            Some(header) => Cow::Owned(basic_auth_user(header)?),
            None => Cow::Borrowed(body_key.ok_or(AuthError::Missing)?),
        };
        if key.is_empty() {
            return Err(AuthError::Missing);
        }
        self.source(&key).ok_or(AuthError::Unknown)
    }
}

fn invalid(origin: &str, entry: usize, message: impl Into<String>) -> WriteKeysError {
    WriteKeysError::Invalid { origin: origin.to_string(), entry, message: message.into() }
}

/// The user name of an HTTP Basic `Authorization` header value.
pub fn basic_auth_user(header: &str) -> Result<String, AuthError> {
    let header = header.trim();
    let (scheme, encoded) = header.split_once(' ').ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(AuthError::Malformed);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| AuthError::Malformed)?;
    let text = String::from_utf8(decoded).map_err(|_| AuthError::Malformed)?;
    let (user, _password) = text.split_once(':').ok_or(AuthError::Malformed)?;
    Ok(user.to_string())
}

/// Checks a request's `Content-Type`: JSON is taken as `application/json`, as `text/plain` (what
/// Segment's browser library and `navigator.sendBeacon` send, because a text body needs no CORS
/// preflight), or with no type at all; parameters such as `charset` are ignored. The type shown in
/// a refusal is cut short and stripped of control characters.
pub fn check_content_type(content_type: Option<&str>) -> Result<(), Rejection> {
    let Some(value) = content_type else { return Ok(()) };
    let essence = value.split(';').next().unwrap_or("").trim();
    if essence.is_empty() || ["application/json", "text/plain"].iter().any(|t| essence.eq_ignore_ascii_case(t)) {
        return Ok(());
    }
    let shown: String = essence.chars().filter(|c| !c.is_control()).take(64).collect();
    Err(Rejection::UnsupportedContentType(shown))
}

/// The settings document Segment's browser library loads from
/// `<cdnURL>/v1/projects/<writeKey>/settings` before anything else: just enough to send every event
/// to `api_host` (`host[:port][/prefix]/v1`) over `protocol`, with no other destination, no
/// middleware and the library's own telemetry to Segment turned off.
pub fn settings_document(write_key: &str, api_host: &str, protocol: &str) -> Value {
    serde_json::json!({
        "integrations": {
            "Segment.io": {
                "apiKey": write_key,
                "apiHost": api_host,
                "protocol": protocol,
                "unbundledIntegrations": [],
                "addBundledMetadata": true,
                "maybeBundledConfigIds": {},
            }
        },
        "plan": {
            "track": { "__default": { "enabled": true, "integrations": {} } },
            "identify": { "__default": { "enabled": true } },
            "group": { "__default": { "enabled": true } },
        },
        "edgeFunction": {},
        "analyticsNextEnabled": true,
        "middlewareSettings": {},
        "enabledMiddleware": {},
        "metrics": { "sampleRate": 0 },
        "legacyVideoPluginsEnabled": false,
        "remotePlugins": [],
    })
}

/// The request body as JSON bytes: decompressed when `Content-Encoding` is gzip, and never more
/// than [`MAX_REQUEST_BYTES`] either way. Decompression stops one byte past the limit, so a small
/// gzip bomb cannot make a large buffer.
pub fn decode_body<'a>(raw: &'a [u8], content_encoding: Option<&str>) -> Result<Cow<'a, [u8]>, Rejection> {
    let too_large = Rejection::RequestTooLarge { limit: MAX_REQUEST_BYTES };
    if raw.len() > MAX_REQUEST_BYTES {
        return Err(too_large);
    }
    let encoding = content_encoding.map(|e| e.trim().to_ascii_lowercase()).unwrap_or_default();
    match encoding.as_str() {
        "" | "identity" => Ok(Cow::Borrowed(raw)),
        "gzip" | "x-gzip" => {
            let mut out = Vec::with_capacity(raw.len() * 4);
            flate2::read::MultiGzDecoder::new(raw)
                .take(MAX_REQUEST_BYTES as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| Rejection::BadGzip(e.to_string()))?;
            if out.len() > MAX_REQUEST_BYTES {
                return Err(too_large);
            }
            Ok(Cow::Owned(out))
        }
        other => Err(Rejection::UnsupportedEncoding(other.to_string())),
    }
}

/// A request body that is a well-formed JSON object, before authentication and validation.
/// A batch's messages are kept as the text the client sent until they are validated, so each
/// one's size is what it was sent as, measured without serializing it again.
#[derive(Debug, Clone)]
pub struct Envelope<'a> {
    endpoint: Endpoint,
    /// The body's fields, except `writeKey` and a batch's `batch`.
    body: Map<String, Value>,
    /// A batch's `batch`, each message as sent.
    batch: Option<BatchField<'a>>,
    /// The body's size as sent.
    sent_bytes: usize,
    write_key: Option<String>,
}

/// One message ready for Kafka.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The client's `messageId`, or a UUIDv4 assigned here.
    pub message_id: String,
    pub event_type: EventType,
    /// The message as JSON: what the client sent, merged, with `messageId`, `type` and
    /// `receivedAt` set and `writeKey` removed.
    pub value: Vec<u8>,
}

/// The top level of a body: every field parsed, except a batch's `batch`, whose messages are
/// kept as text. The body is read once: the array is split into its messages as it is parsed.
struct TopLevel<'a> {
    fields: Map<String, Value>,
    batch: Option<BatchField<'a>>,
}

/// A batch's `batch` field: its messages as sent, or the sign that it was not an array.
#[derive(Debug, Clone)]
enum BatchField<'a> {
    Messages(Vec<&'a RawValue>),
    NotArray,
}

impl<'de> Deserialize<'de> for BatchField<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Items;
        impl<'de> Visitor<'de> for Items {
            type Value = BatchField<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(32).min(MAX_BATCH_EVENTS));
                while let Some(item) = seq.next_element::<&'de RawValue>()? {
                    items.push(item);
                }
                Ok(BatchField::Messages(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(BatchField::NotArray)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(BatchField::NotArray)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(BatchField::NotArray)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(BatchField::NotArray)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(BatchField::NotArray)
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(BatchField::NotArray)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(BatchField::NotArray)
            }
        }
        deserializer.deserialize_any(Items)
    }
}

impl<'de> Deserialize<'de> for TopLevel<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = TopLevel<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut top = TopLevel { fields: Map::new(), batch: None };
                while let Some(name) = map.next_key::<String>()? {
                    // As with any JSON object here, the last of two same-named fields wins.
                    if name == "batch" {
                        top.fields.remove("batch");
                        top.batch = Some(map.next_value()?);
                    } else {
                        let value = map.next_value()?;
                        top.fields.insert(name, value);
                    }
                }
                Ok(top)
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

impl<'a> Envelope<'a> {
    /// Parses a decoded body. Only checks that it is a JSON object (with a string `writeKey`, if
    /// any), so a client learns nothing more about its payload before it is authenticated.
    pub fn parse(endpoint: Endpoint, body: &'a [u8]) -> Result<Self, Rejection> {
        if body.len() > MAX_REQUEST_BYTES {
            return Err(Rejection::RequestTooLarge { limit: MAX_REQUEST_BYTES });
        }
        let (mut fields, batch) = match endpoint {
            Endpoint::Batch => match serde_json::from_slice::<TopLevel<'a>>(body) {
                Ok(top) => (top.fields, top.batch),
                Err(e) => return Err(not_an_object_or_malformed(body, e)),
            },
            Endpoint::Single(_) => match serde_json::from_slice::<Value>(body) {
                Ok(Value::Object(fields)) => (fields, None),
                Ok(_) => return Err(Rejection::NotAnObject),
                Err(e) => return Err(Rejection::MalformedJson(e.to_string())),
            },
        };
        let write_key = match fields.remove("writeKey") {
            None | Some(Value::Null) => None,
            Some(Value::String(k)) => Some(k),
            Some(_) => return Err(Rejection::BadWriteKey),
        };
        Ok(Self { endpoint, body: fields, batch, sent_bytes: body.len(), write_key })
    }

    /// The `writeKey` the body carried, if any.
    pub fn write_key(&self) -> Option<&str> {
        self.write_key.as_deref()
    }

    /// Validates every message and makes it ready for Kafka, all or nothing.
    pub fn into_messages(self, received_at: SystemTime) -> Result<Vec<Message>, Rejection> {
        let received_at = Value::String(rfc3339_millis(received_at));
        match self.endpoint {
            Endpoint::Single(event_type) => {
                let at = Location(None);
                let mut body = self.body;
                let own = check_size(at, self.sent_bytes)?;
                // The path says what the message is.
                body.insert("type".into(), Value::String(event_type.as_str().into()));
                Ok(vec![finish(at, body, &received_at, own)?])
            }
            Endpoint::Batch => {
                let body = self.body;
                let items = match self.batch {
                    Some(BatchField::Messages(items)) => items,
                    Some(BatchField::NotArray) | None => return Err(Rejection::BatchNotArray),
                };
                if items.is_empty() {
                    return Err(Rejection::EmptyBatch);
                }
                if items.len() > MAX_BATCH_EVENTS {
                    return Err(Rejection::TooManyEvents { count: items.len() });
                }
                let shared = Shared::from_batch(&body);
                // What merging would make, bounded before anything is copied: the work and memory
                // a request can cause stay proportional to its size.
                let shared_bytes = shared.serialized_bytes();
                let mut merged_bound = 0usize;
                for (i, item) in items.iter().enumerate() {
                    let at = Location(Some(i));
                    if !item.get().starts_with('{') {
                        return Err(Rejection::MessageNotObject { at });
                    }
                    let own = check_size(at, item.get().len())?;
                    merged_bound = merged_bound.saturating_add(own + shared_bytes);
                }
                if merged_bound > MAX_MERGED_BYTES {
                    return Err(Rejection::MergedBatchTooLarge { bytes: merged_bound });
                }
                let spliced = Spliced::new(&shared, &received_at);
                let mut out = Vec::with_capacity(items.len());
                for (i, raw) in items.into_iter().enumerate() {
                    let at = Location(Some(i));
                    let bound = raw.get().len() + shared_bytes;
                    if bound <= MAX_MESSAGE_BYTES {
                        if let Some(message) = spliced.message(raw.get()) {
                            out.push(message);
                            continue;
                        }
                    }
                    out.push(tree_message(at, raw.get(), &shared, shared_bytes, &received_at)?);
                }
                Ok(out)
            }
        }
    }
}

/// One message of a batch made ready through a parsed tree: any message, valid or not.
fn tree_message(at: Location, raw: &str, shared: &Shared<'_>, shared_bytes: usize, received_at: &Value) -> Result<Message, Rejection> {
    let mut item: Map<String, Value> = serde_json::from_str(raw).map_err(|e| Rejection::MalformedJson(e.to_string()))?;
    item.remove("writeKey");
    let bound = raw.len() + shared_bytes;
    if shared_bytes > 0 {
        shared.merge_into(&mut item);
        // Merging adds at most `shared_bytes`, so only a message that may now be over the limit
        // is measured again.
        if bound > MAX_MESSAGE_BYTES {
            let merged = serialized_bytes(&item);
            if merged > MAX_MESSAGE_BYTES {
                return Err(Rejection::MergedMessageTooLarge { at, bytes: merged });
            }
        }
    }
    finish(at, item, received_at, bound)
}

/// Why a body that is not a parseable object was refused: valid JSON of another kind, or not JSON.
fn not_an_object_or_malformed(body: &[u8], e: serde_json::Error) -> Rejection {
    if e.classify() == serde_json::error::Category::Data && serde_json::from_slice::<IgnoredAny>(body).is_ok() {
        Rejection::NotAnObject
    } else {
        Rejection::MalformedJson(e.to_string())
    }
}

/// The fields of a batch that apply to each of its messages.
struct Shared<'a> {
    context: Option<&'a Map<String, Value>>,
    integrations: Option<&'a Map<String, Value>>,
    sent_at: Option<&'a Value>,
}

impl<'a> Shared<'a> {
    fn from_batch(body: &'a Map<String, Value>) -> Self {
        Self {
            context: body.get("context").and_then(Value::as_object),
            integrations: body.get("integrations").and_then(Value::as_object),
            sent_at: body.get("sentAt").filter(|v| !v.is_null()),
        }
    }

    /// At most what merging adds to one message: the shared values and their names.
    fn serialized_bytes(&self) -> usize {
        let objects = [self.context, self.integrations].into_iter().flatten().map(|o| serialized_bytes(o) + 24);
        let sent_at = self.sent_at.map_or(0, |v| serde_json::to_string(v).map_or(0, |t| t.len()) + 16);
        objects.sum::<usize>() + sent_at
    }

    fn merge_into(&self, item: &mut Map<String, Value>) {
        for (name, shared) in [("context", self.context), ("integrations", self.integrations)] {
            if let Some(shared) = shared {
                merge_defaults(item, name, shared);
            }
        }
        if let Some(sent_at) = self.sent_at {
            item.entry("sentAt").or_insert_with(|| sent_at.clone());
        }
    }
}

/// A batch's valid messages made ready without parsing them into a tree: the fields that
/// validation needs are read in place, and what this service adds (`receivedAt`, a `messageId`
/// when there is none, the batch's shared fields the message lacks) is appended to the text the
/// client sent. A message this cannot take as it is (one that is invalid, carries `writeKey` or a
/// field this service sets, needs a deep merge, or repeats a field) gets `None`, and goes the
/// tree's way, which refuses it with its reason or makes the same record.
struct Spliced {
    received_at: String,
    /// Each shared field the batch has, serialized once: its name, and its value.
    shared: Vec<(&'static str, String)>,
}

/// The fields of a message that validation reads, kept as sent. A field that is present, even
/// as `null`, is `Some`.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Validated<'a> {
    #[serde(rename = "type", borrow, default, deserialize_with = "present")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    event: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    user_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    anonymous_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    previous_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    group_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    message_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    received_at: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    write_key: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    context: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    integrations: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    sent_at: Option<&'a RawValue>,
}

/// A field's value as sent, `null` included.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(deserializer).map(Some)
}

/// The text of a JSON string without escapes, or `None`.
fn plain_str(raw: &RawValue) -> Option<&str> {
    let text = raw.get().strip_prefix('"')?.strip_suffix('"')?;
    (!text.contains('\\')).then_some(text)
}

/// Like [`has_id`]: a non-empty string or a number.
fn raw_has_id(raw: Option<&RawValue>) -> bool {
    raw.is_some_and(|r| {
        let t = r.get();
        (t.starts_with('"') && t != "\"\"") || t.starts_with(|c: char| c == '-' || c.is_ascii_digit())
    })
}

impl Spliced {
    fn new(shared: &Shared<'_>, received_at: &Value) -> Self {
        let mut fields = Vec::new();
        let named = [
            ("context", shared.context.map(serde_json::to_string)),
            ("integrations", shared.integrations.map(serde_json::to_string)),
            ("sentAt", shared.sent_at.map(serde_json::to_string)),
        ];
        for (name, text) in named {
            if let Some(Ok(text)) = text {
                fields.push((name, text));
            }
        }
        Self { received_at: received_at.to_string(), shared: fields }
    }

    fn message(&self, raw: &str) -> Option<Message> {
        if !parses_as_skimmed(raw) {
            return None;
        }
        let v: Validated<'_> = serde_json::from_str(raw).ok()?;
        if v.write_key.is_some() || v.received_at.is_some() {
            return None;
        }
        let has_shared = |name: &str| match name {
            "context" => v.context.is_some(),
            "integrations" => v.integrations.is_some(),
            _ => v.sent_at.is_some(),
        };
        if self.shared.iter().any(|(name, _)| has_shared(name)) {
            return None;
        }
        let event_type = EventType::parse(plain_str(v.kind?)?)?;
        let valid = match event_type {
            EventType::Alias => raw_has_id(v.previous_id) && raw_has_id(v.user_id),
            _ => raw_has_id(v.user_id) || raw_has_id(v.anonymous_id),
        } && match event_type {
            EventType::Track => v.event.is_some_and(|e| e.get().starts_with('"') && e.get() != "\"\""),
            EventType::Group => raw_has_id(v.group_id),
            _ => true,
        };
        if !valid {
            return None;
        }
        let (message_id, assigned) = match v.message_id {
            None => (uuid::Uuid::new_v4().to_string(), true),
            Some(id) => (plain_str(id).filter(|id| valid_message_id(id))?.to_string(), false),
        };
        // The message is an object (checked before): its text ends with its closing brace.
        let open = raw.strip_suffix('}')?.trim_end();
        let mut value = Vec::with_capacity(raw.len() + 128 + self.shared.iter().map(|(n, t)| n.len() + t.len() + 4).sum::<usize>());
        value.extend_from_slice(open.as_bytes());
        let mut field = |name: &str, text: &str| {
            if value.len() > 1 {
                value.push(b',');
            }
            value.push(b'"');
            value.extend_from_slice(name.as_bytes());
            value.extend_from_slice(b"\":");
            value.extend_from_slice(text.as_bytes());
        };
        if assigned {
            field("messageId", &format!("\"{message_id}\""));
        }
        field("receivedAt", &self.received_at);
        for (name, text) in &self.shared {
            field(name, text);
        }
        value.push(b'}');
        (value.len() <= MAX_RECORD_BYTES).then_some(Message { message_id, event_type, value })
    }
}

/// Nesting deeper than this is left to the tree, which refuses it past serde_json's limit (128).
const SKIMMED_MAX_DEPTH: usize = 64;

/// Whether a message that serde_json skimmed without complaint (as a `RawValue`, and its fields
/// as `RawValue`s or ignored) would also pass a full parse, as far as can be told cheaply. A skim
/// checks the syntax only; a full parse also refuses nesting over 128 levels, a number too large
/// for an f64 and a `\u` escape that is half of a surrogate pair. A message with nesting over
/// [`SKIMMED_MAX_DEPTH`], a number with an exponent or over 40 characters, or a lone surrogate is
/// left to the tree, which takes it or refuses it exactly as `/v1/track` would the same message:
/// a batch cannot slip in what a single message cannot (text that strict parsers downstream
/// reject).
fn parses_as_skimmed(raw: &str) -> bool {
    let b = raw.as_bytes();
    let hex = |at: usize| b.get(at..at + 4).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u16::from_str_radix(h, 16).ok());
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                loop {
                    let Some(at) = b.get(i..).and_then(|rest| memchr::memchr2(b'"', b'\\', rest)) else { return false };
                    i += at;
                    if b[i] == b'"' {
                        break;
                    }
                    if b.get(i + 1) != Some(&b'u') {
                        i += 2;
                        continue;
                    }
                    match hex(i + 2) {
                        Some(0xD800..=0xDBFF) => {
                            let pair = b.get(i + 6..i + 8) == Some(&b"\\u"[..]) && matches!(hex(i + 8), Some(0xDC00..=0xDFFF));
                            if !pair {
                                return false;
                            }
                            i += 12;
                        }
                        Some(0xDC00..=0xDFFF) | None => return false,
                        Some(_) => i += 6,
                    }
                }
                i += 1;
            }
            b'{' | b'[' => {
                depth += 1;
                if depth > SKIMMED_MAX_DEPTH {
                    return false;
                }
                i += 1;
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < b.len() && matches!(b[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                    i += 1;
                }
                let number = &b[start..i];
                if number.len() > 40 || number.iter().any(|c| matches!(c, b'e' | b'E')) {
                    return false;
                }
            }
            _ => i += 1,
        }
    }
    true
}

/// Deep-merges `defaults` into `target[name]`: keys missing from the target are added, objects on
/// both sides are merged recursively, and any other value the target has wins.
fn merge_defaults(target: &mut Map<String, Value>, name: &str, defaults: &Map<String, Value>) {
    match target.get_mut(name) {
        None => {
            target.insert(name.to_string(), Value::Object(defaults.clone()));
        }
        Some(Value::Object(own)) => {
            for (k, v) in defaults {
                match (own.get_mut(k), v) {
                    (None, _) => {
                        own.insert(k.clone(), v.clone());
                    }
                    (Some(Value::Object(_)), Value::Object(inner)) => merge_defaults(own, k, inner),
                    (Some(_), _) => {}
                }
            }
        }
        // The message's own non-object value (null included) wins.
        Some(_) => {}
    }
}

/// Refuses a message over [`MAX_MESSAGE_BYTES`] as the client sent it; returns its size.
fn check_size(at: Location, bytes: usize) -> Result<usize, Rejection> {
    if bytes > MAX_MESSAGE_BYTES {
        return Err(Rejection::MessageTooLarge { at, bytes });
    }
    Ok(bytes)
}

/// Counts the bytes a JSON object serializes to, without building the text.
fn serialized_bytes(item: &Map<String, Value>) -> usize {
    struct Count(usize);
    impl io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing JSON to a counter cannot fail.
    let _ = serde_json::to_writer(&mut count, item);
    count.0
}

/// Validates one message and gives it its id and `receivedAt`. `bytes` is about what the message
/// serializes to (its size as sent, plus what merging may have added), so the record's buffer is
/// allocated once.
fn finish(at: Location, mut item: Map<String, Value>, received_at: &Value, bytes: usize) -> Result<Message, Rejection> {
    let event_type = match item.get("type") {
        None | Some(Value::Null) => return Err(Rejection::MissingType { at }),
        Some(Value::String(t)) => EventType::parse(t).ok_or(Rejection::UnknownType { at })?,
        Some(_) => return Err(Rejection::UnknownType { at }),
    };
    match event_type {
        EventType::Alias => {
            if !has_id(&item, "previousId") || !has_id(&item, "userId") {
                return Err(Rejection::MissingAliasIds { at });
            }
        }
        _ => {
            if !has_id(&item, "userId") && !has_id(&item, "anonymousId") {
                return Err(Rejection::MissingIdentity { at });
            }
        }
    }
    match event_type {
        EventType::Track if item.get("event").and_then(Value::as_str).is_none_or(str::is_empty) => {
            return Err(Rejection::MissingEvent { at })
        }
        EventType::Group if !has_id(&item, "groupId") => return Err(Rejection::MissingGroupId { at }),
        _ => {}
    }
    let message_id = match item.get("messageId") {
        None | Some(Value::Null) => {
            let id = uuid::Uuid::new_v4().to_string();
            item.insert("messageId".into(), Value::String(id.clone()));
            id
        }
        Some(Value::String(id)) if valid_message_id(id) => id.clone(),
        Some(_) => return Err(Rejection::BadMessageId { at }),
    };
    item.insert("receivedAt".into(), received_at.clone());
    // With room for the fields set here: `messageId`, `type` and `receivedAt`.
    let mut value = Vec::with_capacity(bytes + 128);
    serde_json::to_writer(&mut value, &item).expect("a JSON map always serializes");
    // The limit holds on what is produced, whatever was added on the way.
    if value.len() > MAX_RECORD_BYTES {
        return Err(Rejection::MergedMessageTooLarge { at, bytes: value.len() });
    }
    Ok(Message { message_id, event_type, value })
}

/// A `messageId` becomes part of the record key: 1 to [`MAX_MESSAGE_ID_BYTES`] bytes, and no
/// control character (CR, LF, NUL...) that would reach logs, keys and downstream tools.
fn valid_message_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_MESSAGE_ID_BYTES && !id.chars().any(char::is_control)
}

/// True if `item[name]` is a non-empty string or a number (Segment accepts numeric ids).
fn has_id(item: &Map<String, Value>, name: &str) -> bool {
    match item.get(name) {
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Number(_)) => true,
        _ => false,
    }
}

/// The record key of a message: `<source>:<messageId>`. Source names cannot contain the
/// separator, so two sources' ids never make the same key.
pub fn record_key(source: &str, message_id: &str) -> String {
    let mut key = String::with_capacity(source.len() + 1 + message_id.len());
    key.push_str(source);
    key.push(KEY_SEPARATOR);
    key.push_str(message_id);
    key
}

/// Milliseconds since the Unix epoch (0 for times before it).
pub fn unix_millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// `t` as RFC 3339 in UTC with milliseconds, e.g. `2024-02-29T13:05:09.042Z`.
pub fn rfc3339_millis(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    fn keys() -> WriteKeys {
        let mut k = WriteKeys::default();
        k.add_file("test", "# comment\n\nkey-a web   # the website\nkey-b ios\n").unwrap();
        k
    }

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn messages(endpoint: &str, body: &str) -> Result<Vec<Message>, Rejection> {
        Envelope::parse(Endpoint::from_name(endpoint).unwrap(), body.as_bytes())?.into_messages(at(0))
    }

    fn json(m: &Message) -> Value {
        serde_json::from_slice(&m.value).unwrap()
    }

    fn basic(user_and_password: &str) -> String {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(user_and_password))
    }

    #[test]
    fn write_keys_file_and_env() {
        let k = keys();
        assert_eq!(k.source("key-a"), Some("web"));
        assert_eq!(k.source("key-b"), Some("ios"));
        assert_eq!(k.source("web"), None);
        let mut k = WriteKeys::default();
        k.add_env(" k1=s1, k2 = s2 ,").unwrap();
        assert_eq!((k.source("k1"), k.source("k2"), k.len()), (Some("s1"), Some("s2"), 2));
    }

    #[test]
    fn write_key_errors_never_quote_the_key() {
        let mut k = WriteKeys::default();
        let err = k.add_file("f", "secret-1 web\nsecret-1 ios\n").unwrap_err().to_string();
        assert_eq!(err, "f, entry 2: repeats a write key given earlier");
        let err = WriteKeys::default().add_file("f", "secret-2\n").unwrap_err().to_string();
        assert!(!err.contains("secret-2"), "{err}");
        // A colon in a source would let two sources' keys collide.
        let err = WriteKeys::default().add_env("secret-3=a:b").unwrap_err().to_string();
        assert!(err.contains("must not contain `:`") && !err.contains("secret-3"), "{err}");
        assert!(matches!(WriteKeys::load(None, Some(" , ")), Err(WriteKeysError::Empty)));
        assert!(!format!("{:?}", keys()).contains("key-a"));
    }

    #[test]
    fn write_keys_load_merges_file_and_env() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "key-a web").unwrap();
        let k = WriteKeys::load(Some(f.path()), Some("key-c=server")).unwrap();
        assert_eq!((k.source("key-a"), k.source("key-c")), (Some("web"), Some("server")));
        assert!(matches!(WriteKeys::load(Some(Path::new("/nonexistent/keys")), None), Err(WriteKeysError::Read { .. })));
    }

    #[test]
    fn authentication() {
        let k = keys();
        // Basic auth: the key is the user name, the password is empty.
        assert_eq!(k.authenticate(Some(&basic("key-a:")), None), Ok("web"));
        // The header wins over the body.
        assert_eq!(k.authenticate(Some(&basic("key-a:")), Some("key-b")), Ok("web"));
        assert_eq!(k.authenticate(Some(&basic("nope:")), Some("key-b")), Err(AuthError::Unknown));
        // Without a header, the body's writeKey.
        assert_eq!(k.authenticate(None, Some("key-b")), Ok("ios"));
        assert_eq!(k.authenticate(None, Some("key-x")), Err(AuthError::Unknown));
        assert_eq!(k.authenticate(None, None), Err(AuthError::Missing));
        assert_eq!(k.authenticate(Some(&basic(":")), None), Err(AuthError::Missing));
        assert_eq!(k.authenticate(Some("Bearer key-a"), None), Err(AuthError::Malformed));
        assert_eq!(k.authenticate(Some("Basic !!!"), None), Err(AuthError::Malformed));
        assert_eq!(k.authenticate(Some(&basic("key-a")), None), Err(AuthError::Malformed));
    }

    #[test]
    fn single_message_takes_type_from_path_and_gets_id_and_received_at() {
        let m = messages("track", r#"{"userId":"u1","event":"Bought","type":"identify","writeKey":"key-a","timestamp":"2020-01-01T00:00:00Z"}"#).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].event_type, EventType::Track);
        let v = json(&m[0]);
        assert_eq!(v["type"], "track");
        assert_eq!(v["receivedAt"], "1970-01-01T00:00:00.000Z");
        // The timestamp is kept as sent; the key is not stored.
        assert_eq!(v["timestamp"], "2020-01-01T00:00:00Z");
        assert!(v.get("writeKey").is_none());
        // No messageId was sent, so a UUIDv4 is assigned.
        let id = uuid::Uuid::parse_str(&m[0].message_id).unwrap();
        assert_eq!(id.get_version_num(), 4);
        assert_eq!(v["messageId"], m[0].message_id.as_str());
    }

    #[test]
    fn batch_splits_keeps_ids_and_merges_shared_fields() {
        let body = r#"{
            "batch": [
                {"type":"track","event":"A","userId":"u","messageId":"m1","context":{"ip":"1.2.3.4","library":{"name":"own"}}},
                {"type":"identify","anonymousId":"x","messageId":"m2","sentAt":"own-sent","context":null},
                {"type":"page","userId":"u"}
            ],
            "context": {"library":{"name":"shared","version":"1"},"locale":"de"},
            "integrations": {"All": false},
            "sentAt": "batch-sent",
            "writeKey": "key-a"
        }"#;
        let m = messages("batch", body).unwrap();
        assert_eq!(m.iter().map(|m| m.event_type).collect::<Vec<_>>(), [EventType::Track, EventType::Identify, EventType::Page]);
        assert_eq!((m[0].message_id.as_str(), m[1].message_id.as_str()), ("m1", "m2"));
        let first = json(&m[0]);
        // Deep merge: the message's own library name wins, the shared version and locale fill in.
        assert_eq!(first["context"], serde_json::json!({"ip":"1.2.3.4","library":{"name":"own","version":"1"},"locale":"de"}));
        assert_eq!(first["integrations"], serde_json::json!({"All": false}));
        assert_eq!(first["sentAt"], "batch-sent");
        // The second message's explicit null context and own sentAt win.
        let second = json(&m[1]);
        assert_eq!(second["context"], Value::Null);
        assert_eq!(second["sentAt"], "own-sent");
        // The third had no context at all, so it gets the shared one whole.
        assert_eq!(json(&m[2])["context"]["locale"], "de");
        assert_ne!(m[2].message_id, "");
    }

    #[test]
    fn validation_names_the_problem() {
        let cases: &[(&str, &str, &str)] = &[
            ("batch", "{not json", "malformed_json"),
            ("batch", "[1]", "not_an_object"),
            ("batch", r#"{"batch":[]}"#, "empty_batch"),
            ("batch", r#"{"batch":{}}"#, "batch_not_array"),
            ("batch", r#"{"writeKey":5,"batch":[]}"#, "bad_write_key"),
            ("batch", r#"{"batch":[7]}"#, "message_not_object"),
            ("batch", r#"{"batch":[{"userId":"u","event":"e"}]}"#, "missing_type"),
            ("batch", r#"{"batch":[{"type":"purchase","userId":"u"}]}"#, "unknown_type"),
            ("track", r#"{"userId":"u"}"#, "missing_event"),
            ("track", r#"{"userId":"u","event":""}"#, "missing_event"),
            ("identify", r#"{"traits":{}}"#, "missing_identity"),
            ("page", r#"{"userId":""}"#, "missing_identity"),
            ("alias", r#"{"userId":"u"}"#, "missing_alias_ids"),
            ("group", r#"{"userId":"u"}"#, "missing_group_id"),
            ("screen", r#"{"userId":"u","messageId":5}"#, "bad_message_id"),
            ("screen", r#"{"userId":"u","messageId":""}"#, "bad_message_id"),
        ];
        for (endpoint, body, reason) in cases {
            let err = messages(endpoint, body).unwrap_err();
            assert_eq!(err.reason(), *reason, "{endpoint} {body}: {err}");
        }
        // Numeric ids are accepted, and alias needs no anonymousId.
        messages("identify", r#"{"userId":42}"#).unwrap();
        messages("alias", r#"{"userId":"u","previousId":"p"}"#).unwrap();
        messages("group", r#"{"anonymousId":"a","groupId":"g"}"#).unwrap();
    }

    #[test]
    fn spliced_messages_are_the_tree_s_messages() {
        let received_at = Value::String(rfc3339_millis(at(1_000)));
        let shared_bodies = [
            r#"{}"#,
            r#"{"context":{"library":{"name":"l"},"ip":"1.2.3.4"},"integrations":{"All":true},"sentAt":"2024-01-01T00:00:00.000Z"}"#,
            r#"{"context":5,"sentAt":null}"#,
        ];
        let items = [
            // Taken in place: valid, nothing to merge into.
            (r#"{"type":"track","event":"e","userId":"u","messageId":"m-1","properties":{"a":[1,{"b":null}]}}"#, true),
            (r#" { "type" : "identify" , "anonymousId" : 7 , "messageId" : "m-2" } "#, true),
            (r#"{"type":"alias","userId":"u","previousId":"p"}"#, true),
            (r#"{"type":"group","userId":"u","groupId":-3,"messageId":"é-✓"}"#, true),
            (r#"{"type":"page","userId":"u","x":"q\"uote\\\\"}"#, true),
            // Left to the tree: what this service sets or removes, escapes it would have to
            // decode, and anything invalid.
            (r#"{"type":"track","event":"e","userId":"u","writeKey":"k"}"#, false),
            (r#"{"type":"track","event":"e","userId":"u","receivedAt":"then"}"#, false),
            (r#"{"type":"track","event":"e","userId":"u","messageId":null}"#, false),
            (r#"{"type":"track","event":"e","userId":"u","messageId":"a\u0041"}"#, false),
            (r#"{"type":"tr\u0061ck","event":"e","userId":"u"}"#, false),
            (r#"{"type":"track","type":"track","event":"e","userId":"u"}"#, false),
            (r#"{"type":"track","event":"","userId":"u"}"#, false),
            (r#"{"type":"group","userId":"u","groupId":""}"#, false),
            (r#"{"type":"alias","userId":"u"}"#, false),
            (r#"{"type":"track","event":"e","userId":"u","messageId":"a\tb"}"#, false),
        ];
        for shared_body in shared_bodies {
            let body: Map<String, Value> = serde_json::from_str(shared_body).unwrap();
            let shared = Shared::from_batch(&body);
            let spliced = Spliced::new(&shared, &received_at);
            for (item, plain) in items {
                let raw: &RawValue = serde_json::from_str(item).unwrap();
                let tree = tree_message(Location(Some(0)), raw.get(), &shared, shared.serialized_bytes(), &received_at);
                let Some(fast) = spliced.message(raw.get()) else {
                    // Plain messages are left to the tree only for a shared field they have.
                    let item: Value = serde_json::from_str(item).unwrap();
                    let clash = ["context", "integrations", "sentAt"].iter().any(|f| item.get(f).is_some());
                    assert!(!plain || clash, "{item} under {shared_body}");
                    continue;
                };
                assert!(plain, "{item} under {shared_body} was taken in place");
                let tree = tree.unwrap();
                let (fast_json, mut tree_json): (Value, Value) =
                    (serde_json::from_slice(&fast.value).unwrap(), serde_json::from_slice(&tree.value).unwrap());
                assert_eq!((fast.event_type, !fast.message_id.is_empty()), (tree.event_type, true));
                if fast.message_id != tree.message_id {
                    // Both assigned a UUIDv4 of their own.
                    assert!(uuid::Uuid::parse_str(&fast.message_id).is_ok() && uuid::Uuid::parse_str(&tree.message_id).is_ok());
                    tree_json["messageId"] = Value::String(fast.message_id.clone());
                }
                assert_eq!(fast_json["messageId"], Value::String(fast.message_id.clone()));
                assert_eq!(fast_json, tree_json, "{item} under {shared_body}");
            }
        }
    }

    #[test]
    fn a_batch_refuses_what_a_single_message_route_refuses() {
        // Text a skim of the JSON passes and a full parse refuses: the same verdict in a batch
        // (where messages are skimmed) as on /v1/track (where the body is parsed).
        let deep = |n: usize| format!(r#"{{"a":{}{}}}"#, "[".repeat(n), "]".repeat(n));
        let refused = [
            r#"{"x":1e999}"#.to_string(),
            r#"{"x":[-1E+400]}"#.to_string(),
            r#"{"x":"\ud800"}"#.to_string(),
            r#"{"x":"\ud800\u0041"}"#.to_string(),
            r#"{"x":"a\udc00"}"#.to_string(),
            format!(r#"{{"x":{}}}"#, "9".repeat(400)),
            // Cut off after an escape's backslash: refused, not a slice past the end.
            r#""a"#.to_string(),
            deep(200),
            deep(5000),
        ];
        let taken = [
            r#"{"x":1e300,"y":-2.5E-400,"z":12345678901234567890123}"#.to_string(),
            r#"{"x":"\ud83d\ude00 \u00e9 \\ud800"}"#.to_string(),
            deep(60),
            deep(100),
        ];
        let single = |properties: &str| format!(r#"{{"event":"e","userId":"u","messageId":"m","properties":{properties}}}"#);
        let batch = |properties: &str| format!(r#"{{"batch":[{{"type":"track","event":"e","userId":"u","messageId":"m","properties":{properties}}}]}}"#);
        for properties in &refused {
            let alone = messages("track", &single(properties)).unwrap_err();
            let in_batch = messages("batch", &batch(properties)).unwrap_err();
            assert_eq!((alone.reason(), in_batch.reason()), ("malformed_json", "malformed_json"), "{properties:.80}");
        }
        for properties in &taken {
            let alone = json(&messages("track", &single(properties)).unwrap()[0]);
            let in_batch = json(&messages("batch", &batch(properties)).unwrap()[0]);
            assert_eq!(alone["properties"], in_batch["properties"], "{properties:.80}");
        }
        // Plain text, a valid surrogate pair and moderate nesting are still taken in place.
        for text in [r#"{"x":"\ud83d\ude00","n":[1,-2.5,{"m":0}]}"#.to_string(), deep(60)] {
            assert!(parses_as_skimmed(&text), "{text:.80}");
        }
        for text in &refused {
            assert!(!parses_as_skimmed(text), "{text:.80}");
        }
    }

    #[test]
    fn one_bad_message_rejects_the_whole_batch_and_says_where() {
        let err = messages("batch", r#"{"batch":[{"type":"track","event":"e","userId":"u"},{"type":"track","userId":"u"}]}"#)
            .unwrap_err();
        assert_eq!(err, Rejection::MissingEvent { at: Location(Some(1)) });
        assert_eq!(err.to_string(), "batch[1]: a track message needs an `event` name");
    }

    #[test]
    fn message_and_request_limits() {
        // A message just under 32 KB passes; one just over is refused, wherever it is.
        let pad = |n: usize| format!(r#"{{"type":"track","event":"e","userId":"u","p":"{}"}}"#, "x".repeat(n));
        let overhead = pad(0).len();
        let fits = pad(MAX_MESSAGE_BYTES - overhead);
        assert_eq!(fits.len(), MAX_MESSAGE_BYTES);
        messages("batch", &format!(r#"{{"batch":[{fits}]}}"#)).unwrap();
        let over = pad(MAX_MESSAGE_BYTES - overhead + 1);
        let err = messages("batch", &format!(r#"{{"batch":[{fits},{over}]}}"#)).unwrap_err();
        assert_eq!(err, Rejection::MessageTooLarge { at: Location(Some(1)), bytes: MAX_MESSAGE_BYTES + 1 });
        assert_eq!(messages("track", &over).unwrap_err().reason(), "message_too_large");
        // The size is the message's as sent, spaces included, as the libraries measure it.
        let spaced = fits.replacen(r#""type":"track","#, r#""type": "track", "#, 1);
        let err = messages("batch", &format!(r#"{{"batch":[{spaced}]}}"#)).unwrap_err();
        assert_eq!(err, Rejection::MessageTooLarge { at: Location(Some(0)), bytes: MAX_MESSAGE_BYTES + 2 });
        // Of two `batch` fields, the last counts, as of any two same-named fields.
        let err = messages("batch", r#"{"batch":[{"type":"track","event":"e","userId":"u"}],"batch":{}}"#).unwrap_err();
        assert_eq!(err, Rejection::BatchNotArray);
        assert_eq!(messages("batch", r#"{"batch":{},"batch":[{"type":"track","event":"e","userId":"u"}]}"#).unwrap().len(), 1);
        // Sixteen messages of 32 KB are over 500 KB.
        let items = vec![fits; 16].join(",");
        let err = messages("batch", &format!(r#"{{"batch":[{items}]}}"#)).unwrap_err();
        assert_eq!(err, Rejection::RequestTooLarge { limit: MAX_REQUEST_BYTES });
        assert!(decode_body(&vec![b' '; MAX_REQUEST_BYTES + 1], None).is_err());
    }

    #[test]
    fn a_shared_context_cannot_amplify_a_batch() {
        // 250 KB of context over 1,000 small messages would be 250 MB once merged: refused from
        // the sizes alone, before a single copy is made.
        let context = format!(r#"{{"blob":"{}"}}"#, "c".repeat(250 << 10));
        let event = r#"{"type":"track","event":"e","userId":"u"}"#;
        let body = format!(r#"{{"context":{context},"batch":[{}]}}"#, vec![event; 1000].join(","));
        assert!(body.len() < MAX_REQUEST_BYTES);
        let err = messages("batch", &body).unwrap_err();
        assert!(matches!(err, Rejection::MergedBatchTooLarge { bytes } if bytes > 200 << 20), "{err:?}");
        assert_eq!(err.reason(), "merged_batch_too_large");
        // The same context over one message still makes a message over 32 KB: refused too.
        let one = format!(r#"{{"context":{context},"batch":[{event}]}}"#);
        let err = messages("batch", &one).unwrap_err();
        assert!(matches!(err, Rejection::MergedMessageTooLarge { at: Location(Some(0)), .. }), "{err:?}");
    }

    #[test]
    fn limits_hold_on_the_merged_messages_that_are_produced() {
        // Each message is 20 KB and the shared context 20 KB: each passes alone, none merged.
        let context = format!(r#"{{"page":{{"title":"{}"}}}}"#, "t".repeat(20 << 10));
        let event = format!(r#"{{"type":"track","event":"e","userId":"u","properties":{{"p":"{}"}}}}"#, "p".repeat(20 << 10));
        let err = messages("batch", &format!(r#"{{"context":{context},"batch":[{event}]}}"#)).unwrap_err();
        assert!(matches!(err, Rejection::MergedMessageTooLarge { at: Location(Some(0)), bytes } if bytes > MAX_MESSAGE_BYTES), "{err:?}");
        // A small context over a full batch is fine, and every record stays within the limit.
        let small = r#"{"library":{"name":"analytics-python","version":"2.3.3"}}"#;
        let event = r#"{"type":"track","event":"e","userId":"u"}"#;
        let ok = messages("batch", &format!(r#"{{"context":{small},"batch":[{}]}}"#, vec![event; 2000].join(","))).unwrap();
        assert_eq!(ok.len(), 2000);
        assert!(ok.iter().all(|m| m.value.len() <= MAX_RECORD_BYTES && json(m)["context"]["library"]["name"] == "analytics-python"));
    }

    #[test]
    fn a_batch_has_at_most_the_event_limit() {
        let event = r#"{"type":"track","event":"e","userId":"u"}"#;
        messages("batch", &format!(r#"{{"batch":[{}]}}"#, vec![event; MAX_BATCH_EVENTS].join(","))).unwrap();
        let err = messages("batch", &format!(r#"{{"batch":[{}]}}"#, vec![event; MAX_BATCH_EVENTS + 1].join(","))).unwrap_err();
        assert_eq!(err, Rejection::TooManyEvents { count: MAX_BATCH_EVENTS + 1 });
        assert_eq!(err.reason(), "too_many_events");
    }

    #[test]
    fn message_ids_with_control_characters_are_refused() {
        for id in [r"a\r\nb", r"a\u0000b", r"tab\there", r"\u007f", r"\u0085"] {
            let body = format!(r#"{{"type":"track","event":"e","userId":"u","messageId":"{id}"}}"#);
            assert_eq!(messages("track", &body).unwrap_err(), Rejection::BadMessageId { at: Location(None) }, "{id}");
        }
        // Unicode that is not a control character is fine.
        let ok = messages("track", r#"{"type":"track","event":"e","userId":"u","messageId":"é-✓-1"}"#).unwrap();
        assert_eq!(ok[0].message_id, "é-✓-1");
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn gzip_bodies_and_bombs() {
        let body = br#"{"batch":[{"type":"track","event":"e","userId":"u"}]}"#;
        assert_eq!(decode_body(&gzip(body), Some("gzip")).unwrap().as_ref(), body);
        assert_eq!(decode_body(body, None).unwrap().as_ref(), body);
        // 10 MB of spaces compress to about 10 KB; the limit holds on the decompressed size.
        let bomb = gzip(&vec![b' '; 10 << 20]);
        assert!(bomb.len() < MAX_REQUEST_BYTES);
        assert_eq!(decode_body(&bomb, Some("gzip")).unwrap_err(), Rejection::RequestTooLarge { limit: MAX_REQUEST_BYTES });
        assert_eq!(decode_body(b"not gzip", Some("gzip")).unwrap_err().reason(), "bad_gzip");
        assert_eq!(decode_body(body, Some("br")).unwrap_err().reason(), "unsupported_encoding");
    }

    #[test]
    fn one_letter_endpoints_are_the_same_endpoints() {
        let aliases = [("t", "track"), ("i", "identify"), ("p", "page"), ("s", "screen"), ("g", "group"), ("a", "alias"), ("b", "batch"), ("import", "batch")];
        for (short, long) in aliases {
            assert_eq!(Endpoint::from_name(short), Endpoint::from_name(long), "{short}");
            assert!(Endpoint::from_name(short).is_some(), "{short}");
        }
        // A one-letter path takes its type from the letter, as the long one does.
        let m = messages("p", r#"{"type": "track", "anonymousId": "a", "name": "Home"}"#).unwrap();
        assert_eq!(json(&m[0])["type"], "page");
        assert_eq!(Endpoint::from_name("x"), None);
        assert_eq!(Endpoint::from_name("tr"), None);
    }

    #[test]
    fn json_is_taken_as_application_json_text_plain_or_untyped() {
        for ok in [None, Some("application/json"), Some("text/plain"), Some("text/plain;charset=UTF-8"), Some("Application/JSON; charset=utf-8"), Some("")] {
            assert_eq!(check_content_type(ok), Ok(()), "{ok:?}");
        }
        let err = check_content_type(Some("application/x-www-form-urlencoded")).unwrap_err();
        assert_eq!(err.reason(), "unsupported_content_type");
        assert!(err.to_string().contains("application/x-www-form-urlencoded"), "{err}");
        let err = check_content_type(Some(&format!("multipart/form-data\u{7}{}", "x".repeat(200)))).unwrap_err();
        let Rejection::UnsupportedContentType(shown) = err else { panic!() };
        assert!(shown.len() == 64 && !shown.contains('\u{7}'), "{shown}");
    }

    #[test]
    fn the_settings_document_points_the_library_back_here() {
        let doc = settings_document("key-a", "127.0.0.1:8080/v1", "http");
        let segment = &doc["integrations"]["Segment.io"];
        assert_eq!((segment["apiKey"].as_str(), segment["apiHost"].as_str(), segment["protocol"].as_str()), (Some("key-a"), Some("127.0.0.1:8080/v1"), Some("http")));
        // Segment.io is the only destination, and the library reports nothing to Segment.
        assert_eq!(doc["integrations"].as_object().unwrap().len(), 1);
        assert_eq!(doc["metrics"]["sampleRate"], 0);
    }

    #[test]
    fn record_keys_and_times() {
        assert_eq!(record_key("web", "m-1"), "web:m-1");
        assert_eq!(rfc3339_millis(at(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_millis(at(951_782_400_000)), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_millis(at(1_709_211_909_042)), "2024-02-29T13:05:09.042Z");
        assert_eq!(rfc3339_millis(at(4_102_444_799_999)), "2099-12-31T23:59:59.999Z");
    }
}

//! The front door: the Segment-compatible tracking API, `dedupe ingest`. Its server
//! ([`server`]: the actix-web routes, admission, the producer to the input and dead-letter
//! topics, answers, metrics and logs, CORS, and what bounds every connection) over its pure
//! logic: write keys and authentication ([`auth`]), the content types taken as JSON and body
//! decoding ([`body`]), requests and their events ([`envelope`], [`event`]) over JSON kept as
//! sent ([`json`]), the settings document analytics.js loads ([`settings`]), and the per-source
//! token buckets ([`rate_limit`]). The pure modules know nothing of HTTP, Kafka or the core; only
//! [`server`] does. The worker is another crate (`dedupe-actors`); the `dedupe` binary
//! (`dedupe-cli`) starts this crate's [`server::serve`] for `dedupe ingest`.
//!
//! Guarantee: a valid event is never lost or altered because of another event. A request whose
//! body can be read (valid JSON, within the size limits) yields every valid event ready for Kafka
//! and every invalid one with its problem named and its text kept, so the caller can log it to
//! the dead-letter topic ([`Envelope::into_events`]); only a body that cannot be read at all is
//! refused whole ([`Rejection`]). What reaches Kafka is the client's JSON for the event, byte for
//! byte in every value and in its order, plus only what this service sets ([`event`] lists it).
//!
//! Merging: a batch's top-level `context` and `integrations` are deep-merged into each message
//! (objects merge key by key, recursively; wherever both have a value the message's own wins, an
//! explicit `null` included), and a top-level `sentAt` is copied into messages that have none.
//! `writeKey` is removed from every message: it is a secret and never reaches Kafka.
//!
//! Duplicate keys: an object with the same key twice, at any depth, is refused (an event with
//! one is invalid; a batch body with one at its top level cannot be read), on every route alike.
//! JSON parsers disagree on which of the two counts, so such text has no one meaning to keep.

pub mod auth;
pub mod body;
pub mod derived_id;
pub mod digest;
pub mod envelope;
pub mod event;
pub mod json;
pub mod rate_limit;
pub mod same_event;
pub mod server;
pub mod settings;

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

pub use auth::{basic_auth_user, AuthError, WriteKeys, WriteKeysError, ENV_WRITE_KEYS};
pub use body::{check_content_type, decode_body};
pub use derived_id::{derived_message_id, is_derived};
pub use digest::{content_hash, HEADER_CONTENT_DIGEST};
pub use envelope::{Envelope, Events};
pub use event::{valid_message_id, IdOrigin, Message, MessageIds, MissingId, Problem, Refused};
pub use same_event::SameEvent;
pub use settings::settings_document;

/// Most bytes of one message as the client sent it (Segment's documented limit: 32 KB).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// Most bytes of a request body, after decompression (Segment's documented limit: 500 KB).
pub const MAX_REQUEST_BYTES: usize = 500 * 1024;
/// Most messages in one request. Segment's libraries send at most a few hundred; a batch of
/// minimal valid messages under [`MAX_REQUEST_BYTES`] holds about 5,000.
pub const MAX_BATCH_EVENTS: usize = 5_000;
/// Most bytes a batch's messages may come to once its shared `context`, `integrations` and
/// `sentAt` are merged into each of them, reckoned before anything is merged: the sum over its
/// messages of their own size plus the shared fields' size. Twice [`MAX_REQUEST_BYTES`]: a small
/// shared context over a full batch passes (Segment's libraries put the context in each message
/// and send none shared), while a large one repeated over thousands of messages is refused
/// without being copied once. It bounds the record values of one request; [`max_written_bytes`]
/// bounds everything one request writes.
pub const MAX_MERGED_BYTES: usize = 2 * MAX_REQUEST_BYTES;
/// At most what this service adds to one event: `"messageId":"<uuid>"` (50 bytes) and
/// `"receivedAt":"<RFC 3339, ms>"` (39), with the commas between fields.
pub const SERVICE_FIELDS_BYTES: usize = 96;
/// Most bytes of the sentence saying why an event was refused, in its dead-letter record's
/// `dedupe-error` header and in the answer: a longer one is cut at a character boundary.
pub const MAX_REFUSAL_SENTENCE_BYTES: usize = 256;
/// Most refused events an answer lists one by one; it counts them all (`rejected_count`).
pub const MAX_ANSWER_REFUSALS: usize = 100;
/// Most bytes of an answer's body: its fixed fields, and each listed refusal's index, code and
/// sentence (JSON escaping at most doubles the sentence).
pub const MAX_ANSWER_BYTES: usize =
    128 + MAX_ANSWER_REFUSALS * (64 + 2 * MAX_REFUSAL_SENTENCE_BYTES);
/// Most bytes one event's records take beyond the event's own text and its client's `messageId`:
/// for a refused event, the dead-letter record's key (`<source>:` before the id) and its six
/// headers (names 83 B; values the source, a reason of at most 24 B, the sentence, the receive
/// time 24 B, the endpoint 8 B, the index 4 B); a valid event's record takes less (the fields
/// this service sets, an assigned id in its key, three headers).
pub const fn max_event_overhead_bytes(source_bytes: usize) -> usize {
    1 + 83 + 24 + MAX_REFUSAL_SENTENCE_BYTES + 24 + 8 + 4 + 2 * source_bytes
}

/// Most bytes one request makes this service write, for a source name of `source_bytes`: the
/// record values (the events' text, merged, within [`MAX_MERGED_BYTES`], plus the fields this
/// service sets), the keys (each client `messageId` comes from the body, so all of them come to
/// at most [`MAX_REQUEST_BYTES`]), every event's key prefix and headers
/// ([`max_event_overhead_bytes`]), and the answer ([`MAX_ANSWER_BYTES`]). Kafka's own framing
/// of the records is not counted. About 3.7 MB for an 8-byte source name; gzip lets the body be
/// small on the wire, and the rate limit bounds how many such requests a source gets in.
pub const fn max_written_bytes(source_bytes: usize) -> usize {
    MAX_MERGED_BYTES
        + MAX_REQUEST_BYTES
        + MAX_BATCH_EVENTS * max_event_overhead_bytes(source_bytes)
        + MAX_ANSWER_BYTES
}

/// Most bytes of a record value produced to Kafka: a message within [`MAX_MESSAGE_BYTES`] after
/// merging, plus the fields this service sets (`messageId` of at most [`MAX_MESSAGE_ID_BYTES`],
/// `type`, `receivedAt`).
pub const MAX_RECORD_BYTES: usize = MAX_MESSAGE_BYTES + 1024;
/// Most bytes of a client's `messageId`; with a source name of at most [`MAX_SOURCE_BYTES`] the
/// record key stays well under the 1 KiB the worker accepts as an id.
pub const MAX_MESSAGE_ID_BYTES: usize = 256;
/// Most bytes of a source name.
pub const MAX_SOURCE_BYTES: usize = 128;
/// The record header naming the source a message came from (input and dead-letter records).
pub const HEADER_SOURCE: &str = "dedupe-source";
/// The header that marks a record whose `messageId` this service gave it: `derived` (from the
/// event's content) or `random`. A record with the client's own id has none.
pub const HEADER_MESSAGE_ID: &str = "dedupe-message-id";
/// Dead-letter record headers: why the event was refused (a [`Problem::reason`] code), the
/// sentence saying so, when the request arrived (RFC 3339, ms), the endpoint it was posted to
/// (as in metric labels), and its place in a batch (absent for a single-event route).
pub const HEADER_REASON: &str = "dedupe-reason";
pub const HEADER_ERROR: &str = "dedupe-error";
pub const HEADER_RECEIVED_AT: &str = "dedupe-received-at";
pub const HEADER_ENDPOINT: &str = "dedupe-endpoint";
pub const HEADER_INDEX: &str = "dedupe-index";
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
    pub const ALL: [EventType; 6] = [
        Self::Track,
        Self::Identify,
        Self::Page,
        Self::Screen,
        Self::Group,
        Self::Alias,
    ];

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

/// Why a request is refused whole with 400 (415 for its content type): its body cannot be read,
/// or (with `ingest.on_invalid_event = "refuse-request"`) one of its events is invalid. The
/// message names the problem and where it is; it never quotes the payload or a header's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("the request body is over the limit of {limit} bytes")]
    RequestTooLarge { limit: usize },
    #[error("this Content-Type is not supported (send JSON as application/json or text/plain, or no Content-Type)")]
    UnsupportedContentType,
    #[error("this Content-Encoding is not supported (send gzip or no encoding)")]
    UnsupportedEncoding,
    #[error("the gzip body cannot be decompressed: {0}")]
    BadGzip(String),
    #[error("the body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("the body must be a JSON object")]
    NotAnObject,
    #[error("`writeKey` must be a string, given once")]
    BadWriteKey,
    #[error("`batch` is missing or is not an array")]
    BatchNotArray,
    #[error("`batch` is empty")]
    EmptyBatch,
    #[error("`batch` has {count} messages; the limit is {MAX_BATCH_EVENTS}")]
    TooManyEvents { count: usize },
    #[error("the batch's messages would come to at least {bytes} bytes once its shared `context`, `integrations` and `sentAt` are merged into each; the limit is {MAX_MERGED_BYTES} bytes")]
    MergedBatchTooLarge { bytes: usize },
    #[error("{at}: {problem}")]
    Invalid { at: Location, problem: Problem },
}

impl Rejection {
    /// A short stable name for the problem: the `reason` label of the rejection counter and the
    /// `code` field of the error body.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::RequestTooLarge { .. } => "request_too_large",
            Self::UnsupportedContentType => "unsupported_content_type",
            Self::UnsupportedEncoding => "unsupported_encoding",
            Self::BadGzip(_) => "bad_gzip",
            Self::MalformedJson(_) => "malformed_json",
            Self::NotAnObject => "not_an_object",
            Self::BadWriteKey => "bad_write_key",
            Self::BatchNotArray => "batch_not_array",
            Self::EmptyBatch => "empty_batch",
            Self::TooManyEvents { .. } => "too_many_events",
            Self::MergedBatchTooLarge { .. } => "merged_batch_too_large",
            Self::Invalid { problem, .. } => problem.reason(),
        }
    }
}

/// The record key of a message: `<source>:<messageId>`. Source names cannot contain the
/// separator, so two sources' ids never make the same key.
pub fn record_key(source: &str, message_id: &str) -> String {
    let mut key = String::with_capacity(source.len() + 1 + message_id.len());
    push_record_key(&mut key, source, message_id);
    key
}

/// [`record_key`] appended to `key`.
pub fn push_record_key(key: &mut String, source: &str, message_id: &str) {
    key.push_str(source);
    key.push(KEY_SEPARATOR);
    key.push_str(message_id);
}

/// Milliseconds since the Unix epoch (0 for times before it).
pub fn unix_millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `t` as RFC 3339 in UTC with milliseconds, e.g. `2024-02-29T13:05:09.042Z`.
pub fn rfc3339_millis(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests;

//! The front door: the Segment-compatible tracking API, `dedupe ingest`. Its server
//! ([`server`]: the actix-web routes, admission, the producer to the input and dead-letter
//! topics, answers, metrics and logs, CORS, and what bounds every connection) over its pure
//! logic: the API's message types and endpoints ([`api`]), its limits ([`limits`]), write keys
//! and authentication ([`auth`]), the content types taken as JSON and body decoding ([`body`]),
//! requests and their events ([`envelope`], [`event`]) over JSON kept as sent ([`json`]), why a
//! request is refused whole ([`rejection`]), the settings document analytics.js loads
//! ([`settings`]), the per-source token buckets ([`rate_limit`]) and the times it writes
//! ([`time`]). The pure modules know nothing of HTTP or Kafka; only [`server`] does. What its
//! records look like to the worker (their headers, the `<source>:<messageId>` key, the content
//! digest's form) is the core's wire contract, `dedupe::wire`, which both sides use; the JSON
//! reader is the core's too (`dedupe::json`). The worker is another crate (`dedupe-actors`); the
//! `dedupe` binary (`dedupe-cli`) starts this crate's [`server::serve`] for `dedupe ingest`.
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

pub mod api;
pub mod auth;
pub mod body;
pub mod derived_id;
pub mod digest;
pub mod envelope;
pub mod event;
pub mod json;
pub mod limits;
pub mod rate_limit;
pub mod rejection;
pub mod same_event;
pub mod server;
pub mod settings;
pub mod time;

pub use api::{Endpoint, EventType, Location};
pub use auth::{basic_auth_user, AuthError, WriteKeys, WriteKeysError, ENV_WRITE_KEYS};
pub use body::{check_content_type, decode_body};
pub use derived_id::{derived_message_id, is_derived};
pub use digest::content_hash;
pub use envelope::{Envelope, Events};
pub use event::{valid_message_id, IdOrigin, Message, MessageIds, MissingId, Problem, Refused};
pub use limits::{
    max_event_overhead_bytes, max_written_bytes, MAX_ANSWER_BYTES, MAX_ANSWER_REFUSALS,
    MAX_BATCH_EVENTS, MAX_MERGED_BYTES, MAX_MESSAGE_BYTES, MAX_MESSAGE_ID_BYTES, MAX_RECORD_BYTES,
    MAX_REFUSAL_SENTENCE_BYTES, MAX_REQUEST_BYTES, MAX_SOURCE_BYTES, SERVICE_FIELDS_BYTES,
};
pub use rejection::Rejection;
pub use same_event::SameEvent;
pub use settings::settings_document;
pub use time::{rfc3339_millis, unix_millis};

#[cfg(test)]
mod tests;

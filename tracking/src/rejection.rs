//! Why a request is refused whole: the body cannot be read, or (with
//! `ingest.on_invalid_event = "refuse-request"`) one of its events is invalid.

use crate::api::Location;
use crate::event::Problem;
use crate::limits::{MAX_BATCH_EVENTS, MAX_MERGED_BYTES};

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

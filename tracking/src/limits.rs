//! The front door's limits: what one message, one request and one answer may come to, and what
//! one request may make this service write. Segment's documented limits where it has them.

use dedupe::wire;

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
/// headers (names 83 B together; values the source, a reason of at most 24 B, the sentence, the receive
/// time 24 B, the endpoint 8 B, the index 4 B); a valid event's record takes less (the fields
/// this service sets, an assigned id in its key, three headers).
pub const fn max_event_overhead_bytes(source_bytes: usize) -> usize {
    1 + DEAD_LETTER_HEADER_NAMES_BYTES
        + 24
        + MAX_REFUSAL_SENTENCE_BYTES
        + 24
        + 8
        + 4
        + 2 * source_bytes
}

/// The names of a dead-letter record's six headers, together (83 bytes).
const DEAD_LETTER_HEADER_NAMES_BYTES: usize = wire::HEADER_SOURCE.len()
    + wire::HEADER_REASON.len()
    + wire::HEADER_ERROR.len()
    + wire::HEADER_RECEIVED_AT.len()
    + wire::HEADER_ENDPOINT.len()
    + wire::HEADER_INDEX.len();

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

//! The wire contract: the record headers and key forms the doors write and the worker and its
//! tools read and write, defined once. The front door (`dedupe-tracking`) writes its records with
//! these names; the worker reads a record's source, its content digest and its flag by them; and
//! a change here is a change of the records every deployed version reads, so each name is a
//! constant used everywhere, never a literal.
//!
//! Guarantees:
//! - A scoped id is `<source>:<messageId>` ([`scoped_id`]): the front door's record key, and what
//!   `dedupe explain`, `dedupe forget` and the admin endpoints look an id up by. Source names may
//!   not contain [`SOURCE_SEPARATOR`], so two sources' same `messageId` are two ids.
//! - A content digest header holds a 64-bit hash as exactly 16 lower-case hex digits
//!   ([`content_digest_header`]); [`read_content_digest_header`] takes that form back, in either
//!   case, and no value of another length.

/// The source a record came in from: the front door's write key's source (input and dead-letter
/// records). The worker counts by it and applies `worker.source_modes` by it.
pub const HEADER_SOURCE: &str = "dedupe-source";
/// Marks a record whose `messageId` the front door gave it: `derived` (from the event's content)
/// or `random`. A record with the client's own id has none.
pub const HEADER_MESSAGE_ID: &str = "dedupe-message-id";
/// The event's 64-bit content hash ([`content_digest_header`]), which the front door writes and
/// the worker keeps two bytes of to tell a retry from a reused id
/// ([`crate::identity::ContentDigest`]).
pub const HEADER_CONTENT_DIGEST: &str = "dedupe-content-digest";

/// Dead-letter record headers of the front door: why the event was refused (a problem's reason
/// code), the sentence saying so, when the request arrived (RFC 3339, ms), the endpoint it was
/// posted to (as in metric labels), and its place in a batch (absent for a single-event route).
pub const HEADER_REASON: &str = "dedupe-reason";
pub const HEADER_ERROR: &str = "dedupe-error";
pub const HEADER_RECEIVED_AT: &str = "dedupe-received-at";
pub const HEADER_ENDPOINT: &str = "dedupe-endpoint";
pub const HEADER_INDEX: &str = "dedupe-index";

/// The header a copy published under `worker.source_modes`' `flag` carries: its verdict. On the
/// output only the worker sets it, once per flagged copy
/// ([`crate::batch::rename_input_duplicate_headers`]).
pub const HEADER_DUPLICATE: &str = "dedupe-duplicate";
/// The name under which an input record's own [`HEADER_DUPLICATE`] headers (a producer's, or the
/// flag of a dedupe pipeline upstream) reach the output, their values kept.
pub const HEADER_INPUT_DUPLICATE: &str = "dedupe-input-duplicate";

/// Headers of the record `dedupe rekey` writes to `worker.dead_letter_topic` for a source record
/// larger than the input topic accepts (beside the source record's own headers and key; its value
/// is not written, being what is too large): why, where it is (`<topic>:<partition>:<offset>`;
/// topic names hold no `:`) and its size in bytes (key, value and headers).
pub const HEADER_REKEY_REASON: &str = "dedupe-rekey-reason";
pub const HEADER_REKEY_SOURCE: &str = "dedupe-rekey-source";
pub const HEADER_REKEY_BYTES: &str = "dedupe-rekey-bytes";

/// Headers of the dead letter the worker writes for a record its output topic refused for good
/// (too large, invalid, a timestamp out of range), beside the record's own key and headers and
/// the front door's [`HEADER_REASON`] (`too_large`, `invalid_record`, `invalid_timestamp`) and
/// [`HEADER_ERROR`] (the broker's words): where it was read (`<topic>:<partition>:<offset>`;
/// topic names hold no `:`), its size in bytes (key, value and headers) and the topic that
/// refused it.
pub const HEADER_REFUSED_SOURCE: &str = "dedupe-refused-source";
pub const HEADER_REFUSED_BYTES: &str = "dedupe-refused-bytes";
pub const HEADER_REFUSED_BY: &str = "dedupe-refused-by";
/// The ledger key (32 lower-case hex digits) of a refused record's dead letter: the id the
/// ledger holds for it, which `dedupe explain` looks for in the dead-letter topic. Absent when
/// the record has no id.
pub const HEADER_REFUSED_LEDGER_KEY: &str = "dedupe-refused-ledger-key";

/// Separates a source's name from the client's message id in a scoped id. Source names cannot
/// contain it.
pub const SOURCE_SEPARATOR: char = ':';

/// The scoped id of `message_id` from `source`: `<source>:<message_id>`, the front door's record
/// key.
pub fn scoped_id(source: &str, message_id: &str) -> String {
    let mut id = String::with_capacity(source.len() + 1 + message_id.len());
    push_scoped_id(&mut id, source, message_id);
    id
}

/// [`scoped_id`] appended to `id` (the front door reuses one buffer per request).
pub fn push_scoped_id(id: &mut String, source: &str, message_id: &str) {
    id.push_str(source);
    id.push(SOURCE_SEPARATOR);
    id.push_str(message_id);
}

/// The [`HEADER_CONTENT_DIGEST`] value of `hash`, without allocating: 16 lower-case hex digits.
pub fn content_digest_header(hash: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = b"0123456789abcdef"[(hash >> (60 - 4 * i) & 0xf) as usize];
    }
    out
}

/// The hash a [`HEADER_CONTENT_DIGEST`] value stands for; `None` unless it is 16 characters of
/// hex digits (as `u64::from_str_radix` reads them, which takes a leading `+` too).
pub fn read_content_digest_header(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok().filter(|t| t.len() == 16)?;
    u64::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scoped_id_is_the_source_a_colon_and_the_message_id() {
        assert_eq!(scoped_id("web", "m-1"), "web:m-1");
        let mut id = String::from("x");
        push_scoped_id(&mut id, "", "");
        assert_eq!(id, "x:");
    }

    #[test]
    fn the_digest_header_is_the_hash_in_sixteen_hex_digits_and_reads_back() {
        for hash in [0, 1, 0xdead_beef, u64::MAX, 0x0123_4567_89ab_cdef] {
            let header = content_digest_header(hash);
            assert_eq!(header, format!("{hash:016x}").as_bytes());
            assert_eq!(read_content_digest_header(&header), Some(hash));
        }
        assert_eq!(
            read_content_digest_header(b"ABCD000000000001"),
            Some(0xabcd_0000_0000_0001)
        );
        // Not 16 hex digits: a space, 15 or 17 digits, a non-digit, bytes not UTF-8.
        for bad in [
            &b""[..],
            b" bcd000000000001",
            b"abcd00000000000",
            b"abcd0000000000011",
            b"abcd00000000000g",
            b"\xff\xfe",
        ] {
            assert_eq!(read_content_digest_header(bad), None, "{bad:?}");
        }
    }
}

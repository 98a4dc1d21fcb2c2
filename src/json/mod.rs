//! JSON read exactly: the one reading of a JSON text that every id and every content digest is made
//! from, at the front door and in the worker.
//!
//! - [`reader`]: a strict one-pass reader. It refuses what serde_json's full parse refuses (a
//!   number out of a double's range, a lone surrogate, nesting of 128 levels) and an object with
//!   the same key twice at any depth (parsers disagree on which of the two counts, so such a text
//!   has no one meaning). It keeps every key and value as a slice of the text: no number goes
//!   through a double, no string is decoded unless asked.
//! - [`canonical`]: the canonical text of a value: no white space, every object's members in the
//!   order of their keys, every number as its exact text. Strings either as sent (the front door's
//!   same event: `"\u00e9"` is not `"é"`) or decoded and written one way (the worker's ids and
//!   digests: they are one string).
//! - [`document`]: a record value read strictly once, with RFC 6901 pointers into it and its
//!   canonical text less some fields, each named by a pointer into the original document.
//!
//! Why the reader lives here and not in the front door: the worker's ids (`json:` pointers,
//! composites, fingerprints) and its content digests must read JSON exactly as the front door
//! does; with serde_json's `Value` they did not (numbers through a double, a repeated key keeping
//! the last). One reader, one canonical writer, used by both doors, cannot drift apart; the front
//! door's batch-reading parts ([`ItemFields`]) came along because the reader's single pass feeds
//! them. The reader's tests against serde_json's verdicts and its bench stay with the front door
//! (`tracking/src/json/tests.rs`, `tracking/examples/parse_bench.rs`), which reaches it through
//! `dedupe_tracking::json`.

pub mod canonical;
pub mod document;
pub mod reader;

pub use canonical::{Canonical, Strings};
pub use document::{Document, Unreadable};
pub use reader::{is_number, string_value, Field, ItemFields, JsonError, Mode, Reader};

#[cfg(test)]
mod tests;

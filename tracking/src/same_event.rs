//! What makes two events the same event: the one definition both the derived `messageId`
//! ([`crate::derived_id`]) and the content digest ([`crate::digest`]) are computed from, so that a
//! retry of an event gets the same id and the verdict `retry`, and two events that differ as sent
//! never share an id.
//!
//! Two events are the same event when they have the same type and, for each of [`FIELDS`], both
//! lack it (or have `null`) or both have the same value. Two values are the same when they are
//! the same JSON text once white space outside strings is removed and every object's members are
//! put in the order of their keys' text; every string and every number is compared as the exact
//! text sent (`1.0` is not `1`, `1e2` is not `100`, `"\u00e9"` is not `"é"`, and an integer of
//! any length stays exact). Nothing is read as a double. Every other field (`messageId`,
//! `sentAt`, `receivedAt`, `context`, `integrations`, `writeKey`, and any field not listed) may
//! differ between a send and its retry.
//!
//! The text both hashes read, [`SameEvent::text`]: the type, then for each of [`FIELDS`] in order
//! a zero byte when absent or `null`, else a one byte and the value's canonical text; the type and
//! each value as an 8-byte big-endian length followed by the bytes.

pub use dedupe::json::canonical::{canonical, Canonical};

use super::json::{Fields, Name};
use super::EventType;

/// The fields that make an event what it is, after its type.
pub const FIELDS: [Name; 9] = [
    Name::Event,
    Name::Name,
    Name::UserId,
    Name::AnonymousId,
    Name::GroupId,
    Name::PreviousId,
    Name::Timestamp,
    Name::Properties,
    Name::Traits,
];

/// An event reduced to what makes it the same event as another.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SameEvent {
    text: Vec<u8>,
}

impl SameEvent {
    /// The event of `event_type` with `fields` (which passed the strict check). `None` only if a
    /// value is not JSON, which the strict check has refused already.
    pub fn of(event_type: EventType, fields: &Fields<'_>) -> Option<SameEvent> {
        let mut same = SameEvent::default();
        same.fill(event_type, fields, &mut Canonical::default())?;
        Some(same)
    }

    /// Makes this the event of `event_type` with `fields`, reusing its buffer and `canonical`'s.
    pub fn fill(
        &mut self,
        event_type: EventType,
        fields: &Fields<'_>,
        canonical: &mut Canonical,
    ) -> Option<()> {
        let text = &mut self.text;
        text.clear();
        put(text, event_type.as_str().as_bytes());
        for name in FIELDS {
            match fields.named(name).filter(|raw| *raw != "null") {
                None => text.push(0),
                Some(raw) => {
                    text.push(1);
                    if !raw.starts_with(['{', '[']) {
                        // A string, number or literal read as one value: its text is canonical.
                        put(text, raw.as_bytes());
                        continue;
                    }
                    // The length goes first: write the value after room for it, then fill it in.
                    let at = text.len();
                    text.extend_from_slice(&[0; 8]);
                    canonical.write(raw, text)?;
                    let len = (text.len() - at - 8) as u64;
                    text[at..at + 8].copy_from_slice(&len.to_be_bytes());
                }
            }
        }
        Some(())
    }

    /// The bytes both hashes read (see the module's doc).
    pub fn text(&self) -> &[u8] {
        &self.text
    }
}

/// Writes `bytes` with their length first, so that no two sequences of fields read alike.
pub(crate) fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(bytes);
}

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

use super::json::{reader, Fields, Name};
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

/// Deepest nesting the canonical writer follows; the strict check refuses deeper text first.
const MAX_DEPTH: usize = 128;

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

/// `raw`'s canonical text into `out`: no white space outside strings, every object's members in
/// the order of their keys' text as sent, every string and number as sent. `None` for text that is
/// not one JSON value.
pub fn canonical(raw: &str, out: &mut Vec<u8>) -> Option<()> {
    Canonical::default().write(raw, out)
}

/// The canonical writer's buffers, reused from one value to the next: the members of every object
/// open, and a copy of an object's members while they are put in order.
#[derive(Debug, Default)]
pub struct Canonical {
    /// Each member as (start, key's end, end) in the output.
    members: Vec<(usize, usize, usize)>,
    copy: Vec<u8>,
}

impl Canonical {
    /// `text`'s canonical text appended to `out`.
    pub fn write(&mut self, text: &str, out: &mut Vec<u8>) -> Option<()> {
        self.members.clear();
        let mut reader = Writer {
            text: text.as_bytes(),
            at: 0,
            buffers: self,
        };
        reader.value(out, 0)?;
        reader.skip_space();
        (reader.at == reader.text.len()).then_some(())
    }
}

/// A cursor over JSON text that passed the strict check.
struct Writer<'a, 'b> {
    text: &'a [u8],
    at: usize,
    buffers: &'b mut Canonical,
}

impl<'a> Writer<'a, '_> {
    fn skip_space(&mut self) {
        while matches!(self.text.get(self.at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn next_byte(&mut self) -> Option<u8> {
        self.skip_space();
        let b = *self.text.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn value(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        self.skip_space();
        match *self.text.get(self.at)? {
            b'{' if depth < MAX_DEPTH => self.object(out, depth + 1),
            b'[' if depth < MAX_DEPTH => self.array(out, depth + 1),
            b'{' | b'[' => None,
            b'"' => {
                out.extend_from_slice(self.string()?);
                Some(())
            }
            _ => {
                // A number, `true`, `false` or `null`: its text up to the next delimiter.
                let start = self.at;
                while self.text.get(self.at).is_some_and(|b| {
                    !matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b',' | b']' | b'}' | b':')
                }) {
                    self.at += 1;
                }
                (self.at > start).then(|| out.extend_from_slice(&self.text[start..self.at]))
            }
        }
    }

    /// A string's text as sent, quotes included.
    fn string(&mut self) -> Option<&'a [u8]> {
        let start = self.at;
        if self.text.get(start) != Some(&b'"') {
            return None;
        }
        let mut i = start + 1;
        loop {
            i = reader::plain_run(self.text, i);
            match *self.text.get(i)? {
                b'"' => break,
                b'\\' => i += 2,
                _ => i += 1,
            }
        }
        self.at = i + 1;
        Some(&self.text[start..self.at])
    }

    fn array(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        self.at += 1;
        out.push(b'[');
        self.skip_space();
        if self.text.get(self.at) == Some(&b']') {
            self.at += 1;
            out.push(b']');
            return Some(());
        }
        loop {
            self.value(out, depth)?;
            match self.next_byte()? {
                b',' => out.push(b','),
                b']' => break,
                _ => return None,
            }
        }
        out.push(b']');
        Some(())
    }

    /// Members are written to `out` as they come (`"key":value`, commas between), then, unless
    /// they came in order already, rewritten from a copy in their keys' order.
    fn object(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        self.at += 1;
        out.push(b'{');
        let body = out.len();
        let from = self.buffers.members.len();
        self.skip_space();
        if self.text.get(self.at) == Some(&b'}') {
            self.at += 1;
        } else {
            loop {
                self.skip_space();
                if out.len() > body {
                    out.push(b',');
                }
                let start = out.len();
                out.extend_from_slice(self.string()?);
                let key_end = out.len();
                if self.next_byte()? != b':' {
                    return None;
                }
                out.push(b':');
                self.value(out, depth)?;
                self.buffers.members.push((start, key_end, out.len()));
                match self.next_byte()? {
                    b',' => {}
                    b'}' => break,
                    _ => return None,
                }
            }
        }
        let members = &mut self.buffers.members[from..];
        if !members
            .windows(2)
            .all(|w| out[w[0].0..w[0].1] <= out[w[1].0..w[1].1])
        {
            let copy = &mut self.buffers.copy;
            copy.clear();
            copy.extend_from_slice(&out[body..]);
            members.sort_by(|a, b| copy[a.0 - body..a.1 - body].cmp(&copy[b.0 - body..b.1 - body]));
            out.truncate(body);
            for (i, &(start, _, end)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&copy[start - body..end - body]);
            }
        }
        self.buffers.members.truncate(from);
        out.push(b'}');
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        let raw = text.trim();
        let mut out = Vec::new();
        canonical(raw, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn white_space_and_member_order_go_and_every_scalar_stays_as_sent() {
        // Members sorted by their keys' text, nested too; arrays keep their order.
        assert_eq!(
            canon(r#" { "b" : [ 2 , 1 ] , "a" : { "y" : null , "x" : true } } "#),
            r#"{"a":{"x":true,"y":null},"b":[2,1]}"#
        );
        // Numbers and strings keep their text: no double, no decoding of escapes.
        assert_eq!(
            canon(
                r#"{"n":12345678901234567890123,"d":0.10000000000000000001,"e":1E+2,"z":-0.0,"s":"\u00e9\/ \" x"}"#
            ),
            r#"{"d":0.10000000000000000001,"e":1E+2,"n":12345678901234567890123,"s":"\u00e9\/ \" x","z":-0.0}"#
        );
        assert_eq!(canon("[]"), "[]");
        assert_eq!(canon("{ }"), "{}");
        assert_eq!(canon(r#""a\\""#), r#""a\\""#);
    }

    #[test]
    fn values_that_differ_as_sent_stay_apart() {
        // Each pair is equal as a double or once escapes are decoded, and differs as sent.
        for (a, b) in [
            ("12345678901234567890123", "12345678901234567890124"),
            ("0.10000000000000000001", "0.1"),
            ("1e2", "100"),
            ("1.0", "1"),
            (r#""\u00e9""#, r#""é""#),
            (r#""\u0041""#, r#""A""#),
        ] {
            assert_ne!(canon(a), canon(b), "{a} and {b}");
        }
    }

    #[test]
    fn text_that_is_not_one_value_has_no_canonical_form() {
        let mut out = Vec::new();
        for bad in [
            r#"{"a" 1}"#,
            "[1 2]",
            r#"{"a":1"#,
            "",
            "1 2",
            r#""open"#,
            r#"{"a":}"#,
        ] {
            assert!(canonical(bad, &mut out).is_none(), "{bad}");
        }
    }
}

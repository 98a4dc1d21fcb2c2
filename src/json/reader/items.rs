//! A batch's events read strictly within the body's pass: each event is read once, where it
//! stands, by a strict reader of its own, and what the pass keeps of it stays small.

use std::borrow::Cow;

use super::{unescape, Capture, Field, Mode, Reader};

/// A batch's events read strictly as the body is read: each element of the captured array that
/// is an object is read by a strict reader of its own, exactly as [`Reader::object`] reads it
/// alone, and the body's reader goes on after it, so the event's bytes are read once. An element
/// that is not an object, or that strict reading refuses, is not kept and is skimmed as before;
/// whoever makes it reads it again on its own, for the problem and its place.
///
/// The body is read before its sender is authenticated, so what this holds stays small: each
/// field as four offsets into the body (`Span`, 20 bytes), about `MOST_SPANS` of them, entries
/// for at most `most` elements (past them the batch is refused for its length), and no element
/// longer than `largest` bytes is read strictly here (it is refused for its size), so the strict
/// reader's own lists stay within one such element's. Every element is of one text.
pub struct ItemFields<'a> {
    reader: Reader<'a>,
    /// The fields of the event being read, reused from one event to the next.
    scratch: Vec<Field<'a>>,
    most: usize,
    largest: usize,
    /// The text the events were read from.
    text: &'a str,
    /// Every event's fields, one event after another.
    spans: Vec<Span>,
    /// Per element, in order, for the first `most` elements: where its fields are in `spans`,
    /// if it was read.
    read: Vec<Option<(u32, u32)>>,
}

/// The most fields a body's pass keeps (80 KiB of spans): the events of a typical batch many times
/// over. The events of a larger batch past them are read alone, as every event was before.
const MOST_SPANS: usize = 4096;

/// A field of an event read in the body's pass: where its key's text (with its quotes) and its
/// value's text are in the body, and whether the key holds an escape.
#[derive(Debug, Clone, Copy)]
struct Span {
    key: u32,
    key_len: u32,
    value: u32,
    value_len: u32,
    escaped: bool,
}

impl<'a> ItemFields<'a> {
    /// Reads at most `most` elements, none longer than `largest` bytes, with room for `room`.
    pub fn new(room: usize, most: usize, largest: usize) -> Self {
        Self {
            reader: Reader::default(),
            scratch: Vec::new(),
            most,
            largest,
            text: "",
            spans: Vec::new(),
            read: Vec::with_capacity(room.min(most)),
        }
    }

    /// Whether the next element is read (one entry more), or only skimmed.
    pub(super) fn wants_more(&self) -> bool {
        self.read.len() < self.most && self.spans.len() < MOST_SPANS
    }

    /// How many elements have an entry (read or not): the first `most`.
    pub fn len(&self) -> usize {
        self.read.len()
    }

    pub fn is_empty(&self) -> bool {
        self.read.is_empty()
    }

    /// The element at `at` of `text`, read strictly on its own when `object` (its first byte is
    /// `{`): where it ends, if strict reading took it whole. Adds the element's entry.
    pub(super) fn read_next(&mut self, text: &'a str, at: usize, object: bool) -> Option<usize> {
        let read = if object && u32::try_from(text.len()).is_ok() {
            self.read_one(text, at)
        } else {
            None
        };
        self.read.push(read.map(|(_, range)| range));
        read.map(|(end, _)| end)
    }

    fn read_one(&mut self, text: &'a str, at: usize) -> Option<(usize, (u32, u32))> {
        self.scratch.clear();
        let capture = Capture::fields_of(&mut self.scratch);
        // Only the next `largest` bytes are given: a longer element ends the read there.
        let mut window = at.saturating_add(self.largest).min(text.len());
        while !text.is_char_boundary(window) {
            window -= 1;
        }
        let end = self
            .reader
            .walk(&text[..window], at, Mode::Strict, capture, false)
            .ok()?;
        self.text = text;
        let offset = |part: &str| (part.as_ptr() as usize - text.as_ptr() as usize) as u32;
        let from = self.spans.len() as u32;
        self.spans.extend(self.scratch.iter().map(|f| Span {
            key: offset(f.key_text),
            key_len: f.key_text.len() as u32,
            value: offset(f.value),
            value_len: f.value.len() as u32,
            escaped: matches!(f.key, Cow::Owned(_)),
        }));
        Some((end, (from, self.spans.len() as u32)))
    }

    /// The fields of element `index` into `out` (emptied first), as the strict read found them;
    /// false when it was not read (or has no entry).
    pub fn fields_into(&self, index: usize, out: &mut Vec<Field<'a>>) -> bool {
        let Some(&Some((from, to))) = self.read.get(index) else {
            return false;
        };
        out.clear();
        let text = self.text;
        out.extend(self.spans[from as usize..to as usize].iter().map(|s| {
            let key_text = &text[s.key as usize..(s.key + s.key_len) as usize];
            let inner = &key_text[1..key_text.len() - 1];
            Field {
                key: if s.escaped {
                    Cow::Owned(unescape(inner))
                } else {
                    Cow::Borrowed(inner)
                },
                key_text,
                value: &text[s.value as usize..(s.value + s.value_len) as usize],
            }
        }));
        true
    }
}

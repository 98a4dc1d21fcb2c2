//! The walk: one pass over a value's text, without recursion. A value is read where it starts
//! ([`Reader::open`]: a scalar whole, or a container's opening and its first key), then every
//! container that ends after it is closed ([`Reader::close`]) until a comma leads to the next
//! value or the outermost value has ended. What the capture asks for is taken on the way.

use std::borrow::Cow;

use super::scalars::{scalar, skip_space, string};
use super::{unescape, Capture, ErrorKind, Field, Frame, JsonError, Mode, Reader, MAX_DEPTH};

/// Up to this many keys an object's keys are compared one by one as they come; past it they are
/// sorted once the object ends, so that a hostile object of thousands of keys costs n log n.
const LINEAR_KEYS: usize = 16;

/// Where a walk stands, and what it has taken for the capture so far.
struct Walk<'a, 'o> {
    text: &'a str,
    strict: bool,
    /// Whether nothing but white space may follow the value.
    whole: bool,
    capture: Capture<'a, 'o>,
    at: usize,
    /// Where the top-level container's current part began, and the key of the top-level
    /// object's current field, for the capture.
    part_start: usize,
    part_key: Option<(Cow<'a, str>, &'a str)>,
    items_depth: usize,
    /// Whether the array open at `items_depth` is the one whose elements are captured, and
    /// where its current element began.
    items_open: bool,
    item_start: usize,
}

/// What follows a step: the next value to read, or the end of one (containers may close).
enum Next {
    Value,
    Ended,
}

impl<'a> Reader<'a> {
    /// Reads the value at `from` and returns where it ends; with `whole`, nothing but white space
    /// may follow it.
    pub(super) fn walk(
        &mut self,
        text: &'a str,
        from: usize,
        mode: Mode,
        capture: Capture<'a, '_>,
        whole: bool,
    ) -> Result<usize, JsonError> {
        self.frames.clear();
        self.keys.clear();
        let items_depth = capture.items_depth();
        let mut w = Walk {
            text,
            strict: mode == Mode::Strict,
            whole,
            capture,
            at: from,
            part_start: 0,
            part_key: None,
            items_depth,
            items_open: false,
            item_start: 0,
        };
        loop {
            w.at = skip_space(text.as_bytes(), w.at);
            if let Next::Value = self.open(&mut w)? {
                continue;
            }
            if let Some(end) = self.close(&mut w)? {
                return Ok(end);
            }
        }
    }

    /// Reads the value at `w.at`: a scalar, or an element the capture reads whole, to its end; or
    /// a container's opening and, unless it is empty, its first key.
    fn open(&mut self, w: &mut Walk<'a, '_>) -> Result<Next, JsonError> {
        let b = w.text.as_bytes();
        let &first = b.get(w.at).ok_or(JsonError::new(ErrorKind::Eof, w.at))?;
        if self.item_read_whole(w, first) {
            return Ok(Next::Ended);
        }
        if first != b'{' && first != b'[' {
            w.at = scalar(w.text, w.at, first, w.strict)?;
            return Ok(Next::Ended);
        }
        if w.strict && self.frames.len() >= MAX_DEPTH {
            return Err(JsonError::new(ErrorKind::TooDeep, w.at));
        }
        w.at = skip_space(b, w.at + 1);
        if first == b'[' {
            self.frames.push(Frame::Array);
            let depth = self.frames.len();
            if depth == w.items_depth {
                w.items_open = depth == 1
                    || w.part_key.as_ref().map(|(k, _)| k.as_ref()) == w.capture.items_of;
            }
            if b.get(w.at) != Some(&b']') {
                w.part_begins(depth);
                return Ok(Next::Value);
            }
        } else {
            let keys_from = self.keys.len();
            self.frames.push(Frame::Object { keys_from });
            if b.get(w.at) != Some(&b'}') {
                let key_at = w.at;
                w.at = skip_space(b, self.key(w, key_at, keys_from)?);
                if self.frames.len() == 1 {
                    w.part_start = w.at;
                }
                return Ok(Next::Value);
            }
        }
        // An empty container: it ends at once.
        if self.frames.len() == w.items_depth {
            w.items_open = false;
        }
        w.at += 1;
        self.frames.pop();
        Ok(Next::Ended)
    }

    /// Whether the element at `w.at` of the captured array was read whole by the capture's strict
    /// reader of events (the body's reader then goes on after it).
    fn item_read_whole(&self, w: &mut Walk<'a, '_>, first: u8) -> bool {
        if !w.items_open || self.frames.len() != w.items_depth {
            return false;
        }
        let Some(events) = w.capture.item_fields.as_mut().filter(|e| e.wants_more()) else {
            return false;
        };
        match events.read_next(w.text, w.at, first == b'{') {
            Some(end) => {
                w.at = end;
                true
            }
            None => false,
        }
    }

    /// A value ended at `w.at`: closes every container that ends there. Returns where the walk
    /// ends once the outermost value has ended, or `None` when a comma leads to another value.
    fn close(&mut self, w: &mut Walk<'a, '_>) -> Result<Option<usize>, JsonError> {
        let b = w.text.as_bytes();
        loop {
            let depth = self.frames.len();
            if depth == 0 {
                return w.finish().map(Some);
            }
            w.part_ends(depth);
            w.at = skip_space(b, w.at);
            let frame = self.frames[depth - 1];
            match (b.get(w.at), frame) {
                (Some(b','), Frame::Array) => {
                    w.at = skip_space(b, w.at + 1);
                    w.part_begins(depth);
                    return Ok(None);
                }
                (Some(b','), Frame::Object { keys_from }) => {
                    let key_at = skip_space(b, w.at + 1);
                    w.at = skip_space(b, self.key(w, key_at, keys_from)?);
                    if depth == 1 {
                        w.part_start = w.at;
                    }
                    return Ok(None);
                }
                (Some(b']'), Frame::Array) => {
                    if depth == w.items_depth {
                        w.items_open = false;
                    }
                }
                (Some(b'}'), Frame::Object { keys_from }) => {
                    if w.strict {
                        self.check_keys(keys_from)?;
                    }
                    self.keys.truncate(keys_from);
                }
                (None, _) => return Err(JsonError::new(ErrorKind::Eof, w.at)),
                _ => return Err(JsonError::new(ErrorKind::ExpectedCommaOrEnd, w.at)),
            }
            w.at += 1;
            self.frames.pop();
        }
    }

    /// Reads a key and its colon at `at`; returns where its value starts. Keeps the key (to refuse
    /// a repeated one) when strict, and hands the top-level object's keys to the capture.
    fn key(
        &mut self,
        w: &mut Walk<'a, '_>,
        at: usize,
        keys_from: usize,
    ) -> Result<usize, JsonError> {
        let text = w.text;
        let strict = w.strict;
        let b = text.as_bytes();
        if b.get(at) != Some(&b'"') {
            return Err(JsonError::new(
                if at >= b.len() {
                    ErrorKind::Eof
                } else {
                    ErrorKind::KeyNotString
                },
                at,
            ));
        }
        // The top-level object's keys are decoded when its fields are wanted, so they are checked
        // as strictly as strict text's.
        let top = self.frames.len() == 1 && w.capture.fields.is_some();
        let (end, escaped) = string(b, at, strict || top)?;
        let key_text = &text[at..end];
        if strict || top {
            let inner = &key_text[1..key_text.len() - 1];
            let key = if escaped {
                Cow::Owned(unescape(inner))
            } else {
                Cow::Borrowed(inner)
            };
            if strict {
                if self.keys.len() - keys_from < LINEAR_KEYS
                    && self.keys[keys_from..].iter().any(|(k, _)| *k == key)
                {
                    return Err(JsonError::new(ErrorKind::DuplicateKey, at));
                }
                self.keys.push((key.clone(), at));
            }
            if top {
                w.part_key = Some((key, key_text));
            }
        }
        let colon = skip_space(b, end);
        match b.get(colon) {
            Some(b':') => Ok(colon + 1),
            None => Err(JsonError::new(ErrorKind::Eof, colon)),
            Some(_) => Err(JsonError::new(ErrorKind::ExpectedColon, colon)),
        }
    }

    /// Refuses a repeated key among an object's many keys (the first [`LINEAR_KEYS`] were
    /// compared as they came): sorted, a repeat sits beside its twin.
    fn check_keys(&mut self, keys_from: usize) -> Result<(), JsonError> {
        let keys = &mut self.keys[keys_from..];
        if keys.len() <= LINEAR_KEYS {
            return Ok(());
        }
        keys.sort_unstable();
        match keys
            .windows(2)
            .filter(|w| w[0].0 == w[1].0)
            .map(|w| w[1].1.max(w[0].1))
            .min()
        {
            Some(at) => Err(JsonError::new(ErrorKind::DuplicateKey, at)),
            None => Ok(()),
        }
    }
}

impl Walk<'_, '_> {
    /// A part of the container at `depth` begins at `at`: the top-level container's part, or an
    /// element of the captured array.
    fn part_begins(&mut self, depth: usize) {
        if depth == 1 {
            self.part_start = self.at;
        }
        if depth == self.items_depth {
            self.item_start = self.at;
        }
    }

    /// The part of the container at `depth` ended at `at`: hands it to the capture if wanted.
    fn part_ends(&mut self, depth: usize) {
        let text = self.text;
        if depth == 1 {
            if let (Some(fields), Some((key, key_text))) =
                (&mut self.capture.fields, self.part_key.take())
            {
                fields.push(Field {
                    key,
                    key_text,
                    value: &text[self.part_start..self.at],
                });
            }
        }
        if depth == self.items_depth && self.items_open {
            if let Some(items) = &mut self.capture.items {
                items.push(&text[self.item_start..self.at]);
            }
        }
    }

    /// The outermost value ended at `at`: where the walk ends, once nothing but white space is
    /// found to follow it when the text must be one value.
    fn finish(&self) -> Result<usize, JsonError> {
        if !self.whole {
            return Ok(self.at);
        }
        let b = self.text.as_bytes();
        let at = skip_space(b, self.at);
        if at == b.len() {
            Ok(at)
        } else {
            Err(JsonError::new(ErrorKind::Trailing, at))
        }
    }
}

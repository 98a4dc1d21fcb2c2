//! One pass over JSON text that checks it and finds an object's fields: the reader of the front
//! door's requests and of the worker's record values ([`super::document`]).
//!
//! Two modes. **Strict** refuses everything serde_json's full parse refuses (a number out of a
//! double's range, a `\u` escape that is half of a surrogate pair, nesting of 128 levels or more)
//! and, as every route of the API does, an object with the same key twice at any depth. **Skim**
//! checks only the grammar, as serde_json does when it skips a value: it reads a request's body,
//! finding where its parts begin and end, while each of a batch's events is read strictly on its
//! own where it stands ([`super::ItemFields`]), so that one bad event costs only itself.
//!
//! Nothing is copied or converted: a field's key and value come back as slices of the text, and
//! a key is decoded (into a new string) only when it holds an escape. The front door's tests
//! (`tracking/src/json/tests.rs`) hold this reader to serde_json's verdicts on generated text.

use std::borrow::Cow;
use std::fmt;

mod items;

pub use items::ItemFields;

/// Deepest nesting strict text may have: serde_json refuses the 128th level.
pub const MAX_DEPTH: usize = 127;
/// Up to this many keys an object's keys are compared one by one as they come; past it they are
/// sorted once the object ends, so that a hostile object of thousands of keys costs n log n.
const LINEAR_KEYS: usize = 16;
/// A number whose decimal magnitude may reach this power of ten is given to serde_json to decide
/// whether it overflows a double; every smaller one is a finite double.
const SURE_FINITE_DIGITS: i64 = 300;

/// One field of an object: its key (escapes decoded, to compare), the key's text as sent (with
/// its quotes), and the value's text as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field<'a> {
    pub key: Cow<'a, str>,
    pub key_text: &'a str,
    pub value: &'a str,
}

/// What is wrong with a text, and at which byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonError {
    pub kind: ErrorKind,
    pub at: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Eof,
    ExpectedValue,
    ExpectedColon,
    ExpectedCommaOrEnd,
    KeyNotString,
    ControlCharacter,
    InvalidEscape,
    LoneSurrogate,
    InvalidNumber,
    NumberOutOfRange,
    TooDeep,
    DuplicateKey,
    Trailing,
    NotAnObject,
}

impl ErrorKind {
    fn says(self) -> &'static str {
        match self {
            Self::Eof => "the text ends inside a value",
            Self::ExpectedValue => "expected a value",
            Self::ExpectedColon => "expected `:` after a key",
            Self::ExpectedCommaOrEnd => "expected `,` or the end of the object or array",
            Self::KeyNotString => "a key must be a string",
            Self::ControlCharacter => {
                "a control character (U+0000 to U+001F) is not escaped in a string"
            }
            Self::InvalidEscape => "invalid escape in a string",
            Self::LoneSurrogate => "a \\u escape is half of a surrogate pair",
            Self::InvalidNumber => "invalid number",
            Self::NumberOutOfRange => "a number is out of a double's range",
            Self::TooDeep => "nested more than 127 levels",
            Self::DuplicateKey => "an object has the same key twice",
            Self::Trailing => "trailing characters after the value",
            Self::NotAnObject => "not a JSON object",
        }
    }
}

impl JsonError {
    fn new(kind: ErrorKind, at: usize) -> Self {
        Self { kind, at }
    }

    /// The 1-based line and column (in bytes) of the error in `text`, the text it was read from.
    pub fn line_column(&self, text: &str) -> (usize, usize) {
        let before = &text.as_bytes()[..self.at.min(text.len())];
        let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
        let column = before.len()
            - before
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1)
            + 1;
        (line, column)
    }

    /// What is wrong and where, for a person: `expected a value at line 1 column 9`.
    pub fn describe(&self, text: &str) -> String {
        let (line, column) = self.line_column(text);
        format!("{} at line {line} column {column}", self.kind.says())
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.kind.says(), self.at)
    }
}

/// How a text is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Strict,
    Skim,
}

/// What kind of container an open frame is, and where its keys start in the key stack.
#[derive(Clone, Copy)]
enum Frame {
    Object { keys_from: usize },
    Array,
}

/// The reader's buffers, kept between texts so that reading allocates only when a text is
/// larger or deeper than every one before it (or a key holds an escape).
pub struct Reader<'a> {
    frames: Vec<Frame>,
    /// Whether this read hands back the top-level object's fields.
    fields_wanted: bool,
    /// The keys of every object open, each with where it was read, to refuse a repeated one.
    keys: Vec<(Cow<'a, str>, usize)>,
}

/// The room a new reader's buffers start with: an event's nesting and its open objects' keys,
/// so that reading a typical event does not grow them.
const FRAMES: usize = 8;
const KEYS: usize = 32;

impl Default for Reader<'_> {
    fn default() -> Self {
        Self {
            frames: Vec::with_capacity(FRAMES),
            fields_wanted: false,
            keys: Vec::with_capacity(KEYS),
        }
    }
}

/// What a read hands back besides its verdict.
#[derive(Default)]
pub(super) struct Capture<'a, 'o> {
    /// The top-level object's fields.
    fields: Option<&'o mut Vec<Field<'a>>>,
    /// The elements of the top-level array, or (with `items_of`) of the array that is the value of
    /// the top-level object's field of that name.
    items: Option<&'o mut Vec<&'a str>>,
    items_of: Option<&'o str>,
    /// With `items`: each element's fields, read strictly in the same pass (see [`ItemFields`]).
    item_fields: Option<&'o mut ItemFields<'a>>,
}

impl<'a, 'o> Capture<'a, 'o> {
    /// The top-level object's fields into `list`, nothing else.
    pub(super) fn fields_of(list: &'o mut Vec<Field<'a>>) -> Self {
        Self {
            fields: Some(list),
            ..Self::default()
        }
    }
}

impl Capture<'_, '_> {
    /// At which depth the captured array's elements are.
    fn items_depth(&self) -> usize {
        match (&self.items, self.items_of) {
            (None, _) => 0,
            (Some(_), None) => 1,
            (Some(_), Some(_)) => 2,
        }
    }
}

impl<'a> Reader<'a> {
    /// Reads `text`, which must be one JSON object (white space around it allowed), and appends
    /// its fields in the order sent to `fields`. In [`Mode::Skim`] a repeated key is kept as it is.
    pub fn object(
        &mut self,
        text: &'a str,
        mode: Mode,
        fields: &mut Vec<Field<'a>>,
    ) -> Result<(), JsonError> {
        self.object_with_events(text, mode, fields, None, None)
    }

    /// Like [`Reader::object`], and when the object's field `name` is an array, appends its
    /// elements' text to `items` in the same pass (a batch's events); with `item_fields`, each
    /// element that is an object is also read strictly in that pass (one entry per element).
    pub fn object_with_events(
        &mut self,
        text: &'a str,
        mode: Mode,
        fields: &mut Vec<Field<'a>>,
        items: Option<(&str, &mut Vec<&'a str>)>,
        item_fields: Option<&mut ItemFields<'a>>,
    ) -> Result<(), JsonError> {
        let start = skip_space(text.as_bytes(), 0);
        if text.as_bytes().get(start) != Some(&b'{') {
            return Err(match self.value(text, mode) {
                Ok(()) => JsonError::new(ErrorKind::NotAnObject, start),
                Err(e) => e,
            });
        }
        let (items_of, items) = match items {
            Some((name, items)) => (Some(name), Some(items)),
            None => (None, None),
        };
        self.read(
            text,
            mode,
            Capture {
                fields: Some(fields),
                items,
                items_of,
                item_fields,
            },
        )
    }

    /// Reads `text`, which must be one JSON array, and appends its elements' text to `items`.
    pub fn array(
        &mut self,
        text: &'a str,
        mode: Mode,
        items: &mut Vec<&'a str>,
    ) -> Result<(), JsonError> {
        let start = skip_space(text.as_bytes(), 0);
        if text.as_bytes().get(start) != Some(&b'[') {
            return Err(JsonError::new(ErrorKind::ExpectedValue, start));
        }
        self.read(
            text,
            mode,
            Capture {
                items: Some(items),
                ..Capture::default()
            },
        )
    }

    /// Checks that `text` is one JSON value.
    pub fn value(&mut self, text: &'a str, mode: Mode) -> Result<(), JsonError> {
        self.read(text, mode, Capture::default())
    }

    fn read(
        &mut self,
        text: &'a str,
        mode: Mode,
        capture: Capture<'a, '_>,
    ) -> Result<(), JsonError> {
        self.walk(text, 0, mode, capture, true).map(|_| ())
    }

    /// Reads the value at `from` and returns where it ends; with `whole`, nothing but white space
    /// may follow it.
    pub(super) fn walk(
        &mut self,
        text: &'a str,
        from: usize,
        mode: Mode,
        mut capture: Capture<'a, '_>,
        whole: bool,
    ) -> Result<usize, JsonError> {
        self.frames.clear();
        self.keys.clear();
        self.fields_wanted = capture.fields.is_some();
        let b = text.as_bytes();
        let strict = mode == Mode::Strict;
        let mut at = from;
        // Where the top-level container's current part began, and the key of the top-level
        // object's current field, for the capture.
        let mut part_start = 0;
        let mut part_key: Option<(Cow<'a, str>, &'a str)> = None;
        let items_depth = capture.items_depth();
        // Whether the array open at `items_depth` is the one whose elements are captured, and
        // where its current element began.
        let mut items_open = false;
        let mut item_start = 0;
        'value: loop {
            at = skip_space(b, at);
            let &first = b.get(at).ok_or(JsonError::new(ErrorKind::Eof, at))?;
            let mut read_whole = false;
            if items_open && self.frames.len() == items_depth {
                if let Some(events) = capture.item_fields.as_mut().filter(|e| e.wants_more()) {
                    if let Some(end) = events.read_next(text, at, first == b'{') {
                        // The event was read whole: the body's reader goes on after it.
                        at = end;
                        read_whole = true;
                    }
                }
            }
            match first {
                _ if read_whole => {}
                b'{' | b'[' => {
                    if strict && self.frames.len() >= MAX_DEPTH {
                        return Err(JsonError::new(ErrorKind::TooDeep, at));
                    }
                    at = skip_space(b, at + 1);
                    if first == b'[' {
                        self.frames.push(Frame::Array);
                        let depth = self.frames.len();
                        if depth == items_depth {
                            items_open = depth == 1
                                || part_key.as_ref().map(|(k, _)| k.as_ref()) == capture.items_of;
                        }
                        if b.get(at) != Some(&b']') {
                            if depth == 1 {
                                part_start = at;
                            }
                            if depth == items_depth {
                                item_start = at;
                            }
                            continue 'value;
                        }
                    } else {
                        let keys_from = self.keys.len();
                        self.frames.push(Frame::Object { keys_from });
                        if b.get(at) != Some(&b'}') {
                            at = skip_space(
                                b,
                                self.key(text, at, strict, keys_from, &mut part_key)?,
                            );
                            if self.frames.len() == 1 {
                                part_start = at;
                            }
                            continue 'value;
                        }
                    }
                    // An empty container: it ends at once.
                    if self.frames.len() == items_depth {
                        items_open = false;
                    }
                    at += 1;
                    self.frames.pop();
                }
                b'"' => at = string(b, at, strict)?.0,
                b'-' | b'0'..=b'9' => at = number(text, at, strict)?,
                b't' => at = literal(b, at, b"true")?,
                b'f' => at = literal(b, at, b"false")?,
                b'n' => at = literal(b, at, b"null")?,
                _ => return Err(JsonError::new(ErrorKind::ExpectedValue, at)),
            }
            // A value ended at `at`: close every container that ends here, then go on to the
            // next value, or finish.
            loop {
                let depth = self.frames.len();
                if depth == 0 {
                    if !whole {
                        return Ok(at);
                    }
                    at = skip_space(b, at);
                    return if at == b.len() {
                        Ok(at)
                    } else {
                        Err(JsonError::new(ErrorKind::Trailing, at))
                    };
                }
                if depth == 1 {
                    if let (Some(fields), Some((key, key_text))) =
                        (&mut capture.fields, part_key.take())
                    {
                        fields.push(Field {
                            key,
                            key_text,
                            value: &text[part_start..at],
                        });
                    }
                }
                if depth == items_depth && items_open {
                    if let Some(items) = &mut capture.items {
                        items.push(&text[item_start..at]);
                    }
                }
                at = skip_space(b, at);
                let frame = self.frames[depth - 1];
                match (b.get(at), frame) {
                    (Some(b','), Frame::Array) => {
                        at = skip_space(b, at + 1);
                        if depth == 1 {
                            part_start = at;
                        }
                        if depth == items_depth {
                            item_start = at;
                        }
                        continue 'value;
                    }
                    (Some(b','), Frame::Object { keys_from }) => {
                        at = skip_space(
                            b,
                            self.key(
                                text,
                                skip_space(b, at + 1),
                                strict,
                                keys_from,
                                &mut part_key,
                            )?,
                        );
                        if depth == 1 {
                            part_start = at;
                        }
                        continue 'value;
                    }
                    (Some(b']'), Frame::Array) => {
                        if depth == items_depth {
                            items_open = false;
                        }
                    }
                    (Some(b'}'), Frame::Object { keys_from }) => {
                        if strict {
                            self.check_keys(keys_from)?;
                        }
                        self.keys.truncate(keys_from);
                    }
                    (None, _) => return Err(JsonError::new(ErrorKind::Eof, at)),
                    _ => return Err(JsonError::new(ErrorKind::ExpectedCommaOrEnd, at)),
                }
                at += 1;
                self.frames.pop();
            }
        }
    }

    /// Reads a key and its colon at `at`; returns where its value starts. Keeps the key (to refuse
    /// a repeated one) when strict, and hands the top-level object's keys to the capture.
    fn key(
        &mut self,
        text: &'a str,
        at: usize,
        strict: bool,
        keys_from: usize,
        part_key: &mut Option<(Cow<'a, str>, &'a str)>,
    ) -> Result<usize, JsonError> {
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
        let top = self.frames.len() == 1 && self.fields_wanted;
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
                *part_key = Some((key, key_text));
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

fn skip_space(b: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(at) {
        at += 1;
    }
    at
}

fn literal(b: &[u8], at: usize, word: &[u8]) -> Result<usize, JsonError> {
    let end = at + word.len();
    match b.get(at..end) {
        Some(got) if got == word => Ok(end),
        _ => {
            let kind = if b.len() < end && b[at..].iter().zip(word).all(|(x, y)| x == y) {
                ErrorKind::Eof
            } else {
                ErrorKind::ExpectedValue
            };
            Err(JsonError::new(kind, at))
        }
    }
}

/// The string at `at` (its opening quote): where it ends (past the closing quote) and whether it
/// holds an escape. Strict refuses a `\u` escape that is half of a surrogate pair.
fn string(b: &[u8], at: usize, strict: bool) -> Result<(usize, bool), JsonError> {
    let mut i = at + 1;
    let mut escaped = false;
    loop {
        i = plain_run(b, i);
        match b.get(i) {
            None => return Err(JsonError::new(ErrorKind::Eof, i)),
            Some(b'"') => return Ok((i + 1, escaped)),
            Some(b'\\') => {
                escaped = true;
                i = escape(b, i, strict)?;
            }
            Some(_) => return Err(JsonError::new(ErrorKind::ControlCharacter, i)),
        }
    }
}

/// Where the run of plain string bytes from `at` ends: at the first quote, backslash or control
/// character (or the text's end). Eight bytes are tested at a time.
pub(crate) fn plain_run(b: &[u8], mut at: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = b.get(at..at + 8) {
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        // A byte's high bit is set where it is a quote, a backslash or under 0x20; a borrow can
        // mark bytes after the first such byte, never one before it.
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        let special = (quote.wrapping_sub(ONES) & !quote
            | backslash.wrapping_sub(ONES) & !backslash
            | w.wrapping_sub(ONES * 0x20) & !w)
            & HIGH;
        if special != 0 {
            return at + (special.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while let Some(&c) = b.get(at) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        at += 1;
    }
    at
}

/// The escape at `at` (its backslash): where it ends.
fn escape(b: &[u8], at: usize, strict: bool) -> Result<usize, JsonError> {
    match b.get(at + 1) {
        None => Err(JsonError::new(ErrorKind::Eof, at + 1)),
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(at + 2),
        Some(b'u') => {
            let unit = hex4(b, at + 2)?;
            if !strict {
                return Ok(at + 6);
            }
            match unit {
                0xD800..=0xDBFF => {
                    // A leading half: the trailing half must follow as the next escape.
                    if b.get(at + 6) == Some(&b'\\') && b.get(at + 7) == Some(&b'u') {
                        match hex4(b, at + 8)? {
                            0xDC00..=0xDFFF => Ok(at + 12),
                            _ => Err(JsonError::new(ErrorKind::LoneSurrogate, at)),
                        }
                    } else if b.len() <= at + 7 {
                        Err(JsonError::new(ErrorKind::Eof, at + 6))
                    } else {
                        Err(JsonError::new(ErrorKind::LoneSurrogate, at))
                    }
                }
                0xDC00..=0xDFFF => Err(JsonError::new(ErrorKind::LoneSurrogate, at)),
                _ => Ok(at + 6),
            }
        }
        Some(_) => Err(JsonError::new(ErrorKind::InvalidEscape, at + 1)),
    }
}

fn hex4(b: &[u8], at: usize) -> Result<u16, JsonError> {
    let mut unit = 0u16;
    for i in at..at + 4 {
        let digit = match b.get(i) {
            None => return Err(JsonError::new(ErrorKind::Eof, i)),
            Some(&c) => (c as char)
                .to_digit(16)
                .ok_or(JsonError::new(ErrorKind::InvalidEscape, i))?,
        };
        unit = unit * 16 + digit as u16;
    }
    Ok(unit)
}

/// The number at `at`: where it ends. Strict refuses one a double cannot hold.
fn number(text: &str, at: usize, strict: bool) -> Result<usize, JsonError> {
    let b = text.as_bytes();
    let digits = |mut i: usize| {
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let mut i = at + usize::from(b[at] == b'-');
    let int_start = i;
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits(i + 1),
        None => return Err(JsonError::new(ErrorKind::Eof, i)),
        Some(_) => return Err(JsonError::new(ErrorKind::InvalidNumber, i)),
    }
    // Digits before the point, leading zero aside: how large the number may be.
    let int_digits = if b[int_start] == b'0' {
        0
    } else {
        (i - int_start) as i64
    };
    if b.get(i) == Some(&b'.') {
        let end = digits(i + 1);
        if end == i + 1 {
            return Err(JsonError::new(
                if end >= b.len() {
                    ErrorKind::Eof
                } else {
                    ErrorKind::InvalidNumber
                },
                end,
            ));
        }
        i = end;
    }
    let mut exponent: Option<i64> = Some(0);
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        let negative = b.get(i) == Some(&b'-');
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        let end = digits(i);
        if end == i {
            return Err(JsonError::new(
                if end >= b.len() {
                    ErrorKind::Eof
                } else {
                    ErrorKind::InvalidNumber
                },
                end,
            ));
        }
        // Five digits or more: serde_json decides.
        exponent = text[i..end]
            .parse::<i64>()
            .ok()
            .filter(|e| *e < 10_000)
            .map(|e| if negative { -e } else { e });
        i = end;
    }
    let sure = exponent.is_some_and(|e| int_digits + e < SURE_FINITE_DIGITS);
    if strict && !sure && serde_json::from_str::<f64>(&text[at..i]).is_err() {
        return Err(JsonError::new(ErrorKind::NumberOutOfRange, at));
    }
    Ok(i)
}

/// The text of a JSON string's contents (between its quotes, which passed the reader) with its
/// escapes decoded. A lone surrogate (which only skimmed text can hold) becomes U+FFFD.
pub fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let b = rest.as_bytes();
        let (c, used) = match b.get(i + 1) {
            Some(b'b') => ('\u{8}', 2),
            Some(b'f') => ('\u{c}', 2),
            Some(b'n') => ('\n', 2),
            Some(b'r') => ('\r', 2),
            Some(b't') => ('\t', 2),
            Some(b'u') => {
                let unit = |at: usize| {
                    rest.get(at..at + 4)
                        .and_then(|h| u32::from_str_radix(h, 16).ok())
                };
                match unit(i + 2) {
                    Some(high @ 0xD800..=0xDBFF) if rest.get(i + 6..i + 8) == Some("\\u") => {
                        match unit(i + 8) {
                            Some(low @ 0xDC00..=0xDFFF) => (
                                char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
                                    .unwrap_or('\u{FFFD}'),
                                12,
                            ),
                            _ => ('\u{FFFD}', 6),
                        }
                    }
                    Some(u) => (char::from_u32(u).unwrap_or('\u{FFFD}'), 6),
                    None => ('\u{FFFD}', 2),
                }
            }
            Some(&c) => (c as char, 2),
            None => ('\u{FFFD}', 1),
        };
        out.push(c);
        rest = &rest[(i + used).min(rest.len())..];
    }
    out.push_str(rest);
    out
}

/// A string value's contents with escapes decoded (borrowed when it has none), or `None` when
/// `value` (a value's text as read) is not a string.
pub fn string_value(value: &str) -> Option<Cow<'_, str>> {
    let inner = value.strip_prefix('"')?.strip_suffix('"')?;
    Some(if inner.contains('\\') {
        Cow::Owned(unescape(inner))
    } else {
        Cow::Borrowed(inner)
    })
}

/// Whether `value` (a value's text as read) is a number.
pub fn is_number(value: &str) -> bool {
    matches!(value.as_bytes().first(), Some(b'-' | b'0'..=b'9'))
}

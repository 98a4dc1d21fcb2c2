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
//!
//! Here the entry points and what a read hands back; `walk` the pass itself, container by
//! container; `scalars` the strings, numbers and literals; `decode` a value's text decoded;
//! `error` what is wrong and where; `items` a batch's events read strictly within the pass.

use std::borrow::Cow;

mod decode;
mod error;
mod items;
mod scalars;
mod walk;

pub use decode::{is_number, string_value, unescape};
pub use error::{ErrorKind, JsonError};
pub use items::ItemFields;
pub(crate) use scalars::plain_run;

use scalars::skip_space;

/// Deepest nesting strict text may have: serde_json refuses the 128th level.
pub const MAX_DEPTH: usize = 127;

/// One field of an object: its key (escapes decoded, to compare), the key's text as sent (with
/// its quotes), and the value's text as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field<'a> {
    pub key: Cow<'a, str>,
    pub key_text: &'a str,
    pub value: &'a str,
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
}

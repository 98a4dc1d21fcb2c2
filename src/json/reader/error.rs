//! What is wrong with a text, and at which byte.

use std::fmt;

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
    pub(super) fn new(kind: ErrorKind, at: usize) -> Self {
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

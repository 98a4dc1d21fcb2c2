//! A value's text as read, decoded: a string's contents with their escapes, and which kind a
//! value is.

use std::borrow::Cow;

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

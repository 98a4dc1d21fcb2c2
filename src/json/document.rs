//! A record value read strictly once: what the worker's ids and content digests are made from.
//!
//! [`Document::read`] takes bytes that are one JSON value under the strict [`reader`](super::reader)
//! (UTF-8, no repeated key at any depth, no lone surrogate, no number out of a double's range,
//! under 128 levels); [`Document::pointer`] finds a value by an RFC 6901 pointer (`~1` is `/`,
//! `~0` is `~`, array elements by index) as its text as sent; [`Document::canonical`] writes the
//! document's canonical text (strings decoded and written one way), leaving out fields named by
//! pointers into the original document, all at once: `/a/0` and `/a/1` remove the first two
//! elements, not the first and the third.

use std::borrow::Cow;

use super::canonical::{Canonical, Strings};
use super::reader::{string_value, ErrorKind, JsonError, Mode, Reader};

/// Why a value cannot be read as one exact JSON document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// The bytes are not UTF-8.
    NotUtf8,
    /// An object has the same key twice: the document has no one meaning.
    RepeatedKey,
    /// Not one JSON value, or one the strict reader refuses (see its doc).
    NotJson(JsonError),
}

/// A JSON value that passed the strict reader.
#[derive(Debug, Clone, Copy)]
pub struct Document<'a> {
    text: &'a str,
}

/// What a pointer names, as an id reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scalar<'a> {
    /// A string's decoded text.
    String(Cow<'a, str>),
    /// A number's exact text.
    Number(&'a str),
    /// `null`.
    Null,
    /// `true`, `false`, an object or an array.
    Other,
}

impl<'a> Document<'a> {
    /// Reads `bytes` strictly.
    pub fn read(bytes: &'a [u8]) -> Result<Self, Unreadable> {
        let text = std::str::from_utf8(bytes).map_err(|_| Unreadable::NotUtf8)?;
        match Reader::default().value(text, Mode::Strict) {
            Ok(()) => Ok(Self { text }),
            Err(e) if e.kind == ErrorKind::DuplicateKey => Err(Unreadable::RepeatedKey),
            Err(e) => Err(Unreadable::NotJson(e)),
        }
    }

    /// The document's text as read.
    pub fn text(&self) -> &'a str {
        self.text
    }

    /// The text (as sent, without surrounding white space) of the value `pointer` names, if there
    /// is one. `""` names the whole document; a pointer that does not start with `/` names nothing.
    pub fn pointer(&self, pointer: &str) -> Option<&'a str> {
        let mut value = self.text.trim_matches([' ', '\t', '\n', '\r']);
        if pointer.is_empty() {
            return Some(value);
        }
        let mut tokens = pointer.strip_prefix('/')?.split('/');
        tokens.try_for_each(|token| {
            value = child(value, &decode_token(token))?;
            Some(())
        })?;
        Some(value)
    }

    /// The value `pointer` names, as an id reads it; `None` if there is none.
    pub fn scalar(&self, pointer: &str) -> Option<Scalar<'a>> {
        let value = self.pointer(pointer)?;
        Some(match value.as_bytes().first() {
            Some(b'"') => Scalar::String(string_value(value)?),
            Some(b'-' | b'0'..=b'9') => Scalar::Number(value),
            Some(b'n') => Scalar::Null,
            _ => Scalar::Other,
        })
    }

    /// Where the value `pointer` names starts in the document's text.
    pub fn offset(&self, pointer: &str) -> Option<usize> {
        let value = self.pointer(pointer)?;
        Some(value.as_ptr() as usize - self.text.as_ptr() as usize)
    }

    /// The document's canonical text (strings decoded, see [`super::canonical`]) into `out`,
    /// without the values `without` names in the original document (absent ones ignored; a
    /// pointer to the whole document is ignored too).
    pub fn canonical(&self, without: &[String], canonical: &mut Canonical, out: &mut Vec<u8>) {
        let mut removed: Vec<usize> = without
            .iter()
            .filter(|p| !p.is_empty())
            .filter_map(|p| self.offset(p))
            .collect();
        removed.sort_unstable();
        // A document that passed the strict reader always has a canonical text.
        let written = canonical.write_without(self.text, &removed, out);
        debug_assert!(written.is_some(), "strict text has a canonical form");
    }

    /// The canonical text of the value `text` (a value of this document, as [`Document::pointer`]
    /// gives it) into `out`.
    pub fn canonical_of(text: &str, canonical: &mut Canonical, out: &mut Vec<u8>) {
        let written = canonical.write(text, out);
        debug_assert!(written.is_some(), "strict text has a canonical form");
    }
}

/// A writer of the canonical text the worker's ids and digests use (strings decoded).
pub fn id_writer() -> Canonical {
    Canonical::new(Strings::Decoded)
}

/// A pointer's reference token with `~1` read as `/` and `~0` as `~` (in that order, as RFC 6901
/// says, so `~01` is `~1`).
fn decode_token(token: &str) -> Cow<'_, str> {
    if token.contains('~') {
        Cow::Owned(token.replace("~1", "/").replace("~0", "~"))
    } else {
        Cow::Borrowed(token)
    }
}

/// The member `token` of the object `value`, or its element at index `token` if it is an array.
fn child<'a>(value: &'a str, token: &str) -> Option<&'a str> {
    match value.as_bytes().first()? {
        b'{' => {
            let mut fields = Vec::new();
            Reader::default()
                .object(value, Mode::Skim, &mut fields)
                .ok()?;
            // The strict read refused a repeated key: at most one field has this key.
            fields.into_iter().find(|f| f.key == token).map(|f| f.value)
        }
        b'[' => {
            // RFC 6901: an index is `0` or digits without a leading zero.
            if token.is_empty()
                || !token.bytes().all(|b| b.is_ascii_digit())
                || (token.len() > 1 && token.starts_with('0'))
            {
                return None;
            }
            let index: usize = token.parse().ok()?;
            let mut items = Vec::new();
            Reader::default()
                .array(value, Mode::Skim, &mut items)
                .ok()?;
            items.get(index).copied()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> Document<'_> {
        Document::read(text.as_bytes()).unwrap()
    }

    fn canonical_without(text: &str, without: &[&str]) -> String {
        let without: Vec<String> = without.iter().map(|p| p.to_string()).collect();
        let mut out = Vec::new();
        doc(text).canonical(&without, &mut id_writer(), &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn pointers_follow_rfc_6901() {
        let d = doc(
            r#" {"a/b":1,"m~n":2,"x":{"":3,"y":[10, 11 ,{"z":"\u00e9"}]},"n":12345678901234567890123} "#,
        );
        assert_eq!(d.pointer(""), Some(d.text().trim()));
        assert_eq!(d.pointer("/a~1b"), Some("1"));
        assert_eq!(d.pointer("/m~0n"), Some("2"));
        assert_eq!(d.pointer("/x/"), Some("3"));
        assert_eq!(d.pointer("/x/y/1"), Some("11"));
        assert_eq!(d.pointer("/x/y/2/z"), Some(r#""\u00e9""#));
        assert_eq!(d.scalar("/x/y/2/z"), Some(Scalar::String("é".into())));
        assert_eq!(
            d.scalar("/n"),
            Some(Scalar::Number("12345678901234567890123"))
        );
        assert_eq!(d.scalar("/x"), Some(Scalar::Other));
        // No such member, an index past the end, a leading zero, `-`, a pointer into a scalar.
        for missing in ["/q", "/x/y/3", "/x/y/01", "/x/y/-", "/a~1b/c", "x"] {
            assert_eq!(d.pointer(missing), None, "{missing}");
        }
    }

    #[test]
    fn what_the_strict_reader_refuses_is_unreadable() {
        assert_eq!(
            Document::read(br#"{"a":1,"a":2}"#).unwrap_err(),
            Unreadable::RepeatedKey
        );
        assert_eq!(
            Document::read(br#"{"b":{"a":1,"a":2}}"#).unwrap_err(),
            Unreadable::RepeatedKey
        );
        assert_eq!(Document::read(b"\xff{}").unwrap_err(), Unreadable::NotUtf8);
        for bad in [
            &b"\xef\xbb\xbf{}"[..],
            b"1e400",
            br#""\ud800""#,
            b"",
            b"not json",
            b"{} {}",
        ] {
            assert!(
                matches!(Document::read(bad), Err(Unreadable::NotJson(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn fields_left_out_are_named_in_the_original_document() {
        // `/a/0` and `/a/1` are the first two elements, whatever order they are given in.
        assert_eq!(
            canonical_without(r#"{"a":[0,1,2],"b":1}"#, &["/a/0", "/a/1"]),
            r#"{"a":[2],"b":1}"#
        );
        assert_eq!(
            canonical_without(r#"{"a":[0,1,2],"b":1}"#, &["/a/1", "/a/0"]),
            r#"{"a":[2],"b":1}"#
        );
        // Absent fields are ignored, nested and escaped ones found.
        assert_eq!(
            canonical_without(
                r#"{ "s" : 1, "a/b":2, "p":{"q":3,"r":4} }"#,
                &["/a~1b", "/p/q", "/nope"]
            ),
            r#"{"p":{"r":4},"s":1}"#
        );
    }
}

//! An id as an operator names it to `dedupe explain` and `dedupe forget` (and the admin routes
//! behind them), and the ledger key that is: the key the worker gives the id it reads from a
//! record, or a refusal saying how to ask, never the key of another id.
//!
//! A `json:` id source keys a JSON number under a tag ([`super::NUMBER_ID_TAG`]) and a JSON string
//! by its decoded text, so `12345678901234567890` typed as text names the string, never the
//! number. Named as one JSON value ([`NamedId::Json`], `--json-id`), the text is read by the one
//! strict reader and keyed by [`json_value_id`], the worker's own function. Named as text where the
//! id source reads JSON and the text is a JSON number, the question has two meanings, and the
//! answer is a refusal that names both ([`NamedIdError::NumberOrString`]) rather than an answer
//! about an id the asker may not mean ("never seen", "forgot").

use super::record::{json_value_id, JsonValueError};
use super::{ledger_key, IdError, IdSource, LedgerKey, Unkeyed};
use crate::json::Unreadable;
use crate::wire::scoped_id;

/// How an operator names an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamedId<'a> {
    /// The id as the worker reads it: a key's or a header's bytes, a JSON string's decoded text,
    /// a composite's joined parts; with the front door's source, the client's message id.
    Text(&'a str),
    /// The text of one JSON value: a number (`12345678901234567890`) or a string (`"abc"`),
    /// keyed as a `json:` pointer keys the value it names.
    Json(&'a str),
}

/// An id named, as the worker holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The id as the worker reads it: `<source>:<id>` with the front door's source, a JSON
    /// string's decoded text, a JSON number's exact text.
    pub id: String,
    pub key: LedgerKey,
    /// Named as a JSON number: its key is the number's text under the tag.
    pub json_number: bool,
}

/// Why a named id is not asked about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamedIdError {
    #[error("not a message id: {0}")]
    Id(#[from] IdError),
    /// `Json` text the strict reader refuses.
    #[error("`{text}` is not one JSON value: {why}; a JSON id is a number (12345) or a string in double quotes (\"abc\")")]
    NotJson { text: String, why: String },
    /// `Json` text that is a JSON value no record's id can be.
    #[error("`{text}` is {what}: a JSON id is a number or a non-empty string of at most 1 KiB")]
    NoJsonId { text: String, what: &'static str },
    /// `Json` with the front door's source: its ids are text scoped by source.
    #[error("a JSON id is read from a record's value, never scoped by the front door's source: name the id without --json-id (json_id on the admin routes), or without the source")]
    JsonWithSource,
    /// `Json` where the id source reads no id from a single JSON value.
    #[error("the id source is {id_source}, which never reads an id from one JSON value: {how}")]
    NoJsonSource { id_source: String, how: String },
    /// `Text` that is a JSON number where the id source reads JSON.
    #[error("this id source ({id_source}) reads JSON; {text} is a number there: {how}")]
    NumberOrString {
        id_source: String,
        text: String,
        how: String,
    },
}

/// The id `named` names (with the front door's `source`, if any) as a worker whose id source is
/// `id_source` holds it; or why it cannot be asked about as named.
pub fn named_id(
    named: NamedId<'_>,
    source: Option<&str>,
    id_source: &IdSource,
) -> Result<Named, NamedIdError> {
    match named {
        NamedId::Text(text) => {
            if source.is_none() {
                refuse_a_number(text, id_source)?;
            }
            let id = match source {
                Some(source) => scoped_id(source, text),
                None => text.to_string(),
            };
            let key = ledger_key(id.as_bytes())?;
            Ok(Named {
                id,
                key,
                json_number: false,
            })
        }
        NamedId::Json(text) => {
            if source.is_some() {
                return Err(NamedIdError::JsonWithSource);
            }
            json_source(id_source)?;
            let (id, json_number) = json_value_id(text).map_err(|e| not_json(text, e))?;
            Ok(Named {
                id: String::from_utf8_lossy(&id.bytes).into_owned(),
                key: id.key,
                json_number,
            })
        }
    }
}

/// Refuses a JSON id where the id source reads none from one JSON value.
fn json_source(id_source: &IdSource) -> Result<(), NamedIdError> {
    let how = match id_source {
        IdSource::JsonPointer(_) => return Ok(()),
        IdSource::Composite(_) => "its ids are its parts joined, each its length, `:` and its bytes, or `#` and the text for a JSON number (a number 123 then \"ab\": 3#1232:ab); name that id without --json-id".to_string(),
        _ => "its ids are bytes, never read as JSON; name the id without --json-id".to_string(),
    };
    Err(NamedIdError::NoJsonSource {
        id_source: id_source.to_string(),
        how,
    })
}

/// Refuses text that is a JSON number when the id source reads JSON: it names a number or a
/// string there, and the text alone keys the string.
fn refuse_a_number(text: &str, id_source: &IdSource) -> Result<(), NamedIdError> {
    let reads_json = |s: &IdSource| matches!(s, IdSource::JsonPointer(_));
    let how = match id_source {
        s if reads_json(s) => format!(
            "ask with --json-id {text}, or --json-id '\"{text}\"' for the string (json_id on the admin routes)"
        ),
        IdSource::Composite(parts) if parts.iter().any(reads_json) => format!(
            "its ids are its parts joined, never a number alone: a number part is its length, `#` and its text ({}#{text}), a string part its length, `:` and its text",
            text.len()
        ),
        _ => return Ok(()),
    };
    // Exactly a JSON number, as the strict reader reads one; surrounding white space would be
    // the string's, not the number's.
    let number =
        matches!(json_value_id(text), Ok((id, true)) if id.bytes.as_ref() == text.as_bytes());
    if !number {
        return Ok(());
    }
    Err(NamedIdError::NumberOrString {
        id_source: id_source.to_string(),
        text: text.to_string(),
        how,
    })
}

/// Why `text` is no JSON id, in words.
fn not_json(text: &str, e: JsonValueError) -> NamedIdError {
    let no_id = |what| NamedIdError::NoJsonId {
        text: text.to_string(),
        what,
    };
    match e {
        JsonValueError::Unreadable(Unreadable::NotJson(e)) => NamedIdError::NotJson {
            text: text.to_string(),
            why: e.describe(text),
        },
        JsonValueError::Unreadable(Unreadable::NotUtf8) => NamedIdError::NotJson {
            text: text.to_string(),
            why: "not UTF-8".to_string(),
        },
        JsonValueError::Unreadable(Unreadable::RepeatedKey) => no_id("an object with a key twice"),
        JsonValueError::NoId(Unkeyed::Missing) => no_id("null"),
        JsonValueError::NoId(Unkeyed::Empty) => no_id("empty"),
        JsonValueError::NoId(Unkeyed::TooLong) => no_id("longer than 1 KiB"),
        JsonValueError::NoId(_) => no_id("neither a number nor a string"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{copied_view, message_key};

    fn json_source() -> IdSource {
        IdSource::JsonPointer("/id".into())
    }

    /// The key a worker reading ids as `source` gives the record whose value is `value`.
    fn worker_key(value: &str, source: &IdSource) -> LedgerKey {
        message_key(&copied_view(None, &[], Some(value.as_bytes())), source).unwrap()
    }

    #[test]
    fn a_json_id_is_keyed_as_the_worker_keys_the_field() {
        let source = json_source();
        // The number 12345678901234567890 held from `{"id":12345678901234567890}`.
        let number = named_id(NamedId::Json("12345678901234567890"), None, &source).unwrap();
        assert_eq!(
            number.key,
            worker_key(r#"{"id":12345678901234567890}"#, &source)
        );
        assert_eq!(number.id, "12345678901234567890");
        assert!(number.json_number);
        // The string of the same digits is another id, the one `{"id":"1234..."}` holds.
        let string = named_id(NamedId::Json(r#""12345678901234567890""#), None, &source).unwrap();
        assert_eq!(
            string.key,
            worker_key(r#"{"id":"12345678901234567890"}"#, &source)
        );
        assert_ne!(string.key, number.key);
        assert!(!string.json_number);
        // A string that is not a number needs no --json-id: as text it names the same id.
        let abc = named_id(NamedId::Json(r#""abc""#), None, &source).unwrap();
        let bare = named_id(NamedId::Text("abc"), None, &source).unwrap();
        assert_eq!((abc.key, abc.id.as_str()), (bare.key, "abc"));
        assert_eq!(bare.key, worker_key(r#"{"id":"abc"}"#, &source));
    }

    #[test]
    fn a_number_named_as_text_where_the_id_source_reads_json_is_refused_naming_both_ways() {
        let e = named_id(NamedId::Text("12345678901234567890"), None, &json_source()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "this id source (json:/id) reads JSON; 12345678901234567890 is a number there: ask with \
             --json-id 12345678901234567890, or --json-id '\"12345678901234567890\"' for the string \
             (json_id on the admin routes)"
        );
        // In a composite a number alone is no id: the answer says how parts join.
        let composite: IdSource = serde_json::from_str(r#"["key", "json:/id"]"#).unwrap();
        let e = named_id(NamedId::Text("12345"), None, &composite).unwrap_err();
        assert!(e.to_string().contains("5#12345"), "{e}");
        // Text that is no bare JSON number, and any text where the id source reads no JSON,
        // is the id as the worker reads it.
        for text in ["12a", " 12", "\"12\"", "1e400", "m-1"] {
            let named = named_id(NamedId::Text(text), None, &json_source()).unwrap();
            assert_eq!(named.key, ledger_key(text.as_bytes()).unwrap(), "{text}");
        }
        for source in [IdSource::Key, IdSource::Header("id".into())] {
            let named = named_id(NamedId::Text("12345"), None, &source).unwrap();
            assert_eq!(named.key, ledger_key(b"12345").unwrap());
        }
        // With the front door's source the id is `<source>:<id>`, never a number.
        let scoped = named_id(NamedId::Text("12345"), Some("web"), &json_source()).unwrap();
        assert_eq!(scoped.id, "web:12345");
    }

    #[test]
    fn a_json_id_the_worker_could_not_hold_is_refused_saying_why() {
        let source = json_source();
        let refused = |text| named_id(NamedId::Json(text), None, &source).unwrap_err();
        assert!(matches!(refused("abc"), NamedIdError::NotJson { .. }));
        assert!(refused("abc").to_string().contains("in double quotes"));
        assert!(matches!(refused("1 2"), NamedIdError::NotJson { .. }));
        for (text, what) in [("null", "null"), ("\"\"", "empty"), ("{}", "neither")] {
            assert!(refused(text).to_string().contains(what), "{text}");
        }
        // With the front door's source, or an id source that never reads one JSON value.
        assert_eq!(
            named_id(NamedId::Json("1"), Some("web"), &source),
            Err(NamedIdError::JsonWithSource)
        );
        for other in [
            IdSource::Key,
            serde_json::from_str(r#"["key", "json:/id"]"#).unwrap(),
        ] {
            let e = named_id(NamedId::Json("1"), None, &other).unwrap_err();
            assert!(matches!(e, NamedIdError::NoJsonSource { .. }), "{e}");
        }
    }
}

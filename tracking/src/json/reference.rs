//! serde_json's verdicts on the same questions the [`reader`](super::reader) answers in one pass:
//! the reference it is tested against (every strict rule, on generated text) and benched against
//! (`examples/parse_bench.rs`): the strict check and the skim of an object's fields the front door
//! made in two passes before the reader.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// The message of the error a repeated key gives.
pub const DUPLICATE_KEY: &str = "an object has the same key twice";

/// Refuses what a full parse with serde_json refuses although a skim passes it: a number too
/// large for a double (`1e999`), a `\u` escape that is half of a surrogate pair, nesting over
/// 128 levels; and, as every route of this API does, an object with the same key twice (JSON
/// parsers disagree on which of the two counts, so such text has no one meaning to keep).
/// Nothing is allocated but the keys of an object with escapes in them.
pub fn check_strict(text: &str) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    de.deserialize_any(Strict)?;
    de.end()
}

/// Visits every value, keeping nothing but each object's keys until the object ends.
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Strict)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys: Vec<Cow<'de, str>> = Vec::new();
        let mut set: Option<HashSet<Cow<'de, str>>> = None;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            // A linear scan for the few keys most objects have, a set past that.
            let repeated = match &mut set {
                Some(set) => !set.insert(key),
                None if keys.len() < 16 => {
                    let repeated = keys.contains(&key);
                    keys.push(key);
                    repeated
                }
                None => {
                    let mut all: HashSet<Cow<'de, str>> = keys.drain(..).collect();
                    let repeated = !all.insert(key);
                    set = Some(all);
                    repeated
                }
            };
            if repeated {
                return Err(de::Error::custom(DUPLICATE_KEY));
            }
            map.next_value_seed(Strict)?;
        }
        Ok(())
    }
}

/// An object's top-level fields as serde_json skims them: each key decoded and each value's text.
pub fn fields(object: &str) -> Result<Vec<(Cow<'_, str>, &RawValue)>, serde_json::Error> {
    let mut reader = serde_json::Deserializer::from_str(object);
    let fields = reader.deserialize_map(FieldsVisitor)?;
    reader.end()?;
    Ok(fields)
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Vec<(Cow<'de, str>, &'de RawValue)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(12));
        while let Some(key) = map.next_key_seed(KeySeed)? {
            fields.push((key, map.next_value::<&'de RawValue>()?));
        }
        Ok(fields)
    }
}

/// A key borrowed from the text when it has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }
}

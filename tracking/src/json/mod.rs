//! JSON kept as the client sent it: an object's fields as their text (key and value), a strict
//! check that refuses what a full parse refuses, and a deep merge that writes both sides' text.
//!
//! Nothing here turns a value into a number or a string and back: a value reaches Kafka as the
//! bytes it arrived as (`98765432109876543210`, `1e2`, `"\u00e9"` stay exactly that). Only the
//! white space between the fields of an object this service rewrites is not kept.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// One field of an object: its key (escapes decoded, to compare), the key's text as sent (with
/// its quotes), and the value's text as sent.
#[derive(Debug, Clone, Copy)]
pub struct Field<'a> {
    pub key: &'a str,
    pub key_text: &'a str,
    pub value: &'a RawValue,
}

/// An object's fields in the order sent, keys decoded. The keys are owned only when they hold
/// escapes, which is rare.
pub struct Fields<'a> {
    keys: Vec<Cow<'a, str>>,
    key_texts: Vec<&'a str>,
    values: Vec<&'a RawValue>,
}

impl<'a> Fields<'a> {
    /// The fields of `object`, which must be a JSON object's text. Syntax is checked as far as
    /// serde_json's skim does (see [`check_strict`] for the rest); a key that appears twice is an
    /// error here already, so every lookup has one answer.
    pub fn parse(object: &'a str) -> Result<Self, serde_json::Error> {
        let fields = Self::parse_repeated(object)?;
        fields.check_unique()?;
        Ok(fields)
    }

    /// Like [`Fields::parse`], but a repeated key is kept as it is (for dropping `writeKey`
    /// from an event that is refused for repeating a key).
    pub fn parse_repeated(object: &'a str) -> Result<Self, serde_json::Error> {
        let mut reader = serde_json::Deserializer::from_str(object);
        let (keys, values) = reader.deserialize_map(FieldsVisitor)?;
        reader.end()?;
        let mut key_texts = Vec::with_capacity(values.len());
        let mut after = object.find('{').map_or(0, |i| i + 1);
        for value in &values {
            let text = key_text(object, after, value.get()).ok_or_else(|| de::Error::custom("cannot locate an object's key"))?;
            key_texts.push(text);
            after = offset_in(object, value.get()) + value.get().len();
        }
        Ok(Self { keys, key_texts, values })
    }

    /// Refuses a key that appears twice (what [`Fields::parse`] checks).
    pub fn check_unique(&self) -> Result<(), serde_json::Error> {
        let unique = if self.keys.len() <= 16 {
            self.keys.iter().enumerate().all(|(i, k)| !self.keys[..i].contains(k))
        } else {
            let mut seen = HashSet::with_capacity(self.keys.len());
            self.keys.iter().all(|k| seen.insert(k.as_ref()))
        };
        if unique {
            Ok(())
        } else {
            Err(de::Error::custom(DUPLICATE_KEY))
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = Field<'_>> {
        (0..self.values.len()).map(|i| Field { key: &self.keys[i], key_text: self.key_texts[i], value: self.values[i] })
    }

    /// The value of the field named `key`.
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.keys.iter().position(|k| k == key).map(|i| self.values[i])
    }
}

/// The message of the error a repeated key gives; [`is_duplicate_key`] recognizes it.
const DUPLICATE_KEY: &str = "an object has the same key twice";

/// Whether a serde_json error is the one [`Fields::parse`] or [`check_strict`] gives for a key
/// that appears twice in one object.
pub fn is_duplicate_key(e: &serde_json::Error) -> bool {
    e.to_string().starts_with(DUPLICATE_KEY)
}

/// The offset of `part` in `whole`; `part` must be a slice of `whole`.
fn offset_in(whole: &str, part: &str) -> usize {
    part.as_ptr() as usize - whole.as_ptr() as usize
}

/// The text of the key (quotes included) whose value is `value`, searched in `object` from
/// `after` (just past the `{` or the previous value). Between them is exactly `, "key" :` with
/// white space, so the key's closing quote is the last non-blank character before the colon and
/// its opening quote the first `"` after `after`.
fn key_text<'a>(object: &'a str, after: usize, value: &str) -> Option<&'a str> {
    let value_at = offset_in(object, value);
    let before = object.get(after..value_at)?;
    let open = before.find('"')?;
    let colon = before.trim_end().strip_suffix(':')?;
    let close = colon.trim_end();
    close.ends_with('"').then(|| &before[open..close.len()]).filter(|k| k.len() >= 2)
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = (Vec<Cow<'de, str>>, Vec<&'de RawValue>);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut keys = Vec::with_capacity(map.size_hint().unwrap_or(12));
        let mut values = Vec::with_capacity(keys.capacity());
        while let Some(key) = map.next_key_seed(KeySeed)? {
            keys.push(key);
            values.push(map.next_value::<&'de RawValue>()?);
        }
        Ok((keys, values))
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

/// Whether a value's text is an object (a `RawValue`'s text starts with its first token).
pub fn is_object(value: &RawValue) -> bool {
    value.get().starts_with('{')
}

/// Writes `own` deep-merged with `defaults`, both objects' text: `own`'s fields in their order,
/// a field that both have as objects merged the same way, and then `defaults`' fields that `own`
/// lacks, in theirs. Wherever both have a value that is not an object on both sides, `own`'s
/// wins (an explicit `null` included). Every value is written as its text.
pub fn merge_into(out: &mut Vec<u8>, own: &Fields<'_>, defaults: &Fields<'_>) -> Result<(), serde_json::Error> {
    out.push(b'{');
    let mut first = true;
    let mut field = |out: &mut Vec<u8>, key_text: &str| {
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(key_text.as_bytes());
        out.push(b':');
    };
    for f in own.iter() {
        field(out, f.key_text);
        match defaults.get(f.key).filter(|d| is_object(d) && is_object(f.value)) {
            Some(d) => merge_into(out, &Fields::parse(f.value.get())?, &Fields::parse(d.get())?)?,
            None => out.extend_from_slice(f.value.get().as_bytes()),
        }
    }
    for d in defaults.iter().filter(|d| own.get(d.key).is_none()) {
        field(out, d.key_text);
        out.extend_from_slice(d.value.get().as_bytes());
    }
    out.push(b'}');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(own: &str, defaults: &str) -> String {
        let mut out = Vec::new();
        merge_into(&mut out, &Fields::parse(own).unwrap(), &Fields::parse(defaults).unwrap()).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn fields_keep_their_text_and_order() {
        // Keys in the order sent, their text as sent (escapes included), values untouched.
        let text = r#" { "b" : 98765432109876543210 ,"a\u0041":1e2,  "c":{"x" : [1.50, "\u00e9"]} } "#;
        let f = Fields::parse(text).unwrap();
        let got: Vec<(&str, &str, &str)> = f.iter().map(|f| (f.key, f.key_text, f.value.get())).collect();
        assert_eq!(
            got,
            [("b", r#""b""#, "98765432109876543210"), ("aA", r#""a\u0041""#, "1e2"), ("c", r#""c""#, r#"{"x" : [1.50, "\u00e9"]}"#)]
        );
        assert_eq!(f.get("aA").map(RawValue::get), Some("1e2"));
        assert!(f.get("a").is_none());
        // A key with a quote and a colon in it is found whole.
        let f = Fields::parse(r#"{"k\":\"":"v","z":0}"#).unwrap();
        assert_eq!(f.iter().map(|f| f.key_text).collect::<Vec<_>>(), [r#""k\":\"""#, r#""z""#]);
        assert_eq!(f.iter().next().unwrap().key, r#"k":""#);
    }

    #[test]
    fn a_repeated_key_is_refused_at_any_depth() {
        // The same key twice, even written with an escape, has no one meaning.
        for text in [r#"{"a":1,"a":2}"#, r#"{"a":1,"\u0061":2}"#] {
            let e = Fields::parse(text).err().unwrap();
            assert!(is_duplicate_key(&e), "{e}");
        }
        let nested = format!(r#"{{"p":{{{}}}}}"#, (0..40).map(|i| format!(r#""k{}":0"#, i % 39)).collect::<Vec<_>>().join(","));
        for text in [r#"{"p":{"x":[{"y":1,"y":1}]}}"#, nested.as_str()] {
            let e = check_strict(text).unwrap_err();
            assert!(is_duplicate_key(&e), "{e}");
        }
        check_strict(r#"{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]}"#).unwrap();
    }

    #[test]
    fn strict_refuses_what_a_full_parse_refuses() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        for bad in [r#"{"x":1e999}"#, r#"[-1E+400]"#, r#""\ud800""#, r#""\ud800\u0041""#, r#""a\udc00""#, &deep(200)] {
            assert!(check_strict(bad).is_err(), "{bad:.60}");
        }
        for good in [r#"{"x":1e300,"y":-2.5E-400,"z":12345678901234567890123}"#, r#""\ud83d\ude00""#, &deep(100)] {
            check_strict(good).unwrap();
        }
    }

    #[test]
    fn a_deep_merge_writes_both_sides_as_sent() {
        // The message's own fields first, in its order; the defaults' missing ones after.
        assert_eq!(merged(r#"{"b":1.0,"a":{"x":1e2}}"#, r#"{"a":{"y":2,"x":3},"c":"\u00e9"}"#), r#"{"b":1.0,"a":{"x":1e2,"y":2},"c":"\u00e9"}"#);
        // The message's own non-object value wins, null included.
        assert_eq!(merged(r#"{"a":null,"b":"s"}"#, r#"{"a":{"y":2},"b":{"z":1}}"#), r#"{"a":null,"b":"s"}"#);
        assert_eq!(merged("{}", r#"{"a" : 1}"#), r#"{"a":1}"#);
        assert_eq!(merged(r#"{"a":1}"#, "{}"), r#"{"a":1}"#);
    }
}

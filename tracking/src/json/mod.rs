//! JSON kept as the client sent it: an object's fields as their text (key and value), read and
//! checked in one pass ([`reader`], the core's: `dedupe::json`, the one reading every id and
//! digest is made from), and a deep merge that writes both sides' text.
//!
//! Nothing here turns a value into a number or a string and back: a value reaches Kafka as the
//! bytes it arrived as (`98765432109876543210`, `1e2`, `"\u00e9"` stay exactly that). Only the
//! white space between the fields of an object this service rewrites is not kept.

pub mod reference;

pub use dedupe::json::reader;
pub use dedupe::json::ItemFields;
pub use reader::{is_number, string_value, Field, JsonError, Mode, Reader};

use reader::ErrorKind;

/// The top-level fields of an event this service reads, found once per event (see
/// [`Fields::named`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name {
    Type,
    Event,
    Name,
    UserId,
    AnonymousId,
    GroupId,
    PreviousId,
    Timestamp,
    Properties,
    Traits,
    MessageId,
    ReceivedAt,
    Context,
    Integrations,
    SentAt,
    WriteKey,
}

impl Name {
    const COUNT: usize = 16;

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Type => "type",
            Self::Event => "event",
            Self::Name => "name",
            Self::UserId => "userId",
            Self::AnonymousId => "anonymousId",
            Self::GroupId => "groupId",
            Self::PreviousId => "previousId",
            Self::Timestamp => "timestamp",
            Self::Properties => "properties",
            Self::Traits => "traits",
            Self::MessageId => "messageId",
            Self::ReceivedAt => "receivedAt",
            Self::Context => "context",
            Self::Integrations => "integrations",
            Self::SentAt => "sentAt",
            Self::WriteKey => "writeKey",
        }
    }

    fn of(key: &str) -> Option<Name> {
        Some(match key {
            "type" => Self::Type,
            "event" => Self::Event,
            "name" => Self::Name,
            "userId" => Self::UserId,
            "anonymousId" => Self::AnonymousId,
            "groupId" => Self::GroupId,
            "previousId" => Self::PreviousId,
            "timestamp" => Self::Timestamp,
            "properties" => Self::Properties,
            "traits" => Self::Traits,
            "messageId" => Self::MessageId,
            "receivedAt" => Self::ReceivedAt,
            "context" => Self::Context,
            "integrations" => Self::Integrations,
            "sentAt" => Self::SentAt,
            "writeKey" => Self::WriteKey,
            _ => return None,
        })
    }
}

/// An object's fields in the order sent, keys decoded.
#[derive(Debug, Default)]
pub struct Fields<'a> {
    /// The object's text, which every field is a slice of.
    text: &'a str,
    list: Vec<Field<'a>>,
    /// Where each [`Name`]'s first field is in `list`, plus one (0: absent).
    named: [u16; Name::COUNT],
}

impl<'a> Fields<'a> {
    /// The fields of `object`, read strictly (see [`reader`]): a key repeated at any depth, a
    /// number no double holds, a lone surrogate or nesting of 128 levels refuse it.
    pub fn strict(object: &'a str) -> Result<Self, JsonError> {
        Self::read(&mut Reader::default(), object, Mode::Strict)
    }

    /// The fields of `object`, its grammar checked and nothing more; a repeated key is kept as it
    /// is (for dropping `writeKey` from an event refused for repeating a key).
    pub fn skim(object: &'a str) -> Result<Self, JsonError> {
        Self::read(&mut Reader::default(), object, Mode::Skim)
    }

    /// The fields of `object` read with `reader` (whose buffers are reused).
    pub fn read(reader: &mut Reader<'a>, object: &'a str, mode: Mode) -> Result<Self, JsonError> {
        Self::read_into(reader, object, mode, Vec::with_capacity(16))
    }

    /// Like [`Fields::read`], into `list` (emptied first): a list given back by
    /// [`Fields::into_list`] is reused without allocating.
    pub fn read_into(
        reader: &mut Reader<'a>,
        object: &'a str,
        mode: Mode,
        mut list: Vec<Field<'a>>,
    ) -> Result<Self, JsonError> {
        list.clear();
        reader.object(object, mode, &mut list)?;
        Ok(Self::of(object, list))
    }

    /// Like [`Fields::read`], and the elements of the array in the field `name` (a batch's
    /// events) appended to `items` in the same pass.
    pub fn read_with_items(
        reader: &mut Reader<'a>,
        object: &'a str,
        mode: Mode,
        name: &str,
        items: &mut Vec<&'a str>,
    ) -> Result<Self, JsonError> {
        Self::read_batch(reader, object, mode, (name, items), None)
    }

    /// Like [`Fields::read_with_items`], and each event that is an object read strictly in the
    /// same pass into `events` (see [`ItemFields`]).
    pub fn read_with_events(
        reader: &mut Reader<'a>,
        object: &'a str,
        mode: Mode,
        name: &str,
        items: &mut Vec<&'a str>,
        events: &mut ItemFields<'a>,
    ) -> Result<Self, JsonError> {
        Self::read_batch(reader, object, mode, (name, items), Some(events))
    }

    fn read_batch(
        reader: &mut Reader<'a>,
        object: &'a str,
        mode: Mode,
        items: (&str, &mut Vec<&'a str>),
        events: Option<&mut ItemFields<'a>>,
    ) -> Result<Self, JsonError> {
        let mut list = Vec::with_capacity(8);
        reader.object_with_events(object, mode, &mut list, Some(items), events)?;
        Ok(Self::of(object, list))
    }

    /// The fields of `object` that a strict read of it found ([`ItemFields::fields_into`]).
    pub fn of_strict_read(object: &'a str, list: Vec<Field<'a>>) -> Self {
        Self::of(object, list)
    }

    fn of(text: &'a str, list: Vec<Field<'a>>) -> Self {
        let mut named = [0u16; Name::COUNT];
        for (i, f) in list.iter().enumerate().take(u16::MAX as usize - 1) {
            if let Some(name) = Name::of(&f.key) {
                if named[name as usize] == 0 {
                    named[name as usize] = i as u16 + 1;
                }
            }
        }
        Self { text, list, named }
    }

    /// The value of the first field called `name`.
    pub fn named(&self, name: Name) -> Option<&'a str> {
        match self.named[name as usize] {
            0 => None,
            i => Some(self.list[i as usize - 1].value),
        }
    }

    /// The list the fields were kept in, emptied, for the next [`Fields::read_into`].
    pub fn into_list(self) -> Vec<Field<'a>> {
        let mut list = self.list;
        list.clear();
        list
    }

    /// Refuses a key that appears twice (which strict reading refuses already). The error is at
    /// the second one.
    pub fn check_unique(&self) -> Result<(), JsonError> {
        let keys = &self.list;
        let repeated = if keys.len() <= 16 {
            keys.iter()
                .enumerate()
                .find(|(i, f)| keys[..*i].iter().any(|g| g.key == f.key))
                .map(|(_, f)| f)
        } else {
            let mut seen = std::collections::HashSet::with_capacity(keys.len());
            keys.iter().find(|f| !seen.insert(f.key.as_ref()))
        };
        match repeated {
            None => Ok(()),
            Some(f) => Err(JsonError {
                kind: ErrorKind::DuplicateKey,
                at: f.key_text.as_ptr() as usize - self.text.as_ptr() as usize,
            }),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Field<'a>> {
        self.list.iter()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The value of the first field called `key`.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        match Name::of(key) {
            Some(name) => self.named(name),
            None => self.list.iter().find(|f| f.key == key).map(|f| f.value),
        }
    }
}

/// Whether an error is a key that appears twice in one object.
pub fn is_duplicate_key(e: &JsonError) -> bool {
    e.kind == ErrorKind::DuplicateKey
}

/// Checks strictly that `text` is one JSON value (see [`reader`]).
pub fn check_strict(text: &str) -> Result<(), JsonError> {
    Reader::default().value(text, Mode::Strict)
}

/// Whether a value's text (as read, so starting with its first token) is an object.
pub fn is_object(value: &str) -> bool {
    value.starts_with('{')
}

/// Writes `own` deep-merged with `defaults`, both objects' text: `own`'s fields in their order,
/// a field that both have as objects merged the same way, and then `defaults`' fields that `own`
/// lacks, in theirs. Wherever both have a value that is not an object on both sides, `own`'s
/// wins (an explicit `null` included). Every value is written as its text.
pub fn merge_into(
    out: &mut Vec<u8>,
    own: &Fields<'_>,
    defaults: &Fields<'_>,
) -> Result<(), JsonError> {
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
        match defaults
            .get(&f.key)
            .filter(|d| is_object(d) && is_object(f.value))
        {
            Some(d) => merge_into(out, &Fields::skim(f.value)?, &Fields::skim(d)?)?,
            None => out.extend_from_slice(f.value.as_bytes()),
        }
    }
    for d in defaults.iter().filter(|d| own.get(&d.key).is_none()) {
        field(out, d.key_text);
        out.extend_from_slice(d.value.as_bytes());
    }
    out.push(b'}');
    Ok(())
}

#[cfg(test)]
mod tests;

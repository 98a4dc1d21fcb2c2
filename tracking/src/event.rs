//! One event: validated, and made into the record the input topic gets, or refused with the
//! problem named and its text kept for the dead-letter topic.
//!
//! The record is the client's JSON for the event, every value as the bytes sent, in the order
//! sent, with only what this service changes: `writeKey` removed (a secret), `messageId` added
//! when missing or `null` (derived from the event's content when it has the client's `timestamp`,
//! see [`crate::derived_id`]; else random), `receivedAt` set, `type` set from the path on a single-event route,
//! and a batch's shared `context`, `integrations` (deep-merged, the event's own values winning)
//! and `sentAt` added where the event lacks them. The same event makes the same record on every
//! route.

use std::fmt;

use super::derived_id::derived_message_id;
use super::digest::content_hash;
use super::json::{
    self, is_duplicate_key, is_number, string_value, Field, Fields, ItemFields, JsonError, Mode,
    Name, Reader,
};
use super::same_event::{Canonical, SameEvent};
use super::{
    EventType, Location, MAX_MESSAGE_BYTES, MAX_MESSAGE_ID_BYTES, MAX_RECORD_BYTES,
    MAX_REFUSAL_SENTENCE_BYTES, SERVICE_FIELDS_BYTES,
};

/// Why one event is refused. The message names the problem, never the payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("is not a JSON object")]
    NotAnObject,
    #[error("is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("has the same key twice in one object ({0}); its meaning would depend on the parser")]
    DuplicateKey(String),
    #[error("`type` is missing")]
    MissingType,
    #[error("`type` is not one of track, identify, page, screen, group, alias")]
    UnknownType,
    #[error("a track message needs an `event` name")]
    MissingEvent,
    #[error("needs a `userId` or an `anonymousId`")]
    MissingIdentity,
    #[error("an alias message needs `previousId` and `userId`")]
    MissingAliasIds,
    #[error("a group message needs a `groupId`")]
    MissingGroupId,
    #[error("`messageId` must be a string of 1 to {MAX_MESSAGE_ID_BYTES} bytes, not blank, without control characters, line or paragraph separators, or bidirectional controls")]
    BadMessageId,
    #[error("is {bytes} bytes; the limit per message is {MAX_MESSAGE_BYTES} bytes")]
    TooLarge { bytes: usize },
    #[error("is {bytes} bytes once the batch's `context`, `integrations` and `sentAt` are merged into it and its `messageId` and `receivedAt` set; the limit is {MAX_RECORD_BYTES} bytes")]
    MergedTooLarge { bytes: usize },
}

impl Problem {
    /// A short stable name: the `reason` label of the rejection counter, the `code` of the
    /// answer's entry and the dead-letter record's `dedupe-reason` header.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotAnObject => "message_not_object",
            Self::MalformedJson(_) => "malformed_json",
            Self::DuplicateKey(_) => "duplicate_key",
            Self::MissingType => "missing_type",
            Self::UnknownType => "unknown_type",
            Self::MissingEvent => "missing_event",
            Self::MissingIdentity => "missing_identity",
            Self::MissingAliasIds => "missing_alias_ids",
            Self::MissingGroupId => "missing_group_id",
            Self::BadMessageId => "bad_message_id",
            Self::TooLarge { .. } => "message_too_large",
            Self::MergedTooLarge { .. } => "merged_message_too_large",
        }
    }
}

/// One event ready for Kafka.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The client's `messageId`, or one this service gave it.
    pub message_id: String,
    /// Where `message_id` came from.
    pub id_origin: IdOrigin,
    pub event_type: EventType,
    /// The record's value: the event as sent, with the changes the module doc lists.
    pub value: Vec<u8>,
    /// What tells a retry of this event from another event under its id ([`crate::digest`]).
    pub content_hash: u64,
}

/// One event refused: where it was, why, and what the dead-letter topic keeps of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub at: Location,
    pub problem: Problem,
    /// The event's text as sent, without `writeKey`.
    pub value: Vec<u8>,
    /// The event's `messageId`, when it has a usable one (the dead-letter record's key).
    pub message_id: Option<String>,
}

impl Refused {
    /// What was wrong and where, as the dead-letter record's `dedupe-error` header and the answer
    /// say it: at most [`MAX_REFUSAL_SENTENCE_BYTES`] bytes, cut at a character boundary.
    pub fn sentence(&self) -> String {
        let mut sentence = self.to_string();
        if sentence.len() > MAX_REFUSAL_SENTENCE_BYTES {
            let mut end = MAX_REFUSAL_SENTENCE_BYTES;
            while !sentence.is_char_boundary(end) {
                end -= 1;
            }
            sentence.truncate(end);
        }
        sentence
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.problem)
    }
}

/// What a batch adds to each of its events: its own `context` and `integrations` when they are
/// objects (their text and fields), and its `sentAt` when it is not `null`.
#[derive(Default)]
pub struct Shared<'a> {
    pub context: Option<(&'a str, Fields<'a>)>,
    pub integrations: Option<(&'a str, Fields<'a>)>,
    pub sent_at: Option<&'a str>,
}

impl Shared<'_> {
    /// At most what merging adds to one event: the shared values' text and their names.
    pub fn bytes(&self) -> usize {
        let object =
            |o: &Option<(&str, Fields<'_>)>| o.as_ref().map_or(0, |(raw, _)| raw.len() + 16);
        object(&self.context)
            + object(&self.integrations)
            + self.sent_at.map_or(0, |v| v.len() + 12)
    }
}

/// Where an event's `messageId` came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdOrigin {
    /// The client's own.
    Client,
    /// Derived from the event's content (see [`crate::derived_id`]).
    Derived,
    /// A random UUIDv4: the event had no id, and none could be derived.
    Random,
}

impl IdOrigin {
    /// The origins of an id this service gave, in the order the front door counts them.
    pub const ASSIGNED: [IdOrigin; 2] = [IdOrigin::Derived, IdOrigin::Random];

    /// The `origin` label of the front door's id counter.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Derived => "derived",
            Self::Random => "random",
        }
    }
}

/// What an event sent without a `messageId` gets (`ingest.missing_message_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingId {
    /// An id derived from its content when it has the client's `timestamp`, else a random one.
    Derive,
    /// Always a random UUIDv4.
    Random,
}

/// How a request's events without a `messageId` get one: the source they count under, and the
/// policy.
#[derive(Debug, Clone, Copy)]
pub struct MessageIds<'a> {
    pub source: &'a str,
    pub missing: MissingId,
}

/// What every event of a request is made with, and the buffers reused from one event to the next.
pub struct Making<'a> {
    /// `receivedAt` as JSON text (a quoted string).
    pub received_at: &'a str,
    /// The type the path gives, on a single-event route.
    pub path_type: Option<EventType>,
    pub shared: &'a Shared<'a>,
    pub ids: MessageIds<'a>,
    reader: Reader<'a>,
    fields: Vec<Field<'a>>,
    same: SameEvent,
    canonical: Canonical,
}

/// The fields validation reads.
struct Read {
    event_type: EventType,
    message_id: Option<String>,
}

impl<'a> Making<'a> {
    pub fn new(
        received_at: &'a str,
        path_type: Option<EventType>,
        shared: &'a Shared<'a>,
        ids: MessageIds<'a>,
    ) -> Self {
        Self {
            received_at,
            path_type,
            shared,
            ids,
            reader: Reader::default(),
            fields: Vec::with_capacity(16),
            same: SameEvent::default(),
            canonical: Canonical::default(),
        }
    }

    /// Validates the event whose text is `raw` and makes its record, or says why not. One pass
    /// over the text checks it strictly and finds its fields.
    pub fn make(&mut self, at: Location, raw: &'a str) -> Result<Message, Refused> {
        self.make_read(at, raw, None)
    }

    /// Like [`Making::make`], for element `index` of a batch whose events the body's pass read
    /// (`read`, [`json::ItemFields`]); one it did not read is read here.
    pub fn make_read(
        &mut self,
        at: Location,
        raw: &'a str,
        read: Option<(&ItemFields<'a>, usize)>,
    ) -> Result<Message, Refused> {
        let refuse = |problem: Problem| Refused {
            at,
            problem,
            value: without_write_key(raw),
            message_id: usable_id(raw),
        };
        if !raw.starts_with('{') {
            return Err(refuse(Problem::NotAnObject));
        }
        if raw.len() > MAX_MESSAGE_BYTES {
            return Err(refuse(Problem::TooLarge { bytes: raw.len() }));
        }
        let mut list = std::mem::take(&mut self.fields);
        let fields = match read {
            Some((events, index)) if events.fields_into(index, &mut list) => {
                Fields::of_strict_read(raw, list)
            }
            _ => Fields::read_into(&mut self.reader, raw, Mode::Strict, list)
                .map_err(|e| refuse(problem_of(&e, raw)))?,
        };
        let made = self.made(&fields, raw).map_err(refuse);
        self.fields = fields.into_list();
        made
    }

    /// The record of the event with `fields` (read strictly from `raw`).
    fn made(&mut self, fields: &Fields<'a>, raw: &str) -> Result<Message, Problem> {
        let read = self.read(fields)?;
        // The strict read passed, so every value has a canonical form.
        self.same
            .fill(read.event_type, fields, &mut self.canonical)
            .ok_or_else(|| Problem::MalformedJson("a value has no canonical form".into()))?;
        let derived = || match self.ids.missing {
            MissingId::Derive => derived_message_id(self.ids.source, fields, &self.same),
            MissingId::Random => None,
        };
        let (message_id, id_origin) = match read.message_id {
            Some(id) => (id, IdOrigin::Client),
            None => match derived() {
                Some(id) => (id, IdOrigin::Derived),
                None => (uuid::Uuid::new_v4().to_string(), IdOrigin::Random),
            },
        };
        let assigned = (id_origin != IdOrigin::Client).then_some(message_id.as_str());
        let value = self
            .record(fields, raw.len(), read.event_type, assigned)
            .map_err(|e| problem_of(&e, raw))?;
        if value.len() > MAX_RECORD_BYTES {
            return Err(Problem::MergedTooLarge { bytes: value.len() });
        }
        let content_hash = content_hash(&self.same);
        Ok(Message {
            message_id,
            id_origin,
            event_type: read.event_type,
            value,
            content_hash,
        })
    }

    fn read(&self, fields: &Fields<'_>) -> Result<Read, Problem> {
        let event_type = match self.path_type {
            Some(t) => t,
            None => match fields.named(Name::Type) {
                None | Some("null") => return Err(Problem::MissingType),
                Some(t) => string_value(t)
                    .and_then(|t| EventType::parse(&t))
                    .ok_or(Problem::UnknownType)?,
            },
        };
        // A non-empty string (`""` is the only text of an empty one) or a number.
        let has_id = |name: Name| {
            fields
                .named(name)
                .is_some_and(|v| (v.starts_with('"') && v.len() > 2) || is_number(v))
        };
        match event_type {
            EventType::Alias if !has_id(Name::PreviousId) || !has_id(Name::UserId) => {
                return Err(Problem::MissingAliasIds)
            }
            EventType::Alias => {}
            _ if !has_id(Name::UserId) && !has_id(Name::AnonymousId) => {
                return Err(Problem::MissingIdentity)
            }
            _ => {}
        }
        match event_type {
            EventType::Track
                if fields
                    .named(Name::Event)
                    .is_none_or(|v| !v.starts_with('"') || v.len() <= 2) =>
            {
                return Err(Problem::MissingEvent)
            }
            EventType::Group if !has_id(Name::GroupId) => return Err(Problem::MissingGroupId),
            _ => {}
        }
        let message_id = match fields.named(Name::MessageId) {
            None | Some("null") => None,
            Some(v) => match string_value(v) {
                Some(id) if valid_message_id(&id) => Some(id.into_owned()),
                _ => return Err(Problem::BadMessageId),
            },
        };
        Ok(Read {
            event_type,
            message_id,
        })
    }

    /// The record's text: the event's fields as sent, with this service's changes.
    fn record(
        &self,
        fields: &Fields<'_>,
        sent: usize,
        event_type: EventType,
        assigned_id: Option<&str>,
    ) -> Result<Vec<u8>, JsonError> {
        let mut out = RecordText::with_capacity(sent + self.shared.bytes() + SERVICE_FIELDS_BYTES);
        for f in fields.iter() {
            self.put_sent(&mut out, f, event_type, assigned_id)?;
        }
        self.put_missing(&mut out, fields, event_type, assigned_id);
        Ok(out.finish())
    }

    /// One field the event was sent with, as the record holds it: dropped (`writeKey`), replaced
    /// (`type` on a single-event route, `receivedAt`, an assigned `messageId`), merged with the
    /// batch's defaults (`context`, `integrations`) or as sent.
    fn put_sent(
        &self,
        out: &mut RecordText,
        f: &Field<'_>,
        event_type: EventType,
        assigned_id: Option<&str>,
    ) -> Result<(), JsonError> {
        match f.key.as_ref() {
            "writeKey" => {}
            "type" if self.path_type.is_some() => {
                out.key(f.key_text);
                out.plain_string(event_type.as_str());
            }
            "receivedAt" => {
                out.key(f.key_text);
                out.raw(self.received_at);
            }
            "messageId" if assigned_id.is_some() => {
                out.key(f.key_text);
                out.plain_string(assigned_id.unwrap_or_default());
            }
            key @ ("context" | "integrations") => {
                out.key(f.key_text);
                let defaults = if key == "context" {
                    &self.shared.context
                } else {
                    &self.shared.integrations
                };
                match defaults {
                    Some((_, defaults)) if json::is_object(f.value) => {
                        json::merge_into(&mut out.0, &Fields::skim(f.value)?, defaults)?
                    }
                    _ => out.raw(f.value),
                }
            }
            _ => {
                out.key(f.key_text);
                out.raw(f.value);
            }
        }
        Ok(())
    }

    /// The fields this service adds where the event lacks them: `type` from the path, an
    /// assigned `messageId`, `receivedAt`, and the batch's `context`, `integrations` and `sentAt`.
    fn put_missing(
        &self,
        out: &mut RecordText,
        fields: &Fields<'_>,
        event_type: EventType,
        assigned_id: Option<&str>,
    ) {
        let shared = self.shared;
        let lacks = |name: Name| fields.named(name).is_none();
        if self.path_type.is_some() && lacks(Name::Type) {
            out.key("\"type\"");
            out.plain_string(event_type.as_str());
        }
        if let (Some(id), true) = (assigned_id, lacks(Name::MessageId)) {
            out.key("\"messageId\"");
            out.plain_string(id);
        }
        if lacks(Name::ReceivedAt) {
            out.key("\"receivedAt\"");
            out.raw(self.received_at);
        }
        for (name, key_text, value) in [
            (
                Name::Context,
                "\"context\"",
                shared.context.as_ref().map(|(raw, _)| *raw),
            ),
            (
                Name::Integrations,
                "\"integrations\"",
                shared.integrations.as_ref().map(|(raw, _)| *raw),
            ),
            (Name::SentAt, "\"sentAt\"", shared.sent_at),
        ] {
            if let (Some(value), true) = (value, lacks(name)) {
                out.key(key_text);
                out.raw(value);
            }
        }
    }
}

/// A record's text as it is written: an object whose members are put one after another.
struct RecordText(Vec<u8>);

impl RecordText {
    fn with_capacity(bytes: usize) -> Self {
        let mut out = Vec::with_capacity(bytes);
        out.push(b'{');
        Self(out)
    }

    /// Starts a member: the comma before every member but the first, the key's text, the colon.
    fn key(&mut self, key_text: &str) {
        if self.0.len() > 1 {
            self.0.push(b',');
        }
        self.0.extend_from_slice(key_text.as_bytes());
        self.0.push(b':');
    }

    /// A string whose text needs no escape: an event type's name, or an assigned id (a UUID).
    fn plain_string(&mut self, text: &str) {
        self.0.push(b'"');
        self.0.extend_from_slice(text.as_bytes());
        self.0.push(b'"');
    }

    /// A value's JSON text as it is.
    fn raw(&mut self, json_text: &str) {
        self.0.extend_from_slice(json_text.as_bytes());
    }

    fn finish(mut self) -> Vec<u8> {
        self.0.push(b'}');
        self.0
    }
}

/// The problem a reading error of `text` stands for.
fn problem_of(e: &JsonError, text: &str) -> Problem {
    if is_duplicate_key(e) {
        let (line, column) = e.line_column(text);
        Problem::DuplicateKey(format!("line {line} column {column}"))
    } else {
        Problem::MalformedJson(e.describe(text))
    }
}

/// An event's text as sent, with any top-level `writeKey` dropped: it is a secret, and a
/// refused event is kept in Kafka too.
fn without_write_key(raw: &str) -> Vec<u8> {
    let fields = match Fields::skim(raw) {
        Ok(fields) if fields.iter().any(|f| f.key == "writeKey") => fields,
        // Not an object (so no top-level field at all), or none to drop.
        _ => return raw.as_bytes().to_vec(),
    };
    let mut out = Vec::with_capacity(raw.len());
    out.push(b'{');
    for f in fields.iter().filter(|f| f.key != "writeKey") {
        if out.len() > 1 {
            out.push(b',');
        }
        out.extend_from_slice(f.key_text.as_bytes());
        out.push(b':');
        out.extend_from_slice(f.value.as_bytes());
    }
    out.push(b'}');
    out
}

/// The event's `messageId` if it is a usable one, however else the event is wrong.
fn usable_id(raw: &str) -> Option<String> {
    let fields = Fields::skim(raw).ok()?;
    let mut ids = fields.iter().filter(|f| f.key == "messageId");
    match (ids.next(), ids.next()) {
        (Some(one), None) if json::check_strict(one.value).is_ok() => string_value(one.value)
            .filter(|id| valid_message_id(id))
            .map(|id| id.into_owned()),
        _ => None,
    }
}

/// A `messageId` becomes part of the record key and reaches logs and tools downstream: 1 to
/// [`MAX_MESSAGE_ID_BYTES`] bytes, not only white space, and none of: control characters (CR,
/// LF, NUL...), Unicode line and paragraph separators (which end a line in JavaScript), and
/// bidirectional controls (which make text display other than it is).
pub fn valid_message_id(id: &str) -> bool {
    const BIDI_AND_SEPARATORS: [char; 14] = [
        '\u{2028}', '\u{2029}', '\u{200E}', '\u{200F}', '\u{061C}', '\u{202A}', '\u{202B}',
        '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
    ];
    !id.is_empty()
        && id.len() <= MAX_MESSAGE_ID_BYTES
        && !id.trim().is_empty()
        && !id
            .chars()
            .any(|c| c.is_control() || BIDI_AND_SEPARATORS.contains(&c))
}

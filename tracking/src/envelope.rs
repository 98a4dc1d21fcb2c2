//! A request body read as JSON: its write key, and its events made ready one by one.

use std::time::SystemTime;

use super::event::{Making, Message, MessageIds, Refused, Shared};
use super::json::{
    self, check_strict, reader::ErrorKind, string_value, Fields, ItemFields, Mode, Reader,
};
use super::{
    rfc3339_millis, Endpoint, Location, Rejection, MAX_BATCH_EVENTS, MAX_MERGED_BYTES,
    MAX_MESSAGE_BYTES, MAX_REQUEST_BYTES,
};

/// The events a batch's lists start with room for: a typical batch's, far fewer than the limit
/// (a larger batch grows them).
const BATCH_ROOM: usize = 32;

/// A request body that is a readable JSON object, before authentication and validation. Every
/// value is kept as the text sent.
pub struct Envelope<'a> {
    endpoint: Endpoint,
    /// The body, white space around it removed.
    text: &'a str,
    top: Fields<'a>,
    /// A batch's events' text, found in the same pass as the body's fields.
    items: Vec<&'a str>,
    /// Each event's fields, read strictly in that same pass (one it did not read is read alone).
    events: ItemFields<'a>,
    write_key: Option<String>,
}

/// A request's events: those ready for Kafka, and those refused (for the dead-letter topic), in
/// the order sent within each.
#[derive(Debug, Default)]
pub struct Events {
    pub messages: Vec<Message>,
    pub refused: Vec<Refused>,
}

impl Events {
    /// Every event of the request, valid or not.
    pub fn len(&self) -> usize {
        self.messages.len() + self.refused.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The body's `writeKey`: none, `null`, or one string (refused if repeated or not a string).
fn write_key_of(top: &Fields<'_>) -> Result<Option<String>, Rejection> {
    let mut keys = top.iter().filter(|f| f.key == "writeKey").map(|f| f.value);
    match (keys.next(), keys.next()) {
        (None, _) | (Some("null"), None) => Ok(None),
        (Some(key), None) if check_strict(key).is_ok() => Ok(Some(
            string_value(key)
                .ok_or(Rejection::BadWriteKey)?
                .into_owned(),
        )),
        _ => Err(Rejection::BadWriteKey),
    }
}

/// JSON's white space.
fn trim_json(text: &str) -> &str {
    text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'))
}

impl<'a> Envelope<'a> {
    /// Parses a decoded body. Only checks that it is a JSON object (with a string `writeKey`, if
    /// any), so a client learns nothing more about its payload before it is authenticated.
    pub fn parse(endpoint: Endpoint, body: &'a [u8]) -> Result<Self, Rejection> {
        if body.len() > MAX_REQUEST_BYTES {
            return Err(Rejection::RequestTooLarge {
                limit: MAX_REQUEST_BYTES,
            });
        }
        let text = std::str::from_utf8(body).map_err(|e| {
            Rejection::MalformedJson(format!(
                "the body is not UTF-8 (at byte {})",
                e.valid_up_to()
            ))
        })?;
        let text = trim_json(text);
        // One pass over the body checks its grammar, finds its fields and, on the batch route,
        // reads each event strictly where it stands (an event strict reading refuses is skimmed
        // here and read on its own later, for its problem).
        let mut items = Vec::with_capacity(BATCH_ROOM);
        let mut events = ItemFields::new(BATCH_ROOM, MAX_BATCH_EVENTS, MAX_MESSAGE_BYTES);
        let mut reader = Reader::default();
        let top = match endpoint {
            Endpoint::Batch => Fields::read_with_events(
                &mut reader,
                text,
                Mode::Skim,
                "batch",
                &mut items,
                &mut events,
            ),
            Endpoint::Single(_) => Fields::read(&mut reader, text, Mode::Skim),
        }
        .map_err(|e| match e.kind {
            ErrorKind::NotAnObject => Rejection::NotAnObject,
            _ => Rejection::MalformedJson(e.describe(text)),
        })?;
        let write_key = write_key_of(&top)?;
        Ok(Self {
            endpoint,
            text,
            top,
            items,
            events,
            write_key,
        })
    }

    /// The `writeKey` the body carried, if any.
    pub fn write_key(&self) -> Option<&str> {
        self.write_key.as_deref()
    }

    /// Validates every event and makes each valid one ready for Kafka; an invalid one is
    /// returned with its problem, never costing the others. Only what concerns the whole request
    /// refuses it: a batch that is not an array, empty or over the limits, or shared fields that
    /// are not valid JSON.
    pub fn into_events(
        self,
        received_at: SystemTime,
        ids: MessageIds<'_>,
    ) -> Result<Events, Rejection> {
        let received_at = format!("\"{}\"", rfc3339_millis(received_at));
        let mut events = Events::default();
        match self.endpoint {
            Endpoint::Single(event_type) => {
                let shared = Shared::default();
                let mut making = Making::new(&received_at, Some(event_type), &shared, ids);
                match making.make(Location(None), self.text) {
                    Ok(m) => events.messages.push(m),
                    Err(r) => events.refused.push(r),
                }
            }
            Endpoint::Batch => {
                // The body's own fields, unlike an event's, are read by this service: a repeated
                // one leaves the request without one meaning.
                if let Err(e) = self.top.check_unique() {
                    return Err(Rejection::MalformedJson(e.describe(self.text)));
                }
                if !self
                    .top
                    .get("batch")
                    .is_some_and(|raw| raw.starts_with('['))
                {
                    return Err(Rejection::BatchNotArray);
                }
                let items = &self.items;
                if items.is_empty() {
                    return Err(Rejection::EmptyBatch);
                }
                if items.len() > MAX_BATCH_EVENTS {
                    return Err(Rejection::TooManyEvents { count: items.len() });
                }
                let shared = self.shared()?;
                // What merging would make, bounded before anything is copied: the work and memory
                // a request can cause stay proportional to its size.
                let shared_bytes = shared.bytes();
                let merged: usize = items
                    .iter()
                    .map(|item| item.len().saturating_add(shared_bytes))
                    .sum();
                if merged > MAX_MERGED_BYTES {
                    return Err(Rejection::MergedBatchTooLarge { bytes: merged });
                }
                let mut making = Making::new(&received_at, None, &shared, ids);
                events.messages.reserve(items.len());
                for (i, item) in items.iter().enumerate() {
                    match making.make_read(Location(Some(i)), item, Some((&self.events, i))) {
                        Ok(m) => events.messages.push(m),
                        Err(r) => events.refused.push(r),
                    }
                }
            }
        }
        Ok(events)
    }

    /// The batch's fields that apply to each of its events. They are checked as strictly as an
    /// event: they become part of every record.
    fn shared(&self) -> Result<Shared<'a>, Rejection> {
        let refuse = |name: &str, raw: &str, e: json::JsonError| {
            Rejection::MalformedJson(format!("the batch's `{name}`: {}", e.describe(raw)))
        };
        let object = |name: &str| -> Result<Option<(&'a str, Fields<'a>)>, Rejection> {
            match self.top.get(name).filter(|raw| json::is_object(raw)) {
                None => Ok(None),
                Some(raw) => Ok(Some((
                    raw,
                    Fields::strict(raw).map_err(|e| refuse(name, raw, e))?,
                ))),
            }
        };
        let sent_at = self.top.get("sentAt").filter(|raw| *raw != "null");
        if let Some(raw) = sent_at {
            check_strict(raw).map_err(|e| refuse("sentAt", raw, e))?;
        }
        Ok(Shared {
            context: object("context")?,
            integrations: object("integrations")?,
            sent_at,
        })
    }
}

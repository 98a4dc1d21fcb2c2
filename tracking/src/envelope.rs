//! A request body read as JSON: its write key, and its events made ready one by one.

use std::time::SystemTime;

use serde_json::value::RawValue;

use super::event::{Making, Message, MessageIds, Refused, Shared};
use super::json::{self, check_strict, Fields};
use super::{rfc3339_millis, Endpoint, Location, Rejection, MAX_BATCH_EVENTS, MAX_MERGED_BYTES, MAX_REQUEST_BYTES};

/// A request body that is a readable JSON object, before authentication and validation. Every
/// value is kept as the text sent.
pub struct Envelope<'a> {
    endpoint: Endpoint,
    /// The body, white space around it removed.
    text: &'a str,
    top: Fields<'a>,
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

/// JSON's white space.
fn trim_json(text: &str) -> &str {
    text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'))
}

impl<'a> Envelope<'a> {
    /// Parses a decoded body. Only checks that it is a JSON object (with a string `writeKey`, if
    /// any), so a client learns nothing more about its payload before it is authenticated.
    pub fn parse(endpoint: Endpoint, body: &'a [u8]) -> Result<Self, Rejection> {
        if body.len() > MAX_REQUEST_BYTES {
            return Err(Rejection::RequestTooLarge { limit: MAX_REQUEST_BYTES });
        }
        let text = std::str::from_utf8(body)
            .map_err(|e| Rejection::MalformedJson(format!("the body is not UTF-8 (at byte {})", e.valid_up_to())))?;
        let text = trim_json(text);
        let top = Fields::parse_repeated(text).map_err(|e| {
            if e.classify() == serde_json::error::Category::Data && serde_json::from_str::<&RawValue>(text).is_ok() {
                Rejection::NotAnObject
            } else {
                Rejection::MalformedJson(e.to_string())
            }
        })?;
        let keys: Vec<&RawValue> = top.iter().filter(|f| f.key == "writeKey").map(|f| f.value).collect();
        let write_key = match keys.as_slice() {
            [] => None,
            [key] if key.get() == "null" => None,
            [key] => Some(serde_json::from_str::<String>(key.get()).map_err(|_| Rejection::BadWriteKey)?),
            _ => return Err(Rejection::BadWriteKey),
        };
        Ok(Self { endpoint, text, top, write_key })
    }

    /// The `writeKey` the body carried, if any.
    pub fn write_key(&self) -> Option<&str> {
        self.write_key.as_deref()
    }

    /// Validates every event and makes each valid one ready for Kafka; an invalid one is
    /// returned with its problem, never costing the others. Only what concerns the whole request
    /// refuses it: a batch that is not an array, empty or over the limits, or shared fields that
    /// are not valid JSON.
    pub fn into_events(self, received_at: SystemTime, ids: MessageIds<'_>) -> Result<Events, Rejection> {
        let received_at = format!("\"{}\"", rfc3339_millis(received_at));
        let mut events = Events::default();
        match self.endpoint {
            Endpoint::Single(event_type) => {
                let making = Making { received_at: &received_at, path_type: Some(event_type), shared: &Shared::default(), ids };
                match making.make(Location(None), self.text) {
                    Ok(m) => events.messages.push(m),
                    Err(r) => events.refused.push(r),
                }
            }
            Endpoint::Batch => {
                // The body's own fields, unlike an event's, are read by this service: a repeated
                // one leaves the request without one meaning.
                if let Err(e) = self.top.check_unique() {
                    return Err(Rejection::MalformedJson(e.to_string()));
                }
                let items = match self.top.get("batch") {
                    Some(raw) if raw.get().starts_with('[') => serde_json::from_str::<Vec<&RawValue>>(raw.get())
                        .map_err(|e| Rejection::MalformedJson(e.to_string()))?,
                    _ => return Err(Rejection::BatchNotArray),
                };
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
                let merged: usize = items.iter().map(|item| item.get().len().saturating_add(shared_bytes)).sum();
                if merged > MAX_MERGED_BYTES {
                    return Err(Rejection::MergedBatchTooLarge { bytes: merged });
                }
                let making = Making { received_at: &received_at, path_type: None, shared: &shared, ids };
                events.messages.reserve(items.len());
                for (i, item) in items.into_iter().enumerate() {
                    match making.make(Location(Some(i)), item.get()) {
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
        let strict = |name: &str, raw: &RawValue| {
            check_strict(raw.get()).map_err(|e| Rejection::MalformedJson(format!("the batch's `{name}`: {e}")))
        };
        let object = |name: &str| -> Result<Option<(&'a RawValue, Fields<'a>)>, Rejection> {
            match self.top.get(name).filter(|raw| json::is_object(raw)) {
                None => Ok(None),
                Some(raw) => {
                    strict(name, raw)?;
                    let fields = Fields::parse(raw.get()).map_err(|e| Rejection::MalformedJson(e.to_string()))?;
                    Ok(Some((raw, fields)))
                }
            }
        };
        let sent_at = self.top.get("sentAt").filter(|raw| raw.get() != "null");
        if let Some(raw) = sent_at {
            strict("sentAt", raw)?;
        }
        Ok(Shared { context: object("context")?, integrations: object("integrations")?, sent_at })
    }
}

//! The `messageId` of an event sent without one, derived from what the event says, so that a
//! client that retries a request whose answer it lost sends the same ids again and the worker
//! drops the copies.
//!
//! An id is derived only when the event carries the client's own `timestamp`: without it two
//! events alike in everything else may be two real events (a button pressed twice), and a retry
//! cannot be told from a second event. Such an event gets a random UUIDv4, as before.
//!
//! What the id is made of, in this order (docs/tracking-api.md names it for clients):
//! the source (the write key's source name), the event's type, then `event`, `name`, `userId`,
//! `anonymousId`, `groupId`, `previousId`, `timestamp`, `properties` and `traits`, each as its
//! JSON value with object keys sorted and no white space, or as absent. Left out: `context`,
//! `integrations`, `sentAt`, `receivedAt` and everything else, which a library may set anew on
//! each try (`sentAt` always is). The id is the first 16 bytes of the SHA-256 of that, as a
//! version-8 UUID (RFC 9562's custom version): a client's UUIDv4 can never be one, so downstream
//! tells a derived id by its version digit, and the record carries the `dedupe-message-id: derived`
//! header as well. SHA-256 rather than a faster hash: no one can make two different events
//! share a derived id on purpose.

use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::json::Fields;
use super::EventType;

/// The fields an id is derived from, after the source and the type.
pub const DERIVED_FROM: [&str; 9] =
    ["event", "name", "userId", "anonymousId", "groupId", "previousId", "timestamp", "properties", "traits"];

/// What starts the hashed text: a new derivation gets a new one, so ids never mean two things.
const DOMAIN: &[u8] = b"dedupe derived messageId v1\0";

/// The derived id of an event, or `None` when it has no usable `timestamp` (a non-empty string).
pub fn derived_message_id(source: &str, event_type: EventType, fields: &Fields<'_>) -> Option<String> {
    match fields.get("timestamp").map(|raw| serde_json::from_str::<Value>(raw.get())) {
        Some(Ok(Value::String(t))) if !t.trim().is_empty() => {}
        _ => return None,
    }
    let mut hash = Sha256::new();
    hash.update(DOMAIN);
    put(&mut hash, source.as_bytes());
    put(&mut hash, event_type.as_str().as_bytes());
    let mut text = String::new();
    for name in DERIVED_FROM {
        match fields.get(name).filter(|raw| raw.get() != "null") {
            None => hash.update([0u8]),
            Some(raw) => {
                hash.update([1u8]);
                text.clear();
                canonical(raw, &mut text)?;
                put(&mut hash, text.as_bytes());
            }
        }
    }
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x80; // version 8
    bytes[8] = (bytes[8] & 0x3f) | 0x80; // the RFC's variant
    Some(uuid::Uuid::from_bytes(bytes).to_string())
}

/// Whether `id` has the form of a derived id (a version-8 UUID, hyphenated, lower case).
pub fn is_derived(id: &str) -> bool {
    id.len() == 36 && uuid::Uuid::parse_str(id).is_ok_and(|u| u.get_version_num() == 8) && id == id.to_ascii_lowercase()
}

/// Hashes `bytes` with their length first, so that no two sequences of fields hash alike.
fn put(hash: &mut Sha256, bytes: &[u8]) {
    hash.update((bytes.len() as u64).to_be_bytes());
    hash.update(bytes);
}

/// The value's JSON with every object's keys sorted and no white space. The event passed the
/// strict check, so its keys are unique at every depth.
fn canonical(raw: &RawValue, out: &mut String) -> Option<()> {
    let value: Value = serde_json::from_str(raw.get()).ok()?;
    write(&value, out);
    Some(())
}

fn write(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write(value, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

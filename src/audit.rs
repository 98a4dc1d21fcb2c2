//! The duplicate audit: for each duplicate the worker drops, one compact record, written in the
//! same transaction as its batch's output. The audit therefore holds exactly the drops whose batch
//! committed: a batch that aborted and is read again leaves nothing in it, a committed one leaves
//! every sampled drop.
//!
//! A record (format version [`FORMAT_VERSION`], documented in docs/operations.md): its key is the
//! dropped record's key (the input is partitioned by it) and it goes to the input partition's
//! number; its value is one JSON object:
//!
//! ```json
//! {"v":1,"ledger_key":"6ba7b8109dad11d180b400c04fd430c8","source":"web","input_topic":"events.in",
//!  "input_partition":3,"input_offset":1234,"timestamp_ms":1764763200000,
//!  "first_seen_ms":1764760000000,"age_ms":3200000,"in_batch":false,"verdict":"unknown"}
//! ```
//!
//! `source` is the front door's source header, or null for other producers; `first_seen_ms` is
//! the first copy's first-seen time (the ledger's, or the earlier copy's in the same batch:
//! `in_batch`); `verdict` is `retry` (the same content digest as the first copy), `reused_id`
//! (another digest) or `unknown` (either copy has none; see [`crate::batch::Verdict`]);
//! `payload` (base64 of the dropped copy's value) is there only with `worker.audit_payloads`;
//! `"refreshed":true` only when the drop recorded its id again at its time
//! (`ledger.refresh_on_duplicate`).
//!
//! Sampling is by id ([`Sampler`]): every drop of an id sampled in is audited, so an id's story is
//! whole or absent. A cap per second per partition bounds the audit's write load in a retry storm;
//! the drops it skips are counted.

use std::time::Instant;

use base64::Engine;
use rdkafka::types::RDKafkaErrorCode;
use serde::Serialize;

use crate::batch::Verdict;
use crate::identity::LedgerKey;
use crate::output::{refusal_reason, OutRecord, ReadAt};

/// The version of the audit record's value.
pub const FORMAT_VERSION: u32 = 1;

/// The audit topic of `output_topic` when `worker.audit_topic` is unset.
pub fn default_topic(output_topic: &str) -> String {
    format!("{output_topic}.duplicates")
}

/// One dropped duplicate, as the audit tells it.
#[derive(Debug, Clone, Copy)]
pub struct DroppedCopy<'a> {
    pub key: LedgerKey,
    /// The dropped record, as read from the input.
    pub record: &'a OutRecord,
    /// The front door's source of the record, if it came through it.
    pub source: Option<&'a str>,
    pub input_topic: &'a str,
    pub input_partition: i32,
    pub input_offset: i64,
    /// When the id was first seen: the ledger's first-seen time, or the earlier copy's in the batch.
    pub first_seen_ms: i64,
    /// The dropped copy's time minus `first_seen_ms` (0 if its clock is behind).
    pub age_ms: i64,
    /// The first copy was earlier in the same batch.
    pub in_batch: bool,
    pub verdict: Verdict,
    /// The drop recorded the id again at its time (`ledger.refresh_on_duplicate`).
    pub refreshed: bool,
}

#[derive(Serialize)]
struct Value<'a> {
    v: u32,
    ledger_key: String,
    source: Option<&'a str>,
    input_topic: &'a str,
    input_partition: i32,
    input_offset: i64,
    timestamp_ms: Option<i64>,
    first_seen_ms: i64,
    age_ms: i64,
    in_batch: bool,
    verdict: &'static str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    refreshed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<String>,
}

/// The audit record of `drop`: keyed like the input record, to be sent to the input partition's
/// number of the audit topic.
pub fn encode(drop: &DroppedCopy<'_>, with_payload: bool) -> OutRecord {
    let value = Value {
        v: FORMAT_VERSION,
        ledger_key: drop.key.hex(),
        source: drop.source,
        input_topic: drop.input_topic,
        input_partition: drop.input_partition,
        input_offset: drop.input_offset,
        timestamp_ms: drop.record.timestamp_ms,
        first_seen_ms: drop.first_seen_ms,
        age_ms: drop.age_ms,
        in_batch: drop.in_batch,
        verdict: drop.verdict.as_str(),
        refreshed: drop.refreshed,
        payload: if with_payload {
            drop.record
                .value
                .as_deref()
                .map(|v| base64::engine::general_purpose::STANDARD.encode(v))
        } else {
            None
        },
    };
    audit_record(keyed_like(drop.record, drop.key), &value, None)
}

/// An audit record's key: the input record's, or its ledger key in hex when it has none.
fn keyed_like(record: &OutRecord, key: LedgerKey) -> Vec<u8> {
    record.key.clone().unwrap_or_else(|| key.hex().into_bytes())
}

/// An audit record: `value` as its JSON, no headers.
fn audit_record(key: Vec<u8>, value: &impl Serialize, timestamp_ms: Option<i64>) -> OutRecord {
    OutRecord {
        key: Some(key),
        // Serializing a struct of strings and numbers cannot fail.
        value: Some(serde_json::to_vec(value).unwrap_or_default()),
        headers: Vec::new(),
        timestamp_ms,
    }
}

/// One forgotten id, as the audit tells it (`"event":"forget"`; see docs/operations.md).
#[derive(Debug, Clone, Copy)]
pub struct Forget<'a> {
    /// The id as the operator gave it (with the front door's source prefix, if any).
    pub id: &'a str,
    pub key: LedgerKey,
    pub input_topic: &'a str,
    pub input_partition: i32,
    /// Who asked, as the request said.
    pub by: &'a str,
    pub reason: Option<&'a str>,
    pub at_ms: i64,
    /// Whether the worker held the id when it was forgotten: a copy arriving then, on any of
    /// the worker's partitions (they share one ledger), would have been dropped. It does not say
    /// that the id was seen on `input_partition`.
    pub held_by_worker: bool,
}

#[derive(Serialize)]
struct ForgetValue<'a> {
    v: u32,
    event: &'static str,
    id: &'a str,
    ledger_key: String,
    input_topic: &'a str,
    input_partition: i32,
    by: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    at_ms: i64,
    held_by_worker: bool,
}

/// The audit record of a forget: keyed by the id, to be sent to its input partition's number.
pub fn encode_forget(f: &Forget<'_>) -> OutRecord {
    let value = ForgetValue {
        v: FORMAT_VERSION,
        event: "forget",
        id: f.id,
        ledger_key: f.key.hex(),
        input_topic: f.input_topic,
        input_partition: f.input_partition,
        by: f.by,
        reason: f.reason,
        at_ms: f.at_ms,
        held_by_worker: f.held_by_worker,
    };
    audit_record(f.id.as_bytes().to_vec(), &value, Some(f.at_ms))
}

/// One record the output refused for good, sent to the dead-letter topic in its place, as the
/// audit tells it (`"event":"dead_letter"`; see docs/operations.md). Every one is audited: the
/// sampler and its cap are for duplicates, and a refusal is rare.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetter<'a> {
    pub key: LedgerKey,
    /// The refused record, as read from the input.
    pub record: &'a OutRecord,
    pub read_at: ReadAt<'a>,
    pub code: RDKafkaErrorCode,
    pub dead_letter_topic: &'a str,
    /// The dead letter kept the record's value (the dead-letter topic took it).
    pub with_value: bool,
    pub at_ms: i64,
}

#[derive(Serialize)]
struct DeadLetterValue<'a> {
    v: u32,
    event: &'static str,
    ledger_key: String,
    input_topic: &'a str,
    input_partition: i32,
    input_offset: i64,
    timestamp_ms: Option<i64>,
    bytes: usize,
    reason: &'static str,
    error: String,
    dead_letter_topic: &'a str,
    with_value: bool,
    at_ms: i64,
}

/// The audit record of a dead-lettered record: keyed like the input record, to be sent to the
/// input partition's number, in the transaction that writes its dead letter.
pub fn encode_dead_letter(d: &DeadLetter<'_>) -> OutRecord {
    let value = DeadLetterValue {
        v: FORMAT_VERSION,
        event: "dead_letter",
        ledger_key: d.key.hex(),
        input_topic: d.read_at.topic,
        input_partition: d.read_at.partition,
        input_offset: d.read_at.offset,
        timestamp_ms: d.record.timestamp_ms,
        bytes: d.record.size(),
        reason: refusal_reason(d.code),
        error: d.code.to_string(),
        dead_letter_topic: d.dead_letter_topic,
        with_value: d.with_value,
        at_ms: d.at_ms,
    };
    audit_record(keyed_like(d.record, d.key), &value, Some(d.at_ms))
}

/// Whether a drop is audited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Audited,
    /// Its id is outside `worker.audit_sample`.
    SampledOut,
    /// The partition's audit records this second reached `worker.audit_max_per_sec`.
    OverCap,
}

/// Chooses the drops to audit: by id (a share of the id space), then at most `max_per_sec` a
/// second.
#[derive(Debug)]
pub struct Sampler {
    /// Ids whose first 8 key bytes, as a number, are below this are sampled in.
    threshold: u64,
    everything: bool,
    max_per_sec: u32,
    second_started: Option<Instant>,
    used: u32,
}

impl Sampler {
    pub fn new(share: f64, max_per_sec: u32) -> Self {
        let share = share.clamp(0.0, 1.0);
        Self {
            threshold: (share * u64::MAX as f64) as u64,
            everything: share >= 1.0,
            max_per_sec,
            second_started: None,
            used: 0,
        }
    }

    /// Whether the drop of `key` at `now` is audited; an audited drop counts against the cap.
    pub fn admit(&mut self, key: &LedgerKey, now: Instant) -> Admission {
        let head = u64::from_be_bytes(
            key.as_bytes()[..8]
                .try_into()
                .expect("a ledger key has 16 bytes"),
        );
        if !self.everything && head >= self.threshold {
            return Admission::SampledOut;
        }
        if self
            .second_started
            .is_none_or(|s| now.duration_since(s).as_secs() >= 1)
        {
            self.second_started = Some(now);
            self.used = 0;
        }
        if self.used >= self.max_per_sec {
            return Admission::OverCap;
        }
        self.used += 1;
        Admission::Audited
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key(n: u64) -> LedgerKey {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&n.to_be_bytes());
        k[15] = 7;
        LedgerKey(k)
    }

    #[test]
    fn a_record_carries_every_documented_field_and_no_payload_unless_asked() {
        let record = OutRecord {
            key: Some(b"id-1".to_vec()),
            value: Some(b"{\"secret\":1}".to_vec()),
            headers: Vec::new(),
            timestamp_ms: Some(5_000),
        };
        let drop = DroppedCopy {
            key: key(1),
            record: &record,
            source: Some("web"),
            input_topic: "events.in",
            input_partition: 3,
            input_offset: 42,
            first_seen_ms: 1_000,
            age_ms: 4_000,
            in_batch: false,
            verdict: Verdict::ReusedId,
            refreshed: false,
        };
        let out = encode(&drop, false);
        assert_eq!(
            out.key.as_deref(),
            Some(&b"id-1"[..]),
            "keyed like the input record"
        );
        let v: serde_json::Value = serde_json::from_slice(out.value.as_deref().unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "v": 1, "ledger_key": "00000000000000010000000000000007", "source": "web", "input_topic": "events.in",
                "input_partition": 3, "input_offset": 42, "timestamp_ms": 5000, "first_seen_ms": 1000, "age_ms": 4000,
                "in_batch": false, "verdict": "reused_id"
            })
        );
        let refreshed = DroppedCopy {
            refreshed: true,
            ..drop
        };
        let v: serde_json::Value =
            serde_json::from_slice(encode(&refreshed, false).value.as_deref().unwrap()).unwrap();
        assert_eq!(
            v["refreshed"], true,
            "present only when the drop refreshed the id"
        );
        let with = encode(&drop, true);
        let v: serde_json::Value = serde_json::from_slice(with.value.as_deref().unwrap()).unwrap();
        assert_eq!(
            v["payload"], "eyJzZWNyZXQiOjF9",
            "base64 of the dropped copy's value"
        );
    }

    #[test]
    fn a_record_without_a_key_is_keyed_by_its_ledger_key() {
        let record = OutRecord::default();
        let drop = DroppedCopy {
            key: key(2),
            record: &record,
            source: None,
            input_topic: "t",
            input_partition: 0,
            input_offset: 0,
            first_seen_ms: 0,
            age_ms: 0,
            in_batch: true,
            verdict: Verdict::Retry,
            refreshed: false,
        };
        assert_eq!(
            encode(&drop, false).key.as_deref(),
            Some(&b"00000000000000020000000000000007"[..])
        );
    }

    #[test]
    fn sampling_keeps_a_share_of_ids_and_every_drop_of_a_kept_id() {
        let mut half = Sampler::new(0.5, u32::MAX);
        let t = Instant::now();
        assert_eq!(half.admit(&key(1), t), Admission::Audited);
        assert_eq!(
            half.admit(&key(1), t),
            Admission::Audited,
            "the same id again"
        );
        assert_eq!(half.admit(&key(u64::MAX - 1), t), Admission::SampledOut);
        let kept = (0..1000u64)
            .filter(|i| {
                half.admit(&key(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)), t) == Admission::Audited
            })
            .count();
        assert!(
            (400..600).contains(&kept),
            "{kept} of 1000 spread ids kept at 0.5"
        );
        let mut none = Sampler::new(0.0, u32::MAX);
        assert_eq!(none.admit(&key(0), t), Admission::SampledOut);
        let mut all = Sampler::new(1.0, u32::MAX);
        assert_eq!(all.admit(&key(u64::MAX), t), Admission::Audited);
    }

    #[test]
    fn the_cap_holds_per_second_and_renews_the_next() {
        let mut s = Sampler::new(1.0, 3);
        let t = Instant::now();
        let first: Vec<_> = (0..5).map(|i| s.admit(&key(i), t)).collect();
        assert_eq!(
            first,
            [
                Admission::Audited,
                Admission::Audited,
                Admission::Audited,
                Admission::OverCap,
                Admission::OverCap
            ]
        );
        assert_eq!(
            s.admit(&key(9), t + Duration::from_millis(999)),
            Admission::OverCap
        );
        assert_eq!(
            s.admit(&key(9), t + Duration::from_secs(1)),
            Admission::Audited,
            "a new second"
        );
    }
}

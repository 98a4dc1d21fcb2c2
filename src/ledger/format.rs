//! The on-disk format (see the [module docs](super)): the keys of the metadata and progress column
//! families, generation column family names, the encoding of stored first-seen times, the
//! generation metadata and the commit records, stored as JSON, and the extension of the files
//! the ledger ingests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Held, LedgerError, Result, FIRST_SEEN_RESOLUTION_MS, GENERATION_CF_PREFIX};
use crate::identity::{ContentDigest, CONTENT_DIGEST_BYTES, LEDGER_KEY_BYTES};
use crate::Partition;

/// Extension of the files written for ingestion (moved into the database when ingested): by a
/// commit's and a load's writers alike, and found again by recovery.
pub(super) const INGEST_FILE_EXTENSION: &str = "ingest";

pub(super) const META_FORMAT_VERSION: &[u8] = b"format_version";
pub(super) const META_GENERATION_PREFIX: &[u8] = b"gen/";
pub(super) const META_FORGOTTEN: &[u8] = b"forgotten";
pub(super) const META_COMMIT_SEQ: &[u8] = b"commit_seq";
/// The retention limit (JSON: ms, or null) the ledger was last opened for writing under.
pub(super) const META_RETENTION_LIMIT: &[u8] = b"retention_limit_ms";
/// Key of the commit record in a generation column family: longer than any id, and after every
/// id in key order, so it is the last key of an ingested file and never answers a lookup.
pub(super) const COMMIT_KEY: &[u8] =
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xffcommit";

// Ids are 16 bytes: the commit key is longer than any id, and the batch log's records hold them.
const _: () = assert!(LEDGER_KEY_BYTES == 16);

pub(super) fn generation_cf_name(id: u64) -> String {
    format!("{GENERATION_CF_PREFIX}{id:012}")
}

pub(super) fn generation_meta_key(id: u64) -> Vec<u8> {
    let mut key = META_GENERATION_PREFIX.to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

pub(super) fn progress_key(partition: Partition) -> [u8; 4] {
    partition.to_be_bytes()
}

/// What a generation's stored first-seen times are relative to: its base, and their resolution
/// ([`FIRST_SEEN_RESOLUTION_MS`], whole seconds; or 1 ms in a generation started under a
/// retention limit, whose comparisons are exact to the millisecond).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeBase {
    pub base_ms: i64,
    pub resolution_ms: i64,
}

impl TimeBase {
    /// Seconds from `base_ms`: the resolution of every generation without one recorded.
    pub fn seconds(base_ms: i64) -> Self {
        Self {
            base_ms,
            resolution_ms: FIRST_SEEN_RESOLUTION_MS,
        }
    }
}

/// Stored offset of an event time relative to a generation base (zigzag varint, in the base's
/// resolution).
pub(super) fn encode_first_seen(base: TimeBase, first_seen_ms: i64, out: &mut Vec<u8>) {
    let delta = first_seen_ms
        .saturating_sub(base.base_ms)
        .div_euclid(base.resolution_ms);
    let mut zz = ((delta << 1) ^ (delta >> 63)) as u64;
    loop {
        let byte = (zz & 0x7f) as u8;
        zz >>= 7;
        if zz == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A stored value: the first-seen offset, then the content digest's bytes when the id has one
/// (values written before format version 3 never do).
pub(super) fn encode_value(
    base: TimeBase,
    first_seen_ms: i64,
    digest: Option<ContentDigest>,
    out: &mut Vec<u8>,
) {
    encode_first_seen(base, first_seen_ms, out);
    if let Some(digest) = digest {
        out.extend_from_slice(&digest.to_bytes());
    }
}

/// What a stored value says: the first-seen time, and the digest if one follows it.
pub(super) fn decode_value(base: TimeBase, bytes: &[u8]) -> Result<Held> {
    let corrupt = || {
        LedgerError::CorruptMetadata {
        what: format!("a stored value is neither a first-seen varint nor one with a content digest: {bytes:?}"),
    }
    };
    let mut zz: u64 = 0;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        zz |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let delta = ((zz >> 1) as i64) ^ -((zz & 1) as i64);
            let first_seen_ms = base
                .base_ms
                .saturating_add(delta.saturating_mul(base.resolution_ms));
            let digest = match &bytes[i + 1..] {
                [] => None,
                rest => Some(
                    <[u8; CONTENT_DIGEST_BYTES]>::try_from(rest)
                        .ok()
                        .and_then(ContentDigest::from_bytes)
                        .ok_or_else(corrupt)?,
                ),
            };
            return Ok(Held {
                first_seen_ms,
                digest,
            });
        }
    }
    Err(corrupt())
}

/// The first-seen time a later lookup will report for an id recorded at `first_seen_ms`.
pub fn stored_first_seen_ms(base: TimeBase, first_seen_ms: i64) -> i64 {
    base.base_ms.saturating_add(
        first_seen_ms
            .saturating_sub(base.base_ms)
            .div_euclid(base.resolution_ms)
            .saturating_mul(base.resolution_ms),
    )
}

/// First and last event times of the ids one partition recorded into one generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionSpan {
    /// Earliest event time, ms.
    pub first_seen_ms: i64,
    /// Latest event time, ms.
    pub last_seen_ms: i64,
    /// Ids recorded.
    pub ids: u64,
}

/// Metadata of one generation, stored in [`CF_META`](super::CF_META) and written atomically with
/// the batches that change it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationMeta {
    /// Generation number (increasing with age: higher is newer).
    pub id: u64,
    /// Event time the stored first-seen offsets are relative to (first id recorded), ms.
    pub base_ms: Option<i64>,
    /// The stored offsets' resolution, ms: [`FIRST_SEEN_RESOLUTION_MS`] (absent from the JSON,
    /// as every generation before format version 4 has it), or 1 in a generation started under
    /// a retention limit (format version 4).
    #[serde(
        default = "seconds_resolution",
        skip_serializing_if = "is_seconds_resolution"
    )]
    pub resolution_ms: i64,
    /// No more ids are recorded into a sealed generation.
    pub sealed: bool,
    /// Ids recorded (exact; "approximate" only in that a crash in NoWal mode may roll it back
    /// together with the ids).
    pub ids: u64,
    /// Per-partition spans.
    pub partitions: BTreeMap<Partition, PartitionSpan>,
}

fn seconds_resolution() -> i64 {
    FIRST_SEEN_RESOLUTION_MS
}

fn is_seconds_resolution(ms: &i64) -> bool {
    *ms == FIRST_SEEN_RESOLUTION_MS
}

impl GenerationMeta {
    /// What the generation's stored first-seen times are relative to, once it has a base.
    pub fn time_base(&self) -> Option<TimeBase> {
        Some(TimeBase {
            base_ms: self.base_ms?,
            resolution_ms: self.resolution_ms.max(1),
        })
    }
}

/// The commit record ingested with a buffered run of ids ([`COMMIT_KEY`]): what the metadata
/// and progress column families must say once that file is in. Cumulative, so the newest one
/// alone restores them.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct CommitRecord {
    pub(super) seq: u64,
    pub(super) meta: GenerationMeta,
    pub(super) progress: BTreeMap<Partition, Vec<u8>>,
    /// Every partition's window floor ([`META_FORGOTTEN`]) as of this commit, when the commit
    /// changed one (a bulk load); absent otherwise, and in records written before loads existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) forgotten: Option<BTreeMap<Partition, i64>>,
}

pub(super) fn parse_json<T: for<'de> Deserialize<'de>>(what: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| LedgerError::CorruptMetadata {
        what: format!("{what}: {e}"),
    })
}

pub(super) fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing these plain structs and maps with integer keys cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

//! The id changelog: what lets a partition's dedupe window move with the partition.
//!
//! Every output transaction that publishes new ids also writes one changelog record, holding
//! those ids and their first-seen times, to the changelog topic's partition of the same number,
//! in the same transaction. The changelog is therefore exactly as committed as the output: a
//! `read_committed` reader sees a batch's ids if and only if it sees the batch's records. A worker
//! that is assigned a partition loads the partition's ids from the changelog (about 19 bytes per
//! id, against the hundreds of bytes of an output message) before it publishes anything from it.
//!
//! Record value, version 1:
//! `0x01`, count (unsigned LEB128 varint), base first-seen ms (i64 big-endian), then per id its
//! 16-byte ledger key and its first-seen time minus the base (zigzag varint). No key, no headers.
//! Content digests are not carried: a loaded id's later copies get the verdict `unknown`.
//!
//! Marker records (rare: an operator's forget, and the first re-send after it), same partition:
//! `0x02` (forgotten) or `0x03` (published again after a forget), count (varint), the time it was
//! marked (ms, i64 big-endian), then the ids' 16-byte ledger keys. Recovery applies them in
//! offset order ([`crate::ledger::Mark`]). Code that predates them refuses such a record by
//! its first byte and names it.

use crate::identity::{LedgerKey, LEDGER_KEY_BYTES};
use crate::ledger::{MarkKind, Sent};

pub(crate) const VERSION: u8 = 1;
pub(crate) const FORGOTTEN: u8 = 2;
pub(crate) const RESENT: u8 = 3;

/// A marker record: what it says of its ids, when it was made (ms), and the ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkRecord {
    pub kind: MarkKind,
    pub at_ms: i64,
    pub keys: Vec<LedgerKey>,
}

/// The changelog topic used when `worker.changelog_topic` is not set.
pub fn default_topic(output_topic: &str) -> String {
    format!("{output_topic}.ids")
}

/// Why a changelog record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChangelogFormatError {
    #[error("changelog record of kind {0} (this version reads kinds {VERSION} to {RESENT}: ids and forget markers)")]
    Version(u8),
    #[error("changelog record is truncated or malformed at byte {0}")]
    Malformed(usize),
}

/// Encodes a batch's new ids with their first-seen times (ms). `None` for an empty batch: a
/// transaction without new ids writes no changelog record.
pub fn encode<S: Sent>(ids: &[S]) -> Option<Vec<u8>> {
    let base = ids.first()?.time_ms();
    let mut out = Vec::with_capacity(1 + 10 + 8 + ids.len() * (LEDGER_KEY_BYTES + 3));
    out.push(VERSION);
    put_varint(&mut out, ids.len() as u64);
    out.extend_from_slice(&base.to_be_bytes());
    for id in ids {
        out.extend_from_slice(id.key().as_bytes());
        put_varint(&mut out, zigzag(id.time_ms().wrapping_sub(base)));
    }
    Some(out)
}

/// Encodes a marker record; `None` without keys.
pub fn encode_mark(kind: MarkKind, at_ms: i64, keys: &[LedgerKey]) -> Option<Vec<u8>> {
    if keys.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(1 + 10 + 8 + keys.len() * LEDGER_KEY_BYTES);
    out.push(match kind {
        MarkKind::Forgotten => FORGOTTEN,
        MarkKind::Resent => RESENT,
    });
    put_varint(&mut out, keys.len() as u64);
    out.extend_from_slice(&at_ms.to_be_bytes());
    for key in keys {
        out.extend_from_slice(key.as_bytes());
    }
    Some(out)
}

/// Whether a changelog record is a marker record (by its first byte).
pub fn is_mark(bytes: &[u8]) -> bool {
    matches!(bytes.first(), Some(&FORGOTTEN) | Some(&RESENT))
}

/// Decodes a marker record.
pub fn decode_mark(bytes: &[u8]) -> Result<MarkRecord, ChangelogFormatError> {
    let kind = match bytes.first() {
        Some(&FORGOTTEN) => MarkKind::Forgotten,
        Some(&RESENT) => MarkKind::Resent,
        Some(&other) => return Err(ChangelogFormatError::Version(other)),
        None => return Err(ChangelogFormatError::Malformed(0)),
    };
    let mut at = 1;
    let count = get_varint(bytes, &mut at)?;
    let at_ms = bytes
        .get(at..at + 8)
        .map(|b| i64::from_be_bytes(b.try_into().expect("8 bytes")))
        .ok_or(ChangelogFormatError::Malformed(at))?;
    at += 8;
    let rest = bytes.len().saturating_sub(at);
    if rest % LEDGER_KEY_BYTES != 0 || (rest / LEDGER_KEY_BYTES) as u64 != count {
        return Err(ChangelogFormatError::Malformed(at));
    }
    let keys = bytes[at..]
        .chunks_exact(LEDGER_KEY_BYTES)
        .map(|k| LedgerKey(k.try_into().expect("16 bytes")))
        .collect();
    Ok(MarkRecord { kind, at_ms, keys })
}

/// How many ids a changelog record holds, from its header alone.
pub fn count(bytes: &[u8]) -> Result<u64, ChangelogFormatError> {
    let version = *bytes.first().ok_or(ChangelogFormatError::Malformed(0))?;
    if version != VERSION {
        return Err(ChangelogFormatError::Version(version));
    }
    let mut at = 1;
    get_varint(bytes, &mut at)
}

/// Decodes a changelog record into ids and first-seen times (ms), appending to `out`.
pub fn decode_into(
    bytes: &[u8],
    out: &mut Vec<(LedgerKey, i64)>,
) -> Result<(), ChangelogFormatError> {
    let mut at = 0usize;
    let version = *bytes.first().ok_or(ChangelogFormatError::Malformed(0))?;
    if version != VERSION {
        return Err(ChangelogFormatError::Version(version));
    }
    at += 1;
    let count = get_varint(bytes, &mut at)?;
    let base = bytes
        .get(at..at + 8)
        .map(|b| i64::from_be_bytes(b.try_into().expect("8 bytes")))
        .ok_or(ChangelogFormatError::Malformed(at))?;
    at += 8;
    // Each id takes at least 17 bytes: a count larger than the record can hold is malformed,
    // and is refused before anything is reserved for it.
    if count > (bytes.len().saturating_sub(at) / (LEDGER_KEY_BYTES + 1)) as u64 {
        return Err(ChangelogFormatError::Malformed(at));
    }
    out.reserve(count as usize);
    for _ in 0..count {
        let key: [u8; LEDGER_KEY_BYTES] = bytes
            .get(at..at + LEDGER_KEY_BYTES)
            .and_then(|b| b.try_into().ok())
            .ok_or(ChangelogFormatError::Malformed(at))?;
        at += LEDGER_KEY_BYTES;
        let delta = unzigzag(get_varint(bytes, &mut at)?);
        out.push((LedgerKey(key), base.wrapping_add(delta)));
    }
    if at != bytes.len() {
        return Err(ChangelogFormatError::Malformed(at));
    }
    Ok(())
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(bytes: &[u8], at: &mut usize) -> Result<u64, ChangelogFormatError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at).ok_or(ChangelogFormatError::Malformed(*at))?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(ChangelogFormatError::Malformed(*at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(n: u8) -> LedgerKey {
        LedgerKey([n; LEDGER_KEY_BYTES])
    }

    #[test]
    fn a_known_record_decodes_and_the_format_does_not_drift() {
        let ids = [(key(1), 1_000), (key(2), 999), (key(3), 1_064)];
        let bytes = encode(&ids).unwrap();
        let mut expected = vec![1, 3, 0, 0, 0, 0, 0, 0, 3, 0xe8];
        expected.extend([1; 16]);
        expected.push(0); // delta 0
        expected.extend([2; 16]);
        expected.push(1); // delta -1
        expected.extend([3; 16]);
        expected.push(128); // delta 64: zigzag 128, two varint bytes
        expected.push(1);
        assert_eq!(bytes, expected);
        let mut out = Vec::new();
        decode_into(&bytes, &mut out).unwrap();
        assert_eq!(out, ids);
        assert_eq!(count(&bytes), Ok(3));
        assert!(
            encode::<(LedgerKey, i64)>(&[]).is_none(),
            "no new ids, no record"
        );
    }

    #[test]
    fn malformed_records_are_refused_not_misread() {
        let bytes = encode(&[(key(7), 5), (key(8), 6)]).unwrap();
        let mut out = Vec::new();
        for cut in 0..bytes.len() {
            assert!(
                decode_into(&bytes[..cut], &mut out).is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_into(&longer, &mut out).is_err());
        let mut other = bytes.clone();
        other[0] = 9;
        assert_eq!(
            decode_into(&other, &mut out),
            Err(ChangelogFormatError::Version(9))
        );
        assert_eq!(decode_mark(&other), Err(ChangelogFormatError::Version(9)));
        // A count far larger than the bytes can hold is refused without allocating for it.
        let mut huge = vec![1];
        put_varint(&mut huge, u64::MAX >> 1);
        huge.extend(0i64.to_be_bytes());
        assert!(decode_into(&huge, &mut out).is_err());
    }

    #[test]
    fn marker_records_round_trip_and_refuse_a_wrong_length() {
        let keys = [key(4), key(5)];
        let bytes = encode_mark(MarkKind::Forgotten, 1_700_000_000_000, &keys).unwrap();
        assert!(is_mark(&bytes));
        assert!(!is_mark(&encode(&[(key(1), 1)]).unwrap()));
        assert_eq!(bytes[0], 2);
        assert_eq!(
            decode_mark(&bytes),
            Ok(MarkRecord {
                kind: MarkKind::Forgotten,
                at_ms: 1_700_000_000_000,
                keys: keys.to_vec(),
            })
        );
        let resent = encode_mark(MarkKind::Resent, 5, &keys[..1]).unwrap();
        assert_eq!(decode_mark(&resent).unwrap().kind, MarkKind::Resent);
        for cut in 0..bytes.len() {
            assert!(decode_mark(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_mark(&longer).is_err());
        // An ids record is not read as marks, nor marks as ids.
        let mut out = Vec::new();
        assert_eq!(
            decode_into(&bytes, &mut out),
            Err(ChangelogFormatError::Version(2))
        );
        assert!(encode_mark(MarkKind::Forgotten, 0, &[]).is_none());
    }

    proptest! {
        #[test]
        fn any_batch_round_trips(ids in proptest::collection::vec((any::<[u8; 16]>(), any::<i64>()), 1..200)) {
            let ids: Vec<(LedgerKey, i64)> = ids.into_iter().map(|(k, t)| (LedgerKey(k), t)).collect();
            let mut out = Vec::new();
            decode_into(&encode(&ids).unwrap(), &mut out).unwrap();
            prop_assert_eq!(out, ids);
        }
    }
}

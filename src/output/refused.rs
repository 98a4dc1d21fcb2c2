//! Records the output refuses for good: which errors say so, and the dead letter a refused record
//! becomes with `worker.dead_letter_topic` (its key and headers, its value while the dead-letter
//! topic takes it, and headers naming where it was read, its size and why it was refused).

use rdkafka::error::RDKafkaErrorCode;

use super::OutRecord;
use crate::identity::LedgerKey;
use crate::wire::{
    HEADER_ERROR, HEADER_REASON, HEADER_REFUSED_BY, HEADER_REFUSED_BYTES,
    HEADER_REFUSED_LEDGER_KEY, HEADER_REFUSED_SOURCE,
};

/// Whether an error for one record says that sending it again as it is cannot succeed: larger
/// than the topic (or the producer) accepts, a record the broker finds invalid, a timestamp
/// outside what the topic accepts. A missing permission or a broker fault is not one: those
/// fail every record, and time or an operator cures them.
pub fn is_refusal(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidTimestamp
            | RDKafkaErrorCode::BadMessage
    )
}

/// The reason label and header value for a refusal's code: what an operator changes.
pub fn refusal_reason(code: RDKafkaErrorCode) -> &'static str {
    match code {
        RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize => {
            REASON_TOO_LARGE
        }
        RDKafkaErrorCode::InvalidTimestamp => REASON_INVALID_TIMESTAMP,
        _ => REASON_INVALID_RECORD,
    }
}

/// Values of [`refusal_reason`].
pub const REASON_TOO_LARGE: &str = "too_large";
pub const REASON_INVALID_TIMESTAMP: &str = "invalid_timestamp";
pub const REASON_INVALID_RECORD: &str = "invalid_record";

/// Where a refused record was read.
#[derive(Debug, Clone, Copy)]
pub struct ReadAt<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

/// The dead letter of `record`, which `refused_by` (the output topic's name) refused with `code`:
/// its key, headers and timestamp, its value when `with_value`, and the headers naming why
/// ([`HEADER_REASON`]: [`refusal_reason`]; [`HEADER_ERROR`]: the broker's words), where it was
/// read ([`HEADER_REFUSED_SOURCE`]: `<topic>:<partition>:<offset>`), its size
/// ([`HEADER_REFUSED_BYTES`]: key, value and headers) and the topic that refused it
/// ([`HEADER_REFUSED_BY`]), and the ledger key of its id ([`HEADER_REFUSED_LEDGER_KEY`]) when it
/// has one. Without its value it carries no timestamp either (the dead-letter
/// topic stamps it), so a record refused for its time is taken too.
pub fn refused_dead_letter(
    record: &OutRecord,
    read_at: ReadAt<'_>,
    code: RDKafkaErrorCode,
    refused_by: &str,
    with_value: bool,
    key: Option<LedgerKey>,
) -> OutRecord {
    let mut headers = record.headers.clone();
    let source = format!("{}:{}:{}", read_at.topic, read_at.partition, read_at.offset);
    for (name, value) in [
        (HEADER_REASON, refusal_reason(code).to_string()),
        (HEADER_ERROR, code.to_string()),
        (HEADER_REFUSED_SOURCE, source),
        (HEADER_REFUSED_BYTES, record.size().to_string()),
        (HEADER_REFUSED_BY, refused_by.to_string()),
    ] {
        headers.push((name.to_string(), Some(value.into_bytes())));
    }
    if let Some(key) = key {
        headers.push((
            HEADER_REFUSED_LEDGER_KEY.to_string(),
            Some(key.hex().into_bytes()),
        ));
    }
    OutRecord {
        key: record.key.clone(),
        value: if with_value {
            record.value.clone()
        } else {
            None
        },
        headers,
        timestamp_ms: if with_value {
            record.timestamp_ms
        } else {
            None
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'r>(r: &'r OutRecord, name: &str) -> Option<&'r str> {
        r.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    #[test]
    fn a_refused_records_dead_letter_names_where_it_was_read_its_size_and_why() {
        let record = OutRecord {
            key: Some(b"k-1".to_vec()),
            value: Some(vec![9; 5000]),
            headers: vec![("dedupe-source".into(), Some(b"web".to_vec()))],
            timestamp_ms: Some(1_000),
        };
        let at = ReadAt {
            topic: "events.in",
            partition: 3,
            offset: 77,
        };
        let code = RDKafkaErrorCode::MessageSizeTooLarge;
        let key = LedgerKey([0xab; 16]);
        let with = refused_dead_letter(&record, at, code, "events.out", true, Some(key));
        assert_eq!(with.key, record.key);
        assert_eq!(with.value, record.value);
        assert_eq!(with.timestamp_ms, Some(1_000));
        assert_eq!(
            header(&with, "dedupe-source"),
            Some("web"),
            "its own headers kept"
        );
        assert_eq!(header(&with, HEADER_REASON), Some(REASON_TOO_LARGE));
        assert_eq!(header(&with, HEADER_REFUSED_SOURCE), Some("events.in:3:77"));
        assert_eq!(header(&with, HEADER_REFUSED_BYTES), Some("5019"));
        assert_eq!(header(&with, HEADER_REFUSED_BY), Some("events.out"));
        assert_eq!(
            header(&with, HEADER_REFUSED_LEDGER_KEY),
            Some("abababababababababababababababab")
        );
        // Without its value: no value and no timestamp, the same headers.
        let without = refused_dead_letter(&record, at, code, "events.out", false, Some(key));
        assert_eq!((without.value, without.timestamp_ms), (None, None));
        assert_eq!(without.headers, with.headers);
        // A record without an id names none.
        let unkeyed = refused_dead_letter(&record, at, code, "events.out", true, None);
        assert_eq!(header(&unkeyed, HEADER_REFUSED_LEDGER_KEY), None);
    }

    #[test]
    fn only_what_a_retry_cannot_cure_is_a_refusal() {
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::InvalidRecord,
            RDKafkaErrorCode::InvalidTimestamp,
        ] {
            assert!(is_refusal(code), "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::OutOfOrderSequenceNumber,
            RDKafkaErrorCode::PurgeQueue,
        ] {
            assert!(!is_refusal(code), "{code:?}");
        }
        assert_eq!(
            refusal_reason(RDKafkaErrorCode::InvalidTimestamp),
            REASON_INVALID_TIMESTAMP
        );
    }
}

//! Finding a refused record's dead letter: `dedupe explain` of a held id looks in
//! `worker.dead_letter_topic` for the dead letter whose [`HEADER_REFUSED_LEDGER_KEY`] names the
//! id's ledger key, so that an id whose record the output refused is explained as such, not only
//! as "held". The ledger itself records nothing more for such an id (its format is the one every
//! past release reads): the dead-letter topic is where the record went, so it is asked.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::identity::message_view;
#[cfg(doc)]
use crate::identity::LedgerKey;
use crate::kafka::{client_config, read_from, KafkaConfig, ReadError};
use crate::wire::{HEADER_REASON, HEADER_REFUSED_LEDGER_KEY, HEADER_REFUSED_SOURCE};

/// How long before an id's first sighting the search starts. A dead letter carries its record's
/// own time, or, without its value, the time the dead-letter topic stamped it, which follows the
/// record's time unless that is in the future; an hour covers a client clock that far ahead.
pub const SEARCH_BEFORE_MS: i64 = 3_600_000;

/// Where a refused record's dead letter is, and what it says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterAt {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Why the output refused it (`too_large`, `invalid_record`, `invalid_timestamp`).
    pub reason: Option<String>,
    /// Where it was read: `<topic>:<partition>:<offset>`.
    pub read_at: Option<String>,
}

/// The dead letter in `topic` (read committed) whose ledger key is `key_hex` (as
/// [`LedgerKey::hex`] writes it), looking at what was written since `since_ms` less
/// [`SEARCH_BEFORE_MS`]; `None` when there is none. Fails if the topic's end is not reached in
/// time: each of its steps (the topic's partitions, their offsets at that time, the reading) has
/// a third of `timeout` (the reading's own metadata request up to 10 s more), so that an answer,
/// or the reason there is none, comes within what an operator's request waits.
pub fn find_dead_letter(
    kafka: &KafkaConfig,
    topic: &str,
    key_hex: &str,
    since_ms: i64,
    timeout: Duration,
) -> Result<Option<DeadLetterAt>, ReadError> {
    let step = timeout / 3;
    let start = offsets_since(kafka, topic, since_ms - SEARCH_BEFORE_MS, step)?;
    let mut found = None;
    read_from(kafka, topic, true, &start, step, &mut |m| {
        if found.is_some() || header(m, HEADER_REFUSED_LEDGER_KEY) != Some(key_hex) {
            return;
        }
        found = Some(DeadLetterAt {
            topic: topic.to_string(),
            partition: m.partition(),
            offset: m.offset(),
            reason: header(m, HEADER_REASON).map(str::to_string),
            read_at: header(m, HEADER_REFUSED_SOURCE).map(str::to_string),
        });
    })?;
    Ok(found)
}

/// Each partition's first offset whose record time is at least `ms` (its end when none is).
fn offsets_since(
    kafka: &KafkaConfig,
    topic: &str,
    ms: i64,
    timeout: Duration,
) -> Result<HashMap<i32, i64>, ReadError> {
    let consumer: BaseConsumer = client_config(kafka).create()?;
    let md = consumer.fetch_metadata(Some(topic), timeout)?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .ok_or_else(|| ReadError::NoSuchTopic(topic.to_string()))?;
    let mut tpl = TopicPartitionList::new();
    for p in t.partitions() {
        tpl.add_partition_offset(topic, p.id(), Offset::Offset(ms.max(0)))?;
    }
    let found = consumer.offsets_for_times(tpl, timeout)?;
    Ok(found
        .elements()
        .iter()
        .filter_map(|e| {
            let offset = match e.offset() {
                Offset::Offset(o) => o,
                // Nothing that recent: start at the end (librdkafka's logical end offset).
                _ => Offset::End.to_raw()?,
            };
            Some((e.partition(), offset))
        })
        .collect())
}

/// The text of header `name` of `m`, if it has one, read as the worker reads a message's headers
/// ([`message_view`]: a header named twice from its first occurrence).
fn header<'m>(m: &'m rdkafka::message::BorrowedMessage<'_>, name: &str) -> Option<&'m str> {
    (message_view(m).header)(name).and_then(|v| std::str::from_utf8(v).ok())
}

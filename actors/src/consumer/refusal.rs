//! Records the output refuses for good, in the per-batch protocol (`protocol.rs`): which record
//! of an attempt was refused first, what a record refused alone is sent as next (to the
//! dead-letter topic with its value, then without), and what the partition reports once one
//! went there. The core decides what a refusal is and writes the dead letter
//! (`dedupe::output::{is_refusal, refused_dead_letter}`).

use dedupe::audit;
use dedupe::clock::now_ms;
use dedupe::output::{refused_dead_letter, ReadAt, RefusedIn, RefusedRecord};
use rdkafka::types::RDKafkaErrorCode;

use super::seams::{SinkAccess, StoreAccess};
use super::{InRecord, Pipeline};
use crate::events::partition::RecordDeadLettered;
use crate::producer::Outgoing;

/// What became of the records handed to [`Pipeline::process`].
#[derive(Debug)]
pub(super) enum Processed {
    /// All of them are committed and recorded.
    Through,
    /// Those before `rest` are committed and recorded. The output refuses `rest`'s first record
    /// for good, alone in its transaction, and no dead-letter topic takes it: the partition stops
    /// at it, nothing after it published, until the output accepts it.
    StoppedAt {
        rest: Vec<InRecord>,
        code: RDKafkaErrorCode,
        refused_by: RefusedIn,
    },
}

/// How the first record of a transaction of one is sent, after the output refused it alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Isolation {
    /// As it is: a record refused in company may only have shared the broker's request with
    /// the record refused; alone, a refusal is its own.
    AsItIs,
    /// To the dead-letter topic instead of its fate's place, with its value.
    DeadLetter(RDKafkaErrorCode),
    /// To the dead-letter topic, without its value (the dead-letter topic refused that too).
    DeadLetterWithoutValue(RDKafkaErrorCode),
}

/// A refused record sent to the dead-letter topic, as it is reported once its transaction
/// committed.
#[derive(Debug, Clone, Copy)]
pub(super) struct DeadLettered {
    offset: i64,
    bytes: usize,
    code: RDKafkaErrorCode,
    with_value: bool,
}

/// A record the output refused, as one attempt found it: its place in the records attempted.
pub(super) struct Refusal {
    pub(super) position: usize,
    pub(super) code: RDKafkaErrorCode,
    pub(super) refused_by: RefusedIn,
}

impl<S: StoreAccess, K: SinkAccess> Pipeline<S, K> {
    /// What a refused record sent to the dead-letter topic is reported with, once it committed.
    pub(super) fn dead_lettered(batch: &[InRecord], isolation: Isolation) -> Option<DeadLettered> {
        let (code, with_value) = match isolation {
            Isolation::AsItIs => return None,
            Isolation::DeadLetter(code) => (code, true),
            Isolation::DeadLetterWithoutValue(code) => (code, false),
        };
        let r = batch.first()?;
        Some(DeadLettered {
            offset: r.offset,
            bytes: r.out.size(),
            code,
            with_value,
        })
    }

    pub(super) fn report_dead_lettered(&self, d: DeadLettered) {
        RecordDeadLettered {
            partition: self.partition,
            input_topic: &self.settings.input_topic,
            offset: d.offset,
            bytes: d.bytes,
            code: d.code,
            dead_letter_topic: self
                .settings
                .dead_letter_topic
                .as_deref()
                .unwrap_or_default(),
            with_value: d.with_value,
        }
        .emit();
    }

    /// Sends a record the output refused alone to the dead-letter topic instead, as the core
    /// writes a refused record's dead letter (`dedupe::output::refused_dead_letter`). Its id, if
    /// it has one, is held as any published id is, so its copies are dropped as duplicates; with
    /// the audit on, the audit says so in the same transaction.
    pub(super) fn refused_to_dead_letter(
        &mut self,
        r: InRecord,
        isolation: Isolation,
        outgoing: &mut Outgoing,
    ) {
        let (code, with_value) = match isolation {
            Isolation::DeadLetter(code) => (code, true),
            Isolation::DeadLetterWithoutValue(code) => (code, false),
            Isolation::AsItIs => return,
        };
        let read_at = ReadAt {
            topic: &self.settings.input_topic,
            partition: self.partition,
            offset: r.offset,
        };
        outgoing.dead_letters.push(refused_dead_letter(
            &r.out,
            read_at,
            code,
            &self.settings.output_topic,
            with_value,
            r.id.ok(),
        ));
        outgoing.dead_letter_positions.push(0);
        // With the audit on, the dead letter is in it too, whatever its sampling.
        if let (true, Ok(key)) = (self.settings.audit.is_some(), r.id) {
            outgoing
                .audit
                .push(audit::encode_dead_letter(&audit::DeadLetter {
                    key,
                    record: &r.out,
                    read_at,
                    code,
                    dead_letter_topic: self
                        .settings
                        .dead_letter_topic
                        .as_deref()
                        .unwrap_or_default(),
                    with_value,
                    at_ms: now_ms(),
                }));
        }
    }
}

/// The refused record that comes first in the batch, by its place among the records attempted.
pub(super) fn first_refused(outgoing: &Outgoing, refused: &[RefusedRecord]) -> Refusal {
    refused
        .iter()
        .filter_map(|r| {
            let positions = match r.topic {
                RefusedIn::Output => &outgoing.positions,
                RefusedIn::DeadLetter => &outgoing.dead_letter_positions,
            };
            Some(Refusal {
                position: *positions.get(r.index)?,
                code: r.code,
                refused_by: r.topic,
            })
        })
        .min_by_key(|r| r.position)
        // A refusal naming no record of the batch (none should): the whole batch alone.
        .unwrap_or(Refusal {
            position: 0,
            code: refused.first().map_or(RDKafkaErrorCode::Fail, |r| r.code),
            refused_by: RefusedIn::Output,
        })
}

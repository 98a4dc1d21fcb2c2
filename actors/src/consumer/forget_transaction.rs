//! Forgets, done by the partition's own pipeline between two batches, so a forget and the batches
//! around it are ordered as they are in the id changelog.
//!
//! A forget is one transaction of the partition's output producer: a marker record in the id
//! changelog ("forgotten", see `dedupe::changelog`) and, with the audit on, one audit record per
//! id (who asked, when, whether the worker's ledger held it). No input offset goes with it. Once
//! it committed, the ledger marks the ids forgotten: they answer "not held", on every partition of
//! the worker (the ledger is shared by them). A crash between the commit and the mark is repaired
//! as any unrecorded batch is: recovery replays the changelog from the partition's progress
//! record, the marker included. A forgotten id's next copy, on whichever partition, is published
//! with a "resent" marker in its batch's transaction, and recorded with its mark changed to
//! resent before the batch is: from then on it is held as any id is, on every partition (see
//! `dedupe::ledger::forgotten_since`).

use std::collections::BTreeMap;
use std::sync::Arc;

use dedupe::audit::{self, Forget};
use dedupe::changelog;
use dedupe::clock::now_ms;
use dedupe::identity::LedgerKey;
use dedupe::ledger::{Forgotten, Mark, MarkKind};
use serde::Serialize;
use tokio::sync::oneshot;

use super::seams::{SinkAccess, StoreAccess};
use super::{Decided, Pipeline, PipelineError};
use crate::events::{ForgetFailed, IdsForgotten};
use crate::producer::Outgoing;

/// Ids to forget, all of one partition, and where to answer.
pub struct ForgetRequest {
    pub ids: Vec<ForgetId>,
    /// Who asked (the request's `by`), for the audit.
    pub by: String,
    pub reason: Option<String>,
    /// The forget's time, the same for every partition of one request and later than any re-send
    /// of its ids the ledger holds: what orders it against the re-sends of other partitions.
    pub at_ms: i64,
    pub reply: oneshot::Sender<Result<ForgetReport, String>>,
}

/// One id to forget: as the operator gave it, its ledger key, and whether the worker held it
/// when the request came (a copy arriving then, on any of the worker's partitions, would have
/// been dropped): looked up once per request, before any of its partitions forgets it.
pub struct ForgetId {
    pub id: String,
    pub key: LedgerKey,
    pub held_by_worker: bool,
}

/// A forget done.
#[derive(Debug, Clone, Serialize)]
pub struct ForgetReport {
    pub partition: i32,
    pub ids: usize,
    /// Of them, the ids the worker's ledger held when they were forgotten (the others' next copy
    /// was to be published anyway). The ledger is shared by the worker's partitions: this does
    /// not say that an id was seen on this partition.
    pub held_by_worker: usize,
    /// The offset of the forget's marker in the id changelog.
    pub changelog_offset: i64,
}

/// The forgotten ids a batch publishes again: marked resent with the batch.
pub(super) struct Resent {
    keys: Vec<LedgerKey>,
    at_ms: i64,
    partition: i32,
}

impl Resent {
    /// The marks to record with the batch, at the offset of its changelog's last record (the
    /// resent marker, written after the ids).
    pub(super) fn marks(&self, changelog_offset: Option<i64>) -> Vec<(LedgerKey, Mark)> {
        let Some(offset) = changelog_offset else {
            return Vec::new();
        };
        let mark = Mark {
            partition: self.partition,
            kind: MarkKind::Resent,
            changelog_offset: offset,
            at_ms: self.at_ms,
        };
        self.keys.iter().map(|k| (*k, mark)).collect()
    }
}

impl<S: StoreAccess, K: SinkAccess> Pipeline<S, K> {
    /// Which of the batch's new ids were forgotten: their resent marker joins the transaction,
    /// in this partition's changelog and in the changelog of each other partition their forget
    /// was written to (so that partition, loaded alone, reads the forget ended). Its time is
    /// never before the forgets it ends (a clock stepped back must not leave them in force: see
    /// `dedupe::ledger::forgotten_since`).
    pub(super) fn resent(&self, decided: &mut Decided, forgotten: &[Forgotten]) -> Resent {
        let mut at_ms = now_ms();
        let mut keys = Vec::new();
        let mut elsewhere: BTreeMap<i32, Vec<LedgerKey>> = BTreeMap::new();
        if !forgotten.is_empty() {
            for (key, ..) in &decided.outgoing.new_ids {
                let Some(f) = forgotten.iter().find(|f| f.key == *key) else {
                    continue;
                };
                at_ms = at_ms.max(f.at_ms);
                keys.push(*key);
                for &p in f.partitions.iter().filter(|&&p| p != self.partition) {
                    elsewhere.entry(p).or_default().push(*key);
                }
            }
        }
        if let Some(marker) = changelog::encode_mark(MarkKind::Resent, at_ms, &keys) {
            decided.outgoing.marks.push(marker);
        }
        decided.outgoing.other_marks = elsewhere
            .into_iter()
            .filter_map(|(p, keys)| {
                changelog::encode_mark(MarkKind::Resent, at_ms, &keys).map(|m| (p, m))
            })
            .collect();
        Resent {
            keys,
            at_ms,
            partition: self.partition,
        }
    }

    /// Does a forget and answers it. A failed transaction or ledger write fails the pipeline as
    /// a batch's would (the partition is taken over again), after answering with the cause.
    pub(super) async fn forget(&mut self, request: ForgetRequest) -> Result<(), PipelineError> {
        let ForgetRequest {
            ids,
            by,
            reason,
            at_ms,
            reply,
        } = request;
        let done = self.forget_ids(&ids, &by, reason.as_deref(), at_ms).await;
        match done {
            Ok(report) => {
                let _ = reply.send(Ok(report));
                Ok(())
            }
            Err(e) => {
                ForgetFailed {
                    partition: self.partition,
                    ids: ids.len(),
                    error: &e,
                }
                .emit();
                let _ = reply.send(Err(e.to_string()));
                Err(e)
            }
        }
    }

    async fn forget_ids(
        &mut self,
        ids: &[ForgetId],
        by: &str,
        reason: Option<&str>,
        at_ms: i64,
    ) -> Result<ForgetReport, PipelineError> {
        let p = self.partition;
        let keys: Vec<LedgerKey> = ids.iter().map(|i| i.key).collect();
        let audit = match &self.settings.audit {
            Some(_) => ids
                .iter()
                .map(|i| {
                    audit::encode_forget(&Forget {
                        id: &i.id,
                        key: i.key,
                        input_topic: &self.settings.input_topic,
                        input_partition: p,
                        by,
                        reason,
                        at_ms,
                        held_by_worker: i.held_by_worker,
                    })
                })
                .collect(),
            None => Vec::new(),
        };
        let outgoing = Arc::new(Outgoing {
            records: Vec::new(),
            dead_letters: Vec::new(),
            audit,
            new_ids: Vec::new(),
            marks: changelog::encode_mark(MarkKind::Forgotten, at_ms, &keys)
                .into_iter()
                .collect(),
            other_marks: Vec::new(),
            positions: Vec::new(),
            dead_letter_positions: Vec::new(),
        });
        let committed = self
            .publish(&outgoing, NO_INPUT_OFFSET)
            .await?
            .map_err(|refused| self.refused(&refused))?;
        fail::fail_point!("forget-after-commit", |_| {
            eprintln!("failpoint forget-after-commit: exiting");
            std::process::exit(86)
        });
        let offset = committed
            .changelog_offset
            .ok_or(PipelineError::ForgetUnconfirmed { partition: p })?;
        self.next_changelog_offset = offset + 1;
        let mark = Mark {
            partition: p,
            kind: MarkKind::Forgotten,
            changelog_offset: offset,
            at_ms,
        };
        self.ledger
            .forget(p, keys.iter().map(|k| (*k, mark)).collect())
            .await?;
        let held_by_worker = ids.iter().filter(|i| i.held_by_worker).count();
        IdsForgotten {
            partition: p,
            counter: &self.metrics.forgotten,
            ids: ids.len(),
            held_by_worker,
            by,
            changelog_offset: offset,
        }
        .emit();
        Ok(ForgetReport {
            partition: p,
            ids: ids.len(),
            held_by_worker,
            changelog_offset: offset,
        })
    }
}

/// A transaction that commits no input offset (see `dedupe::output::Batch::next_input_offset`).
const NO_INPUT_OFFSET: i64 = -1;

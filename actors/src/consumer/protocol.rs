//! One batch, in the order the guarantee needs: look its ids up in the ledger, decide each
//! record's fate, publish the new records with the next input offset in one output transaction,
//! then record the new ids with the progress that follows the batch (see the module above for why
//! this order). Written against the seams (`seams.rs`), so `tests.rs` runs it over the core's
//! doubles.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedupe::audit::Admission;
use dedupe::batch::{self, Candidate, Fate, Rules, Seen, SourceMode, Verdict};
use dedupe::clock::now_ms;
use dedupe::config::{ReusedIdPolicy, UnkeyedPolicy};
use dedupe::identity::LedgerKey;
use dedupe::ledger::{Held, Mark};
use dedupe::output::{OutRecord, PublishError, RefusedRecord};
use dedupe::progress::Progress;
use dedupe::retry::Backoff;
use dedupe::store::Looked;
use dedupe::wire::HEADER_DUPLICATE;

use super::refusal::{first_refused, Isolation, Processed, Refusal};
use super::seams::{SinkAccess, StoreAccess};
use super::tally::Tally;
use super::{Decided, InRecord, NewId, Pipeline, PipelineError};
use crate::events::partition::{source_header, ReusedAction};
use crate::events::{PublishedTwice, TransactionFailed, TransactionRetried};
use crate::producer::Outgoing;

/// How often, and after how long, a batch whose output transaction was aborted is sent again
/// (nothing of an aborted transaction is visible): 0.2, 0.4, 0.8, 1.6 and 3.2 s.
pub(super) const ABORTED_BATCH_RETRIES_ALLOWED: u32 = 5;
const ABORTED_BATCH_RETRIES: Backoff = Backoff::new(
    Duration::from_millis(200),
    Duration::from_millis(3200),
    ABORTED_BATCH_RETRIES_ALLOWED,
);

impl<S: StoreAccess, K: SinkAccess> Pipeline<S, K> {
    /// Records of the partition, in order: each batch is looked up, decided, published with the
    /// next input offset in one transaction, then its new ids recorded with the progress that
    /// follows it. A record the output refuses for good never costs more than its partition:
    /// the records before it are committed on their own, it is tried alone, then dead-lettered
    /// (with its value, then without) when `worker.dead_letter_topic` is set, and the partition
    /// stops at it otherwise ([`Processed::StoppedAt`]).
    pub(super) async fn process(
        &mut self,
        batch: Vec<InRecord>,
    ) -> Result<Processed, PipelineError> {
        let n = batch.len();
        self.metrics.records_in.increment(n as u64);
        self.metrics.batch_records.record(n as f64);
        self.count_misrouted(&batch);
        self.settle(batch).await
    }

    /// [`Pipeline::process`] of records already counted as read (a stalled record tried again).
    pub(super) async fn settle(
        &mut self,
        mut pending: Vec<InRecord>,
    ) -> Result<Processed, PipelineError> {
        let mut end = pending.len();
        let mut isolation = Isolation::AsItIs;
        loop {
            let refusal = match self.attempt(pending[..end].to_vec(), isolation).await? {
                Some(refusal) => refusal,
                None => {
                    pending.drain(..end);
                    if pending.is_empty() {
                        return Ok(Processed::Through);
                    }
                    end = pending.len();
                    isolation = Isolation::AsItIs;
                    continue;
                }
            };
            isolation = match (refusal.position, end, isolation) {
                // Commit what comes before the first record refused.
                (p, _, _) if p > 0 => {
                    end = p;
                    Isolation::AsItIs
                }
                // The first record alone: refused with others, it may only have shared their
                // request.
                (_, e, _) if e > 1 => {
                    end = 1;
                    Isolation::AsItIs
                }
                (_, _, Isolation::AsItIs) if self.settings.dead_letter_topic.is_some() => {
                    Isolation::DeadLetter(refusal.code)
                }
                (_, _, Isolation::DeadLetter(code)) => Isolation::DeadLetterWithoutValue(code),
                _ => {
                    return Ok(Processed::StoppedAt {
                        rest: pending,
                        code: refusal.code,
                        refused_by: refusal.refused_by,
                    })
                }
            };
        }
    }

    /// One transaction of `batch`: look its ids up, decide, publish the new records with the
    /// next input offset, then record the new ids with the progress that follows it. `None`
    /// when it went through; the first record refused when the output refused some.
    async fn attempt(
        &mut self,
        batch: Vec<InRecord>,
        isolation: Isolation,
    ) -> Result<Option<Refusal>, PipelineError> {
        let n = batch.len();
        let next_input_offset = batch[n - 1].offset + 1;
        let started = Instant::now();
        let looked = self.look_up(&batch).await?;
        let looked_up = started.elapsed();
        let dead_lettered = Self::dead_lettered(&batch, isolation);
        let mut decided = self.decide(batch, &looked.held, isolation);
        let resent = self.resent(&mut decided, &looked.forgotten);
        let refreshes = std::mem::take(&mut decided.refreshes);
        let tally = std::mem::take(&mut decided.tally);
        let (new_ids, committed) = match self.publish_decided(decided, next_input_offset).await? {
            Ok(through) => through,
            Err(refusal) => return Ok(Some(refusal)),
        };
        self.count(tally);
        if let Some(dead_lettered) = dead_lettered {
            self.report_dead_lettered(dead_lettered);
        }
        let published = started.elapsed();
        fail::fail_point!("worker-after-publish", |_| {
            eprintln!("failpoint worker-after-publish: exiting");
            std::process::exit(86)
        });
        let marks = resent.marks(committed.changelog_offset);
        let resent_ids = marks.len() as u64;
        self.record(new_ids, &refreshes, next_input_offset, marks)
            .await?;
        if resent_ids > 0 {
            self.metrics.resent.increment(resent_ids);
        }
        fail::fail_point!("worker-after-record", |_| {
            eprintln!("failpoint worker-after-record: exiting");
            std::process::exit(86)
        });
        if let Some(live_since) = self.live_since.take() {
            let ms = |d: Duration| d.as_millis() as u64;
            tracing::info!(
                partition = self.partition,
                records = n,
                waited_ms = ms(started.duration_since(live_since)),
                lookup_ms = ms(looked_up),
                publish_ms = ms(published - looked_up),
                record_ms = ms(started.elapsed() - published),
                "The partition's first batch is through."
            );
        }
        Ok(None)
    }

    /// Step 1: looks the batch's ids up in the ledger: what it holds of each keyed record's id (its
    /// first-seen time and digest), if anything.
    pub(super) async fn look_up(&self, batch: &[InRecord]) -> Result<Looked, PipelineError> {
        let p = self.partition;
        let t = Instant::now();
        let keys: Vec<LedgerKey> = batch.iter().filter_map(|r| r.id.ok()).collect();
        let found = if keys.is_empty() {
            Looked::default()
        } else {
            self.ledger.look_up(p, keys).await?
        };
        self.metrics
            .lookup_seconds
            .record(t.elapsed().as_secs_f64());
        Ok(found)
    }

    /// Step 2: decides, in input order: new ids are published once, repeats are dropped, records
    /// without an id follow the unkeyed policy. A record the output refused alone goes to the
    /// dead-letter topic instead, as `isolation` says. What it counts is in the tally, counted
    /// once its transaction commits.
    pub(super) fn decide(
        &mut self,
        batch: Vec<InRecord>,
        found: &[Option<Held>],
        isolation: Isolation,
    ) -> Decided {
        let candidates = self.candidates(&batch);
        let rules = Rules {
            unkeyed: self.settings.unkeyed_policy,
            reused_id: self.settings.reused_id,
            now_ms: now_ms(),
            limit_ms: self.settings.retention_limit_ms,
            refresh: self.settings.refresh_on_duplicate,
        };
        let decision = batch::decide(&candidates, found, rules);
        let mut tally = Tally::default();
        tally.add(&self.metrics.refreshed, decision.refreshes.len() as u64);
        let mut outgoing = Outgoing {
            records: Vec::with_capacity(batch.len()),
            dead_letters: Vec::new(),
            audit: Vec::new(),
            new_ids: decision.new_ids,
            marks: Vec::new(),
            other_marks: Vec::new(),
            positions: Vec::with_capacity(batch.len()),
            dead_letter_positions: Vec::new(),
        };
        let now = Instant::now();
        for (i, (r, fate)) in batch.into_iter().zip(&decision.fates).enumerate() {
            if i == 0 && isolation != Isolation::AsItIs && fate.reaches_output_or_dead_letter() {
                self.refused_to_dead_letter(r, isolation, &mut outgoing);
                continue;
            }
            let (records, dead_letters) = (outgoing.records.len(), outgoing.dead_letters.len());
            self.route(r, fate, now, &mut outgoing, &mut tally);
            outgoing
                .positions
                .resize(outgoing.records.len().max(records), i);
            outgoing
                .dead_letter_positions
                .resize(outgoing.dead_letters.len().max(dead_letters), i);
        }
        Decided {
            outgoing,
            refreshes: decision.refreshes,
            oldest_new_ms: decision.oldest_new_ms,
            tally,
        }
    }

    /// The batch as the decision reads it: each record's id, time, digest and its source's mode.
    fn candidates(&self, batch: &[InRecord]) -> Vec<Candidate> {
        let modes = self
            .settings
            .source_modes
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        batch
            .iter()
            .map(|r| Candidate {
                id: r.id,
                timestamp_ms: r.out.timestamp_ms,
                digest: r.digest,
                mode: modes.of(source_header(&r.out).flatten()),
            })
            .collect()
    }

    /// Puts one record where its fate sends it (the output, the dead letters, nowhere but the
    /// audit), counted in `tally`.
    fn route(
        &mut self,
        mut r: InRecord,
        fate: &Fate,
        now: Instant,
        outgoing: &mut Outgoing,
        tally: &mut Tally,
    ) {
        if fate.reaches_output() {
            // Only the worker's own flag, added below, says on the output that a copy is a
            // duplicate.
            let renamed = batch::rename_input_duplicate_headers(&mut r.out.headers);
            tally.add(&self.metrics.input_duplicate_headers, renamed as u64);
        }
        let m = &self.metrics;
        match *fate {
            Fate::Publish => {
                tally.one(&m.of_source(source_header(&r.out)).published);
                outgoing.records.push(r.out);
            }
            Fate::Duplicate(seen) => self.drop_duplicate(&r, seen, now, &mut outgoing.audit, tally),
            Fate::Reused(_, ReusedIdPolicy::DeadLetter) => {
                tally.one(m.reused(ReusedAction::DeadLettered));
                tally.one(&m.of_source(source_header(&r.out)).reused);
                outgoing.dead_letters.push(r.out);
            }
            Fate::Reused(..) => {
                tally.one(m.reused(ReusedAction::Published));
                let counters = m.of_source(source_header(&r.out));
                tally.one(&counters.published);
                tally.one(&counters.reused);
                outgoing.records.push(r.out);
            }
            Fate::Passed(seen, mode) => {
                let counters = m.of_source(source_header(&r.out));
                let mut out = r.out;
                if mode == SourceMode::Flag {
                    tally.one(&counters.flagged);
                    out.headers.push((
                        HEADER_DUPLICATE.to_string(),
                        Some(seen.verdict.as_str().as_bytes().to_vec()),
                    ));
                } else {
                    tally.one(&counters.passed);
                }
                outgoing.records.push(out);
            }
            Fate::Forward(reason) => {
                tally.unkeyed(reason, UnkeyedPolicy::Forward);
                outgoing.records.push(r.out);
            }
            Fate::DeadLetter(reason) => {
                tally.unkeyed(reason, UnkeyedPolicy::DeadLetter);
                outgoing.dead_letters.push(r.out);
            }
            Fate::Drop(reason) => tally.unkeyed(reason, UnkeyedPolicy::Drop),
        }
    }

    /// Counts a dropped duplicate in `tally`, and audits it if the sampler admits it.
    fn drop_duplicate(
        &mut self,
        r: &InRecord,
        seen: Seen,
        now: Instant,
        audit: &mut Vec<OutRecord>,
        tally: &mut Tally,
    ) {
        let source = source_header(&r.out);
        let m = &self.metrics;
        tally.one(&m.of_source(source).duplicate);
        tally.duplicate_age(seen.age_ms as f64 / 1000.0);
        tally.one(m.dropped(seen.verdict));
        if seen.verdict == Verdict::ReusedId {
            tally.one(m.reused(ReusedAction::Dropped));
            tally.one(&m.of_source(source).reused);
        }
        if let (Some(sampler), Ok(key)) = (self.sampler.as_mut(), r.id) {
            match sampler.admit(&key, now) {
                Admission::Audited => {
                    let source = source.flatten().and_then(|v| std::str::from_utf8(v).ok());
                    audit.push(self.audit_record(r, key, source, seen));
                }
                Admission::SampledOut => tally.one(&self.metrics.audit_sampled_out),
                Admission::OverCap => tally.one(&self.metrics.audit_over_cap),
            }
        }
    }

    /// Step 3: publishes the new records and the input offset in one transaction; returns the new
    /// ids, to record, and what the transaction committed.
    async fn publish_decided(
        &mut self,
        decided: Decided,
        next_input_offset: i64,
    ) -> Result<Result<(Vec<NewId>, dedupe::output::Committed), Refusal>, PipelineError> {
        let t = Instant::now();
        let out_count = decided.outgoing.records.len() as u64;
        let audited = decided.outgoing.audit.len() as u64;
        let outgoing = Arc::new(decided.outgoing);
        let committed = match self.publish(&outgoing, next_input_offset).await? {
            Ok(committed) => committed,
            Err(refused) => return Ok(Err(first_refused(&outgoing, &refused))),
        };
        self.metrics
            .publish_seconds
            .record(t.elapsed().as_secs_f64());
        self.metrics.committed.increment(1);
        self.metrics.records_out.increment(out_count);
        if audited > 0 {
            self.metrics.audit_written.increment(audited);
        }
        if let Some(last) = committed.last_output_offset {
            self.next_output_offset = last + 1;
        }
        if let Some(at) = committed.changelog_offset {
            self.next_changelog_offset = at + 1;
            self.metrics.changelog_records.increment(1);
        }
        if let Some(oldest) = decided.oldest_new_ms {
            self.metrics
                .end_to_end
                .record(((now_ms() - oldest).max(0) as f64) / 1000.0);
        }
        // The publisher let go of the batch when it answered; a copy only if it still holds it.
        let new_ids =
            Arc::try_unwrap(outgoing).map_or_else(|shared| shared.new_ids.clone(), |o| o.new_ids);
        Ok(Ok((new_ids, committed)))
    }

    /// Step 4: records the new ids with the progress that follows this batch. The ledger judges
    /// them again as it records them (by the same rules: a refresh only forward in time, a copy
    /// past the retention limit as a new sighting); an id published as new that it finds held
    /// was published by another of the worker's partitions meanwhile, and is counted.
    pub(super) async fn record(
        &mut self,
        new_ids: Vec<NewId>,
        refreshes: &[usize],
        next_input_offset: i64,
        marks: Vec<(LedgerKey, Mark)>,
    ) -> Result<(), PipelineError> {
        let p = self.partition;
        let t = Instant::now();
        let progress = Progress {
            next_input_offset,
            next_output_offset: self.next_output_offset,
            next_changelog_offset: self.next_changelog_offset,
        };
        let verdicts = self.ledger.record(p, new_ids, progress, marks).await?;
        self.metrics
            .record_seconds
            .record(t.elapsed().as_secs_f64());
        let twice = batch::published_twice(refreshes, &verdicts);
        if twice > 0 {
            self.count_published_twice(twice);
        }
        Ok(())
    }

    /// Counts ids published twice, and warns at most once a minute per partition.
    fn count_published_twice(&mut self, ids: usize) {
        self.twice_since_warned += ids as u64;
        let warn = self
            .twice_warned_at
            .is_none_or(|t| t.elapsed() > Duration::from_secs(60));
        let since = warn.then_some(self.twice_since_warned);
        if warn {
            self.twice_warned_at = Some(Instant::now());
            self.twice_since_warned = 0;
        }
        PublishedTwice {
            partition: self.partition,
            counter: &self.metrics.published_twice,
            ids,
            warn: since,
        }
        .emit();
    }

    /// Publishes, retrying aborted transactions a few times (nothing of an aborted one is
    /// visible). Every attempt sends the same shared batch: nothing is copied.
    pub(super) async fn publish(
        &self,
        outgoing: &Arc<Outgoing>,
        next_input_offset: i64,
    ) -> Result<Result<dedupe::output::Committed, Vec<RefusedRecord>>, PipelineError> {
        let p = self.partition;
        let mut backoff = ABORTED_BATCH_RETRIES;
        loop {
            let result = self
                .publisher
                .publish(p, Arc::clone(outgoing), next_input_offset)
                .await?;
            match result {
                Ok(c) => return Ok(Ok(c)),
                Err(PublishError::Refused { refused, .. }) => return Ok(Err(refused)),
                Err(PublishError::Aborted { source })
                    if backoff.retries() < ABORTED_BATCH_RETRIES_ALLOWED =>
                {
                    let delay = backoff.next_delay().unwrap_or_default();
                    TransactionRetried {
                        partition: p,
                        attempt: backoff.retries(),
                        error: &source,
                    }
                    .emit();
                    tokio::time::sleep(delay).await;
                }
                Err(source) => {
                    TransactionFailed {
                        fenced: source.is_fenced(),
                    }
                    .emit();
                    return Err(PipelineError::Publish {
                        partition: p,
                        source,
                    });
                }
            }
        }
    }
}

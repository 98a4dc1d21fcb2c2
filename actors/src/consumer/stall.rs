//! A partition stopped at a record its output refuses for good, with no dead-letter topic to
//! take it (`refusal.rs`, [`Processed::StoppedAt`]): nothing after the record is published, and
//! nothing is dropped. The record is tried again, alone, after a backoff (1 s, doubling up to
//! 30 s), so raising the output's limit heals the partition without a restart; the records read
//! after it follow once it is through. While it waits the partition still serves forgets and
//! stops when told to; the other partitions publish throughout. The stall is shown by
//! `dedupe_partition_stalled` and by the input lag counted from the record.

use std::time::{Duration, Instant};

use rdkafka::types::RDKafkaErrorCode;
use tokio::sync::{mpsc, watch};

use dedupe::output::RefusedIn;
use dedupe::retry::Backoff;

use super::refusal::Processed;
use super::seams::{SinkAccess, StoreAccess};
use super::{ForgetRequest, InRecord, Pipeline, PipelineError};
use crate::events::partition::{PartitionHealed, PartitionStalled, StallEnded};

/// How often a stalled record is tried again: after 1 s, doubling up to 30 s, for as long as it
/// takes.
const STALL_RETRIES: Backoff =
    Backoff::new(Duration::from_secs(1), Duration::from_secs(30), u32::MAX);

/// How often a stall is logged again while it lasts (the gauge says it all along).
const STALL_LOG_EVERY: Duration = Duration::from_secs(300);

/// A stalled partition: the records from the refused one on, and why.
pub(super) struct Stall {
    rest: Vec<InRecord>,
    code: RDKafkaErrorCode,
    refused_by: RefusedIn,
    since: Instant,
    logged_at: Option<Instant>,
    backoff: Backoff,
}

impl Stall {
    pub(super) fn new(rest: Vec<InRecord>, code: RDKafkaErrorCode, refused_by: RefusedIn) -> Self {
        Self {
            rest,
            code,
            refused_by,
            since: Instant::now(),
            logged_at: None,
            backoff: STALL_RETRIES,
        }
    }
}

impl<S: StoreAccess, K: SinkAccess> Pipeline<S, K> {
    /// Waits out a stall: tries its record again after each backoff step until it is through,
    /// then the records after it. True when told to stop meanwhile. However it ends, the
    /// partition is no longer shown stalled by this worker unless it is.
    pub(super) async fn wait_out(
        &mut self,
        stall: Stall,
        stop: &mut watch::Receiver<bool>,
        forgets: &mut mpsc::UnboundedReceiver<ForgetRequest>,
    ) -> Result<bool, PipelineError> {
        let result = self.retry_stalled(stall, stop, forgets).await;
        if !matches!(result, Ok(false)) {
            self.settings.board.set_stalled(self.partition, None);
            StallEnded {
                partition: self.partition,
            }
            .emit();
        }
        result
    }

    async fn retry_stalled(
        &mut self,
        mut stall: Stall,
        stop: &mut watch::Receiver<bool>,
        forgets: &mut mpsc::UnboundedReceiver<ForgetRequest>,
    ) -> Result<bool, PipelineError> {
        loop {
            let retry_in = stall
                .backoff
                .next_delay()
                .unwrap_or(Duration::from_secs(30));
            self.report_stall(&mut stall, retry_in);
            let deadline = tokio::time::Instant::now() + retry_in;
            loop {
                if *stop.borrow() {
                    return Ok(true);
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => break,
                    Some(request) = forgets.recv() => self.forget(request).await?,
                    _ = stop.changed() => {}
                }
            }
            let refused = stall.rest[0].clone();
            let offset = refused.offset;
            match self.settle(vec![refused]).await? {
                Processed::StoppedAt {
                    code, refused_by, ..
                } => {
                    stall.code = code;
                    stall.refused_by = refused_by;
                    continue;
                }
                Processed::Through => {}
            }
            PartitionHealed {
                partition: self.partition,
                offset,
                stalled_for: stall.since.elapsed(),
            }
            .emit();
            self.settings.board.set_stalled(self.partition, None);
            let rest = stall.rest.split_off(1);
            if rest.is_empty() {
                return Ok(false);
            }
            match self.settle(rest).await? {
                Processed::Through => return Ok(false),
                Processed::StoppedAt {
                    rest,
                    code,
                    refused_by,
                } => stall = Stall::new(rest, code, refused_by),
            }
        }
    }

    /// Shows the stall (the gauge, the lag from its record) and logs it when it begins and every
    /// [`STALL_LOG_EVERY`] after.
    fn report_stall(&self, stall: &mut Stall, retry_in: Duration) {
        let r = &stall.rest[0];
        self.settings
            .board
            .set_stalled(self.partition, Some(r.offset));
        let log = stall
            .logged_at
            .is_none_or(|at| at.elapsed() >= STALL_LOG_EVERY);
        if log {
            stall.logged_at = Some(Instant::now());
        }
        let refused_by = match stall.refused_by {
            RefusedIn::Output => self.settings.output_topic.as_str(),
            RefusedIn::DeadLetter => self
                .settings
                .dead_letter_topic
                .as_deref()
                .unwrap_or_default(),
        };
        PartitionStalled {
            partition: self.partition,
            input_topic: &self.settings.input_topic,
            offset: r.offset,
            bytes: r.out.size(),
            code: stall.code,
            refused_by,
            retry_in,
            log,
        }
        .emit();
    }
}

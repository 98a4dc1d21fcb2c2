//! Taking one partition over again, in process, when its pipeline failed in a way a new producer
//! mends: a transaction that kept aborting, a fatal producer error, a client call that hung, or a
//! fence while the partition is still this worker's (the broker aborts a transaction that outlived
//! `transaction.timeout.ms` and bumps the producer's epoch, which reads exactly like a newer
//! owner). The other partitions go on publishing.
//!
//! A retake is a take-over like any other (see [`handover`](crate::actors::handover)): a new
//! producer with the partition's `transactional.id` fences the failed one (a call hung inside it
//! included) and aborts its open transaction, the ledger catches up from the changelog's tail, and
//! the input is rewound to the group's committed offset before it flows again. Nothing of the
//! failed pipeline's last batch is visible, so nothing is lost or published twice.
//!
//! Limits: a partition retaken more than [`MAX_RETAKES`] times in ten minutes, a second fence
//! within [`FENCE_MEMORY`] (another worker really writes the partition), or more than
//! [`MAX_ABANDONED`] hung calls still holding their threads end the worker as before, for the
//! orchestrator to restart or page.

use std::time::{Duration, Instant};

use actix::prelude::*;
use dedupe::metrics as m;
use dedupe::retry::Backoff;

use super::{exit, Coordinator, Stage};

/// Waits before a partition is taken over again: 0.1, 0.2, 0.4 ... up to 4 s for the retakes since
/// it was last live (while the brokers are down, each attempt also waits out its own client
/// timeouts, so the first retakes need little wait of their own).
const RETAKE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(4), 10);
/// Retakes of one partition within ten minutes before the worker gives up.
const MAX_RETAKES: usize = 10;
/// A fence after a retake that followed a fence, within this long, is another writer's.
const FENCE_MEMORY: Duration = Duration::from_secs(300);
/// In group mode, how long a fenced partition waits before it is taken over again: long enough
/// for the group to tell a worker that lost the partition (a frozen one, woken up) that it did.
const GROUP_FENCE_WAIT: Duration = Duration::from_secs(5);
/// Hung client calls left to their threads (and not returned since) before the worker exits
/// instead.
const MAX_ABANDONED: usize = 3;

/// Why a partition is taken over again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retake {
    /// Its pipeline failed (a retryable error).
    Failed,
    /// Its producer was fenced.
    Fenced,
    /// A transactional call of its producer hung past its timeout.
    Hung,
}

impl Coordinator {
    /// Stops what is left of partition `p`'s pipeline and, after a backoff, takes it over again.
    /// Returns false when the worker exits instead (see the module docs).
    pub(super) fn retake(&mut self, p: i32, why: Retake, ctx: &mut Context<Self>) -> bool {
        if why == Retake::Fenced && self.fenced_at.is_some_and(|t| t.elapsed() < FENCE_MEMORY) {
            tracing::error!(
                partition = p,
                "Fenced again soon after a fence: another worker writes this partition; exiting."
            );
            self.teardown();
            System::current().stop_with_code(exit::FENCED);
            return false;
        }
        if why == Retake::Hung {
            if let Some(epoch) = self
                .running
                .as_ref()
                .and_then(|r| r.owned.get(&p))
                .map(|o| o.epoch)
            {
                self.abandoned.insert(epoch);
            }
            if self.abandoned.len() > MAX_ABANDONED {
                tracing::error!(abandoned = self.abandoned.len(), "Too many hung client calls hold their threads; exiting so that a restart recovers.");
                self.teardown();
                System::current().stop_with_code(exit::STUCK);
                return false;
            }
        }
        let now = Instant::now();
        let history = self.retakes.entry(p).or_default();
        history.retain(|t| now.duration_since(*t) < Duration::from_secs(600));
        history.push(now);
        if history.len() > MAX_RETAKES {
            tracing::error!(partition = p, "The partition was taken over again more than {MAX_RETAKES} times in 10 minutes; exiting so the orchestrator restarts the worker.");
            self.teardown();
            System::current().stop_with_code(exit::FAILED);
            return false;
        }
        // The backoff grows with the retakes since the partition was last live, not with every
        // retake in ten minutes: faults minutes apart (a rolling restart, repeated node kills)
        // each cost their own recovery, not a growing wait.
        let streak = self.retake_streak.entry(p).or_default();
        *streak += 1;
        let mut delay = RETAKE_BACKOFF.delay(*streak);
        if why == Retake::Fenced {
            self.fenced_at = Some(now);
            if self.group_mode() {
                delay = delay.max(GROUP_FENCE_WAIT);
            }
        }
        self.stop_partition(p);
        metrics::counter!(m::PARTITION_RETAKES, m::LABEL_PARTITION => p.to_string(), m::LABEL_REASON => why.label()).increment(1);
        tracing::warn!(
            partition = p,
            reason = why.label(),
            delay_ms = delay.as_millis() as u64,
            "Taking the partition over again, in process."
        );
        self.publish_health();
        ctx.run_later(delay, move |act, ctx| {
            if act.shutting_down || !act.still_assigned(p) {
                return;
            }
            // Before the first static assignment, the partition joins it like the others.
            let rewind = act.running.as_ref().is_some_and(|r| r.assigned);
            act.take_over(vec![(p, None)], rewind, ctx);
        });
        true
    }

    /// Stops partition `p`'s pipeline, if one runs, and its input: it is no longer owned until
    /// it is taken over again.
    fn stop_partition(&mut self, p: i32) {
        let Some(running) = self.running.as_mut() else {
            return;
        };
        if let Some(owned) = running.owned.remove(&p) {
            match owned.stage {
                Stage::Live { stop, arbiter } => {
                    let _ = stop.send(true);
                    arbiter.stop();
                }
                Stage::Stopping { arbiter } => {
                    arbiter.stop();
                }
                Stage::Loading { .. } | Stage::Loaded { .. } => {}
            }
        }
        if running.assigned {
            if let Err(e) = running.membership.pause(&self.config.worker.input_topic, p) {
                tracing::warn!(partition = p, error = %e, "Could not pause the input partition; it is rewound when taken over again.");
            }
        }
    }

    /// Whether `p` is still this worker's to take over: in group mode, the group may have taken
    /// it away meanwhile.
    fn still_assigned(&self, p: i32) -> bool {
        let Some(running) = self.running.as_ref() else {
            return false;
        };
        if running.owned.contains_key(&p) {
            return false;
        }
        if !self.group_mode() {
            return true;
        }
        let topic = &self.config.worker.input_topic;
        rdkafka::consumer::Consumer::assignment(&*running.membership.consumer)
            .is_ok_and(|tpl| tpl.find_partition(topic, p).is_some())
    }
}

impl Retake {
    fn label(self) -> &'static str {
        match self {
            Retake::Failed => m::REASON_FAILED,
            Retake::Fenced => m::REASON_FENCED,
            Retake::Hung => m::REASON_HUNG,
        }
    }
}

/// A transactional call of partition `partition`'s producer hung past its timeout (see
/// `dedupe::watchdog`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CallHung {
    pub partition: i32,
}

impl Handler<CallHung> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: CallHung, ctx: &mut Self::Context) {
        let p = msg.partition;
        let live = self
            .running
            .as_ref()
            .and_then(|r| r.owned.get(&p))
            .is_some_and(|o| matches!(o.stage, Stage::Live { .. } | Stage::Stopping { .. }));
        if live && !self.shutting_down {
            self.retake(p, Retake::Hung, ctx);
        }
    }
}

impl Coordinator {
    /// Registers the watchdog's rescue: a hung call of a live partition's producer makes the
    /// partition be taken over again; a take-over's own `init_transactions` (whose thread holds
    /// the partition's turn) is left to the watchdog, which ends the worker.
    pub(super) fn rescue_hung_calls(&self, ctx: &Context<Self>) {
        let me = ctx.address();
        let output = self.config.worker.output_topic.clone();
        dedupe::watchdog::set_rescue(Box::new(move |call, owner| {
            if call == "init_transactions" {
                return false;
            }
            match dedupe::output::partition_of(&output, owner) {
                Some(partition) => me.try_send(CallHung { partition }).is_ok(),
                None => false,
            }
        }));
    }
}

//! Taking one partition over again, in process, when its pipeline failed in a way a new producer
//! mends: a transaction that kept aborting, a fatal producer error, a client call that hung, or a
//! fence while the partition is still this worker's (the broker aborts a transaction that outlived
//! `transaction.timeout.ms` and bumps the producer's epoch, which reads exactly like a newer
//! owner). The other partitions go on publishing.
//!
//! A retake is a take-over like any other (see [`handover`](crate::handover)): a new
//! producer with the partition's `transactional.id` fences the failed one (a call hung inside it
//! included) and aborts its open transaction, the ledger catches up from the changelog's tail, and
//! the input is rewound to the group's committed offset before it flows again. Nothing of the
//! failed pipeline's last batch is visible, so nothing is lost or published twice.
//!
//! Limits (decided by [`super::policy`], which has their unit tests): a partition
//! retaken more than [`MAX_RETAKES`] times in ten minutes, a second fence within
//! [`FENCE_MEMORY`] (another worker really writes the partition), or more than
//! [`MAX_ABANDONED`] hung calls still holding their threads end the worker, for the orchestrator
//! to restart or page.
//!
//! [`MAX_RETAKES`]: super::policy::MAX_RETAKES
//! [`FENCE_MEMORY`]: super::policy::FENCE_MEMORY
//! [`MAX_ABANDONED`]: super::policy::MAX_ABANDONED

use std::time::Instant;

use actix::prelude::*;

use super::policy::{GiveUp, Retake, RetakePolicy, Verdict};
use super::{exit, Coordinator, Stage};
use crate::events::coordinator::{PartitionRetaken, WorkerGivesUp};

impl GiveUp {
    /// The worker's exit code for it.
    pub(super) fn exit_code(self) -> i32 {
        match self {
            GiveUp::FencedAgain { .. } => exit::FENCED,
            GiveUp::TooManyHungCalls { .. } => exit::STUCK,
            GiveUp::TooManyRetakes { .. } | GiveUp::TooManyRestarts => exit::FAILED,
        }
    }
}

/// Asks the retake policy about partition `p`'s failure (see [`RetakePolicy::failed`]) and
/// reports its answer: the retake (`PartitionRetaken`) or the worker giving up (`WorkerGivesUp`).
pub(super) fn judge(
    policy: &mut RetakePolicy,
    p: i32,
    why: Retake,
    hung_epoch: Option<u64>,
    group_mode: bool,
    now: Instant,
) -> Verdict {
    let verdict = policy.failed(p, why, hung_epoch, group_mode, now);
    match verdict {
        Verdict::Retake(delay) => PartitionRetaken {
            partition: p,
            why,
            delay_ms: delay.as_millis() as u64,
        }
        .emit(),
        Verdict::Exit(give_up) => WorkerGivesUp { why: give_up }.emit(),
    }
    verdict
}

impl Coordinator {
    /// Stops what is left of partition `p`'s pipeline and, after a backoff, takes it over again.
    /// Returns false when the worker exits instead (see the module docs and [`super::policy`]).
    pub(super) fn retake(&mut self, p: i32, why: Retake, ctx: &mut Context<Self>) -> bool {
        let hung_epoch = self
            .running
            .as_ref()
            .and_then(|r| r.owned.get(&p))
            .map(|o| o.epoch)
            .filter(|_| why == Retake::Hung);
        let group_mode = self.group_mode();
        let verdict = judge(
            &mut self.retake_policy,
            p,
            why,
            hung_epoch,
            group_mode,
            Instant::now(),
        );
        let delay = match verdict {
            Verdict::Retake(delay) => delay,
            Verdict::Exit(why) => {
                self.exit_for(why);
                return false;
            }
        };
        self.stop_partition(p);
        self.publish_health();
        ctx.run_later(delay, move |act, ctx| {
            if act.shutting_down() || !act.still_assigned(p) {
                return;
            }
            // Before the first static assignment, the partition joins it like the others.
            let rewind = act.running.as_ref().is_some_and(|r| r.assigned);
            act.take_over(vec![(p, None)], rewind, ctx);
        });
        true
    }

    /// Ends the worker for `why`: counted, logged, everything stopped, the exit code set.
    pub(super) fn give_up(&mut self, why: GiveUp) {
        WorkerGivesUp { why }.emit();
        self.exit_for(why);
    }

    /// Ends the worker for `why`, already reported: everything stopped, the exit code set.
    fn exit_for(&mut self, why: GiveUp) {
        self.teardown();
        System::current().stop_with_code(why.exit_code());
    }

    /// Stops partition `p`'s pipeline, if one runs, and its input: it is no longer owned until
    /// it is taken over again.
    fn stop_partition(&mut self, p: i32) {
        let Some(running) = self.running.as_mut() else {
            return;
        };
        if let Some(owned) = running.owned.remove(&p) {
            match owned.stage {
                Stage::Live { stop, arbiter, .. } => {
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
                crate::events::coordinator::PauseFailed {
                    partition: p,
                    error: &e,
                }
                .emit();
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
        if live && !self.shutting_down() {
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

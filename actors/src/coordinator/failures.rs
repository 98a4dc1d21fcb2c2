//! How the coordinator answers the end of a partition pipeline and a failed input consumer: a
//! fenced producer or a state a restart would repeat ends the worker; other failures restart the
//! pipeline after a backoff.

use actix::prelude::*;

use super::policy::Retake;
use super::shutdown::Finish;
use super::{exit, Coordinator, Stage};
use crate::consumer::PartitionStopped;
use crate::events::{Fenced, InputConsumerFailed, PipelineFailed, PipelineFatal};
use crate::membership::ConsumerFailed;

impl Handler<ConsumerFailed> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: ConsumerFailed, ctx: &mut Self::Context) {
        InputConsumerFailed { error: &msg.error }.emit();
        if !self.shutting_down() {
            self.restart(ctx);
        }
    }
}

impl Handler<PartitionStopped> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: PartitionStopped, ctx: &mut Self::Context) {
        let p = msg.partition;
        // A pipeline left behind in a hung call has let go of its thread.
        self.retake_policy.ended(msg.epoch);
        let owner = self
            .running
            .as_ref()
            .and_then(|r| r.owned.get(&p))
            .filter(|o| o.epoch == msg.epoch);
        let stopping = owner.is_some_and(|o| matches!(o.stage, Stage::Stopping { .. }));
        let current = owner.is_some();
        match msg.result {
            // A pipeline an earlier take-over started, ending after a retake, a restart or a new
            // take-over replaced it (several partitions fail together when the brokers go away):
            // whatever its end, the partition, if owned, is another pipeline's now. Its producer
            // was fenced by that take-over's own, so "fenced" says nothing about this worker.
            Err(e) if !current => {
                tracing::info!(partition = p, error = %e, "A partition pipeline that was replaced ended with an error.");
            }
            Ok(()) if !current => tracing::info!(
                partition = p,
                "A partition pipeline that was replaced ended."
            ),
            Err(e) if stopping || self.shutting_down() => {
                tracing::warn!(partition = p, error = %e, "A stopping partition's last batch failed; the next owner re-reads it.");
            }
            Err(e) if e.is_fenced() => {
                Fenced {
                    partition: p,
                    error: &e,
                }
                .emit();
                if !self.retake(p, Retake::Fenced, ctx) {
                    return;
                }
            }
            Err(e) if !e.is_retryable() => {
                // A state a restart in process would only repeat (a corrupt or unreadable
                // ledger): exit for the orchestrator, which restarts the process or pages.
                PipelineFatal {
                    partition: p,
                    error: &e,
                }
                .emit();
                self.teardown();
                System::current().stop_with_code(exit::FAILED);
                return;
            }
            Err(e) => {
                PipelineFailed {
                    partition: p,
                    error: &e,
                }
                .emit();
                if !self.retake(p, Retake::Failed, ctx) {
                    return;
                }
            }
            Ok(()) => {}
        }
        if current {
            self.forget(p);
        }
        self.publish_health();
        if self.shutting_down() && self.running.as_ref().is_none_or(|r| r.owned.is_empty()) {
            ctx.notify(Finish);
        }
    }
}

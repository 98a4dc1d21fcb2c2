//! Stopping: finish the batches in flight, close the membership, flush the ledger, exit with the
//! code of the reason (see [`StopPolicy`](super::policy::StopPolicy)): 0 for a stop asked
//! for (SIGTERM, SIGINT), 3 when the group gave the partitions away.

use std::sync::atomic::Ordering;
use std::time::Duration;

use actix::prelude::*;

use super::policy::StopReason;
use super::{exit, Coordinator};
use crate::events::coordinator::FinalFlushFailed;
use crate::ledger::Flush;

/// Stop gracefully: finish the batches in flight, flush the ledger, exit 0.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Finish;

impl StopReason {
    /// The worker's exit code once it stopped for this reason (and flushed its ledger).
    pub(super) fn exit_code(self) -> i32 {
        match self {
            StopReason::Asked => exit::OK,
            StopReason::MembershipLost => exit::FENCED,
        }
    }
}

impl Handler<Shutdown> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Self::Context) {
        if self.stop.stop(StopReason::Asked) {
            crate::events::coordinator::ShutdownStarted.emit();
            self.stop_partitions(ctx);
        }
    }
}

impl Coordinator {
    /// Stops every partition after its batch in flight (one being taken over at once), then
    /// finishes: at once when none runs, else when the last one stopped (see `failures.rs`) or
    /// after `worker.shutdown_timeout_ms`. Called once, when [`StopPolicy::stop`] starts the stop.
    ///
    /// [`StopPolicy::stop`]: super::policy::StopPolicy::stop
    pub(super) fn stop_partitions(&mut self, ctx: &mut Context<Self>) {
        self.health.stopping.store(true, Ordering::Relaxed);
        let mut waiting = false;
        if let Some(running) = self.running.as_mut() {
            running.owned.retain(|_, owned| owned.stop());
            waiting = !running.owned.is_empty();
        }
        self.publish_health();
        if waiting {
            let timeout = Duration::from_millis(self.config.worker.shutdown_timeout_ms);
            ctx.run_later(timeout, |_, ctx| {
                crate::events::coordinator::ShutdownTimedOut.emit();
                ctx.notify(Finish);
            });
        } else {
            ctx.notify(Finish);
        }
    }
}

impl Handler<Finish> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: Finish, ctx: &mut Self::Context) {
        self.teardown();
        let code = self.stop.reason().unwrap_or(StopReason::Asked).exit_code();
        ctx.spawn(
            self.ledger
                .send(Flush)
                .into_actor(self)
                .map(move |res, _, _| match res {
                    Ok(Ok(())) => {
                        crate::events::coordinator::WorkerExiting { code }.emit();
                        System::current().stop_with_code(code)
                    }
                    Ok(Err(e)) => {
                        FinalFlushFailed { error: &e }.emit();
                        System::current().stop_with_code(exit::FAILED)
                    }
                    Err(e) => {
                        let gone = format!("the ledger actor is gone ({e})");
                        FinalFlushFailed { error: &gone }.emit();
                        System::current().stop_with_code(exit::FAILED)
                    }
                }),
        );
    }
}

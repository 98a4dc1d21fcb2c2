//! Graceful shutdown: finish the batches in flight, close the membership, flush the ledger.

use std::sync::atomic::Ordering;
use std::time::Duration;

use actix::prelude::*;

use super::{exit, Coordinator, Stage};
use crate::actors::events::coordinator::FinalFlushFailed;
use crate::actors::ledger::Flush;

/// Stop gracefully: finish the batches in flight, flush the ledger, exit 0.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Finish;

impl Handler<Shutdown> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Self::Context) {
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        self.health.stopping.store(true, Ordering::Relaxed);
        tracing::info!("Shutting down: finishing the batches in flight.");
        let mut waiting = false;
        if let Some(running) = self.running.as_mut() {
            running.owned.retain(|_, owned| {
                match std::mem::replace(&mut owned.stage, Stage::Loading { queue: None }) {
                    Stage::Live { stop, arbiter, .. } => {
                        let _ = stop.send(true);
                        owned.stage = Stage::Stopping { arbiter };
                        true
                    }
                    Stage::Stopping { arbiter } => {
                        owned.stage = Stage::Stopping { arbiter };
                        true
                    }
                    Stage::Loading { .. } | Stage::Loaded { .. } => false,
                }
            });
            waiting = !running.owned.is_empty();
        }
        if waiting {
            let timeout = Duration::from_millis(self.config.worker.shutdown_timeout_ms);
            ctx.run_later(timeout, |_, ctx| {
                tracing::warn!("Shutdown timed out; exiting with batches in flight (their transactions are aborted when the next worker starts).");
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
        ctx.spawn(
            self.ledger
                .send(Flush)
                .into_actor(self)
                .map(|res, _, _| match res {
                    Ok(Ok(())) => {
                        tracing::info!("The ledger is flushed; exiting.");
                        System::current().stop_with_code(exit::OK)
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

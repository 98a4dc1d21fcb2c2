//! Ledger snapshots, taken by the [`Coordinator`] on a timer or on an operator's request: one at
//! a time, and at most one started per `snapshots.min_interval_secs`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use actix::prelude::*;
use dedupe::clock::now_ms;
use dedupe::config::SnapshotConfig;
use dedupe::snapshot::{prune, run_hook, SnapshotError, SnapshotSlot, Trigger};

use super::{Coordinator, TakeSnapshot};
use crate::events::coordinator::SnapshotTaken;
use crate::events::SnapshotFailed;
use crate::ledger::LedgerActor;

impl Handler<TakeSnapshot> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: TakeSnapshot, ctx: &mut Self::Context) {
        let snapshots = self.config.snapshots.clone();
        let Some(root) = snapshots.dir.clone() else {
            return answer(msg.reply, Err(SnapshotError::NotConfigured));
        };
        if self.snapshot_running {
            tracing::info!("A snapshot is already under way; this request is refused.");
            return answer(msg.reply, Err(SnapshotError::Busy));
        }
        if let Err(e) = self.snapshot_pace.try_start(Instant::now(), msg.trigger) {
            // Refused before anything is written: not a failure, and (a client may post in a
            // loop) logged at debug only.
            match msg.trigger {
                Trigger::Scheduled => tracing::debug!("A scheduled snapshot is skipped: {e}."),
                Trigger::Requested => tracing::debug!("A snapshot request is refused: {e}."),
            }
            return answer(msg.reply, Err(e));
        }
        self.snapshot_running = true;
        let ledger = self.ledger.clone();
        let limit_ms = self.config.ledger.options().max_window_ms;
        let fut = take(ledger, root, snapshots, limit_ms);
        ctx.spawn(fut.into_actor(self).map(|result, act, _| {
            act.snapshot_running = false;
            match &result {
                Ok(dir) => {
                    SnapshotTaken {
                        dir,
                        at_ms: now_ms(),
                    }
                    .emit();
                }
                Err(SnapshotError::Stopping) => {
                    tracing::info!("A ledger snapshot was abandoned: the worker is stopping.")
                }
                Err(error) => SnapshotFailed { error }.emit(),
            }
            answer(msg.reply, result);
        }));
    }
}

/// Answers the request, if someone waits for the answer.
fn answer(
    reply: Option<tokio::sync::oneshot::Sender<Result<PathBuf, SnapshotError>>>,
    result: Result<PathBuf, SnapshotError>,
) {
    if let Some(reply) = reply {
        let _ = reply.send(result);
    }
}

/// Takes one snapshot under `root`: a slot reserved, the ledger's checkpoint written into it and
/// published, then the old snapshots pruned and the hook run, off the actor's thread. The
/// snapshot's directory.
async fn take(
    ledger: Addr<LedgerActor>,
    root: PathBuf,
    snapshots: SnapshotConfig,
    limit_ms: Option<i64>,
) -> Result<PathBuf, SnapshotError> {
    let slot = SnapshotSlot::reserve(&root)?;
    let checkpoint = ledger
        .send(crate::ledger::Checkpoint {
            dir: slot.partial.clone(),
        })
        .await;
    let progress = match checkpoint {
        Ok(Ok(progress)) => progress,
        Ok(Err(source)) => {
            slot.discard();
            return Err(SnapshotError::Checkpoint {
                dir: slot.dir,
                source,
            });
        }
        Err(_mailbox) => {
            slot.discard();
            return Err(SnapshotError::Stopping);
        }
    };
    slot.publish()?;
    let partitions: Vec<i32> = progress.keys().copied().collect();
    let dir = slot.dir.clone();
    actix_rt::task::spawn_blocking(move || -> Result<(), SnapshotError> {
        prune(&root, snapshots.keep, now_ms(), limit_ms)?;
        if let Some(hook) = &snapshots.hook {
            let timeout = Duration::from_secs(snapshots.hook_timeout_secs);
            run_hook(hook, &dir, &partitions, &snapshots.hook_env, timeout)?;
        }
        Ok(())
    })
    .await
    .map_err(|_join| SnapshotError::Stopping)??;
    Ok(slot.dir)
}

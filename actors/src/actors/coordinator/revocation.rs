//! Partitions the group takes away: each stops after its batch in flight, its per-partition
//! gauges go blank, and the rebalance is released once all of them stopped.

use actix::prelude::*;
use dedupe::config::PartitionSet;

use super::{exit, Coordinator, Owned, Stage};
use crate::actors::events::coordinator::PartitionRevoked;
use crate::actors::events::PartitionsLost;
use crate::actors::membership::Revoking;

impl Coordinator {
    /// Removes a stopped partition and answers the revocations that waited for it.
    pub(super) fn forget(&mut self, p: i32) {
        let Some(running) = self.running.as_mut() else {
            return;
        };
        if let Some(Owned {
            stage: Stage::Stopping { arbiter } | Stage::Live { arbiter, .. },
            ..
        }) = running.owned.remove(&p)
        {
            arbiter.stop();
        }
        self.settle_revocations();
    }

    /// Answers the revocations whose partitions have all stopped; exits if one of them asked to.
    pub(super) fn settle_revocations(&mut self) {
        let Some(running) = self.running.as_mut() else {
            return;
        };
        let owned = &running.owned;
        running.revocations.retain(|(partitions, done)| {
            let waiting = partitions.iter().any(|p| owned.contains_key(p));
            if !waiting {
                let _ = done.send(());
            }
            waiting
        });
        if running.revocations.is_empty() {
            if let Some(code) = self.exit_when_revoked.take() {
                self.teardown();
                System::current().stop_with_code(code);
            }
        }
    }
}

impl Handler<Revoking> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Revoking, _ctx: &mut Self::Context) {
        let reason = PartitionRevoked::reason(msg.lost);
        tracing::info!(partitions = %PartitionSet(msg.partitions.clone()), reason, "The group takes partitions away; stopping them.");
        let Some(running) = self.running.as_mut() else {
            return;
        };
        for &p in &msg.partitions {
            PartitionRevoked {
                partition: p,
                lost: msg.lost,
            }
            .emit();
            let Some(owned) = running.owned.get_mut(&p) else {
                continue;
            };
            match std::mem::replace(&mut owned.stage, Stage::Loading { queue: None }) {
                Stage::Live { stop, arbiter, .. } => {
                    let _ = stop.send(true);
                    owned.stage = Stage::Stopping { arbiter };
                }
                Stage::Stopping { arbiter } => owned.stage = Stage::Stopping { arbiter },
                // Loading: the take-over's result is ignored when it arrives (its producer dropped).
                Stage::Loading { .. } | Stage::Loaded { .. } => {
                    running.owned.remove(&p);
                }
            }
        }
        if msg.lost {
            // Another member may already be publishing them: this worker's membership expired.
            PartitionsLost.emit();
            self.exit_when_revoked = Some(exit::FENCED);
        }
        running.revocations.push((msg.partitions, msg.done));
        // Answers at once when nothing was running.
        self.settle_revocations();
        self.publish_health();
    }
}

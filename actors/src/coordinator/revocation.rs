//! Partitions the group takes away: each stops after its batch in flight, its per-partition
//! gauges go blank, and the rebalance is released once all of them stopped. Partitions lost (the
//! group gave them away without this worker's consent) stop the worker: it exits with status 3
//! once they stopped (see `shutdown.rs`), taking no partition meanwhile.

use actix::prelude::*;

use super::{Coordinator, Owned, Stage};
use crate::events::coordinator::PartitionRevoked;
use crate::events::group::PartitionsTaken;
use crate::events::PartitionsLost;
use crate::membership::Revoking;

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

    /// Answers the revocations whose partitions have all stopped.
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
    }
}

impl Handler<Revoking> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Revoking, ctx: &mut Self::Context) {
        PartitionsTaken {
            partitions: &msg.partitions,
            lost: msg.lost,
        }
        .emit();
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
            // Loading: the take-over's result is ignored when it arrives (its producer dropped).
            if !owned.stop() {
                running.owned.remove(&p);
            }
        }
        let lost = msg.partitions.clone();
        running.revocations.push((msg.partitions, msg.done));
        // Answers at once when nothing was running.
        self.settle_revocations();
        self.publish_health();
        if msg.lost {
            // Another member may already be publishing them: this worker's membership expired.
            // It stops whatever else it runs and exits (see `StopPolicy`); the partitions the
            // group gives it meanwhile are not taken.
            let exiting = self.stop.revoked(true);
            PartitionsLost {
                partitions: &lost,
                exiting,
            }
            .emit();
            if exiting {
                self.stop_partitions(ctx);
            }
        }
    }
}

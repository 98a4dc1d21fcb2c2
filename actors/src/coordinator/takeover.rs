//! Taking partitions over (fence, load: see [`handover`](crate::handover)) as they are
//! assigned, and starting each one's publisher and consumer once it is loaded: in static mode all
//! together, in group mode each as it comes.

use std::sync::atomic::Ordering;
use std::time::Instant;

use actix::prelude::*;
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use super::policy::Retake;
use super::{Coordinator, Owned, Stage, StartError, StopOnDrop};
use crate::consumer::{PartitionConsumer, PartitionStopped};
use crate::events::coordinator::{PartitionAssigned, PartitionLive};
use crate::handover::{decode_progress, TakeOver, TakeOverError, TakenOver};
use crate::membership::{Assigned, Queue};
use crate::producer::Publisher;

/// A take-over finished.
#[derive(Message)]
#[rtype(result = "()")]
struct Loaded {
    partition: i32,
    epoch: u64,
    result: Result<TakenOver, TakeOverError>,
}

impl Coordinator {
    /// Starts taking each partition over, each on a blocking thread of its own; `retake` when
    /// they are taken over again after their pipeline failed (see `retake.rs`).
    pub(super) fn take_over(
        &mut self,
        partitions: Vec<(i32, Option<Queue>)>,
        retake: bool,
        ctx: &mut Context<Self>,
    ) {
        let Some(running) = self.running.as_mut() else {
            return;
        };
        let me = ctx.address();
        for (p, queue) in partitions {
            PartitionAssigned { partition: p }.emit();
            self.next_epoch += 1;
            let epoch = self.next_epoch;
            let stop = StopOnDrop::default();
            let flag = stop.flag();
            running.owned.insert(
                p,
                Owned {
                    stage: Stage::Loading { queue },
                    assigned_at: Instant::now(),
                    epoch,
                    retake,
                    stop,
                },
            );
            let turn = self.takeover_turns.entry(p).or_default().clone();
            let (config, ledger, consumer, me) = (
                self.config.clone(),
                self.store.clone(),
                running.membership.consumer.clone(),
                me.clone(),
            );
            let accept = self.options.accept_ledger_ahead;
            actix_rt::task::spawn_blocking(move || {
                // One take-over of a partition at a time: an earlier one, taken away while it
                // loaded, has stopped and let go of its producer before this one fences, so it
                // cannot fence this one's producer with its own.
                let _turn = turn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                let ready = |taken| {
                    me.do_send(Loaded {
                        partition: p,
                        epoch,
                        result: Ok(taken),
                    })
                };
                let result = ledger
                    .progress(p)
                    .map_err(|source| TakeOverError::ReadProgress { source })
                    .and_then(|bytes| decode_progress(bytes.as_deref(), p))
                    .and_then(|ledger_progress| {
                        let take = TakeOver {
                            config: &config,
                            consumer: &consumer,
                            ledger: &ledger,
                            partition: p,
                            ledger_progress,
                            accept_ledger_ahead: accept,
                            stop: &flag,
                        };
                        take.run(ready)
                    });
                if let Err(error) = result {
                    me.do_send(Loaded {
                        partition: p,
                        epoch,
                        result: Err(error),
                    });
                }
            });
        }
    }

    /// Starts the partition's publisher and consumer actor.
    fn go_live(
        &mut self,
        p: i32,
        taken: TakenOver,
        queue: Queue,
        report_to: Recipient<PartitionStopped>,
    ) {
        let Some(running) = self.running.as_mut() else {
            return;
        };
        let Some(owned) = running.owned.get_mut(&p) else {
            return;
        };
        let epoch = owned.epoch;
        let arbiter = Arbiter::new();
        let w = &self.config.worker;
        let publisher = Publisher::new(
            taken.writer,
            w.input_topic.clone(),
            p,
            running.membership.consumer.clone(),
        );
        let publisher = Publisher::start_in_arbiter(&arbiter.handle(), move |_| publisher);
        let (stop, stop_rx) = watch::channel(false);
        let (forgets, forgets_rx) = tokio::sync::mpsc::unbounded_channel();
        PartitionConsumer {
            partition: p,
            epoch,
            queue: Some(queue),
            ledger: self.ledger.clone(),
            publisher,
            settings: self.settings.clone(),
            progress: taken.report.progress,
            stop: stop_rx,
            forgets: Some(forgets_rx),
            report_to,
        }
        .start();
        let seconds = owned.assigned_at.elapsed().as_secs_f64();
        owned.stage = Stage::Live {
            stop,
            arbiter,
            forgets,
        };
        self.retake_policy.live(p);
        PartitionLive {
            partition: p,
            seconds,
        }
        .emit();
    }

    /// Static mode: once every partition is taken over, split their queues, assign them at their
    /// resume offsets, and start them.
    fn assign_static_when_loaded(
        &mut self,
        report_to: Recipient<PartitionStopped>,
    ) -> Result<(), StartError> {
        let Some(running) = self.running.as_mut() else {
            return Ok(());
        };
        if !running
            .owned
            .values()
            .all(|o| matches!(o.stage, Stage::Loaded { .. }))
        {
            return Ok(());
        }
        let topic = self.config.worker.input_topic.clone();
        let consumer = running.membership.consumer.clone();
        let mut tpl = TopicPartitionList::new();
        let mut ready = Vec::new();
        let partitions: Vec<i32> = running.owned.keys().copied().collect();
        for p in partitions {
            let Some(Owned {
                stage: Stage::Loaded { .. },
                ..
            }) = running.owned.get(&p)
            else {
                continue;
            };
            let queue = consumer
                .split_partition_queue(&topic, p)
                .ok_or(StartError::SplitQueue { partition: p })?;
            let Some(owned) = running.owned.get_mut(&p) else {
                continue;
            };
            let Stage::Loaded { taken } =
                std::mem::replace(&mut owned.stage, Stage::Loading { queue: None })
            else {
                continue;
            };
            let offset = taken
                .report
                .resume_input_at
                .map(Offset::Offset)
                .unwrap_or(Offset::Beginning);
            tpl.add_partition_offset(&topic, p, offset)
                .map_err(|source| StartError::Assign { source })?;
            ready.push((p, taken, queue));
        }
        consumer
            .assign(&tpl)
            .map_err(|source| StartError::Assign { source })?;
        running.assigned = true;
        for (p, taken, queue) in ready {
            self.go_live(p, *taken, queue, report_to.clone());
        }
        crate::events::coordinator::StaticPartitionsLive {
            partitions: &self.static_partitions,
        }
        .emit();
        Ok(())
    }
}

impl Handler<Assigned> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Assigned, ctx: &mut Self::Context) {
        if !self.stop.takes_assignments() {
            // Stopping (a signal, or the membership lost): the queues are dropped and the
            // partitions stay paused until the consumer leaves the group.
            return;
        }
        let partitions: Vec<i32> = msg.partitions.iter().map(|(p, _)| *p).collect();
        crate::events::group::PartitionsAssigned {
            partitions: &partitions,
        }
        .emit();
        self.take_over(
            msg.partitions
                .into_iter()
                .map(|(p, q)| (p, Some(q)))
                .collect(),
            false,
            ctx,
        );
        self.publish_health();
    }
}

impl Handler<Loaded> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Loaded, ctx: &mut Self::Context) {
        let p = msg.partition;
        let owned = self
            .running
            .as_ref()
            .and_then(|r| r.owned.get(&p))
            .filter(|o| o.epoch == msg.epoch && matches!(o.stage, Stage::Loading { .. }));
        let Some(retake) = owned.map(|o| o.retake) else {
            // Revoked (or torn down) while loading: the producer is dropped with the result.
            return;
        };
        let taken = match msg.result {
            Ok(taken) => taken,
            Err(source) if source.is_retryable() && !self.shutting_down() => {
                // The brokers or the coordinator were away: the partition is taken over again.
                crate::events::coordinator::TakeOverRetried {
                    partition: p,
                    error: &source,
                }
                .emit();
                self.retake(p, Retake::Failed, ctx);
                return;
            }
            Err(source) => {
                return self.fail_start(
                    &StartError::TakeOver {
                        partition: p,
                        source: Box::new(source),
                    },
                    ctx,
                )
            }
        };
        if retake || self.group_mode() {
            if let Err(e) = self.resume_taken(p, retake, taken, ctx) {
                return self.fail_start(&e, ctx);
            }
        } else {
            if let Some(owned) = self.running.as_mut().and_then(|r| r.owned.get_mut(&p)) {
                owned.stage = Stage::Loaded {
                    taken: Box::new(taken),
                };
            }
            if let Err(e) = self.assign_static_when_loaded(ctx.address().recipient()) {
                return self.fail_start(&e, ctx);
            }
        }
        // The window the partition has now, at once rather than at the next tick.
        self.export_stats(ctx);
    }
}

impl Coordinator {
    /// Lets a taken-over partition's input flow into its new pipeline: a partition the group
    /// assigned resumes where the group's committed offset is; one taken over again is first
    /// rewound there, past what its failed pipeline had fetched.
    fn resume_taken(
        &mut self,
        p: i32,
        retake: bool,
        taken: TakenOver,
        ctx: &mut Context<Self>,
    ) -> Result<(), StartError> {
        let topic = self.config.worker.input_topic.clone();
        let Some(running) = self.running.as_mut() else {
            return Ok(());
        };
        let Some(owned) = running.owned.get_mut(&p) else {
            return Ok(());
        };
        let Stage::Loading { queue } = &mut owned.stage else {
            return Ok(());
        };
        let queue = match queue.take() {
            Some(queue) => queue,
            None => running
                .membership
                .consumer
                .split_partition_queue(&topic, p)
                .ok_or(StartError::SplitQueue { partition: p })?,
        };
        if retake {
            running
                .membership
                .rewind(&topic, p, taken.report.resume_input_at)?;
        }
        running.membership.resume(&topic, p)?;
        if !retake {
            if let Some(at) = taken.report.resume_input_at {
                running.membership.wake_fetcher(&topic, p, at);
            }
        }
        self.go_live(p, taken, queue, ctx.address().recipient());
        Ok(())
    }
}

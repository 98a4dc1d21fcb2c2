//! How the coordinator answers the end of a partition pipeline and a failed input consumer: a
//! fenced producer or a state a restart would repeat ends the worker; other failures restart the
//! pipeline after a backoff.

use actix::prelude::*;

use super::policy::Retake;
use super::shutdown::Finish;
use super::{exit, Coordinator, Stage};
use crate::consumer::{PartitionStopped, PipelineError};
use crate::events::coordinator::{ReplacedPipelineEnded, StoppingBatchFailed};
use crate::events::{Fenced, InputConsumerFailed, PipelineFailed, PipelineFatal};
use crate::membership::ConsumerFailed;

impl Handler<ConsumerFailed> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: ConsumerFailed, ctx: &mut Self::Context) {
        InputConsumerFailed {
            error: &msg.error,
            fatal: &msg.fatal,
        }
        .emit();
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
        let stopping = stopping || self.shutting_down();
        match answer(p, current, stopping, &msg.result) {
            Answer::Nothing => {}
            Answer::Retake(why) => {
                if !self.retake(p, why, ctx) {
                    return;
                }
            }
            Answer::Exit => {
                self.teardown();
                System::current().stop_with_code(exit::FAILED);
                return;
            }
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

/// What the coordinator does about a partition pipeline's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    Nothing,
    /// Take the partition over again, in process (unless the retake policy says to give up).
    Retake(Retake),
    /// End the worker: a restart in process would only meet the same state again.
    Exit,
}

/// Reports partition `p`'s pipeline end (its event) and says what to do about it. `current`: the
/// pipeline is still the partition's (not replaced by a later take-over); `stopping`: it was told
/// to stop (revoked, or the worker stopping).
pub(super) fn answer(
    p: i32,
    current: bool,
    stopping: bool,
    result: &Result<(), PipelineError>,
) -> Answer {
    match result {
        // A pipeline an earlier take-over started, ending after a retake, a restart or a new
        // take-over replaced it (several partitions fail together when the brokers go away):
        // whatever its end, the partition, if owned, is another pipeline's now. Its producer
        // was fenced by that take-over's own, so "fenced" says nothing about this worker.
        Err(e) if !current => {
            ReplacedPipelineEnded {
                partition: p,
                error: Some(e),
            }
            .emit();
            Answer::Nothing
        }
        Ok(()) if !current => {
            ReplacedPipelineEnded {
                partition: p,
                error: None,
            }
            .emit();
            Answer::Nothing
        }
        Err(e) if stopping => {
            StoppingBatchFailed {
                partition: p,
                error: e,
            }
            .emit();
            Answer::Nothing
        }
        Err(e) if e.is_fenced() => {
            Fenced {
                partition: p,
                error: e,
            }
            .emit();
            Answer::Retake(Retake::Fenced)
        }
        Err(e) if !e.is_retryable() => {
            // A state a restart in process would only repeat (a corrupt or unreadable ledger):
            // exit for the orchestrator, which restarts the process or pages.
            PipelineFatal {
                partition: p,
                error: e,
            }
            .emit();
            Answer::Exit
        }
        Err(e) => {
            PipelineFailed {
                partition: p,
                error: e,
            }
            .emit();
            Answer::Retake(Retake::Failed)
        }
        Ok(()) => Answer::Nothing,
    }
}

#[cfg(test)]
mod tests {
    //! How the coordinator answers a pipeline's end, and what it reports: the events its
    //! instrumentation emits, recorded on the test's thread.

    use std::time::{Duration, Instant};

    use dedupe::ledger::LedgerError;
    use dedupe::metrics::recorder;
    use dedupe::output::PublishError;
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;
    use tracing::Level;

    use super::super::policy::{GiveUp, RetakePolicy, Verdict, MAX_RETAKES};
    use super::super::retake::judge;
    use super::*;

    fn fenced(partition: i32) -> Result<(), PipelineError> {
        Err(PipelineError::Publish {
            partition,
            source: PublishError::Fenced {
                transactional_id: "t".to_string(),
                source: KafkaError::MessageProduction(RDKafkaErrorCode::Fenced),
            },
        })
    }

    fn aborted(partition: i32) -> Result<(), PipelineError> {
        Err(PipelineError::Publish {
            partition,
            source: PublishError::Aborted {
                source: KafkaError::MessageProduction(RDKafkaErrorCode::OperationTimedOut),
            },
        })
    }

    fn corrupt(partition: i32) -> Result<(), PipelineError> {
        Err(PipelineError::Ledger {
            partition,
            source: LedgerError::NotALedger {
                path: "/data/ledger".into(),
                reason: "no format marker".to_string(),
            },
        })
    }

    #[test]
    fn a_fence_is_reported_and_retaken_once_and_a_second_fence_soon_after_gives_up() {
        let recording = recorder::record();
        let mut policy = RetakePolicy::default();
        let t0 = Instant::now();
        // The broker bumped the producer's epoch: the partition is taken over again.
        assert_eq!(
            answer(4, true, false, &fenced(4)),
            Answer::Retake(Retake::Fenced)
        );
        let verdict = judge(&mut policy, 4, Retake::Fenced, None, false, t0);
        assert!(matches!(verdict, Verdict::Retake(_)), "{verdict:?}");
        assert_eq!(recording.count_at("Fenced", Level::ERROR), 1);
        assert_eq!(recording.count_at("PartitionRetaken", Level::WARN), 1);
        assert_eq!(recording.count("WorkerGivesUp"), 0);
        // Fenced again a minute later: another worker writes the partition, so the worker exits.
        assert_eq!(
            answer(4, true, false, &fenced(4)),
            Answer::Retake(Retake::Fenced)
        );
        let verdict = judge(
            &mut policy,
            4,
            Retake::Fenced,
            None,
            false,
            t0 + Duration::from_secs(60),
        );
        assert_eq!(verdict, Verdict::Exit(GiveUp::FencedAgain { partition: 4 }));
        assert_eq!(recording.count("Fenced"), 2);
        assert_eq!(recording.count_at("WorkerGivesUp", Level::ERROR), 1);
        assert_eq!(recording.count("PartitionRetaken"), 1, "not retaken again");
    }

    #[test]
    fn a_failed_pipeline_is_retaken_until_too_many_retakes_give_up() {
        let recording = recorder::record();
        let mut policy = RetakePolicy::default();
        let t0 = Instant::now();
        for i in 0..MAX_RETAKES as u64 {
            assert_eq!(
                answer(2, true, false, &aborted(2)),
                Answer::Retake(Retake::Failed)
            );
            let now = t0 + Duration::from_secs(i);
            let verdict = judge(&mut policy, 2, Retake::Failed, None, false, now);
            assert!(matches!(verdict, Verdict::Retake(_)), "{verdict:?}");
        }
        assert_eq!(
            recording.count_at("PipelineFailed", Level::ERROR),
            MAX_RETAKES
        );
        assert_eq!(recording.count("PartitionRetaken"), MAX_RETAKES);
        // One more within ten minutes ends the worker.
        answer(2, true, false, &aborted(2));
        let verdict = judge(
            &mut policy,
            2,
            Retake::Failed,
            None,
            false,
            t0 + Duration::from_secs(20),
        );
        assert_eq!(
            verdict,
            Verdict::Exit(GiveUp::TooManyRetakes { partition: 2 })
        );
        assert_eq!(recording.count("WorkerGivesUp"), 1);
        assert_eq!(recording.count("PartitionRetaken"), MAX_RETAKES);
    }

    #[test]
    fn a_state_a_restart_would_repeat_ends_the_worker_without_a_retake() {
        let recording = recorder::record();
        assert_eq!(answer(0, true, false, &corrupt(0)), Answer::Exit);
        assert_eq!(recording.names(), ["PipelineFatal"]);
        assert_eq!(recording.count_at("PipelineFatal", Level::ERROR), 1);
    }

    #[test]
    fn the_end_of_a_stopping_or_replaced_pipeline_is_reported_and_not_acted_on() {
        let recording = recorder::record();
        // A pipeline a later take-over replaced: its end, even a fence, is not this worker's.
        assert_eq!(answer(1, false, false, &fenced(1)), Answer::Nothing);
        assert_eq!(answer(1, false, false, &Ok(())), Answer::Nothing);
        assert_eq!(recording.count_at("ReplacedPipelineEnded", Level::INFO), 2);
        // A revoked partition's last batch failed: the next owner reads it again.
        assert_eq!(answer(1, true, true, &fenced(1)), Answer::Nothing);
        assert_eq!(recording.count_at("StoppingBatchFailed", Level::WARN), 1);
        // A clean end reports nothing.
        assert_eq!(answer(1, true, false, &Ok(())), Answer::Nothing);
        assert_eq!(
            recording.names(),
            [
                "ReplacedPipelineEnded",
                "ReplacedPipelineEnded",
                "StoppingBatchFailed"
            ]
        );
        assert_eq!(recording.count("Fenced"), 0);
        assert_eq!(recording.count("PipelineFailed"), 0);
    }
}

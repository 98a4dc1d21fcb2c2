//! When a failed partition is taken over again and when the worker gives up instead: the retake
//! and exit rules of the coordinator (`coordinator/retake.rs`), as plain state machines over
//! `Instant`s; and when the worker stops and with which exit code ([`StopPolicy`]). They decide;
//! the coordinator acts (stops the partition, schedules the retake, emits the events, exits), so
//! the rules are unit-tested without a broker, an actor system or a clock.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use dedupe::retry::Backoff;

/// Waits before a partition is taken over again: 0.1, 0.2, 0.4 ... up to 4 s for the retakes since
/// it was last live (while the brokers are down, each attempt also waits out its own client
/// timeouts, so the first retakes need little wait of their own).
const RETAKE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(4), 10);
/// How far back retakes and pipeline restarts are counted.
pub const FAILURE_MEMORY: Duration = Duration::from_secs(600);
/// A fence after a retake that followed a fence, within this long, is another writer's.
pub const FENCE_MEMORY: Duration = Duration::from_secs(300);
/// In group mode, how long a fenced partition waits before it is taken over again: long enough
/// for the group to tell a worker that lost the partition (a frozen one, woken up) that it did.
pub const GROUP_FENCE_WAIT: Duration = Duration::from_secs(5);
/// Hung client calls left to their threads (and not returned since) before the worker exits
/// instead.
pub const MAX_ABANDONED: usize = 3;
/// Waits before the whole pipeline starts again: 2, 4, 8 ... up to 32 s.
const RESTART_BACKOFF: Backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(32), 5);

pub use crate::reasons::{GiveUp, Retake, MAX_RESTARTS, MAX_RETAKES};

/// What to do about a failed partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Take it over again after this wait.
    Retake(Duration),
    /// End the worker.
    Exit(GiveUp),
}

/// The retake rules' memory: fences, hung calls left behind, and each partition's retakes.
#[derive(Debug, Default)]
pub struct RetakePolicy {
    /// When a partition's producer was last fenced.
    fenced_at: Option<Instant>,
    /// The take-over epochs of pipelines left behind in a hung client call, until they end.
    abandoned: HashSet<u64>,
    /// Per partition, when it was taken over again.
    retakes: HashMap<i32, Vec<Instant>>,
    /// Per partition, its retakes since it last went live: the backoff before the next one.
    streak: HashMap<i32, u32>,
}

impl RetakePolicy {
    /// Partition `p` failed for `why` at `now`; `hung_epoch` is the take-over epoch of a pipeline
    /// left in a hung call. `group_mode`: the partition's owner is decided by a consumer group.
    pub fn failed(
        &mut self,
        p: i32,
        why: Retake,
        hung_epoch: Option<u64>,
        group_mode: bool,
        now: Instant,
    ) -> Verdict {
        if why == Retake::Fenced
            && self
                .fenced_at
                .is_some_and(|t| now.saturating_duration_since(t) < FENCE_MEMORY)
        {
            return Verdict::Exit(GiveUp::FencedAgain { partition: p });
        }
        if why == Retake::Hung {
            if let Some(epoch) = hung_epoch {
                self.abandoned.insert(epoch);
            }
            if self.abandoned.len() > MAX_ABANDONED {
                return Verdict::Exit(GiveUp::TooManyHungCalls {
                    abandoned: self.abandoned.len(),
                });
            }
        }
        let history = self.retakes.entry(p).or_default();
        history.retain(|t| now.saturating_duration_since(*t) < FAILURE_MEMORY);
        history.push(now);
        if history.len() > MAX_RETAKES {
            return Verdict::Exit(GiveUp::TooManyRetakes { partition: p });
        }
        // The backoff grows with the retakes since the partition was last live, not with every
        // retake in ten minutes: faults minutes apart (a rolling restart, repeated node kills)
        // each cost their own recovery, not a growing wait.
        let streak = self.streak.entry(p).or_default();
        *streak += 1;
        let mut delay = RETAKE_BACKOFF.delay(*streak);
        if why == Retake::Fenced {
            self.fenced_at = Some(now);
            if group_mode {
                delay = delay.max(GROUP_FENCE_WAIT);
            }
        }
        Verdict::Retake(delay)
    }

    /// Partition `p` is live again: its next retake starts from the shortest wait.
    pub fn live(&mut self, p: i32) {
        self.streak.remove(&p);
    }

    /// The pipeline of take-over `epoch` ended: if a hung call had held it, its thread is free.
    pub fn ended(&mut self, epoch: u64) {
        self.abandoned.remove(&epoch);
    }
}

/// The whole pipeline's restarts (a start that failed in a way another attempt may mend).
#[derive(Debug, Default)]
pub struct RestartPolicy {
    restarts: Vec<Instant>,
}

impl RestartPolicy {
    /// The pipeline failed at `now`: start it again after the returned wait, or give up.
    pub fn failed(&mut self, now: Instant) -> Verdict {
        self.restarts
            .retain(|t| now.saturating_duration_since(*t) < FAILURE_MEMORY);
        self.restarts.push(now);
        if self.restarts.len() > MAX_RESTARTS {
            return Verdict::Exit(GiveUp::TooManyRestarts);
        }
        Verdict::Retake(RESTART_BACKOFF.delay(self.restarts.len() as u32))
    }
}

/// Why the worker stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// SIGTERM or SIGINT: a clean stop, exit 0.
    Asked,
    /// The group gave this worker's partitions away without its consent (its membership expired
    /// while it was paused or cut off): another member may already publish them. The worker
    /// stops them and exits with status 3 for its orchestrator to start it again, as a fenced
    /// worker does; it takes no partition meanwhile.
    MembershipLost,
}

/// Whether the worker runs or stops, and why. The first reason to stop is the one it exits with:
/// a stop under way is never turned into another.
#[derive(Debug, Default)]
pub struct StopPolicy {
    stopping: Option<StopReason>,
}

impl StopPolicy {
    /// Stops the worker for `why`. True when this starts the stop (the caller stops the
    /// partitions); false when it was already stopping (for the reason it keeps).
    pub fn stop(&mut self, why: StopReason) -> bool {
        if self.stopping.is_some() {
            return false;
        }
        self.stopping = Some(why);
        true
    }

    /// The group took partitions away, `lost` when without the worker's consent. True when the
    /// worker must stop now; a revocation with consent is an ordinary rebalance.
    pub fn revoked(&mut self, lost: bool) -> bool {
        lost && self.stop(StopReason::MembershipLost)
    }

    /// Whether the worker is stopping.
    pub fn stopping(&self) -> bool {
        self.stopping.is_some()
    }

    /// Whether a partition the group assigns is taken over: not once the worker stops.
    pub fn takes_assignments(&self) -> bool {
        self.stopping.is_none()
    }

    /// Why the worker stops, if it does.
    pub fn reason(&self) -> Option<StopReason> {
        self.stopping
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn delay(v: Verdict) -> Duration {
        match v {
            Verdict::Retake(d) => d,
            Verdict::Exit(why) => panic!("gave up: {why:?}"),
        }
    }

    #[test]
    fn retakes_back_off_per_streak_and_start_over_once_live() {
        let mut policy = RetakePolicy::default();
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..4)
            .map(|i| delay(policy.failed(7, Retake::Failed, None, false, t0 + secs(i))))
            .collect();
        assert!(waits.windows(2).all(|w| w[0] < w[1]), "{waits:?}");
        assert_eq!(waits[0], Duration::from_millis(100));
        policy.live(7);
        assert_eq!(
            delay(policy.failed(7, Retake::Failed, None, false, t0 + secs(5))),
            waits[0]
        );
        // Another partition's streak is its own.
        assert_eq!(
            delay(policy.failed(8, Retake::Failed, None, false, t0 + secs(5))),
            waits[0]
        );
    }

    #[test]
    fn the_backoff_is_capped() {
        let mut policy = RetakePolicy::default();
        let t0 = Instant::now();
        let mut last = Duration::ZERO;
        for i in 0..MAX_RETAKES as u64 {
            last = delay(policy.failed(1, Retake::Failed, None, false, t0 + secs(i)));
        }
        assert_eq!(last, secs(4));
    }

    #[test]
    fn more_than_ten_retakes_in_ten_minutes_end_the_worker() {
        let mut policy = RetakePolicy::default();
        let t0 = Instant::now();
        for i in 0..MAX_RETAKES as u64 {
            delay(policy.failed(3, Retake::Failed, None, false, t0 + secs(i)));
        }
        assert_eq!(
            policy.failed(3, Retake::Failed, None, false, t0 + secs(20)),
            Verdict::Exit(GiveUp::TooManyRetakes { partition: 3 })
        );
    }

    #[test]
    fn retakes_older_than_ten_minutes_are_forgotten() {
        let mut policy = RetakePolicy::default();
        let t0 = Instant::now();
        for i in 0..MAX_RETAKES as u64 {
            delay(policy.failed(3, Retake::Failed, None, false, t0 + secs(i)));
        }
        // Eleven retakes, but the first ten are more than ten minutes old.
        let later = t0 + FAILURE_MEMORY + secs(MAX_RETAKES as u64);
        delay(policy.failed(3, Retake::Failed, None, false, later));
    }

    #[test]
    fn a_second_fence_within_its_memory_ends_the_worker_and_a_later_one_does_not() {
        let mut policy = RetakePolicy::default();
        let t0 = Instant::now();
        delay(policy.failed(2, Retake::Fenced, None, false, t0));
        assert_eq!(
            policy.failed(4, Retake::Fenced, None, false, t0 + secs(299)),
            Verdict::Exit(GiveUp::FencedAgain { partition: 4 })
        );

        let mut policy = RetakePolicy::default();
        delay(policy.failed(2, Retake::Fenced, None, false, t0));
        delay(policy.failed(2, Retake::Fenced, None, false, t0 + FENCE_MEMORY));
    }

    #[test]
    fn a_fence_in_group_mode_waits_for_the_group() {
        let mut policy = RetakePolicy::default();
        let t0 = Instant::now();
        assert_eq!(
            delay(policy.failed(0, Retake::Fenced, None, true, t0)),
            GROUP_FENCE_WAIT
        );
        let mut policy = RetakePolicy::default();
        assert!(delay(policy.failed(0, Retake::Fenced, None, false, t0)) < GROUP_FENCE_WAIT);
        // A failure that is not a fence does not wait for the group.
        let mut policy = RetakePolicy::default();
        assert!(delay(policy.failed(0, Retake::Failed, None, true, t0)) < GROUP_FENCE_WAIT);
    }

    #[test]
    fn hung_calls_end_the_worker_past_their_limit_until_their_threads_come_back() {
        let mut policy = RetakePolicy::default();
        let t0 = Instant::now();
        for epoch in 0..MAX_ABANDONED as u64 {
            delay(policy.failed(epoch as i32, Retake::Hung, Some(epoch), false, t0));
        }
        // The same epoch hanging again is not another thread held.
        delay(policy.failed(0, Retake::Hung, Some(0), false, t0 + secs(1)));
        let next = MAX_ABANDONED as u64;
        assert_eq!(
            policy.failed(5, Retake::Hung, Some(next), false, t0 + secs(2)),
            Verdict::Exit(GiveUp::TooManyHungCalls {
                abandoned: MAX_ABANDONED + 1
            })
        );

        let mut policy = RetakePolicy::default();
        for epoch in 0..MAX_ABANDONED as u64 {
            delay(policy.failed(epoch as i32, Retake::Hung, Some(epoch), false, t0));
        }
        policy.ended(0);
        delay(policy.failed(5, Retake::Hung, Some(next), false, t0 + secs(2)));
    }

    #[test]
    fn pipeline_restarts_back_off_and_give_up_past_five_in_ten_minutes() {
        let mut policy = RestartPolicy::default();
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..MAX_RESTARTS as u64)
            .map(|i| delay(policy.failed(t0 + secs(i))))
            .collect();
        assert_eq!(waits[0], secs(2));
        assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
        assert_eq!(
            policy.failed(t0 + secs(10)),
            Verdict::Exit(GiveUp::TooManyRestarts)
        );
        // Ten minutes later the old restarts no longer count.
        let mut policy = RestartPolicy::default();
        for i in 0..MAX_RESTARTS as u64 {
            delay(policy.failed(t0 + secs(i)));
        }
        delay(policy.failed(t0 + FAILURE_MEMORY + secs(MAX_RESTARTS as u64)));
    }

    #[test]
    fn a_lost_membership_stops_the_worker_for_that_reason_and_takes_nothing_more() {
        let mut policy = StopPolicy::default();
        // A revocation with consent is a rebalance: the worker runs on and takes new partitions.
        assert!(!policy.revoked(false));
        assert!(!policy.stopping());
        assert!(policy.takes_assignments());
        // Lost partitions stop the worker, which takes no partition the group gives it back.
        assert!(policy.revoked(true));
        assert_eq!(policy.reason(), Some(StopReason::MembershipLost));
        assert!(!policy.takes_assignments());
        // A second loss, and a SIGTERM during the stop, start nothing and keep its reason.
        assert!(!policy.revoked(true));
        assert!(!policy.stop(StopReason::Asked));
        assert_eq!(policy.reason(), Some(StopReason::MembershipLost));
    }

    #[test]
    fn a_stop_asked_for_stays_a_clean_stop_when_partitions_are_lost_during_it() {
        let mut policy = StopPolicy::default();
        assert!(policy.takes_assignments());
        assert!(policy.stop(StopReason::Asked));
        assert!(!policy.takes_assignments());
        // The group gives the partitions away while they finish: the stop stays the one asked for.
        assert!(!policy.revoked(true));
        assert_eq!(policy.reason(), Some(StopReason::Asked));
    }
}

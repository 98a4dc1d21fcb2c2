//! Why the coordinator acts: why a partition is taken over again ([`Retake`]) and why the worker
//! gives up ([`GiveUp`]). Plain words, below both the coordinator's policy, which decides them, and
//! the events, which report them.

/// Retakes of one partition within the coordinator's ten minutes of memory
/// (`coordinator::policy::FAILURE_MEMORY`) before the worker gives up.
pub const MAX_RETAKES: usize = 10;
/// Pipeline restarts within those ten minutes before the worker gives up.
pub const MAX_RESTARTS: usize = 5;

/// Why a partition is taken over again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retake {
    /// Its pipeline failed (a retryable error).
    Failed,
    /// Its producer was fenced.
    Fenced,
    /// A transactional call of its producer hung past its timeout.
    Hung,
}

/// Why the worker gives up and exits for the orchestrator to restart it or page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// Fenced again within `coordinator::policy::FENCE_MEMORY` of a fence: another worker writes the partition.
    FencedAgain { partition: i32 },
    /// More than `coordinator::policy::MAX_ABANDONED` hung client calls still hold their threads.
    TooManyHungCalls { abandoned: usize },
    /// The partition was taken over again more than [`MAX_RETAKES`] times in ten minutes.
    TooManyRetakes { partition: i32 },
    /// The pipeline failed more than [`MAX_RESTARTS`] times in ten minutes.
    TooManyRestarts,
}

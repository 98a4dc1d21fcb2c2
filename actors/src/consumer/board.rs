//! What the pipelines show the coordinator of their partitions, beside the metrics: the offset a
//! stalled partition stops at (its input lag counts from there), and whether a partition is
//! caught up: its pipeline waits on an empty queue and its last lag reading was 0. The retention
//! limit's expiry runs on the wall clock only while every owned partition is caught up, and on
//! the watermark of the others otherwise (`dedupe::ledger::Ledger::expire_behind`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

#[derive(Debug, Default)]
pub struct Board(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    stalled: BTreeMap<i32, i64>,
    idle: BTreeSet<i32>,
    lag_zero: BTreeSet<i32>,
}

impl Board {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Marks `partition` stalled at `offset`, or no longer.
    pub(super) fn set_stalled(&self, partition: i32, offset: Option<i64>) {
        let mut state = self.lock();
        match offset {
            Some(offset) => state.stalled.insert(partition, offset),
            None => state.stalled.remove(&partition),
        };
    }

    /// The offset `partition` stops at, if it is stalled.
    pub fn stalled_at(&self, partition: i32) -> Option<i64> {
        self.lock().stalled.get(&partition).copied()
    }

    /// Whether `partition`'s pipeline waits on an empty queue.
    pub(super) fn set_idle(&self, partition: i32, idle: bool) {
        let mut state = self.lock();
        if idle {
            state.idle.insert(partition);
        } else {
            state.idle.remove(&partition);
        }
    }

    /// The partition's last lag reading: `None` when it could not be read.
    pub fn set_lag(&self, partition: i32, records: Option<i64>) {
        let mut state = self.lock();
        if records == Some(0) {
            state.lag_zero.insert(partition);
        } else {
            state.lag_zero.remove(&partition);
        }
    }

    /// Whether `partition` has read all its input: its pipeline waits on an empty queue and its
    /// last lag reading was 0.
    pub fn caught_up(&self, partition: i32) -> bool {
        let state = self.lock();
        state.idle.contains(&partition) && state.lag_zero.contains(&partition)
    }

    /// Whether `partition`'s pipeline waits on an empty queue.
    pub fn idle(&self, partition: i32) -> bool {
        self.lock().idle.contains(&partition)
    }

    /// Forgets what a pipeline showed of `partition` (it ended).
    pub(super) fn clear(&self, partition: i32) {
        let mut state = self.lock();
        state.stalled.remove(&partition);
        state.idle.remove(&partition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_caught_up_only_idle_with_a_lag_of_zero() {
        let board = Board::default();
        assert!(!board.caught_up(0), "nothing known");
        board.set_idle(0, true);
        assert!(!board.caught_up(0), "idle, lag unknown");
        board.set_lag(0, Some(0));
        assert!(board.caught_up(0));
        // A lag that cannot be read (the brokers away) is no longer caught up.
        board.set_lag(0, None);
        assert!(!board.caught_up(0));
        board.set_lag(0, Some(0));
        board.set_idle(0, false);
        assert!(!board.caught_up(0), "reading records");
        board.set_idle(0, true);
        board.set_lag(0, Some(7));
        assert!(!board.caught_up(0), "records waiting");
        board.set_stalled(0, Some(5));
        assert_eq!(board.stalled_at(0), Some(5));
        board.clear(0);
        assert_eq!(board.stalled_at(0), None);
        assert!(!board.idle(0));
    }
}

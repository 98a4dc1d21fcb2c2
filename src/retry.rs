//! One backoff policy for the service's retry loops: exponential delays from a first one up to a
//! cap, for a bounded number of attempts. The output transaction's commit, a batch whose
//! transaction was aborted, and the coordinator's pipeline restarts all count and wait with it.

use std::time::Duration;

/// Exponential backoff over a bounded number of retries.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    retries_allowed: u32,
    retries: u32,
}

impl Backoff {
    /// `retries_allowed` retries, the first after `first`, each later one after twice the one
    /// before, never more than `max`.
    pub const fn new(first: Duration, max: Duration, retries_allowed: u32) -> Self {
        Self {
            first,
            max,
            retries_allowed,
            retries: 0,
        }
    }

    /// The delay before retry number `retry` (counting from 1).
    pub fn delay(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(20);
        self.first.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// Counts a failed attempt: the delay before the next one, or None once the retries are
    /// used up.
    pub fn next_delay(&mut self) -> Option<Duration> {
        if self.retries >= self.retries_allowed {
            return None;
        }
        self.retries += 1;
        Some(self.delay(self.retries))
    }

    /// Retries counted so far.
    pub fn retries(&self) -> u32 {
        self.retries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_retries_run_out() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(1), 5);
        let delays: Vec<_> = std::iter::from_fn(|| b.next_delay())
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(delays, [200, 400, 800, 1000, 1000]);
        assert_eq!(b.retries(), 5);
        assert_eq!(b.next_delay(), None, "no sixth retry");
    }

    #[test]
    fn immediate_retries_wait_nothing() {
        let mut b = Backoff::new(Duration::ZERO, Duration::ZERO, 2);
        assert_eq!(
            (b.next_delay(), b.next_delay(), b.next_delay()),
            (Some(Duration::ZERO), Some(Duration::ZERO), None)
        );
    }
}

//! The tracking API's rate limit: one token bucket per source (each write key stands for one
//! source), counted in events, with the time passed in so the rules are tested without a clock.
//!
//! Guarantee: over any span of `t` seconds a source gets at most `burst + rate * t` events
//! accepted; a refused request takes nothing from its bucket and is told how long until it would
//! pass. A request of more events than the burst is charged the whole burst (it waits for a full
//! bucket), so no request is refused forever.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A bucket's rule: `rate` events a second, at most `burst` saved up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub events_per_sec: NonZeroU32,
    pub burst: NonZeroU32,
}

/// One source's bucket.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: Rate,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(rate: Rate, now: Instant) -> Self {
        Self { rate, tokens: f64::from(rate.burst.get()), updated: now }
    }

    /// Takes `events` tokens if the bucket holds them at `now`; else takes nothing and says how
    /// long until it would.
    pub fn take(&mut self, events: usize, now: Instant) -> Result<(), Duration> {
        let rate = f64::from(self.rate.events_per_sec.get());
        let burst = f64::from(self.rate.burst.get());
        // A clock that went backwards (it cannot with Instant, but a caller may mix instants)
        // adds nothing.
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.updated = self.updated.max(now);
        let cost = (events as f64).min(burst);
        if self.tokens >= cost {
            self.tokens -= cost;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((cost - self.tokens) / rate))
        }
    }
}

/// Every source's bucket. The sources are known when the limiter is made (they come from the
/// write keys), so the map never grows and a request from an unknown key never reaches it.
#[derive(Debug)]
pub struct RateLimiter {
    buckets: HashMap<String, Mutex<TokenBucket>>,
}

impl RateLimiter {
    pub fn new<'a>(rate: Rate, sources: impl IntoIterator<Item = &'a str>, now: Instant) -> Self {
        let buckets = sources.into_iter().map(|s| (s.to_string(), Mutex::new(TokenBucket::new(rate, now)))).collect();
        Self { buckets }
    }

    /// Charges `events` to `source`'s bucket; `Err(wait)` if it is over its rate. A source without
    /// a bucket (none is ever authenticated) is not limited.
    pub fn take(&self, source: &str, events: usize, now: Instant) -> Result<(), Duration> {
        match self.buckets.get(source) {
            // A poisoned lock only means another request panicked mid-update; the bucket's two
            // numbers are still usable.
            Some(bucket) => bucket.lock().unwrap_or_else(|e| e.into_inner()).take(events, now),
            None => Ok(()),
        }
    }
}

/// Whole seconds to tell a client to wait (`Retry-After`, `x-ratelimit-reset`): rounded up, and at
/// least one, so a client never retries before the bucket holds what it needs.
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(events_per_sec: u32, burst: u32) -> Rate {
        Rate { events_per_sec: NonZeroU32::new(events_per_sec).unwrap(), burst: NonZeroU32::new(burst).unwrap() }
    }

    #[test]
    fn a_full_bucket_takes_the_burst_then_refills_at_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(rate(100, 200), t0);
        // The burst passes at once; one more event does not, and must wait 1/100 s.
        assert_eq!(b.take(200, t0), Ok(()));
        let wait = b.take(1, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.01).abs() < 1e-9, "{wait:?}");
        // Half a second later, 50 events' worth is back.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(b.take(50, t1), Ok(()));
        assert!(b.take(1, t1).is_err());
        // A long idle spell refills no more than the burst.
        let t2 = t1 + Duration::from_secs(3600);
        assert_eq!(b.take(200, t2), Ok(()));
        assert!(b.take(1, t2).is_err());
    }

    #[test]
    fn a_refused_request_takes_nothing() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(rate(10, 10), t0);
        assert_eq!(b.take(8, t0), Ok(()));
        // 5 events do not fit in the 2 left; they still are there for a request of 2.
        assert!(b.take(5, t0).is_err());
        assert_eq!(b.take(2, t0), Ok(()));
    }

    #[test]
    fn a_request_larger_than_the_burst_waits_for_a_full_bucket_and_is_never_refused_forever() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(rate(10, 20), t0);
        assert_eq!(b.take(1, t0), Ok(()));
        // 500 events against a burst of 20: charged 20, so it waits for the one token taken.
        let wait = b.take(500, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert_eq!(b.take(500, t0 + wait), Ok(()));
    }

    #[test]
    fn sources_have_buckets_of_their_own() {
        let t0 = Instant::now();
        let limiter = RateLimiter::new(rate(1, 5), ["web", "ios"], t0);
        assert_eq!(limiter.take("web", 5, t0), Ok(()));
        assert!(limiter.take("web", 1, t0).is_err());
        // The other source is untouched.
        assert_eq!(limiter.take("ios", 5, t0), Ok(()));
    }

    #[test]
    fn over_any_span_at_most_burst_plus_rate_times_span_pass() {
        // Requests of 7 events every 10 ms for 10 s against 100/s with a burst of 50.
        let t0 = Instant::now();
        let mut b = TokenBucket::new(rate(100, 50), t0);
        let mut accepted = 0u64;
        for i in 0..1000 {
            if b.take(7, t0 + Duration::from_millis(10 * i)).is_ok() {
                accepted += 7;
            }
        }
        // At most 50 + 100 * 9.99 s; and the limiter is not much stricter than that either.
        assert!(accepted <= 50 + 999, "{accepted}");
        assert!(accepted >= 999 - 7, "{accepted}");
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(10)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
    }
}

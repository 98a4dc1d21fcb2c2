//! The tracking API's rate limit: one token bucket per source (each write key stands for one
//! source), counted in events, with the time passed in so the rules are tested without a clock.
//!
//! Guarantee: over any span of `t` seconds a source gets at most `burst + rate * t` events
//! accepted, every event of every request counted. A request of at most `burst` events passes if
//! the bucket holds that many tokens, else it is refused with the wait until it would
//! ([`RateLimited::Wait`]). A request of more events than the burst could never fit in the bucket,
//! so it is refused at once, whatever the bucket holds ([`RateLimited::OverBurst`]): the client
//! must send smaller requests, and the burst must be at least the clients' largest batch. A
//! refused request takes nothing from its bucket.

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

/// Why a request was refused. Both are answered 429; neither took anything from the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RateLimited {
    /// The bucket does not hold the request's events yet; it will after this long. Worth
    /// retrying, the same request, after the wait.
    #[error("this source is over its rate limit; retry in {} s", retry_after_secs(*.0))]
    Wait(Duration),
    /// The request carries more events than the bucket can ever hold (`burst`), so it would be
    /// refused however long the client waited. Not worth retrying as it is: split into requests of
    /// at most `burst` events. `full_in` is how long until the bucket is full, when a request of
    /// `burst` events would pass.
    #[error("a request may carry at most {burst} events under this source's rate limit; send smaller batches")]
    OverBurst { burst: u32, full_in: Duration },
}

impl RateLimited {
    /// How long to tell the client to wait (`Retry-After`): until the request would pass, or for
    /// a request over the burst, until the bucket is full.
    pub fn retry_after(&self) -> Duration {
        match *self {
            Self::Wait(wait) => wait,
            Self::OverBurst { full_in, .. } => full_in,
        }
    }
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
        Self {
            rate,
            tokens: f64::from(rate.burst.get()),
            updated: now,
        }
    }

    /// Takes `events` tokens if the bucket holds them at `now`; else takes nothing and says why
    /// (a wait, or a request that can never fit).
    pub fn take(&mut self, events: usize, now: Instant) -> Result<(), RateLimited> {
        let rate = f64::from(self.rate.events_per_sec.get());
        let burst = f64::from(self.rate.burst.get());
        // A clock that went backwards (it cannot with Instant, but a caller may mix instants)
        // adds nothing.
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.updated = self.updated.max(now);
        // Every event is charged: a request the bucket can never hold is refused, not let in for
        // the price of the burst (which would let batches of any size through once a second).
        if events as u64 > u64::from(self.rate.burst.get()) {
            return Err(RateLimited::OverBurst {
                burst: self.rate.burst.get(),
                full_in: Duration::from_secs_f64((burst - self.tokens) / rate),
            });
        }
        let cost = events as f64;
        if self.tokens >= cost {
            self.tokens -= cost;
            Ok(())
        } else {
            Err(RateLimited::Wait(Duration::from_secs_f64(
                (cost - self.tokens) / rate,
            )))
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
        let buckets = sources
            .into_iter()
            .map(|s| (s.to_string(), Mutex::new(TokenBucket::new(rate, now))))
            .collect();
        Self { buckets }
    }

    /// Charges `events` to `source`'s bucket; `Err` if it is over its rate or the request is
    /// over the burst. A source without a bucket (none is ever authenticated) is not limited.
    pub fn take(&self, source: &str, events: usize, now: Instant) -> Result<(), RateLimited> {
        match self.buckets.get(source) {
            // A poisoned lock only means another request panicked mid-update; the bucket's two
            // numbers are still usable.
            Some(bucket) => bucket
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(events, now),
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
    use proptest::prelude::*;

    fn rate(events_per_sec: u32, burst: u32) -> Rate {
        Rate {
            events_per_sec: NonZeroU32::new(events_per_sec).unwrap(),
            burst: NonZeroU32::new(burst).unwrap(),
        }
    }

    #[test]
    fn a_full_bucket_takes_the_burst_then_refills_at_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(rate(100, 200), t0);
        // The burst passes at once; one more event does not, and must wait 1/100 s.
        assert_eq!(b.take(200, t0), Ok(()));
        let Err(RateLimited::Wait(wait)) = b.take(1, t0) else {
            panic!("one event past the burst must wait")
        };
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
    fn a_request_larger_than_the_burst_is_refused_at_once_and_takes_nothing() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(rate(10, 20), t0);
        assert_eq!(b.take(1, t0), Ok(()));
        // 500 events against a burst of 20 can never fit: refused as over the burst, with the
        // 0.1 s until the one token taken is back and the bucket is full.
        let refused = b.take(500, t0).unwrap_err();
        let RateLimited::OverBurst { burst: 20, full_in } = refused else {
            panic!("{refused:?}")
        };
        assert!((full_in.as_secs_f64() - 0.1).abs() < 1e-9, "{full_in:?}");
        assert_eq!(refused.retry_after(), full_in);
        // Waiting does not help it: it is refused the same way against a full bucket.
        let t1 = t0 + Duration::from_secs(60);
        assert_eq!(
            b.take(500, t1),
            Err(RateLimited::OverBurst {
                burst: 20,
                full_in: Duration::ZERO
            })
        );
        // One event over the burst is over it too; the burst itself is not, and the refusals took
        // nothing, so the whole burst is there.
        assert!(matches!(
            b.take(21, t1),
            Err(RateLimited::OverBurst { burst: 20, .. })
        ));
        assert_eq!(b.take(20, t1), Ok(()));
    }

    #[test]
    fn batches_far_over_the_burst_get_nothing_through() {
        // 20 events/s with a burst of 20; a client sends a 5,000-event batch every 100 ms for
        // 10 s, and between them a 10-event request that may pass.
        let t0 = Instant::now();
        let mut b = TokenBucket::new(rate(20, 20), t0);
        let mut accepted = 0u64;
        for i in 0..100 {
            let now = t0 + Duration::from_millis(100 * i);
            // Every large batch is refused as over the burst, never let in for the burst's price.
            assert!(
                matches!(
                    b.take(5_000, now),
                    Err(RateLimited::OverBurst { burst: 20, .. })
                ),
                "at {i}"
            );
            if b.take(10, now).is_ok() {
                accepted += 10;
            }
        }
        // At most burst + rate * 9.9 s = 218 events in all, so well under 220.
        assert!(accepted <= 220, "{accepted}");
        // And the small requests still get their fair share: the burst plus 9.9 s at the rate,
        // less what is left in the bucket short of a 10-event request (at the end, and at a
        // step that floating-point rounding leaves a hair short).
        assert!(accepted >= 218 - 2 * 10, "{accepted}");
    }

    #[test]
    fn sources_have_buckets_of_their_own() {
        let t0 = Instant::now();
        let limiter = RateLimiter::new(rate(1, 5), ["web", "ios"], t0);
        assert_eq!(limiter.take("web", 5, t0), Ok(()));
        assert!(limiter.take("web", 1, t0).is_err());
        // The other source is untouched.
        assert_eq!(limiter.take("ios", 5, t0), Ok(()));
        // Over the burst is refused through the limiter as well; an unknown source is not limited.
        assert!(matches!(
            limiter.take("ios", 6, t0),
            Err(RateLimited::OverBurst { burst: 5, .. })
        ));
        assert_eq!(limiter.take("android", 1_000, t0), Ok(()));
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
    fn refusals_say_how_long_to_wait() {
        assert_eq!(
            RateLimited::Wait(Duration::from_millis(1500)).to_string(),
            "this source is over its rate limit; retry in 2 s"
        );
        let over = RateLimited::OverBurst {
            burst: 500,
            full_in: Duration::from_secs(3),
        };
        assert_eq!(over.to_string(), "a request may carry at most 500 events under this source's rate limit; send smaller batches");
        assert_eq!(over.retry_after(), Duration::from_secs(3));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(10)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
    }

    proptest! {
        /// Whatever the requests (their times, their sizes, some far over the burst), the events
        /// accepted in every window [t0, t1] are at most burst + rate * (t1 - t0).
        #[test]
        fn no_window_gets_more_than_burst_plus_rate_times_its_length(
            events_per_sec in 1u32..200,
            burst in 1u32..300,
            requests in proptest::collection::vec((0u64..2_000, 0usize..400), 1..200),
        ) {
            let start = Instant::now();
            let mut b = TokenBucket::new(rate(events_per_sec, burst), start);
            // Each request comes some milliseconds after the one before (0: at the same instant).
            let mut at_ms = 0u64;
            let mut accepted: Vec<(u64, usize)> = Vec::new();
            for (gap_ms, events) in requests {
                at_ms += gap_ms;
                match b.take(events, start + Duration::from_millis(at_ms)) {
                    Ok(()) => accepted.push((at_ms, events)),
                    // A refusal is over the burst exactly when the request is.
                    Err(RateLimited::OverBurst { .. }) => prop_assert!(events > burst as usize),
                    Err(RateLimited::Wait(_)) => prop_assert!(events <= burst as usize),
                }
            }
            // The fullest window starts and ends on accepted requests, so checking those is
            // checking every window.
            for (i, &(t0, _)) in accepted.iter().enumerate() {
                let mut sum = 0u64;
                for &(t1, events) in &accepted[i..] {
                    sum += events as u64;
                    let allowed = f64::from(burst) + f64::from(events_per_sec) * (t1 - t0) as f64 / 1000.0;
                    // The epsilon covers the bucket's floating-point sums, nothing more.
                    prop_assert!(sum as f64 <= allowed + 1e-6, "{sum} events in [{t0}, {t1}] ms, allowed {allowed}");
                }
            }
        }
    }
}

//! Logs that cannot fill a disk: a per-reason rate limit on log lines, with the time passed in so
//! the rule is tested without a clock.
//!
//! An event that a client can cause at will (a refused request, a bad write key) must not write a
//! line each time it happens, or a flood of them fills the disk and drowns every other line. So the
//! code that logs such an event asks [`LogLimiter::check`] first, naming the event's reason.
//!
//! Guarantee: at most one line per reason per interval (two logged lines of one reason are at
//! least `interval` apart), and each logged line carries how many of that reason were not logged
//! since the line before it, so nothing goes uncounted. The limiter only decides about the log
//! line: the metrics still count every event.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The interval a reason is logged at most once in. Ten seconds: an operator watching the log
/// still sees a problem within seconds of its start, while a flood costs at most one line per
/// reason every ten seconds (a few thousand lines a day each, however many requests cause it).
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What to do with one occurrence of a reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogVerdict {
    /// Write the line, saying that `suppressed` occurrences of this reason were not logged since
    /// the last line (0: none, nothing to add).
    Log { suppressed: u64 },
    /// Do not write it; it is counted into the next logged line's `suppressed`.
    Suppress,
}

/// One reason's state: when its last line was written and how many were held back since.
#[derive(Debug, Clone, Copy)]
struct Reason {
    logged_at: Instant,
    suppressed: u64,
}

/// The per-reason log limit, shared by every thread that logs (`&self`; one lock, held for a map
/// lookup). Reasons are `&'static str`, a small fixed set, so the map stays small for ever.
#[derive(Debug)]
pub struct LogLimiter {
    interval: Duration,
    reasons: Mutex<HashMap<&'static str, Reason>>,
}

impl LogLimiter {
    /// A limiter that logs each reason at most once per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            reasons: Mutex::new(HashMap::new()),
        }
    }

    /// Whether an occurrence of `reason` at `now` is logged: the first of a reason is, later ones
    /// less than `interval` after its last logged line are suppressed and counted, and the first
    /// one after that is logged with the count.
    pub fn check(&self, reason: &'static str, now: Instant) -> LogVerdict {
        // A poisoned lock only means another thread panicked mid-update; the counts are still
        // usable, and logging must not panic in turn.
        let mut reasons = self.reasons.lock().unwrap_or_else(|e| e.into_inner());
        let Some(state) = reasons.get_mut(reason) else {
            reasons.insert(
                reason,
                Reason {
                    logged_at: now,
                    suppressed: 0,
                },
            );
            return LogVerdict::Log { suppressed: 0 };
        };
        // An instant before the last line (a caller may mix instants) counts as within the
        // interval: it never lets a second line through early.
        if now.saturating_duration_since(state.logged_at) < self.interval {
            state.suppressed += 1;
            return LogVerdict::Suppress;
        }
        let suppressed = std::mem::take(&mut state.suppressed);
        state.logged_at = now;
        LogVerdict::Log { suppressed }
    }
}

impl Default for LogLimiter {
    /// A limiter at [`LOG_INTERVAL`].
    fn default() -> Self {
        Self::new(LOG_INTERVAL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn each_reason_logs_once_per_interval_and_then_says_how_many_it_held_back() {
        let t0 = Instant::now();
        let limiter = LogLimiter::new(10 * SECOND);
        // (seconds after t0, reason, verdict), in order.
        let steps: &[(u32, &'static str, LogVerdict)] = &[
            // The first of a reason is logged, with nothing held back.
            (0, "rate_limited", LogVerdict::Log { suppressed: 0 }),
            // Within ten seconds of that line the next three are held back.
            (0, "rate_limited", LogVerdict::Suppress),
            (4, "rate_limited", LogVerdict::Suppress),
            (9, "rate_limited", LogVerdict::Suppress),
            // Another reason has its own interval: its first line is logged at once.
            (9, "bad_write_key", LogVerdict::Log { suppressed: 0 }),
            // Ten seconds after the first line, one is logged again, carrying the three.
            (10, "rate_limited", LogVerdict::Log { suppressed: 3 }),
            // The count starts again from that line, and so does the interval.
            (12, "rate_limited", LogVerdict::Suppress),
            (19, "bad_write_key", LogVerdict::Log { suppressed: 0 }),
            (19, "rate_limited", LogVerdict::Suppress),
            (20, "rate_limited", LogVerdict::Log { suppressed: 2 }),
            // After a quiet spell the next one is logged at once, with nothing held back.
            (3600, "rate_limited", LogVerdict::Log { suppressed: 0 }),
        ];
        for &(secs, reason, expected) in steps {
            assert_eq!(
                limiter.check(reason, t0 + secs * SECOND),
                expected,
                "{reason} at {secs} s"
            );
        }
    }

    #[test]
    fn an_earlier_instant_never_lets_a_line_through_early() {
        let t0 = Instant::now();
        let limiter = LogLimiter::new(10 * SECOND);
        // A line at 5 s; an occurrence stamped 1 s counts as within the interval.
        assert_eq!(
            limiter.check("rate_limited", t0 + 5 * SECOND),
            LogVerdict::Log { suppressed: 0 }
        );
        assert_eq!(
            limiter.check("rate_limited", t0 + SECOND),
            LogVerdict::Suppress
        );
        // The interval still runs from the line at 5 s.
        assert_eq!(
            limiter.check("rate_limited", t0 + 14 * SECOND),
            LogVerdict::Suppress
        );
        assert_eq!(
            limiter.check("rate_limited", t0 + 15 * SECOND),
            LogVerdict::Log { suppressed: 2 }
        );
    }

    #[test]
    fn a_flood_from_many_threads_logs_one_line_and_counts_the_rest() {
        let t0 = Instant::now();
        let limiter = LogLimiter::default();
        // 8 threads, 1,000 occurrences each, all within one interval: one line in all.
        let logged: u64 = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        (0..1_000)
                            .filter(|_| {
                                matches!(limiter.check("rate_limited", t0), LogVerdict::Log { .. })
                            })
                            .count() as u64
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        assert_eq!(logged, 1);
        // The next line after the interval accounts for every other one.
        assert_eq!(
            limiter.check("rate_limited", t0 + LOG_INTERVAL),
            LogVerdict::Log { suppressed: 7_999 }
        );
    }
}

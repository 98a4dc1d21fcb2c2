//! The dedupe window forecast: what the window will be once the ledger fills its budget.
//!
//! A full ledger holds `budget / bytes_per_id` ids; at an id rate of `r` per second that is
//! `budget / bytes_per_id / r` seconds of ids. Before the rate is known (an idle worker, or the
//! first minutes), the window the ledger holds now is scaled by how much of the budget is free:
//! the ids it holds took `window` seconds to arrive, so a full ledger holds `budget / bytes` times
//! that, at the same average rate.
//!
//! Whether the budget holds the promised window ([`budget_holds_promise`]) is judged at the last
//! hour's rate ([`HourRate`]), not the smoothed one: a burst of a minute is no reason to warn, an
//! hour of it is.

use std::collections::VecDeque;
use std::time::Duration;

/// What the forecast needs to know about the ledger.
#[derive(Debug, Clone, Copy)]
pub struct LedgerFill {
    pub budget_bytes: u64,
    /// Bytes of ids on disk now.
    pub bytes: u64,
    /// Ids held now.
    pub ids: u64,
}

/// The window once the ledger is full, in seconds: from the recent id rate when there is one,
/// else from the held window at the average rate. Never less than the window held now while the
/// ledger is under budget.
pub fn forecast_seconds(fill: LedgerFill, ids_per_sec: f64, held: Duration) -> f64 {
    let held = held.as_secs_f64();
    if fill.bytes == 0 || fill.ids == 0 {
        return held;
    }
    let bytes_per_id = fill.bytes as f64 / fill.ids as f64;
    let capacity_ids = fill.budget_bytes as f64 / bytes_per_id;
    let forecast = if ids_per_sec > 1.0 {
        capacity_ids / ids_per_sec
    } else {
        held * (fill.budget_bytes as f64 / fill.bytes as f64)
    };
    if fill.bytes < fill.budget_bytes {
        forecast.max(held)
    } else {
        forecast
    }
}

/// A smoothed id rate from successive `(seconds elapsed, ids held)` readings. Readings where the
/// ledger forgot a generation (ids went down) are skipped.
#[derive(Debug, Default, Clone)]
pub struct IdRate {
    per_sec: Option<f64>,
    last_ids: Option<u64>,
}

impl IdRate {
    /// Weight of the newest reading: a 5-second tick forgets a burst in about a minute.
    const ALPHA: f64 = 0.2;

    pub fn observe(&mut self, elapsed: Duration, ids: u64) -> Option<f64> {
        if let Some(last) = self.last_ids {
            let dt = elapsed.as_secs_f64();
            if dt > 0.0 && ids >= last {
                let rate = (ids - last) as f64 / dt;
                self.per_sec = Some(match self.per_sec {
                    None => rate,
                    Some(old) => (1.0 - Self::ALPHA) * old + Self::ALPHA * rate,
                });
            }
        }
        self.last_ids = Some(ids);
        self.per_sec
    }

    pub fn per_sec(&self) -> f64 {
        self.per_sec.unwrap_or(0.0)
    }
}

/// The id rate over the last hour, from successive `(seconds elapsed, ids held)` readings: the
/// ids added (each reading's rise; a fall is a generation forgotten, not ids removed by traffic)
/// over the time the readings span, up to an hour.
#[derive(Debug, Default, Clone)]
pub struct HourRate {
    /// Seconds since the first reading, and ids added since then, at each reading of the last hour
    /// (and the newest one before it, which the hour's span starts from).
    readings: VecDeque<(f64, u64)>,
    last_ids: Option<u64>,
    now: f64,
    added: u64,
}

impl HourRate {
    /// The span the rate is taken over.
    pub const SPAN_SECS: f64 = 3600.0;
    /// The shortest span a rate is given for: fewer readings say nothing about an hour.
    pub const MIN_SPAN_SECS: f64 = 60.0;

    pub fn observe(&mut self, elapsed: Duration, ids: u64) {
        self.now += elapsed.as_secs_f64();
        if let Some(last) = self.last_ids {
            self.added += ids.saturating_sub(last);
        }
        self.last_ids = Some(ids);
        self.readings.push_back((self.now, self.added));
        // Keep one reading at or before the hour's start, so the span is a whole hour once there is
        // one.
        while self.readings.len() > 2 && self.readings[1].0 <= self.now - Self::SPAN_SECS {
            self.readings.pop_front();
        }
    }

    /// Ids per second over the last hour (or the readings' span, if shorter but at least
    /// [`Self::MIN_SPAN_SECS`]); `None` before then.
    pub fn per_sec(&self) -> Option<f64> {
        let &(t0, added0) = self.readings.front()?;
        let span = self.now - t0;
        (span >= Self::MIN_SPAN_SECS).then(|| (self.added - added0) as f64 / span)
    }
}

/// How a ledger stores its ids, as the plan counts them: its generations and whether it keeps
/// content digests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerShape {
    pub generations: u32,
    pub digests: bool,
}

/// Whether a ledger of `fill`'s budget and `shape` holds `promise_secs` of ids at `ids_per_sec`,
/// by the arithmetic of `dedupe plan` (its lowest point, a generation just dropped), at the bytes
/// per id the plan's measured figures give, or at what the ledger shows if that is more. The
/// ledger's own bytes count only what is flushed (its files), while its ids include the write
/// buffer's, so alone they read far too few bytes per id until the buffer is small beside the
/// files: the plan's figure is the floor from the first reading. `None` without a rate.
pub fn budget_holds_promise(
    fill: LedgerFill,
    ids_per_sec: Option<f64>,
    promise_secs: u64,
    shape: LedgerShape,
) -> Option<bool> {
    let rate = ids_per_sec?;
    let planned = crate::plan::planned_bytes_per_id(shape.digests);
    let measured = if fill.bytes > 0 && fill.ids > 0 {
        fill.bytes as f64 / fill.ids as f64
    } else {
        0.0
    };
    let capacity_ids = crate::plan::ids_held_at_lowest(
        fill.budget_bytes as f64,
        shape.generations,
        planned.max(measured),
    );
    Some(capacity_ids >= rate * promise_secs as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn forecast_from_the_rate() {
        // 16 GiB at 20 bytes per id is ~859M ids; at 10k ids/s that is ~23.9 hours.
        let fill = LedgerFill {
            budget_bytes: 16 * GIB,
            bytes: GIB,
            ids: GIB / 20,
        };
        let f = forecast_seconds(fill, 10_000.0, Duration::from_secs(3600));
        assert!((f - 16.0 * GIB as f64 / 20.0 / 10_000.0).abs() < 1.0, "{f}");
        assert!(f < 86_400.0, "this worker will page once full");
    }

    #[test]
    fn forecast_without_a_rate_scales_the_held_window() {
        // A quarter full after 6 hours: a full ledger holds 24 hours at the same average rate.
        let fill = LedgerFill {
            budget_bytes: 4 * GIB,
            bytes: GIB,
            ids: 1_000_000,
        };
        assert_eq!(
            forecast_seconds(fill, 0.0, Duration::from_secs(6 * 3600)),
            24.0 * 3600.0
        );
    }

    #[test]
    fn an_empty_ledger_forecasts_what_it_holds() {
        let fill = LedgerFill {
            budget_bytes: GIB,
            bytes: 0,
            ids: 0,
        };
        assert_eq!(forecast_seconds(fill, 5_000.0, Duration::from_secs(7)), 7.0);
    }

    #[test]
    fn a_full_ledger_may_forecast_less_than_it_holds() {
        // Traffic tripled: the window will shrink to a third.
        let fill = LedgerFill {
            budget_bytes: GIB,
            bytes: GIB,
            ids: 50_000_000,
        };
        let held = Duration::from_secs(30 * 3600);
        let f = forecast_seconds(fill, 50_000_000.0 / (10.0 * 3600.0), held);
        assert!((f - 10.0 * 3600.0).abs() < 1.0, "{f}");
    }

    #[test]
    fn id_rate_smooths_and_skips_forgetting() {
        let mut r = IdRate::default();
        assert_eq!(r.observe(Duration::from_secs(5), 1000), None);
        assert_eq!(r.observe(Duration::from_secs(5), 6000), Some(1000.0));
        // A generation was dropped: ids went down, the reading is skipped.
        assert_eq!(r.observe(Duration::from_secs(5), 10), Some(1000.0));
        let smoothed = r.observe(Duration::from_secs(5), 10 + 10_000).unwrap();
        assert!((smoothed - (0.8 * 1000.0 + 0.2 * 2000.0)).abs() < 1e-9);
    }

    #[test]
    fn the_hour_rate_counts_ids_added_over_the_last_hour() {
        let mut r = HourRate::default();
        r.observe(Duration::ZERO, 0);
        // Under a minute of readings: no rate yet.
        r.observe(Duration::from_secs(30), 30_000);
        assert_eq!(r.per_sec(), None);
        r.observe(Duration::from_secs(30), 60_000);
        assert_eq!(r.per_sec(), Some(1000.0));
        // A generation is forgotten (ids fall): the fall is not negative traffic.
        r.observe(Duration::from_secs(60), 10_000);
        assert_eq!(r.per_sec(), Some(500.0));
        // Two hours at 100 ids/s: the first hour's burst is out of the span.
        for _ in 0..120 {
            let ids = r.last_ids.unwrap() + 6_000;
            r.observe(Duration::from_secs(60), ids);
        }
        let rate = r.per_sec().unwrap();
        assert!((rate - 100.0).abs() < 1e-9, "{rate}");
        assert!(r.readings.len() <= 62, "{}", r.readings.len());
    }

    #[test]
    fn a_budget_holds_the_promise_at_a_rate_or_not_as_the_plan_counts() {
        let shape = LedgerShape {
            generations: 8,
            digests: true,
        };
        let ask = |rate: f64| crate::plan::Ask {
            ids_per_sec: rate,
            promise: Duration::from_secs(86_400),
            changelog_retention: Duration::from_secs(86_400),
            replication: 3,
            generations: 8,
            digests: true,
            least_budget_bytes: crate::config::LedgerConfig::default().least_budget_bytes(),
        };
        // 64 MiB, the case: the plan's window at 500 ids/s is under 24 h, and the gauge
        // says so from the first reading, though the ledger has flushed almost nothing (5,626
        // bytes for 54,600 ids: 0.1 bytes per id, which alone would claim 24 h at 6,000 ids/s).
        let early = LedgerFill {
            budget_bytes: 64 << 20,
            bytes: 5_626,
            ids: 54_600,
        };
        let planned = ask(500.0)
            .window_of((64 << 20) as f64, 500.0)
            .expect("a window");
        assert!(planned < Duration::from_secs(86_400), "{planned:?}");
        assert_eq!(
            budget_holds_promise(early, Some(500.0), 86_400, shape),
            Some(false)
        );
        // At a rate the plan says 64 MiB holds for 24 h, it holds.
        let held_rate = 0.99 * ids_at(64 << 20, shape) / 86_400.0;
        assert!(ask(held_rate)
            .window_of((64 << 20) as f64, held_rate)
            .is_some_and(|w| w >= Duration::from_secs(86_400)));
        assert_eq!(
            budget_holds_promise(early, Some(held_rate), 86_400, shape),
            Some(true)
        );
        // A ledger that stores more per id than the figures (its files say so) holds less.
        let heavy = LedgerFill {
            budget_bytes: 64 << 20,
            bytes: 32 << 20,
            ids: (32 << 20) / 100,
        };
        assert_eq!(
            budget_holds_promise(heavy, Some(held_rate), 86_400, shape),
            Some(false)
        );
        // Unknown without a rate; an empty ledger is judged by the figures.
        assert_eq!(budget_holds_promise(early, None, 86_400, shape), None);
        let empty = LedgerFill {
            bytes: 0,
            ids: 0,
            ..early
        };
        assert_eq!(
            budget_holds_promise(empty, Some(500.0), 86_400, shape),
            Some(false)
        );
    }

    fn ids_at(budget: u64, shape: LedgerShape) -> f64 {
        crate::plan::ids_held_at_lowest(
            budget as f64,
            shape.generations,
            crate::plan::planned_bytes_per_id(shape.digests),
        )
    }
}

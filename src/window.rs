//! The dedupe window forecast: what the window will be once the ledger fills its budget.
//!
//! A full ledger holds `budget / bytes_per_id` ids; at an id rate of `r` per second that is
//! `budget / bytes_per_id / r` seconds of ids. Before the rate is known (an idle worker, or the
//! first minutes), the window the ledger holds now is scaled by how much of the budget is free:
//! the ids it holds took `window` seconds to arrive, so a full ledger holds `budget / bytes` times
//! that, at the same average rate.

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
}

//! The ledger's figures, each partition's window and forecast, whether the budget holds the
//! promised window, and the input lag, exported every few seconds.

use std::time::{Duration, Instant};

use actix::prelude::*;
use dedupe::clock::now_ms;
use dedupe::window::{budget_holds_promise, forecast_seconds, LedgerFill};
use rdkafka::consumer::Consumer;
use rdkafka::Offset;

use super::Coordinator;
use crate::events::coordinator::{
    ConsumerLag, LedgerFigures, LimitApplied, LimitFailed, PartitionWindow, PromiseHeld,
};
use crate::ledger::{Expire, Stats, StatsReport};
use crate::membership::Input;

impl Coordinator {
    pub(super) fn export_stats(&mut self, ctx: &mut Context<Self>) {
        self.publish_health();
        let partitions: Vec<i32> = self
            .running
            .as_ref()
            .map(|r| r.owned.keys().copied().collect())
            .unwrap_or_default();
        // Before the figures: the window they report is what the limit leaves.
        self.apply_limit(ctx);
        let msg = Stats {
            partitions: partitions.clone(),
            now_ms: now_ms(),
        };
        ctx.spawn(
            self.ledger
                .send(msg)
                .into_actor(self)
                .map(move |res, act, _| {
                    let Ok(Ok(report)) = res else { return };
                    act.report_figures(&report);
                }),
        );
        if let Some(running) = &self.running {
            let consumer = running.membership.consumer.clone();
            let topic = self.config.worker.input_topic.clone();
            actix_rt::task::spawn_blocking(move || export_lag(&consumer, &topic, &partitions));
        }
    }

    /// With a retention limit (`ledger.max_window_secs`), has the ledger forget the ids older
    /// than it.
    fn apply_limit(&mut self, ctx: &mut Context<Self>) {
        let Some(limit_secs) = self.config.ledger.max_window_secs else {
            return;
        };
        ctx.spawn(
            self.ledger
                .send(Expire { now_ms: now_ms() })
                .into_actor(self)
                .map(move |res, _, _| match res {
                    Ok(Ok(expired)) => LimitApplied {
                        expired,
                        limit_secs,
                    }
                    .emit(),
                    Ok(Err(e)) => LimitFailed { error: &e }.emit(),
                    Err(_) => {}
                }),
        );
    }

    /// Exports the ledger's figures, updates the id rates, and reports whether the budget holds
    /// the promise and each partition's window and forecast.
    fn report_figures(&mut self, report: &StatsReport) {
        let budget = self.config.ledger.budget_bytes.0;
        let promise_secs = self.config.worker.promised_window_secs;
        let s = &report.stats;
        LedgerFigures { stats: s }.emit();
        let now = Instant::now();
        let elapsed = self
            .last_stats_at
            .map(|t| now.duration_since(t))
            .unwrap_or_default();
        self.last_stats_at = Some(now);
        self.id_rate.observe(elapsed, s.ids_estimate);
        self.hour_rate.observe(elapsed, s.ids_estimate);
        let fill = LedgerFill {
            budget_bytes: budget,
            bytes: s.live_sst_bytes,
            ids: s.ids_estimate,
        };
        let hour_rate = self.hour_rate.per_sec();
        if let Some(holds) = budget_holds_promise(fill, hour_rate, promise_secs) {
            let changed = self.promise_held.map_or(!holds, |before| before != holds);
            self.promise_held = Some(holds);
            PromiseHeld {
                holds,
                changed,
                ids_per_sec: hour_rate.unwrap_or_default(),
                promise_secs,
                budget_bytes: budget,
            }
            .emit();
        }
        for &(partition, window) in &report.windows {
            // No id held: no window to report (the ledger never reports one it does not hold).
            let Some(w) = window else { continue };
            PartitionWindow {
                partition,
                window_secs: w.as_secs_f64(),
                forecast_secs: forecast_seconds(fill, self.id_rate.per_sec(), w),
            }
            .emit();
        }
    }
}

fn export_lag(consumer: &Input, topic: &str, partitions: &[i32]) {
    let Ok(positions) = consumer.position() else {
        return;
    };
    for &p in partitions {
        let Some(Offset::Offset(pos)) = positions.find_partition(topic, p).map(|e| e.offset())
        else {
            continue;
        };
        if let Ok((_, high)) = consumer.fetch_watermarks(topic, p, Duration::from_secs(5)) {
            ConsumerLag {
                partition: p,
                records: high - pos,
            }
            .emit();
        }
    }
}

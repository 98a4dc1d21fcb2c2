//! The ledger's figures, each partition's window and forecast, and the input lag, exported every
//! few seconds.

use std::time::{Duration, Instant};

use actix::prelude::*;
use dedupe::clock::now_ms;
use dedupe::metrics as m;
use dedupe::window::{forecast_seconds, LedgerFill};
use rdkafka::consumer::Consumer;
use rdkafka::Offset;

use super::Coordinator;
use crate::actors::ledger::Stats;
use crate::actors::membership::Input;

impl Coordinator {
    pub(super) fn export_stats(&mut self, ctx: &mut Context<Self>) {
        self.publish_health();
        let partitions: Vec<i32> = self
            .running
            .as_ref()
            .map(|r| r.owned.keys().copied().collect())
            .unwrap_or_default();
        let msg = Stats {
            partitions: partitions.clone(),
            now_ms: now_ms(),
        };
        let budget = self.config.ledger.budget_bytes.0;
        ctx.spawn(
            self.ledger
                .send(msg)
                .into_actor(self)
                .map(move |res, act, _| {
                    let Ok(Ok(report)) = res else { return };
                    let s = &report.stats;
                    metrics::gauge!(m::LEDGER_BYTES).set(s.live_sst_bytes as f64);
                    metrics::gauge!(m::LEDGER_IDS).set(s.ids_estimate as f64);
                    metrics::gauge!(m::LEDGER_GENERATIONS).set(s.generations as f64);
                    metrics::gauge!(m::LEDGER_FILTER_BYTES).set(s.filter_bytes as f64);
                    metrics::gauge!(m::LEDGER_INDEX_BYTES).set(s.index_bytes as f64);
                    metrics::gauge!(m::LEDGER_INDEX_OVERFLOWED_BUCKETS)
                        .set(s.index_overflowed_buckets as f64);
                    metrics::counter!(m::LEDGER_DISK_LOOKUPS).absolute(s.disk_lookups);
                    let now = Instant::now();
                    let elapsed = act
                        .last_stats_at
                        .map(|t| now.duration_since(t))
                        .unwrap_or_default();
                    act.last_stats_at = Some(now);
                    act.id_rate.observe(elapsed, s.ids_estimate);
                    let fill = LedgerFill {
                        budget_bytes: budget,
                        bytes: s.live_sst_bytes,
                        ids: s.ids_estimate,
                    };
                    for (p, window) in &report.windows {
                        let label = p.to_string();
                        // No id held: no window to report (the ledger never reports one it does not hold).
                        let Some(w) = window else { continue };
                        metrics::gauge!(m::WINDOW_SECONDS, m::LABEL_PARTITION => label.clone())
                            .set(w.as_secs_f64());
                        let forecast = forecast_seconds(fill, act.id_rate.per_sec(), *w);
                        metrics::gauge!(m::WINDOW_FORECAST_SECONDS, m::LABEL_PARTITION => label)
                            .set(forecast);
                    }
                }),
        );
        if let Some(running) = &self.running {
            let consumer = running.membership.consumer.clone();
            let topic = self.config.worker.input_topic.clone();
            actix_rt::task::spawn_blocking(move || export_lag(&consumer, &topic, &partitions));
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
            metrics::gauge!(m::CONSUMER_LAG, m::LABEL_PARTITION => p.to_string())
                .set((high - pos).max(0) as f64);
        }
    }
}

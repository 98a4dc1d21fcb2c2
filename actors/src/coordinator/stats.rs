//! The ledger's figures, each partition's window and forecast, whether the budget holds the
//! promised window, and the input lag, exported every few seconds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use dedupe::clock::now_ms;
use dedupe::config::DigestSource;
use dedupe::window::{budget_holds_promise, forecast_seconds, LedgerFill, LedgerShape};
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use super::Coordinator;
use crate::consumer::Board;
use crate::events::coordinator::{
    ConsumerLag, LedgerFigures, LimitApplied, LimitFailed, PartitionWindow, PromiseHeld,
    WindowLimited,
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
        self.apply_limit(ctx, &partitions);
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
            let board = Arc::clone(&self.settings.board);
            actix_rt::task::spawn_blocking(move || {
                export_lag(&consumer, &topic, &partitions, &board)
            });
        }
    }

    /// With a retention limit (`ledger.max_window_secs`), has the ledger forget the ids older
    /// than it.
    /// The partitions not caught up (see [`Board::caught_up`]) hold the limit's clock at their
    /// watermark: the ids their waiting records may repeat stay.
    fn apply_limit(&mut self, ctx: &mut Context<Self>, owned: &[i32]) {
        let Some(limit_secs) = self.config.ledger.max_window_secs else {
            return;
        };
        let behind = owned
            .iter()
            .copied()
            .filter(|&p| !self.settings.board.caught_up(p))
            .collect();
        ctx.spawn(
            self.ledger
                .send(Expire {
                    now_ms: now_ms(),
                    behind,
                })
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
        let shape = LedgerShape {
            generations: self.config.ledger.generations as u32,
            digests: self.config.worker.content_digest != DigestSource::None,
        };
        if let Some(holds) = budget_holds_promise(fill, hour_rate, promise_secs, shape) {
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
        for (&(partition, window), &limited) in report.windows.iter().zip(&report.limited) {
            // Whether the limit alone bounds the window, held or not: a quiet ledger that holds
            // nothing still keeps every id within the limit.
            WindowLimited { partition, limited }.emit();
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

/// Each partition's input lag: from its position, or from the record a stalled partition stops
/// at (the records read past it wait too); shown on the board, unknown when it cannot be read.
/// A partition that has consumed nothing since it was assigned has no position: while its
/// pipeline waits on an empty queue, its lag counts from the group's committed offset.
fn export_lag(consumer: &Input, topic: &str, partitions: &[i32], board: &Board) {
    let positions = consumer.position().ok();
    let mut unread = TopicPartitionList::new();
    for &p in partitions {
        let position = positions
            .as_ref()
            .and_then(|all| all.find_partition(topic, p))
            .map(|e| e.offset());
        match position {
            Some(Offset::Offset(pos)) => lag_from(consumer, topic, p, pos, board),
            _ if board.idle(p) => {
                unread.add_partition(topic, p);
            }
            _ => board.set_lag(p, None),
        }
    }
    if unread.count() == 0 {
        return;
    }
    let committed = consumer.committed_offsets(unread.clone(), Duration::from_secs(5));
    for e in unread.elements() {
        let p = e.partition();
        let offset = committed
            .as_ref()
            .ok()
            .and_then(|c| c.find_partition(topic, p))
            .map(|e| e.offset());
        match offset {
            Some(Offset::Offset(committed)) => lag_from(consumer, topic, p, committed, board),
            // Nothing committed yet: the partition is read from its start.
            Some(_) if committed.is_ok() => lag_from(consumer, topic, p, 0, board),
            _ => board.set_lag(p, None),
        }
    }
}

fn lag_from(consumer: &Input, topic: &str, p: i32, position: i64, board: &Board) {
    let pos = board
        .stalled_at(p)
        .map_or(position, |stalled| stalled.min(position));
    match consumer.fetch_watermarks(topic, p, Duration::from_secs(5)) {
        Ok((low, high)) => {
            // Records before the low watermark are gone: not waiting.
            let records = high - pos.max(low);
            board.set_lag(p, Some(records.max(0)));
            ConsumerLag {
                partition: p,
                records,
            }
            .emit();
        }
        Err(_) => board.set_lag(p, None),
    }
}

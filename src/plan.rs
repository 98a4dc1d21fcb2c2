//! Capacity planning: what a promised window costs at an id rate, in budget, memory, disk,
//! workers, partitions and handover time (`dedupe plan`). The one place this arithmetic lives:
//! docs/operations.md's sizing table is this module's output, checked by the suite.
//!
//! Every figure it starts from is a measurement in docs/performance.md, named in [`FIGURES`] with
//! the bench it comes from; the suite checks each against that bench's raw JSON in docs/bench/, so
//! a new measurement that moves a figure fails until the figure follows.
//!
//! The arithmetic, for `r` ids per second and a promise of `p` seconds:
//! - ids held: `r × p`;
//! - ledger budget: ids held × bytes per id × `g / (g − 1)` for `g` generations, since the window
//!   saw-tooths down to `(g − 1) / g` of what the budget holds when a generation is dropped;
//! - ledger volume: twice the budget (compaction and snapshot hard links);
//! - memory per worker: the measured resident size at the ids it holds (a line through the 100M
//!   and the billion-id runs);
//! - the id changelog: `r × changelog retention × bytes per changelog id × replication factor`;
//! - workers: enough that each gets at most half the pipeline bench's throughput, and holds at most
//!   the billion ids the ledger was measured at;
//! - partitions: at least two per worker (room for a worker to join without a re-partition), and
//!   enough that none holds more than the 50M ids whose handover was measured under 10 s;
//! - handover: a line through the 50M and 200M handover runs, for one partition's ids.
//!
//! A plan never recommends a budget the configuration refuses: below the least
//! `ledger.budget_bytes` it accepts ([`Ask::least_budget_bytes`]) it recommends that least budget
//! and says so. A rate whose answer does not fit a Kafka topic (more than [`MAX_PARTITIONS`]
//! partitions) is refused ([`PlanError`]) rather than rounded to whatever an integer holds.

use std::time::Duration;

/// A measured figure the plan starts from, and where it was measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    pub value: f64,
    /// The bench's row in docs/performance.md and its raw JSON in docs/bench/.
    pub source: &'static str,
}

/// The measured figures (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    /// Ledger bytes per id without content digests.
    pub bytes_per_id: Figure,
    /// Ledger bytes per id with content digests.
    pub bytes_per_id_with_digests: Figure,
    /// Ledger bytes per id without content digests in the digest bench's own run (the digests'
    /// cost is the difference between its two runs, added to `bytes_per_id`).
    pub bytes_per_id_digest_baseline: Figure,
    /// Changelog bytes per id (the 50M handover's changelog over its ids).
    pub changelog_bytes_per_id: Figure,
    /// Peak resident bytes and ids of the 100M-id ledger run.
    pub rss_100m_bytes: Figure,
    /// Peak resident bytes of the billion-id ledger run.
    pub rss_1b_bytes: Figure,
    /// The worker's throughput in the pipeline bench, messages per second.
    pub worker_msgs_per_sec: Figure,
    /// The slowest of three 50M-id handovers, seconds from assignment to first publish.
    pub handover_50m_secs: Figure,
    /// The 200M-id handover, seconds.
    pub handover_200m_secs: Figure,
}

const LEDGER_100M: &str = "ledger, 100M ids (docs/bench/ledger-100m.json)";
const DIGESTS: &str = "content digests, 20M ids (docs/bench/digests.json)";

/// The figures of docs/performance.md that the plan uses.
pub const FIGURES: Figures = Figures {
    bytes_per_id: Figure {
        value: 17.71,
        source: LEDGER_100M,
    },
    bytes_per_id_with_digests: Figure {
        value: 20.36,
        source: DIGESTS,
    },
    bytes_per_id_digest_baseline: Figure {
        value: 17.42,
        source: DIGESTS,
    },
    changelog_bytes_per_id: Figure {
        value: 18.70,
        source: "handoff, 50M ids over 24 h (docs/bench/handoff-50m.json)",
    },
    rss_100m_bytes: Figure {
        value: 1_123_303_424.0,
        source: LEDGER_100M,
    },
    rss_1b_bytes: Figure {
        value: 6.05e9,
        source: "ledger, 1B ids (docs/bench/billion.json)",
    },
    worker_msgs_per_sec: Figure {
        value: 141_205.0,
        source: "pipeline (docs/bench/pipeline.json)",
    },
    handover_50m_secs: Figure {
        value: 8.25,
        source: "handoff, 50M ids over 24 h (docs/bench/handoff-50m.json)",
    },
    handover_200m_secs: Figure {
        value: 26.87,
        source: "handoff, 200M ids over 24 h (docs/bench/handoff-200m.json)",
    },
};

/// The most ids one worker's ledger was measured at.
pub const MAX_IDS_PER_WORKER: f64 = 1e9;
/// The most ids one partition holds in a plan: the 50M whose handover was measured under 10 s.
pub const MAX_IDS_PER_PARTITION: f64 = 50e6;
/// The share of a worker's measured throughput a plan gives it: the other half is headroom for
/// bursts, recoveries and handovers.
pub const THROUGHPUT_SHARE: f64 = 0.5;
/// The most input partitions a plan answers with: Kafka counts a topic's partitions in an int32.
/// Every plan gives each worker at least two partitions, so its workers fit a `u32` too.
pub const MAX_PARTITIONS: f64 = i32::MAX as f64;

/// Why a plan cannot be answered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// The rate is not a positive, finite number.
    #[error("{0} is not a positive number of ids per second")]
    NotARate(f64),
    /// The rate and the promise need more partitions than a topic holds.
    #[error(
        "the plan needs {partitions:.3e} input partitions, more than a Kafka topic holds ({}); \
         with this promise it answers at most {most_ids_per_sec:.3e} ids per second",
        MAX_PARTITIONS as i64
    )]
    TooLarge {
        partitions: f64,
        /// The largest rate whose plan fits, at the same promise.
        most_ids_per_sec: f64,
    },
}

/// What a plan is asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// Ids per second into the pipeline (all partitions).
    pub ids_per_sec: f64,
    /// The promised window.
    pub promise: Duration,
    /// How long the id changelog keeps ids (`worker.changelog_retention_secs`).
    pub changelog_retention: Duration,
    /// The changelog topic's replication factor.
    pub replication: u32,
    /// The ledger's generations (`ledger.generations`).
    pub generations: u32,
    /// Whether content digests are kept (`worker.content_digest` other than `none`).
    pub digests: bool,
    /// The least `ledger.budget_bytes` the configuration accepts
    /// ([`LedgerConfig::least_budget_bytes`](crate::config::LedgerConfig::least_budget_bytes)):
    /// no worker's budget is planned below it.
    pub least_budget_bytes: u64,
}

/// What a promise costs (see the module's doc for the arithmetic).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Plan {
    pub ids_per_sec: f64,
    pub promise_secs: u64,
    pub ids_held: f64,
    pub bytes_per_id: f64,
    pub workers: u32,
    pub partitions: u32,
    /// What each worker needs, the pipeline's rate spread evenly.
    pub per_worker: PerWorker,
    /// The id changelog, all partitions, all replicas.
    pub changelog_bytes: f64,
    /// The handover of one partition (from its assignment to its first publish).
    pub handover_secs: f64,
}

/// What each worker of a plan needs.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PerWorker {
    pub ids_per_sec: f64,
    pub ids_held: f64,
    /// `ledger.budget_bytes`: what the promise needs, or the least budget the configuration
    /// accepts when that is more.
    pub budget_bytes: f64,
    /// The budget the promise alone needs (the lowest window at it is the promise).
    pub promise_budget_bytes: f64,
    /// `budget_bytes` is the least the configuration accepts, more than the promise needs: the
    /// window it holds is longer than the promise.
    pub budget_is_least: bool,
    /// The ledger's volume.
    pub disk_bytes: f64,
    pub memory_bytes: f64,
}

/// Ledger bytes per id as a pipeline stores them, from the measured figures: with content
/// digests (`worker.content_digest` other than `none`) or without.
pub fn planned_bytes_per_id(digests: bool) -> f64 {
    let f = FIGURES;
    if digests {
        f.bytes_per_id.value + f.bytes_per_id_with_digests.value
            - f.bytes_per_id_digest_baseline.value
    } else {
        f.bytes_per_id.value
    }
}

/// The ids a ledger of `budget_bytes` in `generations` generations holds at its lowest (a
/// generation just dropped), at `bytes_per_id`.
pub fn ids_held_at_lowest(budget_bytes: f64, generations: u32, bytes_per_id: f64) -> f64 {
    let g = f64::from(generations.max(2));
    budget_bytes * (g - 1.0) / g / bytes_per_id
}

impl Ask {
    /// Ledger bytes per id as this pipeline stores them.
    pub fn bytes_per_id(&self) -> f64 {
        planned_bytes_per_id(self.digests)
    }

    /// The budget that holds `ids` without the window ever dipping under them.
    pub fn budget_for(&self, ids: f64) -> f64 {
        let g = f64::from(self.generations.max(2));
        ids * self.bytes_per_id() * g / (g - 1.0)
    }

    /// The window a budget holds at `ids_per_sec` when it is at its lowest (a generation just
    /// dropped); `None` when no `Duration` holds it (a rate of zero, or one so near it that the
    /// window outlasts the sun).
    pub fn window_of(&self, budget_bytes: f64, ids_per_sec: f64) -> Option<Duration> {
        Duration::try_from_secs_f64(self.ids_at_lowest(budget_bytes) / ids_per_sec).ok()
    }

    /// The least rate at which the window of a budget ([`Ask::window_of`]) is a `Duration`.
    pub fn least_ids_per_sec(&self, budget_bytes: f64) -> f64 {
        self.ids_at_lowest(budget_bytes) / Duration::MAX.as_secs_f64()
    }

    /// The ids a budget holds at its lowest (a generation just dropped).
    fn ids_at_lowest(&self, budget_bytes: f64) -> f64 {
        ids_held_at_lowest(budget_bytes, self.generations, self.bytes_per_id())
    }

    /// The largest rate whose plan fits [`MAX_PARTITIONS`] at this promise: the workers the rate
    /// or the ids held take (two partitions each), or the partitions the ids held take.
    pub fn most_ids_per_sec(&self) -> f64 {
        let promise = self.promise.as_secs() as f64;
        let workers = (MAX_PARTITIONS / 2.0).floor();
        let for_rate = workers * THROUGHPUT_SHARE * FIGURES.worker_msgs_per_sec.value;
        let for_ids = workers * MAX_IDS_PER_WORKER / promise;
        let for_partitions = MAX_PARTITIONS * MAX_IDS_PER_PARTITION / promise;
        for_rate.min(for_ids).min(for_partitions)
    }

    /// What the promise costs at the rate; refused when the answer does not fit a topic.
    pub fn plan(&self) -> Result<Plan, PlanError> {
        let f = FIGURES;
        if !self.ids_per_sec.is_finite() || self.ids_per_sec <= 0.0 {
            return Err(PlanError::NotARate(self.ids_per_sec));
        }
        let promise_secs = self.promise.as_secs();
        let ids_held = self.ids_per_sec * promise_secs as f64;
        let for_rate = (self.ids_per_sec / (THROUGHPUT_SHARE * f.worker_msgs_per_sec.value)).ceil();
        let for_ids = (self.budget_for(ids_held) / self.budget_for(MAX_IDS_PER_WORKER)).ceil();
        let workers = for_rate.max(for_ids).max(1.0);
        let partitions = (2.0 * workers).max((ids_held / MAX_IDS_PER_PARTITION).ceil());
        if partitions > MAX_PARTITIONS {
            return Err(PlanError::TooLarge {
                partitions,
                most_ids_per_sec: self.most_ids_per_sec(),
            });
        }
        let per_worker_ids = ids_held / workers;
        let promise_budget = self.budget_for(per_worker_ids);
        let least = self.least_budget_bytes as f64;
        let budget = promise_budget.max(least);
        Ok(Plan {
            ids_per_sec: self.ids_per_sec,
            promise_secs,
            ids_held,
            bytes_per_id: self.bytes_per_id(),
            workers: workers as u32,
            partitions: partitions as u32,
            per_worker: PerWorker {
                ids_per_sec: self.ids_per_sec / workers,
                ids_held: per_worker_ids,
                budget_bytes: budget,
                promise_budget_bytes: promise_budget,
                budget_is_least: promise_budget < least,
                disk_bytes: 2.0 * budget,
                memory_bytes: resident_bytes(budget / self.bytes_per_id()),
            },
            changelog_bytes: self.ids_per_sec
                * self.changelog_retention.as_secs_f64()
                * f.changelog_bytes_per_id.value
                * f64::from(self.replication),
            handover_secs: handover_secs(ids_held / partitions),
        })
    }
}

/// Resident memory of a worker whose ledger holds `ids`: the line through the 100M and the
/// billion-id runs' peaks.
pub fn resident_bytes(ids: f64) -> f64 {
    let f = FIGURES;
    let per_id = (f.rss_1b_bytes.value - f.rss_100m_bytes.value) / 900e6;
    f.rss_100m_bytes.value + per_id * (ids - 100e6)
}

/// A partition's handover with `ids` in its window: the line through the 50M and 200M runs.
pub fn handover_secs(ids: f64) -> f64 {
    let f = FIGURES;
    let per_id = (f.handover_200m_secs.value - f.handover_50m_secs.value) / 150e6;
    f.handover_50m_secs.value + per_id * (ids - 50e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(ids_per_sec: f64, promise_hours: u64) -> Ask {
        Ask {
            ids_per_sec,
            promise: Duration::from_secs(promise_hours * 3600),
            changelog_retention: Duration::from_secs(7 * 86_400),
            replication: 3,
            generations: 8,
            digests: true,
            least_budget_bytes: crate::config::LedgerConfig::default().least_budget_bytes(),
        }
    }

    #[test]
    fn a_day_at_five_thousand_ids_a_second() {
        // 432M ids at 20.65 bytes each, 8/7 of that so the lowest window still holds a day.
        let p = ask(5_000.0, 24).plan().unwrap();
        assert_eq!(p.ids_held, 432e6);
        assert!((p.bytes_per_id - 20.65).abs() < 1e-9, "{}", p.bytes_per_id);
        assert_eq!(p.workers, 1);
        // 432M ids in partitions of at most 50M: 9.
        assert_eq!(p.partitions, 9);
        let budget = p.per_worker.budget_bytes;
        assert!((budget - 432e6 * 20.65 * 8.0 / 7.0).abs() < 1.0, "{budget}");
        // The budget's lowest window is the promise, exactly.
        assert!(!p.per_worker.budget_is_least);
        assert_eq!(p.per_worker.promise_budget_bytes, budget);
        let low = ask(5_000.0, 24)
            .window_of(budget, 5_000.0)
            .unwrap()
            .as_secs_f64();
        assert!((low - 86_400.0).abs() < 1e-3, "{low}");
        assert_eq!(p.per_worker.disk_bytes, 2.0 * budget);
        // The changelog: a week of ids, three replicas.
        assert!((p.changelog_bytes - 5_000.0 * 7.0 * 86_400.0 * 18.7 * 3.0).abs() < 1.0);
        // A partition of 48M ids hands over in about the 50M run's time.
        assert!(
            p.handover_secs > 7.0 && p.handover_secs < 8.25,
            "{}",
            p.handover_secs
        );
    }

    #[test]
    fn the_rate_and_the_ids_held_each_add_workers() {
        // 100k ids/s is more than half a worker's measured 141k msgs/s: two workers.
        assert_eq!(ask(100_000.0, 1).plan().unwrap().workers, 2);
        // A week at 5k ids/s is 3.0B ids: four workers of under a billion each.
        let week = ask(5_000.0, 7 * 24).plan().unwrap();
        assert_eq!(week.workers, 4);
        assert!(week.per_worker.ids_held <= MAX_IDS_PER_WORKER);
        assert!(week.partitions as f64 * MAX_IDS_PER_PARTITION >= week.ids_held);
        // No digests: 17.71 bytes per id.
        let plain = Ask {
            digests: false,
            ..ask(5_000.0, 24)
        };
        assert_eq!(plain.bytes_per_id(), 17.71);
    }

    #[test]
    fn a_budget_the_promise_needs_below_the_least_the_configuration_accepts_is_the_least() {
        // One id a second for an hour needs well under a MiB; the default ledger section takes
        // no budget under 512 MiB (its 64 MiB write buffer in each of 8 generations).
        let a = ask(1.0, 1);
        let p = a.plan().unwrap();
        let least = a.least_budget_bytes as f64;
        assert!(p.per_worker.promise_budget_bytes < 1e6, "{p:?}");
        assert_eq!(p.per_worker.budget_bytes, least);
        assert!(p.per_worker.budget_is_least);
        assert_eq!(p.per_worker.disk_bytes, 2.0 * least);
        // The least budget holds more than the promise.
        assert!(a.window_of(least, 1.0).unwrap() > a.promise);
    }

    #[test]
    fn a_rate_whose_answer_does_not_fit_a_topic_is_refused_with_the_most_it_answers() {
        // At a day's promise the partitions of 50M ids bound the rate: about 1.24e12 ids/s.
        let most = ask(1.0, 24).most_ids_per_sec();
        assert!(
            (most / (MAX_PARTITIONS * 50e6 / 86_400.0) - 1.0).abs() < 1e-12,
            "{most}"
        );
        let under = ask(most * (1.0 - 1e-6), 24).plan().unwrap();
        assert!(f64::from(under.partitions) <= MAX_PARTITIONS, "{under:?}");
        assert!(under.workers as f64 <= MAX_PARTITIONS / 2.0, "{under:?}");
        for rate in [most * (1.0 + 1e-6), 1e30] {
            match ask(rate, 24).plan() {
                Err(PlanError::TooLarge {
                    most_ids_per_sec, ..
                }) => assert_eq!(most_ids_per_sec, most),
                other => panic!("{rate}: {other:?}"),
            }
        }
        // What is no rate is refused as such.
        for rate in [f64::INFINITY, f64::NAN, 0.0, -1.0] {
            assert!(
                matches!(ask(rate, 24).plan(), Err(PlanError::NotARate(_))),
                "{rate}"
            );
        }
        // The message gives the bound.
        let e = ask(1e30, 24).plan().unwrap_err().to_string();
        assert!(e.contains("at most 1.243e12 ids per second"), "{e}");
        // At a short promise the workers the rate takes bound it first.
        let short = ask(1.0, 0).most_ids_per_sec();
        assert_eq!(short, (MAX_PARTITIONS / 2.0).floor() * 70_602.5);
        assert!(ask(short * 0.999, 0).plan().is_ok());
        assert!(ask(short * 1.001, 0).plan().is_err());
    }

    #[test]
    fn a_window_no_duration_holds_is_none() {
        let a = ask(1.0, 24);
        assert_eq!(a.window_of(16.0 * (1u64 << 30) as f64, 0.0), None);
        assert_eq!(a.window_of(16.0 * (1u64 << 30) as f64, 1e-11), None);
        assert!(a.window_of(16.0 * (1u64 << 30) as f64, 1e-3).is_some());
        // Just above the least rate the window is a Duration.
        let least = a.least_ids_per_sec(16.0 * (1u64 << 30) as f64);
        assert!(a
            .window_of(16.0 * (1u64 << 30) as f64, least * 1.001)
            .is_some());
        assert_eq!(a.window_of(16.0 * (1u64 << 30) as f64, least * 0.999), None);
    }

    #[test]
    fn the_lines_through_the_measurements_meet_them() {
        assert!((handover_secs(50e6) - 8.25).abs() < 1e-9);
        assert!((handover_secs(200e6) - 26.87).abs() < 1e-9);
        // An empty partition still pays the line's fixed part (the rebalance, the fence): about 2 s.
        assert!(
            (handover_secs(0.0) - 2.04).abs() < 0.01,
            "{}",
            handover_secs(0.0)
        );
        assert!((resident_bytes(100e6) - 1_123_303_424.0).abs() < 1.0);
        assert!((resident_bytes(1e9) - 6.05e9).abs() < 1.0);
    }
}

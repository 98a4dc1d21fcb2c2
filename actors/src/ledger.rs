//! `LedgerActor` owns the worker's one RocksDB ledger. It runs on a `SyncArbiter`, so blocking
//! RocksDB calls never run on the async executor; its mailbox is actix's crossbeam channel, and
//! callers bound what is in flight (one batch per partition). The pipeline's messages
//! ([`Lookup`], [`CheckAndRecord`], [`MarkIds`]) are answered through the core's
//! [`dedupe::store::IdStore`]; the rest are the ledger's own (retention, stats, checkpoints).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use actix::prelude::*;
use dedupe::identity::LedgerKey;
use dedupe::ledger::{Ledger, LedgerError, LedgerStats, Mark, MarkOrder, Verdict};
use dedupe::progress::Progress;
pub use dedupe::store::Looked;
use dedupe::store::{IdStore, NewId};

pub struct LedgerActor {
    ledger: Arc<Ledger>,
}

impl LedgerActor {
    pub fn new(ledger: Arc<Ledger>) -> Self {
        Self { ledger }
    }
}

impl Actor for LedgerActor {
    type Context = SyncContext<Self>;
}

/// Looks ids up without recording them: what the ledger holds of each id held, and which of
/// them an operator had forgotten (they are not held, on any of the worker's partitions).
#[derive(Message)]
#[rtype(result = "Result<Looked, LedgerError>")]
pub struct Lookup {
    pub keys: Vec<LedgerKey>,
}

impl Handler<Lookup> for LedgerActor {
    type Result = Result<Looked, LedgerError>;
    fn handle(&mut self, msg: Lookup, _: &mut Self::Context) -> Self::Result {
        self.ledger.look_up(&msg.keys)
    }
}

/// Marks ids as the newest word on them (a forget just committed).
#[derive(Message)]
#[rtype(result = "Result<(), LedgerError>")]
pub struct MarkIds {
    pub marks: Vec<(LedgerKey, Mark)>,
}

impl Handler<MarkIds> for LedgerActor {
    type Result = Result<(), LedgerError>;
    fn handle(&mut self, msg: MarkIds, _: &mut Self::Context) -> Self::Result {
        IdStore::mark(&*self.ledger, &msg.marks, MarkOrder::Newest)
    }
}

/// Checks a batch's ids (key, first-seen ms, content digest) and records the new ones with the
/// partition's progress, atomically; answers each id's verdict.
#[derive(Message)]
#[rtype(result = "Result<Vec<Verdict>, LedgerError>")]
pub struct CheckAndRecord {
    pub partition: i32,
    pub items: Vec<NewId>,
    /// `None` leaves the partition's progress record as it is (a background load of older ids).
    pub progress: Option<Progress>,
    /// Marks that take effect with the batch (forgotten ids published again: resent).
    pub marks: Vec<(LedgerKey, Mark)>,
}

impl Handler<CheckAndRecord> for LedgerActor {
    type Result = Result<Vec<Verdict>, LedgerError>;
    fn handle(&mut self, msg: CheckAndRecord, _: &mut Self::Context) -> Self::Result {
        fail::fail_point!("ledger-before-record", |_| {
            eprintln!("failpoint ledger-before-record: exiting");
            std::process::exit(86)
        });
        let progress = msg
            .progress
            .map(|p| p.encode().to_vec())
            .unwrap_or_default();
        self.ledger
            .record(msg.partition, &msg.items, &progress, &msg.marks)
    }
}

/// Applies the retention limit at `now_ms`, held back by the partitions `behind` (see
/// `dedupe::ledger::Ledger::expire_behind`).
#[derive(Message)]
#[rtype(result = "Result<dedupe::ledger::Expired, LedgerError>")]
pub struct Expire {
    pub now_ms: i64,
    pub behind: Vec<i32>,
}

impl Handler<Expire> for LedgerActor {
    type Result = Result<dedupe::ledger::Expired, LedgerError>;
    fn handle(&mut self, msg: Expire, _: &mut Self::Context) -> Self::Result {
        self.ledger.expire_behind(msg.now_ms, &msg.behind)
    }
}

/// The ledger's stats and, per partition, its window at `now_ms`.
#[derive(Message)]
#[rtype(result = "Result<StatsReport, LedgerError>")]
pub struct Stats {
    pub partitions: Vec<i32>,
    pub now_ms: i64,
}

pub struct StatsReport {
    pub stats: LedgerStats,
    pub windows: Vec<(i32, Option<std::time::Duration>)>,
    /// Per partition (in the order of `windows`): whether only the retention limit bounds its
    /// window (`Ledger::window_limited`).
    pub limited: Vec<bool>,
}

impl Handler<Stats> for LedgerActor {
    type Result = Result<StatsReport, LedgerError>;
    fn handle(&mut self, msg: Stats, _: &mut Self::Context) -> Self::Result {
        let stats = self.ledger.stats()?;
        let windows = msg
            .partitions
            .iter()
            .map(|&p| (p, self.ledger.window(p, msg.now_ms)))
            .collect();
        let limited = msg
            .partitions
            .iter()
            .map(|&p| self.ledger.window_limited(p, msg.now_ms))
            .collect();
        Ok(StatsReport {
            stats,
            windows,
            limited,
        })
    }
}

/// A consistent checkpoint (hard links) into `dir`; returns the progress records it holds.
#[derive(Message)]
#[rtype(result = "Result<BTreeMap<dedupe::Partition, Vec<u8>>, LedgerError>")]
pub struct Checkpoint {
    pub dir: PathBuf,
}

impl Handler<Checkpoint> for LedgerActor {
    type Result = Result<BTreeMap<dedupe::Partition, Vec<u8>>, LedgerError>;
    fn handle(&mut self, msg: Checkpoint, _: &mut Self::Context) -> Self::Result {
        self.ledger.checkpoint(&msg.dir)
    }
}

/// Flushes memtables to disk (on shutdown, so a clean stop replays nothing).
#[derive(Message)]
#[rtype(result = "Result<(), LedgerError>")]
pub struct Flush;

impl Handler<Flush> for LedgerActor {
    type Result = Result<(), LedgerError>;
    fn handle(&mut self, _: Flush, _: &mut Self::Context) -> Self::Result {
        self.ledger.flush()
    }
}

//! Forgotten ids: an id an operator asked the ledger to forget answers "not held" until its next
//! copy is published, whatever its generations still hold.
//!
//! An id is never deleted from its generation (there are no per-key deletes, see the module
//! docs); a *mark* says how to read it instead. Each mark is one of the id changelog's marker
//! records (see [`crate::changelog::Mark`]): [`MarkKind::Forgotten`] (an operator's forget) or
//! [`MarkKind::Resent`] (the first copy after a forget was published and recorded again), with
//! the changelog offset that record has. Marks are applied in changelog order: a mark read from
//! the log replaces the one held only if its offset is higher, so a back-fill that reads older
//! records after newer ones never brings back a forget that a re-send already ended.
//!
//! Marks are per input partition: a forget is written to the changelog of each partition the id
//! may be on (see `dedupe_actors::http::forget`), and offsets order the marks of one partition.
//!
//! Stored in [`CF_META`] under `forget/<partition i32 BE><16-byte key>` (value: partition i32,
//! kind u8, offset i64, marked-at ms i64, all little-endian), written with the WAL and synced before the call returns
//! (flushed, without a WAL): a mark is durable before the batch that depends on it is recorded.
//! Read whole on open; dropped with the last generation holding their id (see `prune_marks`),
//! and a partition's all when it is loaded anew. Code that predates marks ignores these keys.

use std::collections::HashMap;

use rocksdb::WriteBatch;

use super::error::{rocks, Doing};
use super::{Durability, Ledger, LedgerError, Result, State, CF_META};
use crate::identity::{LedgerKey, LEDGER_KEY_BYTES};
use crate::Partition;

const MARK_PREFIX: &[u8] = b"forget/";
const MARK_VALUE_BYTES: usize = 4 + 1 + 8 + 8;

/// What a mark says of its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    /// Forgotten: the ledger answers "not held" for it, and its next copy is published.
    Forgotten,
    /// Published again after a forget: held as any id is.
    Resent,
}

/// One id's mark: what it says, the changelog offset of its marker record, and when it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Mark {
    pub partition: Partition,
    pub kind: MarkKind,
    pub changelog_offset: i64,
    pub at_ms: i64,
}

/// The marks held, by partition and key.
pub(super) type Marks = HashMap<(Partition, LedgerKey), Mark>;

/// How marks are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkOrder {
    /// Marks read back from the changelog: each replaces the one held only if its offset is
    /// higher.
    ByOffset,
    /// Marks just written by this worker: the newest, whatever is held.
    Newest,
}

impl Ledger {
    /// Applies `marks` durably, each to its partition's id (see the module docs).
    pub fn mark(&self, marks: &[(LedgerKey, Mark)], order: MarkOrder) -> Result<()> {
        let mut state = self.lock();
        self.apply_marks(&mut state, marks, order)
    }

    /// Drops every mark of `partition` (its ids are loaded again from the whole changelog,
    /// whose marker records bring back the marks that still hold).
    pub fn clear_marks(&self, partition: Partition) -> Result<()> {
        let mut state = self.lock();
        let gone: Vec<(Partition, LedgerKey)> = state
            .marks
            .keys()
            .filter(|(p, _)| *p == partition)
            .copied()
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        let meta = self.cf(CF_META)?;
        let mut batch = WriteBatch::default();
        for (p, key) in &gone {
            batch.delete_cf(&meta, mark_key(*p, key));
        }
        self.write_marks(batch)?;
        for k in &gone {
            state.marks.remove(k);
        }
        Ok(())
    }

    /// The marks of `key`, on every partition that has one.
    pub fn marks_of(&self, key: &LedgerKey) -> Vec<Mark> {
        let state = self.lock();
        let mut marks: Vec<Mark> = state
            .marks
            .iter()
            .filter(|((_, k), _)| k == key)
            .map(|(_, m)| *m)
            .collect();
        marks.sort_by_key(|m| m.partition);
        marks
    }

    /// How many marks are held, of each kind: (forgotten, resent).
    pub fn mark_counts(&self) -> (u64, u64) {
        let state = self.lock();
        let forgotten = state
            .marks
            .values()
            .filter(|m| m.kind == MarkKind::Forgotten)
            .count() as u64;
        (forgotten, state.marks.len() as u64 - forgotten)
    }

    pub(super) fn apply_marks(
        &self,
        state: &mut State,
        marks: &[(LedgerKey, Mark)],
        order: MarkOrder,
    ) -> Result<()> {
        let newer = |key: &LedgerKey, mark: &Mark| {
            order == MarkOrder::Newest
                || state
                    .marks
                    .get(&(mark.partition, *key))
                    .is_none_or(|held| mark.changelog_offset > held.changelog_offset)
        };
        let applied: Vec<((Partition, LedgerKey), Mark)> = marks
            .iter()
            .filter(|(k, m)| newer(k, m))
            .map(|(k, m)| ((m.partition, *k), *m))
            .collect();
        if applied.is_empty() {
            return Ok(());
        }
        let meta = self.cf(CF_META)?;
        let mut batch = WriteBatch::default();
        for ((partition, key), mark) in &applied {
            batch.put_cf(&meta, mark_key(*partition, key), encode_mark(mark));
        }
        self.write_marks(batch)?;
        state.marks.extend(applied);
        Ok(())
    }

    /// Drops the marks of ids the ledger no longer holds (their generations aged out): a forget
    /// of an id not held changes nothing, and a re-send's mark has nothing left to order. Called
    /// after generations are dropped, so the marks stay within the window's ids.
    pub(super) fn prune_marks(&self, state: &mut State) -> Result<()> {
        if state.marks.is_empty() {
            return Ok(());
        }
        let mut keys: Vec<LedgerKey> = state.marks.keys().map(|(_, k)| *k).collect();
        keys.sort_unstable();
        keys.dedup();
        let held = self.lookup_sorted(state, &keys)?;
        let gone: std::collections::HashSet<LedgerKey> = keys
            .iter()
            .zip(&held)
            .filter(|(_, h)| h.is_none())
            .map(|(k, _)| *k)
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        let stale: Vec<(Partition, LedgerKey)> = state
            .marks
            .keys()
            .filter(|(_, k)| gone.contains(k))
            .copied()
            .collect();
        let meta = self.cf(CF_META)?;
        let mut batch = WriteBatch::default();
        for (p, key) in &stale {
            batch.delete_cf(&meta, mark_key(*p, key));
        }
        drop(meta);
        self.write_marks(batch)?;
        for k in &stale {
            state.marks.remove(k);
        }
        Ok(())
    }

    /// Writes marks durably: synced with a WAL, flushed without one.
    fn write_marks(&self, batch: WriteBatch) -> Result<()> {
        self.db
            .write_opt(batch, &self.sync_write_options())
            .map_err(rocks(Doing::Write))?;
        if self.options.durability == Durability::NoWal {
            self.flush_cfs(&[CF_META], true)?;
        }
        Ok(())
    }

    /// Every mark stored, read on open.
    pub(super) fn read_marks(&self) -> Result<Marks> {
        let meta = self.cf(CF_META)?;
        let mut marks = Marks::new();
        for item in self.db.prefix_iterator_cf(&meta, MARK_PREFIX) {
            let (key, value) = item.map_err(rocks(Doing::Read))?;
            let Some(rest) = key.strip_prefix(MARK_PREFIX) else {
                break;
            };
            let corrupt = || LedgerError::CorruptMetadata {
                what: format!(
                    "a forget mark with a key of {} bytes and a value of {} bytes",
                    key.len(),
                    value.len()
                ),
            };
            let id: [u8; LEDGER_KEY_BYTES] = rest
                .get(4..)
                .and_then(|id| id.try_into().ok())
                .ok_or_else(corrupt)?;
            let mark = decode_mark(&value).ok_or_else(corrupt)?;
            marks.insert((mark.partition, LedgerKey(id)), mark);
        }
        Ok(marks)
    }
}

/// Turns what `found` says of the ids forgotten on `partition` into "not held"; returns those
/// ids. `keys` and `found` are in the same order.
pub(super) fn forget_override(
    state: &State,
    partition: Partition,
    keys: &[LedgerKey],
    found: &mut [Option<super::Held>],
) -> Vec<LedgerKey> {
    if state.marks.is_empty() {
        return Vec::new();
    }
    let mut forgotten = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let mark = state.marks.get(&(partition, *key));
        if mark.is_some_and(|m| m.kind == MarkKind::Forgotten) {
            found[i] = None;
            forgotten.push(*key);
        }
    }
    forgotten
}

fn mark_key(partition: Partition, key: &LedgerKey) -> Vec<u8> {
    let mut out = MARK_PREFIX.to_vec();
    out.extend_from_slice(&partition.to_be_bytes());
    out.extend_from_slice(key.as_bytes());
    out
}

fn encode_mark(mark: &Mark) -> [u8; MARK_VALUE_BYTES] {
    let mut out = [0u8; MARK_VALUE_BYTES];
    out[..4].copy_from_slice(&mark.partition.to_le_bytes());
    out[4] = match mark.kind {
        MarkKind::Forgotten => 1,
        MarkKind::Resent => 2,
    };
    out[5..13].copy_from_slice(&mark.changelog_offset.to_le_bytes());
    out[13..].copy_from_slice(&mark.at_ms.to_le_bytes());
    out
}

fn decode_mark(value: &[u8]) -> Option<Mark> {
    if value.len() != MARK_VALUE_BYTES {
        return None;
    }
    let kind = match value[4] {
        1 => MarkKind::Forgotten,
        2 => MarkKind::Resent,
        _ => return None,
    };
    Some(Mark {
        partition: i32::from_le_bytes(value[..4].try_into().ok()?),
        kind,
        changelog_offset: i64::from_le_bytes(value[5..13].try_into().ok()?),
        at_ms: i64::from_le_bytes(value[13..].try_into().ok()?),
    })
}

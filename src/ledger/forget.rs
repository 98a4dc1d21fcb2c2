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
//! Marks are stored per input partition, as their marker records are: a forget is written to the
//! changelog of each partition the id may be on (see `dedupe_cli::http::forget_route`), and offsets
//! order the marks of one partition. They are **read per id**, because a worker's partitions share
//! this one ledger (an id seen on one is dropped on the others): an id is forgotten, on every
//! partition, while its newest forget is newer than its newest re-send on any partition
//! ([`forgotten_since`]). So the first copy through, on whichever partition it arrives, ends the
//! forget everywhere, and the copy after it is dropped wherever it arrives. Times order marks of
//! different partitions: a forget request takes one time for all its partitions, later than any
//! re-send of its ids the ledger holds, and a re-send's time is never earlier than the forget it
//! ends (both are written into the marker records, so a ledger loaded from the changelog reads
//! the same order). A re-send's transaction writes its marker to the changelog of each other
//! partition its forget was written to as well ([`crate::output::Batch::other_marks`]), so a
//! partition loaded alone, into another worker's ledger, reads its forget ended.
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

/// The marks held, by key: at most one per partition (the newest by changelog offset), sorted by
/// partition.
pub(super) type Marks = HashMap<LedgerKey, Vec<Mark>>;

/// Since when an id whose marks are `marks` is forgotten: the time of its newest forget, if that
/// is newer than its newest re-send on any partition (see the module docs); `None` when the id
/// is held as any id is.
pub fn forgotten_since(marks: &[Mark]) -> Option<i64> {
    let newest = |kind: MarkKind| {
        marks
            .iter()
            .filter(|m| m.kind == kind)
            .map(|m| m.at_ms)
            .max()
    };
    let forgotten = newest(MarkKind::Forgotten)?;
    newest(MarkKind::Resent)
        .is_none_or(|resent| resent < forgotten)
        .then_some(forgotten)
}

/// A forgotten id, as a lookup finds it: since when (its newest forget), and the partitions whose
/// changelogs hold that forget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forgotten {
    pub key: LedgerKey,
    pub at_ms: i64,
    pub partitions: Vec<Partition>,
}

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
        let gone: Vec<LedgerKey> = state
            .marks
            .iter()
            .filter(|(_, marks)| marks.iter().any(|m| m.partition == partition))
            .map(|(k, _)| *k)
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        let meta = self.cf(CF_META)?;
        let mut batch = WriteBatch::default();
        for key in &gone {
            batch.delete_cf(&meta, mark_key(partition, key));
        }
        self.write_marks(batch)?;
        for key in &gone {
            if let Some(marks) = state.marks.get_mut(key) {
                marks.retain(|m| m.partition != partition);
                if marks.is_empty() {
                    state.marks.remove(key);
                }
            }
        }
        Ok(())
    }

    /// The marks of `key`, on every partition that has one, by partition.
    pub fn marks_of(&self, key: &LedgerKey) -> Vec<Mark> {
        self.lock().marks.get(key).cloned().unwrap_or_default()
    }

    /// The time of the newest re-send of any of `keys` (`None`: none has one). A forget of them
    /// must be newer to be in force (see [`forgotten_since`]).
    pub fn newest_resent_ms(&self, keys: &[LedgerKey]) -> Option<i64> {
        let state = self.lock();
        keys.iter()
            .filter_map(|k| state.marks.get(k))
            .flatten()
            .filter(|m| m.kind == MarkKind::Resent)
            .map(|m| m.at_ms)
            .max()
    }

    /// How many ids have marks, by what they say: (forgotten: the forget is in force; resent:
    /// a copy was published since the forget, on any partition).
    pub fn mark_counts(&self) -> (u64, u64) {
        let state = self.lock();
        let forgotten = state
            .marks
            .values()
            .filter(|m| forgotten_since(m).is_some())
            .count() as u64;
        (forgotten, state.marks.len() as u64 - forgotten)
    }

    pub(super) fn apply_marks(
        &self,
        state: &mut State,
        marks: &[(LedgerKey, Mark)],
        order: MarkOrder,
    ) -> Result<()> {
        // Per key and partition, the last of `marks` that is newer than the mark held.
        let mut latest: HashMap<(LedgerKey, Partition), Mark> = HashMap::new();
        for (key, mark) in marks {
            let held = state
                .marks
                .get(key)
                .and_then(|ms| ms.iter().find(|m| m.partition == mark.partition));
            let newer = order == MarkOrder::Newest
                || held.is_none_or(|held| mark.changelog_offset > held.changelog_offset);
            if newer {
                latest.insert((*key, mark.partition), *mark);
            }
        }
        if latest.is_empty() {
            return Ok(());
        }
        let meta = self.cf(CF_META)?;
        let mut batch = WriteBatch::default();
        for ((key, partition), mark) in &latest {
            batch.put_cf(&meta, mark_key(*partition, key), encode_mark(mark));
        }
        self.write_marks(batch)?;
        for ((key, _), mark) in latest {
            let marks = state.marks.entry(key).or_default();
            match marks.iter_mut().find(|m| m.partition == mark.partition) {
                Some(held) => *held = mark,
                None => {
                    marks.push(mark);
                    marks.sort_by_key(|m| m.partition);
                }
            }
        }
        Ok(())
    }

    /// Drops the marks of ids the ledger no longer holds (their generations aged out): a forget
    /// of an id not held changes nothing, and a re-send's mark has nothing left to order. Called
    /// after generations are dropped, so the marks stay within the window's ids.
    pub(super) fn prune_marks(&self, state: &mut State) -> Result<()> {
        if state.marks.is_empty() {
            return Ok(());
        }
        let mut keys: Vec<LedgerKey> = state.marks.keys().copied().collect();
        keys.sort_unstable();
        let held = self.lookup_sorted(state, &keys)?;
        let gone: Vec<LedgerKey> = keys
            .iter()
            .zip(&held)
            .filter(|(_, h)| h.is_none())
            .map(|(k, _)| *k)
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        let meta = self.cf(CF_META)?;
        let mut batch = WriteBatch::default();
        for key in &gone {
            for m in state.marks.get(key).into_iter().flatten() {
                batch.delete_cf(&meta, mark_key(m.partition, key));
            }
        }
        drop(meta);
        self.write_marks(batch)?;
        for key in &gone {
            state.marks.remove(key);
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
            let of_id = marks.entry(LedgerKey(id)).or_default();
            of_id.push(mark);
            of_id.sort_by_key(|m| m.partition);
        }
        Ok(marks)
    }
}

/// Turns what `found` says of the forgotten ids into "not held" (whichever partition asks: see
/// the module docs); returns those ids. `keys` and `found` are in the same order.
pub(super) fn forget_override(
    state: &State,
    keys: &[LedgerKey],
    found: &mut [Option<super::Held>],
) -> Vec<Forgotten> {
    if state.marks.is_empty() {
        return Vec::new();
    }
    let mut forgotten = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let Some(marks) = state.marks.get(key) else {
            continue;
        };
        if let Some(at_ms) = forgotten_since(marks) {
            found[i] = None;
            forgotten.push(Forgotten {
                key: *key,
                at_ms,
                partitions: marks
                    .iter()
                    .filter(|m| m.kind == MarkKind::Forgotten && m.at_ms == at_ms)
                    .map(|m| m.partition)
                    .collect(),
            });
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

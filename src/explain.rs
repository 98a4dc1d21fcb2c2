//! Explaining one id: whether the ledger holds it (so a copy arriving now is dropped), when it was
//! first seen, which generation holds it, how far back the window reaches, and, when it is not
//! held, why. The worker answers `GET /admin/ids/{id}` with this, and `dedupe explain` prints it
//! (asking the worker, or reading a stopped worker's ledger).
//!
//! Why an id is not held cannot be read from the ledger alone: a forgotten id leaves no trace. The
//! asker may say when the id was first sent (`sent_at_ms`); an id sent before the window's start
//! aged out, one sent after it was never seen here. Without that, the answer names both.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::identity::{ledger_key, IdError};
use crate::ledger::{Ledger, LedgerError, Sighting};

/// What is asked about one id.
#[derive(Debug, Clone, Copy)]
pub struct Question<'a> {
    /// The message id, as the client sent it.
    pub id: &'a str,
    /// The input partition the id belongs to, when known (ids read from the record key,
    /// partitioned as Kafka's clients do).
    pub partition: Option<i32>,
    /// Whether this worker owns that partition; `None` when not known (a stopped worker's ledger).
    pub owned: Option<bool>,
    /// When the asker says the id was first sent, ms since the epoch.
    pub sent_at_ms: Option<i64>,
    pub now_ms: i64,
}

/// Why an id is not held, or not asked about (`not_owned`, `aged_out`, `never_seen`,
/// `not_in_window` in the answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The id's partition is not this worker's.
    NotOwned,
    /// Sent before the window's start.
    AgedOut,
    /// Sent inside the window and never seen here.
    NeverSeen,
    /// Not held, and nothing tells never seen from aged out.
    NotInWindow,
}

/// The answer, one JSON object; `sentence` says it in words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    pub id: String,
    pub ledger_key: String,
    pub partition: Option<i32>,
    pub owned: Option<bool>,
    /// A copy arriving now would be dropped.
    pub held: bool,
    pub first_seen_ms: Option<i64>,
    /// The generation holding the copy a lookup finds (the newest).
    pub generation: Option<u64>,
    /// Every copy held, newest first.
    pub copies: Vec<Sighting>,
    /// How far back the window reaches: the partition's when it is known, else the ledger's.
    pub window_secs: Option<f64>,
    pub window_start_ms: Option<i64>,
    /// Why it is not held; `None` when it is.
    pub reason: Option<Reason>,
    pub sentence: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("not a message id: {0}")]
    Id(#[from] IdError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// Explains `q.id` from `ledger`.
pub fn explain(ledger: &Ledger, q: &Question<'_>) -> Result<Answer, ExplainError> {
    let key = ledger_key(q.id.as_bytes())?;
    let ledger_key = key.hex();
    if q.owned == Some(false) {
        let p = q.partition.unwrap_or(-1);
        return Ok(Answer {
            id: q.id.to_string(),
            ledger_key,
            partition: q.partition,
            owned: Some(false),
            held: false,
            first_seen_ms: None,
            generation: None,
            copies: Vec::new(),
            window_secs: None,
            window_start_ms: None,
            reason: Some(Reason::NotOwned),
            sentence: format!("Id {} belongs to input partition {p}, which this worker does not own; ask the worker that owns partition {p}.", q.id),
        });
    }
    let copies = ledger.sightings(&key)?;
    let window = match q.partition {
        Some(p) => ledger.window(p, q.now_ms),
        None => ledger.window_overall(q.now_ms),
    };
    let window_start_ms = window.map(|w| q.now_ms - w.as_millis() as i64);
    let whose = q.partition.map_or("the ledger's".to_string(), |p| format!("partition {p}'s"));
    let reach = match (window, window_start_ms) {
        (Some(w), Some(start)) => format!("{whose} window reaches back {} (to {})", span(w), when(start)),
        _ => format!("{whose} window is empty: the ledger holds none of its ids"),
    };
    let (reason, sentence) = match copies.first() {
        Some(s) => (
            None,
            format!(
                "Id {} is in the window: first seen {} ({} ago), held in generation {}; {reach}. A copy arriving now is dropped.",
                q.id,
                when(s.first_seen_ms),
                span(Duration::from_millis((q.now_ms - s.first_seen_ms).max(0) as u64)),
                s.generation
            ),
        ),
        None => match (q.sent_at_ms, window_start_ms) {
            (Some(sent), Some(start)) if sent < start => (
                Some(Reason::AgedOut),
                format!("Id {} is not held: sent at {}, before the window's start, so it aged out; {reach}. A copy arriving now is published.", q.id, when(sent)),
            ),
            (Some(sent), _) => (
                Some(Reason::NeverSeen),
                format!("Id {} is not held: sent at {}, inside the window, and never seen here; {reach}. A copy arriving now is published.", q.id, when(sent)),
            ),
            (None, _) => (
                Some(Reason::NotInWindow),
                format!(
                    "Id {} is not held: never seen here, or first seen before the window's start and aged out (give the time it was sent to tell which); {reach}. A copy arriving now is published.",
                    q.id
                ),
            ),
        },
    };
    Ok(Answer {
        id: q.id.to_string(),
        ledger_key,
        partition: q.partition,
        owned: q.owned,
        held: !copies.is_empty(),
        first_seen_ms: copies.first().map(|s| s.first_seen_ms),
        generation: copies.first().map(|s| s.generation),
        window_secs: window.map(|w| w.as_secs_f64()),
        window_start_ms,
        copies,
        reason,
        sentence,
    })
}

/// A time as RFC 3339, to the second.
fn when(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t.min(SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799))).to_string()
}

/// A duration in the unit that reads best.
fn span(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::LedgerOptions;

    const HOUR: i64 = 3_600_000;
    const ID: &str = "6ba7b810-9dad-41d1-80b4-00c04fd430c8";

    fn ledger_with(ids: &[(&str, i64)]) -> (tempfile::TempDir, Ledger) {
        let dir = tempfile::tempdir().unwrap();
        let options = LedgerOptions { budget_bytes: 256 << 20, write_buffer_bytes: 1 << 20, block_cache_bytes: 1 << 20, ..LedgerOptions::default() };
        let ledger = Ledger::open(dir.path(), options).unwrap();
        let items: Vec<_> = ids.iter().map(|(id, t)| (ledger_key(id.as_bytes()).unwrap(), *t)).collect();
        ledger.check_and_record(0, &items, b"").unwrap();
        (dir, ledger)
    }

    fn ask(id: &str, sent_at_ms: Option<i64>, now_ms: i64) -> Question<'_> {
        Question { id, partition: Some(0), owned: Some(true), sent_at_ms, now_ms }
    }

    #[test]
    fn a_held_id_names_its_first_sighting_generation_and_the_window() {
        let now = 100 * HOUR;
        let (_dir, ledger) = ledger_with(&[("other", now - 5 * HOUR), (ID, now - 2 * HOUR)]);
        let a = explain(&ledger, &ask(ID, None, now)).unwrap();
        assert!(a.held);
        assert_eq!(a.first_seen_ms, Some(now - 2 * HOUR));
        assert_eq!(a.ledger_key, "6ba7b8109dad41d180b400c04fd430c8");
        assert_eq!(a.copies.len(), 1);
        assert_eq!(a.generation, Some(a.copies[0].generation));
        assert_eq!(a.window_start_ms, Some(now - 5 * HOUR), "the oldest id held");
        assert_eq!(a.reason, None);
        assert!(a.sentence.contains("is in the window") && a.sentence.contains("2.0 h ago") && a.sentence.contains("dropped"), "{}", a.sentence);
    }

    #[test]
    fn an_id_not_held_is_aged_out_or_never_seen_by_when_it_was_sent_and_both_without() {
        let now = 100 * HOUR;
        let (_dir, ledger) = ledger_with(&[("other", now - 5 * HOUR)]);
        let aged = explain(&ledger, &ask(ID, Some(now - 30 * HOUR), now)).unwrap();
        assert_eq!((aged.held, aged.reason), (false, Some(Reason::AgedOut)));
        let never = explain(&ledger, &ask(ID, Some(now - HOUR), now)).unwrap();
        assert_eq!(never.reason, Some(Reason::NeverSeen));
        let unknown = explain(&ledger, &ask(ID, None, now)).unwrap();
        assert_eq!(unknown.reason, Some(Reason::NotInWindow));
        assert!(unknown.sentence.contains("never seen here, or first seen before"), "{}", unknown.sentence);
        assert!(unknown.sentence.contains("published"));
    }

    #[test]
    fn an_id_of_a_partition_the_worker_does_not_own_names_that_partition() {
        let (_dir, ledger) = ledger_with(&[]);
        let q = Question { id: ID, partition: Some(7), owned: Some(false), sent_at_ms: None, now_ms: HOUR };
        let a = explain(&ledger, &q).unwrap();
        assert_eq!((a.reason, a.partition), (Some(Reason::NotOwned), Some(7)));
        assert!(a.sentence.contains("ask the worker that owns partition 7"), "{}", a.sentence);
        assert!(matches!(explain(&ledger, &ask("", None, HOUR)), Err(ExplainError::Id(IdError::Empty))));
    }
}

//! Explaining one id: whether the ledger holds it (so a copy arriving now is dropped), when it was
//! first seen, which generation holds it, how far back the window reaches, and, when it is not
//! held, why. The worker answers `GET /admin/ids/{id}` with this, and `dedupe explain` prints it
//! (asking the worker, or reading a stopped worker's ledger).
//!
//! Ids the front door writes are scoped by source: its records are keyed `<source>:<messageId>`
//! and the ledger holds that whole key ([`crate::wire::scoped_id`]). A question names the
//! source, or asks about the id as the worker read it; an answer about a bare id that is not held
//! says how to ask with a source.
//!
//! An id is keyed as the worker keys it ([`crate::identity::named_id`]): named as one JSON value
//! (`json`), a number is the number a `json:` id source read, not the string of its digits; named
//! as text where the id source reads JSON and the text is a number, the question is refused with
//! both ways to ask, never answered about the string.
//!
//! Why an id is not held cannot be read from the ledger alone: a forgotten id leaves no trace. The
//! asker may say when the id was first sent (`sent_at_ms`); an id sent before the window's start
//! aged out, one sent after it was never seen here. Without that, the answer names both.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::identity::{named_id, IdSource, LedgerKey, Named, NamedId, NamedIdError};
use crate::ledger::{
    forgotten_since, past_limit, Ledger, LedgerError, LedgerOptions, MarkKind, Sighting,
};
use crate::output::DeadLetterAt;
use crate::wire::SOURCE_SEPARATOR;

/// What is asked about one id.
#[derive(Debug, Clone, Copy)]
pub struct Question<'a> {
    /// The message id, as the client sent it (with `source`), or as the worker reads it.
    pub id: &'a str,
    /// The front door's source that sent `id` (the write key's source name): the worker holds
    /// `<source>:<id>`.
    pub source: Option<&'a str>,
    /// `id` is the text of one JSON value (`12345678901234567890`, `"abc"`), keyed as a `json:`
    /// id source keys it.
    pub json: bool,
    /// Where the worker reads ids from: whether a number can be a JSON number there.
    pub id_source: &'a IdSource,
    /// The input partition the id belongs to, when known (ids read from the record key,
    /// partitioned as Kafka's clients do).
    pub partition: Option<i32>,
    /// Whether this worker owns that partition; `None` when not known (a stopped worker's ledger).
    pub owned: Option<bool>,
    /// When the asker says the id was first sent, ms since the epoch.
    pub sent_at_ms: Option<i64>,
    pub now_ms: i64,
}

impl Question<'_> {
    /// The id asked about as the worker holds it, or why it cannot be asked about as named.
    pub fn named(&self) -> Result<Named, NamedIdError> {
        let named = if self.json {
            NamedId::Json(self.id)
        } else {
            NamedId::Text(self.id)
        };
        named_id(named, self.source, self.id_source)
    }
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
    /// An operator forgot it (`dedupe forget`): its next copy is published.
    Forgotten,
    /// Its last sighting is older than the retention limit (`ledger.max_window_secs`): its next
    /// copy is published, and its bytes go with their generation.
    PastLimit,
}

/// A forget that still holds, written to `partition`'s changelog: the id's next copy, on any of
/// the worker's partitions (they share its ledger), is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForgottenOn {
    pub partition: i32,
    pub at_ms: i64,
}

/// The answer, one JSON object; `sentence` says it in words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// The id asked about, as given.
    pub id: String,
    /// The source named, if any.
    #[serde(default)]
    pub source: Option<String>,
    /// The id as the worker reads it (`<source>:<id>` with a source; a JSON string's decoded
    /// text, a JSON number's text).
    #[serde(default)]
    pub key: String,
    /// Asked as a JSON number (`--json-id`): its ledger key is the number's, not the string's.
    #[serde(default)]
    pub json_number: bool,
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
    /// Every id first seen since `window_start_ms` is held; a held id's first sighting is never
    /// before it (an older id the ledger still holds moves the start back to it).
    pub window_secs: Option<f64>,
    pub window_start_ms: Option<i64>,
    /// Why it is not held; `None` when it is.
    pub reason: Option<Reason>,
    /// The forgets in force (one per partition the forget was written to): the id's next copy,
    /// on any of the worker's partitions, is published. Empty once a copy went through.
    #[serde(default)]
    pub forgotten: Vec<ForgottenOn>,
    /// With `ledger.refresh_on_duplicate` and more than one copy held: the newest copy's time,
    /// recorded by a dropped copy that refreshed the id.
    #[serde(default)]
    pub last_refreshed_ms: Option<i64>,
    /// A held id whose record the output refused: where its dead letter is
    /// ([`with_dead_letter`]).
    #[serde(default)]
    pub dead_letter: Option<DeadLetterAt>,
    pub sentence: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// Not asked about: the id named is no id, or names two (see [`NamedIdError`]).
    #[error(transparent)]
    Id(#[from] NamedIdError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// Explains `q.id` from `ledger`.
pub fn explain(ledger: &Ledger, q: &Question<'_>) -> Result<Answer, ExplainError> {
    let named = q.named()?;
    let key = named.key;
    // The sentence says which of a number and its string was asked about.
    let id = if named.json_number {
        format!("{} (a JSON number)", named.id)
    } else {
        named.id.clone()
    };
    let mut answer = Answer {
        id: q.id.to_string(),
        source: q.source.map(str::to_string),
        key: named.id,
        json_number: named.json_number,
        ledger_key: key.hex(),
        partition: q.partition,
        owned: q.owned,
        held: false,
        first_seen_ms: None,
        generation: None,
        copies: Vec::new(),
        window_secs: None,
        window_start_ms: None,
        reason: None,
        forgotten: Vec::new(),
        last_refreshed_ms: None,
        dead_letter: None,
        sentence: String::new(),
    };
    if q.owned == Some(false) {
        let p = q.partition.unwrap_or(-1);
        answer.reason = Some(Reason::NotOwned);
        answer.sentence = format!("Id {id} belongs to input partition {p}, which this worker does not own; ask the worker that owns partition {p}.");
        return Ok(answer);
    }
    let copies = ledger.sightings(&key)?;
    let forgotten = forgotten_on(ledger, &key);
    let window = match q.partition {
        Some(p) => ledger.window(p, q.now_ms),
        None => ledger.window_overall(q.now_ms),
    };
    let standing = Standing::of(q, &copies, window, ledger.options());
    let (reason, sentence) = verdict(&id, q, &copies, &forgotten, &standing);
    answer.held = !copies.is_empty() && forgotten.is_empty() && !standing.past;
    answer.last_refreshed_ms = standing.last_refreshed_ms;
    answer.forgotten = forgotten;
    answer.first_seen_ms = standing.first_seen_ms;
    answer.generation = copies.first().map(|s| s.generation);
    answer.window_secs = standing.window.map(|w| w.as_secs_f64());
    answer.window_start_ms = standing.window_start_ms;
    answer.copies = copies;
    answer.reason = reason;
    answer.sentence = sentence;
    Ok(answer)
}

/// `answer` told with what a search of the dead-letter topic found for its id (see
/// [`crate::output::find_dead_letter`]): where its dead letter is, or why the topic could not be
/// searched. Nothing is added when none was found: the id's record was published.
pub fn with_dead_letter(
    mut answer: Answer,
    searched: Result<Option<DeadLetterAt>, String>,
    topic: &str,
) -> Answer {
    match searched {
        Ok(None) => {}
        Ok(Some(at)) => {
            answer.sentence.push_str(&format!(
                " Its record (read at {}) was not published: the output refused it ({}), and it was written to the dead-letter topic {} instead (partition {}, offset {}).",
                at.read_at.as_deref().unwrap_or("an unknown offset"),
                at.reason.as_deref().unwrap_or("no reason given"),
                at.topic,
                at.partition,
                at.offset
            ));
            answer.dead_letter = Some(at);
        }
        Err(e) => answer.sentence.push_str(&format!(
            " (The dead-letter topic {topic} could not be searched for its record: {e}.)"
        )),
    }
    answer
}

/// Where an id stands against the retention limit and the window, read from its copies (newest
/// first) before it is put in words.
struct Standing {
    /// Its last sighting is past the retention limit: it is not held.
    past: bool,
    /// The retention limit, ms (0 when there is none).
    max_window_ms: i64,
    refresh_on_duplicate: bool,
    first_seen_ms: Option<i64>,
    last_refreshed_ms: Option<i64>,
    window_start_ms: Option<i64>,
    window: Option<Duration>,
}

impl Standing {
    fn of(
        q: &Question<'_>,
        copies: &[Sighting],
        window: Option<Duration>,
        options: &LedgerOptions,
    ) -> Self {
        let past = copies
            .first()
            .is_some_and(|s| past_limit(options.max_window_ms, s.first_seen_ms, q.now_ms));
        // The window is where every id is held from; an id held from before it (a partition's
        // older ids back-filling, or the ledger's overall window) moves the answer's start back
        // to it, so that `held` and the window never disagree. One past the retention limit is
        // not held.
        let first_seen_ms = copies.first().map(|s| s.first_seen_ms).filter(|_| !past);
        let last_refreshed_ms = match copies {
            [newest, _, ..] if options.refresh_on_duplicate && !past => Some(newest.first_seen_ms),
            _ => None,
        };
        let window_start_ms = match (
            window.map(|w| q.now_ms - w.as_millis() as i64),
            first_seen_ms,
        ) {
            (Some(start), Some(seen)) => Some(start.min(seen)),
            (start, seen) => start.or(seen),
        };
        let window =
            window_start_ms.map(|start| Duration::from_millis((q.now_ms - start).max(0) as u64));
        Self {
            past,
            max_window_ms: options.max_window_ms.unwrap_or(0),
            refresh_on_duplicate: options.refresh_on_duplicate,
            first_seen_ms,
            last_refreshed_ms,
            window_start_ms,
            window,
        }
    }

    /// How far back the window reaches, in words.
    fn reach(&self, q: &Question<'_>) -> String {
        let whose = q
            .partition
            .map_or("the ledger's".to_string(), |p| format!("partition {p}'s"));
        match (self.window, self.window_start_ms) {
            (Some(w), Some(start)) => format!(
                "{whose} window reaches back {} (to {})",
                span(w),
                when(start)
            ),
            _ => format!("{whose} window is empty: the ledger holds none of its ids"),
        }
    }
}

/// Why `id` is not held (or `None` when it is), and the answer's sentence.
fn verdict(
    id: &str,
    q: &Question<'_>,
    copies: &[Sighting],
    forgotten: &[ForgottenOn],
    standing: &Standing,
) -> (Option<Reason>, String) {
    let reach = standing.reach(q);
    match copies.first() {
        Some(_) if !forgotten.is_empty() => (
            Some(Reason::Forgotten),
            format!(
                "Id {id} was forgotten on request ({}): its next copy, on any of this worker's partitions, is published, and held from then on; {reach}.",
                forgotten
                    .iter()
                    .map(|f| format!("partition {} at {}", f.partition, when(f.at_ms)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Some(s) if standing.past => (
            Some(Reason::PastLimit),
            format!(
                "Id {id} is forgotten: past the retention limit of {}: last seen {} ({} ago); {reach}. A copy arriving now is published.",
                span(Duration::from_millis(standing.max_window_ms.max(0) as u64)),
                when(s.first_seen_ms),
                span(Duration::from_millis((q.now_ms - s.first_seen_ms).max(0) as u64)),
            ),
        ),
        Some(s) => (
            None,
            format!(
                "Id {id} is in the window: {}, held in generation {}; {reach}. A copy arriving now is dropped.",
                seen(q, copies, standing),
                s.generation
            ),
        ),
        None => not_held(id, q, standing.window_start_ms, &reach),
    }
}

/// When a held id was seen (its copies newest first, at least one), in words.
fn seen(q: &Question<'_>, copies: &[Sighting], standing: &Standing) -> String {
    let ago = |ms: i64| span(Duration::from_millis((q.now_ms - ms).max(0) as u64));
    let newest = copies[0].first_seen_ms;
    match (standing.last_refreshed_ms, copies.last()) {
        (Some(last), Some(oldest)) => format!(
            "first seen {} ({} ago), last refreshed {} ({} ago) by a dropped copy",
            when(oldest.first_seen_ms),
            ago(oldest.first_seen_ms),
            when(last),
            ago(last)
        ),
        _ if standing.refresh_on_duplicate => format!(
            "last seen {} ({} ago: its first sighting, or the last dropped copy that refreshed it)",
            when(newest),
            ago(newest)
        ),
        _ => format!("first seen {} ({} ago)", when(newest), ago(newest)),
    }
}

/// Why an id the ledger holds no copy of is not held: aged out or never seen, as far as the time
/// it was sent tells.
fn not_held(
    id: &str,
    q: &Question<'_>,
    window_start_ms: Option<i64>,
    reach: &str,
) -> (Option<Reason>, String) {
    // A bare id not held may be one the front door wrote under its source (never a JSON one).
    let scoped_hint = if q.source.is_none() && !q.json && !id.contains(SOURCE_SEPARATOR) {
        " Ids the front door (dedupe ingest) writes are scoped by source and held as <source>:<messageId>: ask with --source NAME (the write key's source)."
    } else {
        ""
    };
    match (q.sent_at_ms, window_start_ms) {
        (Some(sent), Some(start)) if sent < start => (
            Some(Reason::AgedOut),
            format!("Id {id} is not held: sent at {}, before the window's start, so it aged out; {reach}. A copy arriving now is published.", when(sent)),
        ),
        (Some(sent), _) => (
            Some(Reason::NeverSeen),
            format!("Id {id} is not held: sent at {}, inside the window, and never seen here; {reach}. A copy arriving now is published.{scoped_hint}", when(sent)),
        ),
        (None, _) => (
            Some(Reason::NotInWindow),
            format!(
                "Id {id} is not held: never seen here, or first seen before the window's start and aged out (give the time it was sent to tell which); {reach}. A copy arriving now is published.{scoped_hint}"
            ),
        ),
    }
}

/// The forgets of `key` in force: none once a copy was published after the newest (see
/// `dedupe::ledger::forgotten_since`); else the partitions the newest forget was written to.
fn forgotten_on(ledger: &Ledger, key: &LedgerKey) -> Vec<ForgottenOn> {
    let marks = ledger.marks_of(key);
    let Some(since) = forgotten_since(&marks) else {
        return Vec::new();
    };
    marks
        .into_iter()
        .filter(|m| m.kind == MarkKind::Forgotten && m.at_ms == since)
        .map(|m| ForgottenOn {
            partition: m.partition,
            at_ms: m.at_ms,
        })
        .collect()
}

/// A time as RFC 3339, to the second.
fn when(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(
        t.min(SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799)),
    )
    .to_string()
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
    use crate::identity::{json_value_id, ledger_key, IdError};

    const HOUR: i64 = 3_600_000;
    const ID: &str = "6ba7b810-9dad-41d1-80b4-00c04fd430c8";

    fn ledger_with(ids: &[(&str, i64)]) -> (tempfile::TempDir, Ledger) {
        let dir = tempfile::tempdir().unwrap();
        let options = LedgerOptions {
            budget_bytes: 256 << 20,
            write_buffer_bytes: 1 << 20,
            block_cache_bytes: 1 << 20,
            ..LedgerOptions::default()
        };
        let ledger = Ledger::open(dir.path(), options).unwrap();
        let items: Vec<_> = ids
            .iter()
            .map(|(id, t)| (ledger_key(id.as_bytes()).unwrap(), *t))
            .collect();
        ledger.check_and_record(0, &items, b"").unwrap();
        (dir, ledger)
    }

    /// The id source of most tests: the record key.
    static KEY: IdSource = IdSource::Key;

    fn ask(id: &str, sent_at_ms: Option<i64>, now_ms: i64) -> Question<'_> {
        Question {
            id,
            source: None,
            json: false,
            id_source: &KEY,
            partition: Some(0),
            owned: Some(true),
            sent_at_ms,
            now_ms,
        }
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
        assert_eq!(
            a.window_start_ms,
            Some(now - 5 * HOUR),
            "the oldest id held"
        );
        assert_eq!(a.reason, None);
        assert!(
            a.sentence.contains("is in the window")
                && a.sentence.contains("2.0 h ago")
                && a.sentence.contains("dropped"),
            "{}",
            a.sentence
        );
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
        assert!(
            unknown
                .sentence
                .contains("never seen here, or first seen before"),
            "{}",
            unknown.sentence
        );
        assert!(unknown.sentence.contains("published"));
    }

    #[test]
    fn an_id_past_the_retention_limit_is_forgotten_and_a_refreshed_one_names_its_last_refresh() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::clock::now_ms();
        let options = |refresh| crate::ledger::LedgerOptions {
            budget_bytes: 256 << 20,
            write_buffer_bytes: 1 << 20,
            max_window_ms: Some(20_000),
            refresh_on_duplicate: refresh,
            ..Default::default()
        };
        let key = |id: &str| ledger_key(id.as_bytes()).unwrap();
        {
            let ledger = Ledger::open(dir.path(), options(false)).unwrap();
            ledger
                .check_and_record(0, &[(key("old"), now - 15_000)], b"p")
                .unwrap();
            let a = explain(&ledger, &ask("old", None, now + 10_000)).unwrap();
            assert!(!a.held, "{a:?}");
            assert_eq!(a.reason, Some(Reason::PastLimit));
            assert!(
                a.sentence
                    .contains("forgotten: past the retention limit of 20 s"),
                "{}",
                a.sentence
            );
            assert!(a.window_secs.unwrap() <= 20.0, "{a:?}");
            let within = explain(&ledger, &ask("old", None, now)).unwrap();
            assert!(within.held && within.reason.is_none(), "{within:?}");
        }
        let ledger = Ledger::open(dir.path(), options(true)).unwrap();
        ledger
            .check_and_record(0, &[(key("old"), now - 14_000)], b"p")
            .unwrap();
        // The first sighting's generation sealed, the refresh in the next: two copies.
        ledger.expire(now + 3_000).unwrap();
        ledger
            .check_and_record(0, &[(key("old"), now - 2_000)], b"p")
            .unwrap();
        let a = explain(&ledger, &ask("old", None, now)).unwrap();
        assert!(a.held, "{a:?}");
        assert_eq!(a.copies.len(), 2, "{a:?}");
        assert_eq!(a.last_refreshed_ms, Some(a.copies[0].first_seen_ms));
        assert!(a.sentence.contains("last refreshed"), "{}", a.sentence);
    }

    #[test]
    fn an_id_of_a_partition_the_worker_does_not_own_names_that_partition() {
        let (_dir, ledger) = ledger_with(&[]);
        let q = Question {
            id: ID,
            source: None,
            json: false,
            id_source: &KEY,
            partition: Some(7),
            owned: Some(false),
            sent_at_ms: None,
            now_ms: HOUR,
        };
        let a = explain(&ledger, &q).unwrap();
        assert_eq!((a.reason, a.partition), (Some(Reason::NotOwned), Some(7)));
        assert!(
            a.sentence.contains("ask the worker that owns partition 7"),
            "{}",
            a.sentence
        );
        assert!(matches!(
            explain(&ledger, &ask("", None, HOUR)),
            Err(ExplainError::Id(NamedIdError::Id(IdError::Empty)))
        ));
    }

    #[test]
    fn an_id_asked_with_its_source_is_the_front_doors_key_and_a_bare_one_gets_the_hint() {
        // The front door held `web:<id>`; asked with the source, the answer finds it.
        let now = 100 * HOUR;
        let (_dir, ledger) = ledger_with(&[("web:m-1", now - HOUR)]);
        let q = Question {
            source: Some("web"),
            ..ask("m-1", None, now)
        };
        let a = explain(&ledger, &q).unwrap();
        assert!(a.held, "{}", a.sentence);
        assert_eq!(
            (a.id.as_str(), a.source.as_deref(), a.key.as_str()),
            ("m-1", Some("web"), "web:m-1")
        );
        // Asked bare, it is not held, and the sentence says how to ask.
        let bare = explain(&ledger, &ask("m-1", None, now)).unwrap();
        assert!(!bare.held);
        assert!(bare.sentence.contains("--source NAME"), "{}", bare.sentence);
        // An id that already names its source gets no hint.
        let scoped = explain(&ledger, &ask("ios:m-1", None, now)).unwrap();
        assert!(
            !scoped.held && !scoped.sentence.contains("--source"),
            "{}",
            scoped.sentence
        );
    }

    #[test]
    fn a_number_id_is_found_as_a_json_number_and_its_digits_as_text_are_refused() {
        // A worker reading `json:/id` held `{"id":12345678901234567890}`: the number's key.
        let now = 100 * HOUR;
        let digits = "12345678901234567890";
        let source = IdSource::JsonPointer("/id".into());
        let (_dir, ledger) = ledger_with(&[]);
        let number = json_value_id(digits).unwrap().0.key;
        ledger
            .check_and_record(0, &[(number, now - HOUR)], b"")
            .unwrap();
        let q = Question {
            json: true,
            id_source: &source,
            partition: None,
            owned: None,
            ..ask(digits, None, now)
        };
        let a = explain(&ledger, &q).unwrap();
        assert!(a.held && a.json_number, "{a:?}");
        assert_eq!(
            (a.key.as_str(), a.ledger_key.as_str()),
            (digits, number.hex().as_str())
        );
        assert!(
            a.sentence
                .starts_with("Id 12345678901234567890 (a JSON number) is in the window"),
            "{}",
            a.sentence
        );
        // Asked as text, the question is refused naming both ways to ask: never "never seen".
        let e = explain(&ledger, &Question { json: false, ..q }).unwrap_err();
        assert!(
            matches!(e, ExplainError::Id(NamedIdError::NumberOrString { .. })),
            "{e}"
        );
        assert!(
            e.to_string().contains("--json-id 12345678901234567890"),
            "{e}"
        );
        // The string of the same digits is another id, which the ledger does not hold; its
        // answer has no hint about the front door's sources.
        let quoted = format!("\"{digits}\"");
        let string = explain(&ledger, &Question { id: &quoted, ..q }).unwrap();
        assert!(!string.held && !string.json_number, "{string:?}");
        assert_eq!(string.key, digits);
        assert_eq!(
            string.ledger_key,
            ledger_key(digits.as_bytes()).unwrap().hex()
        );
        assert!(!string.sentence.contains("--source"), "{}", string.sentence);
    }

    #[test]
    fn a_held_id_is_never_older_than_the_window_the_answer_gives() {
        // The id is held, first seen before partition 1's window (its own ids are newer):
        // the answer's window reaches back to it.
        let now = 100 * HOUR;
        let dir = tempfile::tempdir().unwrap();
        let options = LedgerOptions {
            budget_bytes: 256 << 20,
            write_buffer_bytes: 1 << 20,
            block_cache_bytes: 1 << 20,
            ..LedgerOptions::default()
        };
        let ledger = Ledger::open(dir.path(), options).unwrap();
        ledger
            .check_and_record(
                0,
                &[(ledger_key(ID.as_bytes()).unwrap(), now - 5 * HOUR)],
                b"",
            )
            .unwrap();
        ledger
            .check_and_record(1, &[(ledger_key(b"other").unwrap(), now - HOUR)], b"")
            .unwrap();
        let a = explain(
            &ledger,
            &Question {
                partition: Some(1),
                ..ask(ID, None, now)
            },
        )
        .unwrap();
        assert!(a.held);
        assert!(
            a.window_start_ms.unwrap() <= a.first_seen_ms.unwrap(),
            "{a:?}"
        );
        assert_eq!(a.window_start_ms, Some(now - 5 * HOUR));
    }
}

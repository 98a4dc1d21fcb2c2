//! Which events fired, for tests. Every event's log line carries its name in the field
//! [`EVENT_FIELD`] (`event = "PartitionsLost"`); [`record`] installs, for the calling thread
//! only, a `tracing` subscriber that keeps those names, so a test says
//! `assert_eq!(recording.count("PartitionsLost"), 1)` about the code it just ran.
//!
//! Thread-scoped on purpose: tests run side by side in one process, and each sees only what its
//! own thread emitted. An actix `System` or a current-thread tokio runtime runs its actors and
//! tasks on the test's thread, so their events are recorded; work handed to other threads
//! (a `SyncArbiter`, a spawned thread) is not. While a recording is installed the thread's log
//! lines go to it and nowhere else.

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// The field of a log line that names the event it reports.
pub const EVENT_FIELD: &str = "event";

/// The events recorded on the thread that called [`record`], until it is dropped.
pub struct Recording {
    names: Arc<Mutex<Vec<(String, Level)>>>,
    _installed: tracing::subscriber::DefaultGuard,
}

/// Starts recording the events the calling thread emits.
pub fn record() -> Recording {
    let names = Arc::new(Mutex::new(Vec::new()));
    let subscriber = Collector {
        names: Arc::clone(&names),
    };
    Recording {
        names,
        _installed: tracing::subscriber::set_default(subscriber),
    }
}

impl Recording {
    /// How many times the event `name` was emitted.
    pub fn count(&self, name: &str) -> usize {
        self.lock().iter().filter(|(n, _)| n == name).count()
    }

    /// How many times the event `name` was emitted with a log line at `level` (an event that
    /// warns once a minute and is counted always, say, logs the others at trace).
    pub fn count_at(&self, name: &str, level: Level) -> usize {
        self.lock()
            .iter()
            .filter(|(n, l)| n == name && *l == level)
            .count()
    }

    /// Every event emitted, in order.
    pub fn names(&self) -> Vec<String> {
        self.lock().iter().map(|(n, _)| n.clone()).collect()
    }

    /// Forgets what was recorded so far: the next counts start from nothing.
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, Level)>> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A subscriber that keeps the [`EVENT_FIELD`] of each log line and drops the rest.
struct Collector {
    names: Arc<Mutex<Vec<(String, Level)>>>,
}

struct EventName(Option<String>);

impl Visit for EventName {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == EVENT_FIELD {
            self.0 = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == EVENT_FIELD {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl Subscriber for Collector {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut name = EventName(None);
        event.record(&mut name);
        if let Some(name) = name.0 {
            self.names
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((name, *event.metadata().level()));
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_the_named_events_of_its_own_thread_only() {
        let recording = record();
        tracing::warn!(event = "Something", "A line with a name.");
        tracing::info!("A line without one is not an event.");
        tracing::error!(event = "Something", partition = 3, "Again.");
        tracing::debug!(event = "Other", "And another.");
        // Another thread's events are not this test's.
        std::thread::spawn(|| tracing::warn!(event = "Something", "Elsewhere."))
            .join()
            .expect("joined");
        assert_eq!(recording.count("Something"), 2);
        assert_eq!(recording.count_at("Something", Level::WARN), 1);
        assert_eq!(recording.names(), ["Something", "Something", "Other"]);
        recording.clear();
        assert_eq!(recording.count("Something"), 0);
    }

    #[test]
    fn the_core_events_carry_their_names() {
        let recording = record();
        super::super::events::OutputRecordUndelivered {
            topic: "out",
            code: &"timed out",
        }
        .emit();
        super::super::events::ReadEndedEarly {
            partition: 0,
            topic: "log",
            at: None,
            end: 3,
        }
        .emit();
        assert_eq!(
            recording.names(),
            ["OutputRecordUndelivered", "ReadEndedEarly"]
        );
    }
}

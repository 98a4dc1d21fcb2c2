//! A watchdog for blocking client calls that can hang past their own timeout.
//!
//! librdkafka 2.12's transactional producer can block in `send_offsets_to_transaction` for good
//! after the consumer group's coordinator moved (confluentinc/librdkafka issues 5456: the
//! coordinator request's timeout is never checked, and 5511: a coordinator cached on a broker
//! that left the metadata is never looked up again). Seen here in a rolling restart of a
//! three-node cluster: every partition's producer blocked in that call, for minutes, with no
//! error. Nothing in the process can unblock such a call, and the producer cannot be dropped
//! while a thread is inside it.
//!
//! So every blocking transactional call is armed with a deadline (its own timeout plus
//! [`GRACE`]); a watchdog thread checks the armed calls every second, and when one is overdue it
//! logs which call hung and where, counts it, and hands it to the [`Rescue`] registered for it:
//! the worker leaves the hung call to its thread and takes its partition over again with a new
//! producer, whose `init_transactions` fences the hung one (nothing of its open transaction
//! becomes visible). A call no rescue takes (a take-over's own `init_transactions`) ends the
//! process with [`STUCK_EXIT_CODE`], as a crash would: the orchestrator restarts the worker and
//! recovery repairs the ledger.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The exit code of a process the watchdog ended.
pub const STUCK_EXIT_CODE: i32 = 4;

/// How long past its own timeout a call may take before it counts as hung. librdkafka returns a
/// call that honours its timeout within milliseconds of it; the hangs above last minutes. Every
/// second of grace is a second more of stall for the partition whose call hung.
pub const GRACE: Duration = Duration::from_secs(2);

/// Takes over a hung call of `owner` (`call` is its name): true when it will recover without the
/// process exiting.
pub type Rescue = Box<dyn Fn(&'static str, &str) -> bool + Send + Sync>;

struct Armed {
    call: &'static str,
    owner: String,
    deadline: Instant,
    /// A rescue was asked for it: it is not reported again.
    rescued: bool,
}

struct Watchdog {
    armed: Mutex<HashMap<u64, Armed>>,
    next: AtomicU64,
    rescue: Mutex<Option<Rescue>>,
}

/// Registers what takes over hung calls (the worker's coordinator); replaces an earlier one.
pub fn set_rescue(rescue: Rescue) {
    *watchdog().rescue.lock().unwrap_or_else(|p| p.into_inner()) = Some(rescue);
}

fn watchdog() -> &'static Watchdog {
    static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();
    WATCHDOG.get_or_init(|| {
        let started = std::thread::Builder::new()
            .name("call-watchdog".into())
            .spawn(|| loop {
                std::thread::sleep(Duration::from_secs(1));
                check(Instant::now());
            });
        if let Err(e) = started {
            crate::metrics::events::WatchdogNotStarted { error: &e }.emit();
        }
        Watchdog {
            armed: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            rescue: Mutex::new(None),
        }
    })
}

/// Hands each armed call overdue at `now` to the rescue; ends the process if none takes it.
fn check(now: Instant) {
    let Some(overdue) = overdue(now) else { return };
    let rescued = watchdog()
        .rescue
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|rescue| rescue(overdue.0, &overdue.1));
    crate::metrics::events::ClientCallStuck {
        call: overdue.0,
        owner: &overdue.1,
        past_deadline_secs: overdue.2.as_secs(),
        grace_secs: GRACE.as_secs(),
        rescued,
    }
    .emit();
    if rescued {
        return;
    }
    eprintln!(
        "error: {} of {} hung {} s past its timeout; exiting with {STUCK_EXIT_CODE} so that a restart recovers",
        overdue.0,
        overdue.1,
        GRACE.as_secs()
    );
    std::process::exit(STUCK_EXIT_CODE);
}

/// The first armed call overdue at `now` that no rescue was asked for: (call, owner, how long
/// past its deadline). It is marked as asked.
fn overdue(now: Instant) -> Option<(&'static str, String, Duration)> {
    let mut armed = watchdog().armed.lock().unwrap_or_else(|p| p.into_inner());
    let found = armed
        .values_mut()
        .find(|a| now > a.deadline && !a.rescued)?;
    found.rescued = true;
    Some((found.call, found.owner.clone(), now - found.deadline))
}

/// An armed call; disarmed when dropped (the call returned, or its thread unwound).
#[must_use = "the call is watched only while the guard lives"]
pub struct Guard {
    id: u64,
}

/// Arms the watchdog for `call` (made by `owner`, e.g. a transactional id) that should return
/// within `timeout`.
pub fn arm(call: &'static str, owner: &str, timeout: Duration) -> Guard {
    let w = watchdog();
    let id = w.next.fetch_add(1, Ordering::Relaxed);
    let deadline = Instant::now() + timeout + GRACE;
    w.armed.lock().unwrap_or_else(|p| p.into_inner()).insert(
        id,
        Armed {
            call,
            owner: owner.to_string(),
            deadline,
            rescued: false,
        },
    );
    Guard { id }
}

impl Drop for Guard {
    fn drop(&mut self) {
        watchdog()
            .armed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_call_past_its_timeout_and_the_grace_is_overdue() {
        let guard = arm(
            "send_offsets_to_transaction",
            "dedupe-out-0",
            Duration::from_secs(60),
        );
        let now = Instant::now();
        assert!(overdue(now).is_none_or(|o| o.1 != "dedupe-out-0"));
        let late = now + Duration::from_secs(60) + GRACE + Duration::from_secs(2);
        let found = overdue(late).expect("overdue after its timeout and the grace");
        assert_eq!(
            (found.0, found.1.as_str()),
            ("send_offsets_to_transaction", "dedupe-out-0")
        );
        assert!(
            overdue(late).is_none_or(|o| o.1 != "dedupe-out-0"),
            "a call is handed to the rescue once"
        );
        drop(guard);
        assert!(
            overdue(late).is_none_or(|o| o.1 != "dedupe-out-0"),
            "a returned call is disarmed"
        );
    }
}

//! The long-running commands' signals (`dedupe run`, `ingest`, `rekey`), caught from the first
//! line of their start: SIGTERM and SIGINT ask for a clean stop, SIGHUP for a reload (the worker's
//! `worker.source_modes`; nothing in the others).
//!
//! Guarantee: once [`Signals::install`] has returned, none of these signals ends the process by
//! its default action (SIGHUP's and SIGTERM's is to terminate it). A signal that arrives while no
//! runtime exists yet (the configuration loading, the brokers' metadata, the ledger opening) is
//! kept in a flag, which the start's phases check and which [`Signals::stopped`] and
//! [`Hangups::next`] read before they wait: no signal is missed between the start and the moment
//! something waits for it. The handlers only store to an atomic (signal-hook's `flag`), which is
//! safe in a signal handler. The three signals are unblocked once their handlers exist, so a
//! launcher that holds them blocked across `exec` (to lose none sent in the first instant) has
//! them delivered to the handlers.
//!
//! The first instant: the `dedupe` binary lists [`catch_early`] in its `.preinit_array`, which the
//! dynamic loader runs as soon as it has relocated the program, before any initializer (RocksDB's
//! C++ statics, the Rust runtime, `main`), which take 20 to 60 ms on a loaded machine. It keeps the
//! three signals in flags of its own; [`Signals::install`] takes them over, and
//! [`release_early`] gives the one-shot commands the default actions back (ending the process by
//! a signal that came meanwhile, as its default action would have). A signal delivered before
//! even that (while the kernel and the dynamic loader load the program, a few milliseconds after
//! `exec`) still takes its default action: no program can catch it then.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::AtomicU64;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// The signals caught by [`catch_early`]'s handler: bit `1 << n` for signal `n`.
static EARLY: AtomicU64 = AtomicU64::new(0);

/// The signals [`catch_early`] catches.
const CAUGHT: [i32; 3] = [SIGTERM, SIGINT, SIGHUP];

extern "C" fn early_handler(signal: libc::c_int) {
    EARLY.fetch_or(1 << signal, Ordering::SeqCst);
}

/// Catches SIGTERM, SIGINT and SIGHUP into a flag of this module, for the time before `main`
/// decides what to do with them. Run from the binary's `.preinit_array`: it only calls
/// `sigaction`, allocates nothing and needs nothing initialized.
pub extern "C" fn catch_early() {
    for signal in CAUGHT {
        // SAFETY: the action is zeroed, then its handler, mask and flags set; the handler only
        // updates an atomic, which is async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = early_handler as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            action.sa_flags = libc::SA_RESTART;
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// For the commands that keep the signals' default actions: gives them back, then raises a
/// signal [`catch_early`] caught meanwhile, which ends the process as it would have.
pub fn release_early() {
    for signal in CAUGHT {
        // SAFETY: as in `catch_early`, with the default action.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
    let early = EARLY.swap(0, Ordering::SeqCst);
    for signal in CAUGHT {
        if early & (1 << signal) != 0 {
            // SAFETY: raise(3) has no memory-safety preconditions.
            unsafe { libc::raise(signal) };
        }
    }
}

/// The stop and reload requests received since [`Signals::install`] (and since [`catch_early`],
/// in the binary).
#[derive(Clone)]
pub struct Signals {
    stop: Arc<AtomicBool>,
    hangup: Arc<AtomicBool>,
}

impl Signals {
    /// Installs the handlers (SIGTERM and SIGINT set the stop flag, SIGHUP the reload flag),
    /// then unblocks the three. Call it before anything else the command does, on the main
    /// thread, before any other thread starts (they inherit its signal mask).
    pub fn install() -> std::io::Result<Signals> {
        let signals = Signals {
            stop: Arc::new(AtomicBool::new(false)),
            hangup: Arc::new(AtomicBool::new(false)),
        };
        signal_hook::flag::register(SIGTERM, Arc::clone(&signals.stop))?;
        signal_hook::flag::register(SIGINT, Arc::clone(&signals.stop))?;
        signal_hook::flag::register(SIGHUP, Arc::clone(&signals.hangup))?;
        // From here on the new handlers see every signal (they call `catch_early`'s after
        // themselves); what came before is in its flag.
        let early = EARLY.load(Ordering::SeqCst);
        if early & (1 << SIGTERM | 1 << SIGINT) != 0 {
            signals.stop.store(true, Ordering::SeqCst);
        }
        if early & (1 << SIGHUP) != 0 {
            signals.hangup.store(true, Ordering::SeqCst);
        }
        unblock(&CAUGHT)?;
        Ok(signals)
    }

    /// Whether SIGTERM or SIGINT has arrived.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// The stop flag itself, for a loop that checks it between its steps (`dedupe rekey`).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// Resolves once SIGTERM or SIGINT has arrived, at once if one already has. Needs a tokio
    /// runtime (actix's is one).
    pub async fn stopped(&self) {
        // The streams are registered before the flag is read: a signal after the read wakes
        // them, one before it is in the flag.
        let streams = signal(SignalKind::terminate()).and_then(|term| {
            let interrupt = signal(SignalKind::interrupt())?;
            Ok((term, interrupt))
        });
        let (mut term, mut interrupt) = match streams {
            Ok(streams) => streams,
            Err(_) => {
                // Without tokio's streams the flag alone says it; look at it often.
                while !self.stop_requested() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                return;
            }
        };
        while !self.stop_requested() {
            tokio::select! {
                _ = term.recv() => {}
                _ = interrupt.recv() => {}
            }
        }
    }

    /// The SIGHUPs to come, starting with one that arrived since the install and was not yet
    /// taken. Needs a tokio runtime.
    pub fn hangups(&self) -> Hangups {
        Hangups {
            stream: signal(SignalKind::hangup()).ok(),
            flag: Arc::clone(&self.hangup),
        }
    }
}

/// Unblocks `signals` in this thread, and so in every thread it starts afterwards: a launcher that
/// held them blocked across `exec` (so that none is lost before a handler exists) has them
/// delivered now, to the handlers; one that never unblocked them would leave the process deaf to
/// them.
fn unblock(signals: &[i32]) -> std::io::Result<()> {
    // SAFETY: the set is initialized by sigemptyset before use; pthread_sigmask reads it and
    // writes no old mask (null).
    let failed = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut())
    };
    match failed {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

/// SIGHUPs, one at a time (several that arrive together are one).
pub struct Hangups {
    stream: Option<Signal>,
    flag: Arc<AtomicBool>,
}

impl Hangups {
    /// Resolves at the next SIGHUP, at once if one arrived since the last call (or since the
    /// install, for the first).
    pub async fn next(&mut self) {
        loop {
            if self.flag.swap(false, Ordering::SeqCst) {
                return;
            }
            match self.stream.as_mut() {
                Some(stream) => {
                    stream.recv().await;
                }
                None => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

/// A long-running command asked to stop while it started, before it did any of its work (`work`:
/// processing, copying): logs the phase it was in.
pub fn stopped_while_starting(phase: &str, work: &str) {
    tracing::info!(
        phase,
        "Received a stop signal while starting; stopped before {work} anything."
    );
}

/// For a command with nothing to reload (`what`: the tracking API, the rekey stage): logs each
/// SIGHUP, for ever.
pub async fn log_hangups(mut hangups: Hangups, what: &'static str) {
    loop {
        hangups.next().await;
        tracing::info!(
            "Received SIGHUP; {what} has nothing to reload (a restart reads the configuration again)."
        );
    }
}

/// Runs `work` on a thread of its own and waits for it, or until `stop` (a [`Signals::stop_flag`])
/// is set: `None` then, and the thread is left to finish alone. For start phases that hold nothing a process
/// exit could harm (metadata reads, a topic's creation), which may each wait many seconds for
/// unreachable brokers.
pub fn unless_stopped<T: Send + 'static>(
    stop: &AtomicBool,
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<Option<T>> {
    let (done, result) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _ = done.send(work());
        })?;
    loop {
        match result.recv_timeout(Duration::from_millis(20)) {
            Ok(value) => return Ok(Some(value)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(std::io::Error::other(format!("the {name} thread panicked")))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if stop.load(Ordering::SeqCst) => {
                return Ok(None)
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's own signals reach the flags and wake the waits, including one sent before
    /// anything waited.
    #[test]
    fn a_signal_before_the_wait_is_not_missed() {
        let signals = Signals::install().expect("install");
        assert!(!signals.stop_requested());
        // SIGHUP first: with the handler installed it does not end the test process.
        signal_hook::low_level::raise(SIGHUP).expect("raise");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut hangups = signals.hangups();
            // The one raised before the wait is taken at once, and only once.
            tokio::time::timeout(Duration::from_secs(5), hangups.next())
                .await
                .expect("the earlier SIGHUP");
            assert!(
                tokio::time::timeout(Duration::from_millis(200), hangups.next())
                    .await
                    .is_err(),
                "a second SIGHUP without one sent"
            );
            signal_hook::low_level::raise(SIGHUP).expect("raise");
            tokio::time::timeout(Duration::from_secs(5), hangups.next())
                .await
                .expect("a SIGHUP while waiting");
        });
        // SIGTERM before anything waits: the flag has it, and the wait ends at once.
        signal_hook::low_level::raise(SIGTERM).expect("raise");
        assert!(signals.stop_requested());
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), signals.stopped())
                .await
                .expect("the earlier SIGTERM");
        });
    }

    #[test]
    fn a_start_phase_is_left_when_a_stop_is_requested() {
        let stop = AtomicBool::new(false);
        assert_eq!(
            unless_stopped(&stop, "quick", || 7).expect("thread"),
            Some(7)
        );
        let (release, wait) = std::sync::mpsc::channel::<()>();
        stop.store(true, Ordering::SeqCst);
        // A phase that would wait for ever is left at once.
        let left = unless_stopped(&stop, "stuck", move || wait.recv().is_ok());
        assert_eq!(left.expect("thread"), None);
        drop(release);
    }
}

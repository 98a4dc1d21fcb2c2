//! What the integration tests in `tests/` share, and the only place they get it from: the test
//! broker and topics that delete themselves ([`kafka`]), one launcher per process kind (the worker
//! in [`worker`], the front door in [`ingest`], the rekey stage in [`rekey`], the three-node
//! cluster in [`cluster`]), one load generator ([`load`]) and one exactly-once checker
//! ([`exactly_once`]), and [`wait_until`], the poll every wait is made of.
//!
//! The tests are integration tests of `dedupe-cli`, the package that owns the `dedupe`
//! binary, so cargo builds the binary (with the features the run asks for) before them and each
//! test names it with `env!("CARGO_BIN_EXE_dedupe")`; see [`Dedupe`]. A test that cannot reach
//! what it needs fails with a message saying what is missing; nothing here skips.

pub mod cluster;
pub mod exactly_once;
pub mod http;
pub mod ingest;
pub mod kafka;
pub mod load;
pub mod rekey;
pub mod source;
pub mod worker;

pub use exactly_once::Count;
pub use ingest::{Ingest, IngestSpec};
pub use kafka::*;
pub use load::{ids, keyed, Load, LoadSpec};
pub use rekey::{Rekey, RekeySpec, SourceLoad};
pub use worker::{free_port, http_get, metric_value, Worker, WorkerSpec};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The `dedupe` binary under test. `CARGO_BIN_EXE_dedupe` is set only while cargo compiles an
/// integration test of the package that owns the binary, so the path comes from the test, once per
/// file:
///
/// ```ignore
/// const DEDUPE: Dedupe = Dedupe::at(env!("CARGO_BIN_EXE_dedupe"));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Dedupe {
    path: &'static str,
}

impl Dedupe {
    pub const fn at(path: &'static str) -> Self {
        Self { path }
    }

    pub fn path(&self) -> &'static Path {
        Path::new(self.path)
    }

    /// A command running the binary, nothing set.
    pub fn command(&self) -> Command {
        Command::new(self.path())
    }

    /// How to start `dedupe run` from `input` to `output` with its ledger in `data_dir` (small
    /// test settings; [`WorkerSpec::without`] drops one to run with the default).
    pub fn worker(&self, input: &str, output: &str, data_dir: &Path) -> WorkerSpec {
        WorkerSpec::new(*self, input, output, data_dir)
    }

    /// [`Dedupe::worker`] with the ledger in a temporary directory of its own (see
    /// [`WorkerSpec::in_temp_dir`]); its path is the spec's `data_dir`.
    pub fn worker_in_temp_dir(&self, input: &str, output: &str) -> WorkerSpec {
        WorkerSpec::in_temp_dir(*self, input, output)
    }

    /// How to start `dedupe ingest` in front of `topic`.
    pub fn ingest(&self, topic: &str) -> IngestSpec {
        IngestSpec::new(*self, topic)
    }

    /// How to start `dedupe rekey` from `source` into `input` (logs in `dir`).
    pub fn rekey(&self, source: &str, input: &str, output: &str, dir: &Path) -> RekeySpec {
        RekeySpec::new(*self, source, input, output, dir)
    }

    /// Runs `dedupe verify` over the two topics on the test brokers; (exit code, JSON summary).
    pub fn verify(&self, input: &str, output: &str) -> (i32, serde_json::Value) {
        let out = self
            .command()
            .args([
                "verify",
                "--brokers",
                &brokers(),
                "--input-topic",
                input,
                "--output-topic",
                output,
            ])
            .output()
            .expect("dedupe verify");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
            panic!(
                "verify printed no JSON: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), json)
    }

    /// `dedupe forget` on the test brokers, asking the worker at `metrics`; the ids and flags
    /// are the caller's to add.
    pub fn forget_command(&self, metrics: std::net::SocketAddr) -> Command {
        let mut command = self.command();
        command
            .arg("forget")
            .args(["--brokers", &brokers()])
            .args(["--metrics-addr", &metrics.to_string()]);
        command
    }

    /// Runs `dedupe explain ID [ARGS]` on the test brokers, asking the worker at `metrics` (or,
    /// when none answers there, reading the ledger at `ledger`); the JSON line and the sentence
    /// it printed. Panics when it fails.
    pub fn explain(
        &self,
        ledger: &Path,
        metrics: std::net::SocketAddr,
        id: &str,
        args: &[&str],
    ) -> (serde_json::Value, String) {
        let out = self
            .command()
            .args([
                "explain",
                id,
                "--brokers",
                &brokers(),
                "--data-dir",
                ledger.to_str().expect("a UTF-8 path"),
            ])
            .args(["--metrics-addr", &metrics.to_string()])
            .args(args)
            .output()
            .expect("dedupe explain");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "dedupe explain {id} failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut lines = stdout.lines();
        let json = serde_json::from_str(lines.next().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}: {stdout}"));
        (json, lines.next().unwrap_or_default().to_string())
    }
}

/// The repository's top directory.
pub fn repo_root() -> PathBuf {
    // Read when the test runs (cargo and nextest set it to the test's package, `actors/`): a test
    // binary left in a shared target directory by a build of another checkout must still use
    // this one. The fallback is this crate's own place, `tests/kit/`.
    match std::env::var_os("CARGO_MANIFEST_DIR") {
        Some(dir) => PathBuf::from(dir)
            .parent()
            .expect("actors/ has a parent")
            .to_path_buf(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
    }
}

/// Polls `done` every `every` until it returns `Some`, and returns that; panics after `timeout`
/// with `what` and whatever `explain` says about the state then (a log tail, a metrics page).
pub fn wait_until<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut done: impl FnMut() -> Option<T>,
    explain: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = done() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!("{what}: not within {timeout:?}\n{}", explain());
        }
        std::thread::sleep(every);
    }
}

/// Sends `signal` to the process `pid`, a child this test started; panics if it cannot.
pub fn send_signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    let sent = unsafe { libc::kill(pid as i32, signal) };
    assert_eq!(
        sent,
        0,
        "kill({pid}, {signal}): {}",
        std::io::Error::last_os_error()
    );
}

/// Whether process `pid` catches `signal` now (its handler is installed: `SigCgt` in
/// `/proc/PID/status`); false when it does not, or has ended.
pub fn catches(pid: u32, signal: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}

/// Makes `command`'s process start with SIGTERM, SIGINT and SIGHUP blocked, as a launcher does that
/// must not lose a signal sent before the program has its handlers: one sent right after the
/// spawn stays pending until the program unblocks it.
pub fn hold_signals(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec, and only calls sigemptyset,
    // sigaddset and pthread_sigmask, which are async-signal-safe and allocate nothing.
    unsafe {
        command.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::sigaddset(&mut set, signal);
            }
            match libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) {
                0 => Ok(()),
                errno => Err(std::io::Error::from_raw_os_error(errno)),
            }
        });
    }
}

/// Waits up to `timeout` for `child` to end: its status, or `None` if it still runs.
pub fn wait_for_exit(
    child: &mut std::process::Child,
    timeout: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

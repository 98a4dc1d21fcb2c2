//! The bench's worker children (`super`): each one a `dedupe run` in its own group member, read
//! through its metrics page, and B's window sampled while it comes back.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use dedupe::config::Config;
use dedupe::metrics as m;

use super::WindowSample;
use crate::bench::pipeline::{http_get, sum_metric};

/// A worker child, killed if the bench ends early.
pub struct Worker {
    child: Child,
    port: u16,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Worker {
    pub fn start(
        config: &Config,
        input: &str,
        output: &str,
        group: &str,
        member: Option<&str>,
        dir: &Path,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Worker> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args([
            "run",
            "--brokers",
            &config.kafka.brokers,
            "--input-topic",
            input,
            "--output-topic",
            output,
        ])
        .args(["--assignment", "group"])
        .args(member.map(|m| ["--member-id", m]).into_iter().flatten())
        .arg("--data-dir")
        .arg(dir)
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("DEDUPE_WORKER_GROUP_ID", group)
        .env(
            "DEDUPE_LOG_LEVEL",
            std::env::var("DEDUPE_BENCH_WORKER_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .envs(env.iter().copied())
        .stdout(Stdio::null());
        Ok(Worker {
            child: cmd.spawn().context("starting a worker")?,
            port,
        })
    }

    /// The sum of a metric's series whose labels contain `labels`; 0 when absent or unreachable.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        http_get(self.port, "/metrics")
            .map(|(_, page)| sum_metric(&page, name, labels))
            .unwrap_or(0.0)
    }

    /// Polls until `done` holds, failing after `timeout` or if the worker exits.
    pub fn wait_until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Worker) -> bool,
    ) -> anyhow::Result<Instant> {
        let started = Instant::now();
        loop {
            if done(self) {
                return Ok(Instant::now());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("a worker exited ({status}) while the bench waited for {what}");
            }
            if started.elapsed() > timeout {
                bail!("{what} did not happen within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM and waits for the exit; its code.
    pub fn terminate(self, timeout: Duration) -> anyhow::Result<Option<i32>> {
        self.signal(libc::SIGTERM, timeout)
    }

    /// Sends `signal` and waits for the exit; its code (`None` when the signal ended it).
    pub fn signal(mut self, signal: i32, timeout: Duration) -> anyhow::Result<Option<i32>> {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let started = Instant::now();
        while started.elapsed() < timeout {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.code());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        bail!("a worker did not stop within {timeout:?} of signal {signal}")
    }
}

/// B's window for the partition from its assignment until it is back, a reading at most every
/// [`WindowSamples::EVERY`]: what docs/performance.md plots.
pub struct WindowSamples {
    pub assigned: Instant,
    /// A's window when it was noted, at `noted_at`.
    pub window_before: f64,
    pub noted_at: Instant,
    pub taken: Vec<WindowSample>,
}

impl WindowSamples {
    const EVERY: Duration = Duration::from_millis(250);

    /// B's window now and what it must come back to (A's window, aged since it was noted); kept
    /// as a sample when one is due or the window changed, so the reading that ends the wait is
    /// the last sample.
    pub fn take(&mut self, worker: &Worker) -> (f64, f64) {
        let window = worker.metric(m::WINDOW_SECONDS, &[("partition", "0")]);
        let target = self.window_before + self.noted_at.elapsed().as_secs_f64();
        let at_secs = self.assigned.elapsed().as_secs_f64();
        let keep = self.taken.last().is_none_or(|last| {
            at_secs - last.at_secs >= Self::EVERY.as_secs_f64() || last.window_secs != window
        });
        if keep {
            self.taken.push(WindowSample {
                at_secs,
                window_secs: window,
                target_secs: target,
            });
        }
        (window, target)
    }
}

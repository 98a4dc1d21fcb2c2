//! The launcher of `dedupe rekey`: a spec, then a process whose stderr goes to a log file and
//! whose metrics are read from its listener.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::{brokers, free_port, http_get, metric_value, Dedupe};

/// How to start `dedupe rekey` from `source` into `input` (its configuration also names
/// `output`, which the stage does not write).
#[derive(Debug, Clone)]
pub struct RekeySpec {
    pub bin: Dedupe,
    pub source: String,
    pub input: String,
    pub output: String,
    /// Where its logs go.
    pub dir: PathBuf,
    pub env: Vec<(String, String)>,
    /// The brokers it is given; the test brokers unless set.
    pub brokers: Option<String>,
}

impl RekeySpec {
    pub fn new(bin: Dedupe, source: &str, input: &str, output: &str, dir: &Path) -> Self {
        Self {
            bin,
            source: source.into(),
            input: input.into(),
            output: output.into(),
            dir: dir.to_path_buf(),
            env: Vec::new(),
            brokers: None,
        }
    }

    /// Gives it these brokers instead of the test brokers (an unreachable address, say).
    pub fn brokers(mut self, brokers: &str) -> Self {
        self.brokers = Some(brokers.into());
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.retain(|(key, _)| key != k);
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn start(&self) -> Rekey {
        let metrics_port = free_port();
        let log = self
            .dir
            .join(format!("rekey-{}.log", uuid::Uuid::new_v4().simple()));
        let mut cmd = self.bin.command();
        cmd.args([
            "rekey",
            "--brokers",
            &self.brokers.clone().unwrap_or_else(brokers),
            "--source-topic",
            &self.source,
        ])
        .args(["--input-topic", &self.input, "--output-topic", &self.output])
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"));
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        Rekey {
            child: cmd.spawn().expect("spawn dedupe rekey"),
            log,
            metrics_port,
        }
    }
}

/// A running `dedupe rekey`; killed when dropped.
pub struct Rekey {
    pub child: Child,
    log: PathBuf,
    metrics_port: u16,
}

impl Rekey {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The sum of a metric's series with these labels; 0 when absent or unreachable.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        http_get(self.metrics_port, "/metrics")
            .and_then(|(_, page)| metric_value(&page, name, labels))
            .unwrap_or(0.0)
    }

    /// Waits for the process to end: its status. Panics with its log, after killing it, if it
    /// still runs after `timeout`.
    pub fn wait_status(&mut self, timeout: std::time::Duration) -> std::process::ExitStatus {
        match crate::wait_for_exit(&mut self.child, timeout) {
            Some(status) => status,
            None => {
                self.kill();
                panic!(
                    "dedupe rekey did not exit within {timeout:?}:\n{}",
                    self.log_text()
                );
            }
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `signal` (SIGTERM, SIGSTOP, SIGCONT) to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// The exit code if the process has exited (`Some(None)`: killed by a signal), else `None`.
    pub fn exited(&mut self) -> Option<Option<i32>> {
        self.child
            .try_wait()
            .ok()
            .flatten()
            .map(|status| status.code())
    }

    /// Waits for the process to exit and returns its exit code (`None`: killed by a signal);
    /// panics with its log if it runs past `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(code) = self.exited() {
                return code;
            }
            if Instant::now() > deadline {
                self.kill();
                panic!(
                    "dedupe rekey did not exit within {timeout:?}:\n{}",
                    crate::tail(&self.log_text(), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM and waits for the exit code.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        self.signal(libc::SIGTERM);
        self.wait(timeout)
    }
}

impl Drop for Rekey {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A source keyed by user, as `dedupe rekey` is for: `total` JSON records, each with a
/// `messageId` of its own (`{prefix}-{n}`), produced in chunks of `chunk` records every `pause`
/// from a thread of its own.
pub struct SourceLoad {
    thread: Option<std::thread::JoinHandle<()>>,
    pub total: usize,
}

impl SourceLoad {
    pub fn start(topic: &str, total: usize, chunk: usize, pause: Duration) -> Self {
        let topic = topic.to_string();
        let prefix = uuid::Uuid::new_v4().simple().to_string();
        let thread = std::thread::spawn(move || {
            let records: Vec<crate::Outgoing> = (0..total)
                .map(|n| {
                    let value = serde_json::json!({
                        "messageId": format!("{prefix}-{n}"),
                        "userId": format!("user-{}", n % 97),
                        "n": n,
                    });
                    (
                        Some(format!("user-{}", n % 97).into_bytes()),
                        Some(serde_json::to_vec(&value).expect("json")),
                        Vec::new(),
                    )
                })
                .collect();
            for part in records.chunks(chunk.max(1)) {
                crate::produce_full(&topic, part);
                std::thread::sleep(pause);
            }
        });
        Self {
            thread: Some(thread),
            total,
        }
    }

    /// Waits until every record is produced.
    pub fn finish(mut self) -> usize {
        if let Some(t) = self.thread.take() {
            t.join().expect("the source load's thread panicked");
        }
        self.total
    }
}

impl Drop for SourceLoad {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How many copies of each source record (by value) `topic` holds, read with read_committed.
pub fn copies_by_value(topic: &str) -> BTreeMap<Vec<u8>, usize> {
    let mut copies = BTreeMap::new();
    for r in crate::consume_all(topic, true) {
        *copies.entry(r.value.unwrap_or_default()).or_insert(0) += 1;
    }
    copies
}

/// Waits until `input` holds as many records as `source` (read with read_committed; at most
/// `timeout`), then asserts that it holds each source record exactly as often as the source does
/// (once, unless the source's own producer wrote it twice: those copies are counted apart and
/// printed): none missing, none copied twice, nothing else.
pub fn assert_copied_once(source: &str, input: &str, timeout: Duration, what: &str) {
    let expected = copies_by_value(source);
    let total: usize = expected.values().sum();
    let deadline = Instant::now() + timeout;
    let copied = loop {
        let copied = copies_by_value(input);
        let held: usize = copied.values().sum();
        if held >= total || Instant::now() > deadline {
            break copied;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let in_source_twice: usize = expected.values().map(|n| n.saturating_sub(1)).sum();
    let extra: usize = copied
        .iter()
        .map(|(v, n)| n.saturating_sub(expected.get(v).copied().unwrap_or(0)))
        .sum();
    let twice = copied
        .iter()
        .filter(|(v, n)| **n > expected.get(*v).copied().unwrap_or(0))
        .count();
    let missing: usize = expected
        .iter()
        .map(|(v, n)| n.saturating_sub(copied.get(v).copied().unwrap_or(0)))
        .sum();
    let foreign = copied.keys().filter(|v| !expected.contains_key(*v)).count();
    eprintln!(
        "{what}: {total} source records ({} distinct, {in_source_twice} extra copies by the source's own producer)",
        expected.len()
    );
    assert!(
        twice == 0 && missing == 0 && foreign == 0,
        "{what}: of {total} source records the input misses {missing}, holds {twice} more often \
         than the source ({extra} extra copies) and {foreign} not from the source"
    );
}

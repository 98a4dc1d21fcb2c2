//! The launcher of `dedupe rekey`: a spec, then a process whose stderr goes to a log file and
//! whose metrics are read from its listener.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

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
        }
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
            &brokers(),
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
}

impl Drop for Rekey {
    fn drop(&mut self) {
        self.kill();
    }
}

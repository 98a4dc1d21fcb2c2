//! The front door's launcher: `dedupe ingest` as a child process on free loopback ports, with a
//! write-keys file of its own, and requests to it.

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::http::{self, Response};
use crate::{metric_value, Dedupe};

/// `Authorization: Basic` for a write key (the key as the user, an empty password).
pub fn basic(key: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{key}:"))
    )
}

/// How to start `dedupe ingest`.
#[derive(Clone)]
pub struct IngestSpec {
    pub bin: Dedupe,
    pub topic: String,
    /// `--brokers`; None leaves it to the environment (`DEDUPE_KAFKA_BROKERS` in `env`) or the
    /// configuration's default.
    pub brokers: Option<String>,
    /// (write key, source) lines of its write-keys file.
    pub write_keys: Vec<(String, String)>,
    pub env: Vec<(String, String)>,
    /// Listen on every address (`0.0.0.0`) instead of loopback; requests still go to loopback.
    pub every_address: bool,
}

impl IngestSpec {
    pub fn new(bin: Dedupe, topic: &str) -> Self {
        Self {
            bin,
            topic: topic.into(),
            brokers: None,
            write_keys: Vec::new(),
            env: Vec::new(),
            every_address: false,
        }
    }

    /// Listens on every address (the test still sends to loopback only).
    pub fn every_address(mut self) -> Self {
        self.every_address = true;
        self
    }

    pub fn brokers(mut self, brokers: &str) -> Self {
        self.brokers = Some(brokers.into());
        self
    }

    pub fn write_key(mut self, key: &str, source: &str) -> Self {
        self.write_keys.push((key.into(), source.into()));
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.retain(|(key, _)| key != k);
        self.env.push((k.into(), v.into()));
        self
    }

    /// Starts it and waits until `/healthz` answers. A port found free can be taken by another
    /// test's process before the ingest binds it (tests run in parallel): that start is retried
    /// on other ports, a few times.
    pub fn start(&self) -> Ingest {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.try_start() {
                Ok(ingest) => return ingest,
                Err(log) if attempt < 5 && log.contains("Address already in use") => continue,
                Err(log) => panic!("dedupe ingest exited during start:\n{log}"),
            }
        }
    }

    fn try_start(&self) -> Result<Ingest, String> {
        let mut ingest = self.spawn();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = http::get(ingest.addr, "/healthz") {
                assert_eq!(r.status, 200);
                return Ok(ingest);
            }
            if let Ok(Some(status)) = ingest.child.try_wait() {
                return Err(format!("exit {status}\n{}", ingest.log_text()));
            }
            assert!(
                Instant::now() < deadline,
                "dedupe ingest did not answer /healthz within 30 s:\n{}",
                ingest.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts it without waiting for anything (the signal tests time their signals from here).
    pub fn spawn(&self) -> Ingest {
        let mut keys = tempfile::NamedTempFile::new().expect("a write-keys file");
        writeln!(keys, "# test keys").unwrap();
        for (key, source) in &self.write_keys {
            writeln!(keys, "{key} {source}").unwrap();
        }
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let listen = crate::free_port();
        let metrics_port = std::iter::repeat_with(crate::free_port)
            .find(|p| *p != listen)
            .expect("a second free port");
        let addr = SocketAddr::from(([127, 0, 0, 1], listen));
        let metrics = SocketAddr::from(([127, 0, 0, 1], metrics_port));
        let bind = if self.every_address {
            SocketAddr::from(([0, 0, 0, 0], listen))
        } else {
            addr
        };
        let mut cmd = self.bin.command();
        cmd.arg("ingest")
            .args(["--listen", &bind.to_string(), "--topic", &self.topic])
            .args(["--metrics-addr", &metrics.to_string()])
            .arg("--write-keys-file")
            .arg(keys.path())
            .env_remove("DEDUPE_WRITE_KEYS")
            .env_remove("DEDUPE_KAFKA_SASL_PASSWORD")
            .env("DEDUPE_LOG_LEVEL", "info")
            .stdin(Stdio::null())
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap());
        if let Some(b) = &self.brokers {
            cmd.args(["--brokers", b]);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start dedupe ingest");
        Ingest {
            child,
            addr,
            metrics,
            log,
            write_keys: self.write_keys.iter().map(|(k, _)| k.clone()).collect(),
            _keys: keys,
        }
    }
}

/// A running `dedupe ingest`, killed when dropped; its log must never hold a write key.
pub struct Ingest {
    pub child: Child,
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    log: tempfile::NamedTempFile,
    write_keys: Vec<String>,
    _keys: tempfile::NamedTempFile,
}

impl Ingest {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// A POST with `Content-Type: application/json` and these headers.
    pub fn post(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        let mut all = vec![("Content-Type", "application/json")];
        all.extend_from_slice(headers);
        self.request("POST", path, &all, body)
    }

    /// Any request, with exactly these headers.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        http::request(self.addr, method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", self.log_text()))
    }

    /// The sum of a metric's series with these labels on its /metrics (0 if none).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let page = http::get(self.metrics, "/metrics").expect("GET /metrics");
        metric_value(&String::from_utf8_lossy(&page.body), name, labels).unwrap_or(0.0)
    }

    /// A JSON POST, authenticated with `key` when there is one.
    pub fn post_json(&self, path: &str, key: Option<&str>, body: &serde_json::Value) -> Response {
        let auth = key.map(basic);
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        self.post(path, &headers, body.to_string().as_bytes())
    }

    /// Waits for the process to end: its status. Panics with its log, after killing it, if it
    /// still runs after `timeout`.
    pub fn wait_status(&mut self, timeout: Duration) -> std::process::ExitStatus {
        match crate::wait_for_exit(&mut self.child, timeout) {
            Some(status) => status,
            None => {
                let _ = self.child.kill();
                panic!(
                    "dedupe ingest did not exit within {timeout:?}:\n{}",
                    self.log_text()
                );
            }
        }
    }

    /// Whether it answers /healthz.
    pub fn healthy(&self) -> bool {
        http::get(self.addr, "/healthz").is_ok_and(|r| r.status == 200)
    }

    /// Waits until /readyz answers `status`.
    pub fn wait_ready(&self, status: u16) {
        crate::wait_until(
            &format!("/readyz answering {status}"),
            Duration::from_secs(60),
            Duration::from_millis(100),
            || (http::get(self.addr, "/readyz").ok()?.status == status).then_some(()),
            || self.log_text(),
        )
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let log = self.log_text();
        if !std::thread::panicking() {
            assert!(
                !self.write_keys.iter().any(|k| log.contains(k.as_str())),
                "a write key was logged:\n{log}"
            );
        }
    }
}

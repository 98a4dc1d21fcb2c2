//! The worker's launcher: `dedupe run` as a child process with its own ledger directory and
//! metrics port, and the metrics page read back.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{brokers, consume_all, http, tail, Dedupe};

/// A free loopback port for a child process to listen on, below the kernel's ephemeral range.
/// A port the kernel hands out for `bind(0)` comes from the range outgoing connections draw from
/// too, so a Kafka client connecting again and again (to a node a test killed) could take it
/// before the child bound it (seen once in a full suite: "Address already in use").
pub fn free_port() -> u16 {
    use rand::Rng;
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    // Below the test clusters' ports (29092 and up) and above the well-known services'.
    let (from, to) = (20000, ephemeral_from.min(29000));
    if to > from {
        let mut rng = rand::rng();
        for _ in 0..200 {
            let port = rng.random_range(from..to);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A `dedupe run` child process with its own ledger directory and metrics port.
pub struct Worker {
    pub child: std::process::Child,
    pub metrics_port: u16,
    /// Where its metrics listener is (127.0.0.1 unless the worker runs in another network namespace).
    pub metrics_host: std::net::IpAddr,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    /// The temporary directory its ledger is in, when the spec made one: kept while it runs.
    _temp: Option<Arc<tempfile::TempDir>>,
}

/// How to start a worker.
#[derive(Clone)]
pub struct WorkerSpec {
    pub bin: Dedupe,
    pub input: String,
    pub output: String,
    pub data_dir: PathBuf,
    pub partitions: Option<String>,
    pub env: Vec<(String, String)>,
    pub extra_args: Vec<String>,
    /// `--brokers` (the tests' broker if None).
    pub brokers: Option<String>,
    /// A command the worker runs under (e.g. `ip netns exec NAME`).
    pub wrapper: Vec<String>,
    /// The address its metrics listener binds (127.0.0.1 if None).
    pub metrics_host: Option<std::net::IpAddr>,
    /// Start it with SIGTERM, SIGINT and SIGHUP blocked (see [`crate::hold_signals`]).
    pub hold_signals: bool,
    /// The temporary directory `data_dir` is in, when the spec made one (see
    /// [`WorkerSpec::in_temp_dir`]): removed once the spec and every worker started from it are
    /// gone.
    temp: Option<Arc<tempfile::TempDir>>,
}

impl WorkerSpec {
    pub fn new(bin: Dedupe, input: &str, output: &str, data_dir: &Path) -> Self {
        Self {
            bin,
            input: input.into(),
            output: output.into(),
            data_dir: data_dir.to_path_buf(),
            partitions: None,
            env: vec![
                ("DEDUPE_WORKER_BATCH_MAX_RECORDS".into(), "500".into()),
                ("DEDUPE_WORKER_BATCH_LINGER_MS".into(), "5".into()),
                ("DEDUPE_LEDGER_BUDGET_BYTES".into(), "256MiB".into()),
                ("DEDUPE_LEDGER_WRITE_BUFFER_BYTES".into(), "8MiB".into()),
                (
                    "DEDUPE_WORKER_GROUP_ID".into(),
                    format!("dedupe-test-{}", uuid::Uuid::new_v4().simple()),
                ),
            ],
            extra_args: Vec::new(),
            brokers: None,
            wrapper: Vec::new(),
            metrics_host: None,
            hold_signals: false,
            temp: None,
        }
    }

    /// Like [`WorkerSpec::new`], with the ledger in a temporary directory of its own, removed
    /// once the spec and every worker started from it are dropped.
    pub fn in_temp_dir(bin: Dedupe, input: &str, output: &str) -> Self {
        let temp = tempfile::tempdir().expect("a temporary directory for the ledger");
        let mut spec = Self::new(bin, input, output, &temp.path().join("ledger"));
        spec.temp = Some(Arc::new(temp));
        spec
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.retain(|(key, _)| key != k);
        self.env.push((k.into(), v.into()));
        self
    }

    /// Adds command-line arguments (after the ones every worker gets).
    pub fn extra(mut self, args: &[&str]) -> Self {
        self.extra_args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Drops a setting, so the worker runs with the default (e.g. the default ledger budget).
    pub fn without(mut self, k: &str) -> Self {
        self.env.retain(|(key, _)| key != k);
        self
    }

    /// Starts `dedupe run`; its stderr goes to a log file in the data directory's parent.
    pub fn start(&self) -> Worker {
        let metrics_port = free_port();
        let log = self
            .data_dir
            .with_extension(format!("log-{}", uuid::Uuid::new_v4().simple()));
        let log_file = std::fs::File::create(&log).expect("log file");
        let metrics_host = self
            .metrics_host
            .unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
        let mut cmd = match self.wrapper.split_first() {
            None => self.bin.command(),
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(self.bin.path());
                cmd
            }
        };
        cmd.arg("run")
            .arg("--brokers")
            .arg(self.brokers.clone().unwrap_or_else(brokers))
            .arg("--input-topic")
            .arg(&self.input)
            .arg("--output-topic")
            .arg(&self.output)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--metrics-addr")
            .arg(std::net::SocketAddr::new(metrics_host, metrics_port).to_string())
            .args(&self.extra_args)
            .stdout(std::process::Stdio::null())
            .stderr(log_file);
        if let Some(p) = &self.partitions {
            cmd.arg("--partitions").arg(p);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if self.hold_signals {
            crate::hold_signals(&mut cmd);
        }
        let child = cmd.spawn().expect("spawn dedupe run");
        Worker {
            child,
            metrics_port,
            metrics_host,
            data_dir: self.data_dir.clone(),
            log,
            _temp: self.temp.clone(),
        }
    }
}

impl Worker {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The metrics page, if the worker serves it yet.
    pub fn metrics(&self) -> Option<String> {
        self.get("/metrics").map(|(_, body)| body)
    }

    /// GET on its metrics listener; (status, body), or None if nothing answers.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        let response = http::get(self.metrics_addr(), path).ok()?;
        Some((
            response.status,
            String::from_utf8_lossy(&response.body).into_owned(),
        ))
    }

    /// The sum of a metric's series whose labels include `labels`; 0 when the page lacks it or
    /// nothing answers yet.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.metrics()
            .and_then(|page| metric_value(&page, name, labels))
            .unwrap_or(0.0)
    }

    /// Waits until it has read at least `records` input records and published or dropped each
    /// one it read (its counters since it started).
    pub fn wait_settled(&self, records: usize, timeout: Duration) {
        let count = |name: &str| self.metric(name, &[]) as usize;
        crate::wait_until(
            "the worker has published or dropped every input record",
            timeout,
            Duration::from_millis(100),
            || {
                let read = count("dedupe_records_in_total");
                let done =
                    count("dedupe_records_out_total") + count("dedupe_duplicates_dropped_total");
                (read >= records && done == read).then_some(())
            },
            || {
                format!(
                    "read {}, published {}, dropped {}\n{}",
                    count("dedupe_records_in_total"),
                    count("dedupe_records_out_total"),
                    count("dedupe_duplicates_dropped_total"),
                    tail(&self.log_text(), 40)
                )
            },
        );
    }

    /// Where its metrics (and admin) listener is.
    pub fn metrics_addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.metrics_host, self.metrics_port)
    }

    /// An empty POST to its metrics listener (the admin endpoints) with these headers; panics if
    /// nothing answers.
    pub fn post(&self, path: &str, headers: &[(&str, &str)]) -> http::Response {
        http::request(self.metrics_addr(), "POST", path, headers, b"")
            .unwrap_or_else(|e| panic!("POST {path} to the worker: {e}\n{}", self.log_text()))
    }

    /// Waits until /readyz answers 200 (every owned partition recovered).
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((200, _)) = self.get("/readyz") {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the worker exited with {status} before it was ready:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the worker was not ready within {timeout:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends SIGTERM and waits for the exit code.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.wait(timeout)
    }

    /// Sends SIGTERM and asserts that the worker exits 0 within 30 s (its log otherwise).
    pub fn stop_cleanly(&mut self) {
        let code = self.terminate(Duration::from_secs(30));
        assert_eq!(
            code,
            Some(0),
            "SIGTERM should end the worker with exit 0:\n{}",
            self.log_text()
        );
    }

    /// SIGKILL: the crash case.
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The exit code if the process has exited (`Some(None)`: killed by a signal), else `None`.
    pub fn exited(&mut self) -> Option<Option<i32>> {
        self.child
            .try_wait()
            .ok()
            .flatten()
            .map(|status| status.code())
    }

    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        self.wait_status(timeout).code()
    }

    /// Waits for the process to end: its status (an exit code, or the signal that ended it).
    /// Panics with its log, after killing it, if it still runs after `timeout`.
    pub fn wait_status(&mut self, timeout: Duration) -> std::process::ExitStatus {
        match crate::wait_for_exit(&mut self.child, timeout) {
            Some(status) => status,
            None => {
                self.kill();
                panic!(
                    "the worker did not exit within {timeout:?}:\n{}",
                    self.log_text()
                );
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// GET http://127.0.0.1:port/path; (status, body), or None if nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let response = http::get(std::net::SocketAddr::from(([127, 0, 0, 1], port)), path).ok()?;
    Some((
        response.status,
        String::from_utf8_lossy(&response.body).into_owned(),
    ))
}

/// The sum of a counter's or gauge's series named `name` whose labels include `labels`, on a
/// metrics page; None when no series matches. Panics if the page is not the Prometheus text format.
pub fn metric_value(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    use prometheus_parse::{Scrape, Value};
    let scrape =
        Scrape::parse(page.lines().map(|l| Ok(l.to_owned()))).expect("a Prometheus text page");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .filter_map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
            _ => None,
        })
        .reduce(|a, b| a + b)
}

/// A worker kept running as an orchestrator would: restarted whenever it exits.
pub struct Supervised {
    pub worker: Arc<Mutex<Worker>>,
    exits: Arc<Mutex<Vec<Option<i32>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Supervised {
    pub fn start(spec: &WorkerSpec) -> Self {
        let mut first = spec.start();
        first.wait_ready(Duration::from_secs(120));
        let worker = Arc::new(Mutex::new(first));
        let exits = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (worker, exits, stop, spec) =
                (worker.clone(), exits.clone(), stop.clone(), spec.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut w = worker.lock().unwrap();
                    if let Ok(Some(status)) = w.child.try_wait() {
                        eprintln!(
                            "the worker exited with {status}; restarting it:\n{}",
                            tail(&w.log_text(), 15)
                        );
                        exits.lock().unwrap().push(status.code());
                        *w = spec.start();
                    }
                    drop(w);
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        Self {
            worker,
            exits,
            stop,
            thread: Some(thread),
        }
    }

    /// Waits until `topic` holds `expected` records; panics with the worker's log if it does not.
    pub fn wait_for_output(&self, topic: &str, expected: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let got = consume_all(topic, true).len();
            if got >= expected {
                return;
            }
            if Instant::now() > deadline {
                let w = self.worker.lock().unwrap();
                let page = w.metrics().unwrap_or_default();
                let interesting: Vec<&str> = page
                    .lines()
                    .filter(|l| {
                        !l.starts_with('#')
                            && (l.contains("lag")
                                || l.contains("ready")
                                || l.contains("errors")
                                || l.contains("transactions"))
                    })
                    .collect();
                panic!("{topic} holds {got} records, expected {expected}, after {timeout:?}\nworker metrics:\n{}\nworker log:\n{}", interesting.join("\n"), tail(&w.log_text(), 60));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Stops restarting, then stops the worker with SIGTERM; the exit codes of every restart.
    pub fn finish(mut self) -> Vec<Option<i32>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .unwrap()
            .join()
            .expect("the supervising thread");
        let mut w = self.worker.lock().unwrap();
        let code = w.terminate(Duration::from_secs(60));
        assert_eq!(
            code,
            Some(0),
            "the worker did not stop cleanly:\n{}",
            tail(&w.log_text(), 40)
        );
        self.exits.lock().unwrap().clone()
    }
}

impl Drop for Supervised {
    /// A test that failed half-way stops restarting before its data directory goes.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec's temporary ledger directory outlives the spec while a worker started from it
    /// runs (a test may start one straight from a spec it does not keep), and goes with both.
    #[test]
    fn a_temporary_ledger_directory_lives_while_its_spec_or_a_worker_from_it_does() {
        // `true` stands for the binary: it takes any arguments and exits 0; no broker is asked.
        let mut spec = WorkerSpec::in_temp_dir(Dedupe::at("/bin/true"), "in", "out");
        spec.brokers = Some("127.0.0.1:1".into());
        let dir = spec
            .data_dir
            .parent()
            .expect("the ledger's parent")
            .to_path_buf();
        assert!(dir.is_dir(), "made with the spec");
        let mut worker = spec.start();
        drop(spec);
        assert!(dir.is_dir(), "kept while the worker lives");
        assert_eq!(worker.wait(Duration::from_secs(10)), Some(0));
        drop(worker);
        assert!(!dir.exists(), "removed with the last of them");
    }
}

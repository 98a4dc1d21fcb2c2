//! Operator tools: `dedupe verify` (does the output hold every input id exactly once?) and
//! `dedupe loadgen` (keyed UUIDv4 messages, a share of them re-sent as retrying clients do).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use dedupe::config::{Config, IdSource};
use dedupe::identity::LedgerKey;
use dedupe::identity::{message_key, RecordView};
use rand::Rng;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use serde::Serialize;

/// What `dedupe verify` found.
#[derive(Debug, Serialize)]
pub struct VerifySummary {
    pub input_records: u64,
    pub input_unkeyed: u64,
    pub distinct_input_ids: u64,
    pub output_records: u64,
    pub output_unkeyed: u64,
    pub duplicate_ids_in_output: u64,
    pub input_ids_missing_from_output: u64,
    pub output_ids_not_in_input: u64,
    pub ok: bool,
}

fn key_of(m: &rdkafka::message::BorrowedMessage<'_>, source: &IdSource) -> Option<LedgerKey> {
    let headers = m.headers();
    let view = RecordView {
        key: m.key(),
        header: |name: &str| {
            headers.and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
        },
        value: m.payload(),
    };
    message_key(&view, source).ok()
}

/// Reads both topics fully (`read_committed`) and compares their ids.
pub fn verify(config: &Config, timeout: Duration) -> anyhow::Result<VerifySummary> {
    let w = &config.worker;
    let mut input_ids = HashSet::new();
    let mut input_unkeyed = 0u64;
    let input_records =
        dedupe::kafka::read_to_end(&config.kafka, &w.input_topic, true, timeout, &mut |m| {
            match key_of(m, &w.id_source) {
                Some(k) => {
                    input_ids.insert(k);
                }
                None => input_unkeyed += 1,
            }
        })
        .with_context(|| format!("reading the input topic {}", w.input_topic))?;
    let mut output_counts: HashMap<LedgerKey, u32> = HashMap::new();
    let mut output_unkeyed = 0u64;
    let output_records =
        dedupe::kafka::read_to_end(&config.kafka, &w.output_topic, true, timeout, &mut |m| {
            match key_of(m, &w.id_source) {
                Some(k) => *output_counts.entry(k).or_default() += 1,
                None => output_unkeyed += 1,
            }
        })
        .with_context(|| format!("reading the output topic {}", w.output_topic))?;
    let duplicates = output_counts.values().filter(|&&c| c > 1).count() as u64;
    let missing = input_ids
        .iter()
        .filter(|k| !output_counts.contains_key(k))
        .count() as u64;
    let extra = output_counts
        .keys()
        .filter(|k| !input_ids.contains(k))
        .count() as u64;
    Ok(VerifySummary {
        input_records,
        input_unkeyed,
        distinct_input_ids: input_ids.len() as u64,
        output_records,
        output_unkeyed,
        duplicate_ids_in_output: duplicates,
        input_ids_missing_from_output: missing,
        output_ids_not_in_input: extra,
        ok: duplicates == 0 && missing == 0 && extra == 0,
    })
}

/// Counts the records the brokers refused for good (after the producer's own retries, within
/// `message.timeout.ms`), keeping the first error.
#[derive(Default)]
struct DeliveryTally {
    failed: std::sync::atomic::AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

impl ClientContext for DeliveryTally {}

impl ProducerContext for DeliveryTally {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.first_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| e.to_string());
        }
    }
}

/// What `dedupe loadgen` sent.
#[derive(Debug, Serialize)]
pub struct LoadgenSummary {
    pub records_sent: u64,
    pub distinct_ids: u64,
    /// Retries: records that re-send an earlier record as it was (the same key and value).
    pub resent: u64,
    /// Records that reuse an earlier id for another value (a client bug the worker calls a
    /// reused id).
    pub reused: u64,
    pub seconds: f64,
    pub records_per_sec: f64,
    /// Every `sample_every`-th new id with the time it was stamped with (ms), for a caller that
    /// sends some of them again later.
    #[serde(skip)]
    pub samples: Vec<(String, i64)>,
}

/// What `loadgen` produces.
#[derive(Debug, Clone, Copy)]
pub struct Load<'a> {
    pub topic: &'a str,
    /// Records to produce.
    pub count: u64,
    /// The share of records that re-send an earlier record as it was (a retry)...
    pub dup_ratio: f64,
    /// The share of records that reuse an earlier id for another value.
    pub reused_ratio: f64,
    /// ...sent at least this long before, when there is one that old.
    pub dup_delay: Duration,
    /// Approximate size of each record's value.
    pub value_bytes: usize,
    /// At most this many records per second; as fast as the broker takes them if None.
    pub rate_per_sec: Option<f64>,
    pub show_progress: bool,
    /// Stamp the records with times spread evenly over this span, ending now (the first-seen
    /// times of a partition that has been running that long); the producer's clock if None.
    pub spread_timestamps: Option<Duration>,
    /// Keep every this-many-th new id in the summary's `samples` (0: none).
    pub sample_every: u64,
}

/// Produces `count` records keyed by UUIDv4; a share `dup_ratio` of them re-send a record sent
/// `dup_delay` earlier (or a recent one, when nothing is that old yet) with the same key and
/// value, as a retrying client does; a share `reused_ratio` reuse a recent id for a new value.
pub fn loadgen(config: &Config, load: Load<'_>) -> anyhow::Result<LoadgenSummary> {
    let Load {
        topic,
        count,
        dup_ratio,
        reused_ratio,
        dup_delay,
        value_bytes,
        rate_per_sec,
        show_progress,
        spread_timestamps,
        sample_every,
    } = load;
    let spread_from =
        spread_timestamps.map(|span| dedupe::recovery::now_ms() - span.as_millis() as i64);
    dedupe::kafka::check_security(&config.kafka, Duration::from_secs(15))
        .with_context(|| format!("connecting to {}", config.kafka.brokers))?;
    // A broker that restarts or a leader that moves is ridden out by the producer's retries
    // (idempotent, so without duplicates) for up to `message.timeout.ms`; a record that is still
    // not delivered then makes the run fail, so a summary never counts ids the topic lacks.
    let producer: ThreadedProducer<DeliveryTally> = dedupe::kafka::client_config(&config.kafka)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "10")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.kbytes", "262144")
        .create_with_context(DeliveryTally::default())
        .context("creating the loadgen producer")?;
    let bar = if show_progress {
        indicatif::ProgressBar::new(count)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut rng = rand::rng();
    // Recent records as sent (when, id, value), for retries and reused ids to draw from.
    let mut recent: std::collections::VecDeque<(Instant, String, String)> =
        std::collections::VecDeque::new();
    let mut distinct = 0u64;
    let mut resent = 0u64;
    let mut reused = 0u64;
    let mut samples = Vec::new();
    let started = Instant::now();
    let filler: String = "x".repeat(value_bytes.saturating_sub(90));
    let (dup_ratio, reused_ratio) = (dup_ratio.clamp(0.0, 1.0), reused_ratio.clamp(0.0, 1.0));
    for i in 0..count {
        let draw: f64 = rng.random();
        let kind = match recent.is_empty() {
            true => Sent::New,
            false if draw < dup_ratio => Sent::Retry,
            false if draw < dup_ratio + reused_ratio => Sent::Reused,
            false => Sent::New,
        };
        let (id, value) = match kind {
            Sent::Retry => {
                resent += 1;
                // The oldest record at least dup_delay old, else a random recent one.
                let now = Instant::now();
                let due = recent
                    .iter()
                    .position(|(t, _, _)| now.duration_since(*t) >= dup_delay);
                let idx = due.unwrap_or_else(|| rng.random_range(0..recent.len()));
                (recent[idx].1.clone(), recent[idx].2.clone())
            }
            Sent::Reused => {
                reused += 1;
                let id = recent[rng.random_range(0..recent.len())].1.clone();
                let value =
                    format!(r#"{{"messageId":"{id}","seq":{i},"type":"track","pad":"{filler}"}}"#);
                (id, value)
            }
            Sent::New => {
                distinct += 1;
                let id = uuid::Uuid::new_v4().to_string();
                let value =
                    format!(r#"{{"messageId":"{id}","seq":{i},"type":"track","pad":"{filler}"}}"#);
                recent.push_back((Instant::now(), id.clone(), value.clone()));
                if recent.len() > 10_000 {
                    recent.pop_front();
                }
                (id, value)
            }
        };
        let resend = kind != Sent::New;
        let mut record = BaseRecord::to(topic).key(&id).payload(&value);
        let stamp = match (spread_from, spread_timestamps) {
            (Some(from), Some(span)) => {
                Some(from + (span.as_millis() as u64 * i / count.max(1)) as i64)
            }
            _ => None,
        };
        if let Some(ms) = stamp {
            record = record.timestamp(ms);
        }
        if !resend && sample_every > 0 && distinct.is_multiple_of(sample_every) {
            samples.push((id.clone(), stamp.unwrap_or_else(dedupe::recovery::now_ms)));
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull,
                    ),
                    r,
                )) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(e).context("producing a loadgen record"),
            }
        }
        if i % 1024 == 0 {
            bar.set_position(i);
        }
        if let Some(rate) = rate_per_sec {
            // Pace the load: never run ahead of `rate` records per second.
            let due = started + Duration::from_secs_f64((i + 1) as f64 / rate);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
    }
    producer
        .flush(Duration::from_secs(360))
        .context("flushing loadgen records")?;
    bar.finish_and_clear();
    let tally = producer.context();
    let failed = tally.failed.load(std::sync::atomic::Ordering::Relaxed);
    if failed > 0 {
        let first = tally
            .first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default();
        anyhow::bail!("{failed} of {count} loadgen records were not delivered to {topic} (first error: {first})");
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(LoadgenSummary {
        records_sent: count,
        distinct_ids: distinct,
        resent,
        reused,
        seconds,
        records_per_sec: count as f64 / seconds,
        samples,
    })
}

/// What one loadgen record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    New,
    /// An earlier record sent again as it was.
    Retry,
    /// An earlier id with a new value.
    Reused,
}

/// `dedupe ledger stats`: the ledger's stats and every partition's progress, as JSON. The
/// ledger must not be open in a running worker (RocksDB allows one process); the worker exports
/// the same figures on /metrics.
pub fn ledger_stats(config: &Config) -> anyhow::Result<serde_json::Value> {
    let path = &config.worker.data_dir;
    if !path.join("CURRENT").exists() {
        anyhow::bail!("no ledger at {}", path.display());
    }
    let ledger =
        dedupe::ledger::Ledger::open_existing(path, crate::run::maintenance_ledger_options(config))
            .with_context(|| {
                format!(
                    "opening the ledger at {} (is a worker running on it?)",
                    path.display()
                )
            })?;
    let s = ledger.stats()?;
    let now = dedupe::recovery::now_ms();
    let mut partitions = serde_json::Map::new();
    for (p, bytes) in ledger.all_progress()? {
        let entry = match dedupe::progress::Progress::decode(&bytes) {
            Ok(pr) => serde_json::json!({
                "next_input_offset": pr.next_input_offset,
                "next_output_offset": pr.next_output_offset,
                "window_seconds": ledger.window(p, now).map(|w| w.as_secs_f64()),
            }),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        partitions.insert(p.to_string(), entry);
    }
    Ok(serde_json::json!({
        "path": path,
        "ids_estimate": s.ids_estimate,
        "live_sst_bytes": s.live_sst_bytes,
        "total_sst_bytes": s.total_sst_bytes,
        "memtable_bytes": s.memtable_bytes,
        "generations": s.generations,
        "filter_bytes": s.filter_bytes,
        // This command opens the ledger without its id index; a worker builds one this large.
        "index_bytes_when_running": crate::run::ledger_options(config).index_bytes(),
        "budget_bytes": config.ledger.budget_bytes.0,
        "oldest_first_seen_ms": s.oldest_first_seen_ms,
        "newest_first_seen_ms": s.newest_first_seen_ms,
        "window_seconds": ledger.window_overall(now).map(|w| w.as_secs_f64()),
        "partitions": partitions,
    }))
}

/// `dedupe ledger snapshot`: asks the running worker (its metrics address) to take a snapshot;
/// when no worker answers there, checkpoints the ledger directly.
pub fn ledger_snapshot(config: &Config) -> anyhow::Result<serde_json::Value> {
    let addr = config.metrics.addr;
    let mut request = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        // A snapshot with its hook may take as long as the hook's timeout.
        .timeout_read(Duration::from_secs(
            config.snapshots.hook_timeout_secs + 300,
        ))
        .build()
        .post(&format!("http://{addr}/admin/snapshot"));
    if let Some(token) = &config.metrics.admin_token {
        request = request.set("Authorization", &format!("Bearer {}", token.expose()));
    }
    let answered = match request.call() {
        Ok(response) => Ok(response),
        Err(ureq::Error::Status(_, response)) => Err(response),
        // No worker listens there: checkpoint the stopped worker's ledger directly.
        Err(ureq::Error::Transport(t)) if t.kind() == ureq::ErrorKind::ConnectionFailed => {
            return ledger_snapshot_offline(config)
        }
        Err(ureq::Error::Transport(t)) => {
            anyhow::bail!("asking the worker at {addr} for a snapshot: {t}")
        }
    };
    match answered {
        Ok(response) => Ok(serde_json::from_reader(response.into_reader())?),
        Err(response) => {
            let status = response.status();
            let body = response.into_string().unwrap_or_default();
            anyhow::bail!("the worker at {addr} could not take a snapshot ({status}): {body}")
        }
    }
}

/// Checkpoints a stopped worker's ledger directly, as the worker would.
fn ledger_snapshot_offline(config: &Config) -> anyhow::Result<serde_json::Value> {
    let root = config
        .snapshots
        .dir
        .clone()
        .context("no worker answers on metrics.addr and snapshots.dir is not configured")?;
    let ledger = dedupe::ledger::Ledger::open_existing(
        &config.worker.data_dir,
        crate::run::maintenance_ledger_options(config),
    )
    .with_context(|| format!("opening the ledger at {}", config.worker.data_dir.display()))?;
    let slot = dedupe::snapshot::SnapshotSlot::reserve(&root)?;
    let progress = match ledger.checkpoint(&slot.partial) {
        Ok(progress) => progress,
        Err(e) => {
            slot.discard();
            return Err(e)
                .with_context(|| format!("checkpointing the ledger into {}", slot.dir.display()));
        }
    };
    slot.publish()?;
    dedupe::snapshot::prune(&root, config.snapshots.keep, dedupe::recovery::now_ms())?;
    if let Some(hook) = &config.snapshots.hook {
        let parts: Vec<i32> = progress.keys().copied().collect();
        let timeout = Duration::from_secs(config.snapshots.hook_timeout_secs);
        dedupe::snapshot::run_hook(hook, &slot.dir, &parts, &config.snapshots.hook_env, timeout)?;
    }
    Ok(serde_json::json!({ "snapshot": slot.dir }))
}

/// `dedupe ledger restore --from DIR`: copies a checkpoint into the (stopped) worker's ledger
/// directory. An existing ledger is moved aside (`<dir>.replaced-<unix ms>`) only with `force`,
/// never deleted.
pub fn ledger_restore(
    config: &Config,
    from: &std::path::Path,
    force: bool,
) -> anyhow::Result<serde_json::Value> {
    let target = &config.worker.data_dir;
    // The checkpoint must open as a ledger before anything is touched.
    let checkpoint =
        dedupe::ledger::Ledger::open_existing(from, crate::run::maintenance_ledger_options(config))
            .with_context(|| format!("{} is not a ledger checkpoint that opens", from.display()))?;
    let progress = checkpoint.all_progress()?;
    drop(checkpoint);
    let mut moved_aside = None;
    let used = std::fs::read_dir(target)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if used {
        if !force {
            anyhow::bail!(
                "{} already holds a ledger; stop the worker and pass --force to move it aside",
                target.display()
            );
        }
        let aside = std::path::PathBuf::from(format!(
            "{}.replaced-{}",
            target.display(),
            dedupe::recovery::now_ms()
        ));
        std::fs::rename(target, &aside)
            .with_context(|| format!("moving {} aside", target.display()))?;
        moved_aside = Some(aside);
    }
    dedupe::ledger::Ledger::restore_from(from, target, false)
        .with_context(|| format!("restoring {} into {}", from.display(), target.display()))?;
    let partitions: Vec<serde_json::Value> = progress
        .iter()
        .map(|(p, bytes)| match dedupe::progress::Progress::decode(bytes) {
            Ok(pr) => serde_json::json!({ "partition": p, "next_input_offset": pr.next_input_offset, "next_output_offset": pr.next_output_offset }),
            Err(e) => serde_json::json!({ "partition": p, "error": e.to_string() }),
        })
        .collect();
    Ok(
        serde_json::json!({ "restored": target, "from": from, "moved_aside": moved_aside, "progress": partitions }),
    )
}

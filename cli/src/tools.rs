//! Operator tools: `dedupe verify` (does the output hold every input id exactly once?) and the
//! ledger's `stats`, `snapshot` and `restore`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::Context as _;
use dedupe::config::{Config, IdSource};
use dedupe::identity::LedgerKey;
use dedupe::identity::{message_key, message_view};
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
    message_key(&message_view(m), source).ok()
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

/// `dedupe ledger stats`: the ledger's stats and every partition's progress, as JSON. The
/// ledger must not be open in a running worker (RocksDB allows one process); the worker exports
/// the same figures on /metrics.
pub fn ledger_stats(config: &Config) -> anyhow::Result<serde_json::Value> {
    let path = &config.worker.data_dir;
    if !path.join("CURRENT").exists() {
        anyhow::bail!("no ledger at {}", path.display());
    }
    let ledger = dedupe::ledger::Ledger::open_existing(path, config.ledger.maintenance_options())
        .with_context(|| {
        format!(
            "opening the ledger at {} (is a worker running on it?)",
            path.display()
        )
    })?;
    let s = ledger.stats()?;
    let now = dedupe::clock::now_ms();
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
    let (forgotten, resent) = ledger.mark_counts();
    Ok(serde_json::json!({
        "path": path,
        "ids_estimate": s.ids_estimate,
        // Marks of `dedupe forget`: ids forgotten (their next copy is published), and ids
        // published again since.
        "forgotten_ids": forgotten,
        "resent_ids": resent,
        "live_sst_bytes": s.live_sst_bytes,
        "total_sst_bytes": s.total_sst_bytes,
        "memtable_bytes": s.memtable_bytes,
        "generations": s.generations,
        "filter_bytes": s.filter_bytes,
        // This command opens the ledger without its id index; a worker builds one this large.
        "index_bytes_when_running": config.ledger.options().index_bytes(),
        "budget_bytes": config.ledger.budget_bytes.0,
        "oldest_first_seen_ms": s.oldest_first_seen_ms,
        "newest_first_seen_ms": s.newest_first_seen_ms,
        // The retention limit the ledger was last opened for writing under (null: none), which
        // may not be the configuration's: a snapshot's ledger says what it was kept under.
        "retention_limit_ms": s.retention_limit_ms,
        "window_seconds": ledger.window_overall(now).map(|w| w.as_secs_f64()),
        "partitions": partitions,
    }))
}

/// `dedupe ledger snapshot`: asks the running worker (its metrics address) to take a snapshot;
/// when no worker answers there, checkpoints the ledger directly.
pub fn ledger_snapshot(config: &Config) -> anyhow::Result<serde_json::Value> {
    let addr = config.metrics.addr;
    let request = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        // A snapshot with its hook may take as long as the hook's timeout.
        .timeout_read(Duration::from_secs(
            config.snapshots.hook_timeout_secs + 300,
        ))
        .build()
        .post(&format!("http://{addr}/admin/snapshot"));
    let answered = match crate::admin_client::authorized(request, config).call() {
        Ok(response) => Ok(response),
        Err(ureq::Error::Status(_, response)) => Err(response),
        // No worker listens there: checkpoint the stopped worker's ledger directly.
        Err(ureq::Error::Transport(t)) if t.kind() == ureq::ErrorKind::ConnectionFailed => {
            return ledger_snapshot_offline(config)
        }
        Err(ureq::Error::Transport(t)) => anyhow::bail!(
            "asking the worker at {addr} for a snapshot: {}",
            crate::admin_client::transport_error(&t)
        ),
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
        config.ledger.maintenance_options(),
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
    dedupe::snapshot::prune(
        &root,
        config.snapshots.keep,
        dedupe::clock::now_ms(),
        config.ledger.options().max_window_ms,
    )?;
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
        dedupe::ledger::Ledger::open_existing(from, config.ledger.maintenance_options())
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
            dedupe::clock::now_ms()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stopped worker's ledger in a fresh directory, last opened under `limit_ms`, and a
    /// configuration pointing at it.
    fn stopped_ledger(limit_ms: Option<i64>) -> (tempfile::TempDir, Config) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.worker.data_dir = dir.path().to_path_buf();
        config.ledger.budget_bytes = dedupe::config::ByteSize(256 << 20);
        config.ledger.write_buffer_bytes = dedupe::config::ByteSize(1 << 20);
        config.ledger.block_cache_bytes = dedupe::config::ByteSize(1 << 20);
        let options = dedupe::ledger::LedgerOptions {
            max_window_ms: limit_ms,
            ..config.ledger.options()
        };
        let ledger = dedupe::ledger::Ledger::open(dir.path(), options).unwrap();
        ledger.close().unwrap();
        (dir, config)
    }

    #[test]
    fn ledger_stats_show_the_retention_limit_the_ledger_was_kept_under() {
        // Opened by a worker with a 20 s limit: the stats say so, whatever the configuration
        // asking now says (its default is no limit).
        let (_dir, config) = stopped_ledger(Some(20_000));
        let stats = ledger_stats(&config).unwrap();
        assert_eq!(stats["retention_limit_ms"], 20_000, "{stats}");
        // Without a limit the key is there, and null.
        let (_dir, config) = stopped_ledger(None);
        let stats = ledger_stats(&config).unwrap();
        assert!(stats["retention_limit_ms"].is_null(), "{stats}");
        assert!(stats
            .as_object()
            .unwrap()
            .contains_key("retention_limit_ms"));
    }
}

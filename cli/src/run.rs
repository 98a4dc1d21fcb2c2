//! `dedupe run`: open the ledger, check the topics, start the actors, wait for a signal.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use anyhow::{bail, Context as _};
use dedupe::config::{Assignment, Config};
use dedupe::ledger::Ledger;

use crate::signals::{stopped_while_starting, unless_stopped, Hangups, Signals};
use dedupe_actors::coordinator::{exit, Coordinator, Health, RunOptions, Shutdown};
use dedupe_actors::events::{ConfigReloadRefused, ConfigReloaded};
use dedupe_actors::ledger::LedgerActor;

/// Which input partitions this worker owns (in static mode; none up front in group mode), and how
/// many the input has, after checking the input and output topics and making sure the id
/// changelog and the duplicate audit are there.
pub fn owned_partitions(config: &Config) -> anyhow::Result<(Vec<i32>, usize)> {
    let all = check_topics(config)?;
    let input = all.len();
    check_group(config, &all)?;
    ensure_changelog(config, input)?;
    ensure_audit(config, input)?;
    if config.worker.assignment == Assignment::Group {
        return Ok((Vec::new(), input));
    }
    let w = &config.worker;
    let owned = match (&w.partitions, w.worker_index, w.worker_count) {
        (Some(set), _, _) => {
            if let Some(p) = set.0.iter().find(|&&p| p as usize >= input) {
                bail!("worker.partitions names partition {p}, but the input topic {} has only {input}", w.input_topic);
            }
            set.0.clone()
        }
        (None, Some(i), Some(n)) => all
            .into_iter()
            .filter(|p| u32::try_from(*p).is_ok_and(|p| p % n == i))
            .collect(),
        _ => all,
    };
    if owned.is_empty() {
        bail!(
            "this worker owns no partition of {} ({input} partitions)",
            w.input_topic
        );
    }
    Ok((owned, input))
}

/// Checks that the input and output topics exist and fit; returns every input partition.
fn check_topics(config: &Config) -> anyhow::Result<Vec<i32>> {
    let w = &config.worker;
    let t = Duration::from_secs(15);
    let input =
        dedupe::kafka::partition_count(&config.kafka, &w.input_topic, t).with_context(|| {
            format!(
                "reading metadata of {} from {}",
                w.input_topic, config.kafka.brokers
            )
        })?;
    let Some(input) = input else {
        bail!(
            "the input topic {} does not exist on {}; create it (partitioned by message id)",
            w.input_topic,
            config.kafka.brokers
        )
    };
    let output = dedupe::kafka::partition_count(&config.kafka, &w.output_topic, t)
        .with_context(|| format!("reading metadata of {}", w.output_topic))?;
    let Some(output) = output else {
        bail!(
            "the output topic {} does not exist; create it with at least {input} partitions",
            w.output_topic
        )
    };
    if output < input {
        bail!(
            "the output topic {} has {output} partitions but the input {} has {input}; the output needs at least {input}",
            w.output_topic,
            w.input_topic
        );
    }
    Ok((0..input as i32).collect())
}

/// Refuses a consumer group whose committed offsets belong to another pipeline (another output
/// topic): see `dedupe::output::owner`.
fn check_group(config: &Config, partitions: &[i32]) -> anyhow::Result<()> {
    let w = &config.worker;
    let group = w.group_id();
    let committed = dedupe::output::owner::committed_metadata(
        &config.kafka,
        &group,
        &w.input_topic,
        partitions,
        Duration::from_secs(30),
    )
    .with_context(|| format!("reading the committed offsets of consumer group {group}"))?;
    dedupe::output::owner::check_owner(&group, &w.input_topic, &w.output_topic, &committed)?;
    Ok(())
}

/// A topic of the worker's own (the changelog, the audit): its configuration key, what it is, its
/// name, and the retention it is created with.
struct OwnTopic<'a> {
    key: &'a str,
    what: &'a str,
    name: &'a str,
    retention_secs: u64,
    /// `segment.ms` to create it with, if not the broker's default.
    segment_secs: Option<u64>,
}

/// Makes sure `topic` has at least `partitions` partitions (its records go to the input
/// partition's number); creates it when it is missing, with its retention and `cleanup.policy =
/// delete` (`if_not_created` completes the error then). True when it existed before.
fn ensure_own_topic(
    config: &Config,
    topic: &OwnTopic<'_>,
    partitions: usize,
    if_not_created: &str,
) -> anyhow::Result<bool> {
    let OwnTopic {
        key,
        what,
        name,
        retention_secs,
        segment_secs,
    } = *topic;
    let existing = dedupe::kafka::partition_count(&config.kafka, name, Duration::from_secs(15))
        .with_context(|| format!("{key}: reading metadata of {name}"))?;
    match existing {
        None => {
            let retention_ms = (retention_secs * 1000).to_string();
            let segment_ms = segment_secs.map(|s| (s * 1000).to_string());
            let mut configs = vec![
                ("cleanup.policy", "delete"),
                ("retention.ms", retention_ms.as_str()),
            ];
            if let Some(ms) = &segment_ms {
                configs.push(("segment.ms", ms.as_str()));
            }
            futures::executor::block_on(dedupe::kafka::create_topic(&config.kafka, name, partitions as i32, -1, &configs))
                .with_context(|| format!("{key}: {what} {name} does not exist and could not be created; create it with {partitions} partitions{if_not_created}"))?;
            tracing::info!(topic = %name, partitions, retention_secs, "Created {what} topic.");
            Ok(false)
        }
        Some(n) if n < partitions => {
            bail!("{key}: {what} {name} has {n} partitions but the input has {partitions}; it needs at least {partitions}")
        }
        Some(_) => Ok(true),
    }
}

/// Makes sure the id changelog exists with as many partitions as the input and keeps ids at
/// least `worker.promised_window_secs`; creates it (with `worker.changelog_retention_secs`) when
/// it is missing. With a retention limit (`ledger.max_window_secs`), the changelog keeps no id
/// longer than the limit plus one generation's span either: it is created with `retention.ms` at
/// most the limit and `segment.ms` the span, and an existing one whose `retention.ms` plus
/// `segment.ms` exceed the limit plus the span is refused.
fn ensure_changelog(config: &Config, input_partitions: usize) -> anyhow::Result<()> {
    let w = &config.worker;
    let name = w.changelog_topic();
    let limit = ChangelogLimit::of(config);
    let topic = OwnTopic {
        key: "worker.changelog_topic",
        what: "the id changelog",
        name: &name,
        retention_secs: limit.map_or(w.changelog_retention_secs, |l| {
            w.changelog_retention_secs.min(l.limit_secs)
        }),
        segment_secs: limit.map(|l| l.span_secs),
    };
    let if_not_created = format!(" and retention.ms >= {} s", w.promised_window_secs);
    if !ensure_own_topic(config, &topic, input_partitions, &if_not_created)? {
        return Ok(());
    }
    let setting = |key: &str| {
        futures::executor::block_on(dedupe::kafka::topic_setting_ms(&config.kafka, &name, key))
            .with_context(|| format!("worker.changelog_topic: reading the configuration of {name}"))
    };
    let retention = setting("retention.ms")?;
    if let Some(ms) = retention.filter(|&ms| ms >= 0) {
        if (ms as u64) < w.promised_window_secs * 1000 {
            bail!(
                "worker.promised_window_secs: the id changelog {name} keeps records {} s (retention.ms), less than the promised window of {} s; raise its retention.ms",
                ms / 1000,
                w.promised_window_secs
            );
        }
    }
    if let Some(limit) = limit {
        limit.check(&name, retention, setting("segment.ms")?)?;
    }
    Ok(())
}

/// What the retention limit asks of the id changelog.
#[derive(Clone, Copy)]
struct ChangelogLimit {
    limit_secs: u64,
    /// One generation's span: the limit over `ledger.generations`, at least a second.
    span_secs: u64,
}

impl ChangelogLimit {
    fn of(config: &Config) -> Option<ChangelogLimit> {
        let limit_secs = config.ledger.max_window_secs?;
        let span_ms = dedupe::ledger::generation_span_ms(
            (limit_secs as i64).saturating_mul(1000),
            config.ledger.generations as u32,
        );
        Some(ChangelogLimit {
            limit_secs,
            span_secs: (span_ms / 1000).max(1) as u64,
        })
    }

    /// Refuses a changelog that can keep a record longer than the limit plus the span: Kafka
    /// deletes a segment once its newest record is `retention.ms` old, and a segment takes records
    /// for up to `segment.ms` (the broker's default, a week, when the topic does not say).
    fn check(
        &self,
        name: &str,
        retention_ms: Option<i64>,
        segment_ms: Option<i64>,
    ) -> anyhow::Result<()> {
        const BROKER_DEFAULT_SEGMENT_MS: i64 = 7 * 86_400_000;
        let bound_ms = (self.limit_secs + self.span_secs) as i64 * 1000;
        let segment = segment_ms
            .filter(|&ms| ms > 0)
            .unwrap_or(BROKER_DEFAULT_SEGMENT_MS);
        let keeps = match retention_ms {
            Some(ms) if ms >= 0 => ms.saturating_add(segment),
            _ => i64::MAX,
        };
        if keeps > bound_ms {
            let retention = retention_ms
                .filter(|&ms| ms >= 0)
                .map_or("forever (-1)".to_string(), |ms| format!("{} s", ms / 1000));
            bail!(
                "ledger.max_window_secs: the id changelog {name} can keep an id {} (retention.ms {retention} plus segment.ms {} s), longer than the retention limit of {} s plus a generation's span of {} s; set its retention.ms to at most {} and its segment.ms to at most {} (kafka-configs.sh --alter --entity-type topics --entity-name {name} --add-config retention.ms=...,segment.ms=...)",
                if keeps == i64::MAX { "forever".to_string() } else { format!("up to {} s", keeps / 1000) },
                segment / 1000,
                self.limit_secs,
                self.span_secs,
                self.limit_secs * 1000,
                self.span_secs * 1000,
            );
        }
        Ok(())
    }
}

/// Makes sure the duplicate audit topic, when on, exists with as many partitions as the input;
/// creates it (with `worker.audit_retention_secs`) when it is missing.
fn ensure_audit(config: &Config, input_partitions: usize) -> anyhow::Result<()> {
    let w = &config.worker;
    let Some(name) = w.audit_topic() else {
        return Ok(());
    };
    let topic = OwnTopic {
        key: "worker.audit_topic",
        what: "the duplicate audit",
        name: &name,
        retention_secs: w.audit_retention_secs,
        segment_secs: None,
    };
    ensure_own_topic(
        config,
        &topic,
        input_partitions,
        ", or set worker.audit_topic = \"\" to turn the audit off",
    )?;
    Ok(())
}

/// Why the ledger's directory could not be made; for a directory this user may not write (a
/// volume owned by root, as a fresh Kubernetes volume without `fsGroup` is), who this user is.
fn data_dir_error(path: &std::path::Path, e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        // SAFETY: getuid and getgid take no arguments and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        anyhow::anyhow!(
            "creating the ledger directory {}: permission denied to uid {uid} (gid {gid}); give the volume to that user (chown {uid}:{gid}, or Kubernetes securityContext.fsGroup: {gid})",
            path.display()
        )
    } else {
        anyhow::Error::new(e).context(format!("creating the ledger directory {}", path.display()))
    }
}

/// Reads the configuration again, as the worker was started with it (file, environment, flags).
pub type Reload = Box<dyn Fn() -> anyhow::Result<Config> + Send>;

/// Runs the worker until a signal or a fatal error; returns the process exit code. On SIGHUP it
/// takes `worker.source_modes` from `reload` without a restart.
///
/// A stop requested while it starts (`signals`, caught before the configuration was read) ends it
/// with exit 0 at the end of the phase it is in: at once while it reads the brokers' metadata
/// (nothing is held then), once the ledger is open while it opens (RocksDB is closed before the
/// process exits), and during a partition's take-over as any stop does (the take-over is
/// abandoned). A SIGHUP during the start is applied once the worker runs.
pub fn run(
    config: Config,
    options: RunOptions,
    reload: Option<Reload>,
    signals: Signals,
) -> anyhow::Result<i32> {
    let handle = crate::http::telemetry::init_metrics()?;
    let Some(Started {
        partitions,
        input_partitions,
        ledger,
    }) = check_and_open(&config, &signals)?
    else {
        return Ok(exit::OK);
    };
    tracing::info!(
        ledger = %config.worker.data_dir.display(),
        partitions = %dedupe::config::PartitionSet(partitions.clone()),
        input = %config.worker.input_topic,
        output = %config.worker.output_topic,
        "Starting the dedupe worker."
    );
    let config = Arc::new(config);
    let system = System::new();
    let db = ledger.clone();
    let store = ledger.clone();
    let admin_ledger = ledger.clone();
    let code = system.block_on(async move {
        let health = Arc::new(Health::default());
        let ledger_addr = SyncArbiter::start(2, move || LedgerActor::new(db.clone()));
        let coordinator = Coordinator::new(
            config.clone(),
            partitions,
            input_partitions as i32,
            ledger_addr,
            store,
            health.clone(),
            options,
        );
        if let Some(reload) = reload {
            let hangups = signals.hangups();
            actix_rt::spawn(reload_on_hangup(
                reload,
                coordinator.source_modes(),
                hangups,
            ));
        }
        let coordinator = coordinator.start();
        // A stop that arrived while the ledger opened is in the flag `stopped` reads first.
        let stopping = coordinator.clone();
        actix_rt::spawn(async move {
            signals.stopped().await;
            tracing::info!("Received a stop signal.");
            stopping.do_send(Shutdown);
        });
        let targets = crate::http::admin::AdminTargets::new(
            coordinator.clone(),
            admin_ledger,
            &config,
            input_partitions as i32,
        );
        let server = crate::http::telemetry::serve(
            config.metrics.addr,
            config.metrics.admin_token.clone(),
            handle,
            health,
            targets,
        )?;
        let server_handle = server.handle();
        actix_rt::spawn(server);
        tracing::info!(addr = %config.metrics.addr, "Serving /metrics, /healthz and /readyz.");
        let _ = server_handle;
        Ok::<_, anyhow::Error>(())
    });
    code?;
    let exit_code = system.run_with_code().unwrap_or(exit::FAILED);
    close_ledger(ledger);
    Ok(exit_code)
}

/// What the start's phases before the actors leave.
struct Started {
    /// The input partitions this worker owns (none up front in group mode).
    partitions: Vec<i32>,
    /// How many partitions the input has.
    input_partitions: usize,
    ledger: Arc<Ledger>,
}

/// The start's phases before the actors: the topics checked (on a thread of its own, so a stop
/// while the brokers do not answer is taken at once), then the ledger opened; None when a stop
/// came first (logged).
fn check_and_open(config: &Config, signals: &Signals) -> anyhow::Result<Option<Started>> {
    let stop = signals.stop_flag();
    let checked = {
        let config = config.clone();
        unless_stopped(&stop, "start-topics", move || owned_partitions(&config))
            .context("starting the thread that checks the topics")?
    };
    let Some(checked) = checked else {
        stopped_while_starting("checking the topics", "processing");
        return Ok(None);
    };
    let (partitions, input_partitions) = checked?;
    let path = &config.worker.data_dir;
    std::fs::create_dir_all(path).map_err(|e| data_dir_error(path, e))?;
    if signals.stop_requested() {
        stopped_while_starting("checking the topics", "processing");
        return Ok(None);
    }
    let ledger =
        Arc::new(Ledger::open(path, config.ledger.options()).context("opening the ledger")?);
    if signals.stop_requested() {
        close_ledger(ledger);
        stopped_while_starting("opening the ledger", "processing");
        return Ok(None);
    }
    Ok(Some(Started {
        partitions,
        input_partitions,
        ledger,
    }))
}

/// On each SIGHUP (the first one at once if one arrived while the worker started), reads the
/// configuration again and applies what can change while the worker runs: `worker.source_modes`.
/// A configuration that does not load changes nothing.
async fn reload_on_hangup(
    reload: Reload,
    modes: Arc<std::sync::RwLock<dedupe::config::SourceModes>>,
    mut hangups: Hangups,
) {
    loop {
        hangups.next().await;
        match reload() {
            Ok(config) => {
                let new = config.worker.source_modes;
                *modes.write().unwrap_or_else(|p| p.into_inner()) = new.clone();
                ConfigReloaded { source_modes: &new }.emit();
            }
            Err(e) => ConfigReloadRefused { error: &e }.emit(),
        }
    }
}

/// Closes the ledger once the ledger actor's threads have let go of it. RocksDB must be closed
/// before the process exits: exiting with the database open races its background threads against
/// the process's exit handlers.
fn close_ledger(mut ledger: Arc<Ledger>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match Arc::try_unwrap(ledger) {
            Ok(ledger) => {
                drop(ledger);
                return;
            }
            Err(shared) if std::time::Instant::now() < deadline => {
                ledger = shared;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => {
                crate::events::LedgerStillInUse.emit();
                return;
            }
        }
    }
}

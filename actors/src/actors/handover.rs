//! Taking over one input partition, at start or when the group assigns it: fence the previous
//! owner, bring the ledger up to date for the partition, and only then let its records flow.
//!
//! Runs on a blocking thread: every step blocks.
//! 1. `init_transactions` with the partition's `transactional.id` fences whichever producer
//!    wrote the partition before (a worker that has not noticed it lost the partition, paused or
//!    cut off from the network) and aborts its open transaction; its next commit fails as fenced.
//! 2. The group's committed input offset is read (stable now that nothing is pending).
//! 3. Recovery replays what the ledger lacks, from the id changelog (see `dedupe::recovery`).
//!    A partition the ledger holds nothing for is loaded newest first, and handed over as soon as
//!    what is loaded covers `worker.handover_min_window_secs`; older ids back-fill on this thread
//!    while the partition runs, and `dedupe_window_seconds` only ever reports what is loaded.

use std::time::{Duration, Instant};

use actix::prelude::*;
use anyhow::Context as _;
use dedupe::config::Config;
use dedupe::metrics as m;
use dedupe::output::{OutputTopics, OutputWriter};
use dedupe::progress::Progress;
use dedupe::recovery::{backfill, recover_partition, Backfill, RecordFailure, RecordReplayed, RecoveryInput, RecoveryReport};
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use crate::actors::ledger::{CheckAndRecord, LedgerActor};
use crate::actors::membership::Input;

/// A partition ready to process: its fenced producer and what recovery found.
pub struct TakenOver {
    pub writer: OutputWriter,
    pub report: RecoveryReport,
}

/// Fences the partition's previous producer and loads what the ledger lacks; hands the partition
/// to `ready` as soon as it may run, then loads the older ids that were left to back-fill.
pub fn take_over(
    config: &Config,
    consumer: &Input,
    ledger: &Addr<LedgerActor>,
    partition: i32,
    ledger_progress: Option<Progress>,
    accept_ledger_ahead: bool,
    ready: impl FnOnce(TakenOver),
) -> anyhow::Result<()> {
    let p = partition;
    let started = Instant::now();
    let w = &config.worker;
    let changelog = w.changelog_topic();
    let topics = OutputTopics { output: &w.output_topic, changelog: &changelog, dead_letter: w.dead_letter_topic.as_deref() };
    // Fence first: init_transactions aborts an older producer's open transaction, whose pending
    // offsets would otherwise keep the group's committed offset unstable.
    let writer = OutputWriter::open(&config.kafka, &topics, p, w.transaction_timeout_ms)
        .with_context(|| format!("opening the output producer of partition {p}"))?;
    let fenced_secs = started.elapsed().as_secs_f64();
    let committed_input = committed_offset(consumer, &w.input_topic, p)?;
    let committed_secs = started.elapsed().as_secs_f64();
    let input = RecoveryInput {
        kafka: &config.kafka,
        output_topic: &w.output_topic,
        changelog_topic: &changelog,
        partition: p,
        id_source: &w.id_source,
        ledger_progress,
        committed_input,
        accept_ledger_ahead,
        ready_window: Duration::from_secs(w.handover_min_window_secs),
        timeout: Duration::from_secs(3600),
    };
    let label = p.to_string();
    let mut record = |items: &[(dedupe::identity::LedgerKey, i64)], progress: Option<Progress>| -> Result<(), RecordFailure> {
        fail::fail_point!("recovery-mid-replay", !items.is_empty(), |_| {
            eprintln!("failpoint recovery-mid-replay: exiting");
            std::process::exit(86)
        });
        futures::executor::block_on(ledger.send(CheckAndRecord { partition: p, items: items.to_vec(), progress }))
            .map_err(|_mailbox| RecordFailure::LedgerGone)??;
        Ok(())
    };
    let bar = indicatif::ProgressBar::hidden();
    let mut loaded = 0u64;
    let mut on_progress = |ids: u64, done: i64, total: i64| {
        metrics::counter!(m::HANDOVER_IDS_LOADED, m::LABEL_PARTITION => label.clone()).increment(ids.saturating_sub(loaded));
        loaded = ids;
        if bar.is_hidden() && total > 1000 {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            bar.set_style(
                indicatif::ProgressStyle::with_template("loading partition {msg} {bar:40} {pos}/{len} records")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_message(label.clone());
        }
        bar.set_length(total.max(0) as u64);
        bar.set_position(done.max(0) as u64);
    };
    let (report, rest) = recover_partition(&input, &mut record, &mut on_progress)?;
    bar.finish_and_clear();
    // One id per output record: what recovery replayed, in output records, whichever log it read.
    metrics::counter!(m::RECOVERY_REPLAYED, m::LABEL_PARTITION => label.clone()).increment(report.ids_loaded);
    metrics::gauge!(m::RECOVERY_SECONDS, m::LABEL_PARTITION => label.clone()).set(started.elapsed().as_secs_f64());
    tracing::info!(
        partition = p,
        source = %report.source,
        records = report.replayed_records,
        ids = report.ids_loaded,
        from = report.replayed_from,
        to = report.replayed_to,
        resume_input_at = report.resume_input_at,
        fenced_secs,
        committed_secs,
        seconds = started.elapsed().as_secs_f64(),
        backfill = !rest.is_empty(),
        "Took the partition over: previous producer fenced, ledger up to date."
    );
    ready(TakenOver { writer, report });
    if rest.is_empty() {
        return Ok(());
    }
    run_backfill(&input, rest, &mut record);
    Ok(())
}

/// Loads the older ids a newest-first load left, counting them; its end is logged, never fatal
/// (the window is what was loaded, and grows with new traffic).
fn run_backfill(input: &RecoveryInput<'_>, rest: Backfill, record: &mut RecordReplayed<'_>) {
    let p = input.partition;
    let label = p.to_string();
    let backfill_started = Instant::now();
    // The back-fill counts its own ids from zero.
    let mut loaded_before = 0;
    let mut on_backfill = |ids: u64| {
        metrics::counter!(m::HANDOVER_IDS_LOADED, m::LABEL_PARTITION => label.clone()).increment(ids.saturating_sub(loaded_before));
        loaded_before = ids;
    };
    match backfill(input, rest, record, &mut on_backfill) {
        Ok(ids) => tracing::info!(partition = p, ids, seconds = backfill_started.elapsed().as_secs_f64(), "Back-filled the partition's older ids."),
        Err(dedupe::recovery::RecoveryError::Record { source: RecordFailure::LedgerGone, .. }) => {
            tracing::info!(partition = p, "The worker is stopping; the back-fill of older ids stops with it (the window is what was loaded).");
        }
        Err(e) => {
            metrics::counter!(m::ERRORS, m::LABEL_KIND => m::KIND_KAFKA).increment(1);
            tracing::warn!(partition = p, error = %e, "Back-filling the partition's older ids stopped; its window is what was loaded, and grows with new traffic.");
        }
    }
}

/// The consumer group's committed offset for one input partition (committed with the output
/// transactions), retrying while the group coordinator is not yet known or offsets are unstable.
fn committed_offset(consumer: &Input, topic: &str, partition: i32) -> anyhow::Result<Option<i64>> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let deadline = Instant::now() + Duration::from_secs(120);
    let got = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Ok(got) => break got,
            Err(e) if Instant::now() < deadline && is_retriable(&e) => {
                tracing::debug!(partition, error = %e, "Reading the committed offset failed; retrying.");
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => return Err(e).with_context(|| format!("reading the committed offset of input partition {partition}")),
        }
    };
    Ok(got.find_partition(topic, partition).and_then(|e| match e.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }))
}

/// Errors that go away by themselves: the coordinator moved or is loading, a timeout.
fn is_retriable(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::NotCoordinator
                | C::CoordinatorNotAvailable
                | C::CoordinatorLoadInProgress
                | C::RequestTimedOut
                | C::OperationTimedOut
                | C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::UnstableOffsetCommit
        )
    )
}

/// The ledger's progress record of `partition`, decoded.
pub fn decode_progress(all: &std::collections::BTreeMap<i32, Vec<u8>>, partition: i32) -> anyhow::Result<Option<Progress>> {
    match all.get(&partition) {
        Some(bytes) => Ok(Some(Progress::decode(bytes).with_context(|| format!("partition {partition}'s progress record"))?)),
        None => Ok(None),
    }
}

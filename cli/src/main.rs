//! The `dedupe` binary: parse the command line, load the configuration, start logging, run the
//! subcommand.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use dedupe::config::Config;
use dedupe_actors::coordinator::RunOptions;
use dedupe_cli::admin_client::{eprint_line, print_line};
#[cfg(feature = "tools")]
use dedupe_cli::args::{
    BenchCommand, HandoffBenchArgs, LedgerBenchArgs, LoadgenArgs, OpenBenchArgs, PipelineBenchArgs,
};
use dedupe_cli::args::{
    Cli, Command, ConfigArgs, ConfigCommand, ExplainArgs, ForgetArgs, IngestArgs, LedgerCommand,
    RekeyArgs, RunArgs, VerifyArgs,
};
use dedupe_cli::http::telemetry;
use dedupe_cli::run;
use dedupe_cli::signals::{self, log_hangups, Signals};
use dedupe_cli::tools;
use dedupe_tracking::server as ingest;

/// jemalloc, for the C code too (the workspace enables tikv-jemallocator's unprefixed `malloc`, so
/// librdkafka's and RocksDB's allocations use it): the tracking API's CPU per event went from 5.3 µs
/// with glibc's malloc to about 3.9 (docs/performance.md has the method and mimalloc's figures).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main` (jemalloc declares `malloc_conf` weak: this definition
/// is the one it reads; `MALLOC_CONF` in the environment still adds to it and wins).
///
/// `oversize_threshold:0`: allocations of 8 MiB and more come from the ordinary arenas, which keep
/// freed pages for the next allocation, not from jemalloc's arena for huge ones, which hands them
/// back to the kernel at once, so that each such allocation faulted in and zeroed fresh pages.
/// A partition's move makes many: librdkafka's buffers for fetched changelog records and the
/// load's runs of ids. Zeroing pages was 12% of the machine's CPU time during a 50M-id load, half
/// of it on librdkafka's broker thread.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static malloc_conf: Option<&'static std::ffi::c_char> =
    // SAFETY: a reference to the first byte of a NUL-terminated string that lives forever.
    Some(unsafe { &*c"oversize_threshold:0".as_ptr() });

/// SIGTERM, SIGINT and SIGHUP are caught from the first instant the program runs code of its own:
/// the dynamic loader runs `.preinit_array` right after relocating the program, before every
/// initializer (RocksDB's C++ statics and the Rust runtime take 20 to 60 ms on a loaded machine).
/// `main` then hands them to the long-running commands or gives the others the default actions
/// back (see `dedupe_cli::signals`).
#[used]
#[link_section = ".preinit_array"]
static CATCH_SIGNALS_EARLY: extern "C" fn() = signals::catch_early;

fn main() -> ExitCode {
    let command = Cli::parse().command;
    // Crash tests name failpoints in FAILPOINTS; without the `failpoints` feature this does nothing.
    let _failpoints = fail::FailScenario::setup();
    match command {
        Command::Run(args) => with_signals(|signals| run_worker(&args, signals)),
        Command::Ingest(args) => with_signals(|signals| serve_ingest(&args, signals)),
        Command::Rekey(args) => with_signals(|signals| rekey(&args, signals)),
        command => {
            signals::release_early();
            one_shot(command)
        }
    }
}

/// The commands that do their work and end, with the signals' default actions.
fn one_shot(command: Command) -> ExitCode {
    match command {
        Command::Run(_) | Command::Ingest(_) | Command::Rekey(_) => {
            fail("a long-running command taken for a one-shot one")
        }
        Command::Config(ConfigCommand::Check(args)) => {
            with_config(&args, |config| Ok(config.to_toml()))
        }
        Command::Verify(args) => verify(&args),
        #[cfg(feature = "tools")]
        Command::Loadgen(args) => with_config(&args.config, |config| loadgen(&args, &config)),
        Command::Explain(args) => explain(&args),
        Command::Forget(args) => forget(&args),
        Command::Ledger(command) => ledger(&command),
        Command::Plan(args) => print_result(dedupe_cli::plan::plan(&args)),
        #[cfg(feature = "tools")]
        Command::Bench(BenchCommand::Ledger(args)) => bench_ledger(&args),
        #[cfg(feature = "tools")]
        Command::Bench(BenchCommand::Handoff(args)) => {
            with_config(&args.config, |config| bench_handoff(&args, &config))
        }
        #[cfg(feature = "tools")]
        Command::Bench(BenchCommand::Pipeline(args)) => {
            with_config(&args.config, |config| bench_pipeline(&args, &config))
        }
        #[cfg(feature = "tools")]
        Command::Bench(BenchCommand::Open(args)) => {
            with_config(&args.config, |config| bench_open(&args, &config))
        }
        #[cfg(feature = "tools")]
        Command::Bench(BenchCommand::Latency(args)) => with_config(&args.config, |config| {
            let result = dedupe_cli::bench::latency::run(
                &config,
                &config.worker.output_topic,
                Duration::from_secs(args.seconds),
            )?;
            Ok(serde_json::to_string(&result)?)
        }),
    }
}

/// Runs a long-running command with SIGTERM, SIGINT and SIGHUP caught before it does anything
/// (loads its configuration, opens its ledger, connects to the brokers): from then on a stop is
/// clean (exit 0) and a SIGHUP never ends it, whatever phase of its start it is in. The one-shot
/// commands keep the signals' default actions.
fn with_signals(command: impl FnOnce(Signals) -> ExitCode) -> ExitCode {
    match Signals::install() {
        Ok(signals) => command(signals),
        Err(e) => fail(format!("installing the signal handlers: {e}")),
    }
}

/// `dedupe run`: the worker, until a signal or a fatal error.
fn run_worker(args: &RunArgs, signals: Signals) -> ExitCode {
    let config = match args.config.load() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    telemetry::init_tracing(&config.log);
    let options = RunOptions {
        accept_ledger_ahead: args.accept_ledger_ahead,
        #[cfg(feature = "tools")]
        passthrough: args.passthrough,
    };
    let again = args.config.clone();
    let reload: run::Reload = Box::new(move || Ok(again.load()?));
    match run::run(config, options, Some(reload), signals) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => fail(format!("{e:#}")),
    }
}

/// `dedupe ingest`: the tracking API and its metrics endpoint, until SIGTERM or SIGINT (a SIGHUP
/// changes nothing: the front door reads its configuration once).
fn serve_ingest(args: &IngestArgs, signals: Signals) -> ExitCode {
    let config = match args.load() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    telemetry::init_tracing(&config.log);
    let result = actix_web::rt::System::new().block_on(async move {
        actix_web::rt::spawn(log_hangups(signals.hangups(), "the tracking API"));
        let handle = telemetry::init_metrics()?;
        let metrics = telemetry::serve_metrics(config.metrics.addr, handle)?;
        actix_web::rt::spawn(metrics);
        let stop = async move {
            signals.stopped().await;
            tracing::info!("Received a stop signal.");
        };
        ingest::serve(config, stop)
            .await
            .map_err(anyhow::Error::from)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format!("{e:#}")),
    }
}

/// `dedupe rekey`: the stage, with its metrics endpoint, until a signal (exit 0), a fenced
/// producer (exit 3), a record larger than the input accepts without a dead-letter topic (exit 2)
/// or an error (exit 2).
fn rekey(args: &RekeyArgs, signals: Signals) -> ExitCode {
    let config = match args.config.load() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    telemetry::init_tracing(&config.log);
    let options = dedupe_cli::rekey::RekeyOptions {
        source_topic: args.source_topic.clone(),
        group_id: args.group_id.clone(),
        batch_max_records: args.batch_max_records.max(1),
        batch_linger: Duration::from_millis(args.batch_linger_ms),
    };
    let stop = signals.stop_flag();
    let serving = {
        let addr = config.metrics.addr;
        std::thread::Builder::new()
            .name("rekey-http".into())
            .spawn(move || {
                let served = actix_web::rt::System::new().block_on(async move {
                    let handle = telemetry::init_metrics()?;
                    actix_web::rt::spawn(telemetry::serve_metrics(addr, handle)?);
                    log_hangups(signals.hangups(), "the rekey stage").await;
                    Ok::<_, anyhow::Error>(())
                });
                if let Err(e) = served {
                    // Without it the stage would run unwatched.
                    eprintln!("dedupe: {e:#}");
                    std::process::exit(2);
                }
            })
    };
    if let Err(e) = serving {
        return fail(format!("starting the metrics thread: {e}"));
    }
    match dedupe_cli::rekey::run(&config, &options, &stop) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => fail(format!("{e:#}")),
    }
}

/// `dedupe verify`: exit 1 when the output is wrong, 2 (from `fail`) when the check could not run.
fn verify(args: &VerifyArgs) -> ExitCode {
    let config = match args.config.load() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    match tools::verify(&config, Duration::from_secs(args.timeout_secs)) {
        Ok(summary) => {
            if let Err(e) = print_line(&serde_json::to_string(&summary).unwrap_or_default()) {
                return fail(format!("writing to standard output: {e}"));
            }
            if summary.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => fail(format!("{e:#}")),
    }
}

#[cfg(feature = "tools")]
/// `dedupe loadgen`: its summary as JSON.
fn loadgen(args: &LoadgenArgs, config: &Config) -> anyhow::Result<String> {
    let load = dedupe_cli::loadgen::Load {
        topic: &args.topic,
        count: args.count,
        dup_ratio: args.dup_ratio,
        reused_ratio: args.reused_ratio,
        dup_delay: Duration::from_millis(args.dup_delay_ms),
        value_bytes: args.value_bytes,
        rate_per_sec: args.rate,
        show_progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        spread_timestamps: None,
        sample_every: 0,
    };
    let summary = dedupe_cli::loadgen::loadgen(config, load)?;
    Ok(serde_json::to_string(&summary)?)
}

/// `dedupe forget ID...`: each answer as one JSON line, then what it came to; the exit code is
/// the one `dedupe forget --help` names.
fn forget(args: &ForgetArgs) -> ExitCode {
    let config = match args.config.load() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let outcome = dedupe_cli::forget_client::forget(&config, args);
    if outcome.code == 0 {
        if let Err(e) = print_line(&outcome.message) {
            return fail(format!("writing to standard output: {e}"));
        }
    } else {
        eprint_line(&format!("error: {}", outcome.message));
    }
    ExitCode::from(outcome.code)
}

/// `dedupe explain ID` (or `--json-id JSON`): the answer as one JSON line, then its sentence.
fn explain(args: &ExplainArgs) -> ExitCode {
    let sent_at_ms = match args.sent_at_ms() {
        Ok(ms) => ms,
        Err(e) => return fail(e),
    };
    with_config(&args.config, |config| {
        let answer = dedupe_cli::explain_client::explain(
            &config,
            args.id(),
            args.source.as_deref(),
            sent_at_ms,
            config.metrics.addr,
        )?;
        Ok(format!(
            "{}\n{}",
            serde_json::to_string(&answer)?,
            answer.sentence
        ))
    })
}

/// `dedupe ledger stats|snapshot|restore`.
fn ledger(command: &LedgerCommand) -> ExitCode {
    let args = match command {
        LedgerCommand::Stats(a) | LedgerCommand::Snapshot(a) => a,
        LedgerCommand::Restore(r) => &r.config,
    };
    with_config(args, |config| {
        let json = match command {
            LedgerCommand::Stats(_) => tools::ledger_stats(&config)?,
            LedgerCommand::Snapshot(_) => tools::ledger_snapshot(&config)?,
            LedgerCommand::Restore(r) => tools::ledger_restore(&config, &r.from, r.force)?,
        };
        Ok(json.to_string())
    })
}

#[cfg(feature = "tools")]
/// `dedupe bench ledger`: the report on stdout as JSON (and readable on stderr unless `--json`).
fn bench_ledger(args: &LedgerBenchArgs) -> ExitCode {
    // The ledger's own lines (how each open went, and where its time went) on stderr.
    telemetry::init_tracing(&dedupe::config::LogConfig::default());
    let report = match dedupe::bench::ledger::run(&args.bench_config()) {
        Ok(r) => r,
        Err(e) => return fail(format!("the ledger bench failed: {e:#}")),
    };
    if !args.json {
        eprint_line(&format!("{report:#?}"));
    }
    match print_line(&serde_json::to_string(&report).unwrap_or_default()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format!("writing to standard output: {e}")),
    }
}

#[cfg(feature = "tools")]
/// `dedupe bench handoff`.
fn bench_handoff(args: &HandoffBenchArgs, config: &Config) -> anyhow::Result<String> {
    let tmp = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let shape = dedupe_cli::bench::handoff::Shape {
        ids: args.ids,
        span: Duration::from_secs(args.span_secs),
        value_bytes: args.value_bytes,
        kill: args.kill,
        static_members: args.static_members,
    };
    let result = dedupe_cli::bench::handoff::run(config, shape, &dir)?;
    let mut out = String::new();
    if !args.json {
        out.push_str(&format!(
            "{} ids: first publish {:.2} s after the old owner's {} (assignment {:.2} s, ready {:.2} s after it), window back {:.2} s after the assignment ({:.0} s before, {:.0} s after)\n",
            result.ids, result.stop_to_first_publish_secs, result.stop.to_uppercase(), result.assignment_secs, result.handover_ready_secs, result.window_restored_secs, result.window_before_secs, result.window_after_secs
        ));
    }
    out.push_str(&serde_json::to_string(&result)?);
    Ok(out)
}

#[cfg(feature = "tools")]
/// `dedupe bench open`.
fn bench_open(args: &OpenBenchArgs, config: &Config) -> anyhow::Result<String> {
    let tmp = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let reports = dedupe::bench::sizes::run(&config.ledger.options(), &args.ids, &dir)?;
    let mut out = String::new();
    if !args.json {
        for r in &reports {
            out.push_str(&format!(
                "{} ids: first open {:.2} s ({} MB resident after), close {:.2} s, {} MB on disk ({} MB index file), reopen {:.2} s ({})\n",
                r.ids,
                r.first_open_secs,
                r.rss_after_open_bytes >> 20,
                r.close_secs,
                r.disk_bytes >> 20,
                r.index_file_bytes >> 20,
                r.reopen_secs,
                r.reopen_index
            ));
        }
    }
    out.push_str(&serde_json::to_string(
        &serde_json::json!({ "sizes": reports }),
    )?);
    Ok(out)
}

#[cfg(feature = "tools")]
/// `dedupe bench pipeline`.
fn bench_pipeline(args: &PipelineBenchArgs, config: &Config) -> anyhow::Result<String> {
    let tmp = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let result = dedupe_cli::bench::pipeline::run(
        config,
        args.messages,
        args.dup_ratio,
        args.value_bytes,
        &dir,
    )?;
    let mut out = String::new();
    if !args.json {
        out.push_str(&format!(
            "dedupe {:.0} msgs/s, pass-through {:.0} msgs/s, ratio {:.2}, p50 {:.0} ms, p99 {:.0} ms\n",
            result.dedupe_msgs_per_sec, result.passthrough_msgs_per_sec, result.ratio, result.p50_ms, result.p99_ms
        ));
    }
    out.push_str(&serde_json::to_string(&result)?);
    Ok(out)
}

/// Loads the configuration, runs `body`, prints what it returns (a reader that went away, as
/// `| head -1` does, ends the output quietly); errors become one line on stderr and exit code 2.
fn with_config(args: &ConfigArgs, body: impl FnOnce(Config) -> anyhow::Result<String>) -> ExitCode {
    let config = match args.load() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    print_result(body(config))
}

/// Prints a command's text (exit 0) or its error (exit 2).
fn print_result(result: anyhow::Result<String>) -> ExitCode {
    match result {
        Ok(text) => match print_line(text.strip_suffix('\n').unwrap_or(&text)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(format!("writing to standard output: {e}")),
        },
        Err(e) => fail(format!("{e:#}")),
    }
}

/// Prints a one-line error and returns exit code 2.
fn fail(error: impl std::fmt::Display) -> ExitCode {
    eprint_line(&format!("error: {error}"));
    ExitCode::from(2)
}

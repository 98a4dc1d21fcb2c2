//! The `dedupe` binary: parse the command line, load the configuration, start logging, run the
//! subcommand.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use dedupe_actors::cli::{BenchCommand, Cli, Command, ConfigCommand};
use dedupe_actors::coordinator::RunOptions;
use dedupe_actors::{bench_pipeline, run, telemetry, tools};

fn main() -> ExitCode {
    // Crash tests name failpoints in FAILPOINTS; without the `failpoints` feature this does nothing.
    let _failpoints = fail::FailScenario::setup();
    let cli = Cli::parse();
    match cli.command {
        Command::Config(ConfigCommand::Check(args)) => match args.load() {
            Ok(config) => {
                print!("{}", config.to_toml());
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Command::Run(args) => {
            let config = match args.config.load() {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            telemetry::init_tracing(&config.log);
            let options = RunOptions { accept_ledger_ahead: args.accept_ledger_ahead, passthrough: args.passthrough };
            match run::run(config, options) {
                Ok(code) => ExitCode::from(code as u8),
                Err(e) => fail(format!("{e:#}")),
            }
        }
        Command::Verify(args) => {
            let config = match args.config.load() {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            match tools::verify(&config, Duration::from_secs(args.timeout_secs)) {
                Ok(summary) => {
                    println!("{}", serde_json::to_string(&summary).unwrap_or_default());
                    if summary.ok {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                }
                Err(e) => fail(format!("{e:#}")),
            }
        }
        Command::Bench(command) => bench(command),
        Command::Loadgen(args) => {
            let config = match args.config.load() {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
            match tools::loadgen(
                &config,
                &args.topic,
                args.count,
                args.dup_ratio,
                Duration::from_millis(args.dup_delay_ms),
                args.value_bytes,
                args.rate,
                progress,
            ) {
                Ok(summary) => {
                    println!("{}", serde_json::to_string(&summary).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(format!("{e:#}")),
            }
        }
    }
}

fn bench(command: BenchCommand) -> ExitCode {
    match command {
        BenchCommand::Pipeline(args) => {
            let config = match args.config.load() {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            let tmp;
            let dir = match &args.dir {
                Some(d) => d.clone(),
                None => match tempfile::tempdir() {
                    Ok(t) => {
                        tmp = t;
                        tmp.path().to_path_buf()
                    }
                    Err(e) => return fail(format!("cannot make a temporary directory: {e}")),
                },
            };
            match bench_pipeline::run(&config, args.messages, args.dup_ratio, args.value_bytes, &dir) {
                Ok(result) => {
                    if !args.json {
                        println!(
                            "dedupe {:.0} msgs/s, pass-through {:.0} msgs/s, ratio {:.2}, p50 {:.0} ms, p99 {:.0} ms",
                            result.dedupe_msgs_per_sec, result.passthrough_msgs_per_sec, result.ratio, result.p50_ms, result.p99_ms
                        );
                    }
                    println!("{}", serde_json::to_string(&result).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(format!("{e:#}")),
            }
        }
    }
}

/// Prints a one-line error and returns exit code 2.
fn fail(error: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {error}");
    ExitCode::from(2)
}

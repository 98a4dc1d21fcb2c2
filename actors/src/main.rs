//! The `dedupe` binary: parse the command line, load the configuration, run the subcommand.

use std::process::ExitCode;

use clap::Parser;
use dedupe_actors::cli::{Cli, Command, ConfigCommand};
use dedupe_actors::ingest;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Config(ConfigCommand::Check(args)) => match args.load() {
            Ok(config) => {
                print!("{}", config.to_toml());
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Command::Ingest(args) => match args.load() {
            Ok(config) => {
                start_tracing(&config.log);
                match actix_web::rt::System::new().block_on(ingest::serve(config)) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => fail(e),
                }
            }
            Err(e) => fail(e),
        },
    }
}

/// Logs to stderr in the configured format and filter.
fn start_tracing(log: &dedupe::config::LogConfig) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(&log.level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match log.format {
        dedupe::config::LogFormat::Human => builder.try_init(),
        dedupe::config::LogFormat::Json => builder.json().try_init(),
    };
}

/// Prints a one-line error and returns the exit code for a refused configuration or a failed run.
fn fail(error: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {error}");
    ExitCode::from(2)
}

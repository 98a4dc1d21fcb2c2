//! The `dedupe` binary: parse the command line, load the configuration, run the subcommand.

use std::process::ExitCode;

use clap::Parser;
use dedupe_actors::cli::{Cli, Command, ConfigCommand};

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
    }
}

/// Prints a one-line error and returns the exit code for a refused configuration or a failed run.
fn fail(error: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {error}");
    ExitCode::from(2)
}

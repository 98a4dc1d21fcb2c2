//! The `dedupe` binary. For now it carries the `bench ledger` subcommand only; the bench logic
//! lives in the core (`dedupe::bench`), this is a thin command-line shell around it.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use dedupe::bench::ledger::{run, LedgerBenchConfig};
use dedupe::ledger::{Durability, MemtableKind};

#[derive(Parser)]
#[command(name = "dedupe", about = "Deduplicates a Kafka stream by client-made message ids.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure a component.
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Insert random UUIDv4 ids into the ledger and compare with Segment's design and a HashSet.
    Ledger(LedgerArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum DurabilityArg {
    SyncWal,
    Wal,
    NoWal,
}

#[derive(clap::Args)]
struct LedgerArgs {
    /// Ids to insert.
    #[arg(long)]
    keys: u64,
    /// Share of ids re-sent from recent batches (client retries).
    #[arg(long, default_value_t = 0.01)]
    dup_ratio: f64,
    /// Disk budget in bytes (default: never age).
    #[arg(long)]
    budget: Option<u64>,
    /// Ids per batch.
    #[arg(long, default_value_t = 4096)]
    batch: usize,
    /// Print the report as one JSON line (it is always the last stdout line).
    #[arg(long)]
    json: bool,
    /// Parent directory for the stores (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Run the baselines on only the first M ids.
    #[arg(long)]
    baseline_keys: Option<u64>,
    /// Skip the baselines.
    #[arg(long)]
    no_baselines: bool,
    /// Ledger durability.
    #[arg(long, value_enum)]
    durability: Option<DurabilityArg>,
    /// Ledger generations (G).
    #[arg(long)]
    generations: Option<u32>,
    /// Ledger memtable.
    #[arg(long, value_enum)]
    memtable: Option<MemtableArg>,
    /// Ledger write buffer (one memtable), MiB.
    #[arg(long)]
    write_buffer_mib: Option<usize>,
    /// Ledger data-block restart interval.
    #[arg(long)]
    restart_interval: Option<i32>,
}

#[derive(Clone, Copy, ValueEnum)]
enum MemtableArg {
    SkipList,
    HashLinkList,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Bench {
            what: Bench::Ledger(args),
        } => bench_ledger(args),
    }
}

fn bench_ledger(args: LedgerArgs) -> anyhow::Result<()> {
    let defaults = LedgerBenchConfig::default();
    let config = LedgerBenchConfig {
        keys: args.keys,
        dup_ratio: args.dup_ratio,
        budget_bytes: args.budget,
        batch: args.batch,
        dir: args.dir,
        baseline_keys: args.baseline_keys,
        skip_baselines: args.no_baselines,
        durability: match args.durability {
            Some(DurabilityArg::SyncWal) => Durability::SyncWal,
            Some(DurabilityArg::Wal) => Durability::Wal,
            Some(DurabilityArg::NoWal) => Durability::NoWal,
            None => defaults.durability,
        },
        generations: args.generations.unwrap_or(defaults.generations),
        ledger: {
            let mut ledger = defaults.ledger.clone();
            if let Some(m) = args.memtable {
                ledger.memtable = match m {
                    MemtableArg::SkipList => MemtableKind::SkipList,
                    MemtableArg::HashLinkList => MemtableKind::HashLinkList,
                };
            }
            if let Some(mib) = args.write_buffer_mib {
                ledger.write_buffer_bytes = mib << 20;
            }
            if let Some(r) = args.restart_interval {
                ledger.block_restart_interval = r;
            }
            ledger
        },
        ..defaults
    };
    let report = run(&config).context("the ledger bench failed")?;
    if !args.json {
        eprintln!("{report:#?}");
    }
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

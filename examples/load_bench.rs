//! A bulk load alone, as a partition's move makes one: `--ids` ids (default 50M) into an empty
//! ledger with the default options, in chunks of 4,096 as the changelog's reader hands them over.
//! Prints the wall time, the process's CPU time over the load, and the load's own phases.
//!
//! ```sh
//! cargo run --release -p dedupe --example load_bench -- 50000000 /var/tmp/load-bench
//! ```
//!
//! The ids are made before the clock starts; the directory is emptied first.

use dedupe::identity::ledger_key;
use dedupe::ledger::{Ledger, LedgerOptions, WindowFloor};

/// User and system CPU seconds of this process so far.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map_or(50_000_000, |a| a.parse().expect("--ids: a number"));
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "/var/tmp/load-bench".into()));
    let _ = std::fs::remove_dir_all(&dir);
    let ledger = Ledger::open(&dir, LedgerOptions::default()).expect("open the ledger");
    let ids: Vec<_> = (0..n)
        .map(|i| {
            let key = ledger_key(format!("load-bench-{i}").as_bytes()).expect("an id");
            (key, 1_700_000_000_000_i64 + i as i64)
        })
        .collect();
    let (cpu, started) = (cpu_secs(), std::time::Instant::now());
    let mut load = ledger.begin_load(0);
    load.reserve(n).expect("reserve");
    for chunk in ids.chunks(4096) {
        load.add(chunk).expect("add");
    }
    let (loaded, times) = load.finish(&[], WindowFloor::Keep).expect("finish");
    println!(
        "{}",
        serde_json::json!({
            "ids": loaded,
            "wall_secs": started.elapsed().as_secs_f64(),
            "cpu_secs": cpu_secs() - cpu,
            "index_secs": times.index_secs,
            "run_wait_secs": times.run_wait_secs,
            "commit_secs": times.commit_secs,
            "runs": times.runs,
        })
    );
}

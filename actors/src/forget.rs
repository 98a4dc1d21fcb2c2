//! `dedupe forget ID... [--file FILE]`: asks the running worker (`POST /admin/forget` at its
//! metrics address) to forget ids, [`crate::http::forget::MAX_IDS`] per request, and prints each
//! answer as one JSON line.

use std::io::BufRead;
use std::time::Duration;

use anyhow::Context;
use dedupe::config::Config;
use serde_json::json;

use crate::cli::ForgetArgs;
use crate::http::forget::MAX_IDS;

/// Forgets the ids of `args` (and of its file); the summary line. An error when any id could not
/// be forgotten, after every answer was printed.
pub fn forget(config: &Config, args: &ForgetArgs) -> anyhow::Result<String> {
    let mut ids = args.ids.clone();
    if let Some(file) = &args.file {
        ids.extend(read_ids(file)?);
    }
    if ids.is_empty() {
        anyhow::bail!("no ids to forget: name them, or give --file");
    }
    let addr = config.metrics.addr;
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        .timeout_read(Duration::from_secs(300))
        .build();
    let by = args.by.clone().unwrap_or_else(whoami);
    let (mut forgotten, mut failed, mut held) = (0u64, 0u64, 0u64);
    for chunk in ids.chunks(MAX_IDS) {
        let body = json!({
            "ids": chunk,
            "by": by,
            "reason": args.reason,
            "source": args.source,
            "partition": args.partition,
        });
        let mut request = agent.post(&format!("http://{addr}/admin/forget"));
        if let Some(token) = &config.metrics.admin_token {
            request = request.set("Authorization", &format!("Bearer {}", token.expose()));
        }
        let request = request.set("Content-Type", "application/json");
        let answer: serde_json::Value = match request.send_string(&body.to_string()) {
            Ok(response) => serde_json::from_reader(response.into_reader())?,
            Err(ureq::Error::Status(409, response)) => {
                serde_json::from_reader(response.into_reader())?
            }
            Err(ureq::Error::Status(status, response)) => {
                let body = response.into_string().unwrap_or_default();
                anyhow::bail!(
                    "the worker at {addr} refused the forget ({status}): {}",
                    body.trim()
                )
            }
            Err(ureq::Error::Transport(t)) => {
                anyhow::bail!("asking the worker at {addr} to forget: {t} (forget needs the running worker that owns the ids' partitions)")
            }
        };
        println!("{answer}");
        held += answer["done"].as_array().map_or(0, |d| {
            d.iter().filter_map(|r| r["were_held"].as_u64()).sum()
        });
        forgotten += answer["forgotten"].as_u64().unwrap_or(0);
        failed += answer["failed"].as_u64().unwrap_or(0);
    }
    if held == 0 && forgotten > 0 && args.source.is_none() {
        eprintln!("note: the worker held none of these ids. Ids the front door (dedupe ingest) writes are held as <source>:<messageId>: give --source NAME (the write key's source) to forget those.");
    }
    if failed > 0 {
        anyhow::bail!(
            "{failed} of {} ids were not forgotten (see `failed` above); {forgotten} were",
            ids.len()
        );
    }
    Ok(format!("forgot {forgotten} ids"))
}

/// Ids from a file (`-`: standard input), one per line; blank lines and `#` comments skipped.
fn read_ids(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(path)
            .with_context(|| format!("reading ids from {}", path.display()))?;
        Box::new(std::io::BufReader::new(file))
    };
    let mut ids = Vec::new();
    for line in reader.lines() {
        let line = line.with_context(|| format!("reading ids from {}", path.display()))?;
        let id = line.trim();
        if !id.is_empty() && !id.starts_with('#') {
            ids.push(id.to_string());
        }
    }
    Ok(ids)
}

/// The user running the command, `USER@HOST` as the environment and the kernel name them.
fn whoami() -> String {
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "unknown user".to_string());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    if host.is_empty() {
        user
    } else {
        format!("{user}@{host}")
    }
}

//! `dedupe explain ID`: asks the running worker (`GET /admin/ids/{id}` at its metrics address),
//! or, when none listens there, reads the stopped worker's ledger, and prints the answer (see
//! `dedupe::explain`) as one JSON line and one sentence.

use std::time::Duration;

use anyhow::Context;
use dedupe::config::{Config, IdSource, InputPartitioner};

use crate::admin_client::{authorized, transport_error};

/// The input partition of an id read from the record key: the partition the input's producers
/// choose for that key with `partitioner` (librdkafka's own implementations; `murmur2_random` is
/// the Java client's). `None` for ids read from a header or the value, whose partition follows a
/// key this command does not see.
pub fn partition_of_id(
    source: &IdSource,
    partitioner: InputPartitioner,
    id: &[u8],
    partitions: i32,
) -> Option<i32> {
    if !source.is_key() {
        return None;
    }
    partitioner.partition(id, partitions)
}

/// Explains `id` (from the front door's `source`, when given): asks the worker at `addr`; reads
/// `config.worker.data_dir` when nothing listens there.
pub fn explain(
    config: &Config,
    id: &str,
    source: Option<&str>,
    sent_at_ms: Option<i64>,
    addr: std::net::SocketAddr,
) -> anyhow::Result<dedupe::explain::Answer> {
    let mut url = format!("http://{addr}/admin/ids/{}", urlencode(id));
    let mut query = Vec::new();
    if let Some(ms) = sent_at_ms {
        query.push(format!("sent_at_ms={ms}"));
    }
    if let Some(source) = source {
        query.push(format!("source={}", urlencode(source)));
    }
    if !query.is_empty() {
        url.push('?');
        url.push_str(&query.join("&"));
    }
    let request = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
        .get(&url);
    match authorized(request, config).call() {
        Ok(response) => Ok(serde_json::from_reader(response.into_reader())?),
        Err(ureq::Error::Status(status, response)) => {
            let body = response.into_string().unwrap_or_default();
            anyhow::bail!(
                "the worker at {addr} could not explain the id ({status}): {}",
                body.trim()
            )
        }
        Err(ureq::Error::Transport(t)) if t.kind() == ureq::ErrorKind::ConnectionFailed => {
            offline(config, id, source, sent_at_ms)
        }
        Err(ureq::Error::Transport(t)) => {
            anyhow::bail!("asking the worker at {addr}: {}", transport_error(&t))
        }
    }
}

/// A stopped worker's ledger, opened as `dedupe ledger stats` opens it. Which partition the id
/// belongs to and whether this worker owned it are not known here.
fn offline(
    config: &Config,
    id: &str,
    source: Option<&str>,
    sent_at_ms: Option<i64>,
) -> anyhow::Result<dedupe::explain::Answer> {
    let path = &config.worker.data_dir;
    if !path.join("CURRENT").exists() {
        anyhow::bail!(
            "no worker answers on metrics.addr and there is no ledger at {}",
            path.display()
        );
    }
    let ledger = dedupe::ledger::Ledger::open_existing(path, config.ledger.maintenance_options())
        .with_context(|| format!("no worker answers on metrics.addr; opening the ledger at {} (is a worker running on it?)", path.display()))?;
    let q = dedupe::explain::Question {
        id,
        source,
        partition: None,
        owned: None,
        sent_at_ms,
        now_ms: dedupe::clock::now_ms(),
    };
    let answer = dedupe::explain::explain(&ledger, &q)?;
    ledger.close()?;
    Ok(answer)
}

/// Percent-encodes an id for a URL path segment (ids are any bytes up to 1 KiB).
fn urlencode(id: &str) -> String {
    id.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_escaped_for_the_path() {
        assert_eq!(urlencode("a b/c?d"), "a%20b%2Fc%3Fd");
        assert_eq!(urlencode("6ba7b810-9dad"), "6ba7b810-9dad");
    }
}

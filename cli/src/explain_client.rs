//! `dedupe explain ID` (or `--json-id JSON`): asks the running worker (`GET /admin/ids/{id}` at
//! its metrics address), or, when none listens there, reads the stopped worker's ledger, and
//! prints the answer (see `dedupe::explain`) as one JSON line and one sentence.

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

/// `answer` told with where its record's dead letter is, when the id is held and the pipeline has
/// a dead-letter topic: a held id whose record the output refused was never published (see
/// `dedupe::explain::with_dead_letter`).
pub fn with_dead_letter(
    answer: dedupe::explain::Answer,
    kafka: &dedupe::kafka::KafkaConfig,
    dead_letter_topic: Option<&str>,
) -> dedupe::explain::Answer {
    let (Some(topic), true) = (dead_letter_topic, answer.held) else {
        return answer;
    };
    let since = answer
        .copies
        .iter()
        .map(|s| s.first_seen_ms)
        .min()
        .unwrap_or_else(dedupe::clock::now_ms)
        .min(dedupe::clock::now_ms());
    let searched = dedupe::output::find_dead_letter(
        kafka,
        topic,
        &answer.ledger_key,
        since,
        Duration::from_secs(15),
    )
    .map_err(|e| e.to_string());
    dedupe::explain::with_dead_letter(answer, searched, topic)
}

/// Explains `id` (from the front door's `source`, when given; the text of one JSON value if
/// `json`): asks the worker at `addr`; reads `config.worker.data_dir` when nothing listens there.
pub fn explain(
    config: &Config,
    (id, json): (&str, bool),
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
    if json {
        query.push("json_id=true".to_string());
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
        Ok(response) => {
            let answer: dedupe::explain::Answer = serde_json::from_reader(response.into_reader())?;
            if json {
                read_as_json(&answer, id, addr)?;
            }
            Ok(answer)
        }
        Err(ureq::Error::Status(status, response)) => {
            let body = response.into_string().unwrap_or_default();
            anyhow::bail!(
                "the worker at {addr} could not explain the id ({status}): {}",
                error_of(&body)
            )
        }
        Err(ureq::Error::Transport(t)) if t.kind() == ureq::ErrorKind::ConnectionFailed => {
            offline(config, (id, json), source, sent_at_ms)
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
    (id, json): (&str, bool),
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
        json,
        id_source: &config.worker.id_source,
        partition: None,
        owned: None,
        sent_at_ms,
        now_ms: dedupe::clock::now_ms(),
    };
    let answer = dedupe::explain::explain(&ledger, &q)?;
    ledger.close()?;
    Ok(with_dead_letter(
        answer,
        &config.kafka,
        config.worker.dead_letter_topic.as_deref(),
    ))
}

/// Refuses an answer about another id than the JSON value asked about: a worker older than
/// `json_id` ignores the parameter and answers about the string of the text.
fn read_as_json(
    answer: &dedupe::explain::Answer,
    id: &str,
    addr: std::net::SocketAddr,
) -> anyhow::Result<()> {
    // The key the worker gives this JSON value, by the worker's own function.
    let asked = match dedupe::identity::json_value_id(id) {
        Ok((named, _)) => named.key.hex(),
        // Not one the worker could hold: its refusal says why; nothing to compare.
        Err(_) => return Ok(()),
    };
    if answer.ledger_key != asked {
        anyhow::bail!(
            "the worker at {addr} answered about ledger key {}, not the JSON value {id} (key {asked}): it does not read --json-id (an older version?); its answer is not printed",
            answer.ledger_key
        );
    }
    Ok(())
}

/// The `error` of an admin route's JSON answer, else the body as it is.
pub fn error_of(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.trim().to_string())
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
        // A JSON string's quotes travel in the path.
        assert_eq!(urlencode("\"abc\""), "%22abc%22");
    }

    #[test]
    fn a_routes_refusal_reads_as_its_error() {
        let body = r#"{"error":"this id source (json:/id) reads JSON; 1 is a number there"}"#;
        assert_eq!(
            error_of(body),
            "this id source (json:/id) reads JSON; 1 is a number there"
        );
        assert_eq!(error_of(" not json \n"), "not json");
    }

    /// A stopped worker's ledger reading ids as `json:/id`, holding the number
    /// 12345678901234567890 (as `{"id":12345678901234567890}` is held), and its configuration;
    /// no worker answers at the configuration's metrics address.
    fn stopped_json_worker() -> (tempfile::TempDir, Config) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.worker.data_dir = dir.path().to_path_buf();
        config.worker.id_source = IdSource::JsonPointer("/id".into());
        config.ledger.budget_bytes = dedupe::config::ByteSize(256 << 20);
        config.ledger.write_buffer_bytes = dedupe::config::ByteSize(1 << 20);
        config.ledger.block_cache_bytes = dedupe::config::ByteSize(1 << 20);
        let ledger = dedupe::ledger::Ledger::open(dir.path(), config.ledger.options()).unwrap();
        let record = br#"{"id":12345678901234567890}"#;
        let key = dedupe::identity::message_key(
            &dedupe::identity::copied_view(None, &[], Some(record)),
            &config.worker.id_source,
        )
        .unwrap();
        ledger
            .check_and_record(0, &[(key, dedupe::clock::now_ms())], b"")
            .unwrap();
        ledger.close().unwrap();
        (dir, config)
    }

    #[test]
    fn a_stopped_workers_number_id_is_found_by_json_id_and_its_digits_alone_get_the_hint() {
        let (_dir, config) = stopped_json_worker();
        // Nothing listens on a port just taken and let go: the ledger is read directly.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let digits = "12345678901234567890";
        let found = explain(&config, (digits, true), None, None, addr).unwrap();
        assert!(found.held && found.json_number, "{found:?}");
        // Named as text the digits are refused, naming --json-id: never `never_seen`.
        let e = format!(
            "{:#}",
            explain(&config, (digits, false), None, None, addr).unwrap_err()
        );
        assert!(
            e.contains("reads JSON; 12345678901234567890 is a number there")
                && e.contains("--json-id 12345678901234567890"),
            "{e}"
        );
        // The string of the digits is another id: asked for, it is not held.
        let quoted = format!("\"{digits}\"");
        let string = explain(&config, (&quoted, true), None, None, addr).unwrap();
        assert!(!string.held, "{string:?}");
    }
}

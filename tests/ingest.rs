//! The tracking API end to end: the real `dedupe ingest` binary against the real broker. A batch
//! lands as one record per message, keyed `<source>:<messageId>` on the partition the Java client
//! would choose; refused requests produce nothing; without Kafka nothing is ever answered 200.
//!
//! Cargo builds the binary for the test run (`CARGO_BIN_EXE_dedupe`), with the run's features.

// The browser and mobile routes, CORS, the settings document and Segment's JavaScript libraries;
// the rate limit and the in-flight limit.
#[path = "ingest/browser.rs"]
mod browser;
// Segment's libraries sending a batch with one invalid event.
#[path = "ingest/clients.rs"]
mod clients;
// Events without a `messageId`: derived ids, so a retry is dropped.
#[path = "ingest/ids.rs"]
mod ids;
#[path = "ingest/limits.rs"]
mod limits;
// Segment's server libraries that post to `/v1/import`: analytics-java.
#[path = "ingest/servers.rs"]
mod servers;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kit::http::{self, Response};
use kit::ingest::basic;
use kit::{brokers, consume_all, Dedupe, Ingest, TestTopic};
use serde_json::{json, Value};

const KEY_WEB: &str = "test-key-web";
const KEY_IOS: &str = "test-key-ios";

/// The Java client's partitioner for keyed records, written from its reference definition:
/// `toPositive(murmur2(key)) % partitions` (org.apache.kafka.common.utils.Utils).
fn java_partition(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions
}

fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

#[test]
fn murmur2_matches_the_java_clients_known_vectors() {
    // Vectors from the Java client's own tests (UtilsTest.testMurmur2), and the partition its
    // partitioner picks for a record key of ours out of four.
    for (input, hash) in [
        ("21", -973_932_308),
        ("foobar", -790_332_482),
        ("a-little-bit-long-string", -985_981_536),
        ("a-little-bit-longer-string", -1_486_304_829),
        (
            "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
            -58_897_971,
        ),
        ("abc", 479_470_107),
    ] {
        assert_eq!(murmur2(input.as_bytes()), hash, "murmur2({input})");
    }
    assert_eq!(java_partition(b"web:m-1", 4), 3);
}

#[test]
fn explain_puts_a_key_id_where_the_java_client_puts_its_record() {
    for (key, partitions) in [
        ("6ba7b810-9dad-11d1-80b4-00c04fd430c8", 4),
        ("web:m-1", 4),
        ("a", 3),
        ("messageId-7", 12),
    ] {
        let p = dedupe_cli::explain_client::partition_of_id(
            &dedupe::config::IdSource::Key,
            dedupe::config::InputPartitioner::Murmur2Random,
            key.as_bytes(),
            partitions,
        );
        assert_eq!(p, Some(java_partition(key.as_bytes(), partitions)), "{key}");
    }
    let header = dedupe::config::IdSource::Header("message-id".into());
    assert_eq!(
        dedupe_cli::explain_client::partition_of_id(
            &header,
            dedupe::config::InputPartitioner::Murmur2Random,
            b"x",
            4
        ),
        None,
        "a header id's partition follows a key it does not see"
    );
}

/// The binary under test, built by cargo for this test run.
const DEDUPE: Dedupe = Dedupe::at(env!("CARGO_BIN_EXE_dedupe"));

/// Starts `dedupe ingest` in front of `topic` on `brokers`, with two write keys (sources `web`
/// and `ios`) and `env`.
fn start_ingest(brokers: &str, topic: &str, env: &[(&str, &str)]) -> Ingest {
    let mut spec = DEDUPE
        .ingest(topic)
        .brokers(brokers)
        .write_key(KEY_WEB, "web")
        .write_key(KEY_IOS, "ios");
    for (k, v) in env {
        spec = spec.env(k, v);
    }
    spec.start()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn batch_lands_as_keyed_records_on_the_java_clients_partitions() {
    let topic = TestTopic::create("ingest-batch", 4);
    let ingest = start_ingest(&brokers(), &topic.name, &[]);
    ingest.wait_ready(200);

    // Forty messages: even ones carry their own messageId, odd ones get one from the service.
    let n = 40;
    let batch: Vec<Value> = (0..n)
        .map(|i| {
            let mut m = json!({"type": "track", "event": "Played", "userId": format!("u{i}"),
                               "properties": {"i": i}, "timestamp": "2024-01-01T00:00:00.000Z",
                               "context": {"library": {"name": "own"}}});
            if i % 2 == 0 {
                m["messageId"] = json!(format!("m-{i}"));
            }
            m
        })
        .collect();
    let before = now_ms();
    let r = ingest.post_json(
        "/v1/batch",
        Some(KEY_WEB),
        &json!({"batch": batch, "sentAt": "2024-01-01T00:00:01.000Z",
                "context": {"library": {"name": "shared", "version": "9"}, "locale": "de"}}),
    );
    let after = now_ms();
    assert_eq!(
        (r.status, r.json()),
        (200, json!({"success": true})),
        "{}",
        ingest.log_text()
    );

    let records = consume_all(&topic.name, false);
    assert_eq!(records.len(), n, "one record per message");
    let mut ids = BTreeSet::new();
    let mut partitions = BTreeSet::new();
    for rec in &records {
        let key = rec.key.clone().expect("every record is keyed");
        let value: Value = serde_json::from_slice(rec.value.as_deref().unwrap()).unwrap();
        let id = value["messageId"]
            .as_str()
            .expect("messageId in the value")
            .to_string();
        // The key is <source>:<messageId>, and the partition is the Java client's for that key.
        assert_eq!(String::from_utf8(key.clone()).unwrap(), format!("web:{id}"));
        assert_eq!(
            rec.partition,
            java_partition(&key, 4),
            "key {id} is not on the murmur2 partition"
        );
        partitions.insert(rec.partition);
        // Client ids are kept; the others, which carry the client's timestamp, got one derived
        // from their content (a version-8 UUID, marked by a header).
        let i = value["properties"]["i"].as_u64().unwrap();
        if i.is_multiple_of(2) {
            assert_eq!(id, format!("m-{i}"));
            assert_eq!(header(rec, "dedupe-message-id"), None);
        } else {
            assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 8);
            assert_eq!(header(rec, "dedupe-message-id"), Some("derived"));
        }
        ids.insert(id);
        // The shared context is merged under the message's own fields; times are kept as sent.
        assert_eq!(
            value["context"],
            json!({"library": {"name": "own", "version": "9"}, "locale": "de"})
        );
        assert_eq!(value["sentAt"], "2024-01-01T00:00:01.000Z");
        assert_eq!(value["timestamp"], "2024-01-01T00:00:00.000Z");
        assert!(
            value["receivedAt"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z') && t.len() == 24),
            "{value}"
        );
        assert!(value.get("writeKey").is_none());
        // The source header, the content digest (16 hex digits) and the id's mark (above), and
        // the receive time as the record's timestamp.
        assert_eq!(
            rec.headers[0],
            ("dedupe-source".to_string(), Some(b"web".to_vec()))
        );
        assert_eq!(rec.headers[1].0, "dedupe-content-digest");
        assert!(
            rec.headers[1]
                .1
                .as_ref()
                .is_some_and(|d| d.len() == 16 && d.iter().all(u8::is_ascii_hexdigit)),
            "{:?}",
            rec.headers[1]
        );
        assert_eq!(rec.headers.len(), 2 + usize::from(!i.is_multiple_of(2)));
        let ts = rec.timestamp.expect("a record timestamp");
        assert!(
            ts >= before - 1 && ts <= after + 1,
            "timestamp {ts} not within the request ({before}..{after})"
        );
    }
    assert_eq!(ids.len(), n, "every message has its own id");
    assert!(
        partitions.len() > 1,
        "forty keys all landed on one partition"
    );
}

#[test]
fn single_message_endpoints_take_gzip_and_the_body_write_key() {
    let topic = TestTopic::create("ingest-single", 2);
    let ingest = start_ingest(&brokers(), &topic.name, &[]);

    // Each single-message endpoint, authenticated by writeKey in the body, sent gzipped.
    let messages = [
        (
            "track",
            json!({"userId": "u", "event": "Clicked", "messageId": "s-track"}),
        ),
        (
            "identify",
            json!({"userId": "u", "traits": {"plan": "pro"}, "messageId": "s-identify"}),
        ),
        (
            "page",
            json!({"anonymousId": "a", "name": "Home", "messageId": "s-page"}),
        ),
        (
            "screen",
            json!({"anonymousId": "a", "name": "Feed", "messageId": "s-screen"}),
        ),
        (
            "group",
            json!({"userId": "u", "groupId": "g", "messageId": "s-group"}),
        ),
        (
            "alias",
            json!({"previousId": "a", "userId": "u", "messageId": "s-alias"}),
        ),
    ];
    for (endpoint, body) in &messages {
        let mut body = body.clone();
        body["writeKey"] = json!(KEY_IOS);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(body.to_string().as_bytes()).unwrap();
        let r = ingest.post(
            &format!("/v1/{endpoint}"),
            &[("Content-Encoding", "gzip")],
            &gz.finish().unwrap(),
        );
        assert_eq!(
            (r.status, r.json()),
            (200, json!({"success": true})),
            "/v1/{endpoint}"
        );
    }

    let records = consume_all(&topic.name, false);
    let by_key: BTreeMap<String, Value> = records
        .iter()
        .map(|r| {
            (
                String::from_utf8(r.key.clone().unwrap()).unwrap(),
                serde_json::from_slice(r.value.as_deref().unwrap()).unwrap(),
            )
        })
        .collect();
    assert_eq!(by_key.len(), messages.len());
    for (endpoint, _) in &messages {
        let value = &by_key[&format!("ios:s-{endpoint}")];
        // The type comes from the path, and the key never reaches Kafka.
        assert_eq!(value["type"], *endpoint);
        assert!(value.get("writeKey").is_none());
    }
}

#[test]
fn requests_without_a_known_write_key_are_refused_and_produce_nothing() {
    let topic = TestTopic::create("ingest-auth", 2);
    let ingest = start_ingest(&brokers(), &topic.name, &[]);
    let batch = json!({"batch": [{"type": "track", "event": "e", "userId": "u"}]});

    let cases = [
        ("no key at all", None, batch.clone(), "missing_write_key"),
        (
            "an unknown key in the header",
            Some("wrong-key"),
            batch.clone(),
            "unknown_write_key",
        ),
        (
            "an unknown key in the body",
            None,
            json!({"writeKey": "wrong-key", "batch": batch["batch"]}),
            "unknown_write_key",
        ),
        // A wrong header key is not rescued by a right body key.
        (
            "a wrong header with a right body key",
            Some("wrong-key"),
            json!({"writeKey": KEY_WEB, "batch": batch["batch"]}),
            "unknown_write_key",
        ),
    ];
    for (what, key, body, code) in cases {
        let r = ingest.post_json("/v1/batch", key, &body);
        assert_eq!(r.status, 401, "{what}");
        assert_eq!(r.json()["code"], code, "{what}");
        assert_eq!(r.json()["success"], false, "{what}");
    }
    let r = ingest.post(
        "/v1/batch",
        &[("Authorization", "Bearer test-key-web")],
        batch.to_string().as_bytes(),
    );
    assert_eq!(
        (r.status, r.json()["code"].clone()),
        (401, json!("malformed_authorization"))
    );

    assert!(
        consume_all(&topic.name, false).is_empty(),
        "a refused request produced records"
    );
}

#[test]
fn a_body_that_cannot_be_read_is_refused_whole_with_the_problem_named() {
    let topic = TestTopic::create("ingest-bad", 2);
    let ingest = start_ingest(&brokers(), &topic.name, &[]);
    ingest.wait_ready(200);
    let good = json!({"type": "track", "event": "e", "userId": "u"});

    let cases: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        ("malformed JSON", "/v1/batch", b"{\"batch\": [".to_vec(), "malformed_json"),
        ("not an object", "/v1/track", b"[1]".to_vec(), "not_an_object"),
        ("an empty batch", "/v1/batch", json!({"batch": []}).to_string().into_bytes(), "empty_batch"),
        ("a batch that is not an array", "/v1/b", json!({"batch": {"a": good}}).to_string().into_bytes(), "batch_not_array"),
        ("two batch fields", "/v1/batch", br#"{"batch":[],"batch":[{"type":"track","event":"e","userId":"u"}]}"#.to_vec(), "malformed_json"),
        ("a shared context with a lone surrogate", "/v1/batch",
         br#"{"context":{"s":"\ud800"},"batch":[{"type":"track","event":"e","userId":"u"}]}"#.to_vec(), "malformed_json"),
        ("a request over 500 KB", "/v1/batch",
         json!({"batch": vec![json!({"type": "track", "event": "e", "userId": "u", "p": "x".repeat(30 * 1024)}); 18]})
             .to_string()
             .into_bytes(),
         "request_too_large"),
    ];
    for (what, path, body, code) in &cases {
        let auth = basic(KEY_WEB);
        let r = ingest.post(path, &[("Authorization", &auth)], body);
        assert_eq!(
            r.status,
            400,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let v = r.json();
        assert_eq!(
            (v["success"].clone(), v["code"].as_str()),
            (json!(false), Some(*code)),
            "{what}: {v}"
        );
        assert!(
            v["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
    }

    // A gzip bomb: 20 MB of spaces in a few KB; refused on its decompressed size.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![b' '; 20 << 20]).unwrap();
    let bomb = gz.finish().unwrap();
    let auth = basic(KEY_WEB);
    let r = ingest.post(
        "/v1/batch",
        &[("Authorization", &auth), ("Content-Encoding", "gzip")],
        &bomb,
    );
    assert_eq!(
        (r.status, r.json()["code"].clone()),
        (400, json!("request_too_large"))
    );
    // A bad encoding is named by kind; its value is not echoed.
    let r = ingest.post(
        "/v1/batch",
        &[("Authorization", &auth), ("Content-Encoding", "br<script>")],
        b"{}",
    );
    assert_eq!(
        (r.status, r.json()["code"].clone()),
        (400, json!("unsupported_encoding"))
    );
    assert!(!String::from_utf8_lossy(&r.body).contains("script"));

    // Nothing of a refused request reached either topic.
    assert!(
        consume_all(&topic.name, false).is_empty(),
        "a refused request produced records"
    );
    assert!(
        consume_all(&format!("{}.dead-letter", topic.name), false).is_empty(),
        "a refused request was dead-lettered"
    );
}

/// The dead-letter records of `input`'s front door, by the index of the event in its batch.
fn dead_letters(input: &str) -> Vec<kit::Record> {
    consume_all(&format!("{input}.dead-letter"), false)
}

fn header<'a>(r: &'a kit::Record, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.as_deref())
        .map(|v| std::str::from_utf8(v).unwrap())
}

#[test]
fn an_invalid_event_goes_to_the_dead_letter_topic_and_costs_no_other_event() {
    let topic = TestTopic::create("ingest-per-event", 2);
    let ingest = start_ingest(&brokers(), &topic.name, &[]);
    ingest.wait_ready(200);
    let good = |i: usize| json!({"type": "track", "event": "e", "userId": "u", "messageId": format!("ok-{i}")});
    let long_id = "x".repeat(300);
    let big = "x".repeat(33 * 1024);

    // Each invalid event beside a valid one: the valid one is logged, the invalid one
    // dead-lettered with its reason, and the answer is 200 naming it.
    let invalid: Vec<(&str, String, &str)> = vec![
        (
            "a batch item without type",
            json!({"event": "e", "userId": "u"}).to_string(),
            "missing_type",
        ),
        (
            "a track without event",
            json!({"type": "track", "userId": "u", "messageId": "no-event"}).to_string(),
            "missing_event",
        ),
        (
            "a 300-character messageId",
            json!({"type": "track", "event": "e", "userId": "u", "messageId": long_id}).to_string(),
            "bad_message_id",
        ),
        (
            "a blank messageId",
            json!({"type": "track", "event": "e", "userId": "u", "messageId": "  "}).to_string(),
            "bad_message_id",
        ),
        (
            "a messageId with a bidirectional control",
            r#"{"type":"track","event":"e","userId":"u","messageId":"a\u202eb"}"#.to_string(),
            "bad_message_id",
        ),
        (
            "a message over 32 KB",
            json!({"type": "track", "event": "e", "userId": "u", "p": big}).to_string(),
            "message_too_large",
        ),
        (
            "a number too large for a double",
            r#"{"type":"track","event":"e","userId":"u","properties":{"n":1e999}}"#.to_string(),
            "malformed_json",
        ),
        (
            "a lone surrogate",
            r#"{"type":"track","event":"e","userId":"u","properties":{"s":"\ud800"}}"#.to_string(),
            "malformed_json",
        ),
        (
            "nesting 300 levels deep",
            format!(
                r#"{{"type":"track","event":"e","userId":"u","properties":{{"a":{}{}}}}}"#,
                "[".repeat(300),
                "]".repeat(300)
            ),
            "malformed_json",
        ),
        (
            "a repeated key",
            r#"{"type":"track","event":"e","userId":"u","event":"f"}"#.to_string(),
            "duplicate_key",
        ),
        ("not an object", "7".to_string(), "message_not_object"),
    ];
    for (i, (what, event, code)) in invalid.iter().enumerate() {
        let body = format!(
            r#"{{"batch":[{},{event},{}]}}"#,
            good(2 * i),
            good(2 * i + 1)
        );
        let auth = basic(KEY_WEB);
        let r = ingest.post("/v1/batch", &[("Authorization", &auth)], body.as_bytes());
        assert_eq!(
            r.status,
            200,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let v = r.json();
        assert_eq!(v["success"], true, "{what}: {v}");
        let rejected = v["rejected"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: {v}"));
        assert_eq!(rejected.len(), 1, "{what}: {v}");
        assert_eq!(
            (rejected[0]["index"].as_u64(), rejected[0]["code"].as_str()),
            (Some(1), Some(*code)),
            "{what}: {v}"
        );
        assert!(
            rejected[0]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("batch[1]: ")),
            "{what}: {v}"
        );
    }
    // A single-event route: the event alone, dead-lettered the same way, its write key dropped.
    let r = ingest.post(
        "/v1/track",
        &[],
        format!(r#"{{"userId":"u","messageId":"single-bad","writeKey":"{KEY_WEB}"}}"#).as_bytes(),
    );
    assert_eq!(
        (r.status, r.json()["rejected"][0]["code"].as_str()),
        (200, Some("missing_event")),
        "{:?}",
        r.json()
    );
    assert!(r.json()["rejected"][0].get("index").is_none());

    // Every valid event is in the input topic, once.
    let ids: BTreeSet<String> = consume_all(&topic.name, false)
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(r.value.as_deref().unwrap()).unwrap()["messageId"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        ids,
        (0..2 * invalid.len())
            .map(|i| format!("ok-{i}"))
            .collect::<BTreeSet<_>>()
    );
    // Every invalid one is in the dead-letter topic, as sent, with why, from where and when.
    let letters = dead_letters(&topic.name);
    assert_eq!(letters.len(), invalid.len() + 1);
    let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
    for r in &letters {
        let reason = header(r, "dedupe-reason").expect("a reason header");
        *by_reason.entry(reason.to_string()).or_default() += 1;
        assert_eq!(header(r, "dedupe-source"), Some("web"));
        assert!(header(r, "dedupe-error").is_some_and(|e| !e.is_empty()));
        assert!(
            header(r, "dedupe-received-at").is_some_and(|t| t.ends_with('Z') && t.len() == 24),
            "{:?}",
            r.headers
        );
        let value = String::from_utf8(r.value.clone().unwrap()).unwrap();
        assert!(
            !value.contains(KEY_WEB),
            "a write key reached the dead-letter topic"
        );
        if header(r, "dedupe-endpoint") == Some("track") {
            assert_eq!(header(r, "dedupe-index"), None);
            assert_eq!(value, r#"{"userId":"u","messageId":"single-bad"}"#);
            assert_eq!(r.key.as_deref(), Some(&b"web:single-bad"[..]));
        } else {
            assert_eq!(
                (header(r, "dedupe-endpoint"), header(r, "dedupe-index")),
                (Some("batch"), Some("1"))
            );
            // Byte for byte what was sent.
            assert!(
                invalid
                    .iter()
                    .any(|(_, sent, code)| *code == reason && *sent == value),
                "{reason}: {value:.120}"
            );
        }
    }
    let expected: BTreeMap<String, usize> = [
        ("missing_type", 1),
        ("missing_event", 2),
        ("bad_message_id", 3),
        ("message_too_large", 1),
        ("malformed_json", 3),
        ("duplicate_key", 1),
        ("message_not_object", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(by_reason, expected);
    // Counted per event, by reason.
    assert_eq!(
        ingest.metric(
            "dedupe_ingest_rejected_total",
            &[("reason", "malformed_json")]
        ),
        3.0
    );
    assert_eq!(
        ingest.metric(
            "dedupe_ingest_rejected_total",
            &[("reason", "missing_event")]
        ),
        2.0
    );
}

#[test]
fn refuse_request_mode_refuses_a_request_with_an_invalid_event_whole() {
    let topic = TestTopic::create("ingest-strict", 1);
    let ingest = start_ingest(
        &brokers(),
        &topic.name,
        &[("DEDUPE_INGEST_ON_INVALID_EVENT", "refuse-request")],
    );
    ingest.wait_ready(200);
    let r = ingest.post_json("/v1/batch", Some(KEY_WEB), &json!({"batch": [{"type": "track", "event": "e", "userId": "u"}, {"type": "track", "userId": "u"}]}));
    assert_eq!(r.status, 400, "{:?}", r.json());
    assert_eq!(r.json()["code"], "missing_event");
    assert_eq!(
        r.json()["message"],
        "batch[1]: a track message needs an `event` name"
    );
    assert!(
        consume_all(&topic.name, false).is_empty(),
        "a refused request produced records"
    );
}

#[test]
fn numbers_keys_and_strings_reach_kafka_as_sent_on_every_route() {
    let topic = TestTopic::create("ingest-as-sent", 1);
    let ingest = start_ingest(&brokers(), &topic.name, &[]);
    ingest.wait_ready(200);
    // The numbers a double would rewrite, keys out of alphabetical order, an escaped string.
    let fields = r#""userId":98765432109876543210,"properties":{"big":12345678901234567890123,"e":1e2,"z":1.50,"a":"\u00e9"}"#;
    let routes = [
        ("/v1/track", "track"),
        ("/v1/t", "t"),
        ("/v1/batch", "batch"),
        ("/v1/b", "b"),
    ];
    for (path, name) in routes {
        let event =
            format!(r#"{{"event":"e","messageId":"as-sent-{name}",{fields},"type":"track"}}"#);
        let body = if path.ends_with("track") || path.ends_with("/t") {
            event
        } else {
            format!(r#"{{"batch":[{event}]}}"#)
        };
        let auth = basic(KEY_WEB);
        let r = ingest.post(path, &[("Authorization", &auth)], body.as_bytes());
        assert_eq!(
            (r.status, r.json()),
            (200, json!({"success": true})),
            "{path}"
        );
    }
    let records = consume_all(&topic.name, false);
    assert_eq!(records.len(), routes.len());
    for r in records {
        let text = String::from_utf8(r.value.unwrap()).unwrap();
        let name = text
            .split("as-sent-")
            .nth(1)
            .and_then(|t| t.split('"').next())
            .unwrap()
            .to_string();
        assert!(text.starts_with(&format!(r#"{{"event":"e","messageId":"as-sent-{name}",{fields},"type":"track","receivedAt":""#)), "{text}");
        for number in [
            "98765432109876543210",
            "12345678901234567890123",
            "1e2",
            "1.50",
        ] {
            assert!(
                text.contains(number),
                "{name}: {number} is not as sent in {text}"
            );
        }
    }
}

#[test]
fn without_kafka_requests_are_answered_503_and_never_200() {
    // A broker address nothing listens on, and a short ack timeout.
    let ingest = start_ingest(
        "127.0.0.1:1",
        "ingest-unreachable",
        &[("DEDUPE_INGEST_ACK_TIMEOUT_MS", "1500")],
    );
    for i in 0..3 {
        let started = Instant::now();
        let r = ingest.post_json(
            "/v1/batch",
            Some(KEY_WEB),
            &json!({"batch": [{"type": "track", "event": "e", "userId": "u", "messageId": format!("x{i}")}]}),
        );
        assert_eq!(
            r.status,
            503,
            "request {i} was answered {}: {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["success"], false);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the 503 took {:?}",
            started.elapsed()
        );
    }
    // The process is up, but not ready, and says why.
    assert_eq!(http::get(ingest.addr, "/healthz").unwrap().status, 200);
    assert_eq!(http::get(ingest.addr, "/readyz").unwrap().status, 503);
    assert!(
        ingest
            .log_text()
            .contains("The brokers did not answer a metadata request for the input topic"),
        "{}",
        ingest.log_text()
    );
}

#[test]
fn a_front_door_killed_mid_traffic_answered_200_only_for_what_kafka_holds() {
    // Four clients send 20-event batches, each until it is answered 200: a refused or broken
    // connection, or a 503, is sent again with the same ids, as Segment's libraries do. Once a
    // third of the batches are acknowledged the front door (default settings) is SIGKILLed and
    // another one started. A 200 for a batch Kafka did not hold would leave its ids missing.
    const CLIENTS: usize = 4;
    const BATCHES: usize = 25;
    let input = TestTopic::create("ingest-killed", 3);
    let mut first = start_ingest(&brokers(), &input.name, &[]);
    first.wait_ready(200);
    let addr = Arc::new(Mutex::new(first.addr));
    let acknowledged = Arc::new(Mutex::new(BTreeSet::new()));
    let failed = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (addr, acknowledged, failed) = (addr.clone(), acknowledged.clone(), failed.clone());
            std::thread::spawn(move || {
                let auth = basic(KEY_WEB);
                for b in 0..BATCHES {
                    let ids: Vec<String> = (0..20).map(|i| format!("killed-{c}-{b}-{i}")).collect();
                    let events: Vec<Value> =
                        ids.iter().map(|id| json!({"type": "track", "event": "e", "userId": "u", "messageId": id})).collect();
                    let body = json!({ "batch": events }).to_string();
                    let deadline = Instant::now() + Duration::from_secs(90);
                    loop {
                        let at = *addr.lock().unwrap();
                        let headers = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
                        match http::request(at, "POST", "/v1/batch", &headers, body.as_bytes()) {
                            Ok(r) if r.status == 200 => break,
                            Ok(r) => assert_eq!(r.status, 503, "batch {c}-{b}: {}", String::from_utf8_lossy(&r.body)),
                            Err(_) => {}
                        }
                        failed.fetch_add(1, Ordering::Relaxed);
                        assert!(Instant::now() < deadline, "batch {c}-{b} was never answered 200");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    acknowledged.lock().unwrap().extend(ids);
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while acknowledged.lock().unwrap().len() < CLIENTS * BATCHES * 20 / 3 {
        assert!(
            Instant::now() < deadline,
            "the clients did not get a third of their batches through:\n{}",
            first.log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let second = start_ingest(&brokers(), &input.name, &[]);
    *addr.lock().unwrap() = second.addr;
    for client in clients {
        client.join().expect("a client failed");
    }
    assert!(
        failed.load(Ordering::Relaxed) > 0,
        "no request met the killed front door"
    );
    let acknowledged = std::mem::take(&mut *acknowledged.lock().unwrap());
    assert_eq!(acknowledged.len(), CLIENTS * BATCHES * 20);
    let copies = browser::input_copies(&input.name);
    eprintln!(
        "{} requests failed and were sent again; {} ids are twice in the input",
        failed.load(Ordering::Relaxed),
        copies.values().filter(|&&n| n > 1).count()
    );
    browser::dedupe_and_verify(&input, &acknowledged);
}

#[test]
fn a_missing_input_topic_is_named_and_served_once_it_exists() {
    let name = format!("ingest-late-{}", uuid::Uuid::new_v4().simple());
    let ingest = start_ingest(
        &brokers(),
        &name,
        &[("DEDUPE_INGEST_ACK_TIMEOUT_MS", "1500")],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ingest
        .log_text()
        .contains("The input topic does not exist on the brokers")
    {
        assert!(
            Instant::now() < deadline,
            "the missing topic was not named:\n{}",
            ingest.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ingest.log_text().contains(&name), "{}", ingest.log_text());
    assert_eq!(http::get(ingest.addr, "/readyz").unwrap().status, 503);
    let event = |id: &str| json!({"batch": [{"type": "track", "event": "e", "userId": "u", "messageId": id}]});
    let r = ingest.post_json("/v1/batch", Some(KEY_WEB), &event("late-1"));
    assert_eq!(
        (r.status, r.json()["code"].clone()),
        (503, json!("kafka_timeout"))
    );

    futures::executor::block_on(dedupe::kafka::create_topic(
        &kit::kafka_config(),
        &name,
        2,
        -1,
        &[],
    ))
    .unwrap();
    let topic = TestTopic {
        name,
        partitions: 2,
    };
    kit::wait_for_topic(&topic.name, 2);
    ingest.wait_ready(200);
    assert!(
        ingest
            .log_text()
            .contains("The input and dead-letter topics are in the brokers' metadata: ready."),
        "{}",
        ingest.log_text()
    );
    let r = ingest.post_json("/v1/batch", Some(KEY_WEB), &event("late-2"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        browser::input_copies(&topic.name)
            .keys()
            .collect::<Vec<_>>(),
        ["late-2"]
    );
}

/// The process's resident memory and its peak so far, in KiB, from `/proc/<pid>/status`.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// Bytes of records as this service wrote them: keys, values, header names and values (Kafka's
/// own framing not counted, as the documented bound does not).
fn written_bytes(records: &[kit::Record]) -> usize {
    records
        .iter()
        .map(|r| {
            let headers: usize = r
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                .sum();
            r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len) + headers
        })
        .sum()
}

#[test]
fn what_one_request_writes_stays_within_the_documented_bound() {
    // The two worst requests: 5,000 refused events (each a dead-letter record with its headers,
    // and the answer naming them), and 5,000 valid events that merge a shared context up to the
    // merged limit (each a record with an assigned id and three headers). Both arrive gzipped.
    let source_bytes = "web".len();
    let bound = dedupe_tracking::max_written_bytes(source_bytes);
    let refused = TestTopic::create("ingest-bound-refused", 1);
    let merged = TestTopic::create("ingest-bound-merged", 1);
    let auth = basic(KEY_WEB);
    for (topic, body, expect_refused) in [
        (
            &refused,
            format!(
                r#"{{"batch":[{}]}}"#,
                vec![r#"{"messageId":1}"#; 5000].join(",")
            ),
            5000,
        ),
        (
            &merged,
            {
                // Own size 42 B, plus the shared context's 16 + its text per event: just under 1 MB merged.
                let context = json!({ "c": "x".repeat(130) }).to_string();
                let events = vec![r#"{"type":"track","event":"e","userId":"u"}"#; 5000].join(",");
                format!(r#"{{"context":{context},"batch":[{events}]}}"#)
            },
            0,
        ),
    ] {
        let ingest = start_ingest(&brokers(), &topic.name, &[]);
        ingest.wait_ready(200);
        let gz = gzip(body.as_bytes());
        let r = ingest.post(
            "/v1/batch",
            &[("Authorization", &auth), ("Content-Encoding", "gzip")],
            &gz,
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(
            r.json()["rejected_count"].as_u64().unwrap_or(0),
            expect_refused
        );
        assert!(
            r.json()["rejected"].as_array().map_or(0, Vec::len)
                <= dedupe_tracking::MAX_ANSWER_REFUSALS
        );
        let input = consume_all(&topic.name, false);
        let letters = dead_letters(&topic.name);
        assert_eq!(
            input.len() + letters.len(),
            5000,
            "every event is a record, in one topic or the other"
        );
        let records = written_bytes(&input) + written_bytes(&letters);
        let total = records + r.body.len();
        eprintln!(
            "bound: {} B gzipped, {} B sent, wrote {records} B of records and a {} B answer: {total} B of at most {bound} B ({:.0}x the body)",
            gz.len(),
            body.len(),
            r.body.len(),
            total as f64 / body.len() as f64
        );
        assert!(total <= bound, "{total} B written, the bound is {bound} B");
        assert!(
            r.body.len() <= dedupe_tracking::MAX_ANSWER_BYTES,
            "a {} B answer",
            r.body.len()
        );
    }
}

#[test]
fn a_small_gzip_request_cannot_amplify_memory_through_the_shared_context() {
    let topic = TestTopic::create("ingest-amplify", 1);
    let ingest = start_ingest(&brokers(), &topic.name, &[]);
    ingest.wait_ready(200);
    // Warm up the allocator and the blocking pool with ordinary requests of the same route.
    for _ in 0..3 {
        let ok = ingest.post_json(
            "/v1/batch",
            Some(KEY_WEB),
            &json!({"batch": [{"type": "track", "event": "e", "userId": "u"}]}),
        );
        assert_eq!(ok.status, 200, "{:?}", ok.json());
    }
    let pid = ingest.child.id();
    let (idle_rss, idle_peak) = memory_kib(pid);

    // 250 KB of context shared by 5,000 tiny events: under 500 KB as sent, about 1.2 GB once
    // merged into every event, and about a kilobyte gzipped.
    let context = json!({ "blob": "c".repeat(250 << 10) });
    let events: Vec<Value> = (0..5000)
        .map(|_| json!({"type": "track", "event": "e", "userId": "u"}))
        .collect();
    let body = json!({ "context": context, "batch": events }).to_string();
    assert!(body.len() < 500 << 10);
    let bomb = gzip(body.as_bytes());
    assert!(bomb.len() < 4096, "{} bytes gzipped", bomb.len());

    // Four at once, while the process's memory is sampled.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut max_rss = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                max_rss = max_rss.max(memory_kib(pid).0);
                std::thread::sleep(Duration::from_millis(2));
            }
            max_rss
        })
    };
    let auth = basic(KEY_WEB);
    let answers: Vec<Response> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    ingest.post(
                        "/v1/batch",
                        &[("Authorization", &auth), ("Content-Encoding", "gzip")],
                        &bomb,
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let max_rss = sampler.join().unwrap();
    let (_, peak) = memory_kib(pid);

    for r in &answers {
        assert_eq!(r.status, 400, "{:?}", r.json());
        assert_eq!(r.json()["code"], "merged_batch_too_large", "{:?}", r.json());
        assert!(
            r.json()["message"].as_str().unwrap().contains("limit"),
            "{:?}",
            r.json()
        );
    }
    let grew_mib = (max_rss.max(peak).saturating_sub(idle_rss.max(idle_peak))) as f64 / 1024.0;
    eprintln!("amplification: idle RSS {idle_rss} KiB (peak {idle_peak}), during {max_rss} KiB, peak after {peak} KiB");
    assert!(
        grew_mib < 16.0,
        "memory grew by {grew_mib:.1} MiB under four amplification requests"
    );
    // Nothing of a refused request reached Kafka: only the three warm-up events are there.
    assert_eq!(consume_all(&topic.name, true).len(), 3);
}

/// Opens a connection and sends `bytes`, without waiting for an answer.
fn open_with(addr: SocketAddr, bytes: &[u8]) -> std::net::TcpStream {
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    stream.write_all(bytes).unwrap();
    stream
}

/// Feeds `stream` one byte of `rest` every `every` until the server closes it or `give_up` passes;
/// returns how long the server took to close it, or None if it never did.
fn trickle_until_closed(
    stream: &mut std::net::TcpStream,
    rest: &[u8],
    every: Duration,
    give_up: Duration,
) -> Option<Duration> {
    use std::io::Read;
    let started = Instant::now();
    stream.set_read_timeout(Some(every)).unwrap();
    let mut sink = [0u8; 4096];
    let mut at = 0;
    while started.elapsed() < give_up {
        if stream
            .write_all(&rest[at % rest.len()..at % rest.len() + 1])
            .is_err()
        {
            return Some(started.elapsed());
        }
        at += 1;
        match stream.read(&mut sink) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => {} // An answer (a 408): the close follows.
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return Some(started.elapsed()),
        }
    }
    None
}

const SLOW_LIMITS: &[(&str, &str)] = &[
    ("DEDUPE_INGEST_REQUEST_TIMEOUT_MS", "1000"),
    ("DEDUPE_INGEST_ACK_TIMEOUT_MS", "2000"),
    ("DEDUPE_INGEST_MAX_CONNECTIONS", "4"),
];

#[test]
fn a_body_that_does_not_arrive_in_time_is_answered_408_and_closed() {
    let topic = TestTopic::create("ingest-slow-body", 1);
    let ingest = start_ingest(&brokers(), &topic.name, SLOW_LIMITS);
    ingest.wait_ready(200);
    let head = format!(
        "POST /v1/batch HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"batch\":",
        basic(KEY_WEB)
    );
    let mut stream = open_with(ingest.addr, head.as_bytes());
    let started = Instant::now();
    use std::io::Read;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.starts_with("HTTP/1.1 408"),
        "a stalled body got: {text:?} after {:?}",
        started.elapsed()
    );
    assert!(text.contains("request_timeout"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered after {:?}",
        started.elapsed()
    );
}

#[test]
fn the_second_request_of_a_keep_alive_connection_is_timed_too() {
    use std::io::Read;
    let topic = TestTopic::create("ingest-slow-head", 1);
    let ingest = start_ingest(&brokers(), &topic.name, SLOW_LIMITS);
    ingest.wait_ready(200);
    // A whole first request, answered, on a connection that stays open.
    let body = r#"{"batch":[{"type":"track","event":"e","userId":"u"}]}"#;
    let first = format!(
        "POST /v1/batch HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        basic(KEY_WEB),
        body.len()
    );
    let mut stream = open_with(ingest.addr, first.as_bytes());
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    // The second request's head, a byte every 300 ms: never complete.
    let closed = trickle_until_closed(
        &mut stream,
        b"POST /v1/batch HTTP/1.1\r\nX-Slow: ",
        Duration::from_millis(300),
        Duration::from_secs(15),
    );
    let closed = closed.expect("the server held a trickling keep-alive connection open for 15 s");
    // The limit: request timeout + ack timeout + 1 s = 4 s.
    assert!(closed < Duration::from_secs(7), "closed after {closed:?}");
}

#[test]
fn slow_clients_cannot_hold_every_connection() {
    let topic = TestTopic::create("ingest-slowloris", 1);
    let ingest = start_ingest(&brokers(), &topic.name, SLOW_LIMITS);
    ingest.wait_ready(200);
    // Twelve trickling clients against a limit of four connections.
    let started = Instant::now();
    let connected = Arc::new(AtomicUsize::new(0));
    let slow: Vec<_> = (0..12)
        .map(|_| {
            let (addr, connected) = (ingest.addr, connected.clone());
            std::thread::spawn(move || {
                let mut s = open_with(addr, b"POST /v1/batch HTTP/1.1\r\n");
                connected.fetch_add(1, Ordering::Relaxed);
                trickle_until_closed(
                    &mut s,
                    b"X-Slow: abcdefgh\r\n",
                    Duration::from_millis(300),
                    Duration::from_secs(40),
                )
            })
        })
        .collect();
    // Every slow client has connected and sent its first line before the real one tries.
    kit::wait_until(
        "12 slow clients connected",
        Duration::from_secs(10),
        Duration::from_millis(10),
        || (connected.load(Ordering::Relaxed) == 12).then_some(()),
        || ingest.log_text(),
    );
    // A real client still gets through, once the slow ones are cut off.
    let ok = ingest.post_json(
        "/v1/batch",
        Some(KEY_WEB),
        &json!({"batch": [{"type": "track", "event": "e", "userId": "u"}]}),
    );
    let served_after = started.elapsed();
    assert_eq!(ok.status, 200, "{:?}", ok.json());
    assert!(
        served_after < Duration::from_secs(20),
        "a real request waited {served_after:?}"
    );
    for (i, s) in slow.into_iter().enumerate() {
        let closed = s.join().unwrap();
        assert!(
            closed.is_some_and(|d| d < Duration::from_secs(30)),
            "slow client {i} was held open: {closed:?}"
        );
    }
}

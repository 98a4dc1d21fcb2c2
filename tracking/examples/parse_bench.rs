//! The front door's parse, per event: the one-pass reader against the two serde_json passes it
//! replaced (the strict check, then the skim of the fields), and against a SIMD parser's bare
//! validation, on the ingest bench's 20-event batches and on one large nested event. Then the
//! whole of a request's making (parse, validate, the same-event text and its hashes, the records).
//!
//!   cargo run --release -p dedupe-tracking --example parse_bench [-- SECONDS_PER_CASE [NAME_PART]]
//!
//! Prints one JSON line per case: ns per event and MB/s. The cases run interleaved, round after
//! round, and each figure is the median of its rounds, so a machine that speeds up or slows down
//! moves every case alike.

use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime};

use dedupe_tracking::json::{reference, Fields, ItemFields, Mode, Reader};
use dedupe_tracking::{Endpoint, Envelope, MessageIds, MissingId};

/// A body as `deploy/bench/ingest.lua` sends it: 20 track events with a client `messageId`, an
/// anonymousId, a timestamp and four properties, and a shared context and `sentAt`.
fn bench_batch(seed: u64) -> String {
    let mut x = seed;
    let mut random = |n: usize, alphabet: &[u8]| -> String {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                alphabet[(x % alphabet.len() as u64) as usize] as char
            })
            .collect()
    };
    let events: Vec<String> = (0..20)
        .map(|i| {
            let h = random(32, b"0123456789abcdef");
            let uuid = format!("{}-{}-4{}-a{}-{}", &h[..8], &h[8..12], &h[13..16], &h[17..20], &h[20..]);
            let token = random(43, b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_");
            format!(
                r#"{{"messageId":"bench-{seed}-{i}","type":"track","event":"Bench Event","userId":"user-{i}","anonymousId":"{uuid}","timestamp":"2024-01-01T00:00:00.000Z","properties":{{"plan":"pro","n":{i},"path":"/bench/page","token":"{token}"}}}}"#
            )
        })
        .collect();
    format!(
        r#"{{"batch":[{}],"context":{{"library":{{"name":"wrk","version":"4"}}}},"sentAt":"2024-01-01T00:00:00.000Z"}}"#,
        events.join(",")
    )
}

/// One event of about 24 KB: properties nested four deep, with numbers, escapes and arrays.
fn large_event() -> String {
    let leaf = |i: usize| {
        format!(
            r#"{{"id":{i},"price":{i}.25,"name":"item \u00e9 {i}","tags":["a","b\n","c"],"ok":true,"none":null}}"#
        )
    };
    let level = |i: usize| {
        format!(
            r#"{{"items":[{}],"total":{}e2,"label":"level {i}"}}"#,
            (0..8)
                .map(|j| leaf(i * 8 + j))
                .collect::<Vec<_>>()
                .join(","),
            i
        )
    };
    let groups = (0..12)
        .map(|g| format!(r#""group{g}":{{"a":{},"b":{}}}"#, level(g), level(g + 100)))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        r#"{{"type":"track","event":"Order","userId":"u-1","messageId":"large-1","timestamp":"2024-01-01T00:00:00.000Z","properties":{{{groups}}}}}"#
    )
}

/// The events of a batch body, as the reader finds them.
fn events_of(body: &str) -> Vec<&str> {
    let mut items = Vec::new();
    Fields::read_with_items(
        &mut Reader::default(),
        body,
        Mode::Skim,
        "batch",
        &mut items,
    )
    .expect("the bench's body reads");
    items
}

/// A case: a name, the events it covers per call, the bytes it reads per call, and the call.
struct Case<'a> {
    name: &'static str,
    events: usize,
    bytes: usize,
    run: Box<dyn FnMut() + 'a>,
    ns_per_event: Vec<f64>,
}

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let batch = bench_batch(7);
    let events = events_of(&batch);
    let large = large_event();
    let ids = MessageIds {
        source: "bench",
        missing: MissingId::Derive,
    };
    let received = SystemTime::now();

    let mut cases: Vec<Case> = vec![
        Case {
            name: "batch: two serde_json passes per event (the strict check, then the skim of its fields), before",
            events: events.len(),
            bytes: batch.len(),
            run: Box::new(|| {
                // The body's skim, the batch's skim, then each event twice.
                let top = reference::fields(&batch).unwrap();
                let raw = top.iter().find(|(k, _)| k == "batch").unwrap().1;
                let items: Vec<&serde_json::value::RawValue> = serde_json::from_str(raw.get()).unwrap();
                for item in items {
                    reference::check_strict(item.get()).unwrap();
                    black_box(reference::fields(item.get()).unwrap());
                }
            }),
            ns_per_event: Vec::new(),
        },
        Case {
            name: "batch: the body's skim, then one strict pass per event, before",
            events: events.len(),
            bytes: batch.len(),
            run: Box::new(|| {
                let mut reader = Reader::default();
                let mut items = Vec::new();
                black_box(Fields::read_with_items(&mut reader, &batch, Mode::Skim, "batch", &mut items).unwrap());
                let mut list = Vec::new();
                for item in items {
                    let fields = Fields::read_into(&mut reader, item, Mode::Strict, list).unwrap();
                    black_box(&fields);
                    list = fields.into_list();
                }
            }),
            ns_per_event: Vec::new(),
        },
        Case {
            name: "batch: one strict pass per event within the body's pass, now",
            events: events.len(),
            bytes: batch.len(),
            run: Box::new(|| {
                let mut reader = Reader::default();
                let mut items = Vec::new();
                let mut read = ItemFields::new(32, usize::MAX, usize::MAX);
                black_box(
                    Fields::read_with_events(&mut reader, &batch, Mode::Skim, "batch", &mut items, &mut read).unwrap(),
                );
                let mut list = Vec::new();
                for (i, item) in items.into_iter().enumerate() {
                    assert!(read.fields_into(i, &mut list));
                    let fields = Fields::of_strict_read(item, list);
                    black_box(&fields);
                    list = fields.into_list();
                }
            }),
            ns_per_event: Vec::new(),
        },
        Case {
            name: "batch: sonic-rs (SIMD) parsing the body into a tree, every event once, no strict rule",
            events: events.len(),
            bytes: batch.len(),
            run: Box::new(|| {
                black_box(sonic_rs::from_str::<sonic_rs::Value>(&batch).unwrap());
            }),
            ns_per_event: Vec::new(),
        },
        Case {
            name: "large event: two serde_json passes, before",
            events: 1,
            bytes: large.len(),
            run: Box::new(|| {
                reference::check_strict(&large).unwrap();
                black_box(reference::fields(&large).unwrap());
            }),
            ns_per_event: Vec::new(),
        },
        Case {
            name: "large event: one strict pass, now",
            events: 1,
            bytes: large.len(),
            run: Box::new(|| {
                black_box(Fields::strict(&large).unwrap());
            }),
            ns_per_event: Vec::new(),
        },
        Case {
            name: "large event: sonic-rs, no strict rule",
            events: 1,
            bytes: large.len(),
            run: Box::new(|| {
                black_box(sonic_rs::from_str::<sonic_rs::Value>(&large).unwrap());
            }),
            ns_per_event: Vec::new(),
        },
        Case {
            name: "batch: the whole making of a request (parse, validate, same-event hashes, records), now",
            events: events.len(),
            bytes: batch.len(),
            run: Box::new(|| {
                let envelope = Envelope::parse(Endpoint::Batch, batch.as_bytes()).unwrap();
                black_box(envelope.into_events(received, ids).unwrap());
            }),
            ns_per_event: Vec::new(),
        },
    ];

    // A second argument keeps only the cases whose name holds it (to profile one).
    if let Some(only) = std::env::args().nth(2) {
        cases.retain(|c| c.name.contains(&only));
    }
    let rounds = 10;
    let per_round = Duration::from_secs_f64(seconds / rounds as f64);
    for _ in 0..rounds {
        for case in &mut cases {
            let started = Instant::now();
            let mut calls = 0u64;
            while started.elapsed() < per_round {
                for _ in 0..16 {
                    (case.run)();
                }
                calls += 16;
            }
            case.ns_per_event
                .push(started.elapsed().as_nanos() as f64 / (calls as f64 * case.events as f64));
        }
    }
    for case in &mut cases {
        case.ns_per_event.sort_by(f64::total_cmp);
        let ns = case.ns_per_event[rounds / 2];
        let bytes_per_event = case.bytes as f64 / case.events as f64;
        println!(
            "{}",
            serde_json::json!({
                "case": case.name,
                "ns_per_event": ns.round(),
                "mb_per_sec": (bytes_per_event / ns * 1e3).round(),
                "bytes_per_event": bytes_per_event.round(),
                "rounds": rounds,
            })
        );
    }
}

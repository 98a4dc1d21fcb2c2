//! The `[ingest]` section: the HTTP tracking API (`dedupe ingest`).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The HTTP tracking API.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// Listen address; loopback unless told otherwise.
    pub listen: SocketAddr,
    /// The topic every message is logged to (the worker's input topic).
    pub topic: String,
    /// File of `KEY SOURCE` lines; alternatively `DEDUPE_WRITE_KEYS=KEY=SOURCE,...`.
    pub write_keys_file: Option<PathBuf>,
    /// How long a request waits for Kafka's acknowledgement before it answers 503.
    pub ack_timeout_ms: u64,
    /// How long a client may take to send a request (head and body), on every request of a
    /// keep-alive connection. A request must also be answered within this plus `ack_timeout_ms`
    /// plus one second of its first byte, or its connection is closed.
    pub request_timeout_ms: u64,
    /// Most connections held at once, all worker threads together. Past it, new connections wait
    /// in the listen backlog. Needs as many file descriptors (plus 256), checked at start.
    pub max_connections: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            // Loopback: the image and the manifests open it to the pod network on purpose.
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            // The worker's default input topic.
            topic: "events.in".into(),
            write_keys_file: None,
            // Segment's clients time out at 10-15 s; answer before they give up.
            ack_timeout_ms: 10_000,
            // actix-web's default client_request_timeout, which times only a connection's first
            // request head; the service times every request (actors/src/http/guarded_stream.rs).
            request_timeout_ms: 5_000,
            // Well within the 1,024 files Debian and most container runtimes allow by default;
            // at a few ms per request this serves tens of thousands of requests per second.
            max_connections: 512,
        }
    }
}

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
    /// Most requests handled at once, all worker threads together; past it a request is answered
    /// 503 before its body is read, so a flood of large requests cannot exhaust memory (each may
    /// hold up to about 2.5 MB while it is decoded and produced).
    pub max_in_flight_requests: usize,
    /// Browser origins (`https://shop.example.com`, scheme, host and port, no path) whose pages may
    /// read the API's answers (CORS), preflight included. Empty: no CORS headers at all, so only
    /// servers, apps and same-origin pages can use it. `"*"` allows every origin (warned about at
    /// start: any page on the web can then post with a write key it has seen).
    pub cors_origins: Vec<String>,
    /// Events a second each source (write key) may send; 0 turns the limit off. Past it a request
    /// is answered 429 with `Retry-After` and `x-ratelimit-reset` (seconds), which Segment's
    /// libraries honour by waiting and sending the same events again.
    pub rate_limit_events_per_sec: u32,
    /// Events a source may send at once above its rate (the bucket's size); 0 means one second's
    /// worth (`rate_limit_events_per_sec`). Every event counts, so this is also the most events
    /// one request may carry: a request of more is refused 429 with reason `over_burst`, however
    /// long it waits. Set it at least as large as the clients' largest batch (Segment's libraries
    /// send up to 100-500 events per batch).
    pub rate_limit_burst_events: u32,
    /// The address browsers reach this API at (`https://track.example.com`), which the settings
    /// document (`GET /v1/projects/<writeKey>/settings`) points the library at. Unset: the
    /// request's own `Host` header, over http.
    pub public_url: Option<String>,
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
            // A quarter of the connections: at a few ms per request that is still tens of
            // thousands of requests per second, and at most about 320 MB of request bodies being
            // decoded at once.
            max_in_flight_requests: 128,
            // No CORS unless asked for: a browser page from another origin gets no answer it can read.
            cors_origins: Vec::new(),
            // Off: a write key stands for a whole source (a website, an app), whose fair rate only
            // its operator knows, and the front door's own limits (connections, requests in
            // flight) already protect the process. Set it per deployment to stop one source from
            // crowding out the others.
            rate_limit_events_per_sec: 0,
            rate_limit_burst_events: 0,
            public_url: None,
        }
    }
}

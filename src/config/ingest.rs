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
    /// Most requests decoded and produced at once, all worker threads together. A request takes
    /// its place once its body has arrived (a body still arriving holds only its connection and
    /// what it has sent), and past the limit it is answered 503 without being decoded, so a
    /// flood of large requests cannot exhaust memory (docs/tracking-api.md: what one holds).
    pub max_in_flight_requests: usize,
    /// How long a request whose write key is only in its body (the browser routes) may take to
    /// send that body. A request with a known key in its `Authorization` header has
    /// `request_timeout_ms`; one without must not hold a connection that long before anything
    /// about it is known. Never more than `request_timeout_ms`.
    pub keyless_body_timeout_ms: u64,
    /// Most requests without a known key in their `Authorization` header whose bodies are being
    /// read at once, all clients together; past it such a request is answered 503 at once. Keyed
    /// requests are not counted, so clients without a key cannot crowd out those with one.
    /// Unset: an eighth of `max_connections`; it must stay below it.
    pub max_keyless_body_reads: Option<usize>,
    /// The same, per client address. Unset: a quarter of `max_keyless_body_reads`.
    pub max_keyless_body_reads_per_client: Option<usize>,
    /// What happens to an invalid event in a request whose body can be read. `dead-letter`: the
    /// valid events go to `topic`, each invalid one to `dead_letter_topic` with its reason, and
    /// the answer is 200 naming the refused ones, so no client loses its valid events.
    /// `refuse-request`: the whole request is answered 400 naming the first invalid event, and
    /// nothing is produced.
    pub on_invalid_event: OnInvalidEvent,
    /// Where invalid events go. Unset: `<topic>.dead-letter`. Created at start (with the input
    /// topic's partition count and the brokers' default replication) when it does not exist;
    /// until it exists `/readyz` answers 503.
    pub dead_letter_topic: Option<String>,
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
    /// document (`GET /v1/projects/<writeKey>/settings`) points the library at. Unset: the listen
    /// address over http (listening on every address, the settings route answers 503 until it is
    /// set); never the request's `Host` header.
    pub public_url: Option<String>,
    /// What an event sent without a `messageId` gets. `derive`: when it carries the client's own
    /// `timestamp`, an id derived from its content (docs/tracking-api.md lists the fields), so a
    /// retry of the same request gets the same id and the worker drops it; without one, a random
    /// UUIDv4. `random`: always a random UUIDv4 (every retry of an id-less event is published).
    pub missing_message_id: MissingMessageId,
}

/// What `ingest.missing_message_id` asks for.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum MissingMessageId {
    /// Derived from the event's content when it has the client's `timestamp`, else random.
    Derive,
    /// Always a random UUIDv4.
    Random,
}

/// What `ingest.on_invalid_event` asks for.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum OnInvalidEvent {
    /// Produce the valid events, dead-letter the invalid ones, answer 200 naming them.
    DeadLetter,
    /// Answer 400 for the whole request and produce nothing.
    RefuseRequest,
}

impl IngestConfig {
    /// `keyless_body_timeout_ms`, never longer than a keyed request's `request_timeout_ms`.
    pub fn keyless_body_timeout_ms(&self) -> u64 {
        self.keyless_body_timeout_ms.min(self.request_timeout_ms)
    }

    /// `max_keyless_body_reads`, or its default.
    pub fn keyless_body_reads(&self) -> usize {
        self.max_keyless_body_reads
            .unwrap_or(self.max_connections / 8)
            .max(1)
    }

    /// `max_keyless_body_reads_per_client`, or its default.
    pub fn keyless_body_reads_per_client(&self) -> usize {
        self.max_keyless_body_reads_per_client
            .unwrap_or(self.keyless_body_reads() / 4)
            .max(1)
    }

    /// The dead-letter topic: the configured one, or `<topic>.dead-letter`.
    pub fn dead_letter_topic(&self) -> String {
        self.dead_letter_topic
            .clone()
            .unwrap_or_else(|| format!("{}.dead-letter", self.topic))
    }
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
            // request head; the service times every request
            // (tracking/src/server/guarded_stream.rs).
            request_timeout_ms: 5_000,
            // Well within the 1,024 files Debian and most container runtimes allow by default;
            // at a few ms per request this serves tens of thousands of requests per second.
            max_connections: 512,
            // An eighth of the connections: at a few ms per request that is still tens of
            // thousands of requests per second, and the worst case (every place holding the
            // largest body that can be sent, docs/tracking-api.md) fits the 1 GiB the manifests
            // give the pod, with room.
            max_in_flight_requests: 64,
            // Browsers send their bodies at once; two seconds cover a 500 KB batch over a slow
            // mobile link.
            keyless_body_timeout_ms: 2_000,
            // An eighth of the connections for bodies nobody vouches for yet (64 of 512), and a
            // quarter of those per address (a browser sends one or two requests at a time; an
            // office behind one address, more).
            max_keyless_body_reads: None,
            max_keyless_body_reads_per_client: None,
            // Never lose a valid event because of another.
            on_invalid_event: OnInvalidEvent::DeadLetter,
            dead_letter_topic: None,
            // No CORS unless asked for: a browser page from another origin gets no answer it can read.
            cors_origins: Vec::new(),
            // Off: a write key stands for a whole source (a website, an app), whose fair rate only
            // its operator knows, and the front door's own limits (connections, requests in
            // flight) already protect the process. Set it per deployment to stop one source from
            // crowding out the others.
            rate_limit_events_per_sec: 0,
            rate_limit_burst_events: 0,
            public_url: None,
            // The retry of an id-less event is the seed's lost response too.
            missing_message_id: MissingMessageId::Derive,
        }
    }
}

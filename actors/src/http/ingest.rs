//! The HTTP tracking API (`dedupe ingest`): an actix-web server that takes Segment-compatible
//! requests (`/v1/track`, `identify`, `page`, `screen`, `group`, `alias`, `batch`), authenticates
//! them with a write key, and logs every message to the input topic with an idempotent, `acks=all`
//! producer. It owns the HTTP listener, the input topic's producer and the readiness probe; the
//! parsing, validation and key rules live in the core's `dedupe::tracking`.
//!
//! Guarantee: never 200 for a message that is not in Kafka. A request is answered 200 only after
//! Kafka acknowledged every one of its messages; a delivery error, or no acknowledgement within
//! `ingest.ack_timeout_ms`, is answered 503 so the client retries with the same message ids (the
//! worker removes the duplicates a retry makes). Bad input is refused whole with 400 before
//! anything is produced; a missing or unknown write key is refused with 401.
//!
//! Routes: `POST /v1/<type>` and `/v1/batch`, the same under the one-letter names Segment's
//! browser and mobile libraries use (`/v1/t`, `i`, `p`, `s`, `g`, `a`, and `/v1/b`), and
//! `/v1/import`, the batch's older name (the Java, Ruby and .NET libraries'), each also with a
//! trailing slash (the Java library posts to `/v1/import/`); the settings
//! document analytics.js loads (`GET /v1/projects/<writeKey>/settings`); CORS for the configured
//! origins (`http::cors`).
//!
//! Checks, in order: requests in flight (503 past `ingest.max_in_flight_requests`, before the body
//! is read); the `Content-Type` (JSON as `application/json`, `text/plain` or none; else 415); a
//! write key in the `Authorization` header (401 if unknown, before the body is read); the body's
//! size (raw and decompressed) and JSON syntax (400); the write key from the header or the body's
//! `writeKey` (401); every message's fields and size (400); the source's rate limit (429 with
//! `Retry-After` and `x-ratelimit-reset`); then Kafka.
//!
//! Records: key `<source>:<messageId>`, value the message's JSON, header `dedupe-source`, timestamp
//! the receive time, partition chosen by librdkafka's `murmur2_random` partitioner (the Java
//! client's murmur2), so clients in other languages agree on where a key lands.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix_web::http::header::{ALLOW, AUTHORIZATION, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, HOST, RETRY_AFTER};
use actix_web::http::StatusCode;
use actix_web::middleware::from_fn;
use actix_web::{web, App, HttpRequest, HttpResponse};
use dedupe::config::Config;
use dedupe::metrics::{INGEST_EVENTS, INGEST_REJECTED, INGEST_REQUESTS, INGEST_REQUEST_SECONDS};
use dedupe::rate_limit::{self, Rate, RateLimiter};
use dedupe::tracking::{
    self, AuthError, Endpoint, Envelope, EventType, Message, Rejection, WriteKeys, WriteKeysError, ENV_WRITE_KEYS,
    HEADER_SOURCE, MAX_REQUEST_BYTES,
};
use futures::StreamExt;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use futures::channel::oneshot;
use rdkafka::client::ClientContext;
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::http::cors::{self, CorsPolicy};
use crate::http::server::{serve_http, Limits, LimitsError};

/// librdkafka's partitioner that matches the Java client's for keyed records.
pub const PARTITIONER: &str = "murmur2_random";
/// The ingest producer's `linger.ms`, unless `kafka.properties` sets it.
///
/// A 1 ms linger: the records of the requests that arrive within a millisecond go out in one
/// produce request per partition, not one per request. librdkafka sends each partition's batch
/// as a request of its own, and the broker's cost is mostly per request: in four paired runs of
/// 32 connections, 20-event requests, it took the broker 23-34% less CPU per event than no
/// linger and gave 1-15% more events/s. A longer linger adds to every request's wait, and with
/// a bounded number of clients each waiting on its answer the wait bounds the throughput: 2 ms
/// lost 25-28% of the events/s at 32 connections (gaining 2-14% at 128). `kafka.properties`
/// may set another.
pub const LINGER_MS: &str = "1";
/// The ingest producer's `compression.type`, unless `kafka.properties` sets it.
///
/// lz4 batches: the broker appends a compressed batch as it came (the topic's default
/// `compression.type=producer`), skipping each record's key, value and headers when it checks
/// them, and it writes and keeps a fraction of the bytes. Events that lz4 makes 4.4 times
/// smaller (each with 64 random characters; real events repeat their field names and context
/// the same way) took the broker 14-24% less CPU per event in three paired runs of 128
/// connections, and librdkafka's broker thread, which compresses, about 0.3 µs more: with
/// both on one 2-core machine the events/s were -6%, -6% and +6%. Events that differed only in
/// their ids, 13 times smaller: the broker's CPU per event 18-35% lower, events/s -2% to +17%.
/// The input topic's disk and network shrink by the same factor; the worker's consumer
/// decompresses transparently. `kafka.properties` may set another codec, or none.
pub const COMPRESSION: &str = "lz4";
/// What [`producer`] sets when `kafka.properties` does not.
const PRODUCER_DEFAULTS: [(&str, &str); 2] = [("linger.ms", LINGER_MS), ("compression.type", COMPRESSION)];
/// How often the readiness probe asks the broker for the topic's metadata.
const READINESS_INTERVAL: Duration = Duration::from_secs(2);
/// How long a metadata answer keeps the server ready: a few missed probes, not one.
const READINESS_FRESH: Duration = Duration::from_secs(10);
/// How long the producer may take to deliver what is in flight when the server stops.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// The rate limit's wait, in whole seconds, as Segment's browser library read it before it
/// honoured `Retry-After`; both are sent.
const X_RATELIMIT_RESET: &str = "x-ratelimit-reset";
/// How long a browser or CDN may keep the settings document when `ingest.public_url` names
/// where it points (without it, the document is built from the request's `Host` and never kept).
const SETTINGS_MAX_AGE: &str = "public, max-age=300";

/// Why the tracking API could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("cannot load the write keys: {0}")]
    WriteKeys(#[from] WriteKeysError),
    #[error("cannot create the Kafka producer for topic {topic}: {source}")]
    CreateProducer { topic: String, source: KafkaError },
    #[error("cannot connect to {brokers}: {failure}")]
    Security { brokers: String, failure: dedupe::kafka::SecurityFailure },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error("ingest.{0} (raise `ulimit -n` or lower ingest.max_connections)")]
    Limits(#[from] LimitsError),
}

/// Why a request's messages are not all in Kafka. Every variant is answered 503: each is worth
/// retrying, and a retry can only make duplicates, which the worker removes.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("the producer refused a message: {0}")]
    Enqueue(KafkaError),
    #[error("Kafka did not take a message: {0}")]
    Delivery(KafkaError),
    #[error("the producer dropped a message before it was acknowledged")]
    Dropped,
    #[error("Kafka did not acknowledge within {0:?}")]
    Timeout(Duration),
}

impl DeliveryError {
    fn reason(&self) -> &'static str {
        match self {
            Self::Enqueue(_) => "kafka_enqueue",
            Self::Delivery(_) => "kafka_delivery",
            Self::Dropped => "kafka_dropped",
            Self::Timeout(_) => "kafka_timeout",
        }
    }
}

/// How a request ended.
enum Outcome {
    /// Every message is in Kafka.
    Accepted(Vec<EventType>),
    /// Bad input: nothing was produced.
    Rejected(Rejection),
    /// The body could not be read (the client went away).
    Unreadable(String),
    /// The body did not arrive within `ingest.request_timeout_ms`.
    TooSlow(Duration),
    /// No usable write key: nothing was produced.
    Unauthorized(AuthError),
    /// The source is over its rate: nothing was produced; retry after this long.
    RateLimited(Duration),
    /// Too many requests in flight: the body was not read.
    Overloaded { limit: usize },
    /// Not every message is known to be in Kafka.
    Unavailable(DeliveryError),
}

impl Outcome {
    fn status(&self) -> StatusCode {
        match self {
            Self::Accepted(_) => StatusCode::OK,
            Self::Rejected(Rejection::UnsupportedContentType(_)) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Rejected(_) | Self::Unreadable(_) => StatusCode::BAD_REQUEST,
            Self::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::TooSlow(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            Self::Accepted(_) => "accepted",
            Self::Rejected(r) => r.reason(),
            Self::Unreadable(_) => "unreadable_body",
            Self::TooSlow(_) => "request_timeout",
            Self::Unauthorized(a) => a.reason(),
            Self::RateLimited(_) => "rate_limited",
            Self::Overloaded { .. } => "too_many_requests_in_flight",
            Self::Unavailable(d) => d.reason(),
        }
    }

    fn response(&self) -> HttpResponse {
        let body = match self {
            Self::Accepted(_) => json!({ "success": true }),
            Self::Rejected(r) => error_body(self.reason(), &r.to_string()),
            Self::Unreadable(e) => error_body(self.reason(), &format!("the request body could not be read: {e}")),
            Self::TooSlow(limit) => {
                error_body(self.reason(), &format!("the request body did not arrive within {} ms", limit.as_millis()))
            }
            Self::Unauthorized(a) => error_body(self.reason(), &a.to_string()),
            Self::RateLimited(wait) => error_body(
                self.reason(),
                &format!("this source is over its rate limit; retry in {} s", rate_limit::retry_after_secs(*wait)),
            ),
            Self::Overloaded { limit } => error_body(
                self.reason(),
                &format!("the server is handling {limit} requests already; retry the same request"),
            ),
            // The Kafka error text names brokers and topics, not payloads; the client only needs to retry.
            Self::Unavailable(_) => {
                error_body(self.reason(), "the messages could not be confirmed in Kafka; retry the same request")
            }
        };
        // No Retry-After on 503: Segment's clients then retry at once and back off by count,
        // rather than pausing their whole pipeline as they do for a rate limit.
        let mut response = HttpResponse::build(self.status());
        if matches!(
            self,
            Self::TooSlow(_) | Self::Unreadable(_) | Self::Overloaded { .. } | Self::Rejected(Rejection::UnsupportedContentType(_))
        ) {
            // The rest of a body that did not arrive, or was never read, must not be read as the
            // next request.
            response.force_close();
        }
        if let Self::RateLimited(wait) = self {
            // Both say how many seconds to wait: Retry-After for today's libraries,
            // x-ratelimit-reset for the browser library's older releases.
            let secs = rate_limit::retry_after_secs(*wait).to_string();
            response.insert_header((RETRY_AFTER, secs.clone())).insert_header((X_RATELIMIT_RESET, secs));
        }
        response.json(body)
    }
}

/// A status code as a metric label.
fn status_label(status: u16) -> &'static str {
    match status {
        200 => "200",
        400 => "400",
        401 => "401",
        408 => "408",
        415 => "415",
        429 => "429",
        503 => "503",
        _ => "other",
    }
}

fn error_body(code: &str, message: &str) -> serde_json::Value {
    json!({ "success": false, "code": code, "message": message })
}

/// A finished request, logged and counted once, here. Never carries a payload or a key.
struct RequestFinished<'a> {
    endpoint: &'static str,
    outcome: &'a Outcome,
    source: Option<&'a str>,
    elapsed: Duration,
}

impl RequestFinished<'_> {
    fn emit(&self) {
        let status = self.outcome.status().as_u16();
        // Static labels: no allocation per request.
        metrics::counter!(INGEST_REQUESTS, "endpoint" => self.endpoint, "status" => status_label(status)).increment(1);
        metrics::histogram!(INGEST_REQUEST_SECONDS, "endpoint" => self.endpoint).record(self.elapsed.as_secs_f64());
        let source = self.source.unwrap_or("-");
        match self.outcome {
            Outcome::Accepted(types) => {
                // One counter update per type, not per event.
                let mut counts = [0u64; EventType::ALL.len()];
                for t in types {
                    counts[EventType::ALL.iter().position(|a| a == t).unwrap_or(0)] += 1;
                }
                for (t, n) in EventType::ALL.iter().zip(counts).filter(|(_, n)| *n > 0) {
                    metrics::counter!(INGEST_EVENTS, "type" => t.as_str()).increment(n);
                }
                debug!(endpoint = self.endpoint, source, events = types.len(), "Every message of the request is in Kafka.");
            }
            Outcome::Overloaded { .. } => {
                metrics::counter!(INGEST_REJECTED, "reason" => self.outcome.reason()).increment(1);
                warn!(endpoint = self.endpoint, "Answered 503: too many requests in flight (ingest.max_in_flight_requests).");
            }
            Outcome::Unavailable(e) => {
                metrics::counter!(INGEST_REJECTED, "reason" => self.outcome.reason()).increment(1);
                warn!(endpoint = self.endpoint, source, error = %e, "Answered 503: the request's messages are not confirmed in Kafka.");
            }
            other => {
                metrics::counter!(INGEST_REJECTED, "reason" => other.reason()).increment(1);
                info!(endpoint = self.endpoint, source, status, reason = other.reason(), "Refused a request.");
            }
        }
    }
}

/// The acknowledgements one request waits for. Kafka's answer for each of its messages is counted
/// here, on the producer's polling thread, and the last one wakes the request: one wake-up and one
/// allocation per request, not per message.
pub struct Acks {
    remaining: AtomicUsize,
    first_error: std::sync::Mutex<Option<KafkaError>>,
    done: std::sync::Mutex<Option<oneshot::Sender<Option<KafkaError>>>>,
}

impl Acks {
    fn new(messages: usize) -> (Arc<Self>, oneshot::Receiver<Option<KafkaError>>) {
        let (tx, rx) = oneshot::channel();
        let acks = Self {
            remaining: AtomicUsize::new(messages),
            first_error: std::sync::Mutex::new(None),
            done: std::sync::Mutex::new(Some(tx)),
        };
        (Arc::new(acks), rx)
    }

    /// Counts one message's answer; the last sends the first error, if any.
    fn record(&self, error: Option<&KafkaError>) {
        // A poisoned lock only means a panic elsewhere; the value is still an Option.
        if let Some(e) = error {
            self.first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| e.clone());
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let first_error = self.first_error.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(done) = self.done.lock().unwrap_or_else(|p| p.into_inner()).take() {
                // The request may have given up (timeout) and dropped its receiver.
                let _ = done.send(first_error);
            }
        }
    }
}

/// The producer's context: hands each delivery report to its request's [`Acks`].
pub struct RequestAcks;

impl ClientContext for RequestAcks {}

impl ProducerContext for RequestAcks {
    type DeliveryOpaque = Arc<Acks>;

    fn delivery(&self, result: &DeliveryResult<'_>, acks: Arc<Acks>) {
        acks.record(result.as_ref().err().map(|(e, _)| e));
    }
}

/// The input topic's producer, polled on a thread of its own.
pub type IngestProducer = Arc<ThreadedProducer<RequestAcks>>;

/// What every request handler shares.
struct Ingest {
    producer: IngestProducer,
    topic: String,
    keys: Arc<WriteKeys>,
    ack_timeout: Duration,
    request_timeout: Duration,
    readiness: Arc<Readiness>,
    /// Each source's token bucket; None when `ingest.rate_limit_events_per_sec` is 0.
    limiter: Option<RateLimiter>,
    in_flight: AtomicUsize,
    max_in_flight: usize,
    /// `ingest.public_url` split as the settings document wants it: (protocol, host and path).
    public_url: Option<(String, String)>,
}

/// A request counted in flight until it is dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts a request in flight, or refuses it if `max` are already.
fn admit(in_flight: &AtomicUsize, max: usize) -> Result<InFlight<'_>, Outcome> {
    if in_flight.fetch_add(1, Ordering::AcqRel) >= max {
        in_flight.fetch_sub(1, Ordering::AcqRel);
        return Err(Outcome::Overloaded { limit: max });
    }
    Ok(InFlight(in_flight))
}

impl Ingest {

    async fn handle(&self, endpoint: Endpoint, req: &HttpRequest, payload: web::Payload) -> (Outcome, Option<String>) {
        let content_type = req.headers().get(CONTENT_TYPE).map(|h| h.to_str().unwrap_or("unreadable"));
        if let Err(r) = tracking::check_content_type(content_type) {
            return (Outcome::Rejected(r), None);
        }
        let authorization = req.headers().get(AUTHORIZATION).map(|h| h.to_str().unwrap_or(""));
        // A header with a wrong key is refused before the body is even read.
        if let Some(header) = authorization {
            if let Err(e) = self.keys.authenticate(Some(header), None) {
                return (Outcome::Unauthorized(e), None);
            }
        }
        let raw = match read_body(req, payload, self.request_timeout).await {
            Ok(raw) => raw.freeze(),
            Err(outcome) => return (outcome, None),
        };
        let raw_len = raw.len();
        let encoding = req.headers().get(CONTENT_ENCODING).map(|h| h.to_str().unwrap_or("unreadable").to_string());
        let authorization = authorization.map(str::to_string);
        let keys = Arc::clone(&self.keys);
        let received_at = SystemTime::now();
        let decode = move || {
            decode_and_validate(endpoint, &raw, encoding.as_deref(), authorization.as_deref(), &keys, received_at)
        };
        // Decoding and validating cost time in proportion to the body (bounded by the request
        // limits); a large body is handled off the server's event loop so it delays no one else.
        let decoded = if raw_len <= INLINE_BODY_BYTES {
            decode()
        } else {
            match web::block(decode).await {
                Ok(decoded) => decoded,
                Err(e) => return (Outcome::Unreadable(format!("the request could not be decoded: {e}")), None),
            }
        };
        let (source, messages) = match decoded {
            Ok(decoded) => decoded,
            Err(refused) => return refused,
        };
        if let Some(limiter) = &self.limiter {
            if let Err(wait) = limiter.take(&source, messages.len(), Instant::now()) {
                return (Outcome::RateLimited(wait), Some(source));
            }
        }
        let outcome = match self.deliver(&source, &messages, tracking::unix_millis(received_at)).await {
            Ok(()) => Outcome::Accepted(messages.iter().map(|m| m.event_type).collect()),
            Err(e) => Outcome::Unavailable(e),
        };
        (outcome, Some(source))
    }

    /// Produces every message and waits until Kafka acknowledged all of them, or gives up.
    async fn deliver(&self, source: &str, messages: &[Message], received_ms: i64) -> Result<(), DeliveryError> {
        if let Some((code, _)) = self.producer.client().fatal_error() {
            return Err(DeliveryError::Enqueue(KafkaError::MessageProduction(code)));
        }
        if messages.is_empty() {
            return Ok(());
        }
        let (acks, answered) = Acks::new(messages.len());
        for m in messages {
            let key = tracking::record_key(source, &m.message_id);
            let headers = OwnedHeaders::new_with_capacity(1).insert(Header { key: HEADER_SOURCE, value: Some(source) });
            let record = BaseRecord::with_opaque_to(&self.topic, Arc::clone(&acks))
                .key(&key)
                .payload(&m.value)
                .headers(headers)
                .timestamp(received_ms);
            // Messages already handed over may still land; the client's retry makes duplicates
            // of them, which the worker removes.
            self.producer.send(record).map_err(|(e, _)| DeliveryError::Enqueue(e))?;
        }
        let answer = tokio::time::timeout(self.ack_timeout, answered)
            .await
            .map_err(|_| DeliveryError::Timeout(self.ack_timeout))?;
        match answer {
            Ok(None) => Ok(()),
            Ok(Some(e)) => Err(DeliveryError::Delivery(e)),
            Err(oneshot::Canceled) => Err(DeliveryError::Dropped),
        }
    }
}

/// Bodies up to this size are decoded on the event loop; larger ones on the blocking pool.
const INLINE_BODY_BYTES: usize = 16 * 1024;

/// Decodes, parses, authenticates and validates a request: the source and its messages, or the
/// refusal (with the source when it is known).
fn decode_and_validate(
    endpoint: Endpoint,
    raw: &[u8],
    encoding: Option<&str>,
    authorization: Option<&str>,
    keys: &WriteKeys,
    received_at: SystemTime,
) -> Result<(String, Vec<Message>), (Outcome, Option<String>)> {
    let body = tracking::decode_body(raw, encoding).map_err(|r| (Outcome::Rejected(r), None))?;
    let envelope = Envelope::parse(endpoint, &body).map_err(|r| (Outcome::Rejected(r), None))?;
    let source = match keys.authenticate(authorization, envelope.write_key()) {
        Ok(source) => source.to_string(),
        Err(e) => return Err((Outcome::Unauthorized(e), None)),
    };
    match envelope.into_messages(received_at) {
        Ok(messages) => Ok((source, messages)),
        Err(r) => Err((Outcome::Rejected(r), Some(source))),
    }
}

/// Reads the raw body within `timeout`, refusing it as soon as it is known to be over the limit.
async fn read_body(req: &HttpRequest, payload: web::Payload, timeout: Duration) -> Result<web::BytesMut, Outcome> {
    tokio::time::timeout(timeout, read_body_unbounded(req, payload)).await.map_err(|_| Outcome::TooSlow(timeout))?
}

async fn read_body_unbounded(req: &HttpRequest, mut payload: web::Payload) -> Result<web::BytesMut, Outcome> {
    let too_large = || Outcome::Rejected(Rejection::RequestTooLarge { limit: MAX_REQUEST_BYTES });
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_REQUEST_BYTES) {
        return Err(too_large());
    }
    let mut body = web::BytesMut::with_capacity(declared.unwrap_or(8192));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| Outcome::Unreadable(e.to_string()))?;
        if body.len() + chunk.len() > MAX_REQUEST_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A message route asked with another method than POST.
async fn method_not_allowed() -> HttpResponse {
    HttpResponse::MethodNotAllowed()
        .insert_header((ALLOW, "POST"))
        .json(error_body("method_not_allowed", "this route takes POST"))
}

/// `POST /v1/<name>` for a name no library uses.
async fn unknown_endpoint() -> HttpResponse {
    HttpResponse::NotFound().json(error_body("unknown_endpoint", "no such endpoint"))
}

async fn post_message(endpoint: Endpoint, req: HttpRequest, payload: web::Payload, ingest: web::Data<Ingest>) -> HttpResponse {
    let started = Instant::now();
    let (outcome, source) = match admit(&ingest.in_flight, ingest.max_in_flight) {
        Ok(_in_flight) => ingest.handle(endpoint, &req, payload).await,
        Err(overloaded) => (overloaded, None),
    };
    RequestFinished { endpoint: endpoint.as_str(), outcome: &outcome, source: source.as_deref(), elapsed: started.elapsed() }
        .emit();
    outcome.response()
}

/// `GET /v1/projects/<writeKey>/settings`: the settings document that points analytics.js back at
/// this API, for a known write key; 401 for any other.
async fn settings(req: HttpRequest, key: web::Path<String>, ingest: web::Data<Ingest>) -> HttpResponse {
    let endpoint = "settings";
    let status = |response: HttpResponse| {
        metrics::counter!(INGEST_REQUESTS, "endpoint" => endpoint, "status" => response.status().as_u16().to_string()).increment(1);
        response
    };
    let Some(source) = ingest.keys.source(&key) else {
        let refusal = AuthError::Unknown;
        metrics::counter!(INGEST_REJECTED, "reason" => refusal.reason()).increment(1);
        info!(endpoint, status = 401, reason = refusal.reason(), "Refused a request.");
        return status(HttpResponse::Unauthorized().json(error_body(refusal.reason(), &refusal.to_string())));
    };
    let (protocol, base, cache) = match &ingest.public_url {
        Some((protocol, base)) => (protocol.as_str(), base.clone(), SETTINGS_MAX_AGE),
        None => {
            let host = req.headers().get(HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
            if !is_host(host) {
                metrics::counter!(INGEST_REJECTED, "reason" => "bad_host").increment(1);
                return status(HttpResponse::BadRequest().json(error_body(
                    "bad_host",
                    "the Host header is missing or not a host[:port]; set ingest.public_url",
                )));
            }
            ("http", host.to_string(), "no-store")
        }
    };
    debug!(endpoint, source, "Served the settings document.");
    let doc = tracking::settings_document(&key, &format!("{base}/v1"), protocol);
    status(HttpResponse::Ok().insert_header((CACHE_CONTROL, cache)).json(doc))
}

/// A `Host` header worth echoing into the settings document: a name or address, and a port.
fn is_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
}

/// `ingest.public_url` as (protocol, host and path without a trailing slash).
fn split_public_url(url: &str) -> Option<(String, String)> {
    let (protocol, rest) = url.split_once("://")?;
    Some((protocol.to_string(), rest.trim_end_matches('/').to_string()))
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "up" }))
}

async fn readyz(ingest: web::Data<Ingest>) -> HttpResponse {
    match ingest.readiness.check() {
        Ok(()) => HttpResponse::Ok().json(json!({ "status": "ready" })),
        Err(why) => HttpResponse::ServiceUnavailable().json(json!({ "status": "not ready", "message": why })),
    }
}

/// What one readiness probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probed {
    Ready,
    NoTopic,
    NoAnswer,
}

/// Whether the producer can reach the topic: a metadata request for it succeeded recently.
struct Readiness {
    last_ok_ms: AtomicI64,
    stop: AtomicBool,
}

impl Readiness {
    /// Probes in a thread of its own: metadata requests block.
    fn start(producer: IngestProducer, topic: String) -> Arc<Self> {
        let readiness = Arc::new(Self { last_ok_ms: AtomicI64::new(0), stop: AtomicBool::new(false) });
        let probe = Arc::clone(&readiness);
        let spawned = std::thread::Builder::new().name("ingest-readiness".into()).spawn(move || {
            // What the previous probe found: a change is logged, a repeat is not.
            let mut last: Option<Probed> = None;
            while !probe.stop.load(Ordering::Relaxed) {
                let found = producer.client().fetch_metadata(Some(&topic), READINESS_INTERVAL).map(|md| {
                    md.topics()
                        .iter()
                        .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
                });
                let now = match &found {
                    Ok(true) => Probed::Ready,
                    Ok(false) => Probed::NoTopic,
                    Err(_) => Probed::NoAnswer,
                };
                if now == Probed::Ready {
                    probe.last_ok_ms.store(tracking::unix_millis(SystemTime::now()), Ordering::Relaxed);
                }
                if last != Some(now) {
                    match &found {
                        Ok(true) => info!(topic = %topic, "The input topic is in the brokers' metadata: ready."),
                        Ok(false) => warn!(
                            topic = %topic,
                            "The input topic does not exist on the brokers (this service does not create it): /readyz answers 503, and so does every request, after ingest.ack_timeout_ms, until it does."
                        ),
                        Err(e) => warn!(
                            topic = %topic, error = %e,
                            "The brokers did not answer a metadata request for the input topic: /readyz answers 503 until they do."
                        ),
                    }
                    last = Some(now);
                }
                std::thread::sleep(READINESS_INTERVAL);
            }
        });
        if let Err(e) = spawned {
            warn!(error = %e, "Cannot start the readiness probe; /readyz will say not ready.");
        }
        readiness
    }

    fn check(&self) -> Result<(), &'static str> {
        let age_ms = tracking::unix_millis(SystemTime::now()) - self.last_ok_ms.load(Ordering::Relaxed);
        if age_ms <= READINESS_FRESH.as_millis() as i64 {
            Ok(())
        } else {
            Err("no recent metadata for the input topic from Kafka")
        }
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The rate limit `ingest` asks for, if any.
fn rate_limit_of(config: &dedupe::config::IngestConfig) -> Option<Rate> {
    let events_per_sec = std::num::NonZeroU32::new(config.rate_limit_events_per_sec)?;
    let burst = std::num::NonZeroU32::new(config.rate_limit_burst_events).unwrap_or(events_per_sec);
    Some(Rate { events_per_sec, burst })
}

/// The input topic's producer: idempotent, `acks=all`, Java-compatible partitioning, and giving
/// up on a message no earlier than the request does.
pub fn producer(config: &Config) -> Result<IngestProducer, KafkaError> {
    ThreadedProducer::from_config_and_context(&producer_config(config), RequestAcks).map(Arc::new)
}

/// The settings of [`producer`].
fn producer_config(config: &Config) -> rdkafka::ClientConfig {
    let mut client_config = dedupe::kafka::client_config(&config.kafka);
    client_config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", PARTITIONER)
        .set("message.timeout.ms", config.ingest.ack_timeout_ms.to_string());
    // Defaults, not requirements: where `kafka.properties` sets one, it wins.
    for (name, value) in PRODUCER_DEFAULTS {
        if !config.kafka.properties.contains_key(name) {
            client_config.set(name, value);
        }
    }
    client_config
}

/// Every message route's name: the server libraries' and the browser and mobile libraries'.
const ENDPOINT_NAMES: [&str; 15] =
    ["track", "identify", "page", "screen", "group", "alias", "batch", "t", "i", "p", "s", "g", "a", "b", "import"];

fn routes(cfg: &mut web::ServiceConfig) {
    // Fixed paths per endpoint, with and without a trailing slash: matched by comparing text,
    // not by a pattern, on every request.
    for name in ENDPOINT_NAMES {
        let endpoint = Endpoint::from_name(name).expect("every listed endpoint name is known");
        for path in [format!("/v1/{name}"), format!("/v1/{name}/")] {
            cfg.route(
                &path,
                web::post().to(move |req: HttpRequest, payload: web::Payload, ingest: web::Data<Ingest>| {
                    post_message(endpoint, req, payload, ingest)
                }),
            )
            // Any other method (a preflight from a listed origin is answered before routing).
            .route(&path, web::route().to(method_not_allowed));
        }
    }
    cfg.route("/v1/{endpoint}", web::post().to(unknown_endpoint))
        .route("/v1/{endpoint}/", web::post().to(unknown_endpoint))
        .route("/v1/projects/{write_key}/settings", web::get().to(settings))
        .route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .default_service(web::to(|| async { HttpResponse::NotFound().json(error_body("not_found", "no such path")) }));
}

/// Runs the tracking API until the process is told to stop (SIGINT, SIGTERM), then lets requests
/// in flight finish and flushes the producer.
pub async fn serve(config: Config) -> Result<(), IngestError> {
    let ingest_config = &config.ingest;
    let keys = WriteKeys::load(ingest_config.write_keys_file.as_deref(), std::env::var(ENV_WRITE_KEYS).ok().as_deref())?;
    let cors_policy = CorsPolicy::new(&ingest_config.cors_origins);
    if cors_policy.allows_any() {
        warn!("ingest.cors_origins allows every origin (\"*\"): any page on the web can post with a write key it has seen and read the answers; list your sites' origins instead.");
    }
    let limiter = rate_limit_of(ingest_config).map(|rate| {
        info!(events_per_sec = rate.events_per_sec.get(), burst = rate.burst.get(), "Each source is rate limited.");
        RateLimiter::new(rate, keys.sources(), Instant::now())
    });
    let topic = ingest_config.topic.clone();
    // Settings that can never connect end the process; unreachable brokers do not (the API
    // answers 503 until they are back).
    dedupe::kafka::check_security(&config.kafka, Duration::from_secs(15))
        .map_err(|failure| IngestError::Security { brokers: config.kafka.brokers.clone(), failure })?;
    let producer =
        producer(&config).map_err(|source| IngestError::CreateProducer { topic: topic.clone(), source })?;
    let readiness = Readiness::start(producer.clone(), topic.clone());
    let ack_timeout = Duration::from_millis(ingest_config.ack_timeout_ms);
    info!(sources = ?keys, "Loaded the write keys.");
    let ingest = web::Data::new(Ingest {
        producer: producer.clone(),
        topic: topic.clone(),
        keys: Arc::new(keys),
        ack_timeout,
        request_timeout: Duration::from_millis(ingest_config.request_timeout_ms),
        readiness: Arc::clone(&readiness),
        limiter,
        in_flight: AtomicUsize::new(0),
        max_in_flight: ingest_config.max_in_flight_requests,
        public_url: ingest_config.public_url.as_deref().and_then(split_public_url),
    });
    let cors_policy = web::Data::new(cors_policy);
    let addr = ingest_config.listen;
    let limits = Limits::from_ingest(ingest_config)?;
    let server = serve_http(addr, limits, move || {
        App::new().app_data(ingest.clone()).app_data(cors_policy.clone()).wrap(from_fn(cors::cors)).configure(routes)
    })
        .map_err(|source| IngestError::Bind { addr, source })?;
    info!(addr = %addr, topic = %topic, max_connections = limits.max_connections, "The tracking API is listening.");
    let result = server.await.map_err(IngestError::Serve);
    readiness.stop();
    if let Err(e) = producer.flush(FLUSH_TIMEOUT) {
        warn!(error = %e, "The producer did not flush before shutdown.");
    }
    info!("The tracking API stopped.");
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_fully_acknowledged_request_is_200() {
        // Bad input is 400, a missing or unknown key 401, anything short of every ack 503.
        let cases = [
            (Outcome::Accepted(vec![EventType::Track]), 200, "accepted"),
            (Outcome::Rejected(Rejection::EmptyBatch), 400, "empty_batch"),
            (Outcome::Rejected(Rejection::RequestTooLarge { limit: MAX_REQUEST_BYTES }), 400, "request_too_large"),
            (Outcome::Unreadable("connection reset".into()), 400, "unreadable_body"),
            (Outcome::TooSlow(Duration::from_secs(5)), 408, "request_timeout"),
            (Outcome::Unauthorized(AuthError::Missing), 401, "missing_write_key"),
            (Outcome::Unauthorized(AuthError::Unknown), 401, "unknown_write_key"),
            (Outcome::Rejected(Rejection::UnsupportedContentType("text/html".into())), 415, "unsupported_content_type"),
            (Outcome::RateLimited(Duration::from_millis(1500)), 429, "rate_limited"),
            (Outcome::Overloaded { limit: 128 }, 503, "too_many_requests_in_flight"),
            (Outcome::Unavailable(DeliveryError::Timeout(Duration::from_secs(1))), 503, "kafka_timeout"),
            (Outcome::Unavailable(DeliveryError::Dropped), 503, "kafka_dropped"),
            (Outcome::Unavailable(DeliveryError::Delivery(KafkaError::Canceled)), 503, "kafka_delivery"),
        ];
        for (outcome, status, reason) in cases {
            assert_eq!((outcome.status().as_u16(), outcome.reason()), (status, reason));
            assert_eq!(status_label(status), status.to_string());
            assert_eq!(outcome.response().status().as_u16(), status);
        }
    }

    #[actix_rt::test]
    async fn refusals_answer_a_body_with_their_code_and_a_message_naming_the_problem() {
        let cases = [
            (Outcome::Rejected(Rejection::EmptyBatch), "empty_batch", "`batch` is empty"),
            (Outcome::Rejected(Rejection::TooManyEvents { count: 6000 }), "too_many_events", "the limit is 5000"),
            (Outcome::TooSlow(Duration::from_millis(1500)), "request_timeout", "within 1500 ms"),
            (Outcome::Unauthorized(AuthError::Unknown), "unknown_write_key", "not known"),
            (Outcome::Unavailable(DeliveryError::Dropped), "kafka_dropped", "retry the same request"),
        ];
        for (outcome, code, names) in cases {
            let response = outcome.response();
            let closes = !response.head().keep_alive();
            let bytes = actix_web::body::to_bytes(response.into_body()).await.unwrap();
            let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(body["success"], false, "{body}");
            assert_eq!(body["code"], code, "{body}");
            assert!(body["message"].as_str().unwrap().contains(names), "{body}");
            // A body that did not arrive in time closes the connection; other refusals keep it.
            assert_eq!(closes, code == "request_timeout", "{code}");
        }
    }

    #[test]
    fn a_rate_limited_answer_says_how_long_to_wait_in_both_headers() {
        let response = Outcome::RateLimited(Duration::from_millis(1500)).response();
        assert_eq!(response.headers().get(RETRY_AFTER).unwrap(), "2");
        assert_eq!(response.headers().get(X_RATELIMIT_RESET).unwrap(), "2");
        // A request turned away unread closes its connection, so its body is never parsed as a
        // request.
        assert!(!Outcome::Overloaded { limit: 1 }.response().head().keep_alive());
    }

    #[test]
    fn the_in_flight_limit_counts_requests_until_they_end() {
        // Two of two admitted, a third refused; one ends, and a third fits.
        let counter = AtomicUsize::new(0);
        let a = admit(&counter, 2).ok().unwrap();
        let b = admit(&counter, 2).ok().unwrap();
        assert!(matches!(admit(&counter, 2), Err(Outcome::Overloaded { limit: 2 })));
        drop(a);
        let c = admit(&counter, 2).ok().unwrap();
        drop((b, c));
        assert_eq!(counter.load(Ordering::Acquire), 0);
    }

    #[test]
    fn settings_hosts_and_public_urls() {
        assert!(is_host("127.0.0.1:8080") && is_host("track.example.com") && is_host("[::1]:80"));
        assert!(!is_host("") && !is_host("a.com/evil") && !is_host("a.com\"x") && !is_host("a b"));
        assert_eq!(split_public_url("https://t.example.com/"), Some(("https".into(), "t.example.com".into())));
        assert_eq!(split_public_url("http://h:81/seg"), Some(("http".into(), "h:81/seg".into())));
    }

    #[test]
    fn the_producer_lingers_and_compresses_unless_kafka_properties_say_otherwise() {
        let mut config = Config::default();
        let defaults = producer_config(&config);
        assert_eq!(defaults.get("linger.ms"), Some(LINGER_MS));
        assert_eq!(defaults.get("compression.type"), Some(COMPRESSION));
        assert_eq!(defaults.get("enable.idempotence"), Some("true"));
        assert_eq!(defaults.get("acks"), Some("all"));

        config.kafka.properties.insert("linger.ms".into(), "5".into());
        config.kafka.properties.insert("compression.type".into(), "none".into());
        let overridden = producer_config(&config);
        assert_eq!(overridden.get("linger.ms"), Some("5"));
        assert_eq!(overridden.get("compression.type"), Some("none"));
    }

    #[test]
    fn readiness_needs_a_recent_metadata_answer() {
        // Never answered: not ready. Answered just now: ready. Answered long ago: not ready.
        let r = Readiness { last_ok_ms: AtomicI64::new(0), stop: AtomicBool::new(false) };
        assert!(r.check().is_err());
        let now = tracking::unix_millis(SystemTime::now());
        r.last_ok_ms.store(now, Ordering::Relaxed);
        assert!(r.check().is_ok());
        r.last_ok_ms.store(now - 2 * READINESS_FRESH.as_millis() as i64, Ordering::Relaxed);
        assert!(r.check().is_err());
    }
}

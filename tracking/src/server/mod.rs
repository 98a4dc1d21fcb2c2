//! The HTTP tracking API (`dedupe ingest`): an actix-web server that takes Segment-compatible
//! requests (`/v1/track`, `identify`, `page`, `screen`, `group`, `alias`, `batch`), authenticates
//! them with a write key, and logs every valid event to the input topic and every invalid one to
//! the dead-letter topic, with an idempotent, `acks=all` producer. It owns the HTTP listener, the
//! producer and the readiness probe; the parsing and validation live in the crate's pure modules,
//! the record key and headers in the core's wire contract (`dedupe::wire`). One file per concern:
//! [`admission`] (what a request may hold, and when), [`producer`](mod@producer) (the producer,
//! its settings and the acknowledgements it counts, below the topic handle and the delivery),
//! `topic` (a topic's handle and the send through it), [`delivery`] (a request's records and the
//! wait for their acknowledgements), [`outcome`] (answers), [`events`] (metrics and logs),
//! [`readiness`], [`settings`] (the document analytics.js loads).
//!
//! Guarantee: never 200 for an event that is not in Kafka, and never a valid event lost or
//! altered because of another. A request is answered 200 only after Kafka acknowledged every
//! record it made (its valid events in the input topic, its invalid ones in the dead-letter
//! topic), with the refused ones named in the answer; a delivery error, or no acknowledgement
//! within `ingest.ack_timeout_ms`, is answered 503 so the client retries with the same message
//! ids (the worker removes the duplicates a retry makes). A body that cannot be read (not JSON,
//! over the size limits, a bad encoding) is refused whole with 400 before anything is produced;
//! a missing or unknown write key is refused with 401.
//!
//! Routes: `POST /v1/<type>` and `/v1/batch`, the same under the one-letter names Segment's
//! browser and mobile libraries use (`/v1/t`, `i`, `p`, `s`, `g`, `a`, and `/v1/b`), and
//! `/v1/import`, the batch's older name (the Java, Ruby and .NET libraries'), each also with a
//! trailing slash (the Java library posts to `/v1/import/`); the settings document analytics.js
//! loads (`GET /v1/projects/<writeKey>/settings`); CORS for the configured origins
//! (`http::cors`).
//!
//! Checks, in order: the `Content-Type` (JSON as `application/json`, `text/plain` or none; else
//! 415); a write key in the `Authorization` header (401 if unknown, before the body is read);
//! for a request without one, a place among the keyless body reads (503 past them); the body,
//! within its deadline (408) and size (400); a place in flight (503 past
//! `ingest.max_in_flight_requests`); the body's JSON syntax (400); the write key from the header
//! or the body's `writeKey` (401); the source's rate limit, every event counted (429 with
//! `Retry-After` and `x-ratelimit-reset`); then each event's fields and size, and Kafka.
//!
//! Records: key `<source>:<messageId>`, value the event's JSON as sent (`dedupe_tracking::event`
//! says what is changed), header `dedupe-source`, timestamp the receive time, partition chosen by
//! librdkafka's `murmur2_random` partitioner (the Java client's murmur2), so clients in other
//! languages agree on where a key lands. Dead letters: the event's text as sent (without
//! `writeKey`), keyed alike when it has a usable id, with headers naming the reason.

pub mod admission;
pub mod cors;
pub mod delivery;
pub mod events;
pub mod guarded_stream;
pub mod http;
pub mod outcome;
pub mod producer;
pub mod readiness;
pub mod settings;
mod topic;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate as tracking;
use crate::rate_limit::{Rate, RateLimited, RateLimiter};
use crate::{
    Endpoint, Envelope, Events, IdOrigin, MessageIds, MissingId, Rejection, WriteKeys,
    WriteKeysError, ENV_WRITE_KEYS,
};
use actix_web::http::header::{ALLOW, AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE};
use actix_web::middleware::from_fn;
use actix_web::{web, App, HttpRequest, HttpResponse};
use dedupe::config::{Config, MissingMessageId, OnInvalidEvent};
use dedupe::log_limit::{LogLimiter, LOG_INTERVAL};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use serde_json::json;
use tracing::info;

use admission::{read_body, BodyReads, InFlight};
use cors::CorsPolicy;
use delivery::Delivery;
use events::RequestFinished;
use http::{serve_http, Limits, LimitsError};
use outcome::{error_body, Outcome, RefusedEvent};
use readiness::Readiness;

pub use producer::{producer, IngestProducer, COMPRESSION, LINGER_MS, PARTITIONER};

/// How long the producer may take to deliver what is in flight when the server stops.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// Bodies up to this size are decoded on the event loop; larger ones on the blocking pool.
const INLINE_BODY_BYTES: usize = 16 * 1024;

/// Why the tracking API could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("cannot load the write keys: {0}")]
    WriteKeys(#[from] WriteKeysError),
    #[error("cannot create the Kafka producer for topic {topic}: {source}")]
    CreateProducer { topic: String, source: KafkaError },
    #[error("cannot connect to {brokers}: {failure}")]
    Security {
        brokers: String,
        failure: dedupe::kafka::SecurityFailure,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error("checking the connection to the brokers failed: {0}")]
    ConnectionCheck(String),
    #[error("ingest.{0} (raise `ulimit -n` or lower ingest.max_connections)")]
    Limits(#[from] LimitsError),
}

/// What every request handler shares.
pub struct Ingest {
    delivery: Delivery,
    keys: Arc<WriteKeys>,
    request_timeout: Duration,
    keyless_body_timeout: Duration,
    readiness: Arc<Readiness>,
    /// Each source's token bucket; None when `ingest.rate_limit_events_per_sec` is 0.
    limiter: Option<RateLimiter>,
    in_flight: InFlight,
    body_reads: BodyReads,
    on_invalid_event: OnInvalidEvent,
    /// What an event sent without a `messageId` gets (`ingest.missing_message_id`).
    missing_id: MissingId,
    logs: LogLimiter,
    /// Where the settings document points browsers.
    api_base: settings::ApiBase,
}

/// A request decoded and authenticated: its source and its events.
type Decoded = Result<(String, Events), (Outcome, Option<String>)>;

impl Ingest {
    /// What the handlers share, from `ingest`'s settings.
    fn new(
        config: &dedupe::config::IngestConfig,
        delivery: Delivery,
        keys: WriteKeys,
        readiness: Arc<Readiness>,
        limiter: Option<RateLimiter>,
    ) -> Self {
        Self {
            delivery,
            keys: Arc::new(keys),
            request_timeout: Duration::from_millis(config.request_timeout_ms),
            keyless_body_timeout: Duration::from_millis(config.keyless_body_timeout_ms()),
            readiness,
            limiter,
            in_flight: InFlight::new(config.max_in_flight_requests),
            body_reads: BodyReads::new(
                config.keyless_body_reads(),
                config.keyless_body_reads_per_client(),
            ),
            on_invalid_event: config.on_invalid_event,
            missing_id: match config.missing_message_id {
                MissingMessageId::Derive => MissingId::Derive,
                MissingMessageId::Random => MissingId::Random,
            },
            logs: LogLimiter::new(LOG_INTERVAL),
            api_base: settings::ApiBase::of(config.public_url.as_deref(), config.listen),
        }
    }

    async fn handle(
        &self,
        endpoint: Endpoint,
        req: &HttpRequest,
        payload: web::Payload,
    ) -> (Outcome, Option<String>) {
        let (raw, authorization) = match self.receive(req, payload).await {
            Ok(received) => received,
            Err(outcome) => return (outcome, None),
        };
        let _place = match self.in_flight.admit() {
            Ok(place) => place,
            Err(overloaded) => return (overloaded, None),
        };
        // Crash and limit tests hold a request in its place for the failpoint's milliseconds,
        // without blocking the event loop.
        #[cfg(feature = "failpoints")]
        if let Some(ms) = fail::eval("ingest-in-flight", |arg| {
            arg.and_then(|a| a.parse::<u64>().ok())
        })
        .flatten()
        {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let received_at = SystemTime::now();
        let decoded = self
            .decode(
                endpoint,
                req,
                raw,
                authorization.map(str::to_string),
                received_at,
            )
            .await;
        let (source, events) = match decoded {
            Ok(decoded) => decoded,
            Err(refused) => return refused,
        };
        if let Err(limited) = self.charge(&source, events.len()) {
            return (limited, Some(source));
        }
        if let (OnInvalidEvent::RefuseRequest, Some(first)) =
            (self.on_invalid_event, events.refused.first())
        {
            let rejection = Rejection::Invalid {
                at: first.at,
                problem: first.problem.clone(),
            };
            return (Outcome::Rejected(rejection), Some(source));
        }
        let outcome = match self
            .delivery
            .deliver(
                &source,
                endpoint,
                &events,
                tracking::unix_millis(received_at),
            )
            .await
        {
            Ok(()) => accepted(&events),
            Err(e) => Outcome::Unavailable(e),
        };
        (outcome, Some(source))
    }

    /// Checks the `Content-Type` and the write key in the `Authorization` header, then reads
    /// the body within its deadline: the body and the header, or the refusal.
    async fn receive<'r>(
        &self,
        req: &'r HttpRequest,
        payload: web::Payload,
    ) -> Result<(web::Bytes, Option<&'r str>), Outcome> {
        let content_type = req
            .headers()
            .get(CONTENT_TYPE)
            .map(|h| h.to_str().unwrap_or("unreadable"));
        tracking::check_content_type(content_type).map_err(Outcome::Rejected)?;
        let authorization = req
            .headers()
            .get(AUTHORIZATION)
            .map(|h| h.to_str().unwrap_or(""));
        // A header with a wrong key is refused before the body is even read; one with a known
        // key gets the full deadline and is not counted among the keyless reads.
        let (_read, deadline) = match authorization {
            Some(header) => match self.keys.authenticate(Some(header), None) {
                Ok(_) => (self.body_reads.keyed(), self.request_timeout),
                Err(e) => return Err(Outcome::Unauthorized(e)),
            },
            None => (
                self.body_reads.keyless(req.peer_addr().map(|a| a.ip()))?,
                self.keyless_body_timeout,
            ),
        };
        let raw = read_body(req, payload, deadline).await?;
        // The place among the body reads is given back here, before the request asks for one
        // in flight.
        Ok((raw.freeze(), authorization))
    }

    /// Charges the source's rate limit for every event, valid or not: each becomes a record.
    fn charge(&self, source: &str, events: usize) -> Result<(), Outcome> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        match limiter.take(source, events, Instant::now()) {
            Ok(()) => Ok(()),
            Err(RateLimited::Wait(wait)) => Err(Outcome::RateLimited(wait)),
            Err(RateLimited::OverBurst { burst, full_in }) => Err(Outcome::OverBurst {
                burst,
                wait: full_in,
            }),
        }
    }

    /// Decodes, parses, authenticates and validates a request. Decoding and validating cost
    /// time in proportion to the body (bounded by the request limits); a large body is handled
    /// off the server's event loop so it delays no one else.
    async fn decode(
        &self,
        endpoint: Endpoint,
        req: &HttpRequest,
        raw: web::Bytes,
        authorization: Option<String>,
        received_at: SystemTime,
    ) -> Decoded {
        let encoding = req
            .headers()
            .get(CONTENT_ENCODING)
            .map(|h| h.to_str().unwrap_or("unreadable").to_string());
        let keys = Arc::clone(&self.keys);
        let inline = raw.len() <= INLINE_BODY_BYTES;
        let missing = self.missing_id;
        let decode = move || {
            decode_and_validate(
                endpoint,
                &raw,
                encoding.as_deref(),
                authorization.as_deref(),
                &keys,
                missing,
                received_at,
            )
        };
        if inline {
            return decode();
        }
        match web::block(decode).await {
            Ok(decoded) => decoded,
            Err(e) => Err((
                Outcome::Unreadable(format!("the request could not be decoded: {e}")),
                None,
            )),
        }
    }
}

/// The answer to a request whose records Kafka all acknowledged.
fn accepted(events: &Events) -> Outcome {
    Outcome::Accepted {
        types: events.messages.iter().map(|m| m.event_type).collect(),
        assigned: IdOrigin::ASSIGNED.map(|origin| {
            events
                .messages
                .iter()
                .filter(|m| m.id_origin == origin)
                .count() as u64
        }),
        refused: events.refused.iter().map(RefusedEvent::from).collect(),
    }
}

/// Decodes, parses, authenticates and validates a request: the source and its events, or the
/// refusal (with the source when it is known).
fn decode_and_validate(
    endpoint: Endpoint,
    raw: &[u8],
    encoding: Option<&str>,
    authorization: Option<&str>,
    keys: &WriteKeys,
    missing: MissingId,
    received_at: SystemTime,
) -> Decoded {
    let body = tracking::decode_body(raw, encoding).map_err(|r| (Outcome::Rejected(r), None))?;
    let envelope = Envelope::parse(endpoint, &body).map_err(|r| (Outcome::Rejected(r), None))?;
    let source = match keys.authenticate(authorization, envelope.write_key()) {
        Ok(source) => source.to_string(),
        Err(e) => return Err((Outcome::Unauthorized(e), None)),
    };
    match envelope.into_events(
        received_at,
        MessageIds {
            source: &source,
            missing,
        },
    ) {
        Ok(events) => Ok((source, events)),
        Err(r) => Err((Outcome::Rejected(r), Some(source))),
    }
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

async fn post_message(
    endpoint: Endpoint,
    req: HttpRequest,
    payload: web::Payload,
    ingest: web::Data<Ingest>,
) -> HttpResponse {
    let started = Instant::now();
    let (outcome, source) = ingest.handle(endpoint, &req, payload).await;
    RequestFinished {
        endpoint: endpoint.as_str(),
        outcome: &outcome,
        source: source.as_deref(),
        elapsed: started.elapsed(),
    }
    .emit(&ingest.logs);
    outcome.response()
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "up" }))
}

async fn readyz(ingest: web::Data<Ingest>) -> HttpResponse {
    match ingest.readiness.check() {
        Ok(()) => HttpResponse::Ok().json(json!({ "status": "ready" })),
        Err(why) => HttpResponse::ServiceUnavailable()
            .json(json!({ "status": "not ready", "message": why })),
    }
}

/// The rate limit `ingest` asks for, if any.
fn rate_limit_of(config: &dedupe::config::IngestConfig) -> Option<Rate> {
    let events_per_sec = std::num::NonZeroU32::new(config.rate_limit_events_per_sec)?;
    let burst = std::num::NonZeroU32::new(config.rate_limit_burst_events).unwrap_or(events_per_sec);
    Some(Rate {
        events_per_sec,
        burst,
    })
}

/// Every message route's name: the server libraries' and the browser and mobile libraries'.
const ENDPOINT_NAMES: [&str; 15] = [
    "track", "identify", "page", "screen", "group", "alias", "batch", "t", "i", "p", "s", "g", "a",
    "b", "import",
];

fn routes(cfg: &mut web::ServiceConfig) {
    // Fixed paths per endpoint, with and without a trailing slash: matched by comparing text,
    // not by a pattern, on every request.
    for name in ENDPOINT_NAMES {
        let endpoint = Endpoint::from_name(name).expect("every listed endpoint name is known");
        for path in [format!("/v1/{name}"), format!("/v1/{name}/")] {
            cfg.route(
                &path,
                web::post().to(
                    move |req: HttpRequest, payload: web::Payload, ingest: web::Data<Ingest>| {
                        post_message(endpoint, req, payload, ingest)
                    },
                ),
            )
            // Any other method (a preflight from a listed origin is answered before routing).
            .route(&path, web::route().to(method_not_allowed));
        }
    }
    cfg.route("/v1/{endpoint}", web::post().to(unknown_endpoint))
        .route("/v1/{endpoint}/", web::post().to(unknown_endpoint))
        .route(
            "/v1/projects/{write_key}/settings",
            web::get().to(settings::settings),
        )
        .route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .default_service(web::to(|| async {
            HttpResponse::NotFound().json(error_body("not_found", "no such path"))
        }));
}

/// What the configuration leaves to chance, said once at start.
fn warn_about(
    config: &dedupe::config::IngestConfig,
    cors_policy: &CorsPolicy,
    limiter: Option<Rate>,
) {
    if cors_policy.allows_any() {
        events::ConfigCaveat::AnyOrigin.emit();
    }
    if config.public_url.is_none() {
        events::ConfigCaveat::NoPublicUrl.emit();
    }
    if let Some(rate) = limiter {
        info!(events_per_sec = rate.events_per_sec.get(), burst = rate.burst.get(), "Each source is rate limited; a request of more events than the burst is refused (429, over_burst).");
    }
}

/// Checks the Kafka settings against the brokers: settings that can never connect end the
/// process; unreachable brokers do not (the API answers 503 until they are back). False when
/// `stop` resolved first.
async fn check_brokers(
    config: &Config,
    stop: &mut (impl std::future::Future<Output = ()> + Unpin),
) -> Result<bool, IngestError> {
    let kafka = config.kafka.clone();
    let checked = tokio::task::spawn_blocking(move || {
        dedupe::kafka::check_security(&kafka, Duration::from_secs(15))
    });
    let checked = tokio::select! {
        checked = checked => checked,
        () = stop => return Ok(false),
    };
    match checked {
        Ok(result) => result.map_err(|failure| IngestError::Security {
            brokers: config.kafka.brokers.clone(),
            failure,
        })?,
        Err(e) => return Err(IngestError::ConnectionCheck(e.to_string())),
    }
    Ok(true)
}

/// Runs the tracking API until `stop` resolves (the binary's SIGTERM or SIGINT), then lets requests
/// in flight finish and flushes the producer. A `stop` that resolves while it starts (the
/// connection check waits up to 15 s for brokers that do not answer) ends it there, before it
/// listens: nothing was accepted, so nothing is left to deliver.
pub async fn serve(
    config: Config,
    stop: impl std::future::Future<Output = ()> + 'static,
) -> Result<(), IngestError> {
    let mut stop = Box::pin(stop);
    let ingest_config = &config.ingest;
    let keys = WriteKeys::load(
        ingest_config.write_keys_file.as_deref(),
        std::env::var(ENV_WRITE_KEYS).ok().as_deref(),
    )?;
    let cors_policy = CorsPolicy::new(&ingest_config.cors_origins);
    let rate = rate_limit_of(ingest_config);
    warn_about(ingest_config, &cors_policy, rate);
    let limiter = rate.map(|rate| RateLimiter::new(rate, keys.sources(), Instant::now()));
    let topic = ingest_config.topic.clone();
    let dead_letter_topic = ingest_config.dead_letter_topic();
    if !check_brokers(&config, &mut stop).await? {
        info!("The tracking API stopped before it listened.");
        return Ok(());
    }
    let producer = producer(&config).map_err(|source| IngestError::CreateProducer {
        topic: topic.clone(),
        source,
    })?;
    let readiness = Readiness::start(
        producer.clone(),
        config.kafka.clone(),
        topic.clone(),
        dead_letter_topic.clone(),
    );
    info!(sources = ?keys, "Loaded the write keys.");
    let delivery = Delivery::new(
        &producer,
        &topic,
        &dead_letter_topic,
        Duration::from_millis(ingest_config.ack_timeout_ms),
    )
    .map_err(|source| IngestError::CreateProducer {
        topic: topic.clone(),
        source,
    })?;
    let ingest = web::Data::new(Ingest::new(
        ingest_config,
        delivery,
        keys,
        Arc::clone(&readiness),
        limiter,
    ));
    let cors_policy = web::Data::new(cors_policy);
    let addr = ingest_config.listen;
    let limits = Limits::from_ingest(ingest_config)?;
    let server = serve_http(addr, limits, move || {
        App::new()
            .app_data(ingest.clone())
            .app_data(cors_policy.clone())
            .wrap(from_fn(cors::cors))
            .configure(routes)
    })
    .map_err(|source| IngestError::Bind { addr, source })?;
    info!(addr = %addr, topic = %topic, max_connections = limits.max_connections, "The tracking API is listening.");
    let handle = server.handle();
    actix_web::rt::spawn(async move {
        stop.await;
        handle.stop(true).await;
    });
    let result = server.await.map_err(IngestError::Serve);
    readiness.stop();
    if let Err(e) = producer.flush(FLUSH_TIMEOUT) {
        events::ProducerNotFlushed { error: &e }.emit();
    }
    info!("The tracking API stopped.");
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_needs_events_per_second_and_takes_a_second_of_them_as_its_default_burst() {
        let mut config = dedupe::config::IngestConfig::default();
        assert_eq!(rate_limit_of(&config), None);
        config.rate_limit_events_per_sec = 20;
        assert_eq!(rate_limit_of(&config).map(|r| r.burst.get()), Some(20));
        config.rate_limit_burst_events = 500;
        assert_eq!(rate_limit_of(&config).map(|r| r.burst.get()), Some(500));
    }
}

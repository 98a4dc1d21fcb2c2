//! The front door's instrumentation: each request's end, the settings route's answers, the
//! admission gauges and the CORS refusals, each an event whose `emit` logs and counts together.
//! Every `metrics` call of the front door is here; the names and labels are declared once, in
//! `dedupe::metrics`. Refusals are logged at most once per reason per interval (with the count of
//! those not logged), and counted in full, so a flood of bad requests cannot fill a disk. Never a
//! payload or a key in a line.

use std::time::{Duration, Instant};

use crate::{EventType, IdOrigin};
use dedupe::log_limit::{LogLimiter, LogVerdict};
use dedupe::metrics::{
    ERRORS, INGEST_ASSIGNED_IDS, INGEST_BODY_READS, INGEST_EVENTS, INGEST_IN_FLIGHT,
    INGEST_LOG_SUPPRESSED, INGEST_READY, INGEST_REJECTED, INGEST_REQUESTS, INGEST_REQUEST_SECONDS,
    KEY_KEYED, KEY_KEYLESS, KIND_KAFKA, KIND_THREAD, LABEL_ENDPOINT, LABEL_KEY, LABEL_KIND,
    LABEL_ORIGIN, LABEL_REASON, LABEL_STATUS, LABEL_TYPE,
};
use tracing::{debug, info, warn};

use super::outcome::Outcome;

/// A status code as a metric label.
pub fn status_label(status: u16) -> &'static str {
    match status {
        200 => "200",
        400 => "400",
        401 => "401",
        404 => "404",
        405 => "405",
        408 => "408",
        415 => "415",
        429 => "429",
        503 => "503",
        _ => "other",
    }
}

/// A finished request, logged and counted once, here. Never carries a payload or a key.
pub struct RequestFinished<'a> {
    pub endpoint: &'static str,
    pub outcome: &'a Outcome,
    pub source: Option<&'a str>,
    pub elapsed: Duration,
}

impl RequestFinished<'_> {
    pub fn emit(&self, logs: &LogLimiter) {
        let status = self.outcome.status().as_u16();
        // Static labels: no allocation per request.
        metrics::counter!(INGEST_REQUESTS, LABEL_ENDPOINT => self.endpoint, LABEL_STATUS => status_label(status)).increment(1);
        metrics::histogram!(INGEST_REQUEST_SECONDS, LABEL_ENDPOINT => self.endpoint)
            .record(self.elapsed.as_secs_f64());
        let source = self.source.unwrap_or("-");
        if let Outcome::Accepted {
            types,
            assigned,
            refused,
        } = self.outcome
        {
            for (origin, n) in IdOrigin::ASSIGNED
                .into_iter()
                .zip(*assigned)
                .filter(|(_, n)| *n > 0)
            {
                metrics::counter!(INGEST_ASSIGNED_IDS, LABEL_ORIGIN => origin.as_str())
                    .increment(n);
            }
            // One counter update per type and per reason, not per event.
            let mut counts = [0u64; EventType::ALL.len()];
            for t in types {
                counts[EventType::ALL.iter().position(|a| a == t).unwrap_or(0)] += 1;
            }
            for (t, n) in EventType::ALL.iter().zip(counts).filter(|(_, n)| *n > 0) {
                metrics::counter!(INGEST_EVENTS, LABEL_TYPE => t.as_str()).increment(n);
            }
            for r in refused {
                metrics::counter!(INGEST_REJECTED, LABEL_REASON => r.code).increment(1);
            }
            match refused.first() {
                None => debug!(
                    event = "RequestFinished",
                    endpoint = self.endpoint,
                    source,
                    events = types.len(),
                    "Every message of the request is in Kafka."
                ),
                Some(first) => {
                    if let Some(suppressed) = log_now(logs, "dead_lettered") {
                        info!(
                            event = "RequestFinished",
                            endpoint = self.endpoint, source, valid = types.len(), refused = refused.len(),
                            first = first.code, suppressed,
                            "Logged a request's valid events to the input topic and its invalid ones to the dead-letter topic."
                        );
                    }
                }
            }
            return;
        }
        let reason = self.outcome.reason();
        metrics::counter!(INGEST_REJECTED, LABEL_REASON => reason).increment(1);
        let Some(suppressed) = log_now(logs, reason) else {
            return;
        };
        match self.outcome {
            Outcome::Overloaded { .. } => warn!(
                event = "RequestFinished",
                endpoint = self.endpoint, suppressed,
                "Answered 503: too many requests in flight (ingest.max_in_flight_requests)."
            ),
            Outcome::TooManyKeylessReads { .. } => warn!(
                event = "RequestFinished",
                endpoint = self.endpoint, suppressed,
                "Answered 503: too many bodies without a known write key are arriving (ingest.max_keyless_body_reads)."
            ),
            Outcome::Unavailable(e) => warn!(
                event = "RequestFinished",
                endpoint = self.endpoint, source, error = %e, suppressed,
                "Answered 503: the request's messages are not confirmed in Kafka."
            ),
            _ => info!(event = "RequestFinished", endpoint = self.endpoint, source, status, reason, suppressed, "Refused a request."),
        }
    }
}

/// A settings request answered (`GET /v1/projects/<writeKey>/settings`), counted once, here; a
/// refusal is also counted by its reason and logged. Never carries a key.
pub struct SettingsAnswered {
    pub status: u16,
    /// Why it was refused, if it was.
    pub refused: Option<&'static str>,
}

impl SettingsAnswered {
    /// The metric label of the settings route.
    pub const ENDPOINT: &'static str = "settings";

    pub fn emit(&self) {
        metrics::counter!(INGEST_REQUESTS, LABEL_ENDPOINT => Self::ENDPOINT, LABEL_STATUS => status_label(self.status)).increment(1);
        if let Some(reason) = self.refused {
            metrics::counter!(INGEST_REJECTED, LABEL_REASON => reason).increment(1);
            info!(
                event = "SettingsAnswered",
                endpoint = Self::ENDPOINT,
                status = self.status,
                reason,
                "Refused a request."
            );
        }
    }
}

/// Whether a line about `reason` may be written now; if so, how many were not since the last.
/// Those not written are counted.
fn log_now(logs: &LogLimiter, reason: &'static str) -> Option<u64> {
    match logs.check(reason, Instant::now()) {
        LogVerdict::Log { suppressed } => Some(suppressed),
        LogVerdict::Suppress => {
            metrics::counter!(INGEST_LOG_SUPPRESSED, LABEL_REASON => reason).increment(1);
            None
        }
    }
}

/// The gauge of requests in flight (their bodies arrived), moved by one as they come and go.
pub fn in_flight_gauge() -> metrics::Gauge {
    metrics::gauge!(INGEST_IN_FLIGHT)
}

/// Bodies arriving now: those with a known key move the gauge by one; the keyless count is set
/// whole, under its lock.
pub enum BodyReadsChanged {
    KeyedStarted,
    KeyedEnded,
    Keyless(usize),
}

impl BodyReadsChanged {
    pub fn emit(&self) {
        match *self {
            BodyReadsChanged::KeyedStarted => {
                metrics::gauge!(INGEST_BODY_READS, LABEL_KEY => KEY_KEYED).increment(1.0)
            }
            BodyReadsChanged::KeyedEnded => {
                metrics::gauge!(INGEST_BODY_READS, LABEL_KEY => KEY_KEYED).decrement(1.0)
            }
            BodyReadsChanged::Keyless(total) => {
                metrics::gauge!(INGEST_BODY_READS, LABEL_KEY => KEY_KEYLESS).set(total as f64)
            }
        }
    }
}

/// A CORS preflight from an origin that is not allowed, refused with 403.
pub struct CorsPreflightRefused {
    pub reason: &'static str,
}

impl CorsPreflightRefused {
    pub fn emit(&self) {
        metrics::counter!(INGEST_REJECTED, LABEL_REASON => self.reason).increment(1);
        info!(
            event = "CorsPreflightRefused",
            reason = self.reason,
            "Refused a CORS preflight from an origin that is not allowed."
        );
    }
}

/// What the readiness probe found, when it differs from the probe before.
pub enum ReadinessFound<'a> {
    Ready,
    /// The input topic does not exist.
    NoTopic,
    /// The dead-letter topic does not exist, and creating it failed with this.
    NoDeadLetterTopic(&'a str),
    NoAnswer(&'a str),
}

/// The readiness probe's finding changed: logged once per change, and exported as
/// `dedupe_ingest_ready`.
pub struct ReadinessChanged<'a> {
    pub topic: &'a str,
    pub dead_letter_topic: &'a str,
    pub found: ReadinessFound<'a>,
}

impl ReadinessChanged<'_> {
    pub fn emit(&self) {
        let ready = matches!(self.found, ReadinessFound::Ready);
        metrics::gauge!(INGEST_READY).set(if ready { 1.0 } else { 0.0 });
        let (topic, dead_letter_topic) = (self.topic, self.dead_letter_topic);
        match self.found {
            ReadinessFound::Ready => {
                info!(event = "ReadinessChanged", topic = %topic, dead_letter_topic = %dead_letter_topic, "The input and dead-letter topics are in the brokers' metadata: ready.")
            }
            ReadinessFound::NoTopic => warn!(
                event = "ReadinessChanged",
                topic = %topic,
                "The input topic does not exist on the brokers (this service does not create it): /readyz answers 503, and so does every request, after ingest.ack_timeout_ms, until it does."
            ),
            ReadinessFound::NoDeadLetterTopic(error) => warn!(
                event = "ReadinessChanged",
                dead_letter_topic = %dead_letter_topic, error = %error,
                "The dead-letter topic does not exist and could not be created (create it, or grant this service Create on it): /readyz answers 503 until it exists."
            ),
            ReadinessFound::NoAnswer(error) => warn!(
                event = "ReadinessChanged",
                topic = %topic, error = %error,
                "The brokers did not answer a metadata request for the input topic: /readyz answers 503 until they do."
            ),
        }
    }
}

/// The readiness probe's thread could not be started: the API never says it is ready.
pub struct ReadinessProbeNotStarted<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl ReadinessProbeNotStarted<'_> {
    pub fn emit(&self) {
        metrics::gauge!(INGEST_READY).set(0.0);
        metrics::counter!(ERRORS, LABEL_KIND => KIND_THREAD).increment(1);
        warn!(event = "ReadinessProbeNotStarted", error = %self.error, "Cannot start the readiness probe; /readyz will say not ready.");
    }
}

/// What the configuration leaves to chance, said once at start. Logged only: a setting does not
/// change while the process runs, so a count would say nothing the log line does not.
pub enum ConfigCaveat {
    /// `ingest.cors_origins` is `"*"`.
    AnyOrigin,
    /// `ingest.public_url` is not set.
    NoPublicUrl,
}

impl ConfigCaveat {
    pub fn emit(&self) {
        match self {
            Self::AnyOrigin => warn!(event = "ConfigCaveat", "ingest.cors_origins allows every origin (\"*\"): any page on the web can post with a write key it has seen and read the answers; list your sites' origins instead."),
            Self::NoPublicUrl => warn!(event = "ConfigCaveat", "ingest.public_url is not set: the settings document points browsers at the listen address over http (or, listening on every address, is refused), which pages served over HTTPS refuse to call (mixed content); set it to the https:// address browsers reach this API at."),
        }
    }
}

/// The producer did not flush before shutdown: requests it had not acknowledged were answered
/// with an error, and their clients send them again.
pub struct ProducerNotFlushed<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl ProducerNotFlushed<'_> {
    pub fn emit(&self) {
        metrics::counter!(ERRORS, LABEL_KIND => KIND_KAFKA).increment(1);
        warn!(event = "ProducerNotFlushed", error = %self.error, "The producer did not flush before shutdown.");
    }
}

//! How a tracking API request ended: its status and its answer's body. It is counted and logged
//! once, by [`events::RequestFinished`](super::events::RequestFinished).

use std::time::Duration;

use crate::rate_limit;
use crate::{AuthError, EventType, Refused, Rejection, MAX_ANSWER_REFUSALS};
use actix_web::http::header::RETRY_AFTER;
use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use serde_json::{json, Value};

use super::delivery::DeliveryError;

/// The rate limit's wait, in whole seconds, as Segment's browser library read it before it
/// honoured `Retry-After`; both are sent.
pub const X_RATELIMIT_RESET: &str = "x-ratelimit-reset";

/// One refused event as the answer names it: its place in the batch (none for a single-event
/// route), its reason code and the sentence saying what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedEvent {
    pub index: Option<usize>,
    pub code: &'static str,
    pub message: String,
}

impl From<&Refused> for RefusedEvent {
    fn from(r: &Refused) -> Self {
        Self {
            index: r.at.0,
            code: r.problem.reason(),
            message: r.sentence(),
        }
    }
}

/// How a request ended.
pub enum Outcome {
    /// Every event is in Kafka: the valid ones (these types) in the input topic, the refused
    /// ones in the dead-letter topic.
    /// `assigned`: how many of the events got an id of each of `IdOrigin::ASSIGNED`.
    Accepted {
        types: Vec<EventType>,
        assigned: [u64; 2],
        refused: Vec<RefusedEvent>,
    },
    /// The body cannot be read, or an event is invalid under `refuse-request`: nothing was
    /// produced.
    Rejected(Rejection),
    /// The body could not be read (the client went away).
    Unreadable(String),
    /// The body did not arrive within its deadline.
    TooSlow(Duration),
    /// No usable write key: nothing was produced.
    Unauthorized(AuthError),
    /// The source is over its rate: nothing was produced; retry after this long.
    RateLimited(Duration),
    /// The request carries more events than the source's bucket holds: it can never pass as it
    /// is; a smaller one may after this long.
    OverBurst { burst: u32, wait: Duration },
    /// Too many requests being decoded and produced: this one was not.
    Overloaded { limit: usize },
    /// Too many bodies without a known key are arriving: this one's was not read.
    TooManyKeylessReads { limit: usize },
    /// Not every event is known to be in Kafka.
    Unavailable(DeliveryError),
}

impl Outcome {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Accepted { .. } => StatusCode::OK,
            Self::Rejected(Rejection::UnsupportedContentType) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Rejected(_) | Self::Unreadable(_) => StatusCode::BAD_REQUEST,
            Self::RateLimited(_) | Self::OverBurst { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Overloaded { .. } | Self::TooManyKeylessReads { .. } | Self::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::TooSlow(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            Self::Accepted { .. } => "accepted",
            Self::Rejected(r) => r.reason(),
            Self::Unreadable(_) => "unreadable_body",
            Self::TooSlow(_) => "request_timeout",
            Self::Unauthorized(a) => a.reason(),
            Self::RateLimited(_) => "rate_limited",
            Self::OverBurst { .. } => "over_burst",
            Self::Overloaded { .. } => "too_many_requests_in_flight",
            Self::TooManyKeylessReads { .. } => "too_many_keyless_reads",
            Self::Unavailable(d) => d.reason(),
        }
    }

    pub fn response(&self) -> HttpResponse {
        let body = match self {
            Self::Accepted { refused, .. } if refused.is_empty() => json!({ "success": true }),
            Self::Accepted { refused, .. } => {
                // The first few are named; all are counted (and every one is in the dead-letter
                // topic), so a batch of thousands of bad events cannot make a large answer.
                let listed: Vec<Value> = refused
                    .iter()
                    .take(MAX_ANSWER_REFUSALS)
                    .map(|r| match r.index {
                        Some(i) => json!({ "index": i, "code": r.code, "message": r.message }),
                        None => json!({ "code": r.code, "message": r.message }),
                    })
                    .collect();
                json!({ "success": true, "rejected": listed, "rejected_count": refused.len() })
            }
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
            Self::OverBurst { burst, .. } => error_body(
                self.reason(),
                &format!("this request has more events than this source may send at once ({burst}); send smaller batches"),
            ),
            Self::Overloaded { limit } => error_body(
                self.reason(),
                &format!("the server is handling {limit} requests already; retry the same request"),
            ),
            Self::TooManyKeylessReads { limit } => error_body(
                self.reason(),
                &format!("{limit} requests without a write key in their Authorization header are arriving already; retry the same request"),
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
            Self::TooSlow(_)
                | Self::Unreadable(_)
                | Self::Overloaded { .. }
                | Self::TooManyKeylessReads { .. }
                | Self::Rejected(Rejection::UnsupportedContentType)
        ) {
            // The rest of a body that did not arrive, or was never read, must not be read as the
            // next request.
            response.force_close();
        }
        if let Self::RateLimited(wait) | Self::OverBurst { wait, .. } = self {
            // Both say how many seconds to wait: Retry-After for today's libraries,
            // x-ratelimit-reset for the browser library's older releases.
            let secs = rate_limit::retry_after_secs(*wait).to_string();
            response
                .insert_header((RETRY_AFTER, secs.clone()))
                .insert_header((X_RATELIMIT_RESET, secs));
        }
        response.json(body)
    }
}

/// The JSON body of a refusal: its code and the sentence naming the cause.
pub fn error_body(code: &str, message: &str) -> Value {
    json!({ "success": false, "code": code, "message": message })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::events::status_label;
    use crate::{Location, Problem};
    use rdkafka::error::KafkaError;

    #[test]
    fn only_a_fully_acknowledged_request_is_200() {
        // Bad input is 400, a missing or unknown key 401, anything short of every ack 503.
        let accepted = || Outcome::Accepted {
            types: vec![EventType::Track],
            assigned: [0, 0],
            refused: Vec::new(),
        };
        let cases = [
            (accepted(), 200, "accepted"),
            (Outcome::Rejected(Rejection::EmptyBatch), 400, "empty_batch"),
            (
                Outcome::Rejected(Rejection::RequestTooLarge { limit: 1 }),
                400,
                "request_too_large",
            ),
            (
                Outcome::Rejected(Rejection::Invalid {
                    at: Location(Some(2)),
                    problem: Problem::MissingEvent,
                }),
                400,
                "missing_event",
            ),
            (
                Outcome::Unreadable("connection reset".into()),
                400,
                "unreadable_body",
            ),
            (
                Outcome::TooSlow(Duration::from_secs(5)),
                408,
                "request_timeout",
            ),
            (
                Outcome::Unauthorized(AuthError::Missing),
                401,
                "missing_write_key",
            ),
            (
                Outcome::Unauthorized(AuthError::Unknown),
                401,
                "unknown_write_key",
            ),
            (
                Outcome::Rejected(Rejection::UnsupportedContentType),
                415,
                "unsupported_content_type",
            ),
            (
                Outcome::RateLimited(Duration::from_millis(1500)),
                429,
                "rate_limited",
            ),
            (
                Outcome::OverBurst {
                    burst: 20,
                    wait: Duration::from_secs(1),
                },
                429,
                "over_burst",
            ),
            (
                Outcome::Overloaded { limit: 128 },
                503,
                "too_many_requests_in_flight",
            ),
            (
                Outcome::TooManyKeylessReads { limit: 64 },
                503,
                "too_many_keyless_reads",
            ),
            (
                Outcome::Unavailable(DeliveryError::Timeout(Duration::from_secs(1))),
                503,
                "kafka_timeout",
            ),
            (
                Outcome::Unavailable(DeliveryError::Dropped),
                503,
                "kafka_dropped",
            ),
            (
                Outcome::Unavailable(DeliveryError::Delivery(KafkaError::Canceled)),
                503,
                "kafka_delivery",
            ),
        ];
        for (outcome, status, reason) in cases {
            assert_eq!(
                (outcome.status().as_u16(), outcome.reason()),
                (status, reason)
            );
            assert_eq!(status_label(status), status.to_string());
            assert_eq!(outcome.response().status().as_u16(), status);
        }
    }

    async fn body_of(outcome: &Outcome) -> (Value, bool) {
        let response = outcome.response();
        let closes = !response.head().keep_alive();
        let bytes = actix_web::body::to_bytes(response.into_body())
            .await
            .unwrap();
        (serde_json::from_slice(&bytes).unwrap(), closes)
    }

    #[actix_rt::test]
    async fn refusals_answer_a_body_with_their_code_and_a_message_naming_the_problem() {
        let cases = [
            (
                Outcome::Rejected(Rejection::EmptyBatch),
                "empty_batch",
                "`batch` is empty",
            ),
            (
                Outcome::Rejected(Rejection::TooManyEvents { count: 6000 }),
                "too_many_events",
                "the limit is 5000",
            ),
            (
                Outcome::TooSlow(Duration::from_millis(1500)),
                "request_timeout",
                "within 1500 ms",
            ),
            (
                Outcome::Unauthorized(AuthError::Unknown),
                "unknown_write_key",
                "not known",
            ),
            (
                Outcome::Unavailable(DeliveryError::Dropped),
                "kafka_dropped",
                "retry the same request",
            ),
            (
                Outcome::OverBurst {
                    burst: 20,
                    wait: Duration::from_secs(1),
                },
                "over_burst",
                "at once (20)",
            ),
        ];
        for (outcome, code, names) in cases {
            let (body, closes) = body_of(&outcome).await;
            assert_eq!(body["success"], false, "{body}");
            assert_eq!(body["code"], code, "{body}");
            assert!(body["message"].as_str().unwrap().contains(names), "{body}");
            // A body that did not arrive in time closes the connection; other refusals keep it.
            assert_eq!(closes, code == "request_timeout", "{code}");
        }
    }

    #[actix_rt::test]
    async fn an_accepted_request_names_each_refused_event() {
        // Nothing refused: the answer Segment's libraries expect. Some refused: each named, so a
        // client that looks can tell which, and one that does not still sees success.
        let (body, _) = body_of(&Outcome::Accepted {
            types: vec![EventType::Track],
            assigned: [0, 0],
            refused: Vec::new(),
        })
        .await;
        assert_eq!(body, json!({ "success": true }));
        let refused = vec![
            RefusedEvent {
                index: Some(3),
                code: "missing_event",
                message: "batch[3]: a track message needs an `event` name".into(),
            },
            RefusedEvent {
                index: None,
                code: "bad_message_id",
                message: "the message: ...".into(),
            },
        ];
        let (body, _) = body_of(&Outcome::Accepted {
            types: vec![EventType::Track],
            assigned: [0, 0],
            refused,
        })
        .await;
        assert_eq!(
            body,
            json!({ "success": true, "rejected": [
                { "index": 3, "code": "missing_event", "message": "batch[3]: a track message needs an `event` name" },
                { "code": "bad_message_id", "message": "the message: ..." },
            ], "rejected_count": 2})
        );
        // Thousands refused: the first hundred named, all counted, the answer within its bound.
        let many: Vec<RefusedEvent> = (0..5000)
            .map(|i| RefusedEvent {
                index: Some(i),
                code: "bad_message_id",
                message: "x".repeat(crate::MAX_REFUSAL_SENTENCE_BYTES),
            })
            .collect();
        let response = Outcome::Accepted {
            types: Vec::new(),
            assigned: [0, 0],
            refused: many,
        }
        .response();
        let bytes = actix_web::body::to_bytes(response.into_body())
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        let bytes = bytes.len();
        assert_eq!(
            (
                body["rejected"].as_array().map(Vec::len),
                body["rejected_count"].as_u64()
            ),
            (Some(MAX_ANSWER_REFUSALS), Some(5000))
        );
        assert!(bytes <= crate::MAX_ANSWER_BYTES, "{bytes}");
    }

    #[test]
    fn a_rate_limited_answer_says_how_long_to_wait_in_both_headers() {
        for outcome in [
            Outcome::RateLimited(Duration::from_millis(1500)),
            Outcome::OverBurst {
                burst: 5,
                wait: Duration::from_millis(1500),
            },
        ] {
            let response = outcome.response();
            assert_eq!(response.headers().get(RETRY_AFTER).unwrap(), "2");
            assert_eq!(response.headers().get(X_RATELIMIT_RESET).unwrap(), "2");
        }
        // A request turned away undecoded closes its connection, so its body is never parsed
        // as a request.
        assert!(!Outcome::Overloaded { limit: 1 }
            .response()
            .head()
            .keep_alive());
        assert!(!Outcome::TooManyKeylessReads { limit: 1 }
            .response()
            .head()
            .keep_alive());
    }
}

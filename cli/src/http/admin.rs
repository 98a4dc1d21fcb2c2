//! The worker's admin endpoints and who may call them: `POST /admin/snapshot` (take a ledger
//! snapshot now) and `GET /admin/ids/{id}` (explain one id) here, `POST /admin/forget` and
//! `DELETE /admin/ids/{id}` in [`super::forget_route`]. They are served in one scope
//! (`super::telemetry::admin_scope`) behind one guard, [`guard`]: every request under `/admin`,
//! to a route or not, passes it (see `authorize`) before any handler sees it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{AUTHORIZATION, HOST, ORIGIN, RETRY_AFTER};
use actix_web::middleware::Next;
use actix_web::{web, HttpRequest, HttpResponse};
use dedupe::config::{Secret, SecretMatcher, ENV_ADMIN_TOKEN};
use dedupe::identity::{named_id, NamedId};
use dedupe::snapshot::{SnapshotError, Trigger};
use dedupe_tracking::rate_limit::retry_after_secs;
use serde_json::json;

use dedupe_actors::coordinator::{Coordinator, OwnedPartitions, TakeSnapshot};
use dedupe_actors::events::AdminRefused;

/// What the admin endpoints reach: the coordinator, and for `GET /admin/ids/{id}` the ledger and
/// how ids map to input partitions.
pub struct AdminTargets {
    pub coordinator: actix::Addr<Coordinator>,
    pub ledger: Arc<dedupe::ledger::Ledger>,
    pub id_source: dedupe::config::IdSource,
    pub partitioner: dedupe::config::InputPartitioner,
    /// The input topic's partitions, as read at start.
    pub input_partitions: i32,
    /// Where an explained id's refused record is looked for (`worker.dead_letter_topic`).
    pub kafka: dedupe::kafka::KafkaConfig,
    pub dead_letter_topic: Option<String>,
}

impl AdminTargets {
    /// The targets of a worker running `config`, whose input topic has `input_partitions`.
    pub fn new(
        coordinator: actix::Addr<Coordinator>,
        ledger: Arc<dedupe::ledger::Ledger>,
        config: &dedupe::config::Config,
        input_partitions: i32,
    ) -> Self {
        AdminTargets {
            coordinator,
            ledger,
            id_source: config.worker.id_source.clone(),
            partitioner: config.worker.input_partitioner,
            input_partitions,
            kafka: config.kafka.clone(),
            dead_letter_topic: config.worker.dead_letter_topic.clone(),
        }
    }
}

/// The Fetch Metadata header a browser adds to say which site a request is sent for.
const SEC_FETCH_SITE: &str = "sec-fetch-site";

/// What the admin endpoints share.
pub(crate) struct Admin {
    token: Option<SecretMatcher>,
    pub(crate) targets: AdminTargets,
    /// Refusals' log lines, at most one per interval.
    logs: dedupe::log_limit::LogLimiter,
}

impl Admin {
    /// The admin endpoints of a worker whose token (if any) is `token`.
    pub(crate) fn new(token: Option<Secret>, targets: AdminTargets) -> Self {
        Admin {
            token: token.map(SecretMatcher::new),
            targets,
            logs: Default::default(),
        }
    }
}

/// What an admin request carries that [`authorize`] reads: plain data, so the decision is tested
/// without a server. A header that is present but not readable text is `Some("")`, which no rule
/// accepts, never `None`.
#[derive(Debug, Clone, Copy)]
struct AdminRequest<'a> {
    authorization: Option<&'a str>,
    origin: Option<&'a str>,
    sec_fetch_site: Option<&'a str>,
    host: Option<&'a str>,
    /// The address the listener is bound to.
    listener: SocketAddr,
    peer: Option<IpAddr>,
}

/// Why an admin request is refused before it does anything.
#[derive(Debug, PartialEq, Eq)]
enum AdminRefusal {
    /// A token is set and the request's is missing or wrong.
    BadToken,
    /// No token is set and the client is not on loopback.
    NotLoopback,
    /// No token is set and the request has an `Origin` header: a web page sent it.
    WebPage,
    /// No token is set and a browser sent the request for another site (`Sec-Fetch-Site`).
    CrossSite,
    /// No token is set and the `Host` header is missing or names another host: a DNS name an
    /// attacker's page rebound to loopback, say.
    ForeignHost,
}

impl AdminRefusal {
    /// Why, for the log line.
    fn why(&self) -> &'static str {
        match self {
            Self::BadToken => "missing or wrong bearer token",
            Self::NotLoopback => "a client outside loopback, and no admin token is set",
            Self::WebPage => "it has an Origin header (a web page sent it), and no admin token is set",
            Self::CrossSite => "a browser sent it for another site (Sec-Fetch-Site), and no admin token is set",
            Self::ForeignHost => "its Host header is missing or does not name this listener, and no admin token is set",
        }
    }

    /// The answer: 401 for a bad token, 403 otherwise, with a JSON error saying what is needed.
    fn response(&self, listener: SocketAddr) -> HttpResponse {
        let error = match self {
            Self::BadToken => {
                return HttpResponse::Unauthorized().json(json!({ "error": format!("send Authorization: Bearer <{ENV_ADMIN_TOKEN}>") }))
            }
            Self::NotLoopback => format!("admin endpoints answer loopback clients only unless {ENV_ADMIN_TOKEN} is set"),
            Self::WebPage => format!("admin requests from a web page (with an Origin header) are refused unless {ENV_ADMIN_TOKEN} is set"),
            Self::CrossSite => format!(
                "admin requests a browser sends for another site (Sec-Fetch-Site other than none or same-origin) are refused unless {ENV_ADMIN_TOKEN} is set"
            ),
            Self::ForeignHost => format!(
                "admin requests must name this listener in their Host header ({listener} or localhost:{}) unless {ENV_ADMIN_TOKEN} is set",
                listener.port()
            ),
        };
        HttpResponse::Forbidden().json(json!({ "error": error }))
    }
}

/// Authorizes an admin request. With a token set: `Authorization: Bearer <token>` (the scheme in
/// any case), checked in constant time, and nothing else. Without one, only what a browser page
/// cannot send: a loopback peer, no `Origin` header, `Sec-Fetch-Site` absent, `none` or
/// `same-origin`, and a `Host` that names the listener (its address, or `localhost`), so neither a
/// cross-site form nor a DNS name rebound to loopback reaches the endpoint.
fn authorize(token: Option<&SecretMatcher>, req: &AdminRequest<'_>) -> Result<(), AdminRefusal> {
    if let Some(token) = token {
        let given = req.authorization.and_then(bearer_token).unwrap_or("");
        return if token.matches(given.as_bytes()) {
            Ok(())
        } else {
            Err(AdminRefusal::BadToken)
        };
    }
    if !req.peer.is_some_and(|ip| ip.is_loopback()) {
        return Err(AdminRefusal::NotLoopback);
    }
    if req.origin.is_some() {
        return Err(AdminRefusal::WebPage);
    }
    let own_site =
        |site: &str| site.eq_ignore_ascii_case("none") || site.eq_ignore_ascii_case("same-origin");
    if req.sec_fetch_site.is_some_and(|site| !own_site(site)) {
        return Err(AdminRefusal::CrossSite);
    }
    if !req
        .host
        .is_some_and(|host| names_listener(host, req.listener))
    {
        return Err(AdminRefusal::ForeignHost);
    }
    Ok(())
}

/// The token of an `Authorization: Bearer <token>` header; the scheme is matched in any case, as
/// HTTP's authentication schemes are (RFC 9110, 11.1).
fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether a `Host` header names the listener at `listener`: `localhost` or the listener's IP
/// (any loopback IP when it listens on every address), with the listener's port or none.
fn names_listener(host: &str, listener: SocketAddr) -> bool {
    let (name, port) = match host.strip_prefix('[') {
        // `[v6]` or `[v6]:port`.
        Some(rest) => match rest.split_once(']') {
            Some((ip, "")) => (ip, None),
            Some((ip, port)) => match port.strip_prefix(':') {
                Some(port) => (ip, Some(port)),
                None => return false,
            },
            None => return false,
        },
        None => match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        },
    };
    let port_ok = port.is_none_or(|p| {
        p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>() == Ok(listener.port())
    });
    let ip = if host.starts_with('[') {
        name.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6)
    } else {
        name.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
    };
    let name_ok = match ip {
        Some(ip) => ip == listener.ip() || (listener.ip().is_unspecified() && ip.is_loopback()),
        None => name.eq_ignore_ascii_case("localhost"),
    };
    port_ok && name_ok
}

/// A header's value for [`AdminRequest`]: present but unreadable reads as `""`.
fn header(req: &HttpRequest, name: impl actix_web::http::header::AsHeaderName) -> Option<&str> {
    req.headers().get(name).map(|v| v.to_str().unwrap_or(""))
}

/// The admin scope's one guard: a request [`authorize`] refuses is answered here (logged,
/// counted), and no handler runs.
pub(crate) async fn guard(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let refused = match req.app_data::<web::Data<Admin>>() {
        Some(admin) => refusal(req.request(), admin),
        // An app without the admin state: nothing to authorize against.
        None => Some(HttpResponse::ServiceUnavailable().json(json!({ "error": "no admin state" }))),
    };
    match refused {
        Some(response) => Ok(req.into_response(response).map_into_right_body()),
        None => next
            .call(req)
            .await
            .map(ServiceResponse::map_into_left_body),
    }
}

/// Lets an admin request through (`None`), or answers its refusal (logged, counted).
fn refusal(req: &HttpRequest, admin: &Admin) -> Option<HttpResponse> {
    let peer = req.peer_addr().map(|a| a.ip());
    let listener = req.app_config().local_addr();
    let request = AdminRequest {
        authorization: header(req, AUTHORIZATION),
        origin: header(req, ORIGIN),
        sec_fetch_site: header(req, SEC_FETCH_SITE),
        host: header(req, HOST),
        listener,
        peer,
    };
    authorize(admin.token.as_ref(), &request)
        .err()
        .map(|refusal| {
            AdminRefused {
                peer,
                why: refusal.why(),
            }
            .emit(&admin.logs);
            refusal.response(listener)
        })
}

/// The prefix of the routes that name one id in their path.
const IDS_PATH: &str = "/admin/ids/";

/// The id of a `/admin/ids/{id}` request, percent-decoded from the path as sent; why not, for a
/// 400, when it is not UTF-8 (ids are text: a lossy decoding would name another id, and the
/// ledger key of the wrong id would be explained or forgotten).
pub(crate) fn path_id(req: &HttpRequest) -> Result<String, String> {
    let raw = req.uri().path().strip_prefix(IDS_PATH).unwrap_or_default();
    String::from_utf8(percent_decode(raw.as_bytes(), false)).map_err(|_| {
        "the id in the path is not UTF-8 once percent-decoded: ids are text; percent-encode the id's UTF-8 bytes".to_string()
    })
}

/// Why not, naming the parameter, when a value of the request's query is not UTF-8 once
/// percent-decoded (`source` names the id's ledger key, so a lossy decoding would name another
/// id).
pub(crate) fn utf8_query(req: &HttpRequest) -> Result<(), String> {
    for pair in req.query_string().split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = String::from_utf8(percent_decode(name.as_bytes(), true));
        let value = String::from_utf8(percent_decode(value.as_bytes(), true));
        return Err(match (name, value) {
            (Ok(_), Ok(_)) => continue,
            (Ok(name), Err(_)) => format!(
                "{}: not UTF-8 once percent-decoded; percent-encode the value's UTF-8 bytes",
                name.chars().take(40).collect::<String>()
            ),
            (Err(_), _) => "a query parameter's name is not UTF-8 once percent-decoded".to_string(),
        });
    }
    Ok(())
}

/// The id of a `/admin/ids/{id}` request, its query checked; why not, for a 400.
pub(crate) fn id_of(req: &HttpRequest) -> Result<String, String> {
    utf8_query(req).and_then(|()| path_id(req))
}

/// Percent-decodes `raw` (in a query, `+` is a space); a `%` not followed by two hex digits is
/// kept as it is, as URL parsers do.
fn percent_decode(raw: &[u8], query: bool) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' => match (
                raw.get(i + 1).and_then(|&b| hex(b)),
                raw.get(i + 2).and_then(|&b| hex(b)),
            ) {
                (Some(hi), Some(lo)) => {
                    out.push((hi * 16 + lo) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if query => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// The query of `GET /admin/ids/{id}`: when the id was first sent, ms since the epoch, the
/// front door's source that sent it (the worker holds `<source>:<id>`), and `json_id=true` when
/// the id is the text of one JSON value (`12345678901234567890`, `"abc"`; see
/// `dedupe::identity::named_id`).
#[derive(serde::Deserialize)]
pub(crate) struct ExplainQuery {
    sent_at_ms: Option<i64>,
    source: Option<String>,
    #[serde(default)]
    json_id: bool,
}

/// `GET /admin/ids/{id}`: whether the ledger holds the id, and why not (see `dedupe::explain`).
pub(crate) async fn admin_explain(
    req: HttpRequest,
    admin: web::Data<Admin>,
    query: web::Query<ExplainQuery>,
) -> HttpResponse {
    let id = match id_of(&req) {
        Ok(id) => id,
        Err(e) => return HttpResponse::BadRequest().json(json!({ "error": e })),
    };
    let query = query.into_inner();
    let t = &admin.targets;
    let named = if query.json_id {
        NamedId::Json(&id)
    } else {
        NamedId::Text(&id)
    };
    // An id named two ways, or none, is refused before anything is asked of the pipeline.
    let key = match named_id(named, query.source.as_deref(), &t.id_source) {
        Ok(named) => named.id,
        Err(e) => return HttpResponse::BadRequest().json(json!({ "error": e.to_string() })),
    };
    let partition = crate::explain_client::partition_of_id(
        &t.id_source,
        t.partitioner,
        key.as_bytes(),
        t.input_partitions,
    );
    let owned = match partition {
        Some(p) => match t.coordinator.send(OwnedPartitions).await {
            Ok(owned) => Some(owned.contains(&p)),
            Err(_) => {
                return HttpResponse::ServiceUnavailable()
                    .json(json!({ "error": "the worker is stopping" }))
            }
        },
        None => None,
    };
    let ledger = t.ledger.clone();
    let id_source = t.id_source.clone();
    let (kafka, dead_letter_topic) = (t.kafka.clone(), t.dead_letter_topic.clone());
    let answer = web::block(move || {
        let q = dedupe::explain::Question {
            id: &id,
            source: query.source.as_deref(),
            json: query.json_id,
            id_source: &id_source,
            partition,
            owned,
            sent_at_ms: query.sent_at_ms,
            now_ms: dedupe::clock::now_ms(),
        };
        dedupe::explain::explain(&ledger, &q).map(|answer| {
            crate::explain_client::with_dead_letter(answer, &kafka, dead_letter_topic.as_deref())
        })
    })
    .await;
    match answer {
        Ok(Ok(answer)) => HttpResponse::Ok().json(answer),
        Ok(Err(e @ dedupe::explain::ExplainError::Id(_))) => {
            HttpResponse::BadRequest().json(json!({ "error": e.to_string() }))
        }
        Ok(Err(e)) => HttpResponse::InternalServerError().json(json!({ "error": e.to_string() })),
        Err(_) => {
            HttpResponse::ServiceUnavailable().json(json!({ "error": "the worker is stopping" }))
        }
    }
}

/// `POST /admin/snapshot`: takes a snapshot and answers with its directory.
pub(crate) async fn admin_snapshot(admin: web::Data<Admin>) -> HttpResponse {
    let (tx, rx) = tokio::sync::oneshot::channel();
    admin.targets.coordinator.do_send(TakeSnapshot {
        trigger: Trigger::Requested,
        reply: Some(tx),
    });
    match rx.await {
        Ok(Ok(dir)) => HttpResponse::Ok().json(json!({ "snapshot": dir })),
        Ok(Err(e @ SnapshotError::Busy)) => {
            HttpResponse::Conflict().json(json!({ "error": e.to_string() }))
        }
        Ok(Err(e @ SnapshotError::TooSoon { retry_after })) => {
            let secs = retry_after_secs(retry_after);
            HttpResponse::TooManyRequests()
                .insert_header((RETRY_AFTER, secs.to_string()))
                .json(json!({ "error": e.to_string(), "retry_after_secs": secs }))
        }
        Ok(Err(e @ SnapshotError::NotConfigured)) => {
            HttpResponse::BadRequest().json(json!({ "error": e.to_string() }))
        }
        Ok(Err(SnapshotError::Stopping)) | Err(_) => {
            HttpResponse::ServiceUnavailable().json(json!({ "error": "the worker is stopping" }))
        }
        Ok(Err(e)) => HttpResponse::InternalServerError().json(json!({ "error": e.to_string() })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTENER: &str = "127.0.0.1:9090";

    /// A plain loopback request, as `dedupe ledger snapshot` or curl sends it.
    fn plain() -> AdminRequest<'static> {
        AdminRequest {
            authorization: None,
            origin: None,
            sec_fetch_site: None,
            host: Some(LISTENER),
            listener: LISTENER.parse().unwrap(),
            peer: Some("127.0.0.1".parse().unwrap()),
        }
    }

    fn peer(ip: &str) -> Option<IpAddr> {
        Some(ip.parse().unwrap())
    }

    #[test]
    fn without_a_token_only_a_loopback_client_that_is_not_a_web_page_is_admitted() {
        use AdminRefusal::*;
        let cases: &[(&str, AdminRequest<'static>, Result<(), AdminRefusal>)] = &[
            ("plain loopback", plain(), Ok(())),
            (
                "IPv6 loopback",
                AdminRequest {
                    peer: peer("::1"),
                    ..plain()
                },
                Ok(()),
            ),
            (
                "localhost with the port",
                AdminRequest {
                    host: Some("localhost:9090"),
                    ..plain()
                },
                Ok(()),
            ),
            (
                "localhost in capitals",
                AdminRequest {
                    host: Some("LOCALHOST:9090"),
                    ..plain()
                },
                Ok(()),
            ),
            (
                "localhost without a port",
                AdminRequest {
                    host: Some("localhost"),
                    ..plain()
                },
                Ok(()),
            ),
            (
                "the listener's IP without a port",
                AdminRequest {
                    host: Some("127.0.0.1"),
                    ..plain()
                },
                Ok(()),
            ),
            (
                "a tool's Sec-Fetch-Site: none",
                AdminRequest {
                    sec_fetch_site: Some("none"),
                    ..plain()
                },
                Ok(()),
            ),
            (
                "same-origin",
                AdminRequest {
                    sec_fetch_site: Some("same-origin"),
                    ..plain()
                },
                Ok(()),
            ),
            // The header is ignored without a token; it neither helps nor hurts.
            (
                "a bearer header",
                AdminRequest {
                    authorization: Some("Bearer x"),
                    ..plain()
                },
                Ok(()),
            ),
            (
                "outside loopback",
                AdminRequest {
                    peer: peer("10.1.2.3"),
                    ..plain()
                },
                Err(NotLoopback),
            ),
            (
                "no peer address",
                AdminRequest {
                    peer: None,
                    ..plain()
                },
                Err(NotLoopback),
            ),
            (
                "a cross-site form post",
                AdminRequest {
                    origin: Some("https://evil.example"),
                    ..plain()
                },
                Err(WebPage),
            ),
            (
                "an opaque origin",
                AdminRequest {
                    origin: Some("null"),
                    ..plain()
                },
                Err(WebPage),
            ),
            (
                "an unreadable origin",
                AdminRequest {
                    origin: Some(""),
                    ..plain()
                },
                Err(WebPage),
            ),
            (
                "even our own origin",
                AdminRequest {
                    origin: Some("http://127.0.0.1:9090"),
                    ..plain()
                },
                Err(WebPage),
            ),
            (
                "cross-site",
                AdminRequest {
                    sec_fetch_site: Some("cross-site"),
                    ..plain()
                },
                Err(CrossSite),
            ),
            (
                "same-site",
                AdminRequest {
                    sec_fetch_site: Some("same-site"),
                    ..plain()
                },
                Err(CrossSite),
            ),
            (
                "an unreadable Sec-Fetch-Site",
                AdminRequest {
                    sec_fetch_site: Some(""),
                    ..plain()
                },
                Err(CrossSite),
            ),
            (
                "a rebound DNS name",
                AdminRequest {
                    host: Some("evil.example:9090"),
                    ..plain()
                },
                Err(ForeignHost),
            ),
            (
                "a rebound name on its own",
                AdminRequest {
                    host: Some("evil.example"),
                    ..plain()
                },
                Err(ForeignHost),
            ),
            (
                "no Host",
                AdminRequest {
                    host: None,
                    ..plain()
                },
                Err(ForeignHost),
            ),
            (
                "an empty Host",
                AdminRequest {
                    host: Some(""),
                    ..plain()
                },
                Err(ForeignHost),
            ),
            (
                "another port",
                AdminRequest {
                    host: Some("127.0.0.1:9091"),
                    ..plain()
                },
                Err(ForeignHost),
            ),
            (
                "localhost on another port",
                AdminRequest {
                    host: Some("localhost:80"),
                    ..plain()
                },
                Err(ForeignHost),
            ),
            (
                "an empty port",
                AdminRequest {
                    host: Some("localhost:"),
                    ..plain()
                },
                Err(ForeignHost),
            ),
            (
                "a signed port",
                AdminRequest {
                    host: Some("localhost:+9090"),
                    ..plain()
                },
                Err(ForeignHost),
            ),
            (
                "another loopback IP",
                AdminRequest {
                    host: Some("127.0.0.2:9090"),
                    ..plain()
                },
                Err(ForeignHost),
            ),
            (
                "a name that starts with localhost",
                AdminRequest {
                    host: Some("localhost.evil.example:9090"),
                    ..plain()
                },
                Err(ForeignHost),
            ),
            (
                "IPv6 for an IPv4 listener",
                AdminRequest {
                    host: Some("[::1]:9090"),
                    ..plain()
                },
                Err(ForeignHost),
            ),
            (
                "a host with a path",
                AdminRequest {
                    host: Some("127.0.0.1:9090/x"),
                    ..plain()
                },
                Err(ForeignHost),
            ),
        ];
        for (what, request, expected) in cases {
            assert_eq!(&authorize(None, request), expected, "{what}");
        }
    }

    #[test]
    fn percent_decoding_keeps_every_byte() {
        assert_eq!(percent_decode(b"a%20b%2Fc", false), b"a b/c");
        assert_eq!(percent_decode(b"%FF%fe", false), [0xff, 0xfe]);
        // A `+` is a space in a query only; a broken escape is kept as it is.
        assert_eq!(percent_decode(b"a+b", true), b"a b");
        assert_eq!(percent_decode(b"a+b", false), b"a+b");
        assert_eq!(percent_decode(b"%zz%4", false), b"%zz%4");
        assert_eq!(percent_decode("é".as_bytes(), false), "é".as_bytes());
    }

    #[test]
    fn the_host_names_an_ipv6_or_wildcard_listener() {
        let v6: SocketAddr = "[::1]:9090".parse().unwrap();
        assert!(names_listener("[::1]:9090", v6));
        assert!(
            names_listener("[0:0:0:0:0:0:0:1]:9090", v6),
            "another spelling of the same address"
        );
        assert!(names_listener("[::1]", v6));
        assert!(names_listener("localhost:9090", v6));
        assert!(!names_listener("[::1]9090", v6));
        assert!(!names_listener("[::1:9090", v6));
        assert!(!names_listener("::1:9090", v6), "IPv6 needs its brackets");
        assert!(!names_listener("127.0.0.1:9090", v6));
        // Listening on every address, a client on this machine may use any loopback address, or
        // the wildcard itself (what `dedupe ledger snapshot` sends for metrics.addr = 0.0.0.0:9464).
        let any: SocketAddr = "0.0.0.0:9464".parse().unwrap();
        for host in [
            "127.0.0.1:9464",
            "127.0.0.2:9464",
            "0.0.0.0:9464",
            "localhost:9464",
        ] {
            assert!(names_listener(host, any), "{host}");
        }
        assert!(!names_listener("10.0.0.5:9464", any));
        assert!(!names_listener("127.0.0.1:9465", any));
    }

    #[test]
    fn with_a_token_the_bearer_token_decides_in_any_scheme_case() {
        use AdminRefusal::*;
        let token = SecretMatcher::new(Secret::new("s3cret"));
        let with = |authorization: Option<&'static str>, peer_ip: &str| AdminRequest {
            authorization,
            peer: peer(peer_ip),
            ..plain()
        };
        let cases = [
            (
                "from anywhere",
                with(Some("Bearer s3cret"), "10.1.2.3"),
                Ok(()),
            ),
            (
                "lower case scheme",
                with(Some("bearer s3cret"), "127.0.0.1"),
                Ok(()),
            ),
            (
                "upper case scheme",
                with(Some("BEARER s3cret"), "127.0.0.1"),
                Ok(()),
            ),
            (
                "spaces around",
                with(Some("  Bearer   s3cret "), "127.0.0.1"),
                Ok(()),
            ),
            // A web page, a foreign Host: the token alone decides (a page cannot send it).
            (
                "from a page, with the token",
                AdminRequest {
                    origin: Some("https://evil.example"),
                    host: Some("evil.example"),
                    ..with(Some("Bearer s3cret"), "127.0.0.1")
                },
                Ok(()),
            ),
            (
                "no header, even on loopback",
                with(None, "127.0.0.1"),
                Err(BadToken),
            ),
            (
                "a prefix of the token",
                with(Some("Bearer s3cre"), "127.0.0.1"),
                Err(BadToken),
            ),
            (
                "the token and more",
                with(Some("Bearer s3crets"), "127.0.0.1"),
                Err(BadToken),
            ),
            (
                "another scheme",
                with(Some("Basic s3cret"), "127.0.0.1"),
                Err(BadToken),
            ),
            (
                "the scheme alone",
                with(Some("Bearer"), "127.0.0.1"),
                Err(BadToken),
            ),
            (
                "an empty token",
                with(Some("Bearer "), "127.0.0.1"),
                Err(BadToken),
            ),
            (
                "the token alone",
                with(Some("s3cret"), "127.0.0.1"),
                Err(BadToken),
            ),
            (
                "an unreadable header",
                with(Some(""), "127.0.0.1"),
                Err(BadToken),
            ),
        ];
        for (what, request, expected) in cases {
            assert_eq!(authorize(Some(&token), &request), expected, "{what}");
        }
    }

    #[test]
    fn each_refusal_names_why_in_its_answer() {
        let listener: SocketAddr = LISTENER.parse().unwrap();
        let refusals = [
            (AdminRefusal::BadToken, 401, "Authorization: Bearer"),
            (AdminRefusal::NotLoopback, 403, "loopback clients only"),
            (AdminRefusal::WebPage, 403, "Origin header"),
            (AdminRefusal::CrossSite, 403, "Sec-Fetch-Site"),
            (
                AdminRefusal::ForeignHost,
                403,
                "Host header (127.0.0.1:9090 or localhost:9090)",
            ),
        ];
        for (refusal, status, says) in refusals {
            let response = refusal.response(listener);
            assert_eq!(response.status().as_u16(), status, "{refusal:?}");
            let body = actix_web::body::to_bytes(response.into_body());
            let body = futures::executor::block_on(body).unwrap_or_default();
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let error = json["error"].as_str().unwrap_or_default();
            assert!(error.contains(says), "{refusal:?}: {error}");
        }
    }
}

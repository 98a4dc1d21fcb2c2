//! Logs and metrics: tracing (human or JSON lines), the Prometheus recorder, and the HTTP
//! endpoints `/metrics`, `/healthz` (the process is up) and `/readyz` (every owned partition is
//! recovered and processing).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::AUTHORIZATION;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use dedupe::config::{LogConfig, LogFormat, Secret, ENV_ADMIN_TOKEN};
use dedupe::snapshot::SnapshotError;
use serde_json::json;
use dedupe::metrics as m;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::actors::coordinator::{Coordinator, Health, TakeSnapshot};
use crate::actors::events::AdminRefused;

/// Starts logging to stderr. Log lines never carry message payloads or secrets.
pub fn init_tracing(log: &LogConfig) {
    let filter = EnvFilter::try_new(&log.level).unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match log.format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
    };
}

/// Installs the global Prometheus recorder with real histogram buckets.
pub fn init_metrics() -> anyhow::Result<PrometheusHandle> {
    let mut builder = PrometheusBuilder::new();
    for metric in m::ALL.iter().filter(|x| x.kind == m::Kind::Histogram) {
        builder = builder.set_buckets_for_metric(Matcher::Full(metric.name.to_string()), m::buckets(metric.name))?;
    }
    let handle = builder.install_recorder()?;
    m::describe();
    Ok(handle)
}

/// Serves `/metrics`, `/healthz`, `/readyz`, and `POST /admin/snapshot` (take a ledger snapshot
/// now) on `addr`, which is loopback unless configured otherwise. The admin endpoint needs
/// `Authorization: Bearer <DEDUPE_ADMIN_TOKEN>` when a token is set, and a loopback client when
/// none is.
pub fn serve(
    addr: SocketAddr,
    admin_token: Option<Secret>,
    handle: PrometheusHandle,
    health: Arc<Health>,
    coordinator: actix::Addr<Coordinator>,
) -> anyhow::Result<actix_web::dev::Server> {
    let admin = web::Data::new(Admin { token: admin_token, coordinator });
    let server = HttpServer::new(move || {
        let handle = handle.clone();
        let health = health.clone();
        App::new()
            .app_data(admin.clone())
            .route("/admin/snapshot", web::post().to(admin_snapshot))
            .route("/metrics", metrics_route(handle))
            .route("/healthz", web::get().to(|| async { HttpResponse::Ok().body("ok\n") }))
            .route(
                "/readyz",
                web::get().to(move || {
                    let ready = health.is_ready();
                    async move {
                        if ready {
                            HttpResponse::Ok().body("ready\n")
                        } else {
                            HttpResponse::ServiceUnavailable().body("recovering\n")
                        }
                    }
                }),
            )
    })
    .workers(1)
    .disable_signals()
    .client_request_timeout(ADMIN_REQUEST_TIMEOUT)
    .max_connections(ADMIN_MAX_CONNECTIONS)
    .bind(addr)
    .map_err(|e| anyhow::anyhow!("cannot listen for metrics on {addr}: {e}"))?
    .run();
    Ok(server)
}

/// How long a client of the metrics listener may take to send its request's head.
const ADMIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections the metrics listener holds at once (Prometheus, probes, an operator).
const ADMIN_MAX_CONNECTIONS: usize = 64;

/// What the admin endpoints share.
struct Admin {
    token: Option<Secret>,
    coordinator: actix::Addr<Coordinator>,
}

/// Why an admin request is refused before it does anything.
#[derive(Debug, PartialEq, Eq)]
enum AdminRefusal {
    /// A token is set and the request's is missing or wrong.
    BadToken,
    /// No token is set and the client is not on loopback.
    NotLoopback,
}

/// Authorizes an admin request: the bearer token when one is set, else a loopback peer.
fn authorize(token: Option<&Secret>, authorization: Option<&str>, peer: Option<IpAddr>) -> Result<(), AdminRefusal> {
    match token {
        Some(token) => {
            let given = authorization.and_then(|h| h.strip_prefix("Bearer ")).unwrap_or("");
            if constant_time_eq(given.trim().as_bytes(), token.expose().as_bytes()) {
                Ok(())
            } else {
                Err(AdminRefusal::BadToken)
            }
        }
        None if peer.is_some_and(|ip| ip.is_loopback()) => Ok(()),
        None => Err(AdminRefusal::NotLoopback),
    }
}

/// Compares without stopping at the first difference, so timing does not reveal the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `POST /admin/snapshot`: takes a snapshot and answers with its directory.
async fn admin_snapshot(req: HttpRequest, admin: web::Data<Admin>) -> HttpResponse {
    let authorization = req.headers().get(AUTHORIZATION).and_then(|h| h.to_str().ok());
    let peer = req.peer_addr().map(|a| a.ip());
    match authorize(admin.token.as_ref(), authorization, peer) {
        Err(AdminRefusal::BadToken) => {
            AdminRefused { peer, why: "missing or wrong bearer token" }.emit();
            return HttpResponse::Unauthorized()
                .json(json!({ "error": format!("send Authorization: Bearer <{ENV_ADMIN_TOKEN}>") }));
        }
        Err(AdminRefusal::NotLoopback) => {
            AdminRefused { peer, why: "a client outside loopback, and no admin token is set" }.emit();
            return HttpResponse::Forbidden().json(
                json!({ "error": format!("admin endpoints answer loopback clients only unless {ENV_ADMIN_TOKEN} is set") }),
            );
        }
        Ok(()) => {}
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    admin.coordinator.do_send(TakeSnapshot { reply: Some(tx) });
    match rx.await {
        Ok(Ok(dir)) => HttpResponse::Ok().json(json!({ "snapshot": dir })),
        Ok(Err(e @ SnapshotError::Busy)) => HttpResponse::Conflict().json(json!({ "error": e.to_string() })),
        Ok(Err(e @ SnapshotError::NotConfigured)) => HttpResponse::BadRequest().json(json!({ "error": e.to_string() })),
        Ok(Err(SnapshotError::Stopping)) | Err(_) => {
            HttpResponse::ServiceUnavailable().json(json!({ "error": "the worker is stopping" }))
        }
        Ok(Err(e)) => HttpResponse::InternalServerError().json(json!({ "error": e.to_string() })),
    }
}

/// Serves `/metrics` alone on `addr`: for `dedupe ingest`, whose own listener has `/healthz` and
/// `/readyz`.
pub fn serve_metrics(addr: SocketAddr, handle: PrometheusHandle) -> anyhow::Result<actix_web::dev::Server> {
    let server = HttpServer::new(move || App::new().route("/metrics", metrics_route(handle.clone())))
        .workers(1)
        .disable_signals()
        .bind(addr)
        .map_err(|e| anyhow::anyhow!("cannot listen for metrics on {addr}: {e}"))?
        .run();
    Ok(server)
}

/// `GET /metrics`: the Prometheus text rendering of every metric.
fn metrics_route(handle: PrometheusHandle) -> actix_web::Route {
    web::get().to(move || {
        let body = handle.render();
        async move { HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(body) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(token: Option<&str>, header: Option<&str>, peer: &str) -> Result<(), AdminRefusal> {
        authorize(token.map(Secret::new).as_ref(), header, Some(peer.parse().unwrap()))
    }

    #[test]
    fn admin_needs_the_token_when_one_is_set_and_loopback_otherwise() {
        // No token: loopback only, whatever the header says.
        assert_eq!(check(None, None, "127.0.0.1"), Ok(()));
        assert_eq!(check(None, None, "::1"), Ok(()));
        assert_eq!(check(None, Some("Bearer x"), "10.1.2.3"), Err(AdminRefusal::NotLoopback));
        // A token: required from everyone, loopback included.
        assert_eq!(check(Some("s3cret"), Some("Bearer s3cret"), "10.1.2.3"), Ok(()));
        assert_eq!(check(Some("s3cret"), None, "127.0.0.1"), Err(AdminRefusal::BadToken));
        assert_eq!(check(Some("s3cret"), Some("Bearer s3cre"), "127.0.0.1"), Err(AdminRefusal::BadToken));
        assert_eq!(check(Some("s3cret"), Some("Basic s3cret"), "127.0.0.1"), Err(AdminRefusal::BadToken));
    }
}

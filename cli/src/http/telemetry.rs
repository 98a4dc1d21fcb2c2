//! Logs and metrics: tracing (human or JSON lines), the Prometheus recorder, and the HTTP
//! endpoints `/metrics`, `/healthz` (the process is up) and `/readyz` (every owned partition is
//! recovered and processing).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::from_fn;
use actix_web::{web, App, HttpResponse, HttpServer};
use dedupe::config::{LogConfig, LogFormat, Secret};
use dedupe::metrics as m;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use super::admin::{self, Admin, AdminTargets};
use super::forget_route;
use dedupe_actors::coordinator::Health;

/// Starts logging to stderr. Log lines never carry message payloads or secrets.
pub fn init_tracing(log: &LogConfig) {
    let filter = EnvFilter::try_new(&log.level).unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = match log.format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
}

/// Installs the global Prometheus recorder with real histogram buckets.
pub fn init_metrics() -> anyhow::Result<PrometheusHandle> {
    let mut builder = PrometheusBuilder::new();
    for metric in m::ALL.iter().filter(|x| x.kind == m::Kind::Histogram) {
        builder = builder.set_buckets_for_metric(
            Matcher::Full(metric.name.to_string()),
            m::buckets(metric.name),
        )?;
    }
    let handle = builder.install_recorder()?;
    m::describe();
    crate::events::BuildInfo.emit();
    Ok(handle)
}

/// Serves `/metrics`, `/healthz`, `/readyz` and the admin endpoints (in [`admin_scope`], behind
/// its one guard) on `addr`, which is loopback unless configured otherwise. The admin endpoints
/// need `Authorization: Bearer <DEDUPE_ADMIN_TOKEN>` when a token is set; when none is, a
/// loopback client that is not a web page.
pub fn serve(
    addr: SocketAddr,
    admin_token: Option<Secret>,
    handle: PrometheusHandle,
    health: Arc<Health>,
    targets: AdminTargets,
) -> anyhow::Result<actix_web::dev::Server> {
    let admin = web::Data::new(Admin::new(admin_token, targets));
    let server = HttpServer::new(move || {
        let handle = handle.clone();
        let health = health.clone();
        App::new()
            .app_data(admin.clone())
            .service(admin_scope())
            .route("/metrics", metrics_route(handle))
            .route(
                "/healthz",
                web::get().to(|| async { HttpResponse::Ok().body("ok\n") }),
            )
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

/// The admin routes, as [`admin_scope`] serves them: method and path. The route test sends each one
/// unauthorized and expects a refusal; a route served outside the scope fails it.
pub const ADMIN_ROUTES: &[(&str, &str)] = &[
    ("POST", "/admin/snapshot"),
    ("GET", "/admin/ids/{id}"),
    ("DELETE", "/admin/ids/{id}"),
    ("POST", "/admin/forget"),
];

/// Every admin route ([`ADMIN_ROUTES`]) in the scope `/admin`, behind [`admin::guard`].
fn admin_scope() -> actix_web::Scope<
    impl actix_web::dev::ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<EitherBody<impl MessageBody>>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    web::scope("/admin")
        .wrap(from_fn(admin::guard))
        .route("/snapshot", web::post().to(admin::admin_snapshot))
        .route("/ids/{id}", web::get().to(admin::admin_explain))
        .route(
            "/ids/{id}",
            web::delete().to(forget_route::admin_forget_one),
        )
        .service(
            web::resource("/forget")
                .app_data(web::JsonConfig::default().limit(forget_route::MAX_BODY_BYTES))
                .route(web::post().to(forget_route::admin_forget)),
        )
}

/// How long a client of the metrics listener may take to send its request's head.
const ADMIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections the metrics listener holds at once (Prometheus, probes, an operator).
const ADMIN_MAX_CONNECTIONS: usize = 64;
/// Serves `/metrics` alone on `addr`: for `dedupe ingest`, whose own listener has `/healthz` and
/// `/readyz`.
pub fn serve_metrics(
    addr: SocketAddr,
    handle: PrometheusHandle,
) -> anyhow::Result<actix_web::dev::Server> {
    let server =
        HttpServer::new(move || App::new().route("/metrics", metrics_route(handle.clone())))
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
        async move {
            HttpResponse::Ok()
                .content_type("text/plain; version=0.0.4")
                .body(body)
        }
    })
}

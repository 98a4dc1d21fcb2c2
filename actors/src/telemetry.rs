//! Logs and metrics: tracing (human or JSON lines), the Prometheus recorder, and the HTTP
//! endpoints `/metrics`, `/healthz` (the process is up) and `/readyz` (every owned partition is
//! recovered and processing).

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::{web, App, HttpResponse, HttpServer};
use dedupe::config::{LogConfig, LogFormat};
use dedupe::metrics as m;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::coordinator::Health;

/// Starts logging to stderr. Log lines never carry message payloads or secrets.
pub fn init_tracing(log: &LogConfig) {
    let filter = EnvFilter::try_new(&log.level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
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

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr`.
pub fn serve(addr: SocketAddr, handle: PrometheusHandle, health: Arc<Health>) -> anyhow::Result<actix_web::dev::Server> {
    let server = HttpServer::new(move || {
        let handle = handle.clone();
        let health = health.clone();
        App::new()
            .route(
                "/metrics",
                web::get().to(move || {
                    let body = handle.render();
                    async move { HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(body) }
                }),
            )
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
    .bind(addr)
    .map_err(|e| anyhow::anyhow!("cannot listen for metrics on {addr}: {e}"))?
    .run();
    Ok(server)
}

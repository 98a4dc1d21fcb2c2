//! The `[metrics]` and `[log]` sections.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::Secret;

/// The Prometheus endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Where /metrics, /healthz, /readyz and the worker's admin endpoints are served; loopback
    /// by default.
    pub addr: SocketAddr,
    /// The admin endpoints' bearer token: from `DEDUPE_ADMIN_TOKEN` only; never in a file. Without
    /// one, the admin endpoints answer only clients on loopback.
    #[serde(skip_deserializing)]
    pub admin_token: Option<Secret>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            // Loopback, on the OpenTelemetry Prometheus exporter's default port.
            addr: SocketAddr::from(([127, 0, 0, 1], 9464)),
            // Admin endpoints for loopback clients only, until a token is set.
            admin_token: None,
        }
    }
}

/// Log output.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// Logging.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `human` or `json`.
    pub format: LogFormat,
    /// A tracing filter, e.g. `info` or `info,dedupe=debug`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        // Lines for a terminal; the image sets json.
        Self {
            format: LogFormat::Human,
            level: "info".into(),
        }
    }
}

//! `GET /v1/projects/<writeKey>/settings`: the settings document that points analytics.js back
//! at this API, for a known write key; 401 for any other.
//!
//! The document points at `ingest.public_url`, or at the listener's own address when that is one
//! address; nothing of it comes from the request. It is cached `private` (by the browser, never by
//! a shared cache): the CORS layer
//! answers each origin with its own `Access-Control-Allow-Origin`, and a shared cache that
//! ignored `Vary: Origin` would hand one origin's answer to another.

use crate as tracking;
use crate::AuthError;
use actix_web::http::header::CACHE_CONTROL;
use actix_web::{web, HttpRequest, HttpResponse};
use dedupe::metrics::REASON_NO_PUBLIC_URL;
use tracing::debug;

use super::events::SettingsAnswered;
use super::outcome::error_body;
use super::Ingest;

/// How long a browser may keep the settings document: it depends on the configuration alone.
const SETTINGS_MAX_AGE: &str = "private, max-age=300";
/// The settings route, as the metric label and log field name it.
const ENDPOINT: &str = SettingsAnswered::ENDPOINT;

/// Where the settings document points browsers: (protocol, host and path without a trailing
/// slash). Nothing of it comes from the request: a `Host` header echoed into a cacheable answer
/// would let anyone who can send one poison a shared cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiBase {
    /// `ingest.public_url`, or the listener's own address when it listens on one address.
    Known { protocol: String, base: String },
    /// Listening on every address without `ingest.public_url`: no one address to point at.
    Unknown,
}

impl ApiBase {
    /// `ingest.public_url` when set, else the listen address when it is one address.
    pub fn of(public_url: Option<&str>, listen: std::net::SocketAddr) -> ApiBase {
        if let Some((protocol, base)) = public_url.and_then(split_public_url) {
            return ApiBase::Known { protocol, base };
        }
        if listen.ip().is_unspecified() {
            return ApiBase::Unknown;
        }
        // SocketAddr's Display writes an IPv6 address in brackets, as a URL wants it.
        ApiBase::Known {
            protocol: "http".into(),
            base: listen.to_string(),
        }
    }
}

pub async fn settings(
    _req: HttpRequest,
    key: web::Path<String>,
    ingest: web::Data<Ingest>,
) -> HttpResponse {
    let answered = |response: HttpResponse, refused: Option<&'static str>| {
        SettingsAnswered {
            status: response.status().as_u16(),
            refused,
        }
        .emit();
        response
    };
    let Some(source) = ingest.keys.source(&key) else {
        let refusal = AuthError::Unknown;
        let response =
            HttpResponse::Unauthorized().json(error_body(refusal.reason(), &refusal.to_string()));
        return answered(response, Some(refusal.reason()));
    };
    let (protocol, base) = match &ingest.api_base {
        ApiBase::Known { protocol, base } => (protocol, base),
        ApiBase::Unknown => {
            let response = HttpResponse::ServiceUnavailable().json(error_body(
                REASON_NO_PUBLIC_URL,
                "ingest.public_url is not set and the API listens on every address, so it cannot tell which one browsers reach; set ingest.public_url",
            ));
            return answered(response, Some(REASON_NO_PUBLIC_URL));
        }
    };
    debug!(endpoint = ENDPOINT, source, "Served the settings document.");
    let doc = tracking::settings_document(&key, &format!("{base}/v1"), protocol);
    answered(
        HttpResponse::Ok()
            .insert_header((CACHE_CONTROL, SETTINGS_MAX_AGE))
            .json(doc),
        None,
    )
}

/// `ingest.public_url` as (protocol, host and path without a trailing slash).
pub fn split_public_url(url: &str) -> Option<(String, String)> {
    let (protocol, rest) = url.split_once("://")?;
    Some((protocol.to_string(), rest.trim_end_matches('/').to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_points_at_the_public_url_or_the_listener_never_at_the_request() {
        assert_eq!(
            split_public_url("https://t.example.com/"),
            Some(("https".into(), "t.example.com".into()))
        );
        assert_eq!(
            split_public_url("http://h:81/seg"),
            Some(("http".into(), "h:81/seg".into()))
        );
        let known = |protocol: &str, base: &str| ApiBase::Known {
            protocol: protocol.into(),
            base: base.into(),
        };
        let loopback = "127.0.0.1:8088".parse().unwrap();
        assert_eq!(
            ApiBase::of(Some("https://t.example.com/seg/"), loopback),
            known("https", "t.example.com/seg")
        );
        assert_eq!(ApiBase::of(None, loopback), known("http", "127.0.0.1:8088"));
        assert_eq!(
            ApiBase::of(None, "[::1]:80".parse().unwrap()),
            known("http", "[::1]:80")
        );
        // Every address: no one of them to name.
        assert_eq!(
            ApiBase::of(None, "0.0.0.0:8088".parse().unwrap()),
            ApiBase::Unknown
        );
        assert_eq!(
            ApiBase::of(Some("https://t.example.com"), "[::]:80".parse().unwrap()),
            known("https", "t.example.com")
        );
    }
}

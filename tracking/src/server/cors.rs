//! CORS for the tracking API: which browser origins may read its answers, the preflight a browser
//! sends before a request with an `Authorization` or `X-Retry-Count` header, and the headers on
//! every answer to an allowed origin.
//!
//! Guarantee: with no origins configured (the default) no answer carries a CORS header; an origin
//! that is not allowed never gets one, and its preflight is refused with 403. CORS only decides
//! what a page may read: the write key is what authenticates a write, whatever the origin (a
//! `navigator.sendBeacon` or a `text/plain` post needs no preflight, and is taken or refused on its
//! write key alone).

use crate::server::events::CorsPreflightRefused;
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderMap, HeaderValue};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::{web, HttpResponse};
use serde_json::json;

/// Request headers a page may send: what Segment's libraries set.
const ALLOW_HEADERS: &str = "authorization, content-type, content-encoding, x-retry-count";
/// Response headers a page may read: the rate limit's wait, which the browser library honours.
const EXPOSE_HEADERS: &str = "retry-after, x-ratelimit-reset";
const ALLOW_METHODS: &str = "GET, POST";
/// How long a browser may reuse a preflight's answer (Chromium caps it at two hours).
const MAX_AGE_SECS: &str = "600";
/// The `reason` a refused preflight is counted under.
pub const REASON_ORIGIN: &str = "cors_origin_not_allowed";

/// The configured origins.
#[derive(Debug, Clone, Default)]
pub struct CorsPolicy {
    any: bool,
    origins: Vec<String>,
}

/// What an answer to a request from `Origin` carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    /// No CORS at all (none configured, or no `Origin` sent).
    Off,
    /// The origin is not allowed: no CORS header (but `Vary: Origin`, so a cache keeps answers
    /// apart).
    Refused,
    /// `Access-Control-Allow-Origin` with this value.
    Origin(String),
}

impl CorsPolicy {
    /// From `ingest.cors_origins` (already validated: origins or `*`).
    pub fn new(origins: &[String]) -> Self {
        Self {
            any: origins.iter().any(|o| o == "*"),
            origins: origins.iter().filter(|o| *o != "*").cloned().collect(),
        }
    }

    pub fn is_off(&self) -> bool {
        !self.any && self.origins.is_empty()
    }

    pub fn allows_any(&self) -> bool {
        self.any
    }

    /// The answer's CORS for a request with this `Origin` header.
    pub fn check(&self, origin: Option<&str>) -> Allowed {
        let Some(origin) = origin else {
            return Allowed::Off;
        };
        if self.is_off() {
            Allowed::Off
        } else if self.any {
            Allowed::Origin("*".into())
        } else if self.origins.iter().any(|o| o.eq_ignore_ascii_case(origin)) {
            Allowed::Origin(origin.to_string())
        } else {
            Allowed::Refused
        }
    }
}

/// The middleware: answers preflights, and adds the CORS headers to every other answer.
pub async fn cors(
    policy: web::Data<CorsPolicy>,
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    if policy.is_off() {
        return Ok(next.call(req).await?.map_into_boxed_body());
    }
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_string);
    let allowed = policy.check(origin.as_deref());
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        let response = preflight_response(&allowed, policy.allows_any());
        return Ok(req.into_response(response));
    }
    let mut res = next.call(req).await?.map_into_boxed_body();
    add_headers(res.headers_mut(), &allowed, policy.allows_any());
    Ok(res)
}

fn preflight_response(allowed: &Allowed, any: bool) -> HttpResponse {
    match allowed {
        Allowed::Origin(_) => {
            let mut response = HttpResponse::NoContent().finish();
            add_headers(response.headers_mut(), allowed, any);
            let headers = response.headers_mut();
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static(ALLOW_METHODS),
            );
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static(ALLOW_HEADERS),
            );
            headers.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static(MAX_AGE_SECS),
            );
            response
        }
        Allowed::Off | Allowed::Refused => {
            CorsPreflightRefused {
                reason: REASON_ORIGIN,
            }
            .emit();
            let mut response = HttpResponse::Forbidden().json(json!({
                "success": false,
                "code": REASON_ORIGIN,
                "message": "this origin is not in ingest.cors_origins",
            }));
            add_headers(response.headers_mut(), allowed, any);
            response
        }
    }
}

fn add_headers(headers: &mut HeaderMap, allowed: &Allowed, any: bool) {
    if !any {
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    if let Allowed::Origin(origin) = allowed {
        // The origin was compared with a configured one, so it is a valid header value.
        if let Ok(value) = HeaderValue::from_str(origin) {
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
            headers.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static(EXPOSE_HEADERS),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(origins: &[&str]) -> CorsPolicy {
        CorsPolicy::new(&origins.iter().map(|o| o.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn no_origins_means_no_cors_at_all() {
        let p = policy(&[]);
        assert!(p.is_off());
        assert_eq!(p.check(Some("https://shop.example.com")), Allowed::Off);
    }

    #[test]
    fn only_configured_origins_are_allowed() {
        let p = policy(&["https://shop.example.com", "http://127.0.0.1:8000"]);
        assert_eq!(
            p.check(Some("https://shop.example.com")),
            Allowed::Origin("https://shop.example.com".into())
        );
        assert_eq!(
            p.check(Some("http://127.0.0.1:8000")),
            Allowed::Origin("http://127.0.0.1:8000".into())
        );
        // Another port, another scheme, a suffix or a prefix is another origin.
        for other in [
            "http://127.0.0.1:8001",
            "http://shop.example.com",
            "https://shop.example.com.evil.io",
            "https://evil.io",
            "null",
        ] {
            assert_eq!(p.check(Some(other)), Allowed::Refused, "{other}");
        }
        // No Origin header: not a cross-origin browser request.
        assert_eq!(p.check(None), Allowed::Off);
    }

    #[test]
    fn the_wildcard_allows_every_origin_with_a_star() {
        let p = policy(&["*"]);
        assert!(p.allows_any());
        assert_eq!(
            p.check(Some("https://anything.example")),
            Allowed::Origin("*".into())
        );
    }

    #[test]
    fn a_refused_preflight_carries_no_cors_header() {
        let response = preflight_response(&Allowed::Refused, false);
        assert_eq!(response.status().as_u16(), 403);
        assert!(!response
            .headers()
            .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN));
        let response = preflight_response(&Allowed::Origin("http://a.example".into()), false);
        assert_eq!(response.status().as_u16(), 204);
        assert_eq!(
            response
                .headers()
                .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
                .unwrap(),
            "http://a.example"
        );
        assert!(response
            .headers()
            .get(header::ACCESS_CONTROL_ALLOW_HEADERS)
            .unwrap()
            .to_str()
            .unwrap()
            .contains("authorization"));
    }
}

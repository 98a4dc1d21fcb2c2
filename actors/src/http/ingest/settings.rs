//! `GET /v1/projects/<writeKey>/settings`: the settings document that points analytics.js back
//! at this API, for a known write key; 401 for any other.
//!
//! The document is cached `private` (by the browser, never by a shared cache): the CORS layer
//! answers each origin with its own `Access-Control-Allow-Origin`, and a shared cache that
//! ignored `Vary: Origin` would hand one origin's answer to another.

use actix_web::http::header::{CACHE_CONTROL, HOST};
use actix_web::{web, HttpRequest, HttpResponse};
use dedupe::metrics::REASON_BAD_HOST;
use dedupe_tracking::{self as tracking, AuthError};
use tracing::debug;

use super::outcome::{error_body, SettingsAnswered};
use super::Ingest;

/// How long a browser may keep the settings document when `ingest.public_url` names where it
/// points (without it, the document is built from the request's `Host` and never kept).
const SETTINGS_MAX_AGE: &str = "private, max-age=300";
/// The settings route, as the metric label and log field name it.
const ENDPOINT: &str = SettingsAnswered::ENDPOINT;

pub async fn settings(req: HttpRequest, key: web::Path<String>, ingest: web::Data<Ingest>) -> HttpResponse {
    let answered = |response: HttpResponse, refused: Option<&'static str>| {
        SettingsAnswered { status: response.status().as_u16(), refused }.emit();
        response
    };
    let Some(source) = ingest.keys.source(&key) else {
        let refusal = AuthError::Unknown;
        let response = HttpResponse::Unauthorized().json(error_body(refusal.reason(), &refusal.to_string()));
        return answered(response, Some(refusal.reason()));
    };
    let (protocol, base, cache) = match &ingest.public_url {
        Some((protocol, base)) => (protocol.as_str(), base.clone(), SETTINGS_MAX_AGE),
        None => {
            let host = req.headers().get(HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
            if !is_host(host) {
                let response = HttpResponse::BadRequest().json(error_body(
                    REASON_BAD_HOST,
                    "the Host header is missing or not a host name or IP address with an optional port; set ingest.public_url",
                ));
                return answered(response, Some(REASON_BAD_HOST));
            }
            ("http", host.to_string(), "no-store")
        }
    };
    debug!(endpoint = ENDPOINT, source, "Served the settings document.");
    let doc = tracking::settings_document(&key, &format!("{base}/v1"), protocol);
    answered(HttpResponse::Ok().insert_header((CACHE_CONTROL, cache)).json(doc), None)
}

/// A `Host` header worth echoing into the settings document: a DNS name (labels of letters,
/// digits and inner hyphens), an IPv4 address, or an IPv6 address in brackets, then an optional
/// port of 1 to 65535.
pub fn is_host(host: &str) -> bool {
    if host.is_empty() || host.len() > 255 {
        return false;
    }
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, after)) => {
                if v6.parse::<std::net::Ipv6Addr>().is_err() {
                    return false;
                }
                match after {
                    "" => return true,
                    p => match p.strip_prefix(':') {
                        Some(port) => (None, Some(port)),
                        None => return false,
                    },
                }
            }
            None => return false,
        },
        None => match host.split_once(':') {
            Some((name, port)) => (Some(name), Some(port)),
            None => (Some(host), None),
        },
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok_and(|n| n > 0));
    let name_ok = name.is_none_or(|n| {
        let n = n.strip_suffix('.').unwrap_or(n);
        !n.is_empty()
            && n.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
    });
    port_ok && name_ok
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
    fn settings_hosts_and_public_urls() {
        for good in ["127.0.0.1:8080", "track.example.com", "[::1]:80", "[::1]", "localhost", "a-b.c9.example.", "x:65535"] {
            assert!(is_host(good), "{good}");
        }
        for bad in ["", "a.com/evil", "a.com\"x", "a b", "[evil]:::--..", "[::1]x", "-a.com", "a-.com", "a..com", "h:0", "h:65536", "h:", "h:8a", ":80", "[1.2.3.4]"] {
            assert!(!is_host(bad), "{bad}");
        }
        assert_eq!(split_public_url("https://t.example.com/"), Some(("https".into(), "t.example.com".into())));
        assert_eq!(split_public_url("http://h:81/seg"), Some(("http".into(), "h:81/seg".into())));
    }
}

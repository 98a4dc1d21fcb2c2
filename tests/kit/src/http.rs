//! Requests to the servers the tests start, through the project's one HTTP client (ureq). Only the
//! tests that play a hostile client (a request trickled byte by byte) write to a socket themselves.

use std::io::Read;
use std::net::SocketAddr;
use std::time::Duration;

/// A response as read back, whatever its status.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The body as JSON; panics with the body's text if it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {} body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request and reads the whole response. An error status is a response like any
/// other; only a failure to connect, send or read is an error.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(5))
        .timeout(Duration::from_secs(60))
        .build();
    let mut request = agent.request(method, &format!("http://{addr}{path}"));
    for (k, v) in headers {
        request = request.set(k, v);
    }
    let sent = if body.is_empty() && method == "GET" {
        request.call()
    } else {
        request.send_bytes(body)
    };
    let response = match sent {
        Ok(response) | Err(ureq::Error::Status(_, response)) => response,
        Err(ureq::Error::Transport(e)) => {
            return Err(std::io::Error::other(format!("{method} {path}: {e}")))
        }
    };
    let status = response.status();
    let headers = response
        .headers_names()
        .into_iter()
        .map(|name| {
            let value = response.header(&name).unwrap_or_default().to_string();
            (name, value)
        })
        .collect();
    let mut body = Vec::new();
    response.into_reader().read_to_end(&mut body)?;
    Ok(Response {
        status,
        headers,
        body,
    })
}

pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    request(addr, "GET", path, &[], b"")
}

//! Admission: what a request may hold, and when. A slow client cannot hold what others need.
//!
//! - A body is read within a deadline: `request_timeout_ms` for a request with a known write
//!   key in its `Authorization` header, the shorter `keyless_body_timeout_ms` for one whose key
//!   can only be in the body (nothing about it is known until the body has arrived).
//! - Bodies without a known key being read at once are bounded overall
//!   (`max_keyless_body_reads`, below `max_connections`) and per client address
//!   (`max_keyless_body_reads_per_client`); past either, the request is answered 503 at once and
//!   its connection closed. Keyed requests are not counted there, so keyless clients, however
//!   many, cannot lock out a client with a key.
//! - A request takes one of `max_in_flight_requests` places only once its body has arrived:
//!   the places bound the memory of decoding and producing, which only a complete body uses.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use actix_web::http::header::CONTENT_LENGTH;
use actix_web::{web, HttpRequest};

use crate::{Rejection, MAX_REQUEST_BYTES};
use futures::StreamExt;

use super::events;
use super::outcome::Outcome;

/// The places for requests being decoded and produced.
pub struct InFlight {
    count: AtomicUsize,
    max: usize,
    /// Moved by one with each place taken or given back, never set: requests on different
    /// server threads would otherwise write their counts in any order and leave it stale.
    gauge: metrics::Gauge,
}

/// A request counted in flight until it is dropped.
pub struct InFlightPlace<'a>(&'a InFlight);

impl Drop for InFlightPlace<'_> {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
        self.0.gauge.decrement(1.0);
    }
}

impl InFlight {
    pub fn new(max: usize) -> Self {
        Self::with_gauge(max, events::in_flight_gauge())
    }

    fn with_gauge(max: usize, gauge: metrics::Gauge) -> Self {
        Self {
            count: AtomicUsize::new(0),
            max,
            gauge,
        }
    }

    /// A place, or the refusal if all are taken.
    pub fn admit(&self) -> Result<InFlightPlace<'_>, Outcome> {
        let before = self.count.fetch_add(1, Ordering::AcqRel);
        if before >= self.max {
            self.count.fetch_sub(1, Ordering::AcqRel);
            return Err(Outcome::Overloaded { limit: self.max });
        }
        self.gauge.increment(1.0);
        Ok(InFlightPlace(self))
    }
}

/// The bodies being read now: keyed ones counted, keyless ones bounded overall and per address.
pub struct BodyReads {
    keyed: AtomicUsize,
    keyless: Mutex<Keyless>,
    max_keyless: usize,
    max_keyless_per_client: usize,
}

#[derive(Default)]
struct Keyless {
    total: usize,
    by_client: HashMap<IpAddr, usize>,
}

/// A body being read, counted until it is dropped.
pub struct BodyRead<'a> {
    reads: &'a BodyReads,
    /// The client's address for a keyless read; `None` for a keyed one.
    keyless: Option<Option<IpAddr>>,
}

impl Drop for BodyRead<'_> {
    fn drop(&mut self) {
        match self.keyless {
            None => {
                self.reads.keyed.fetch_sub(1, Ordering::AcqRel);
                events::BodyReadsChanged::KeyedEnded.emit();
            }
            Some(client) => {
                let mut k = self.reads.keyless.lock().unwrap_or_else(|p| p.into_inner());
                k.total = k.total.saturating_sub(1);
                if let Some(ip) = client {
                    if let Some(n) = k.by_client.get_mut(&ip) {
                        *n -= 1;
                        if *n == 0 {
                            k.by_client.remove(&ip);
                        }
                    }
                }
                events::BodyReadsChanged::Keyless(k.total).emit();
            }
        }
    }
}

impl BodyReads {
    pub fn new(max_keyless: usize, max_keyless_per_client: usize) -> Self {
        Self {
            keyed: AtomicUsize::new(0),
            keyless: Mutex::default(),
            max_keyless,
            max_keyless_per_client,
        }
    }

    /// A keyed body: always read (its key was checked), counted.
    pub fn keyed(&self) -> BodyRead<'_> {
        // Moved by one, not set, for the same reason as the in-flight gauge; the keyless count
        // is set under its lock.
        self.keyed.fetch_add(1, Ordering::AcqRel);
        events::BodyReadsChanged::KeyedStarted.emit();
        BodyRead {
            reads: self,
            keyless: None,
        }
    }

    /// A keyless body from `client`, or the refusal if too many are being read overall or from
    /// that address. A peer without an address (none over TCP) is bounded overall only.
    pub fn keyless(&self, client: Option<IpAddr>) -> Result<BodyRead<'_>, Outcome> {
        let mut k = self.keyless.lock().unwrap_or_else(|p| p.into_inner());
        if k.total >= self.max_keyless {
            return Err(Outcome::TooManyKeylessReads {
                limit: self.max_keyless,
            });
        }
        if let Some(ip) = client {
            let n = k.by_client.entry(ip).or_insert(0);
            if *n >= self.max_keyless_per_client {
                return Err(Outcome::TooManyKeylessReads {
                    limit: self.max_keyless_per_client,
                });
            }
            *n += 1;
        }
        k.total += 1;
        events::BodyReadsChanged::Keyless(k.total).emit();
        Ok(BodyRead {
            reads: self,
            keyless: Some(client),
        })
    }
}

/// Reads the raw body within `timeout`, refusing it as soon as it is known to be over the limit.
pub async fn read_body(
    req: &HttpRequest,
    payload: web::Payload,
    timeout: Duration,
) -> Result<web::BytesMut, Outcome> {
    tokio::time::timeout(timeout, read_body_unbounded(req, payload))
        .await
        .map_err(|_| Outcome::TooSlow(timeout))?
}

async fn read_body_unbounded(
    req: &HttpRequest,
    mut payload: web::Payload,
) -> Result<web::BytesMut, Outcome> {
    let too_large = || {
        Outcome::Rejected(Rejection::RequestTooLarge {
            limit: MAX_REQUEST_BYTES,
        })
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_REQUEST_BYTES) {
        return Err(too_large());
    }
    // What the client declared is allocated only as it arrives, past a first 8 KB.
    let mut body = web::BytesMut::with_capacity(declared.unwrap_or(8192).min(8192));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| Outcome::Unreadable(e.to_string()))?;
        if body.len() + chunk.len() > MAX_REQUEST_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_in_flight_limit_counts_requests_until_they_end() {
        // Two of two admitted, a third refused; one ends, and a third fits.
        let places = InFlight::new(2);
        let a = places.admit().ok().unwrap();
        let b = places.admit().ok().unwrap();
        assert!(matches!(
            places.admit(),
            Err(Outcome::Overloaded { limit: 2 })
        ));
        drop(a);
        let c = places.admit().ok().unwrap();
        drop((b, c));
        assert_eq!(places.count.load(Ordering::Acquire), 0);
    }

    #[test]
    fn the_in_flight_gauge_follows_requests_on_many_threads() {
        // Four threads take and give back places as fast as they can, and each checks, while it
        // holds a place, that the gauge shows at least its own. A gauge set from each thread's
        // count instead of moved by one falls behind here within a few thousand rounds.
        let value = Arc::new(std::sync::atomic::AtomicU64::new(0f64.to_bits()));
        let places = Arc::new(InFlight::with_gauge(
            64,
            metrics::Gauge::from_arc(value.clone()),
        ));
        let gauge = || f64::from_bits(value.load(Ordering::Acquire));
        let behind: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let mut behind = 0;
                        for _ in 0..200_000 {
                            let _place = places.admit().ok().unwrap();
                            if gauge() < 1.0 {
                                behind += 1;
                            }
                        }
                        behind
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(
            (behind, gauge(), places.count.load(Ordering::Acquire)),
            (0, 0.0, 0)
        );
    }

    #[test]
    fn keyless_reads_are_bounded_per_client_and_overall_and_keyed_ones_are_not() {
        let reads = BodyReads::new(3, 2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        // Two from one address fill its share; a third from it is refused, one from another
        // address fits, and then the total is full for everyone.
        let a1 = reads.keyless(Some(a)).ok().unwrap();
        let _a2 = reads.keyless(Some(a)).ok().unwrap();
        assert!(matches!(
            reads.keyless(Some(a)),
            Err(Outcome::TooManyKeylessReads { limit: 2 })
        ));
        let _b1 = reads.keyless(Some(b)).ok().unwrap();
        assert!(matches!(
            reads.keyless(Some(b)),
            Err(Outcome::TooManyKeylessReads { limit: 3 })
        ));
        // Keyed reads pass whatever the keyless ones hold.
        let keyed: Vec<_> = (0..10).map(|_| reads.keyed()).collect();
        assert_eq!(reads.keyed.load(Ordering::Acquire), 10);
        drop(keyed);
        // One ends: its address may send another.
        drop(a1);
        let _a3 = reads.keyless(Some(a)).ok().unwrap();
        assert_eq!(reads.keyed.load(Ordering::Acquire), 0);
    }
}

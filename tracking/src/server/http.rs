//! The HTTP listeners' server: actix-web apps served over [`GuardedStream`]s, with a bound on the
//! connections held at once and on the time any request may take.
//!
//! Limits, each with its own config key (`ingest.*`):
//! - `request_timeout_ms`: a request's head and body must arrive within it, on every request of a
//!   keep-alive connection (a body that does not is answered 408 and the connection closed);
//! - `request_timeout_ms + ack_timeout_ms + 1 s`: from a request's first byte to its answer,
//!   enforced on the connection itself, so a client that trickles bytes is cut off;
//! - `max_connections`: connections held at once, across all worker threads; past it, new
//!   connections wait in the listen backlog. Checked against the process's file limit at start.

use std::net::SocketAddr;
use std::time::Duration;

use actix_http::{HttpService, Protocol};
use actix_rt::net::TcpStream;
use actix_service::{fn_service, map_config, ServiceFactoryExt as _};
use actix_web::dev::{AppConfig, Server};
use dedupe::config::IngestConfig;

use crate::server::guarded_stream::GuardedStream;

/// File descriptors kept for what is not a connection (Kafka sockets, logs, the listener).
const RESERVED_FILES: u64 = 256;
/// How long an idle keep-alive connection is kept (actix-web's default).
const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// How long a closing connection may take to flush its last answer.
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The limits one listener enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Worker threads (each an event loop).
    pub workers: usize,
    /// Connections held at once, all workers together.
    pub max_connections: usize,
    /// How long a request's head and body may take to arrive.
    pub request_timeout: Duration,
    /// How long from a request's first byte to the first byte of its answer.
    pub answer_timeout: Duration,
    /// How long requests in flight may take to finish when the server stops.
    pub shutdown_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    #[error("max_connections = {connections} needs about {needed} file descriptors, but this process may open only {limit}")]
    FileLimit {
        connections: usize,
        needed: u64,
        limit: u64,
    },
}

impl Limits {
    /// The tracking API's limits, after making sure the process may open enough files.
    pub fn from_ingest(config: &IngestConfig) -> Result<Self, LimitsError> {
        let request_timeout = Duration::from_millis(config.request_timeout_ms);
        let ack_timeout = Duration::from_millis(config.ack_timeout_ms);
        let limits = Self {
            workers: std::thread::available_parallelism().map_or(2, usize::from),
            max_connections: config.max_connections,
            request_timeout,
            answer_timeout: request_timeout + ack_timeout + Duration::from_secs(1),
            shutdown_timeout: ack_timeout + Duration::from_secs(1),
        };
        ensure_file_limit(limits.max_connections)?;
        Ok(limits)
    }

    /// Connections per worker thread: the total shared out, rounded up.
    fn per_worker(&self) -> usize {
        self.max_connections.div_ceil(self.workers.max(1)).max(1)
    }
}

/// Raises the soft file limit towards the hard one if `connections` need it; errs if even the
/// hard limit is too low.
fn ensure_file_limit(connections: usize) -> Result<(), LimitsError> {
    let needed = connections as u64 + RESERVED_FILES;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Ok(());
        }
        if limit.rlim_cur < needed && limit.rlim_max > limit.rlim_cur {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max.min(needed.max(limit.rlim_cur)),
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    if limit.rlim_cur < needed {
        return Err(LimitsError::FileLimit {
            connections,
            needed,
            limit: limit.rlim_cur,
        });
    }
    Ok(())
}

/// Serves the app that `factory` makes on `addr` under `limits`, until its handle stops it
/// (gracefully, within `limits.shutdown_timeout`). It handles no signal itself: the binary
/// catches them from its start (`dedupe_cli::signals`) and stops it.
pub fn serve_http<F, A, B>(addr: SocketAddr, limits: Limits, factory: F) -> std::io::Result<Server>
where
    F: Fn() -> actix_web::App<A> + Send + Clone + 'static,
    A: actix_service::ServiceFactory<
            actix_web::dev::ServiceRequest,
            Config = (),
            Response = actix_web::dev::ServiceResponse<B>,
            Error = actix_web::Error,
            InitError = (),
        > + 'static,
    B: actix_web::body::MessageBody + 'static,
{
    let server = Server::build()
        .workers(limits.workers)
        .max_concurrent_connections(limits.per_worker())
        .shutdown_timeout(limits.shutdown_timeout.as_secs().max(1))
        .disable_signals()
        .bind("http", addr, move || {
            let http = HttpService::build()
                .client_request_timeout(limits.request_timeout)
                .client_disconnect_timeout(DISCONNECT_TIMEOUT)
                .keep_alive(KEEP_ALIVE)
                .finish(map_config(factory(), |_| AppConfig::default()));
            fn_service(move |io: TcpStream| {
                let peer = io.peer_addr().ok();
                let _ = io.set_nodelay(true);
                async move {
                    Ok((
                        GuardedStream::new(io, limits.answer_timeout),
                        Protocol::Http1,
                        peer,
                    ))
                }
            })
            .and_then(http)
        })?
        .run();
    Ok(server)
}

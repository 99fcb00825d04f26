//! A bounded HTTP/1.1 accept loop over a [`Listener`], with graceful shutdown.
//!
//! # Bounds of one listener
//!
//! - Connections: at most [`ServeOptions::connections_max`] at once. At the limit the loop holds
//!   the one connection it accepted, asks one idle keep-alive connection to close
//!   ([`Reclaim`]), and serves the new one the moment a slot frees; further connections wait in
//!   the kernel's listen backlog (bounded: [`LISTEN_BACKLOG`](crate::seam::LISTEN_BACKLOG) on
//!   tokio; past it the kernel drops SYNs and clients retry). At most one descriptor beyond the
//!   limit is spent on a connection the loop cannot serve yet.
//! - Accept failures for want of a resource (`EMFILE`, `ENFILE`, `ENOBUFS`, ...): a short pause
//!   ([`ACCEPT_BACKOFF_MIN`] doubling to [`ACCEPT_BACKOFF_MAX`]) that ends early when one of
//!   this listener's connections closes, and at most one log line per [`ACCEPT_LOG_INTERVAL`]
//!   (plus one when accepting recovers).
//! - Request heads: [`ServeOptions::head_read_timeout`] and [`ServeOptions::head_bytes_max`]
//!   (an oversized head is answered 431 and the connection closed); a keep-alive connection
//!   idle between requests is closed after [`ServeOptions::idle_timeout`] (see
//!   [`HeadTimer`](crate::guard::HeadTimer)).
//! - Writes: a connection whose client takes no bytes for [`ServeOptions::write_progress`] is
//!   closed ([`GuardedIo`]); one whose response the node aborts is closed at once
//!   ([`ConnectionAbort`]).
//! - Buffers: hyper's read buffer is at most `head_bytes_max`; its write buffer takes no
//!   further body part once it holds `head_bytes_max` bytes or 16 parts, so it holds at most
//!   that plus one part. The node's body window adds at most `BODY_WINDOW` parts of at most one
//!   block each (docs in `dart_core::node`); a passthrough body is moved frame by frame with
//!   hyper's backpressure.

use crate::body::ResponseBody;
use crate::guard::{ConnectionAbort, GuardedIo, Reclaim};
use crate::seam::Listener;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// How long a keep-alive connection may sit idle between requests by default (Go's
/// `IdleTimeout` of the earlier implementation's servers; nginx uses 75 s).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How much longer than the node's write-stall bound the transport waits for write progress:
/// the node's own timer, armed when its body window filled (at or before the socket blocked),
/// acts first on block reads and counts them; the transport's catches what the node does not
/// see (passthrough bodies).
pub const WRITE_PROGRESS_GRACE: Duration = Duration::from_secs(1);
/// First pause after an accept failed for want of a resource.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause between accept attempts while they keep failing.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_millis(50);
/// At most one log line about failing accepts per this interval (plus one on recovery).
pub const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Server options. The inbound transport limits come from the node's bounds
/// (`dart_core::node::Bounds`): they act before the node sees a request.
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// Stamp a `Date` header (off in simulations: it reads the wall clock).
    pub date_header: bool,
    /// How long in-flight connections may take to finish after shutdown is signalled.
    pub drain_timeout: Duration,
    /// How long a client may take to send its request head (the first on a connection from
    /// when it was accepted; a later one from its first byte).
    pub head_read_timeout: Duration,
    /// How long a keep-alive connection may wait for the first byte of its next request.
    pub idle_timeout: Duration,
    /// Most bytes of a request head (hyper's read buffer; at least 8 KiB).
    pub head_bytes_max: usize,
    /// Most connections served at once; further accepts wait for a free slot.
    pub connections_max: usize,
    /// How long a write may make no progress (the client stopped reading) before the
    /// connection is closed.
    pub write_progress: Duration,
}

impl ServeOptions {
    /// Options taking the inbound limits from `bounds`.
    pub fn from_bounds(bounds: &dart_core::node::Bounds) -> Self {
        ServeOptions {
            date_header: true,
            drain_timeout: Duration::from_secs(10),
            head_read_timeout: bounds.inbound_head_read,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            head_bytes_max: bounds.inbound_head_bytes.max(8192),
            connections_max: bounds.inbound_connections,
            write_progress: bounds.write_stall.saturating_add(WRITE_PROGRESS_GRACE),
        }
    }
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions::from_bounds(&dart_core::node::Bounds::default())
    }
}

/// How a server stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drained {
    /// Every connection finished within the drain timeout.
    Clean,
    /// The drain timed out; the connections still open were force-closed.
    TimedOut,
}

/// Serves `handler` on `listener` until `shutdown` resolves, then drains in-flight connections for
/// at most `options.drain_timeout`.
///
/// On shutdown the listener is closed at once (new connections are refused, not queued), idle
/// keep-alive connections close, and a connection with a response in flight finishes that
/// response and then closes. Connections still open when the drain bound passes are aborted:
/// their sockets close and their clients see a truncated body.
pub async fn serve<L, H, F>(
    mut listener: L,
    handler: H,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) -> Drained
where
    L: Listener,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(options.connections_max));
    // Holds every connection task so a drain that times out can abort them; finished tasks are
    // reaped on each accept, so it never holds more than `connections_max` live ones plus those
    // that ended since the last accept.
    let mut connections = crate::seam::TaskSet::default();
    let mut failures = AcceptFailures::default();
    let reclaim = Reclaim::default();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _remote)) => {
                failures.accepted(tokio::time::Instant::now());
                stream
            }
            Err(e) if is_transient(&e) => continue,
            Err(e) => {
                let pause = failures.failed(&e, tokio::time::Instant::now());
                // A connection of ours that closes frees a descriptor: try again at once.
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    Some(_) = connections.join_next() => {}
                    () = tokio::time::sleep(pause) => {}
                }
                continue;
            }
        };
        let permit = match slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                // At the limit with a client waiting: an idle keep-alive connection makes room.
                reclaim.one();
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    p = slots.clone().acquire_owned() => p.expect("semaphore never closed"),
                }
            }
        };
        while connections.try_join_next().is_some() {}
        let guard = ConnectionGuard { options, reclaim: reclaim.clone(), permit };
        connections.spawn(serve_connection(stream, handler.clone(), &graceful, guard));
    }
    drop(listener);
    match tokio::time::timeout(options.drain_timeout, graceful.shutdown()).await {
        Ok(()) => Drained::Clean,
        Err(_) => {
            while connections.try_join_next().is_some() {}
            let open = connections.len();
            connections.abort_all();
            while connections.join_next().await.is_some() {}
            tracing::warn!(
                connections = open,
                bound = ?options.drain_timeout,
                "drain timed out: force-closed the connections still open"
            );
            Drained::TimedOut
        }
    }
}

/// What a connection holds of its listener: the options, the reclaim signal and its slot.
struct ConnectionGuard {
    options: ServeOptions,
    reclaim: Reclaim,
    permit: tokio::sync::OwnedSemaphorePermit,
}

/// Serves one accepted connection under its bounds (see the module doc).
fn serve_connection<S, H, F>(
    stream: S,
    handler: H,
    graceful: &GracefulShutdown,
    guard: ConnectionGuard,
) -> impl Future<Output = ()> + Send + 'static
where
    S: crate::seam::Stream,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let ConnectionGuard { options, reclaim, permit } = guard;
    let abort = ConnectionAbort::default();
    let (io, timer) = GuardedIo::new(
        stream,
        options.write_progress,
        options.head_read_timeout,
        options.idle_timeout,
        reclaim,
    );
    let on_request = abort.clone();
    let service = service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(on_request.clone());
        let response = handler(req);
        async move { Ok::<_, Infallible>(response.await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(timer)
        .header_read_timeout(options.head_read_timeout)
        .max_buf_size(options.head_bytes_max)
        .auto_date_header(options.date_header)
        .serve_connection(TokioIo::new(io), service);
    let watched = graceful.watch(conn);
    async move {
        tokio::select! {
            ended = watched => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            }
            () = abort.aborted() => tracing::debug!("connection closed: its response was aborted"),
        }
        drop(permit);
    }
}

/// Whether an accept error concerns only the connection being accepted (try the next at once)
/// rather than the process (descriptors, memory: pause).
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Rate-limited reporting and backoff of failing accepts (see the module doc).
#[derive(Debug, Default)]
struct AcceptFailures {
    /// Failures of the current storm, if accepts are failing.
    storm: Option<Storm>,
    /// When the last start of a storm was logged.
    logged_at: Option<tokio::time::Instant>,
    /// Failures not yet reported in a log line.
    unreported: u64,
    /// Log lines written.
    lines: u64,
}

#[derive(Debug)]
struct Storm {
    started: tokio::time::Instant,
    failures: u64,
    announced: bool,
    pause: Duration,
}

impl AcceptFailures {
    /// Records a failure at `now`; returns how long to pause before the next attempt.
    fn failed(&mut self, e: &io::Error, now: tokio::time::Instant) -> Duration {
        self.unreported += 1;
        let due = self.logged_at.is_none_or(|t| now.duration_since(t) >= ACCEPT_LOG_INTERVAL);
        let storm = self.storm.get_or_insert(Storm {
            started: now,
            failures: 0,
            announced: false,
            pause: ACCEPT_BACKOFF_MIN,
        });
        storm.failures += 1;
        if due {
            tracing::warn!(
                error = %e,
                failures = self.unreported,
                "accept failed: pausing up to {ACCEPT_BACKOFF_MAX:?} between attempts \
                 (reported at most every {ACCEPT_LOG_INTERVAL:?})"
            );
            storm.announced = true;
            self.lines += 1;
            self.logged_at = Some(now);
            self.unreported = 0;
        }
        let pause = storm.pause;
        storm.pause = (storm.pause * 2).min(ACCEPT_BACKOFF_MAX);
        pause
    }

    /// Records a successful accept at `now`: a storm whose start was logged logs its end.
    fn accepted(&mut self, now: tokio::time::Instant) {
        let Some(storm) = self.storm.take() else { return };
        if storm.announced {
            self.lines += 1;
            tracing::info!(
                failures = storm.failures,
                lasted = ?now.duration_since(storm.started),
                "accepting again"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emfile() -> io::Error {
        io::Error::from_raw_os_error(24)
    }

    #[test]
    fn a_storm_of_accept_failures_logs_one_line_and_one_on_recovery() {
        let mut f = AcceptFailures::default();
        let t0 = tokio::time::Instant::now();
        let mut pauses = Vec::new();
        for i in 0..1000u64 {
            pauses.push(f.failed(&emfile(), t0 + Duration::from_millis(i)));
        }
        assert_eq!(f.lines, 1, "one line for the start of the storm");
        assert_eq!(pauses[0], ACCEPT_BACKOFF_MIN);
        assert!(pauses.iter().all(|p| *p <= ACCEPT_BACKOFF_MAX));
        assert_eq!(pauses[999], ACCEPT_BACKOFF_MAX);
        f.accepted(t0 + Duration::from_secs(1));
        assert_eq!(f.lines, 2, "one line when accepting recovers");
        f.accepted(t0 + Duration::from_secs(1));
        assert_eq!(f.lines, 2, "successes outside a storm log nothing");
    }

    #[test]
    fn storms_within_the_log_interval_are_counted_not_logged() {
        let mut f = AcceptFailures::default();
        let t0 = tokio::time::Instant::now();
        for i in 0..50u64 {
            let at = t0 + Duration::from_millis(100 * i);
            assert_eq!(f.failed(&emfile(), at), ACCEPT_BACKOFF_MIN, "a new storm starts short");
            f.accepted(at + Duration::from_millis(1));
        }
        assert_eq!(f.lines, 2, "the first storm and its end; the next 49 are inside the interval");
        assert_eq!(f.unreported, 49);
        let later = t0 + ACCEPT_LOG_INTERVAL + Duration::from_secs(1);
        f.failed(&emfile(), later);
        assert_eq!((f.lines, f.unreported), (3, 0), "the next report carries the count");
    }

    #[test]
    fn only_resource_errors_pause_the_accept_loop() {
        for kind in [io::ErrorKind::ConnectionAborted, io::ErrorKind::ConnectionReset] {
            assert!(is_transient(&io::Error::from(kind)));
        }
        assert!(!is_transient(&emfile()));
        assert!(!is_transient(&io::Error::from_raw_os_error(23)), "ENFILE");
    }
}

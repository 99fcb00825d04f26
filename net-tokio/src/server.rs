//! A bounded HTTP/1.1 accept loop over a [`Listener`], with graceful shutdown.

use crate::body::ResponseBody;
use crate::seam::Listener;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Server options. The inbound transport limits come from the node's bounds
/// (`dart_core::node::Bounds`): they act before the node sees a request.
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// Stamp a `Date` header (off in simulations: it reads the wall clock).
    pub date_header: bool,
    /// How long in-flight connections may take to finish after shutdown is signalled.
    pub drain_timeout: Duration,
    /// How long a client may take to send its request head.
    pub head_read_timeout: Duration,
    /// Most bytes of a request head (hyper's read buffer; at least 8 KiB).
    pub head_bytes_max: usize,
    /// Most connections served at once; further accepts wait for a free slot.
    pub connections_max: usize,
}

impl ServeOptions {
    /// Options taking the inbound limits from `bounds`.
    pub fn from_bounds(bounds: &dart_core::node::Bounds) -> Self {
        ServeOptions {
            date_header: true,
            drain_timeout: Duration::from_secs(10),
            head_read_timeout: bounds.inbound_head_read,
            head_bytes_max: bounds.inbound_head_bytes.max(8192),
            connections_max: bounds.inbound_connections,
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
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            p = slots.clone().acquire_owned() => p.expect("semaphore never closed"),
        };
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (stream, _remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let handler = handler.clone();
        let service = service_fn(move |req| {
            let h = handler.clone();
            async move { Ok::<_, Infallible>(h(req).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(options.head_read_timeout)
            .max_buf_size(options.head_bytes_max)
            .auto_date_header(options.date_header)
            .serve_connection(TokioIo::new(stream), service);
        let watched = graceful.watch(conn);
        while connections.try_join_next().is_some() {}
        connections.spawn(async move {
            if let Err(e) = watched.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
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

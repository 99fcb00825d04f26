//! The client plane: `GET`/`HEAD` of arbitrary byte ranges, served by driving a core
//! [`Read`] — probe, cache look-ups, origin fetches and stores are the core's decisions; this
//! module performs them and streams the emitted bytes with an exact `Content-Length`.

use crate::body::{self, ChannelBody, ResponseBody};
use crate::driver::{NodeCore, Outward};
use crate::seam::Dialer;
use bytes::Bytes;
use dart_core::codec::redact::redact_url;
use dart_core::engine::resolve::UpstreamMode;
use dart_core::engine::{Method, Read, ReadFailure, ReadRequest, ResponseHead};
use http::header::{
    HeaderValue, ACCEPT_RANGES, ALLOW, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE,
};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::sync::Arc;
use tokio::sync::mpsc;
use tracing::Instrument as _;

/// Frames buffered between the read task and the socket (backpressure bound).
pub const BODY_CHANNEL_DEPTH: usize = 4;

/// Entity headers copied from the origin on passthrough (fetch.md §6).
const PASSTHROUGH_HEADERS: [http::header::HeaderName; 7] = [
    CONTENT_TYPE,
    CONTENT_LENGTH,
    CONTENT_RANGE,
    http::header::ETAG,
    http::header::LAST_MODIFIED,
    http::header::CACHE_CONTROL,
    ACCEPT_RANGES,
];

/// The client plane: the node's machinery plus how request targets name upstream URLs.
pub struct ClientPlane<D: Dialer> {
    /// The node's shared machinery.
    pub node: Arc<NodeCore<D>>,
    /// How request targets name upstream URLs.
    pub mode: UpstreamMode,
}

fn plain(status: StatusCode, msg: &str) -> Response<ResponseBody> {
    let mut r = Response::new(body::full(format!("{msg}\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

fn head_response(head: &ResponseHead, body: ResponseBody) -> Response<ResponseBody> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(head.status).expect("engine emits valid statuses");
    let h = r.headers_mut();
    h.insert(CONTENT_LENGTH, HeaderValue::from(head.content_length));
    h.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Some(cr) = &head.content_range {
        h.insert(CONTENT_RANGE, HeaderValue::try_from(cr.as_str()).expect("ascii content-range"));
    }
    if head.status != 416 {
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    }
    r
}

fn failure_response(f: &ReadFailure, url: &str) -> Response<ResponseBody> {
    tracing::warn!(url = %redact_url(url), status = f.status, error = %f.error, "read failed");
    let status = StatusCode::from_u16(f.status).unwrap_or(StatusCode::BAD_GATEWAY);
    plain(status, &format!("dart: {}", f.error))
}

impl<D: Dialer> ClientPlane<D> {
    /// Serves one client request.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<ResponseBody> {
        let method = match *req.method() {
            http::Method::GET => Method::Get,
            http::Method::HEAD => Method::Head,
            _ => {
                let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "dart: method not allowed");
                r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
                return r;
            }
        };
        let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
        let url = match self.mode.resolve(target) {
            Ok(u) => u,
            Err(e) => return plain(StatusCode::BAD_REQUEST, &format!("dart: {e}")),
        };
        let span = tracing::info_span!("read", url = %redact_url(&url), ?method);
        // Instrumented, not entered: a guard held across an await would tag other tasks' logs.
        self.read(req, method, url).instrument(span).await
    }

    async fn read(
        self: Arc<Self>,
        req: Request<Incoming>,
        method: Method,
        url: String,
    ) -> Response<ResponseBody> {
        let range = req.headers().get(http::header::RANGE).map(|v| v.as_bytes().to_vec());
        let request = ReadRequest { url: url.clone(), method, range };
        let mut read = self.node.engine.lock().expect("engine lock").begin_read(request);
        // Before the head: the read probes until it commits to a response.
        match self.node.next(&mut read).await {
            Outward::Passthrough(url) => self.passthrough(&req, method, &url).await,
            Outward::Respond(head) => {
                if method == Method::Head || head.content_length == 0 {
                    return head_response(&head, body::empty());
                }
                let (tx, body) = ChannelBody::channel(head.content_length, BODY_CHANNEL_DEPTH);
                let node = self.node.clone();
                let span = tracing::Span::current();
                tokio::spawn(async move { stream(&node, read, tx).await }.instrument(span));
                head_response(&head, body)
            }
            Outward::Fail(f) => failure_response(&f, &url),
            Outward::Emit(_) | Outward::Finish => unreachable!("a head precedes every body"),
        }
    }

    async fn passthrough(
        &self,
        req: &Request<Incoming>,
        method: Method,
        url: &str,
    ) -> Response<ResponseBody> {
        let upstream = match self.node.origin.open(url, req.headers()).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(url = %redact_url(url), error = %e, "passthrough failed");
                return plain(StatusCode::BAD_GATEWAY, &format!("dart: {e}"));
            }
        };
        let (parts, incoming) = upstream.into_parts();
        let body = match method {
            Method::Head => body::empty(),
            Method::Get => incoming.map_err(|e| -> body::BodyError { Box::new(e) }).boxed(),
        };
        let mut r = Response::new(body);
        *r.status_mut() = parts.status;
        for name in PASSTHROUGH_HEADERS {
            if let Some(v) = parts.headers.get(&name) {
                r.headers_mut().insert(name, v.clone());
            }
        }
        r
    }
}

/// After the head: stream the body until the read finishes.
async fn stream<D: Dialer>(
    node: &NodeCore<D>,
    mut read: Read,
    tx: mpsc::Sender<Result<Bytes, body::BodyError>>,
) {
    loop {
        match node.next(&mut read).await {
            Outward::Emit(bytes) => {
                if tx.send(Ok(bytes)).await.is_err() {
                    tracing::debug!("client went away mid-body");
                    return;
                }
            }
            Outward::Finish => return,
            Outward::Fail(f) => {
                tracing::warn!(error = %f.error, "read failed after the head: truncating");
                let _ = tx.send(Err(f.error.to_string().into())).await;
                return;
            }
            Outward::Respond(_) | Outward::Passthrough(_) => {
                unreachable!("head-level actions never follow the head")
            }
        }
    }
}

//! The peer server: `GET /peer/v1/block/<chunk-hex>/<block-dec>` (seeds/peer.md §2).
//!
//! A request is parsed (400 for a malformed path or hop, 405 for another verb), checked by the
//! core ([`relay_check`]: declines are a clean 404 that never blames this relay), then served by a
//! core relay read driven through [`NodeCore::next`]. The relay holds the whole validated block
//! before it sends a header, so every failure is a clean status: 404 not held, 500 source error,
//! 502 with `X-DART-Upstream-Status` when the origin refused the requester's credential.

use crate::body::{self, ResponseBody};
use crate::driver::{NodeCore, Outward};
use crate::seam::Dialer;
use bytes::BytesMut;
use dart_core::codec::wire::{
    parse_block_path, parse_hop, BLOCK_PATH_PREFIX, HEADER_HOP, HEADER_NODE, HEADER_ORIGIN,
    HEADER_UPSTREAM_STATUS,
};
use dart_core::engine::route::{relay_check, RelayPlan};
use http::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use std::sync::Arc;

/// The peer plane of one node.
pub struct PeerPlane<D: Dialer> {
    /// The node's shared machinery.
    pub node: Arc<NodeCore<D>>,
    /// This node's member id, echoed as `X-DART-Node`.
    pub self_id: String,
}

impl<D: Dialer> PeerPlane<D> {
    fn reply(&self, status: StatusCode, msg: &str) -> Response<ResponseBody> {
        let mut r = Response::new(body::full(format!("{msg}\n")));
        *r.status_mut() = status;
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        self.name(&mut r);
        r
    }

    fn name(&self, r: &mut Response<ResponseBody>) {
        if let Ok(v) = HeaderValue::try_from(self.self_id.as_str()) {
            r.headers_mut().insert(HEADER_NODE, v);
        }
    }

    /// Serves one peer request.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<ResponseBody> {
        let path = req.uri().path();
        if !path.starts_with(BLOCK_PATH_PREFIX) {
            return self.reply(StatusCode::NOT_FOUND, "dart: unknown peer path");
        }
        if req.method() != http::Method::GET {
            let mut r = self.reply(StatusCode::METHOD_NOT_ALLOWED, "dart: method not allowed");
            r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET"));
            return r;
        }
        let key = match parse_block_path(path) {
            Ok(k) => k,
            Err(e) => return self.reply(StatusCode::BAD_REQUEST, &format!("dart: {e}")),
        };
        let hop = match parse_hop(req.headers().get(HEADER_HOP).map(HeaderValue::as_bytes)) {
            Ok(h) => h,
            Err(e) => return self.reply(StatusCode::BAD_REQUEST, &format!("dart: bad hop: {e}")),
        };
        // An empty value means cache-only, as an absent header does (peer.md §3.1).
        let origin = match req.headers().get(HEADER_ORIGIN).map(|v| v.to_str()) {
            None | Some(Ok("")) => None,
            Some(Ok(url)) => Some(url.to_owned()),
            Some(Err(_)) => {
                return self.reply(StatusCode::BAD_REQUEST, "dart: origin header is not ASCII")
            }
        };
        let plan = {
            let mut engine = self.node.engine.lock().expect("engine lock");
            match relay_check(&engine, key, origin.as_deref(), hop) {
                Ok(plan) => Ok(plan),
                Err(decline) => {
                    engine.note_relay_declined();
                    Err(decline)
                }
            }
        };
        let (url, next_hop) = match plan {
            Ok(RelayPlan::CacheOnly) => (None, hop),
            Ok(RelayPlan::FetchOnBehalf { next_hop }) => (origin, next_hop),
            Err(decline) => {
                tracing::debug!(block = %key, %decline, "relay declined");
                return self.reply(StatusCode::NOT_FOUND, &format!("dart: declined: {decline}"));
            }
        };
        let mut read =
            self.node.engine.lock().expect("engine lock").begin_relay(key, url, next_hop);
        let mut head = None;
        let mut data = BytesMut::new();
        loop {
            match self.node.next(&mut read).await {
                Outward::Respond(h) => head = Some(h),
                Outward::Emit(b) => data.extend_from_slice(&b),
                Outward::Finish => break,
                Outward::Fail(f) => {
                    let status =
                        StatusCode::from_u16(f.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    let mut r = self.reply(status, &format!("dart: {}", f.error));
                    if let Some(up) = f.upstream_status {
                        r.headers_mut().insert(HEADER_UPSTREAM_STATUS, HeaderValue::from(up));
                    }
                    return r;
                }
                Outward::Passthrough(_) => unreachable!("relays never proxy"),
            }
        }
        let head = head.expect("a finished relay sent its head");
        debug_assert_eq!(head.content_length, data.len() as u64);
        let mut r = Response::new(body::full(data.freeze()));
        r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(head.content_length));
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
        self.name(&mut r);
        r
    }
}

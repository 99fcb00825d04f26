//! The soak's origin: several generated objects on loopback, each a pure function of its seed
//! and offset, so every byte a client receives is checked against the generator.

use bytes::Bytes;
use dart_core::codec::range::{content_range_header, resolve_range, RangeOutcome};
use dart_net_tokio::body::{self, ResponseBody};
use dart_net_tokio::server::{serve, ServeOptions};
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_RANGE, ETAG, RANGE};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One generated object.
#[derive(Clone, Debug)]
pub struct Object {
    pub path: String,
    pub seed: u64,
    pub size: u64,
}

/// Writes bytes `start..start + out.len()` of object `seed` into `out`: the same bytes as
/// `dart_net_tokio::origin_server::byte_at`, one hash per 8 bytes instead of one per byte.
pub fn fill(seed: u64, start: u64, out: &mut [u8]) {
    let mut offset = start;
    let mut i = 0;
    while i < out.len() {
        let word = dart_core::hash::fmix64(seed ^ (offset / 8).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let bytes = word.to_le_bytes();
        let from = (offset % 8) as usize;
        let n = (8 - from).min(out.len() - i);
        out[i..i + n].copy_from_slice(&bytes[from..from + n]);
        i += n;
        offset += n as u64;
    }
}

/// Counters of what the origin served.
#[derive(Default)]
pub struct OriginStats {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
}

/// Starts the origin on an ephemeral loopback port; it serves until the process ends.
pub async fn start(objects: Vec<Object>) -> std::io::Result<(SocketAddr, Arc<OriginStats>)> {
    use dart_net_tokio::seam::{Seam as _, TokioSeam};
    let listener = TokioSeam.bind("127.0.0.1:0".parse().expect("addr")).await?;
    let addr = dart_net_tokio::seam::Listener::local_addr(&listener)?;
    let stats = Arc::new(OriginStats::default());
    let objects = Arc::new(objects);
    let s = stats.clone();
    let handler = move |req: Request<Incoming>| {
        let (objects, stats) = (objects.clone(), s.clone());
        async move { respond(&objects, &stats, &req) }
    };
    tokio::spawn(serve(listener, handler, std::future::pending(), ServeOptions::default()));
    Ok((addr, stats))
}

fn status_only(status: StatusCode) -> Response<ResponseBody> {
    let mut r = Response::new(body::empty());
    *r.status_mut() = status;
    r
}

fn respond(
    objects: &[Object],
    stats: &OriginStats,
    req: &Request<Incoming>,
) -> Response<ResponseBody> {
    stats.requests.fetch_add(1, Ordering::Relaxed);
    let Some((index, o)) = objects.iter().enumerate().find(|(_, o)| o.path == req.uri().path())
    else {
        return status_only(StatusCode::NOT_FOUND);
    };
    let range = req.headers().get(RANGE).map(HeaderValue::as_bytes);
    let (status, start, len) = match resolve_range(range, o.size) {
        Ok(RangeOutcome::Whole) => (StatusCode::OK, 0, o.size),
        Ok(RangeOutcome::Partial { start, end }) => {
            (StatusCode::PARTIAL_CONTENT, start, end - start + 1)
        }
        Err(_) => {
            let mut r = status_only(StatusCode::RANGE_NOT_SATISFIABLE);
            let cr = HeaderValue::try_from(format!("bytes */{}", o.size)).expect("ascii");
            r.headers_mut().insert(CONTENT_RANGE, cr);
            return r;
        }
    };
    let mut data = vec![0u8; if req.method() == http::Method::HEAD { 0 } else { len as usize }];
    fill(o.seed, start, &mut data);
    stats.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
    let mut r = Response::new(body::full(Bytes::from(data)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(ETAG, HeaderValue::try_from(format!("\"soak-{index}\"")).expect("ascii"));
    if status == StatusCode::PARTIAL_CONTENT {
        let cr = content_range_header(start, start + len - 1, o.size);
        h.insert(CONTENT_RANGE, HeaderValue::try_from(cr).expect("ascii"));
    }
    r
}

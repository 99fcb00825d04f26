//! Response bodies: fixed bytes, a bounded channel the read task streams into, or a proxied
//! origin body.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// Boxed error of a response body.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;
/// The body type of every response the shell sends.
pub type ResponseBody = BoxBody<Bytes, BodyError>;

/// A body of fixed bytes.
pub fn full(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// An empty body.
pub fn empty() -> ResponseBody {
    full(Bytes::new())
}

/// A plain-text response of `status` with `message`.
pub fn plain(status: u16, message: &str) -> hyper::Response<ResponseBody> {
    let mut r = hyper::Response::new(full(format!("{message}\n")));
    *r.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A body fed through a bounded channel; an `Err` item aborts the response (truncation).
pub struct ChannelBody {
    rx: mpsc::Receiver<Result<Bytes, BodyError>>,
    remaining: u64,
}

impl ChannelBody {
    /// A channel body of exactly `len` bytes (what `Content-Length` announces) and its sender.
    pub fn channel(
        len: u64,
        depth: usize,
    ) -> (mpsc::Sender<Result<Bytes, BodyError>>, ResponseBody) {
        let (tx, rx) = mpsc::channel(depth);
        (tx, ChannelBody { rx, remaining: len }.boxed())
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => {
                self.remaining = self.remaining.saturating_sub(b.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(Some(Err("response body ended early".into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

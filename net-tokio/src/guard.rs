//! Per-connection bounds of the accept loop: every accepted stream is wrapped in a
//! [`GuardedIo`] (write progress), served with a [`HeadTimer`] (request-head and keep-alive
//! idle bounds; an idle wait also ends when the listener's [`Reclaim`] needs the slot), and can
//! be ended at once through its [`ConnectionAbort`].
//!
//! These act in the transport, before and around the node: the node's own write-stall timer
//! (`Bounds::write_stall`) gives up block reads whose requester stops reading, and the
//! connection's [`ConnectionAbort`] carries that decision to the socket even while hyper is
//! blocked on a full socket and never polls the body again. Bodies the node does not see
//! (passthrough pipes, admin answers) are bounded by [`GuardedIo`]'s write-progress bound.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// Ends one connection at once, whatever it is doing (the node aborted its response).
///
/// The accept loop puts one in every request's extensions; the driver fires it on the node's
/// `Output::Abort`.
#[derive(Clone, Debug, Default)]
pub struct ConnectionAbort(Arc<Notify>);

impl ConnectionAbort {
    /// Closes the connection: its task drops the socket and every buffer it holds.
    pub fn abort(&self) {
        self.0.notify_one();
    }

    /// Resolves once [`abort`](Self::abort) was called (before or after this call).
    pub async fn aborted(&self) {
        self.0.notified().await;
    }
}

/// What the stream wrapper and the head timer of one connection share.
#[derive(Debug, Default)]
struct Shared {
    /// Bytes read from the client so far.
    bytes_read: AtomicU64,
    /// Request heads hyper has started to wait for.
    heads: AtomicU64,
    /// Stream offset just past the last `\r\n\r\n` read: bytes read beyond it belong to a
    /// head that has not ended (or to a request body, which our GET/HEAD listeners do not
    /// expect). A keep-alive wait that starts with such bytes already read is a head wait.
    head_end: AtomicU64,
}

/// An accepted stream with a write-progress bound: a write, flush or shutdown that makes no
/// progress for `write_progress` fails with `TimedOut`, which ends the connection (hyper drops
/// it, and with it the response body and whatever that body held).
pub struct GuardedIo<S> {
    inner: S,
    shared: Arc<Shared>,
    write_progress: Duration,
    /// Armed while a write is blocked; reset by any progress.
    stall: Option<Pin<Box<tokio::time::Sleep>>>,
    stalled: bool,
    /// How much of `\r\n\r\n` the bytes read so far end with (0..=3).
    terminator: u8,
}

/// Asks idle keep-alive connections of one listener to close: the accept loop, at its
/// connection limit with a connection accepted and waiting, wakes one (the longest waiting)
/// so that a client with a request goes before a client with none. With none idle, the next
/// connection to go idle closes (one pick is kept, never more).
#[derive(Clone, Debug, Default)]
pub struct Reclaim(Arc<Notify>);

impl Reclaim {
    /// Closes one idle keep-alive connection, now or as soon as one goes idle.
    pub fn one(&self) {
        self.0.notify_one();
    }

    fn waiter(&self) -> Pin<Box<OwnedNotified>> {
        let mut notified = Box::pin(self.0.clone().notified_owned());
        // Registered from now on, not only from its first poll (notify_one would skip it).
        notified.as_mut().enable();
        notified
    }
}

impl<S> GuardedIo<S> {
    /// Wraps `inner`; returns the stream and the head timer hyper must use for it. Idle waits
    /// for a next request end early when `reclaim` asks.
    pub fn new(
        inner: S,
        write_progress: Duration,
        head: Duration,
        idle: Duration,
        reclaim: Reclaim,
    ) -> (Self, HeadTimer) {
        assert!(!write_progress.is_zero() && !head.is_zero() && !idle.is_zero());
        let shared = Arc::new(Shared::default());
        let timer = HeadTimer { shared: shared.clone(), head, idle, reclaim };
        let io =
            GuardedIo { inner, shared, write_progress, stall: None, stalled: false, terminator: 0 };
        (io, timer)
    }

    /// A write made progress: the bound starts over at the next blocked write.
    fn progressed(&mut self) {
        self.stalled = false;
    }

    /// A write is blocked: arms the bound if it is not running, and fails once it passed.
    fn blocked(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let deadline = tokio::time::Instant::now() + self.write_progress;
        if !self.stalled {
            self.stalled = true;
            match &mut self.stall {
                Some(sleep) => sleep.as_mut().reset(deadline),
                None => self.stall = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let sleep = self.stall.as_mut().expect("armed above");
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took no bytes for {:?}", self.write_progress),
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    fn guard<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => match self.blocked(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
            ready => {
                self.progressed();
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for GuardedIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let fresh = &buf.filled()[before.min(buf.filled().len())..];
        let start = self.shared.bytes_read.load(Ordering::Relaxed);
        let mut matched = self.terminator;
        let mut end = None;
        for (i, &b) in fresh.iter().enumerate() {
            // 0: nothing, 1: "\r", 2: "\r\n", 3: "\r\n\r" matched so far.
            matched = match (matched, b) {
                (2, b'\r') => 3,
                (_, b'\r') => 1,
                (1, b'\n') => 2,
                (3, b'\n') => {
                    end = Some(start + i as u64 + 1);
                    0
                }
                _ => 0,
            };
        }
        self.terminator = matched;
        if let Some(end) = end {
            self.shared.head_end.store(end, Ordering::Relaxed);
        }
        self.shared.bytes_read.fetch_add(fresh.len() as u64, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GuardedIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.guard(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.guard(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.guard(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.guard(cx, polled)
    }
}

/// hyper's timer for one connection, which hyper uses only for its request-head read timeout.
///
/// hyper arms that timeout whenever it starts waiting for a request head: on a new connection
/// and again each time a keep-alive connection goes idle after a response. Alone it would
/// close an idle keep-alive connection after the head bound. This timer gives the first head
/// of a connection the head bound from the moment hyper waits for it (a client that connects
/// and sends nothing, or trickles, is closed by it), and every later head the idle bound until
/// its first byte arrives, then the head bound from that byte (Go's `IdleTimeout` and
/// `ReadHeaderTimeout`). An idle wait also ends, closing the connection, when the listener's
/// [`Reclaim`] picks it.
#[derive(Clone, Debug)]
pub struct HeadTimer {
    shared: Arc<Shared>,
    head: Duration,
    idle: Duration,
    reclaim: Reclaim,
}

impl HeadTimer {
    fn arm(&self, sleep: &mut HeadSleep) {
        let first = self.shared.heads.fetch_add(1, Ordering::Relaxed) == 0;
        let now = tokio::time::Instant::now();
        let read = self.shared.bytes_read.load(Ordering::Relaxed);
        // Bytes of the next head may have come with the request just answered (pipelined):
        // its head bound runs from now, not the idle bound until a byte that already came.
        let started = read > self.shared.head_end.load(Ordering::Relaxed);
        let head_wait = first || started;
        sleep.read_mark = read;
        sleep.waiting_for_first_byte = !head_wait;
        sleep.reclaimed = if head_wait { None } else { Some(self.reclaim.waiter()) };
        let bound = if head_wait { self.head } else { self.idle };
        sleep.inner.as_mut().reset(now + bound);
    }

    fn new_sleep(&self) -> HeadSleep {
        let mut sleep = HeadSleep {
            shared: self.shared.clone(),
            head: self.head,
            read_mark: 0,
            waiting_for_first_byte: false,
            reclaimed: None,
            inner: Box::pin(tokio::time::sleep(self.head)),
        };
        self.arm(&mut sleep);
        sleep
    }
}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        // Not used by an HTTP/1 server; a plain sleep if a future hyper does.
        Box::pin(PlainSleep(Box::pin(tokio::time::sleep(duration))))
    }

    fn sleep_until(&self, _deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        // hyper asks for now + the head bound: a head wait starts.
        Box::pin(self.new_sleep())
    }

    // The conversions between std's and tokio's `Instant` are identities under madsim, where
    // tokio's is std's (virtual there).
    #[allow(clippy::useless_conversion)]
    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        if let Some(s) = sleep.as_mut().downcast_mut_pin::<HeadSleep>() {
            self.arm(Pin::into_inner(s));
        } else if let Some(s) = sleep.as_mut().downcast_mut_pin::<PlainSleep>() {
            Pin::into_inner(s).0.as_mut().reset(new_deadline.into());
        }
    }

    #[allow(clippy::useless_conversion)]
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into()
    }
}

/// One wait for a request head; see [`HeadTimer`].
struct HeadSleep {
    shared: Arc<Shared>,
    head: Duration,
    read_mark: u64,
    waiting_for_first_byte: bool,
    /// While idle: fires when the listener reclaims this connection.
    reclaimed: Option<Pin<Box<OwnedNotified>>>,
    inner: Pin<Box<tokio::time::Sleep>>,
}

impl Future for HeadSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // hyper polls this whenever bytes arrive and the head is still incomplete, so the first
        // byte after an idle wait is seen as it lands.
        if self.waiting_for_first_byte
            && self.shared.bytes_read.load(Ordering::Relaxed) > self.read_mark
        {
            self.waiting_for_first_byte = false;
            // A request is coming: no longer idle (a pick it had goes on to the next waiter).
            self.reclaimed = None;
            let deadline = tokio::time::Instant::now() + self.head;
            self.inner.as_mut().reset(deadline);
        }
        if let Some(reclaimed) = &mut self.reclaimed {
            if reclaimed.as_mut().poll(cx).is_ready() {
                tracing::debug!("idle keep-alive connection closed to make room");
                return Poll::Ready(());
            }
        }
        self.inner.as_mut().poll(cx)
    }
}

impl hyper::rt::Sleep for HeadSleep {}

struct PlainSleep(Pin<Box<tokio::time::Sleep>>);

impl Future for PlainSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

impl hyper::rt::Sleep for PlainSleep {}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A disk-tier answer from an arena file's mapping is written to the client's socket as a
    /// copy taken at the write: once the write returned (and the answer's pin may go), rewriting
    /// those file bytes (a new block in the same slot) must not change what the client reads from
    /// its socket later. A `sendfile` of the mapped bytes fails this (the socket keeps references
    /// to the page cache's pages until the reader takes them): it served wrong bytes in the soak.
    #[tokio::test]
    async fn bytes_written_from_a_mapping_are_the_bytes_at_write_time() {
        let (dir, file) = crate::mapped::temp_file("write-time");
        let len = 1usize << 20;
        let old: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        file.write_all_at(&old, 0).expect("write");
        let mapping = crate::mapped::Mapping::map(&file, len as u64).expect("map");
        let body = &mapping.slice(4096, 256 << 10);

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let second = Duration::from_secs(10);
        let (mut io, _timer) = GuardedIo::new(server, second, second, second, Reclaim::default());
        // As hyper writes a body: vectored.
        let mut rest: &[u8] = body;
        while !rest.is_empty() {
            let n = io.write_vectored(&[std::io::IoSlice::new(rest)]).await.expect("write");
            rest = &rest[n..];
        }
        io.flush().await.expect("flush");
        // The slot is rewritten after the write returned, before the client reads a byte.
        file.write_all_at(&vec![0xEE; len], 0).expect("rewrite");
        io.shutdown().await.expect("shutdown");
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.expect("read");
        assert_eq!(got.len(), 256 << 10);
        assert!(got[..] == old[4096..4096 + (256 << 10)], "the bytes at the time of the write");
        drop(mapping);
        std::fs::remove_dir_all(dir).expect("clean up");
    }
}

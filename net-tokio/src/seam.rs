//! The seam between the shell and its network: listeners that accept byte streams and dialers
//! that open them, so the same servers and clients run on real tokio sockets and inside turmoil
//! and madsim simulated networks.
//!
//! Timers and tasks use tokio's (`tokio::time`, `tokio::spawn`), which turmoil virtualises; the
//! core's notion of time comes from [`ShellClock`], which reads tokio's clock, never std's.
//!
//! Under madsim (`--cfg madsim`) `tokio` is madsim's runtime (the workspace depends on tokio
//! through `madsim-tokio`), so [`TokioSeam`] itself is the simulated network. What madsim lacks
//! is bridged here and nowhere else: listen options ([`TokioSeam`]'s bind), handing a worker off
//! for a disk read (`block_in_place`), `JoinSet` ([`TaskSet`]) and the stop signals
//! ([`shutdown_signal`]: madsim has Ctrl-C only).

use dart_core::policy::{Refusal, UpstreamPolicy};
use dart_core::time::Instant as CoreInstant;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A byte stream the shell can serve or speak HTTP over.
pub trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// Accepts inbound streams.
pub trait Listener: Send + 'static {
    /// The accepted stream type.
    type Io: Stream;
    /// Waits for the next connection.
    fn accept(&mut self) -> impl Future<Output = io::Result<(Self::Io, SocketAddr)>> + Send;
    /// The bound address.
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

/// Opens outbound streams to `host:port`.
///
/// A dial the upstream policy governs (origin fetches) resolves the host with
/// [`resolve`](Self::resolve), has the policy judge every address, and connects to an admitted
/// one with [`dial_addr`](Self::dial_addr), so what is checked is what is connected to (a name
/// cannot rebind between the two). Other dials (peers) use [`dial`](Self::dial).
pub trait Dialer: Clone + Send + Sync + 'static {
    /// The dialed stream type.
    type Io: Stream;
    /// Connects; the caller bounds it with the dial timeout.
    fn dial(&self, host: &str, port: u16) -> impl Future<Output = io::Result<Self::Io>> + Send;

    /// The addresses `host` resolves to, with `port`. The default resolves literal addresses
    /// only (a name is "not found"): dialers that resolve names override it.
    fn resolve(
        &self,
        host: &str,
        port: u16,
    ) -> impl Future<Output = io::Result<Vec<SocketAddr>>> + Send {
        let parsed = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>();
        let host = host.to_owned();
        async move {
            match parsed {
                Ok(ip) => Ok(vec![SocketAddr::new(ip, port)]),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("this dialer resolves no names ({host})"),
                )),
            }
        }
    }

    /// Connects to one resolved address. The default dials its textual form.
    fn dial_addr(&self, addr: SocketAddr) -> impl Future<Output = io::Result<Self::Io>> + Send {
        let host = addr.ip().to_string();
        async move { self.dial(&host, addr.port()).await }
    }
}

/// Dials `host:port` under `policy` (when given): resolves, refuses the addresses the policy
/// refuses, and connects to the admitted ones in order until one answers. With no admitted
/// address nothing is connected and the first refusal is returned.
pub async fn dial_checked<D: Dialer>(
    dialer: &D,
    host: &str,
    port: u16,
    policy: Option<&UpstreamPolicy>,
) -> Result<D::Io, DialError> {
    let Some(policy) = policy else { return Ok(dialer.dial(host, port).await?) };
    let addrs = dialer.resolve(host, port).await?;
    let mut refusal = None;
    let mut last_error = None;
    for addr in addrs {
        if let Err(r) = policy.check_addr(host, addr) {
            refusal.get_or_insert(r);
            continue;
        }
        match dialer.dial_addr(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last_error = Some(e),
        }
    }
    match (last_error, refusal) {
        (Some(e), _) => Err(DialError::Io(e)),
        (None, Some(r)) => Err(DialError::Refused(r)),
        (None, None) => Err(DialError::Io(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{host} resolved to no address"),
        ))),
    }
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept(&mut self) -> io::Result<(Self::Io, SocketAddr)> {
        let (s, a) = tokio::net::TcpListener::accept(self).await?;
        s.set_nodelay(true)?;
        Ok((s, a))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        tokio::net::TcpListener::local_addr(self)
    }
}

/// Real TCP via tokio.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioDialer;

impl Dialer for TokioDialer {
    type Io = tokio::net::TcpStream;

    async fn dial(&self, host: &str, port: u16) -> io::Result<Self::Io> {
        let s = tokio::net::TcpStream::connect((host, port)).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }

    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Ok(tokio::net::lookup_host((host, port)).await?.collect())
    }

    async fn dial_addr(&self, addr: SocketAddr) -> io::Result<Self::Io> {
        let s = tokio::net::TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }
}

/// A dialed stream, wrapped so hyper-util's pool can use it (the orphan rule needs a newtype).
#[derive(Debug)]
pub struct SeamStream<S>(pub S);

impl<S: AsyncRead + Unpin> AsyncRead for SeamStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SeamStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S> Connection for SeamStream<S> {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// Why a dial failed; the peer client classifies `Dial` as a hard failure.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The URI had no host.
    #[error("uri has no host")]
    NoHost,
    /// Connecting failed.
    #[error("dial failed: {0}")]
    Io(#[from] io::Error),
    /// Connecting did not finish within the dial bound.
    #[error("dial timed out after {0:?}")]
    Timeout(Duration),
    /// An `https://` URI on a connector without TLS (the peer plane is plaintext by design).
    #[error("https is not enabled on this connector")]
    NoTls,
    /// The host is not a valid TLS server name.
    #[error("invalid TLS server name {0:?}")]
    BadServerName(String),
    /// The upstream policy refused every address the host resolved to; nothing was connected.
    #[error("refused by the upstream policy: {}", .0.explain())]
    Refused(Refusal),
}

/// A dialed stream, plain or wrapped in TLS (for `https://` origins).
#[derive(Debug)]
pub enum MaybeTls<S> {
    /// Plaintext.
    Plain(S),
    /// TLS over the stream.
    Tls(Box<tokio_rustls::client::TlsStream<S>>),
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for MaybeTls<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for MaybeTls<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A TLS client configuration trusting the Mozilla root set (webpki-roots) plus `extra_roots`
/// (DER certificates of private CAs), HTTP/1.1 only.
pub fn tls_client_config(
    extra_roots: &[rustls::pki_types::CertificateDer<'static>],
) -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for cert in extra_roots {
        roots.add(cert.clone())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A hyper-util connector over a [`Dialer`], bounding every dial (TLS handshake included) and
/// speaking TLS to `https://` URIs when it has a TLS configuration.
#[derive(Clone)]
pub struct SeamConnector<D> {
    dialer: D,
    dial_timeout: Duration,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl<D: std::fmt::Debug> std::fmt::Debug for SeamConnector<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeamConnector")
            .field("dialer", &self.dialer)
            .field("dial_timeout", &self.dial_timeout)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl<D: Dialer> SeamConnector<D> {
    /// A plaintext connector whose dials give up after `dial_timeout`.
    pub fn new(dialer: D, dial_timeout: Duration) -> Self {
        SeamConnector { dialer, dial_timeout, tls: None }
    }

    /// A connector that also speaks TLS to `https://` URIs with `config`.
    pub fn with_tls(dialer: D, dial_timeout: Duration, config: Arc<rustls::ClientConfig>) -> Self {
        SeamConnector { dialer, dial_timeout, tls: Some(tokio_rustls::TlsConnector::from(config)) }
    }
}

/// Dials `host:port` through `dialer` (under `policy` when given, see [`dial_checked`]),
/// wrapping the stream in TLS when `https` (with `tls`). Unbounded: callers bound it (the node's
/// dial timer, or [`SeamConnector`]'s dial timeout).
pub async fn dial_maybe_tls<D: Dialer>(
    dialer: &D,
    tls: Option<&tokio_rustls::TlsConnector>,
    host: &str,
    port: u16,
    https: bool,
    policy: Option<&UpstreamPolicy>,
) -> Result<MaybeTls<D::Io>, DialError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let stream = dial_checked(dialer, host, port, policy).await?;
    if !https {
        return Ok(MaybeTls::Plain(stream));
    }
    let tls = tls.ok_or(DialError::NoTls)?;
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|_| DialError::BadServerName(host.to_owned()))?;
    let stream = tls.connect(name, stream).await?;
    Ok(MaybeTls::Tls(Box::new(stream)))
}

impl<D: Dialer> tower_service::Service<http::Uri> for SeamConnector<D> {
    type Response = TokioIo<SeamStream<MaybeTls<D::Io>>>;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, DialError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let dialer = self.dialer.clone();
        let bound = self.dial_timeout;
        let tls = self.tls.clone();
        Box::pin(async move {
            let host = uri.host().ok_or(DialError::NoHost)?.to_owned();
            let https = uri.scheme_str() == Some("https");
            let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
            let connect = dial_maybe_tls(&dialer, tls.as_ref(), &host, port, https, None);
            match tokio::time::timeout(bound, connect).await {
                Ok(Ok(s)) => Ok(TokioIo::new(SeamStream(s))),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(DialError::Timeout(bound)),
            }
        })
    }
}

/// Everything the node needs from its world besides the core: listeners, a dialer, and whether
/// the wall clock may be read (it may not in simulations). Time comes from tokio's clock, which
/// turmoil virtualises. `node::start_on` is generic over it, so the real wiring runs on tokio
/// sockets and inside turmoil.
pub trait Seam: Clone + Send + Sync + 'static {
    /// Accepted streams.
    type Listener: Listener;
    /// Dialed streams.
    type Dialer: Dialer;
    /// Binds a listener on `addr`.
    fn bind(&self, addr: SocketAddr) -> impl Future<Output = io::Result<Self::Listener>> + Send;
    /// The dialer (name resolution included: simulated worlds resolve their own names).
    fn dialer(&self) -> Self::Dialer;
    /// Whether responses may carry a wall-clock `Date` header.
    fn wall_clock(&self) -> bool {
        true
    }
}

/// Connections a listener's kernel queue holds while the accept loop is at its connection limit
/// (the kernel caps it at `net.core.somaxconn`, 4096 on current Linux, which is what Go's
/// listeners ask for). Past it the kernel drops SYNs and clients retry after a second:
/// std's and tokio's default of 128 overflows under a burst of a few hundred connections.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Real sockets on tokio.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioSeam;

impl Seam for TokioSeam {
    type Listener = tokio::net::TcpListener;
    type Dialer = TokioDialer;

    async fn bind(&self, addr: SocketAddr) -> io::Result<Self::Listener> {
        listen_tcp(addr).await
    }

    fn dialer(&self) -> TokioDialer {
        TokioDialer
    }
}

/// Maps tokio's clock (virtual under turmoil) onto the core's [`CoreInstant`].
#[derive(Clone, Copy, Debug)]
pub struct ShellClock {
    origin: tokio::time::Instant,
}

impl ShellClock {
    /// A clock whose origin is now. Must be called inside a tokio runtime.
    pub fn start() -> Self {
        ShellClock { origin: tokio::time::Instant::now() }
    }

    /// The current time for the core.
    pub fn now(&self) -> CoreInstant {
        let nanos = tokio::time::Instant::now().saturating_duration_since(self.origin).as_nanos();
        CoreInstant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The tokio instant of a core instant (for sleeping until a core deadline).
    pub fn to_tokio(&self, at: CoreInstant) -> tokio::time::Instant {
        let far = Duration::from_secs(100 * 365 * 86_400);
        let d = Duration::from_nanos(at.as_nanos()).min(far);
        self.origin.checked_add(d).unwrap_or_else(|| self.origin + Duration::from_secs(86_400))
    }
}

/// Resolves at the process's stop signal: SIGTERM or Ctrl-C (SIGINT); madsim simulates Ctrl-C
/// only.
pub async fn shutdown_signal() {
    #[cfg(all(unix, not(madsim)))]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(any(not(unix), madsim))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Binds a listening TCP socket. On real tokio it sets `SO_REUSEADDR` and asks for
/// [`LISTEN_BACKLOG`]; madsim's simulated sockets have neither option (the one place the two
/// builds differ in socket set-up).
#[cfg(not(madsim))]
async fn listen_tcp(addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

#[cfg(madsim)]
async fn listen_tcp(addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Runs a blocking call (a disk read) in the task that needs its result, with the worker thread
/// handed off, where the runtime can do that (tokio's multi-thread runtime). Elsewhere (tokio's
/// current-thread runtime, turmoil, madsim) it gives the call back, for the caller to offload
/// with `spawn_blocking`.
#[cfg(not(madsim))]
pub(crate) fn block_in_place<R, F: FnOnce() -> R>(
    rt: &tokio::runtime::Handle,
    call: F,
) -> Result<R, F> {
    if rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
        Ok(tokio::task::block_in_place(call))
    } else {
        Err(call)
    }
}

#[cfg(madsim)]
pub(crate) fn block_in_place<R, F: FnOnce() -> R>(
    _rt: &tokio::runtime::Handle,
    call: F,
) -> Result<R, F> {
    Err(call)
}

/// The tasks a server spawned, so that a drain can abort those still running: tokio's `JoinSet`
/// reduced to what [`crate::server::serve`] uses, built on `tokio::spawn` and abort handles only,
/// so it runs the same on tokio, turmoil and madsim (madsim has no `JoinSet`).
pub struct TaskSet {
    live: std::collections::BTreeMap<u64, tokio::task::AbortHandle>,
    next: u64,
    done_tx: tokio::sync::mpsc::UnboundedSender<u64>,
    done_rx: tokio::sync::mpsc::UnboundedReceiver<u64>,
}

impl Drop for TaskSet {
    /// Like `JoinSet`: the tasks of a set that goes away are aborted.
    fn drop(&mut self) {
        self.abort_all();
    }
}

/// Reports its task's end when the task's future is dropped: finished or aborted alike.
struct TaskDone {
    id: u64,
    tx: tokio::sync::mpsc::UnboundedSender<u64>,
}

impl Drop for TaskDone {
    fn drop(&mut self) {
        let _ = self.tx.send(self.id);
    }
}

impl Default for TaskSet {
    fn default() -> Self {
        let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel();
        TaskSet { live: Default::default(), next: 0, done_tx, done_rx }
    }
}

impl TaskSet {
    /// Spawns `task` on the current runtime.
    pub fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        let id = self.next;
        self.next += 1;
        let done = TaskDone { id, tx: self.done_tx.clone() };
        let handle = tokio::spawn(async move {
            let _done = done;
            task.await;
        });
        self.live.insert(id, handle.abort_handle());
    }

    /// Forgets one task that has ended, if any has.
    pub fn try_join_next(&mut self) -> Option<()> {
        let id = self.done_rx.try_recv().ok()?;
        self.live.remove(&id);
        Some(())
    }

    /// Waits for one task to end; `None` at once when none is running.
    pub async fn join_next(&mut self) -> Option<()> {
        while !self.live.is_empty() {
            let id = self.done_rx.recv().await?;
            if self.live.remove(&id).is_some() {
                return Some(());
            }
        }
        None
    }

    /// Tasks spawned and not yet seen to end.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no task is running.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Asks every running task to stop; each is seen to end by [`join_next`](Self::join_next).
    pub fn abort_all(&self) {
        for handle in self.live.values() {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TaskSet;

    #[tokio::test]
    async fn a_task_set_sees_ends_aborts_the_rest_and_aborts_on_drop() {
        let mut set = TaskSet::default();
        assert!(set.join_next().await.is_none(), "an empty set has nothing to wait for");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        set.spawn(async {});
        set.spawn(async move {
            let _ = rx.await;
        });
        set.spawn(std::future::pending());
        assert_eq!(set.len(), 3);
        assert!(set.join_next().await.is_some(), "the task that ends at once is seen to end");
        assert_eq!(set.len(), 2);
        tx.send(()).expect("the second task waits");
        assert!(set.join_next().await.is_some());
        assert!(set.try_join_next().is_none(), "the pending task has not ended");
        set.abort_all();
        assert!(set.join_next().await.is_some(), "an aborted task is seen to end");
        assert!(set.is_empty());
        assert!(set.join_next().await.is_none());

        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut dropped = TaskSet::default();
        dropped.spawn(async move {
            let _keep = tx;
            std::future::pending::<()>().await;
        });
        drop(dropped);
        assert!(rx.await.is_err(), "dropping the set aborted its task (its sender went away)");
    }
}

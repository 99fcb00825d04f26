//! The accept loop under descriptor exhaustion: a listener whose accepts fail with `EMFILE`
//! (as a process out of descriptors sees) recovers as soon as they succeed again.

use dart_net_tokio::body;
use dart_net_tokio::seam::Listener;
use dart_net_tokio::server::{serve, ServeOptions, ACCEPT_BACKOFF_MAX};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

/// A TCP listener whose accepts fail with `EMFILE` while `storm` is on, without taking the
/// pending connection off the backlog (as the kernel does).
struct Exhausted {
    inner: tokio::net::TcpListener,
    storm: Arc<AtomicBool>,
    failures: Arc<AtomicU64>,
    failed: Arc<Notify>,
}

impl Listener for Exhausted {
    type Io = tokio::net::TcpStream;

    async fn accept(&mut self) -> io::Result<(Self::Io, SocketAddr)> {
        if self.storm.load(Ordering::SeqCst) {
            self.failures.fetch_add(1, Ordering::SeqCst);
            self.failed.notify_one();
            return Err(io::Error::from_raw_os_error(24));
        }
        self.inner.accept().await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepting_resumes_at_once_when_descriptors_free_after_a_storm_of_emfile() {
    let inner = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = inner.local_addr().expect("addr");
    let storm = Arc::new(AtomicBool::new(true));
    let failures = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(Notify::new());
    let listener = Exhausted {
        inner,
        storm: storm.clone(),
        failures: failures.clone(),
        failed: failed.clone(),
    };
    let handler = |_req| async { body::plain(200, "ok") };
    tokio::spawn(serve(listener, handler, std::future::pending(), ServeOptions::default()));

    // A client arrives during the storm and waits in the backlog.
    let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .expect("send");
    while failures.load(Ordering::SeqCst) < 20 {
        failed.notified().await;
    }
    // The storm passes: descriptors are free again.
    storm.store(false, Ordering::SeqCst);
    let t0 = Instant::now();
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.expect("answer");
    let waited = t0.elapsed();
    let n = failures.load(Ordering::SeqCst);
    println!("emfile: {n} failed accepts; the waiting client was answered {waited:?} after");
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&answer));
    assert!(waited < ACCEPT_BACKOFF_MAX + Duration::from_millis(200), "waited {waited:?}");
}

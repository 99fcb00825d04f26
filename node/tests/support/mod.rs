//! Helpers shared by the node's integration tests (each test binary uses a subset).
#![allow(dead_code)]

use dart_net_tokio::origin_server::{serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::server::ServeOptions;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh, empty directory named after the test binary, the test and the process.
pub fn temp_dir(suite: &str, name: &str) -> TempDir {
    let p = std::env::temp_dir().join(format!("dart-{suite}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    TempDir(p)
}

/// A generated-object origin on loopback, stopped when dropped.
pub struct Origin {
    /// Its address.
    pub addr: SocketAddr,
    /// What it served.
    pub stats: Arc<OriginStats>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Starts an origin serving object `seed` of `size` bytes with `behaviour`.
pub async fn origin(seed: u64, behaviour: Behaviour, size: u64) -> Origin {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
    let addr = l.local_addr().expect("addr");
    let stats = Arc::new(OriginStats::default());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let object = OriginObject { seed, size, behaviour };
    let stop = async {
        let _ = rx.await;
    };
    tokio::spawn(serve_origin(l, object, stats.clone(), stop, ServeOptions::default()));
    Origin { addr, stats, _stop: tx }
}

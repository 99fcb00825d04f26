//! `https://` origins: a node reads through TLS from an origin whose certificate is signed by a
//! private CA given with `--origin-ca-file`, and refuses one it cannot verify.

use bytes::Bytes;
use dart_net_tokio::origin_server::{generate, serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::seam::{Dialer, Listener, Seam, SeamConnector, TokioDialer};
use dart_net_tokio::server::ServeOptions;
use dart_node::cli::NodeFlags;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

mod support;
use support::TempDir;

const SEED: u64 = 11;
const SIZE: u64 = 3 * (64 << 10) + 5;

/// Accepts TCP, then completes a TLS handshake before handing the stream to the server.
struct TlsListener {
    inner: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

    async fn accept(&mut self) -> std::io::Result<(Self::Io, SocketAddr)> {
        loop {
            let (tcp, addr) = self.inner.accept().await?;
            // A failed handshake (a client that does not trust us) must not stop the server.
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return Ok((tls, addr));
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

struct TlsOrigin {
    port: u16,
    ca_pem: String,
    stats: Arc<OriginStats>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn tls_origin() -> TlsOrigin {
    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
    let cert_der = key.cert.der().clone();
    let key_der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert_der], key_der)
        .expect("server config");
    let inner = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = inner.local_addr().expect("addr").port();
    let listener =
        TlsListener { inner, acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)) };
    let stats = Arc::new(OriginStats::default());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let object = OriginObject { seed: SEED, size: SIZE, behaviour: Behaviour::Honours };
    let stop = async {
        let _ = rx.await;
    };
    tokio::spawn(serve_origin(listener, object, stats.clone(), stop, ServeOptions::default()));
    TlsOrigin { port, ca_pem: key.cert.pem(), stats, _stop: tx }
}

/// Real sockets with an injected name table: `localhost` is 127.0.0.1 and no other name
/// resolves, so no test asks the system's resolver.
#[derive(Clone, Copy, Debug, Default)]
struct NamedSeam;

#[derive(Clone, Copy, Debug, Default)]
struct NamedDialer;

impl Dialer for NamedDialer {
    type Io = tokio::net::TcpStream;

    async fn dial(&self, host: &str, port: u16) -> std::io::Result<Self::Io> {
        let ip: std::net::IpAddr = match host {
            "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
            other => other.parse().map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::NotFound, format!("no such host {other}"))
            })?,
        };
        tokio::net::TcpStream::connect((ip, port)).await
    }

    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<std::net::SocketAddr>> {
        match host {
            "localhost" => Ok(vec![(std::net::Ipv4Addr::LOCALHOST, port).into()]),
            other => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no such host {other}"),
            )),
        }
    }
}

impl Seam for NamedSeam {
    type Listener = tokio::net::TcpListener;
    type Dialer = NamedDialer;

    async fn bind(&self, addr: SocketAddr) -> std::io::Result<Self::Listener> {
        tokio::net::TcpListener::bind(addr).await
    }

    fn dialer(&self) -> NamedDialer {
        NamedDialer
    }
}

async fn node(
    name: &str,
    ca_file: Option<std::path::PathBuf>,
) -> (dart_node::Running<NamedDialer>, TempDir) {
    let dir = std::env::temp_dir().join(format!("dart-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let flags = NodeFlags {
        allow_upstream: vec!["127.0.0.0/8".into()],
        public_upstream: vec!["127.0.0.0/8".into()],
        listen: "127.0.0.1:0".into(),
        admin: String::new(),
        cache_dir: dir.join("cache"),
        cache_size: 1 << 20,
        mem_size: 0,
        block_size: 64 << 10,
        chunk_size: 256 << 10,
        origin_ca_file: ca_file,
        drain_secs: 1,
        ..NodeFlags::default()
    };
    let running = dart_node::start_on(NamedSeam, &flags, None).await.expect("node starts");
    (running, TempDir(dir))
}

async fn get(addr: SocketAddr, url: &str) -> (u16, Bytes) {
    let c: Client<SeamConnector<TokioDialer>, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(2)));
    let uri = format!("http://{addr}/dart/{url}");
    let resp = c.get(uri.parse().expect("uri")).await.expect("response");
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.expect("body").to_bytes())
}

#[tokio::test]
async fn a_node_reads_an_https_origin_signed_by_a_ca_it_was_given() {
    let origin = tls_origin().await;
    let scratch = std::env::temp_dir().join(format!("dart-tls-ca-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("dir");
    let ca = scratch.join("ca.pem");
    std::fs::write(&ca, &origin.ca_pem).expect("write ca");
    let (n, _dir) = node("trusted", Some(ca)).await;
    let url = format!("https://localhost:{}/weights.bin?sig=x", origin.port);
    let (status, body) = get(n.client_addr, &url).await;
    assert_eq!(status, 200);
    assert_eq!(body[..], generate(SEED, 0, SIZE as usize)[..]);
    assert_eq!(origin.stats.requests(), 5, "one probe and four blocks, over TLS");
    let (status, _) = get(n.client_addr, &url).await;
    assert_eq!(status, 200);
    assert_eq!(origin.stats.requests(), 5, "the second read is a cache hit");
    let _ = std::fs::remove_dir_all(&scratch);
}

#[tokio::test]
async fn an_https_origin_the_node_cannot_verify_is_a_502_not_a_plaintext_fallback() {
    let origin = tls_origin().await;
    let (n, _dir) = node("untrusted", None).await;
    let url = format!("https://localhost:{}/weights.bin", origin.port);
    let (status, body) = get(n.client_addr, &url).await;
    assert_eq!(status, 502, "{}", String::from_utf8_lossy(&body));
    assert_eq!(origin.stats.requests(), 0, "no request got past the handshake");
}

#[tokio::test]
async fn a_ca_file_without_certificates_is_a_start_up_error() {
    let scratch = std::env::temp_dir().join(format!("dart-tls-bad-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("dir");
    let bad = scratch.join("empty.pem");
    std::fs::write(&bad, "not a certificate\n").expect("write");
    let flags = NodeFlags {
        allow_upstream: vec!["127.0.0.0/8".into()],
        public_upstream: vec!["127.0.0.0/8".into()],
        listen: "127.0.0.1:0".into(),
        admin: String::new(),
        cache_dir: scratch.join("cache"),
        origin_ca_file: Some(bad),
        ..NodeFlags::default()
    };
    let err = dart_node::start(&flags).await.err().expect("refused");
    assert!(format!("{err:#}").contains("origin-ca-file"), "{err:#}");
    let _ = std::fs::remove_dir_all(&scratch);
}

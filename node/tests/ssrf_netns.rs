//! Cloud metadata addresses through a node with default flags: refused with a 403 and a reason,
//! and nothing connected, neither by address nor through a name that resolves to one.
//!
//! This test names link-local addresses, so it runs only inside a network namespace whose one
//! interface is `lo` (README: External-part tests): there, even a wrong node could not send a
//! packet off this machine. It fails, with the command to run it, anywhere else. In the namespace
//! 169.254.169.254 is an address of `lo`, where a counting listener on port 80 stands in for a
//! metadata service:
//!
//! ```text
//! cargo test -p dart-node --features external-tests --test ssrf_netns --no-run
//! unshare -n sh -c 'ip link set lo up && ip addr add 169.254.169.254/32 dev lo && <test binary>'
//! ```

use dart_core::policy::Refusal;
use dart_net_tokio::seam::{Dialer, Seam};
use dart_node::cli::NodeFlags;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

mod support;
use support::{get, sample, Counting, Reply, TempDir};

const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

const HOW_TO_RUN: &str = "run it as .ci/run does, as root: `cargo test -p dart-node --features \
    external-tests --test ssrf_netns --no-run`, then `unshare -n sh -c 'ip link set lo up && ip \
    addr add 169.254.169.254/32 dev lo && <the test binary it printed>'`";

/// The interfaces of this process's network namespace.
fn interfaces() -> Vec<String> {
    let dev = std::fs::read_to_string("/proc/self/net/dev").expect("read /proc/self/net/dev");
    dev.lines().skip(2).filter_map(|l| Some(l.split_once(':')?.0.trim().to_owned())).collect()
}

/// Panics unless this process is in a network namespace with only `lo`, and binds the stand-in
/// metadata service on 169.254.169.254:80.
async fn isolated_metadata_service() -> (Arc<AtomicUsize>, tokio::sync::oneshot::Sender<()>) {
    let found = interfaces();
    assert!(
        found == ["lo"],
        "this test names link-local addresses and must run in a network namespace whose only \
         interface is lo; this one has {found:?}: {HOW_TO_RUN}"
    );
    let l = tokio::net::TcpListener::bind((METADATA, 80)).await.unwrap_or_else(|e| {
        panic!("cannot listen on 169.254.169.254:80 ({e}): is the address on lo? {HOW_TO_RUN}")
    });
    let accepted = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async {
        let _ = rx.await;
    };
    let handler = |_req: http::Request<hyper::body::Incoming>| async {
        dart_net_tokio::body::plain(200, "ami-id\ninstance-id\niam/security-credentials/")
    };
    let l = Counting::new(l, accepted.clone());
    tokio::spawn(dart_net_tokio::server::serve(l, handler, stop, Default::default()));
    // The control: the stand-in answers and counts, so a count of 0 below means no connection.
    let r = get("http://169.254.169.254/latest/meta-data/", &[]).await;
    assert_eq!((r.status, accepted.load(Ordering::SeqCst)), (200, 1), "the stand-in is not up");
    accepted.store(0, Ordering::SeqCst);
    (accepted, tx)
}

/// Resolves `metadata.google.internal` to 169.254.169.254 and `metadata6.test` to fe80::1, as a
/// cloud resolver would, and logs every dial.
#[derive(Clone, Debug, Default)]
struct CloudDialer {
    dialed: Arc<Mutex<Vec<SocketAddr>>>,
}

impl Dialer for CloudDialer {
    type Io = tokio::net::TcpStream;

    async fn dial(&self, host: &str, port: u16) -> std::io::Result<Self::Io> {
        let addr = self.resolve(host, port).await?[0];
        self.dial_addr(addr).await
    }

    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        let ip: IpAddr = match host.trim_start_matches('[').trim_end_matches(']') {
            "metadata.google.internal" => METADATA.into(),
            "metadata6.test" => Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1).into(),
            other => other.parse().map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::NotFound, format!("no such host {other}"))
            })?,
        };
        Ok(vec![SocketAddr::new(ip, port)])
    }

    async fn dial_addr(&self, addr: SocketAddr) -> std::io::Result<Self::Io> {
        self.dialed.lock().expect("log").push(addr);
        tokio::net::TcpStream::connect(addr).await
    }
}

#[derive(Clone, Debug, Default)]
struct CloudSeam {
    dialer: CloudDialer,
}

impl Seam for CloudSeam {
    type Listener = tokio::net::TcpListener;
    type Dialer = CloudDialer;

    async fn bind(&self, addr: SocketAddr) -> std::io::Result<Self::Listener> {
        tokio::net::TcpListener::bind(addr).await
    }

    fn dialer(&self) -> CloudDialer {
        self.dialer.clone()
    }
}

/// The flags a user runs with (loopback listeners aside), with `public` upstreams.
fn default_flags(dir: &TempDir, public: &[&str]) -> NodeFlags {
    NodeFlags {
        public_upstream: public.iter().map(|s| s.to_string()).collect(),
        listen: "127.0.0.1:0".into(),
        admin: "127.0.0.1:0".into(),
        cache_dir: dir.0.clone(),
        cache_size: 1 << 20,
        mem_size: 0,
        block_size: 64 << 10,
        chunk_size: 256 << 10,
        drain_secs: 1,
        ..NodeFlags::default()
    }
}

/// A 403 explaining the link-local refusal in its body. Whether `x-dart-refused` names it is
/// noted in `unlabelled` and asserted at the end, so that a missing header does not hide the
/// connection counts.
fn assert_link_local(r: &Reply, case: &str, unlabelled: &mut Vec<String>) {
    let reason = Refusal::LinkLocal;
    assert_eq!(r.status, 403, "{case}: {}", r.text());
    assert!(r.text().contains(reason.explain()), "{case}: {}", r.text());
    if r.header("x-dart-refused") != reason.label() {
        unlabelled.push(format!("{case}: x-dart-refused {:?}", r.header("x-dart-refused")));
    }
}

async fn refused_total(admin: SocketAddr) -> u64 {
    let m = get(&format!("http://{admin}/metrics"), &[]).await.text();
    sample(&m, "dart_upstream_refused_total{reason=\"link_local\"}")
}

#[tokio::test]
async fn metadata_and_link_local_upstreams_are_refused_with_nothing_connected() {
    let (accepted, _stop) = isolated_metadata_service().await;
    let mut unlabelled = Vec::new();
    // The credential check (the default) and a public upstream reach the origin differently.
    for (mode, public) in [
        ("checked", &[][..]),
        ("public", &["169.254.0.0/16", "fe80::/10", ".internal", ".test"][..]),
    ] {
        // The production seam: real sockets and the system's dialer.
        let dir = support::temp_dir("netns", &format!("tokio-{mode}"));
        let node = dart_node::start(&default_flags(&dir, public)).await.expect("node starts");
        let literal = [
            "http://169.254.169.254/latest/meta-data/",
            "http://169.254.169.254:80/latest/meta-data/iam/security-credentials/",
            "http://[fe80::1]/",
            "http://[::ffff:169.254.169.254]/latest/meta-data/",
            "http://user@169.254.169.254/latest/meta-data/",
        ];
        for url in literal {
            let r = get(&format!("http://{}/dart/{url}", node.client_addr), &[]).await;
            assert_link_local(&r, &format!("{mode} {url}"), &mut unlabelled);
        }
        assert_eq!(refused_total(node.admin_addr.expect("admin")).await, literal.len() as u64);

        // Names that resolve to metadata addresses: refused at dial time, after resolution.
        let dir = support::temp_dir("netns", &format!("named-{mode}"));
        let seam = CloudSeam::default();
        let flags = default_flags(&dir, public);
        let node = dart_node::start_on(seam.clone(), &flags, None).await.expect("node starts");
        let named =
            ["http://metadata.google.internal/computeMetadata/v1/", "http://metadata6.test/"];
        for url in named {
            let r = get(&format!("http://{}/dart/{url}", node.client_addr), &[]).await;
            assert_link_local(&r, &format!("{mode} {url}"), &mut unlabelled);
        }
        assert_eq!(refused_total(node.admin_addr.expect("admin")).await, named.len() as u64);
        let dialed = seam.dialer.dialed.lock().expect("log").clone();
        assert!(dialed.is_empty(), "{mode}: dialled {dialed:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), 0, "{mode}: the metadata service was reached");
    }
    assert!(unlabelled.is_empty(), "403s without x-dart-refused: link_local: {unlabelled:#?}");
}

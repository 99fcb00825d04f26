//! Server-side request forgery through a running node, on loopback only: the upstream policy
//! refuses what it must with a 403 and a reason, and refuses it where the connection is dialled,
//! after name resolution, so a name that resolves to a refused address gets nowhere.
//!
//! The world: a node on a seam whose dialer resolves a few test names itself (the system resolver
//! is never asked) and refuses to dial anything but a loopback address, so no packet leaves this
//! machine even if the code under test is wrong; and two counting origins on the same port, one on
//! 127.0.0.1 (allowed by `--allow-upstream 127.0.0.1,...`) and one on 127.0.0.2 (loopback the
//! policy does not admit; Linux routes all of 127/8 to `lo`). A refused read must leave the
//! 127.0.0.2 origin with no connection and the dialer with no dial of it.
//!
//! The names: `allowed.test`, `a.blobs.test`, `blobs.test` and `other.test` resolve to 127.0.0.1,
//! `rebind.test` to 127.0.0.2, `mixed.test` to 127.0.0.2 then 127.0.0.1, and `flip.test` to
//! 127.0.0.1 the first time it is resolved and to 127.0.0.2 every time after.

use dart_core::policy::Refusal;
use dart_net_tokio::origin_server::{generate, serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::seam::{Dialer, Seam};
use dart_net_tokio::server::{serve, ServeOptions};
use dart_node::cli::NodeFlags;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

mod support;
use support::{get, sample, Counting, Reply, TempDir};

const SEED: u64 = 13;
/// One block: a read is one probe or check and one block fetch.
const SIZE: u64 = 50_000;
const BLOCK: u64 = 64 << 10;
const NEAR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const FAR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// The policy of most tests: 127.0.0.1 by address, a suffix and a host by name.
const ALLOW: &[&str] = &["127.0.0.1", ".blobs.test", "allowed.test"];

/// The test names; every address is loopback.
fn table(host: &str) -> Option<Vec<IpAddr>> {
    let (near, far) = (IpAddr::V4(NEAR), IpAddr::V4(FAR));
    match host {
        "allowed.test" | "a.blobs.test" | "blobs.test" | "other.test" => Some(vec![near]),
        "rebind.test" => Some(vec![far]),
        "mixed.test" => Some(vec![far, near]),
        _ => None,
    }
}

/// What the node's dialer was asked to do.
#[derive(Debug, Default)]
struct DialLog {
    /// Host names (and literal addresses) resolved.
    resolved: Vec<String>,
    /// Addresses dialled (refused ones never get here).
    dialed: Vec<SocketAddr>,
}

/// Resolves [`table`] names and literal addresses, and dials loopback addresses only.
#[derive(Clone, Debug, Default)]
struct LoopbackDialer {
    log: Arc<Mutex<DialLog>>,
}

impl LoopbackDialer {
    fn addrs(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let ips = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => table(bare).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotFound, format!("no such host {host}"))
            })?,
        };
        Ok(ips.into_iter().map(|ip| SocketAddr::new(ip, port)).collect())
    }
}

impl Dialer for LoopbackDialer {
    type Io = tokio::net::TcpStream;

    async fn dial(&self, host: &str, port: u16) -> std::io::Result<Self::Io> {
        let addr = Self::addrs(host, port)?[0];
        self.dial_addr(addr).await
    }

    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        let mut log = self.log.lock().expect("log");
        let earlier = log.resolved.iter().filter(|h| *h == host).count();
        log.resolved.push(host.to_owned());
        if host == "flip.test" {
            // A rebinding name: benign at its first resolution, 127.0.0.2 ever after.
            let ip = if earlier == 0 { NEAR } else { FAR };
            return Ok(vec![SocketAddr::new(ip.into(), port)]);
        }
        Self::addrs(host, port)
    }

    async fn dial_addr(&self, addr: SocketAddr) -> std::io::Result<Self::Io> {
        self.log.lock().expect("log").dialed.push(addr);
        if !addr.ip().is_loopback() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("this test never leaves loopback ({addr})"),
            ));
        }
        tokio::net::TcpStream::connect(addr).await
    }
}

/// The node's bound listeners and the connections each accepted.
type Accepts = Arc<Mutex<Vec<(SocketAddr, Arc<AtomicUsize>)>>>;

/// Real loopback sockets, counting the connections each of the node's listeners accepts.
#[derive(Clone, Debug, Default)]
struct TestSeam {
    dialer: LoopbackDialer,
    listeners: Accepts,
}

impl Seam for TestSeam {
    type Listener = Counting<tokio::net::TcpListener>;
    type Dialer = LoopbackDialer;

    async fn bind(&self, addr: SocketAddr) -> std::io::Result<Self::Listener> {
        let l = tokio::net::TcpListener::bind(addr).await?;
        let count = Arc::new(AtomicUsize::new(0));
        self.listeners.lock().expect("listeners").push((l.local_addr()?, count.clone()));
        Ok(Counting::new(l, count))
    }

    fn dialer(&self) -> LoopbackDialer {
        self.dialer.clone()
    }
}

/// A counting origin on `ip:port` serving the test object (or `handler`'s answers).
struct Origin {
    accepted: Arc<AtomicUsize>,
    stats: Arc<OriginStats>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn stopper() -> (tokio::sync::oneshot::Sender<()>, impl std::future::Future<Output = ()>) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    (tx, async {
        let _ = rx.await;
    })
}

fn serve_object(l: tokio::net::TcpListener) -> Origin {
    let accepted = Arc::new(AtomicUsize::new(0));
    let stats = Arc::new(OriginStats::default());
    let object = OriginObject { seed: SEED, size: SIZE, behaviour: Behaviour::Honours };
    let (tx, stop) = stopper();
    let l = Counting::new(l, accepted.clone());
    tokio::spawn(serve_origin(l, object, stats.clone(), stop, ServeOptions::default()));
    Origin { accepted, stats, _stop: tx }
}

/// Binds 127.0.0.1:P and 127.0.0.2:P for one port P.
async fn twin_listeners() -> (tokio::net::TcpListener, tokio::net::TcpListener) {
    for _ in 0..64 {
        let near = tokio::net::TcpListener::bind((NEAR, 0)).await.expect("bind 127.0.0.1");
        let port = near.local_addr().expect("addr").port();
        if let Ok(far) = tokio::net::TcpListener::bind((FAR, port)).await {
            return (near, far);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2 after 64 tries");
}

struct World {
    node: dart_node::Running<LoopbackDialer>,
    seam: TestSeam,
    near: Origin,
    far: Origin,
    port: u16,
    _dir: TempDir,
}

impl World {
    /// A one-member cluster node (so it has a peer port) with `allow` and `public` patterns, in
    /// front of the twin origins.
    async fn start(name: &str, allow: &[&str], public: &[&str]) -> World {
        let (near, far) = twin_listeners().await;
        let port = near.local_addr().expect("addr").port();
        let (near, far) = (serve_object(near), serve_object(far));
        let dir = support::temp_dir("ssrf", name);
        // Outside the ephemeral range: a port the kernel handed out for `:0` here was taken by
        // another test's outbound connection before the node bound it (CI, 2026-12-06).
        let peer_port = support::free_port();
        let flags = NodeFlags {
            allow_upstream: allow.iter().map(|s| s.to_string()).collect(),
            public_upstream: public.iter().map(|s| s.to_string()).collect(),
            listen: "127.0.0.1:0".into(),
            admin: "127.0.0.1:0".into(),
            self_id: "ssrf".into(),
            peers: format!("ssrf@127.0.0.1:{peer_port}"),
            peer_listen: format!("127.0.0.1:{peer_port}"),
            cache_dir: dir.0.clone(),
            cache_size: 16 * BLOCK,
            mem_size: 0,
            block_size: BLOCK,
            chunk_size: 4 * BLOCK,
            drain_secs: 1,
            ..NodeFlags::default()
        };
        let seam = TestSeam::default();
        let node = dart_node::start_on(seam.clone(), &flags, None).await.expect("node starts");
        World { node, seam, near, far, port, _dir: dir }
    }

    async fn read(&self, upstream: &str) -> Reply {
        get(&format!("http://{}/dart/{upstream}", self.node.client_addr), &[]).await
    }

    async fn metrics(&self) -> String {
        let admin = self.node.admin_addr.expect("admin on");
        get(&format!("http://{admin}/metrics"), &[]).await.text()
    }

    fn refused(metrics: &str, reason: Refusal) -> u64 {
        sample(metrics, &format!("dart_upstream_refused_total{{reason=\"{}\"}}", reason.label()))
    }

    /// Connections the node's own listener at `addr` accepted.
    fn own_accepted(&self, addr: SocketAddr) -> usize {
        let listeners = self.seam.listeners.lock().expect("listeners");
        let (_, n) = listeners.iter().find(|(a, _)| *a == addr).expect("a node listener");
        n.load(Ordering::SeqCst)
    }

    fn dialed(&self, ip: Ipv4Addr) -> usize {
        let log = self.seam.dialer.log.lock().expect("log");
        log.dialed.iter().filter(|a| a.ip() == IpAddr::V4(ip)).count()
    }

    fn resolved(&self, host: &str) -> usize {
        let log = self.seam.dialer.log.lock().expect("log");
        log.resolved.iter().filter(|h| *h == host).count()
    }

    /// Asserts that nothing reached 127.0.0.2: no dial, no accepted connection, no request.
    fn assert_far_untouched(&self, case: &str) {
        assert_eq!(self.dialed(FAR), 0, "{case}: 127.0.0.2 was dialled");
        assert_eq!(self.far.accepted.load(Ordering::SeqCst), 0, "{case}: 127.0.0.2 connected");
        assert_eq!(self.far.stats.requests(), 0, "{case}: 127.0.0.2 was asked");
    }

    fn near_accepted(&self) -> usize {
        self.near.accepted.load(Ordering::SeqCst)
    }
}

/// The 403s whose `x-dart-refused` header did not name their reason. They are asserted at the
/// end of a test ([`Unlabelled::assert_none`]), so that a missing header does not hide the
/// connection counts checked after it.
#[derive(Debug, Default)]
struct Unlabelled(Vec<String>);

impl Unlabelled {
    fn assert_none(&self) {
        assert!(self.0.is_empty(), "403s without the right x-dart-refused header: {:#?}", self.0);
    }
}

/// A 403 explaining `reason` in the body and naming it in `x-dart-refused` (noted in
/// `unlabelled` when not).
fn assert_refused(r: &Reply, reason: Refusal, case: &str, unlabelled: &mut Unlabelled) {
    assert_eq!(r.status, 403, "{case}: {}", r.text());
    assert!(r.text().contains(reason.explain()), "{case}: the body gives no reason: {}", r.text());
    if r.header("x-dart-refused") != reason.label() {
        unlabelled.0.push(format!(
            "{case}: x-dart-refused {:?}, want {:?} (body: {})",
            r.header("x-dart-refused"),
            reason.label(),
            r.text().trim_end()
        ));
    }
}

fn assert_object(r: &Reply, case: &str) {
    assert_eq!(r.status, 200, "{case}: {}", r.text());
    assert!(r.body[..] == generate(SEED, 0, SIZE as usize)[..], "{case}: wrong bytes");
}

/// Both ways a client read reaches an origin: through a credential check (the default) and as
/// a public upstream (through the engine's probe).
const MODES: [(&str, &[&str]); 2] = [("checked", &[]), ("public", &[".test", "127.0.0.0/8"])];

#[tokio::test]
async fn a_literal_loopback_address_the_policy_does_not_admit_is_refused_with_no_connection() {
    let mut u = Unlabelled::default();
    for (mode, public) in MODES {
        let w = World::start(&format!("literal-{mode}"), ALLOW, public).await;
        let r = w.read(&format!("http://127.0.0.2:{}/obj.bin", w.port)).await;
        assert_refused(&r, Refusal::Loopback, mode, &mut u);
        let r = w.read(&format!("http://[::ffff:127.0.0.2]:{}/obj.bin", w.port)).await;
        assert_refused(&r, Refusal::Loopback, mode, &mut u);
        w.assert_far_untouched(mode);
        assert_eq!(w.near_accepted(), 0, "{mode}");
        let m = w.metrics().await;
        assert_eq!(World::refused(&m, Refusal::Loopback), 2, "{mode}");
    }
    u.assert_none();
}

#[tokio::test]
async fn a_name_that_resolves_to_a_refused_address_is_refused_at_dial_time() {
    let mut u = Unlabelled::default();
    for (mode, public) in MODES {
        let w = World::start(&format!("rebind-{mode}"), ALLOW, public).await;
        let r = w.read(&format!("http://rebind.test:{}/obj.bin", w.port)).await;
        // The name passes the check before the exchange (the CIDR pattern defers names to what
        // they resolve to); it was resolved, and the address it resolved to was refused.
        assert_refused(&r, Refusal::Loopback, mode, &mut u);
        assert_eq!(w.resolved("rebind.test"), 1, "{mode}: resolved once, at dial time");
        w.assert_far_untouched(mode);
        assert_eq!(w.near_accepted(), 0, "{mode}");
        let m = w.metrics().await;
        assert_eq!(World::refused(&m, Refusal::Loopback), 1, "{mode}");
    }
    u.assert_none();
}

#[tokio::test]
async fn a_name_that_rebinds_after_its_first_dial_is_refused_at_the_next_dial() {
    let mut u = Unlabelled::default();
    for (mode, public) in MODES {
        let w = World::start(&format!("flip-{mode}"), ALLOW, public).await;
        // The 1-byte check or probe dials 127.0.0.1; the block fetch resolves again and gets
        // 127.0.0.2, which its own dial refuses.
        let r = w.read(&format!("http://flip.test:{}/obj.bin", w.port)).await;
        assert_refused(&r, Refusal::Loopback, mode, &mut u);
        assert_eq!(w.resolved("flip.test"), 2, "{mode}: one resolution per dial");
        assert_eq!(w.near_accepted(), 1, "{mode}: only the first dial connected");
        w.assert_far_untouched(mode);
        let m = w.metrics().await;
        assert_eq!(World::refused(&m, Refusal::Loopback), 1, "{mode}");
    }
    u.assert_none();
}

#[tokio::test]
async fn a_name_that_resolves_to_a_refused_and_an_allowed_address_connects_to_the_allowed_one() {
    for (mode, public) in MODES {
        let w = World::start(&format!("mixed-{mode}"), ALLOW, public).await;
        let r = w.read(&format!("http://mixed.test:{}/obj.bin", w.port)).await;
        assert_object(&r, mode);
        w.assert_far_untouched(mode);
        // One connection for the 1-byte check or probe (cancelled at its head), one for the block.
        assert_eq!(w.near_accepted(), 2, "{mode}");
        assert_eq!(w.near.stats.requests(), 2, "{mode}");
    }
}

#[tokio::test]
async fn allowed_names_suffixes_and_addresses_are_fetched_with_counted_connections() {
    for (mode, public) in MODES {
        let w = World::start(&format!("allowed-{mode}"), ALLOW, public).await;
        // `other.test` is in no name pattern, but it resolves to 127.0.0.1, which the CIDR
        // pattern admits: a network pattern admits every name that resolves into it.
        let hosts = ["allowed.test", "a.blobs.test", "other.test", "127.0.0.1"];
        for (i, host) in hosts.into_iter().enumerate() {
            let r = w.read(&format!("http://{host}:{}/obj{i}.bin", w.port)).await;
            assert_object(&r, &format!("{mode} {host}"));
            // Every host is its own connection pool: a check or probe, then the block.
            assert_eq!(w.near_accepted(), 2 * (i + 1), "{mode} {host}");
            assert_eq!(w.near.stats.requests(), 2 * (i as u64 + 1), "{mode} {host}");
        }
        w.assert_far_untouched(mode);
        let m = w.metrics().await;
        for reason in Refusal::ALL {
            assert_eq!(World::refused(&m, reason), 0, "{mode}: {reason}");
        }
    }
}

#[tokio::test]
async fn with_name_patterns_only_an_unlisted_name_is_refused_before_resolution_and_a_listed_one_cannot_reach_loopback(
) {
    let mut u = Unlabelled::default();
    for (mode, public) in MODES {
        let w =
            World::start(&format!("names-{mode}"), &[".blobs.test", "allowed.test"], public).await;
        let p = w.port;
        // Not in the allow list: refused before any resolution.
        for host in ["other.test", "blobs.test", "xblobs.test", "rebind.test"] {
            let r = w.read(&format!("http://{host}:{p}/obj.bin")).await;
            assert_refused(&r, Refusal::NotAllowed, &format!("{mode} {host}"), &mut u);
            assert_eq!(w.resolved(host), 0, "{mode} {host}: resolved");
        }
        // Listed by name, so resolved, but a name pattern never admits a loopback address.
        for host in ["a.blobs.test", "allowed.test"] {
            let r = w.read(&format!("http://{host}:{p}/obj.bin")).await;
            assert_refused(&r, Refusal::Loopback, &format!("{mode} {host}"), &mut u);
            assert_eq!(w.resolved(host), 1, "{mode} {host}: not resolved at dial time");
        }
        w.assert_far_untouched(mode);
        assert_eq!(w.dialed(NEAR), 0, "{mode}");
        assert_eq!(w.near_accepted(), 0, "{mode}");
        let m = w.metrics().await;
        assert_eq!(World::refused(&m, Refusal::NotAllowed), 4, "{mode}");
        assert_eq!(World::refused(&m, Refusal::Loopback), 2, "{mode}");
    }
    u.assert_none();
}

#[tokio::test]
async fn the_nodes_own_listeners_are_refused_by_address_and_by_name() {
    let mut u = Unlabelled::default();
    for (mode, public) in MODES {
        let w = World::start(&format!("own-{mode}"), ALLOW, public).await;
        let client = w.node.client_addr;
        let admin = w.node.admin_addr.expect("admin");
        let peer = w.node.peer_addr.expect("peer");
        let targets = [
            format!("http://{client}/dart/http://127.0.0.1:{}/obj.bin", w.port),
            format!("http://{admin}/metrics"),
            format!("http://{peer}/peer/v1/roster"),
            // By name: admitted before the exchange, refused once resolved.
            format!("http://allowed.test:{}/metrics", admin.port()),
            format!("http://a.blobs.test:{}/peer/v1/roster", peer.port()),
            format!("http://localhost:{}/dart/x", client.port()),
        ];
        for (i, target) in targets.iter().enumerate() {
            let r = w.read(target).await;
            assert_refused(&r, Refusal::OwnListener, &format!("{mode} {target}"), &mut u);
            // The client listener accepted this test's own requests and nothing else.
            assert_eq!(w.own_accepted(client), i + 1, "{mode} {target}: the node called itself");
        }
        assert_eq!(w.own_accepted(admin), 0, "{mode}: the node called its admin plane");
        assert_eq!(w.own_accepted(peer), 0, "{mode}: the node called its peer plane");
        assert_eq!(w.resolved("allowed.test") + w.resolved("a.blobs.test"), 2, "{mode}");
        assert!(w.seam.dialer.log.lock().expect("log").dialed.is_empty(), "{mode}: dialled");
        let m = w.metrics().await;
        assert_eq!(World::refused(&m, Refusal::OwnListener), targets.len() as u64, "{mode}");
    }
    u.assert_none();
}

/// A raw peer-plane block request for block 0 of `origin_url`, the key computed as the node does.
async fn relay(w: &World, origin_url: &str) -> Reply {
    let path = w.node.driver.with_node(|n| {
        let e = n.engine();
        dart_core::codec::wire::block_path(e.block_key(&e.identify(origin_url), 0))
    });
    let peer = w.node.peer_addr.expect("peer plane on");
    get(&format!("http://{peer}{path}"), &[("x-dart-hop", "0"), ("x-dart-origin", origin_url)])
        .await
}

#[tokio::test]
async fn a_relay_naming_a_refused_origin_is_refused_on_the_peer_plane_with_no_connection() {
    let mut u = Unlabelled::default();
    let w = World::start("relay", ALLOW, &[]).await;
    let p = w.port;
    // A literal refused address: refused before any exchange, with the reason.
    let r = relay(&w, &format!("http://127.0.0.2:{p}/obj.bin")).await;
    assert_refused(&r, Refusal::Loopback, "relay to 127.0.0.2", &mut u);
    let r = relay(
        &w,
        &format!("http://127.0.0.1:{}/metrics", w.node.admin_addr.expect("admin").port()),
    )
    .await;
    assert_refused(&r, Refusal::OwnListener, "relay to the admin plane", &mut u);
    // A name that resolves to it: refused at dial time. A relay tells its requester the origin
    // failed (502) with the origin-side status 403, as for any origin refusal.
    let r = relay(&w, &format!("http://rebind.test:{p}/obj.bin")).await;
    assert_eq!(r.status, 502, "relay via rebind.test: {}", r.text());
    assert_eq!(r.header("x-dart-upstream-status"), "403", "{:?}", r.headers);
    assert_eq!(w.resolved("rebind.test"), 1);
    w.assert_far_untouched("relays");
    assert_eq!(w.near_accepted(), 0);
    // The control: an allowed origin is relayed (so the refusals above were the policy's).
    let r = relay(&w, &format!("http://allowed.test:{p}/obj.bin")).await;
    assert_eq!(r.status, 200, "relay via allowed.test: {}", r.text());
    assert!(support::peer_block(&r.body) == &generate(SEED, 0, SIZE as usize)[..], "the block");
    let m = w.metrics().await;
    assert_eq!(World::refused(&m, Refusal::Loopback), 2);
    assert_eq!(World::refused(&m, Refusal::OwnListener), 1);
    u.assert_none();
}

#[tokio::test]
async fn a_redirect_to_a_refused_address_is_not_followed() {
    for (mode, public) in MODES {
        let w = World::start(&format!("redirect-{mode}"), ALLOW, public).await;
        // A third origin on 127.0.0.1 that redirects every request to the 127.0.0.2 origin.
        let l = tokio::net::TcpListener::bind((NEAR, 0)).await.expect("bind");
        let redirector = l.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let location = format!("http://127.0.0.2:{}/obj.bin", w.port);
        let handler = move |_req: http::Request<hyper::body::Incoming>| {
            let location = location.clone();
            async move {
                let mut r = dart_net_tokio::body::plain(302, "moved");
                r.headers_mut().insert("location", location.parse().expect("header"));
                r
            }
        };
        let (_stop, stop) = stopper();
        tokio::spawn(serve(
            Counting::new(l, accepted.clone()),
            handler,
            stop,
            ServeOptions::default(),
        ));
        let r = w.read(&format!("http://{redirector}/obj.bin")).await;
        assert!(r.status != 200 && r.status != 206, "{mode}: {} {}", r.status, r.text());
        assert!(!r.body.windows(64).any(|w| w == &generate(SEED, 0, 64)[..]), "{mode}: bytes");
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "{mode}: asked once, at its head");
        w.assert_far_untouched(mode);
    }
}

//! Peer-plane authentication with a cluster secret (`--cluster-secret-file`): real `dart`
//! processes that share the secret read through each other, and a caller without it, or with a
//! stale, foreign or re-targeted MAC, gets 401 on the peer port, is never relayed for, never
//! served a block and never learned as a member.

use dart_core::codec::wire::{block_path, ROSTER_PATH};
use dart_core::engine::{Engine, EngineConfig};
use dart_core::geometry::Geometry;
use dart_core::peer_auth::{ClusterSecret, Covered, HEADER_AUTH};
use dart_net_tokio::origin_server::{generate, serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::server::ServeOptions;
use dart_node::cli::NodeFlags;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

mod support;
use support::{
    dart_command, free_port, get, sample, spawn_dart, temp_dir, DartProcess, Reply, TempDir,
};

const SEED: u64 = 31;
const NODES: usize = 3;
const BLOCK: u64 = 64 << 10;
const CHUNK: u64 = 4 * BLOCK;
/// Eight chunks: spread over every member's share of the ring.
const SIZE: u64 = 8 * CHUNK;
const SECRET: &str = "cluster-secret-for-the-peer-auth-test";
const OTHER_SECRET: &str = "another-cluster-entirely-0123456789";

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs()
}

fn secret(text: &str) -> ClusterSecret {
    ClusterSecret::from_bytes(text.as_bytes()).expect("a long enough secret")
}

fn write_secret(dir: &Path, text: &str) -> PathBuf {
    std::fs::create_dir_all(dir).expect("dir");
    let path = dir.join("cluster-secret");
    std::fs::write(&path, format!("{text}\n")).expect("write secret");
    path
}

/// Starts member `i` of `peers`, with the secret in `secret` (none: unauthenticated).
fn spawn_node(name: &str, i: usize, peers: &str, secret: Option<&str>) -> Proc {
    let dir = temp_dir(&format!("peer-auth-{name}"), &i.to_string());
    let peer_port = peers.split(',').nth(i).and_then(|e| e.rsplit(':').next()).expect("port");
    let mut cmd = dart_command();
    cmd.args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--peer-listen", &format!("127.0.0.1:{peer_port}")])
        .args(["--self-id", &format!("node-{i}"), "--peers", peers])
        .args(["--cache-size", "16MiB", "--mem-size", "0"])
        .args(["--block-size", &BLOCK.to_string(), "--chunk-size", &CHUNK.to_string()])
        .args(["--allow-upstream", "127.0.0.0/8", "--public-upstream", "127.0.0.0/8"])
        .arg("--cache-dir")
        .arg(dir.0.join("cache"));
    if let Some(text) = secret {
        cmd.arg("--cluster-secret-file").arg(write_secret(&dir.0, text));
    }
    let dart = spawn_dart(&mut cmd);
    let admin = dart.admin.expect("an admin listener");
    Proc { client: dart.client, admin, dart, _dir: dir }
}

/// A started member: the process (killed when dropped, before its directory goes).
struct Proc {
    dart: DartProcess,
    client: SocketAddr,
    admin: SocketAddr,
    _dir: TempDir,
}

struct Cluster {
    procs: Vec<Proc>,
    peer_addrs: Vec<String>,
    origin: SocketAddr,
    stats: Arc<OriginStats>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Cluster {
    /// Members `node-0` .. with `secrets[i]` each (none: unauthenticated).
    async fn start(name: &str, secrets: [Option<&str>; NODES]) -> Cluster {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
        let origin = listener.local_addr().expect("addr");
        let stats = Arc::new(OriginStats::default());
        let object = OriginObject { seed: SEED, size: SIZE, behaviour: Behaviour::Honours };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let stop = async {
            let _ = rx.await;
        };
        tokio::spawn(serve_origin(listener, object, stats.clone(), stop, ServeOptions::default()));
        let peer_addrs: Vec<String> =
            (0..NODES).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let peers: Vec<String> =
            peer_addrs.iter().enumerate().map(|(i, a)| format!("node-{i}@{a}")).collect();
        let peers = peers.join(",");
        let procs = (0..NODES).map(|i| spawn_node(name, i, &peers, secrets[i])).collect();
        Cluster { procs, peer_addrs, origin, stats, _stop: tx }
    }

    fn object_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.origin)
    }

    async fn read(&self, i: usize, upstream: &str) -> Reply {
        get(&format!("http://{}/dart/{upstream}", self.procs[i].client), &[]).await
    }

    async fn admin(&self, i: usize, path: &str) -> String {
        let r = get(&format!("http://{}{path}", self.procs[i].admin), &[]).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        r.text()
    }
}

/// The peer-plane path of block `index` of `url`, keyed as the members key it.
fn block_target(url: &str, index: u64) -> String {
    let geometry = Geometry::new(CHUNK, BLOCK).expect("geometry");
    let engine = Engine::new(EngineConfig { geometry, ..EngineConfig::default() });
    block_path(engine.block_key(&engine.identify(url), index))
}

/// A raw peer request: `target` with hop 0, `origin` as `X-DART-Origin`, and `auth` as
/// `X-DART-Auth` when given.
async fn peer_get(peer: &str, target: &str, origin: &str, auth: Option<&str>) -> Reply {
    let mut headers = vec![("x-dart-hop", "0"), ("x-dart-origin", origin)];
    if let Some(a) = auth {
        headers.push((HEADER_AUTH, a));
    }
    get(&format!("http://{peer}{target}"), &headers).await
}

/// The MAC of a hop-0 block request for `target` naming `origin`, with no caller headers.
fn block_mac(key: &ClusterSecret, target: &str, origin: &str, unix: u64) -> String {
    let covered = Covered {
        method: "GET",
        target,
        hop: b"0",
        origin: origin.as_bytes(),
        ..Covered::default()
    };
    covered.sign(key, unix)
}

fn assert_unauthorized(r: &Reply, reason: &str, case: &str) {
    assert_eq!(r.status, 401, "{case}: {}", r.text());
    assert_eq!(r.header("www-authenticate"), "DART-HMAC-SHA256", "{case}: {:?}", r.headers);
    assert!(r.text().contains(reason), "{case}: the body does not say {reason}: {}", r.text());
    assert!(r.body.len() < 256, "{case}: block bytes in a refusal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_that_share_the_cluster_secret_read_through_each_other() {
    let cluster = Cluster::start("e2e", [Some(SECRET); NODES]).await;
    for p in &cluster.procs {
        assert!(p.dart.banner.contains(", authenticated"), "{}", p.dart.banner);
    }
    let want = generate(SEED, 0, SIZE as usize);
    let url = cluster.object_url("/models/a.bin");
    for i in 0..NODES {
        let r = cluster.read(i, &url).await;
        assert_eq!(r.status, 200, "node-{i}: {}", r.text());
        assert!(r.body[..] == want[..], "node-{i}: wrong bytes");
    }
    let mut from_peers = 0;
    for i in 0..NODES {
        let m = cluster.admin(i, "/metrics").await;
        from_peers += sample(&m, "dart_block_source_total{source=\"peer\"}");
        for reason in ["missing", "malformed", "expired", "bad_mac"] {
            let series = format!("dart_peer_auth_refused_total{{reason=\"{reason}\"}}");
            assert_eq!(sample(&m, &series), 0, "node-{i} refused a member ({reason})");
        }
        let health = cluster.admin(i, "/healthz").await;
        assert!(!health.contains("unauthenticated"), "node-{i}: {health}");
    }
    assert!(from_peers > 0, "no block came from a peer");
    println!(
        "{NODES} authenticated members read a {SIZE}-byte object each: {from_peers} blocks from \
         peers, the origin served {} bytes",
        cluster.stats.bytes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_another_secret_gets_no_block_from_the_others_and_reads_from_the_origin() {
    let cluster = Cluster::start("foreign", [Some(SECRET), Some(SECRET), Some(OTHER_SECRET)]).await;
    let url = cluster.object_url("/models/c.bin");
    let r = cluster.read(2, &url).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body[..] == generate(SEED, 0, SIZE as usize)[..], "wrong bytes");
    let m = cluster.admin(2, "/metrics").await;
    assert_eq!(sample(&m, "dart_block_source_total{source=\"peer\"}"), 0, "{m}");
    let mut bad_macs = 0;
    for i in 0..2 {
        let m = cluster.admin(i, "/metrics").await;
        bad_macs += sample(&m, "dart_peer_auth_refused_total{reason=\"bad_mac\"}");
        assert_eq!(sample(&m, "dart_block_source_total{source=\"origin\"}"), 0, "node-{i}: {m}");
    }
    assert!(bad_macs > 0, "node-2's peer requests were not refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_without_a_valid_mac_is_refused_never_relayed_for_and_never_learned() {
    let cluster = Cluster::start("refuse", [Some(SECRET); NODES]).await;
    let (ours, theirs) = (secret(SECRET), secret(OTHER_SECRET));
    let peer = cluster.peer_addrs[1].as_str();
    let url = cluster.object_url("/models/b.bin");
    let target = block_target(&url, 0);
    let other_target = block_target(&url, 1);
    let now = unix_now();
    let elsewhere = "http://127.0.0.2:9/metadata";
    let cases: Vec<(&str, &str, String, Option<String>, &str)> = vec![
        ("no MAC", "missing", target.clone(), None, url.as_str()),
        ("a malformed MAC", "malformed", target.clone(), Some("v1 now letmein".into()), &url),
        (
            "a MAC made with another secret",
            "bad_mac",
            target.clone(),
            Some(block_mac(&theirs, &target, &url, now)),
            &url,
        ),
        (
            "a replayed MAC an hour old",
            "expired",
            target.clone(),
            Some(block_mac(&ours, &target, &url, now - 3600)),
            &url,
        ),
        (
            "a valid MAC for another block's path",
            "bad_mac",
            target.clone(),
            Some(block_mac(&ours, &other_target, &url, now)),
            &url,
        ),
        (
            "a valid MAC for another origin",
            "bad_mac",
            target.clone(),
            Some(block_mac(&ours, &target, &url, now)),
            elsewhere,
        ),
    ];
    let members_before = cluster.admin(1, "/admin/members").await;
    let round = |phase: &'static str| {
        let cases = &cases;
        async move {
            for (case, reason, target, auth, origin) in cases {
                let r = peer_get(peer, target, origin, auth.as_deref()).await;
                assert_unauthorized(&r, reason, &format!("{phase}: {case}"));
            }
        }
    };
    round("cold").await;
    assert_eq!(cluster.stats.requests(), 0, "a refused caller made a member fetch");

    // The roster: refused, and the caller is not learned.
    let intruder = [("x-dart-node", "intruder"), ("x-dart-peer-addr", "127.0.0.1:9")];
    let r = get(&format!("http://{peer}{ROSTER_PATH}"), &intruder).await;
    assert_unauthorized(&r, "missing", "an unsigned roster request");
    let forged = Covered {
        method: "GET",
        target: ROSTER_PATH,
        node: b"intruder",
        peer_addr: b"127.0.0.1:9",
        ..Covered::default()
    }
    .sign(&theirs, now);
    let mut headers = intruder.to_vec();
    headers.push((HEADER_AUTH, &forged));
    let r = get(&format!("http://{peer}{ROSTER_PATH}"), &headers).await;
    assert_unauthorized(&r, "bad_mac", "a roster request signed with another secret");
    assert_eq!(cluster.admin(1, "/admin/members").await, members_before);

    // The control: the same request with a valid MAC is relayed (so the refusals were the MAC's).
    let good = block_mac(&ours, &target, &url, unix_now());
    let r = peer_get(peer, &target, &url, Some(&good)).await;
    assert_eq!(r.status, 200, "a valid MAC: {}", r.text());
    assert!(support::peer_block(&r.body) == &generate(SEED, 0, BLOCK as usize)[..], "block 0");
    assert!(cluster.stats.requests() > 0, "the relay fetched the block");

    // With the block now held, a refused caller still gets none of it.
    round("warm").await;
    let m = cluster.admin(1, "/metrics").await;
    let refused =
        |reason: &str| sample(&m, &format!("dart_peer_auth_refused_total{{reason=\"{reason}\"}}"));
    assert_eq!(
        (refused("missing"), refused("malformed"), refused("expired"), refused("bad_mac")),
        (2 + 1, 2, 2, 2 * 3 + 1),
        "{m}"
    );
}

/// An in-process one-member cluster node with `secret` (none: unauthenticated).
async fn member(name: &str, secret: Option<&str>) -> (dart_node::Running, TempDir) {
    let dir = support::temp_dir("peer-auth", name);
    let peer_port = free_port();
    let flags = NodeFlags {
        listen: "127.0.0.1:0".into(),
        admin: "127.0.0.1:0".into(),
        self_id: "solo".into(),
        peers: format!("solo@127.0.0.1:{peer_port}"),
        peer_listen: format!("127.0.0.1:{peer_port}"),
        cluster_secret_file: secret.map(|s| write_secret(&dir.0, s)),
        cache_dir: dir.0.join("cache"),
        cache_size: 1 << 20,
        mem_size: 0,
        block_size: BLOCK,
        chunk_size: CHUNK,
        drain_secs: 1,
        ..NodeFlags::default()
    };
    (dart_node::start(&flags).await.expect("node starts"), dir)
}

#[tokio::test]
async fn a_roster_caller_is_learned_only_with_a_valid_mac() {
    let (node, _dir) = member("roster", Some(SECRET)).await;
    let peer = node.peer_addr.expect("peer plane");
    let roster = format!("http://{peer}{ROSTER_PATH}");
    let caller = [("x-dart-node", "newcomer"), ("x-dart-peer-addr", "127.0.0.1:9")];
    let learned = || node.driver.with_node(|n| n.learned().clone());
    assert_unauthorized(&get(&roster, &caller).await, "missing", "unsigned");
    let sign = |key: &ClusterSecret, unix| {
        Covered {
            method: "GET",
            target: ROSTER_PATH,
            node: b"newcomer",
            peer_addr: b"127.0.0.1:9",
            ..Covered::default()
        }
        .sign(key, unix)
    };
    for (case, auth, reason) in [
        ("another secret", sign(&secret(OTHER_SECRET), unix_now()), "bad_mac"),
        ("an hour old", sign(&secret(SECRET), unix_now() - 3600), "expired"),
    ] {
        let mut headers = caller.to_vec();
        headers.push((HEADER_AUTH, &auth));
        assert_unauthorized(&get(&roster, &headers).await, reason, case);
    }
    assert!(learned().is_empty(), "a refused caller was learned: {:?}", learned());
    let auth = sign(&secret(SECRET), unix_now());
    let mut headers = caller.to_vec();
    headers.push((HEADER_AUTH, &auth));
    let r = get(&roster, &headers).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(learned().get("newcomer").map(String::as_str), Some("127.0.0.1:9"));
}

#[tokio::test]
async fn health_and_stats_say_when_the_peer_plane_is_unauthenticated() {
    for (secret, plane) in [(None, "unauthenticated"), (Some(SECRET), "authenticated")] {
        let (node, _dir) = member(plane, secret).await;
        let admin = node.admin_addr.expect("admin");
        let health = get(&format!("http://{admin}/healthz"), &[]).await;
        assert_eq!(health.status, 200);
        assert_eq!(
            health.text().contains("the peer plane is unauthenticated"),
            secret.is_none(),
            "{plane}: {}",
            health.text()
        );
        let stats = get(&format!("http://{admin}/admin/stats"), &[]).await;
        let stats: serde_json::Value = serde_json::from_slice(&stats.body).expect("json");
        assert_eq!(stats["peer_plane"], plane, "{stats}");
        assert_eq!(node.banner.contains("UNAUTHENTICATED"), secret.is_none(), "{}", node.banner);
    }
}

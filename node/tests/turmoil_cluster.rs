//! Five real nodes (`dart_node::start_on`, the shipped wiring) and an origin inside one turmoil
//! simulation, seeded: a thundering herd, a root that black-holes mid-read, a stalled peer, a
//! partition that heals, and a client that hangs up mid-read. Every byte is checked; the same seed
//! must give the same outcome twice.
//!
//! Replay another seed: `DART_TURMOIL_SEED=<n> cargo test -p dart-node --test turmoil_cluster`.

#[path = "../../net-tokio/tests/support/turmoil_seam.rs"]
mod turmoil_seam;

use bytes::Bytes;
use dart_core::engine::route::Placement;
use dart_core::engine::{Engine, EngineConfig};
use dart_core::geometry::Geometry;
use dart_core::membership::{Member, View};
use dart_core::node::{Bounds, Endpoint};
use dart_net_tokio::cache::MemCache;
use dart_net_tokio::driver::NodeDriver;
use dart_net_tokio::origin_server::{generate, serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::seam::SeamConnector;
use dart_net_tokio::server::ServeOptions;
use dart_node::cli::NodeFlags;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use turmoil_seam::{TurmoilDialer, TurmoilListener, TurmoilSeam};

const SEED: u64 = 0x005E_EDC1;
const OBJECT_SEED: u64 = 11;
const NODES: usize = 5;
const BLOCK: u64 = 64 << 10;
const SIZE: u64 = 16 * BLOCK;
const CLIENT_PORT: u16 = 8080;
const PEER_PORT: u16 = 9000;
const ORIGIN_PORT: u16 = 80;

fn seed() -> u64 {
    std::env::var("DART_TURMOIL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(SEED)
}

fn host(i: usize) -> String {
    format!("n{i}")
}

fn peers() -> String {
    (0..NODES).map(|i| format!("n{i}@n{i}:{PEER_PORT}")).collect::<Vec<_>>().join(",")
}

fn flags(i: usize) -> NodeFlags {
    NodeFlags {
        public_upstream: vec!["origin".into()],
        listen: format!(":{CLIENT_PORT}"),
        admin: String::new(),
        peer_listen: format!(":{PEER_PORT}"),
        peers: peers(),
        self_id: host(i),
        block_size: BLOCK,
        chunk_size: 64 * BLOCK,
        cache_size: 64 << 20,
        mem_size: 0,
        ..NodeFlags::default()
    }
}

fn upstream(object: &str) -> String {
    format!("http://origin:{ORIGIN_PORT}/{object}")
}

/// Node indices in the distribution tree of `object`'s first chunk, root first.
fn tree(object: &str) -> Vec<usize> {
    let members = (0..NODES).map(|i| Member::ready(&host(i), &format!("n{i}:{PEER_PORT}")));
    let geometry = Geometry::new(64 * BLOCK, BLOCK).expect("geometry");
    let engine = Engine::new(EngineConfig { geometry, ..EngineConfig::default() });
    let key = engine.block_key(&engine.identify(&upstream(object)), 0);
    let placement = Placement::new(View::new(members.collect()), "n0", 2, 1);
    placement.ranked(key.chunk).iter().map(|id| id[1..].parse().expect("index")).collect()
}

type Drivers = Arc<Mutex<BTreeMap<usize, Arc<NodeDriver<TurmoilDialer>>>>>;
type HttpClient = Client<SeamConnector<TurmoilDialer>, Empty<Bytes>>;

struct World {
    client: HttpClient,
    origin: Arc<OriginStats>,
    drivers: Drivers,
    trace: Arc<Mutex<String>>,
}

impl World {
    fn driver(&self, i: usize) -> Arc<NodeDriver<TurmoilDialer>> {
        self.drivers.lock().expect("drivers").get(&i).cloned().expect("node started")
    }

    fn note(&self, line: String) {
        eprintln!("{line}");
        let mut t = self.trace.lock().expect("trace");
        let _ = writeln!(t, "{line}");
    }

    fn check_invariants(&self) {
        for (i, d) in self.drivers.lock().expect("drivers").iter() {
            d.with_node(|n| n.check_invariants());
            assert_eq!(d.counters().panics, 0, "n{i} panicked");
        }
    }

    /// Reads `object` whole through node `i`: (status, body or error, virtual ms taken).
    async fn read(&self, i: usize, object: &str) -> (u16, Result<Bytes, String>, u128) {
        let url = format!("http://{}:{CLIENT_PORT}/dart/{}", host(i), upstream(object));
        let t0 = tokio::time::Instant::now();
        let req = http::Request::get(url).body(Empty::new()).expect("request");
        let resp = self.client.request(req).await.expect("the node always answers");
        let status = resp.status().as_u16();
        let body =
            resp.into_body().collect().await.map(|b| b.to_bytes()).map_err(|e| e.to_string());
        (status, body, t0.elapsed().as_millis())
    }

    /// Every node but `skip` reads `object` at once; each must get every byte.
    async fn everyone_reads(&self, object: &str, skip: &[usize], label: &str) -> Vec<u128> {
        let want = generate(OBJECT_SEED, 0, SIZE as usize);
        let reads = (0..NODES).filter(|i| !skip.contains(i)).map(|i| async move {
            let (status, body, ms) = self.read(i, object).await;
            (i, status, body, ms)
        });
        let mut times = Vec::new();
        for (i, status, body, ms) in futures_join_all(reads).await {
            let ok = status == 200 && body.as_deref().ok() == Some(&want[..]);
            self.note(format!(
                "{label}: n{i} {status} {} in {ms} ms",
                if ok { "exact" } else { "WRONG" }
            ));
            assert!(ok, "{label}: n{i} got {status} {:?}", body.map(|b| b.len()));
            times.push(ms);
        }
        times
    }
}

/// Polls the futures together on the current task (turmoil clients are single-task).
async fn futures_join_all<F: std::future::Future>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let handles: Vec<_> = futures.map(|f| Box::pin(f)).collect();
    let mut out: Vec<Option<F::Output>> = handles.iter().map(|_| None).collect();
    let mut handles: Vec<_> = handles.into_iter().map(Some).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, h) in out.iter_mut().zip(handles.iter_mut()) {
            if let Some(f) = h {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        *slot = Some(v);
                        *h = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("ready")).collect()
}

fn others(i: usize) -> Vec<String> {
    (0..NODES)
        .filter(|&j| j != i)
        .map(host)
        .chain(["origin".to_owned(), "reader".to_owned()])
        .collect()
}

async fn script(w: World) {
    // 1. A thundering herd: everyone reads one cold object at once; the origin pays once.
    let before = w.origin.bytes();
    w.everyone_reads("herd.bin", &[], "herd").await;
    let paid = w.origin.bytes() - before;
    w.note(format!("herd: origin served {paid} bytes for {SIZE}"));
    assert!((SIZE..=SIZE + NODES as u64).contains(&paid), "the object once plus 1-byte probes");
    w.check_invariants();

    // 2. The root black-holes mid-read: every other reader still completes. An exchange already
    //    in flight to it ends at its own bound (head 10 s, or request 30 s once the head is in);
    //    every later request pays at most one dial bound (1 s), which opens the circuit.
    let order = tree("root.bin");
    let root = order[0];
    let before = w.origin.bytes();
    let t0 = tokio::time::Instant::now();
    let readers = async { w.everyone_reads("root.bin", &[root], "dead root").await };
    let killer = async {
        while w.origin.bytes() - before < SIZE / 4 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for other in others(root) {
            turmoil::partition(host(root), other);
        }
        w.note(format!("dead root: n{root} black-holed after {} bytes", w.origin.bytes() - before));
        t0.elapsed().as_millis()
    };
    let (times, killed_at) = tokio::join!(readers, killer);
    let bound = (Bounds::default().peer_request + Bounds::default().peer_dial).as_millis();
    for t in &times {
        let after = t.saturating_sub(killed_at);
        assert!(after <= bound + 2_000, "a read ended {after} ms after the root died");
    }
    for other in others(root) {
        turmoil::repair(host(root), other);
    }
    w.check_invariants();

    // 3. A stalled interior peer: accepts requests and never answers.
    let order = tree("stall.bin");
    let stalled = order[1];
    w.note(format!("stalled peer: tree {order:?}, n{stalled} stalls"));
    let soft = |w: &World| -> Vec<u64> {
        (0..NODES)
            .map(|i| {
                w.driver(i).with_node(|n| n.engine().p2p().map_or(0, |p| p.breaker.counters().soft))
            })
            .collect()
    };
    let hedges = |w: &World| -> u64 {
        (0..NODES).map(|i| w.driver(i).with_node(|n| n.stats().hedge_backup_won)).sum()
    };
    let soft_before = soft(&w);
    let hedges_before = hedges(&w);
    // Every node first opens a connection to it (a roster exchange), so that the stall hits
    // requests on established connections, not only dials.
    for i in (0..NODES).filter(|&i| i != stalled) {
        let roster = w.driver(i).fetch_roster(&format!("n{stalled}:{PEER_PORT}")).await;
        assert!(roster.is_ok(), "n{i} reaches n{stalled}: {roster:?}");
    }
    for i in (0..NODES).filter(|&i| i != stalled) {
        turmoil::hold(host(stalled), host(i));
    }
    let times = w.everyone_reads("stall.bin", &[stalled], "stalled peer").await;
    let soft_after = soft(&w);
    let hedges_won = hedges(&w) - hedges_before;
    w.note(format!(
        "stalled peer: soft failures before {soft_before:?} after {soft_after:?}; {hedges_won} \
         hedges won; read times {times:?} ms"
    ));
    // Its children either hedged past it (the backup won) or timed out on it.
    assert!(hedges_won > 0 || soft_after != soft_before, "nothing routed around the stall");
    let slowest = times.iter().max().copied().unwrap_or(0);
    // Without hedging a child paid one response-head bound (10 s) on the established
    // connection, then one dial bound (1 s): about 11 s. A hedge races the grandparent after the
    // estimated p99 instead (measured for the default seed: slowest 1.2 s, one hedge won).
    assert!(slowest < 5_000, "slowest read {slowest} ms: the stall cost a head bound");
    for i in (0..NODES).filter(|&i| i != stalled) {
        turmoil::release(host(stalled), host(i));
    }
    w.check_invariants();

    // 4. A partition between two halves that heals: reads complete, circuits close again.
    let (left, right) = ([0usize, 1], [2usize, 3, 4]);
    for a in left {
        for b in right {
            turmoil::partition(host(a), host(b));
        }
    }
    let healer = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        for a in left {
            for b in right {
                turmoil::repair(host(a), host(b));
            }
        }
        w.note("partition: healed".to_owned());
    };
    let (_, ()) = tokio::join!(w.everyone_reads("part.bin", &[], "partition"), healer);
    tokio::time::sleep(Duration::from_secs(65)).await;
    for i in 0..NODES {
        let d = w.driver(i);
        let now = d.clock().now();
        let open = d.with_node(|n| n.engine().p2p().map_or(0, |p| p.breaker.open_count(now)));
        assert_eq!(open, 0, "n{i} still has open circuits long after the heal");
    }
    w.check_invariants();

    // 5. A client hangs up while its node waits on a stalled parent: the permit is abandoned and
    //    the parent charged nothing.
    let order = tree("hangup.bin");
    let (leaf, parent) = (order[NODES - 1], order[(NODES - 2) / 2]);
    turmoil::hold(host(parent), host(leaf));
    let d = w.driver(leaf);
    let counters = |d: &NodeDriver<TurmoilDialer>| {
        d.with_node(|n| n.engine().p2p().map(|p| p.breaker.counters().clone()).unwrap_or_default())
    };
    let before = counters(&d);
    let waiting = async {
        loop {
            let peer_fetch = d.with_node(|n| {
                n.exchanges().iter().any(|(_, to, rid)| *to == Endpoint::Peer && rid.is_some())
            });
            if peer_fetch {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        biased;
        _ = w.read(leaf, "hangup.bin") => panic!("the read finished while its parent stalls"),
        () = waiting => {}
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = counters(&d);
    w.note(format!(
        "hang-up: n{leaf} abandoned {} permit(s), charged soft {} hard {}",
        after.abandoned - before.abandoned,
        after.soft - before.soft,
        after.hard - before.hard
    ));
    assert!(after.abandoned > before.abandoned, "the permit was abandoned");
    assert_eq!((after.soft, after.hard), (before.soft, before.hard), "nothing was charged");
    assert_eq!(d.with_node(|n| n.live_requests()), 0, "the request is gone");
    turmoil::release(host(parent), host(leaf));
    w.check_invariants();
}

fn simulate(seed: u64) -> String {
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .epoch(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
        .simulation_duration(Duration::from_secs(600))
        .build();
    let origin = Arc::new(OriginStats::default());
    let stats = origin.clone();
    sim.host("origin", move || {
        let stats = stats.clone();
        async move {
            let listener = TurmoilListener::bind(ORIGIN_PORT).await?;
            let object =
                OriginObject { seed: OBJECT_SEED, size: SIZE, behaviour: Behaviour::Honours };
            let options = ServeOptions { date_header: false, ..ServeOptions::default() };
            serve_origin(listener, object, stats, std::future::pending(), options).await;
            Ok(())
        }
    });
    let drivers: Drivers = Arc::new(Mutex::new(BTreeMap::new()));
    for i in 0..NODES {
        let drivers = drivers.clone();
        sim.host(host(i), move || {
            let drivers = drivers.clone();
            async move {
                let store = Arc::new(MemCache::default());
                let running = dart_node::start_on(TurmoilSeam, &flags(i), Some(store))
                    .await
                    .map_err(|e| e.to_string())?;
                drivers.lock().expect("drivers").insert(i, running.driver.clone());
                std::future::pending::<()>().await;
                drop(running);
                Ok(())
            }
        });
    }
    let trace = Arc::new(Mutex::new(String::new()));
    let w = World {
        client: Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            // A fresh connection per read: a pooled one may have died in a partition.
            .pool_max_idle_per_host(0)
            .build(SeamConnector::new(TurmoilDialer, Duration::from_secs(1))),
        origin,
        drivers,
        trace: trace.clone(),
    };
    sim.client("reader", async move {
        script(w).await;
        Ok(())
    });
    sim.run().unwrap_or_else(|e| panic!("seed {seed}: simulation failed: {e}"));
    let t = trace.lock().expect("trace").clone();
    t
}

#[test]
fn five_real_nodes_survive_a_herd_a_dead_root_a_stall_a_partition_and_a_hang_up() {
    let seed = seed();
    eprintln!("turmoil seed {seed} (replay: DART_TURMOIL_SEED={seed} cargo test -p dart-node --test turmoil_cluster)");
    let first = simulate(seed);
    let second = simulate(seed);
    assert_eq!(first, second, "seed {seed}: two runs of one seed gave different outcomes");
}

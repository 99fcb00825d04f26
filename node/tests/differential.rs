//! One small scenario run twice: in the simulator (`dart-sim`, the core node machine in a modelled
//! network) and under turmoil (`dart_node::start_on`, the shipped wiring on hyper over simulated
//! TCP). Both worlds serve the same generated object; both must deliver identical bytes, make
//! equal origin requests per block (probes aside) and open the same set of circuits.
//!
//! The scenario: four nodes; one interior node is black-holed from the start; the other three
//! read the whole object one after another, root first, so each read's route is decided by what
//! the previous reads left behind, not by timing.
//!
//! Replay another turmoil seed: `DART_TURMOIL_SEED=<n> cargo test -p dart-node --test
//! differential`.

#[path = "../../net-tokio/tests/support/turmoil_seam.rs"]
mod turmoil_seam;

use bytes::Bytes;
use dart_core::node::Event;
use dart_net_tokio::body::{self, ResponseBody};
use dart_net_tokio::cache::MemCache;
use dart_net_tokio::driver::NodeDriver;
use dart_net_tokio::seam::SeamConnector;
use dart_net_tokio::server::{serve, ServeOptions};
use dart_node::cli::NodeFlags;
use dart_sim::content::Contents;
use dart_sim::origin::{object_url, ObjectDef, ORIGIN_HOST};
use dart_sim::{
    CheckLevel, ClusterConfig, Fault, FaultKind, FaultPlan, Phases, ReadOutcome, ReadSpec, SimSpec,
    Workload,
};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use turmoil_seam::{TurmoilDialer, TurmoilListener, TurmoilSeam};

const NODES: usize = 4;
const BLOCK: u64 = 64 << 10;
const SIZE: u64 = 8 * BLOCK + 100;
const SALT: u64 = 3;
const SIM_SEED: u64 = 5;
const TURMOIL_SEED: u64 = 0x00D1_FF00;
/// When each reader starts, in order (spaced far apart: every read ends before the next).
const STARTS: [u64; 3] = [1, 16, 31];

/// What a run shows: the bytes each reader got, origin range requests per window start, and the
/// circuits opened as (node, peer address).
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    delivered: Vec<(usize, Result<u64, String>)>,
    per_window: BTreeMap<u64, u64>,
    opened: BTreeSet<(usize, String)>,
}

fn object() -> ObjectDef {
    ObjectDef::plain(SIZE, SALT)
}

fn url(reader: &str) -> String {
    object_url(0, reader, u64::MAX)
}

/// The distribution tree of the object's only chunk, root first (the same in both worlds: the
/// same member ids, addresses and object identity).
fn tree() -> Vec<usize> {
    let cluster = ClusterConfig::new(NODES, BLOCK, vec![object()]);
    dart_sim::node::tree_order(&cluster, 0, 0)
}

/// The interior node that is black-holed, and the readers in order (root first).
fn roles() -> (usize, Vec<usize>) {
    let order = tree();
    // With four nodes and fanout 2 the preorder tree is 0 → {1 → {2}, 3}: position 1 is the
    // interior node whose child, position 2, must route around it.
    let dead = order[1];
    let readers = vec![order[0], order[3], order[2]];
    (dead, readers)
}

fn simulate() -> Outcome {
    let (dead, readers) = roles();
    let safety: Vec<ReadSpec> = readers
        .iter()
        .zip(STARTS)
        .map(|(&n, s)| ReadSpec::whole(Duration::from_secs(s), n, 0))
        .collect();
    let spec = SimSpec {
        cluster: ClusterConfig::new(NODES, BLOCK, vec![object()]),
        workload: Workload { safety, liveness: vec![] },
        plan: FaultPlan {
            faults: vec![Fault {
                at: Duration::ZERO,
                lasts: Duration::from_secs(60),
                kind: FaultKind::BlackHole { node: dead },
            }],
        },
        phases: Phases { safety: Duration::from_secs(60), liveness: Duration::from_secs(1) },
        check: CheckLevel::Full,
        record_trace: false,
    };
    let report = dart_sim::run(spec, SIM_SEED);
    assert!(report.passed(), "{}", report.summary());
    let delivered = report
        .reads
        .iter()
        .map(|r| match &r.outcome {
            // The simulator checked every delivered byte against the generator.
            ReadOutcome::Finished => (r.node, Ok(r.bytes)),
            other => (r.node, Err(format!("{other:?}"))),
        })
        .collect();
    let per_window = report.origin.per_window.iter().map(|(&(_, start), &n)| (start, n)).collect();
    let opened = report
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| {
            n.circuit_events
                .iter()
                .filter(|e| e.to == dart_core::breaker::CircuitState::Open)
                .map(move |e| (i, e.addr.clone()))
        })
        .collect();
    Outcome { delivered, per_window, opened }
}

fn flags(i: usize) -> NodeFlags {
    let peers: Vec<String> = (0..NODES).map(|j| format!("n{j}@n{j}:9000")).collect();
    NodeFlags {
        public_upstream: vec![ORIGIN_HOST.into()],
        listen: ":8080".into(),
        admin: String::new(),
        peer_listen: ":9000".into(),
        peers: peers.join(","),
        self_id: format!("n{i}"),
        block_size: BLOCK,
        chunk_size: 64 * BLOCK,
        cache_size: 64 << 20,
        mem_size: 0,
        ..NodeFlags::default()
    }
}

/// The simulator's origin on a turmoil host: the same generated bytes, RFC 9110 ranges, and a
/// count of range requests per window start.
async fn origin_answer(
    contents: Arc<Contents>,
    windows: Arc<Mutex<BTreeMap<u64, u64>>>,
    req: http::Request<Incoming>,
) -> http::Response<ResponseBody> {
    let shape = object().shape();
    let range = req.headers().get(http::header::RANGE).and_then(|v| v.to_str().ok());
    let Some((start, end)) = range
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
    else {
        return body::plain(400, "a ranged GET only");
    };
    if range != Some("bytes=0-0") {
        *windows.lock().expect("windows").entry(start).or_default() += 1;
    }
    let end = end.min(SIZE - 1);
    let data = contents.window(shape, start, end - start + 1);
    let mut r = http::Response::new(body::full(data.clone()));
    *r.status_mut() = http::StatusCode::PARTIAL_CONTENT;
    let h = r.headers_mut();
    h.insert("content-range", format!("bytes {start}-{end}/{SIZE}").parse().expect("ascii"));
    h.insert("content-length", data.len().into());
    r
}

type Drivers = Arc<Mutex<BTreeMap<usize, Arc<NodeDriver<TurmoilDialer>>>>>;

fn emulate(seed: u64) -> Outcome {
    let (dead, readers) = roles();
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .epoch(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
        .simulation_duration(Duration::from_secs(120))
        .build();
    let contents = Arc::new(Contents::new(BLOCK));
    let windows: Arc<Mutex<BTreeMap<u64, u64>>> = Arc::default();
    let (c, w) = (contents.clone(), windows.clone());
    sim.host(ORIGIN_HOST, move || {
        let (c, w) = (c.clone(), w.clone());
        async move {
            let listener = TurmoilListener::bind(80).await?;
            let handler = move |req| origin_answer(c.clone(), w.clone(), req);
            let options = ServeOptions { date_header: false, ..ServeOptions::default() };
            serve(listener, handler, std::future::pending(), options).await;
            Ok(())
        }
    });
    let drivers: Drivers = Arc::default();
    for i in 0..NODES {
        let drivers = drivers.clone();
        sim.host(format!("n{i}"), move || {
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
    let result: Arc<Mutex<Option<Outcome>>> = Arc::default();
    let out = result.clone();
    let (c, w) = (contents.clone(), windows.clone());
    sim.client("reader", async move {
        while drivers.lock().expect("drivers").len() < NODES {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut taps: Vec<_> =
            (0..NODES).map(|i| drivers.lock().expect("drivers")[&i].tap_events()).collect();
        for other in (0..NODES).filter(|&j| j != dead).map(|j| format!("n{j}")) {
            turmoil::partition(format!("n{dead}"), other);
        }
        turmoil::partition(format!("n{dead}"), ORIGIN_HOST);
        let client: Client<SeamConnector<TurmoilDialer>, Empty<Bytes>> =
            Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .pool_max_idle_per_host(0)
                .build(SeamConnector::new(TurmoilDialer, Duration::from_secs(1)));
        let want = c.window(object().shape(), 0, SIZE);
        let t0 = tokio::time::Instant::now();
        let mut delivered = Vec::new();
        for (&n, start) in readers.iter().zip(STARTS) {
            tokio::time::sleep_until(t0 + Duration::from_secs(start)).await;
            let target = format!("http://n{n}:8080/dart/{}", url(&format!("n{n}")));
            let req = http::Request::get(target).body(Empty::new()).expect("request");
            let resp = client.request(req).await.expect("the node answers");
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.map(|b| b.to_bytes());
            let got = match body {
                Ok(b) if status == 200 && b == want => Ok(b.len() as u64),
                Ok(b) => Err(format!("status {status}, {} bytes, exact: {}", b.len(), b == want)),
                Err(e) => Err(e.to_string()),
            };
            delivered.push((n, got));
        }
        let mut opened = BTreeSet::new();
        for (i, tap) in taps.iter_mut().enumerate() {
            while let Ok(e) = tap.try_recv() {
                if let Event::Circuit(e) = e {
                    if e.to == dart_core::breaker::CircuitState::Open {
                        opened.insert((i, e.addr));
                    }
                }
            }
        }
        let per_window = w.lock().expect("windows").clone();
        *out.lock().expect("result") = Some(Outcome { delivered, per_window, opened });
        Ok(())
    });
    sim.run().unwrap_or_else(|e| panic!("seed {seed}: simulation failed: {e}"));
    let outcome = result.lock().expect("result").take().expect("the script finished");
    outcome
}

#[test]
fn the_simulator_and_the_shipped_wiring_agree_on_bytes_origin_requests_and_circuits() {
    let seed = std::env::var("DART_TURMOIL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(TURMOIL_SEED);
    eprintln!("sim seed {SIM_SEED}, turmoil seed {seed} (replay: DART_TURMOIL_SEED={seed} cargo test -p dart-node --test differential)");
    let (dead, readers) = roles();
    let sim = simulate();
    let real = emulate(seed);
    eprintln!("tree {:?}, n{dead} dead, readers {readers:?}", tree());
    eprintln!("simulator: {sim:?}");
    eprintln!("turmoil:   {real:?}");
    assert_eq!(sim.delivered, real.delivered, "delivered bytes");
    assert!(sim.delivered.iter().all(|(_, d)| *d == Ok(SIZE)), "every reader got the object");
    assert_eq!(sim.per_window, real.per_window, "origin requests per block");
    assert_eq!(sim.per_window.values().sum::<u64>(), 9, "each of the nine blocks once");
    assert_eq!(sim.opened, real.opened, "circuits opened");
    // Two alive nodes meet the dead one: its child (position 2), whose parent it is, and the
    // root, whose successor (the member ranked next, position 1) it is: the root asks its
    // successor held-only before it pays the origin. Nobody blames an alive node.
    let expected_open: BTreeSet<(usize, String)> =
        [(readers[2], format!("n{dead}:9000")), (readers[0], format!("n{dead}:9000"))].into();
    // The dead node's own neighbour pings fail from inside its black hole, and may open circuits
    // there: nobody alive sees them.
    let alive_opened: BTreeSet<(usize, String)> =
        sim.opened.iter().filter(|(n, _)| *n != dead).cloned().collect();
    assert_eq!(
        alive_opened, expected_open,
        "only the dead node's child and the root opened a circuit, both to the dead node"
    );
}

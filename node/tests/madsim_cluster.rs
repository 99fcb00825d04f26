//! The shared scenario subset (`support/subset.rs`) on five real nodes and an origin under
//! madsim: the shipped `dart_node::start_on` on the production seam (`TokioSeam`), whose sockets,
//! timers and tasks are madsim's when the crate is built with `--cfg madsim` (tokio is
//! madsim-tokio through the workspace's rename). Faults are madsim's own: node kill and restart,
//! socket reset, pause and resume, link clogging. Each seed runs a different interleaving of every task.
//!
//! Built only with the cfg, in its own target directory (the whole dependency tree builds again):
//!
//! ```text
//! RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR=target/madsim \
//!   cargo test -p dart-node --test madsim_cluster
//! ```
//!
//! Seeds: `MADSIM_TEST_SEED=<n>` (replay; madsim prints it on failure), `MADSIM_TEST_NUM=<count>`
//! (a sweep from that seed), `MADSIM_TEST_CHECK_DETERMINISM=1` (each seed runs twice: the second
//! run must draw the same random numbers in the same order, and write the same trace).

#![cfg(madsim)]

#[path = "support/subset.rs"]
mod subset;

use dart_net_tokio::cache::MemCache;
use dart_net_tokio::origin_server::{serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::seam::{Seam, TokioDialer, TokioSeam};
use dart_net_tokio::server::ServeOptions;
use madsim::net::NetSim;
use madsim::runtime::Handle;
use madsim::task::NodeId;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use subset::{flags, host, Cluster, Drivers, World, NODES, OBJECT_SEED, ORIGIN_PORT, SIZE};

/// The subset's verbs on madsim (`support/subset.rs` has the table of both simulators).
struct Madsim {
    handle: Handle,
    nodes: Vec<NodeId>,
    drivers: Drivers<TokioDialer>,
    origin: Arc<OriginStats>,
}

impl Cluster for Madsim {
    type Dialer = TokioDialer;

    fn drivers(&self) -> &Drivers<TokioDialer> {
        &self.drivers
    }

    fn dialer(&self) -> TokioDialer {
        TokioDialer
    }

    fn origin(&self) -> &OriginStats {
        &self.origin
    }

    fn kill(&self, i: usize) {
        self.handle.kill(self.nodes[i]);
    }

    fn reset(&self, i: usize) {
        NetSim::current().reset_node(self.nodes[i]);
    }

    fn restart(&self, i: usize) {
        self.handle.restart(self.nodes[i]);
    }

    fn stall(&self, i: usize) {
        self.handle.pause(self.nodes[i]);
    }

    fn unstall(&self, i: usize) {
        self.handle.resume(self.nodes[i]);
    }

    fn cut(&self, a: usize, b: usize) {
        let net = NetSim::current();
        net.clog_link(self.nodes[a], self.nodes[b]);
        net.clog_link(self.nodes[b], self.nodes[a]);
    }

    fn heal(&self, a: usize, b: usize) {
        let net = NetSim::current();
        net.unclog_link(self.nodes[a], self.nodes[b]);
        net.unclog_link(self.nodes[b], self.nodes[a]);
    }
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

#[madsim::test]
async fn the_shared_subset_on_five_real_nodes_under_madsim() {
    let handle = Handle::current();
    let seed = handle.seed();
    eprintln!(
        "madsim seed {seed} (replay: MADSIM_TEST_SEED={seed} RUSTFLAGS=\"--cfg madsim\" \
         CARGO_TARGET_DIR=target/madsim cargo test -p dart-node --test madsim_cluster)"
    );
    let net = NetSim::current();

    let origin = Arc::new(OriginStats::default());
    let stats = origin.clone();
    net.add_dns_record("origin", ip(100));
    handle
        .create_node()
        .name("origin")
        .ip(ip(100))
        .init(move || {
            let stats = stats.clone();
            async move {
                let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), ORIGIN_PORT);
                let listener = TokioSeam.bind(addr).await.expect("origin binds");
                let object =
                    OriginObject { seed: OBJECT_SEED, size: SIZE, behaviour: Behaviour::Honours };
                let options = ServeOptions { date_header: false, ..ServeOptions::default() };
                serve_origin(listener, object, stats, std::future::pending(), options).await;
            }
        })
        .build();

    let drivers: Drivers<TokioDialer> = Arc::new(Mutex::new(BTreeMap::new()));
    let mut nodes = Vec::new();
    for i in 0..NODES {
        let last = u8::try_from(i + 1).expect("few nodes");
        net.add_dns_record(&host(i), ip(last));
        let drivers = drivers.clone();
        // The cache outlives the node: a restart runs this init again on the same store.
        let store = Arc::new(MemCache::default());
        let node = handle
            .create_node()
            .name(host(i))
            .ip(ip(last))
            .init(move || {
                let (drivers, store) = (drivers.clone(), store.clone());
                async move {
                    let running = dart_node::start_on(TokioSeam, &flags(i), Some(store))
                        .await
                        .unwrap_or_else(|e| panic!("n{i} starts: {e:#}"));
                    drivers.lock().expect("drivers").insert(i, running.driver.clone());
                    std::future::pending::<()>().await;
                    drop(running);
                }
            })
            .build();
        nodes.push(node.id());
    }

    net.add_dns_record("reader", ip(200));
    let reader = handle.create_node().name("reader").ip(ip(200)).build();
    let cluster = Madsim { handle: handle.clone(), nodes, drivers, origin };
    let trace = Arc::new(Mutex::new(String::new()));
    let written = trace.clone();
    reader
        .spawn(async move {
            subset::script(&World { cluster: &cluster, trace: written }).await;
        })
        .await
        .expect("the subset ran to its end");
    let trace = trace.lock().expect("trace").clone();
    // Under MADSIM_TEST_CHECK_DETERMINISM this function runs twice per seed in one process:
    // the second run's trace must be the first's, line for line (madsim itself compares the
    // random draws).
    let mut traces = TRACES.lock().expect("traces");
    match traces.get(&seed) {
        Some(first) => assert_eq!(first, &trace, "seed {seed}: two runs gave different traces"),
        None => {
            traces.insert(seed, trace);
        }
    }
}

/// The trace of each seed run so far in this process.
static TRACES: Mutex<BTreeMap<u64, String>> = Mutex::new(BTreeMap::new());

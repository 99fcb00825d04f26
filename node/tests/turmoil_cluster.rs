//! The shared scenario subset (`support/subset.rs`: a boot from a cyclic seed list, a herd, a
//! dead root, a reset root, a silent peer, a partition that heals, a client that hangs up, a
//! restart with the cache kept) on five real
//! nodes (`dart_node::start_on`, the shipped wiring) and an origin inside one turmoil simulation,
//! seeded. The same seed must give the same trace twice. `tests/madsim_cluster.rs` runs the same
//! subset under madsim.
//!
//! Replay another seed: `DART_TURMOIL_SEED=<n> cargo test -p dart-node --test turmoil_cluster`.

#![cfg(not(madsim))]

#[path = "support/subset.rs"]
mod subset;
#[path = "../../net-tokio/tests/support/turmoil_seam.rs"]
mod turmoil_seam;

use dart_net_tokio::cache::MemCache;
use dart_net_tokio::origin_server::{serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::server::ServeOptions;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use subset::{flags, host, Cluster, Drivers, World, NODES, OBJECT_SEED, ORIGIN_PORT, SIZE};
use turmoil_seam::{TurmoilDialer, TurmoilListener, TurmoilSeam};

const SEED: u64 = 0x005E_EDC1;

fn seed() -> u64 {
    std::env::var("DART_TURMOIL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(SEED)
}

/// Every host of the simulation but node `i`.
fn others(i: usize) -> Vec<String> {
    (0..NODES)
        .filter(|&j| j != i)
        .map(host)
        .chain(["origin".to_owned(), "reader".to_owned()])
        .collect()
}

/// The subset's verbs on turmoil (`support/subset.rs` has the table of both simulators).
struct Turmoil {
    drivers: Drivers<TurmoilDialer>,
    origin: Arc<OriginStats>,
    /// Per node: (start generation, up). A new generation makes its host drop the running node
    /// and start it again; `up` false makes it drop the node and wait.
    control: Vec<tokio::sync::watch::Sender<(u64, bool)>>,
}

impl Cluster for Turmoil {
    type Dialer = TurmoilDialer;

    fn drivers(&self) -> &Drivers<TurmoilDialer> {
        &self.drivers
    }

    fn dialer(&self) -> TurmoilDialer {
        TurmoilDialer
    }

    fn origin(&self) -> &OriginStats {
        &self.origin
    }

    fn kill(&self, i: usize) {
        for other in others(i) {
            turmoil::partition(host(i), other);
        }
    }

    fn reset(&self, i: usize) {
        self.control[i].send_modify(|(_, up)| *up = false);
    }

    fn restart(&self, i: usize) {
        for other in others(i) {
            turmoil::repair(host(i), other);
        }
        self.control[i].send_modify(|(generation, up)| {
            *generation += 1;
            *up = true;
        });
    }

    fn stall(&self, i: usize) {
        for other in others(i) {
            turmoil::hold(host(i), other);
        }
    }

    fn unstall(&self, i: usize) {
        for other in others(i) {
            turmoil::release(host(i), other);
        }
    }

    fn cut(&self, a: usize, b: usize) {
        turmoil::partition(host(a), host(b));
    }

    fn heal(&self, a: usize, b: usize) {
        turmoil::repair(host(a), host(b));
    }
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
    let drivers: Drivers<TurmoilDialer> = Arc::new(Mutex::new(BTreeMap::new()));
    let mut control = Vec::new();
    for i in 0..NODES {
        let (tx, rx) = tokio::sync::watch::channel((0u64, true));
        control.push(tx);
        let drivers = drivers.clone();
        // The cache outlives the node: a restart starts it again on the same store.
        let store = Arc::new(MemCache::default());
        sim.host(host(i), move || {
            let (drivers, store, mut control) = (drivers.clone(), store.clone(), rx.clone());
            async move {
                loop {
                    let generation = control.borrow_and_update().0;
                    let running = dart_node::start_on(TurmoilSeam, &flags(i), Some(store.clone()))
                        .await
                        .map_err(|e| e.to_string())?;
                    drivers.lock().expect("drivers").insert(i, running.driver.clone());
                    let down = control.wait_for(|&(g, up)| g != generation || !up).await.is_ok();
                    if !down {
                        std::future::pending::<()>().await;
                    }
                    running.abort().await;
                    let _ = control.wait_for(|&(_, up)| up).await;
                }
            }
        });
    }
    let trace = Arc::new(Mutex::new(String::new()));
    let cluster = Turmoil { drivers, origin, control };
    let t = trace.clone();
    sim.client("reader", async move {
        subset::script(&World { cluster: &cluster, trace: t }).await;
        Ok(())
    });
    sim.run().unwrap_or_else(|e| panic!("seed {seed}: simulation failed: {e}"));
    let t = trace.lock().expect("trace").clone();
    t
}

#[test]
fn the_shared_subset_on_five_real_nodes_under_turmoil() {
    let seed = seed();
    eprintln!(
        "turmoil seed {seed} (replay: DART_TURMOIL_SEED={seed} cargo test -p dart-node --test \
         turmoil_cluster)"
    );
    let first = simulate(seed);
    let second = simulate(seed);
    assert_eq!(first, second, "seed {seed}: two runs of one seed gave different outcomes");
}

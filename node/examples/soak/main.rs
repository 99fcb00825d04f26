//! Soak: three real `dart` processes and a loopback origin under hours of mixed load, every byte
//! checked.
//!
//! The origin serves several generated objects whose total (about 256 MiB) is four times each
//! node's cache (64 MiB), so eviction churns. Clients read random ranges and whole objects
//! through random nodes; every 20 s a herd of readers asks for one object at once; one node
//! (`node-2`) is killed (alternately SIGKILL and SIGTERM) every 30–60 s and restarted cold a few
//! seconds later. Every 10 s a line reports requests, errors, wrong bytes and each node's RSS and
//! open descriptors (from `/proc`); at the end a table and a verdict on whether RSS and
//! descriptors stayed flat (within 10 %) after warm-up.
//!
//! Run: `cargo run --release -p dart-node --example soak -- --minutes 30` (fractions allowed;
//! `--seed` replays a workload; `--help` lists the rest). The example builds the workspace's
//! `dart` binary with cargo in its own profile, or takes `--dart PATH`. Exit status: non-zero on
//! any wrong byte, wrong answer, request to a live node left unanswered, node crash or panic in a
//! node's log; RSS and descriptors are reported (`--require-flat` makes them count too).
//! docs/soak.md has a 30-minute table.

mod cluster;
mod origin;
mod report;
mod workload;

use clap::Parser;
use cluster::Node;
use origin::Object;
use report::{Event, Sample};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use workload::{Rng, Stats};

const NODES: usize = 3;
/// The node that is killed and restarted.
const FLAPPING: usize = 2;
const OBJECTS: u64 = 8;
const MIB: u64 = 1 << 20;
const HERD_EVERY: Duration = Duration::from_secs(20);
/// When the first kill comes (so that a one-minute run flaps too), then between kills.
const FIRST_KILL: (u64, u64) = (10, 20);
const KILL_EVERY: (u64, u64) = (30, 60);

/// Soak: three `dart` nodes and an origin under mixed load with a flapping peer.
#[derive(Parser, Debug)]
struct Args {
    /// How long to run (fractions allowed: 0.5 is 30 s).
    #[arg(long, default_value_t = 1.0)]
    minutes: f64,
    /// Seed of the workload (objects, asks, flap times); printed at start. Default: the clock.
    #[arg(long, value_parser = parse_seed)]
    seed: Option<u64>,
    /// Concurrent clients (and readers in each herd).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// The `dart` binary to run. Default: built by cargo in this example's profile.
    #[arg(long)]
    dart: Option<PathBuf>,
    /// Seconds between report lines.
    #[arg(long, default_value_t = 10)]
    report_secs: u64,
    /// Also fail when RSS or descriptors of a long-lived node drift more than 10 % after warm-up.
    #[arg(long)]
    require_flat: bool,
}

fn parse_seed(s: &str) -> Result<u64, String> {
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|e| format!("{s:?}: {e}"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    match rt.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::from(2)
        }
    }
}

/// The objects of `seed`: sizes between 16 and 48 MiB, none a multiple of the block size.
fn objects(seed: u64) -> Vec<Object> {
    let mut rng = Rng::new(seed ^ 0x00B1_EC75);
    (0..OBJECTS)
        .map(|i| Object {
            path: format!("/soak/object-{i}.bin"),
            seed: rng.next(),
            size: rng.between(16 * MIB, 48 * MIB) | 1,
        })
        .collect()
}

/// The soak's fast generator must produce the origin server's bytes.
fn check_generator() {
    let mut rng = Rng::new(7);
    for _ in 0..64 {
        let (seed, start, len) = (rng.next(), rng.below(1 << 30), rng.below(100) as usize);
        let mut got = vec![0; len];
        origin::fill(seed, start, &mut got);
        assert_eq!(got, dart_net_tokio::origin_server::generate(seed, start, len));
    }
}

/// Everything the run's tasks share.
struct Run {
    nodes: Arc<Vec<Node>>,
    objects: Arc<Vec<Object>>,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    events: Arc<Mutex<Vec<Event>>>,
    started: Instant,
}

async fn run(args: Args) -> Result<bool, String> {
    check_generator();
    let seed = args.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("1970");
        dart_core::hash::fmix64(t.as_nanos() as u64)
    });
    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    let dart = match args.dart.clone() {
        Some(p) => p,
        None => tokio::task::spawn_blocking(cluster::dart_binary).await.expect("build")?,
    };
    let objects = objects(seed);
    let working_set: u64 = objects.iter().map(|o| o.size).sum();
    println!(
        "soak: seed {seed:#x}, {:.1} min, {} clients, {NODES} nodes ({}), {OBJECTS} objects, \
         working set {} MiB, cache {} per node, block {}; node-{FLAPPING} flaps\n\
         soak: replay: cargo run --release -p dart-node --example soak -- --minutes {} --seed {seed:#x}",
        args.minutes,
        args.clients,
        dart.display(),
        working_set / MIB,
        cluster::CACHE_SIZE,
        cluster::BLOCK_SIZE,
        args.minutes,
    );
    let (origin, origin_stats) = origin::start(objects.clone()).await.map_err(|e| e.to_string())?;
    workload::ORIGIN.set(origin.to_string()).expect("set once");
    let root = std::env::temp_dir().join(format!("dart-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let nodes = cluster::plan(NODES, &root).map_err(|e| e.to_string())?;
    let peers = cluster::peers(&nodes);
    for n in &nodes {
        n.start(&dart, &peers)?;
    }
    let run = Run {
        nodes: Arc::new(nodes),
        objects: Arc::new(objects),
        stats: Arc::new(Stats::default()),
        stop: Arc::new(AtomicBool::new(false)),
        events: Arc::new(Mutex::new(Vec::new())),
        started: Instant::now(),
    };
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.clients {
        let s = seed ^ (i as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407);
        let (n, o, st, stop) =
            (run.nodes.clone(), run.objects.clone(), run.stats.clone(), run.stop.clone());
        tasks.spawn(workload::client(s, n, o, st, stop));
    }
    tasks.spawn(herds(&run, seed, args.clients));
    let flapper = tokio::spawn(flap(&run, seed, dart.clone(), peers));
    let samples = watch(&run, duration, Duration::from_secs(args.report_secs.max(1))).await;
    run.stop.store(true, Ordering::SeqCst);
    let _ = flapper.await;
    let drain = workload::REQUEST_BOUND + Duration::from_secs(10);
    if tokio::time::timeout(drain, async { while tasks.join_next().await.is_some() {} })
        .await
        .is_err()
    {
        run.events
            .lock()
            .expect("events")
            .push(Event::fatal_at(run.started, "clients did not finish"));
    }
    let elapsed = run.started.elapsed();
    let metrics = report::scrape(&run.nodes).await;
    stop_all(&run);
    let verdict = report::Verdict::of(&samples, warm_up(duration), FLAPPING);
    let input = report::Final {
        seed,
        elapsed,
        clients: args.clients,
        working_set,
        stats: &run.stats,
        origin: &origin_stats,
        events: &run.events.lock().expect("events"),
        samples: &samples,
        metrics: &metrics,
        verdict: &verdict,
        nodes: &run.nodes,
    };
    let correct = report::print_final(&input);
    Ok(correct && (!args.require_flat || verdict.flat()))
}

/// The warm-up excluded from the flatness verdict: a quarter of the run, 15 s to 5 min.
fn warm_up(run: Duration) -> Duration {
    (run / 4).clamp(Duration::from_secs(15), Duration::from_secs(300))
}

/// Samples every node's RSS and descriptors every `every` until `duration` passes, printing a
/// line each time; notes a node that exits while it should be up.
async fn watch(run: &Run, duration: Duration, every: Duration) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut crashed = [false; NODES];
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let sample = Sample::take(&run.nodes, run.started.elapsed());
        for (i, n) in run.nodes.iter().enumerate() {
            if let (false, false, Some(status)) =
                (crashed[i], n.down.load(Ordering::SeqCst), n.exited())
            {
                crashed[i] = true;
                let what = format!("{} exited while up: {status}", n.id);
                run.events.lock().expect("events").push(Event::fatal_at(run.started, &what));
            }
        }
        println!("{}", report::line(&sample, &run.stats));
        samples.push(sample);
        if run.started.elapsed() >= duration {
            return samples;
        }
    }
}

/// Kills and restarts node `FLAPPING` until the run stops; a restart that fails is fatal.
fn flap(
    run: &Run,
    seed: u64,
    dart: PathBuf,
    peers: String,
) -> impl std::future::Future<Output = ()> {
    let (nodes, stop, events, started) =
        (run.nodes.clone(), run.stop.clone(), run.events.clone(), run.started);
    async move {
        let mut rng = Rng::new(seed ^ 0xF1A9);
        let mut wait = Duration::from_secs(rng.between(FIRST_KILL.0, FIRST_KILL.1));
        for flap in 0u64.. {
            if sleep_unless(&stop, wait).await {
                return;
            }
            let kill = flap % 2 == 0;
            let n = nodes.clone();
            let status = tokio::task::spawn_blocking(move || n[FLAPPING].stop(kill)).await;
            let how = if kill { "SIGKILL" } else { "SIGTERM" };
            let text = format!("node-{FLAPPING} stopped ({how}): {status:?}");
            events.lock().expect("events").push(Event::at(started, &text));
            let down = rng.between(cluster::DOWN_FOR.0.as_secs(), cluster::DOWN_FOR.1.as_secs());
            if sleep_unless(&stop, Duration::from_secs(down)).await {
                return;
            }
            let (n, d, p) = (nodes.clone(), dart.clone(), peers.clone());
            let started_again =
                tokio::task::spawn_blocking(move || n[FLAPPING].start(&d, &p)).await;
            let text = match started_again {
                Ok(Ok(())) => Event::at(started, &format!("node-{FLAPPING} restarted (cold)")),
                other => Event::fatal_at(started, &format!("node-{FLAPPING} restart: {other:?}")),
            };
            events.lock().expect("events").push(text);
            wait = Duration::from_secs(rng.between(KILL_EVERY.0, KILL_EVERY.1));
        }
    }
}

/// Sleeps `d` in short steps; true when `stop` was set meanwhile.
async fn sleep_unless(stop: &AtomicBool, d: Duration) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.load(Ordering::SeqCst) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200).min(until - Instant::now())).await;
    }
    stop.load(Ordering::SeqCst)
}

/// Every [`HERD_EVERY`], `readers` clients read one whole object at once.
fn herds(run: &Run, seed: u64, readers: usize) -> impl std::future::Future<Output = ()> {
    let (nodes, objects, stats, stop) =
        (run.nodes.clone(), run.objects.clone(), run.stats.clone(), run.stop.clone());
    async move {
        let mut rng = Rng::new(seed ^ 0x4E2D);
        while !sleep_unless(&stop, HERD_EVERY).await {
            let object = objects[rng.below(objects.len() as u64) as usize].clone();
            workload::herd(nodes.clone(), object, readers, stats.clone()).await;
        }
    }
}

/// Stops every running node with SIGTERM; one that does not exit cleanly is fatal.
fn stop_all(run: &Run) {
    for n in run.nodes.iter().filter(|n| !n.down.load(Ordering::SeqCst)) {
        match n.stop(false) {
            Ok(status) if status.success() => {}
            other => {
                let what = format!("{} did not stop cleanly on SIGTERM: {other:?}", n.id);
                run.events.lock().expect("events").push(Event::fatal_at(run.started, &what));
            }
        }
    }
}

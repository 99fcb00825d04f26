//! Garbage: the `dart` binary's three listeners (client, peer, admin) fuzzed with at least
//! 100,000 malformed requests, most of them mutations of valid requests that get past the request
//! line, the rest random byte streams; pipelined on many concurrent connections, some half-closed,
//! some dropped mid-head, a few stalled until the node closes them. The node must not crash or log a
//! panic, must answer a valid read with exact bytes afterwards (and valid reads interleaved with
//! the garbage all along), and its resident memory must stay bounded.
//!
//! Loopback only: every URL the fuzzer sends names an address literal (checked before sending),
//! so not even a DNS query leaves the machine. Deterministic from a seed printed at the start:
//! `DART_FUZZ_SEED=<seed>` replays a run's bytes (ports and MAC timestamps aside), and
//! `DART_FUZZ_REQUESTS` (default 100,000) and `DART_FUZZ_CONNECTIONS` (default 64) size it.

use dart_core::peer_auth::ClusterSecret;
use dart_net_tokio::origin_server::{generate, Behaviour};
use gen::{Ctx, Kind, Plan, Plane, Shape};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use wire::{Answer, End, Outcome};

mod gen;
mod mutate;
mod rng;
#[path = "../support/mod.rs"]
mod support;
mod wire;

const SEED: u64 = 0x6A_8BA6E;
const SIZE: u64 = 40 * 1024 + 17;
const BLOCK: u64 = 16 * 1024;
const CHUNK: u64 = 4 * BLOCK;
const SECRET: &str = "garbage-test-cluster-secret-0123456789";
const OTHER_SECRET: &str = "not-this-cluster-secret-9876543210";
/// The node's head bounds: small, so that oversized heads are cheap and stalls end soon.
const HEAD_BYTES_MAX: &str = "16KiB";
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the node may take to close a connection after our last byte: a partial head is
/// closed after the head timeout (pipelined ones too, see the last test); the rest is slack for a
/// loaded machine.
const CLOSE_BOUND: Duration = Duration::from_secs(15);
/// Generous bound on the node's resident-memory growth over the whole run.
const RSS_GROWTH_MAX_KIB: u64 = 256 << 10;
const STARTUP_BOUND: Duration = Duration::from_secs(20);

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

/// The running node and what it printed on stderr.
struct Node {
    child: Child,
    stderr: tokio::task::JoinHandle<String>,
    client: SocketAddr,
    admin: SocketAddr,
    peer: SocketAddr,
    _dir: support::TempDir,
}

/// A free port outside the ephemeral range ([`support::free_port`]).
fn free_port() -> u16 {
    support::free_port()
}

async fn start_node(self_id: &str, idle: Duration) -> Node {
    let dir = support::temp_dir("garbage", self_id);
    std::fs::create_dir_all(&dir.0).expect("dir");
    let secret_file = dir.0.join("secret");
    std::fs::write(&secret_file, SECRET).expect("secret");
    let peer: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_dart"))
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--peer-listen", &peer.to_string()])
        .args(["--self-id", self_id, "--peers", &format!("{self_id}@{peer}")])
        .arg("--cluster-secret-file")
        .arg(&secret_file)
        .args(["--cache-size", "2MiB", "--mem-size", "512KiB"])
        .args(["--block-size", &BLOCK.to_string(), "--chunk-size", &CHUNK.to_string()])
        .args(["--allow-upstream", "127.0.0.0/8", "--public-upstream", "127.0.0.0/8"])
        .args(["--max-header-bytes", HEAD_BYTES_MAX])
        .args(["--header-read-timeout", &format!("{}s", HEAD_TIMEOUT.as_secs())])
        .args(["--idle-timeout", &format!("{}s", idle.as_secs()), "--drain-secs", "2"])
        .arg("--cache-dir")
        .arg(dir.0.join("cache"))
        .env("DART_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the dart binary");
    let mut err = child.stderr.take().expect("stderr");
    let stderr = tokio::spawn(async move {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s).await;
        s
    });
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let banner = tokio::time::timeout(STARTUP_BOUND, lines.next_line())
        .await
        .expect("a banner within the startup bound")
        .expect("read stdout")
        .expect("dart exited before its banner");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let field = |prefix: &str| -> SocketAddr {
        let at = banner.find(prefix).unwrap_or_else(|| panic!("no {prefix:?} in {banner:?}"));
        let rest = &banner[at + prefix.len()..];
        let end = rest.find([' ', '|', ',']).unwrap_or(rest.len());
        rest[..end].trim().parse().unwrap_or_else(|_| panic!("bad {prefix:?} in {banner:?}"))
    };
    let (client, admin) = (field("client="), field("admin: "));
    assert_eq!(field("peer="), peer, "{banner}");
    Node { child, stderr, client, admin, peer, _dir: dir }
}

/// The node's log lines grouped by level, target and message (the words before the first
/// `key=value` field).
fn log_kinds(log: &str) -> BTreeMap<String, u64> {
    let mut kinds = BTreeMap::new();
    for line in log.lines() {
        let text = line.split_once("Z ").map_or(line, |(_, rest)| rest);
        let words: Vec<&str> = text.split_whitespace().take_while(|w| !w.contains('=')).collect();
        *kinds.entry(words.join(" ")).or_default() += 1;
    }
    kinds
}

/// `(VmRSS, VmHWM)` of `pid` in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Counts over the whole run.
#[derive(Default)]
struct Tally {
    connections: u64,
    connect_errors: u64,
    malformed: u64,
    mutated: u64,
    random: u64,
    controls: u64,
    controls_checked: u64,
    control_failures: Vec<String>,
    answered: u64,
    unanswered: u64,
    /// Answers whose body the close cut: hyper (with its default `half_close(false)`) closes a
    /// connection whose client half-closed while its last request is in flight.
    incomplete_bodies: u64,
    /// Answers by listener and status (0: not an HTTP status line).
    by_status: BTreeMap<(Plane, u16), u64>,
    by_mutation: BTreeMap<&'static str, u64>,
    by_flavour: BTreeMap<&'static str, u64>,
    ends: BTreeMap<End, u64>,
    write_cut: u64,
    stalls: u64,
    stall_close_max: Duration,
    stuck: Vec<String>,
    /// Unparsable or cut answers, for the report.
    odd: Vec<String>,
    durations: Vec<Duration>,
}

impl Tally {
    fn record(
        &mut self,
        index: u64,
        plan: &Plan,
        outcome: std::io::Result<Outcome>,
        took: Duration,
    ) {
        self.connections += 1;
        self.durations.push(took);
        self.count_items(plan);
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                self.connect_errors += 1;
                return eprintln!("connection {index}: connect failed: {e}");
            }
        };
        *self.ends.entry(outcome.end).or_default() += 1;
        self.write_cut += u64::from(outcome.write_cut);
        if outcome.end == End::Stuck && self.stuck.len() < 5 {
            let head: String = String::from_utf8_lossy(&plan.bytes()).chars().take(300).collect();
            self.stuck.push(format!("connection {index} ({:?}): {head:?}", plan.plane));
        }
        if plan.ending == gen::Ending::Stall {
            self.stalls += 1;
            match outcome.stall_closed_after {
                Some(t) => self.stall_close_max = self.stall_close_max.max(t),
                None => self.stuck.push(format!("connection {index}: a stalled head kept open")),
            }
        }
        if plan.ending == gen::Ending::Drop {
            return;
        }
        self.answered += outcome.answers.len() as u64;
        self.unanswered += (plan.items.len() - outcome.answers.len()) as u64;
        for (a, item) in outcome.answers.iter().zip(&plan.items) {
            *self.by_status.entry((plan.plane, a.status)).or_default() += 1;
            self.incomplete_bodies += u64::from(!a.complete);
            if (a.status == 0 || !a.complete) && self.odd.len() < 6 {
                let sent: String = String::from_utf8_lossy(&item.bytes).chars().take(300).collect();
                self.odd.push(format!(
                    "connection {index} ({:?}): {:?} with {} body bytes (complete: {}) to {:?} \
                     {sent:?}",
                    plan.plane,
                    a.head,
                    a.body.len(),
                    a.complete,
                    item.kind
                ));
            }
        }
        if let Some(Kind::Control { start, len }) = plan.items.first().map(|i| &i.kind) {
            self.check_control(index, *start, *len, outcome.answers.first());
        }
    }

    fn count_items(&mut self, plan: &Plan) {
        for item in &plan.items {
            match &item.kind {
                Kind::Control { .. } => self.controls += 1,
                Kind::Mutated(names) => {
                    self.mutated += 1;
                    for name in names {
                        *self.by_mutation.entry(name).or_default() += 1;
                    }
                }
                Kind::Random(flavour) => {
                    self.random += 1;
                    *self.by_flavour.entry(flavour).or_default() += 1;
                }
            }
        }
        self.malformed += plan.malformed();
    }

    fn check_control(&mut self, index: u64, start: u64, len: u64, answer: Option<&Answer>) {
        self.controls_checked += 1;
        let ok = answer.is_some_and(|a| {
            a.status == 206 && a.complete && a.body[..] == generate(SEED, start, len as usize)[..]
        });
        if !ok && self.control_failures.len() < 5 {
            let got = answer.map(|a| (a.status, a.body.len(), a.complete));
            self.control_failures.push(format!(
                "connection {index}: bytes={start}-{}: got (status, body bytes, complete) {got:?}",
                start + len - 1
            ));
        }
    }
}

/// How many connections carry at least `requests` malformed requests under `seed`.
fn connections_for(seed: u64, requests: u64) -> u64 {
    let mut sum = 0;
    let mut n = 0;
    while sum < requests {
        sum += Shape::of(seed, n).malformed();
        n += 1;
    }
    n
}

async fn fuzz(ctx: Arc<Ctx>, seed: u64, connections: u64, workers: u64) -> Tally {
    let next = Arc::new(AtomicU64::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (ctx, next, tally) = (ctx.clone(), next.clone(), tally.clone());
        tasks.spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= connections {
                    return;
                }
                let plan = gen::plan(seed, index, &ctx);
                let addr = match plan.plane {
                    Plane::Client => ctx.client,
                    Plane::Peer => ctx.peer,
                    Plane::Admin => ctx.admin,
                };
                let t0 = Instant::now();
                let outcome = wire::run(addr, &plan, CLOSE_BOUND).await;
                tally.lock().expect("tally").record(index, &plan, outcome, t0.elapsed());
            }
        });
    }
    let progress = {
        let (next, tally) = (next.clone(), tally.clone());
        tokio::spawn(async move {
            let t0 = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let sent = tally.lock().expect("tally").malformed;
                let at = next.load(Ordering::Relaxed).min(connections);
                println!(
                    "  {:>4.0?}: {at}/{connections} connections, {sent} malformed sent",
                    t0.elapsed()
                );
            }
        })
    };
    while let Some(r) = tasks.join_next().await {
        r.expect("a fuzz worker");
    }
    progress.abort();
    let _ = progress.await;
    Arc::try_unwrap(tally).ok().expect("workers done").into_inner().expect("tally")
}

fn print_tally(t: &Tally, took: Duration) {
    println!(
        "sent {} malformed requests ({} mutations of valid requests, {} random byte streams) and \
         {} valid control reads on {} connections in {took:.1?} ({:.0} requests/s)",
        t.malformed,
        t.mutated,
        t.random,
        t.controls,
        t.connections,
        (t.malformed + t.controls) as f64 / took.as_secs_f64()
    );
    println!("  mutations applied: {:?}", t.by_mutation);
    println!("  random streams: {:?}", t.by_flavour);
    for plane in [Plane::Client, Plane::Peer, Plane::Admin] {
        let mut classes: BTreeMap<u16, u64> = BTreeMap::new();
        let mut statuses = Vec::new();
        for ((_, status), n) in t.by_status.iter().filter(|((p, _), _)| *p == plane) {
            *classes.entry(status / 100).or_default() += n;
            statuses.push(format!("{status}:{n}"));
        }
        let classes: Vec<String> = classes.iter().map(|(c, n)| format!("{c}xx {n}")).collect();
        println!(
            "  answers on the {plane:?} listener: {} ({})",
            classes.join(", "),
            statuses.join(" ")
        );
    }
    println!(
        "  answered {}, unanswered {} (the node closes after a malformed request, and when the \
         client half-closes with its last request in flight), {} answer bodies cut by that close",
        t.answered, t.unanswered, t.incomplete_bodies
    );
    for odd in &t.odd {
        println!("    {odd}");
    }
    println!(
        "  connections closed by the node {}, reset by the node {}, dropped by us mid-head {}, \
         held {}, capped {}; {} closed before taking all our bytes; {} stalled mid-head, all closed \
         by the node within {:.1?}; {} connect errors",
        t.ends.get(&End::Closed).unwrap_or(&0),
        t.ends.get(&End::Reset).unwrap_or(&0),
        t.ends.get(&End::Dropped).unwrap_or(&0),
        t.ends.get(&End::Stuck).unwrap_or(&0),
        t.ends.get(&End::Capped).unwrap_or(&0),
        t.write_cut,
        t.stalls,
        t.stall_close_max,
        t.connect_errors
    );
    let mut d = t.durations.clone();
    d.sort();
    let q = |f: f64| d.get(((d.len().max(1) - 1) as f64 * f) as usize).copied().unwrap_or_default();
    println!(
        "  control reads checked byte for byte: {}; connection time p50 {:.1?}, p99 {:.1?}, max \
         {:.1?}",
        t.controls_checked,
        q(0.5),
        q(0.99),
        q(1.0)
    );
}

async fn final_reads(node: &Node, ctx: &Ctx) {
    let url = ctx.object_url("/final/object.bin");
    let r = support::get(&format!("http://{}/dart/{url}", node.client), &[]).await;
    assert_eq!(r.status, 200, "a valid read after the fuzz: {}", r.text());
    assert!(r.body[..] == generate(SEED, 0, SIZE as usize)[..], "a valid read: wrong bytes");
    let range = [("range", "bytes=1000-30000")];
    let r = support::get(&format!("http://{}/dart/{url}", node.client), &range).await;
    assert_eq!(r.status, 206, "a valid range after the fuzz: {}", r.text());
    assert!(r.body[..] == generate(SEED, 1000, 29_001)[..], "a valid range: wrong bytes");
    let target = ctx.block_target(&url, 1);
    let auth = dart_core::peer_auth::Covered {
        method: "GET",
        target: &target,
        hop: b"0",
        origin: url.as_bytes(),
        ..Default::default()
    }
    .sign(&ctx.secret, gen::unix_now());
    let headers = [("x-dart-hop", "0"), ("x-dart-origin", url.as_str()), ("x-dart-auth", &auth)];
    let r = support::get(&format!("http://{}{target}", node.peer), &headers).await;
    assert_eq!(r.status, 200, "a signed peer block request after the fuzz: {}", r.text());
    let block = generate(SEED, BLOCK, BLOCK as usize);
    assert!(support::peer_block(&r.body) == &block[..], "peer block: wrong bytes");
    let r = support::get(&format!("http://{}/healthz", node.admin), &[]).await;
    assert_eq!((r.status, r.text().as_str()), (200, "ok\n"), "healthz after the fuzz");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_on_every_listener_never_crash_panic_or_grow_the_node() {
    let seed = env_u64("DART_FUZZ_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("1970");
        dart_core::hash::fmix64(t.as_nanos() as u64)
    });
    let requests = env_u64("DART_FUZZ_REQUESTS").unwrap_or(100_000);
    let workers = env_u64("DART_FUZZ_CONNECTIONS").unwrap_or(64);
    println!(
        "garbage: seed {seed:#x}, {requests} malformed requests, {workers} concurrent connections \
         (replay: DART_FUZZ_SEED={seed:#x} cargo test -p dart-node --test garbage -- --nocapture)"
    );
    let origin = support::origin(SEED, Behaviour::Honours, SIZE).await;
    let self_id = "fuzz";
    let mut node = start_node(self_id, IDLE_TIMEOUT).await;
    let pid = node.child.id().expect("running");
    let ctx = Arc::new(Ctx {
        origin: origin.addr,
        client: node.client,
        peer: node.peer,
        admin: node.admin,
        self_id: self_id.into(),
        secret: ClusterSecret::from_bytes(SECRET.as_bytes()).expect("secret"),
        other_secret: ClusterSecret::from_bytes(OTHER_SECRET.as_bytes()).expect("secret"),
        size: SIZE,
        block: BLOCK,
        chunk: CHUNK,
        paths: (0..8).map(|i| format!("/objects/{i}.bin")).collect(),
    });
    final_reads(&node, &ctx).await; // Warm-up: every plane has served once.
    let (rss_before, _) = memory_kib(pid);
    let fds_before = open_fds(pid);

    let connections = connections_for(seed, requests);
    let t0 = Instant::now();
    let tally = fuzz(ctx.clone(), seed, connections, workers).await;
    let took = t0.elapsed();
    print_tally(&tally, took);

    assert!(node.child.try_wait().expect("wait").is_none(), "the node exited during the fuzz");
    let (rss_after, hwm) = memory_kib(pid);
    let fds_after = open_fds(pid);
    final_reads(&node, &ctx).await;
    println!(
        "node RSS: {rss_before} KiB after warm-up, {rss_after} KiB after the fuzz (growth {} KiB, \
         peak {hwm} KiB); open fds {fds_before} -> {fds_after}",
        rss_after as i64 - rss_before as i64
    );

    let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    assert!(status.expect("run kill").success());
    let exit = tokio::time::timeout(Duration::from_secs(15), node.child.wait()).await;
    let exit = exit.expect("the node stops within its drain bound").expect("wait");
    let stderr = (&mut node.stderr).await.expect("stderr reader");
    let panics: Vec<&str> = stderr.lines().filter(|l| l.contains("panicked")).collect();
    let warnings = stderr.lines().filter(|l| l.contains(" WARN ") || l.contains("ERROR")).count();
    println!("node log: {} lines, {warnings} warnings or errors", stderr.lines().count());
    for (kind, n) in log_kinds(&stderr) {
        println!("  {n:>6} x {kind}");
    }

    assert!(panics.is_empty(), "panics in the node's log:\n{}", panics.join("\n"));
    assert!(exit.success(), "the node exited with {exit:?}");
    assert!(tally.malformed >= requests, "sent {} < {requests}", tally.malformed);
    assert!(2 * tally.mutated >= tally.malformed, "fewer than half were mutations");
    assert_eq!(tally.connect_errors, 0, "the node refused connections");
    assert!(tally.control_failures.is_empty(), "controls: {:#?}", tally.control_failures);
    assert!(tally.stuck.is_empty(), "connections the node held: {:#?}", tally.stuck);
    assert!(
        rss_after.saturating_sub(rss_before) < RSS_GROWTH_MAX_KIB,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
}

/// How long the node takes to close a connection after answering `first`, when `second` (a
/// partial head) came with `first` in one write (pipelined) or after the answer.
async fn close_after_partial_head(
    addr: SocketAddr,
    first: &[u8],
    second: &[u8],
    pipelined: bool,
) -> Duration {
    use tokio::io::AsyncWriteExt as _;
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(&if pipelined { [first, second].concat() } else { first.to_vec() })
        .await
        .expect("write");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut chunk).await.expect("read the answer");
        assert!(n > 0, "closed before answering");
        buf.extend_from_slice(&chunk[..n]);
    }
    let answered = Instant::now();
    if !pipelined {
        s.write_all(second).await.expect("write");
    }
    loop {
        match tokio::time::timeout(Duration::from_secs(60), s.read(&mut chunk)).await {
            Err(_) => panic!("not closed within a minute"),
            Ok(Ok(0) | Err(_)) => return answered.elapsed(),
            Ok(Ok(_)) => {}
        }
    }
}

/// Found by the fuzzer (its stalled connections were closed after the idle timeout, not the head
/// timeout): a partial head that arrived in the same segment as the request before it was
/// bounded by `--idle-timeout` instead of `--header-read-timeout`, because the head timer of a
/// keep-alive connection started its head bound only at the first byte read *after* it was
/// armed. With the defaults a client held such a connection 60 s instead of 15 s. The timer now
/// knows where the last head ended in the stream, so bytes already read past it start the head
/// bound at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_head_pipelined_behind_a_request_is_closed_by_the_head_timeout() {
    let idle = Duration::from_secs(12);
    let node = start_node("stall", idle).await;
    let first = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let second = b"GET /hea";
    let after = close_after_partial_head(node.admin, first, second, false).await;
    let pipelined = close_after_partial_head(node.admin, first, second, true).await;
    println!(
        "a partial second head is closed {after:.1?} after the first answer when it arrives \
         after that answer, {pipelined:.1?} when it arrived with the first request (head timeout \
         {HEAD_TIMEOUT:?}, idle timeout {idle:?})"
    );
    let bound = HEAD_TIMEOUT + Duration::from_secs(3);
    assert!(after < bound, "a partial head sent after an answer held {after:?}");
    assert!(pipelined < bound, "a partial head pipelined behind a request held {pipelined:?}");
}

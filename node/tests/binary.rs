//! The `dart` binary as a user runs it: spawned as a child process against an in-test origin,
//! found through the banner it prints, read through, scraped, and stopped with SIGTERM.

use bytes::Bytes;
use dart_net_tokio::origin_server::{generate, Behaviour};
use dart_net_tokio::seam::{SeamConnector, TokioDialer};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

mod support;
use support::{Origin, TempDir};

async fn origin(behaviour: Behaviour, size: u64) -> Origin {
    support::origin(SEED, behaviour, size).await
}

fn temp_dir(name: &str) -> TempDir {
    support::temp_dir("bin", name)
}

const SEED: u64 = 0xB1_0B;
const BLOCK: u64 = 256 * 1024;
/// How long a starting node may take to print its banner (a debug build on a busy machine).
const STARTUP_BOUND: Duration = Duration::from_secs(20);
/// Slack over `--drain-secs` for signal delivery, runtime teardown and process exit.
const EXIT_SLACK: Duration = Duration::from_secs(3);

/// The flags every test node runs with: loopback, ephemeral ports, a small geometry.
fn node_args(dir: &TempDir, drain_secs: u64) -> Vec<String> {
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--cache-size",
        "16MiB",
        "--mem-size",
        "1MiB",
        "--block-size",
        "256KiB",
        "--chunk-size",
        "4MiB",
        "--allow-upstream",
        "127.0.0.0/8",
        "--public-upstream",
        "127.0.0.0/8",
    ];
    let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    v.extend(["--cache-dir".into(), dir.0.display().to_string()]);
    v.extend(["--drain-secs".into(), drain_secs.to_string()]);
    v
}

fn dart(args: &[String]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dart"));
    c.args(args).stdin(Stdio::null()).kill_on_drop(true);
    c
}

/// A running `dart` child and what it printed.
struct Dart {
    child: Child,
    stdout: mpsc::UnboundedReceiver<String>,
    stderr: tokio::task::JoinHandle<String>,
    client: SocketAddr,
    admin: SocketAddr,
}

/// Parses `dart client=<addr> | mode: ... | admin: <addr> | ...`.
fn parse_banner(line: &str) -> (SocketAddr, SocketAddr) {
    let mut parts = line.split(" | ");
    let client = parts.next().and_then(|p| p.strip_prefix("dart client=")).expect(line);
    let admin = parts.find_map(|p| p.strip_prefix("admin: ")).expect(line);
    (client.parse().expect("client addr"), admin.parse().expect("admin addr"))
}

async fn start_dart(args: &[String]) -> Dart {
    start_command(dart(args)).await
}

/// [`start_dart`] with a command made by the caller (its environment, say).
async fn start_command(mut command: Command) -> Dart {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the dart binary");
    let (tx, mut stdout) = mpsc::unbounded_channel();
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = tx.send(line);
        }
    });
    let mut err = child.stderr.take().expect("stderr");
    let stderr = tokio::spawn(async move {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s).await;
        s
    });
    let banner = tokio::time::timeout(STARTUP_BOUND, stdout.recv())
        .await
        .expect("a banner within the startup bound")
        .unwrap_or_else(|| panic!("dart exited before its banner: {:?}", child.try_wait()));
    let (client, admin) = parse_banner(&banner);
    Dart { child, stdout, stderr, client, admin }
}

impl Dart {
    fn sigterm(&self) {
        let pid = self.child.id().expect("still running");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {pid}");
    }

    /// Waits for the exit (bounded), returning the status, how long it took from now, and every
    /// line printed on stdout after the banner and on stderr.
    async fn exit(mut self, bound: Duration) -> (ExitStatus, Duration, Vec<String>, String) {
        let t0 = Instant::now();
        let status = tokio::time::timeout(bound, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("dart still running {bound:?} after SIGTERM"))
            .expect("wait");
        let took = t0.elapsed();
        let mut lines = Vec::new();
        while let Some(l) = self.stdout.recv().await {
            lines.push(l);
        }
        (status, took, lines, self.stderr.await.expect("stderr reader"))
    }
}

type C = Client<SeamConnector<TokioDialer>, Empty<Bytes>>;

fn client() -> C {
    Client::builder(TokioExecutor::new())
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(2)))
}

async fn get(c: &C, url: &str, range: Option<&str>) -> (u16, http::HeaderMap, Bytes) {
    let mut req = http::Request::get(url);
    if let Some(r) = range {
        req = req.header(http::header::RANGE, r);
    }
    let resp = c.request(req.body(Empty::new()).expect("request")).await.expect("response");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("complete body").to_bytes();
    (parts.status.as_u16(), parts.headers, body)
}

fn object_url(d: &Dart, o: &Origin, path: &str) -> String {
    format!("http://{}/dart/http://{}{path}", d.client, o.addr)
}

#[tokio::test]
async fn the_binary_serves_bytes_health_and_metrics_then_exits_cleanly_on_sigterm() {
    let size = 3 * BLOCK + 1000;
    let o = origin(Behaviour::Honours, size).await;
    let dir = temp_dir("serve");
    let drain_secs = 5;
    let d = start_dart(&node_args(&dir, drain_secs)).await;
    let c = client();
    let url = object_url(&d, &o, "/models/m.bin");

    let (status, _, body) = get(&c, &url, None).await;
    assert_eq!(status, 200);
    assert!(body[..] == generate(SEED, 0, size as usize)[..], "full read: bytes differ");
    let (a, b) = (BLOCK - 10, 2 * BLOCK + 10);
    let (status, _, body) = get(&c, &url, Some(&format!("bytes={a}-{b}"))).await;
    assert_eq!(status, 206);
    assert!(body[..] == generate(SEED, a, (b - a + 1) as usize)[..], "range: bytes differ");
    assert_eq!(o.stats.requests(), 1 + 4, "one probe and one fetch per block, then cache hits");

    let (status, _, body) = get(&c, &format!("http://{}/healthz", d.admin), None).await;
    assert_eq!((status, &body[..]), (200, &b"ok\n"[..]));
    let (status, headers, body) = get(&c, &format!("http://{}/metrics", d.admin), None).await;
    assert_eq!(status, 200);
    let ctype = headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    assert_eq!(ctype, Some("text/plain; version=0.0.4; charset=utf-8"));
    let text = String::from_utf8(body.to_vec()).expect("utf-8 metrics");
    assert!(text.contains("dart_block_source_total{source=\"origin\"} 4"), "{text}");
    assert!(text.contains("dart_block_source_total{source=\"cache\"} 3"), "{text}");
    assert!(text.contains("# TYPE dart_block_fetch_seconds histogram"), "{text}");
    // Tail-control counters exist from the start (a lone node never hedges).
    for event in ["fired", "primary_won", "backup_won"] {
        assert!(text.contains(&format!("dart_hedge_total{{event=\"{event}\"}} 0")), "{text}");
    }
    for result in ["sent", "alive", "silent"] {
        let sample = format!("dart_hedge_probe_total{{result=\"{result}\"}} 0");
        assert!(text.contains(&sample), "{text}");
    }
    assert!(text.contains("dart_origin_window_streamed_total "), "{text}");
    for result in ["resumed", "refused"] {
        let sample = format!("dart_relay_stream_resume_total{{result=\"{result}\"}} 0");
        assert!(text.contains(&sample), "{text}");
    }
    assert!(text.contains("dart_relay_early_answer_total{reason=\"upstream_slow\"} 0"), "{text}");
    assert!(text.contains("dart_peer_failover_total 0"), "{text}");
    assert!(text.contains("dart_warm_blocks_dropped_total 0"), "{text}");

    d.sigterm();
    let bound = Duration::from_secs(drain_secs) + EXIT_SLACK;
    let (status, took, stdout, stderr) = d.exit(bound).await;
    assert!(status.success(), "exit {status:?}; stderr:\n{stderr}");
    assert!(took < bound, "took {took:?}");
    assert_eq!(
        stdout,
        [
            format!("dart: shutting down (draining for up to {drain_secs}s)"),
            "dart: stopped (drained cleanly)".to_string()
        ]
    );
    assert!(!stderr.contains('\u{1b}'), "log output to a pipe carries no colour codes: {stderr:?}");
}

/// The binary caps glibc's malloc arenas at one per core before its runtime starts, and leaves
/// the cap to the environment when it sets one (`MALLOC_ARENA_MAX`, or `GLIBC_TUNABLES`); its
/// start-up log says which.
#[tokio::test]
async fn the_binary_caps_malloc_arenas_unless_the_environment_names_a_cap() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let tunables = "glibc.malloc.arena_max=3";
    for (i, env) in [None, Some(("MALLOC_ARENA_MAX", "3")), Some(("GLIBC_TUNABLES", tunables))]
        .into_iter()
        .enumerate()
    {
        let dir = temp_dir(&format!("arenas-{i}"));
        let mut c = dart(&node_args(&dir, 1));
        for var in ["MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "DART_LOG"] {
            c.env_remove(var);
        }
        c.envs(env);
        let d = start_command(c).await;
        d.sigterm();
        let (status, _, _, stderr) = d.exit(Duration::from_secs(1) + EXIT_SLACK).await;
        assert!(status.success(), "{env:?}: exit {status:?}; stderr:\n{stderr}");
        match env {
            Some(_) => {
                let line = "malloc arenas left to the environment";
                assert!(stderr.contains(line), "{env:?}: {stderr}");
                assert!(!stderr.contains("capped"), "{env:?}: {stderr}");
            }
            None if cfg!(all(target_os = "linux", target_env = "gnu")) => {
                let line = format!("malloc arenas capped at one per core arenas={cores}");
                assert!(stderr.contains(&line), "{stderr}");
            }
            None => {}
        }
    }
}

#[tokio::test]
async fn a_second_node_on_the_same_cache_dir_fails_fast_naming_the_lock() {
    let dir = temp_dir("lock");
    let first = start_dart(&node_args(&dir, 1)).await;
    let t0 = Instant::now();
    let out = tokio::time::timeout(STARTUP_BOUND, dart(&node_args(&dir, 1)).output())
        .await
        .expect("the second node gives up instead of waiting for the lock")
        .expect("run the second node");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second node on one cache dir must not start");
    assert!(out.stdout.is_empty(), "no banner: {:?}", String::from_utf8_lossy(&out.stdout));
    let lock = dir.0.join(".dart.lock");
    assert!(stderr.contains(&lock.display().to_string()), "names the lock file: {stderr}");
    assert!(stderr.contains("in use by another dart instance"), "{stderr}");
    assert!(t0.elapsed() < Duration::from_secs(10), "fails fast, took {:?}", t0.elapsed());

    first.sigterm();
    let (status, ..) = first.exit(Duration::from_secs(1) + EXIT_SLACK).await;
    assert!(status.success(), "the first node is unaffected and stops cleanly");
}

#[tokio::test]
async fn bad_flags_exit_non_zero_with_a_clear_message_before_touching_the_disk() {
    let cases: [(&[&str], &str); 13] = [
        (&["--cache-size", "0"], "--cache-size (0) must be at least --block-size"),
        (
            &["--block-size", "3MiB", "--chunk-size", "256MiB"],
            "chunk size 268435456 is not a multiple of block size 3145728",
        ),
        (&["--owned-fraction", "1"], "--owned-fraction must be strictly between 0 and 1, got 1"),
        (&["--namespace", "team\u{1f}a"], "invalid --namespace"),
        (
            &["--self-id", "a", "--peers", "a@h:1", "--discover", "h:2"],
            "--peers and --discover are mutually exclusive",
        ),
        (&["--discover", "static:h:9000"], "--self-id is required with --discover"),
        (&["--self-id", "a", "--discover", "static:h"], "invalid --discover"),
        (
            &["--self-id", "a", "--discover", "k8s:ns/dart"],
            "--discover scheme \"k8s\" is not supported",
        ),
        (&["--self-id", "a", "--discover", "dns:name"], "invalid --discover"),
        (
            &["--self-id", "a", "--discover", "h:9000", "--peer-advertise", "0.0.0.0:9000"],
            "invalid --peer-advertise",
        ),
        (&["--peer-advertise", "10.0.0.1:9000"], "--peer-advertise needs --discover"),
        (&["--reader-tree"], "--reader-tree needs --peers or --discover"),
        (
            &[
                "--self-id",
                "a",
                "--discover",
                "h:9000",
                "--discover-interval",
                "5s",
                "--forget-after",
                "6s",
            ],
            "--forget-after (6s) must be at least twice --discover-interval (5s)",
        ),
    ];
    for (flags, want) in cases {
        let dir = temp_dir("flags");
        let mut args = vec![
            "--listen".to_string(),
            "127.0.0.1:0".into(),
            "--admin".into(),
            "127.0.0.1:0".into(),
            "--cache-dir".into(),
            dir.0.display().to_string(),
        ];
        args.extend(flags.iter().map(|s| s.to_string()));
        let out = tokio::time::timeout(STARTUP_BOUND, dart(&args).output())
            .await
            .expect("a bad flag fails at once")
            .expect("run dart");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} must be refused");
        assert!(out.stdout.is_empty(), "{flags:?}: no banner");
        assert!(stderr.starts_with("dart: "), "{flags:?}: {stderr}");
        assert!(stderr.contains(want), "{flags:?}: want {want:?} in {stderr}");
        assert!(!dir.0.exists(), "{flags:?}: validation comes before the cache directory");
    }
}

/// Starts a whole-object read of a slow object and waits for its first body bytes, so the
/// response is certainly in flight; returns the response body to finish reading.
async fn slow_read_in_flight(c: &C, url: &str) -> (hyper::body::Incoming, Bytes) {
    let req = http::Request::get(url).body(Empty::new()).expect("request");
    let resp = c.request(req).await.expect("response head");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = loop {
        let frame = body.frame().await.expect("a first frame").expect("no error yet");
        if let Ok(data) = frame.into_data() {
            break data;
        }
    };
    (body, first)
}

#[tokio::test]
async fn sigterm_mid_read_lets_the_response_finish_before_exiting() {
    // 8 blocks at 1 MiB/s: about 2 s of body, well inside the 10 s drain.
    let size = 8 * BLOCK;
    let o = origin(Behaviour::Slow { bytes_per_second: 1 << 20 }, size).await;
    let dir = temp_dir("drain");
    let drain_secs = 10;
    let d = start_dart(&node_args(&dir, drain_secs)).await;
    let c = client();
    let (rest, first) = slow_read_in_flight(&c, &object_url(&d, &o, "/slow")).await;

    d.sigterm();
    let got = rest.collect().await.expect("the drain lets the body finish").to_bytes();
    let mut body = first.to_vec();
    body.extend_from_slice(&got);
    assert_eq!(body.len() as u64, size);
    assert!(body[..] == generate(SEED, 0, size as usize)[..], "drained body: bytes differ");

    let bound = Duration::from_secs(drain_secs) + EXIT_SLACK;
    let (status, _, stdout, stderr) = d.exit(bound).await;
    assert!(status.success(), "exit {status:?}; stderr:\n{stderr}");
    assert_eq!(stdout.last().map(String::as_str), Some("dart: stopped (drained cleanly)"));
}

#[tokio::test]
async fn a_drain_longer_than_drain_secs_force_closes_and_exits_on_time() {
    // 16 blocks at 1 MiB/s: about 4 s of body against a 1 s drain.
    let size = 16 * BLOCK;
    let o = origin(Behaviour::Slow { bytes_per_second: 1 << 20 }, size).await;
    let dir = temp_dir("force");
    let drain_secs = 1;
    let d = start_dart(&node_args(&dir, drain_secs)).await;
    let c = client();
    let (rest, first) = slow_read_in_flight(&c, &object_url(&d, &o, "/slow")).await;

    d.sigterm();
    let bound = Duration::from_secs(drain_secs) + EXIT_SLACK;
    let (status, took, stdout, stderr) = d.exit(bound).await;
    assert!(status.success(), "exit {status:?}; stderr:\n{stderr}");
    assert!(took < bound, "took {took:?}");
    assert_eq!(
        stdout.last().map(String::as_str),
        Some("dart: stopped (drain exceeded 1s: remaining connections force-closed)")
    );
    let rest = rest.collect().await;
    assert!(rest.is_err(), "a force-closed response must not look complete");
    assert!(first.len() < size as usize);
}

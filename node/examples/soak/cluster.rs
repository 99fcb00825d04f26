//! The soak's `dart` nodes: real processes of the workspace's `dart` binary on fixed loopback
//! ports (a restarted node comes back where it was), their logs in files, and what `/proc` says
//! about them.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The node flags of the soak: a cache far smaller than the working set, so eviction churns.
pub const CACHE_SIZE: &str = "64MiB";
pub const MEM_SIZE: &str = "16MiB";
pub const BLOCK_SIZE: &str = "1MiB";
pub const CHUNK_SIZE: &str = "8MiB";
const SECRET: &str = "soak-cluster-secret-0123456789abcdef";

/// The `dart` binary of this workspace, built (or found up to date) by cargo in the profile this
/// example was built in: `cargo run --release --example soak` runs `target/release/dart`.
pub fn dart_binary() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "-p", "dart-node", "--bin", "dart", "--message-format=json"]);
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).stderr(Stdio::inherit());
    let out = cmd.output().map_err(|e| format!("running {cargo} build: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cargo} build -p dart-node --bin dart failed: {}", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "dart")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo built no dart executable".into())
}

/// One member of the soak cluster; shared by the clients (addresses, generation), the flapper
/// (its process) and the reporter (its pid).
pub struct Node {
    pub id: String,
    pub client: SocketAddr,
    pub admin: SocketAddr,
    pub peer: SocketAddr,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
    /// The running process's id, 0 when none.
    pid: AtomicU32,
    /// Bumped when the node goes down and again when it is back: a request that saw it change
    /// (or saw the node down) overlapped a down window.
    pub generation: AtomicU64,
    pub down: AtomicBool,
    /// Lives so far (1 after the first start).
    pub lives: AtomicU64,
}

fn free_port() -> std::io::Result<u16> {
    dart_node::demo::free_port()
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Allocates `n` members' ports and directories under `root`.
pub fn plan(n: usize, root: &Path) -> std::io::Result<Vec<Node>> {
    std::fs::create_dir_all(root)?;
    std::fs::write(root.join("secret"), SECRET)?;
    (0..n)
        .map(|i| {
            Ok(Node {
                id: format!("node-{i}"),
                client: loopback(free_port()?),
                admin: loopback(free_port()?),
                peer: loopback(free_port()?),
                dir: root.join(format!("node-{i}")),
                child: Mutex::new(None),
                pid: AtomicU32::new(0),
                generation: AtomicU64::new(0),
                down: AtomicBool::new(true),
                lives: AtomicU64::new(0),
            })
        })
        .collect()
}

/// The `--peers` list of `nodes`.
pub fn peers(nodes: &[Node]) -> String {
    let list: Vec<String> = nodes.iter().map(|n| format!("{}@{}", n.id, n.peer)).collect();
    list.join(",")
}

impl Node {
    /// Starts the node (cold: no `--warm-start`) and waits for its banner.
    pub fn start(&self, dart: &Path, peers: &str) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| e.to_string())?;
        let secret = self.dir.parent().expect("root").join("secret");
        let mut child = Command::new(dart)
            .args(["--listen", &self.client.to_string(), "--admin", &self.admin.to_string()])
            .args(["--peer-listen", &self.peer.to_string(), "--self-id", &self.id])
            .args(["--peers", peers])
            .arg("--cluster-secret-file")
            .arg(&secret)
            .args(["--cache-size", CACHE_SIZE, "--mem-size", MEM_SIZE])
            .args(["--block-size", BLOCK_SIZE, "--chunk-size", CHUNK_SIZE])
            .args(["--allow-upstream", "127.0.0.0/8", "--public-upstream", "127.0.0.0/8"])
            .args(["--drain-secs", "2"])
            .arg("--cache-dir")
            .arg(self.dir.join("cache"))
            .env("DART_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", dart.display()))?;
        let mut banner = String::new();
        let stdout = child.stdout.take().expect("piped");
        let mut reader = BufReader::new(stdout);
        reader.read_line(&mut banner).map_err(|e| e.to_string())?;
        if !banner.starts_with("dart client=") {
            let _ = child.kill();
            return Err(format!(
                "{} printed no banner (see {})",
                self.id,
                self.log_path().display()
            ));
        }
        // Keep reading stdout so the node never blocks on a full pipe.
        std::thread::spawn(move || for _ in reader.lines() {});
        self.pid.store(child.id(), Ordering::SeqCst);
        *self.child.lock().expect("child") = Some(child);
        self.lives.fetch_add(1, Ordering::SeqCst);
        self.down.store(false, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Marks the node down, then stops it: SIGKILL (a crash) or SIGTERM (a drain), and waits.
    pub fn stop(&self, kill: bool) -> Result<std::process::ExitStatus, String> {
        self.down.store(true, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
        let mut child = self.child.lock().expect("child").take().ok_or("not running")?;
        self.pid.store(0, Ordering::SeqCst);
        if kill {
            child.kill().map_err(|e| e.to_string())?;
        } else {
            let pid = child.id().to_string();
            let ok =
                Command::new("kill").args(["-TERM", &pid]).status().map_err(|e| e.to_string())?;
            if !ok.success() {
                return Err(format!("kill -TERM {pid} failed"));
            }
        }
        child.wait().map_err(|e| e.to_string())
    }

    /// Whether the node's process has exited (it should not have, unless stopped).
    pub fn exited(&self) -> Option<std::process::ExitStatus> {
        self.child.lock().expect("child").as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn pid(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::SeqCst)).filter(|p| *p != 0)
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("dart.log")
    }

    /// `(VmRSS in KiB, open descriptors)` of the running process.
    pub fn usage(&self) -> Option<(u64, u64)> {
        let pid = self.pid()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let rss = status.lines().find_map(|l| {
            l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok()
        })?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        Some((rss, fds))
    }

    /// Lines of the node's log (every life) that report a panic.
    pub fn panics(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        log.lines().filter(|l| l.contains("panicked")).map(str::to_owned).collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.lock().expect("child").take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// How long a restarted node is left down before it comes back.
pub const DOWN_FOR: (Duration, Duration) = (Duration::from_secs(3), Duration::from_secs(8));

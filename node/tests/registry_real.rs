//! The registry mirror with real parts (external tier): the Docker distribution registry
//! (`docker-registry`) as the upstream, with htpasswd auth, an image pushed into it by `skopeo`
//! from an OCI layout this test writes (three layers, one of them larger than a chunk), and two
//! `dart` processes with `--registry` and the registry's credential (`--registry-auth`) as
//! peers; no client sends a credential. Clients:
//!
//! - `skopeo copy` and `skopeo inspect` through node A: the copied blobs are byte-identical to
//!   the pushed ones (skopeo verifies every digest too); then through node B, whose blob bytes
//!   come from node A and its own share of the tree, not from the registry;
//! - containerd itself (`ctr images pull --hosts-dir`, the `native` snapshotter) with the
//!   `hosts.toml` a user writes, naming node A as the mirror and an unreachable `server`, so a
//!   broken mirror fails the pull instead of containerd falling back around it; the unpacked
//!   files are compared with the layers' contents;
//! - a node without the credential answers the registry's own `401` (and skopeo fails).
//!
//! Needs `docker-registry`, `skopeo`, `containerd` and `ctr` (`apt-get install docker-registry
//! skopeo containerd`) and root for containerd; it fails with that message, never skips.
//! Pull times are printed (`--nocapture`), not asserted.

mod support;

use dart_core::registry::sha256_digest;
use dart_net_tokio::origin_server::generate;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{dart_command, free_port, get, sample, spawn_dart, temp_dir, DartProcess, TempDir};

const SEED: u64 = 57;
/// The default block size and small chunks, so that the big layer spans four chunks and both
/// nodes' shares of the tree.
const BLOCK: &str = "4MiB";
const CHUNK: &str = "8MiB";
/// File sizes in each layer: the second one spans 32 chunks.
const LAYERS: [usize; 3] = [1_000, (32 << 20) + 77, 20_000];
const IMAGE: &str = "test/app:v1";
/// The registry's one user, `u` with password `p`.
const HTPASSWD: &str = "u:$2y$05$m9Y5Guqs1gplgX2G7tOqf.56mUdbSo3yH4nfyxj7e4rft.8lYg2WK\n";
const CREDS: &str = "u:p";

fn require(tool: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(found, "{tool} is not installed: apt-get install {package} (this test never skips)");
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A child process killed and reaped when dropped.
struct Daemon(Child);

impl Daemon {
    /// Starts `cmd` with its stdout and stderr in the file `log`.
    fn start(cmd: &mut Command, log: &Path) -> Daemon {
        let out = std::fs::File::create(log).expect("a daemon log");
        let child = cmd
            .stdout(out.try_clone().expect("a daemon log"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        Daemon(child)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `ready` holds, polling every 50 ms for at most 20 s.
async fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "{what} not ready within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One file in a ustar archive: a 512-byte header, the data, padding to 512.
fn ustar_entry(out: &mut Vec<u8>, name: &str, data: &[u8]) {
    let mut header = [0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |field: &mut [u8], value: u64| {
        let text = format!("{value:0width$o}\0", width = field.len() - 1);
        field.copy_from_slice(text.as_bytes());
    };
    octal(&mut header[100..108], 0o644);
    octal(&mut header[108..116], 0);
    octal(&mut header[116..124], 0);
    octal(&mut header[124..136], data.len() as u64);
    octal(&mut header[136..148], 1_700_000_000);
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[148..156].fill(b' ');
    let sum: u64 = header.iter().map(|&b| u64::from(b)).sum();
    let text = format!("{sum:06o}\0 ");
    header[148..156].copy_from_slice(text.as_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

/// The contents of layer `i`: one file `layer<i>/file.bin`.
fn layer_file(i: usize) -> Vec<u8> {
    generate(SEED + i as u64, 0, LAYERS[i]).to_vec()
}

/// Writes an OCI image layout with the three layers (uncompressed tar) under `dir`, tagged `v1`.
fn write_layout(dir: &Path) {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("layout dir");
    let put = |data: &[u8]| {
        let digest = sha256_digest(data);
        let hex = digest.strip_prefix("sha256:").expect("sha256");
        std::fs::write(blobs.join(hex), data).expect("write blob");
        (digest, data.len())
    };
    let mut layers = Vec::new();
    for i in 0..LAYERS.len() {
        let mut tar = Vec::new();
        ustar_entry(&mut tar, &format!("layer{i}/file.bin"), &layer_file(i));
        tar.resize(tar.len() + 1024, 0); // two zero blocks end the archive
        layers.push(put(&tar));
    }
    let diff_ids: Vec<&str> = layers.iter().map(|(d, _)| d.as_str()).collect();
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    })
    .to_string();
    let (config_digest, config_len) = put(config.as_bytes());
    let layer_entries: Vec<_> = layers
        .iter()
        .map(|(d, n)| {
            serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": n})
        })
        .collect();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_len},
        "layers": layer_entries,
    })
    .to_string();
    let (manifest_digest, manifest_len) = put(manifest.as_bytes());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_len,
            "annotations": {"org.opencontainers.image.ref.name": "v1"},
        }],
    });
    std::fs::write(dir.join("index.json"), index.to_string()).expect("index");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
        .expect("oci-layout");
}

/// The Docker distribution registry on a loopback port, storing in `dir`.
struct Registry {
    addr: SocketAddr,
    log: PathBuf,
    _daemon: Daemon,
}

impl Registry {
    async fn start(dir: &Path) -> Registry {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        // htpasswd auth: every request needs Basic u:p (a bcrypt line made by `htpasswd -Bbn u
        // p`; any valid hash of p will do).
        let htpasswd = dir.join("htpasswd");
        std::fs::write(&htpasswd, HTPASSWD).expect("htpasswd");
        let config = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: {addr}\nauth:\n  htpasswd:\n    realm: dart-test\n    path: {}\n",
            dir.join("storage").display(),
            htpasswd.display(),
        );
        std::fs::write(dir.join("config.yml"), config).expect("registry config");
        let log = dir.join("registry.log");
        let daemon = Daemon::start(
            Command::new("docker-registry").arg("serve").arg(dir.join("config.yml")),
            &log,
        );
        wait_for("docker-registry", || std::net::TcpStream::connect(addr).is_ok()).await;
        Registry { addr, log, _daemon: daemon }
    }

    /// The access-log lines of blob GETs the registry answered.
    fn blob_log(&self) -> Vec<String> {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains("/blobs/sha256:"))
            .map(str::to_owned)
            .collect()
    }

    /// Blob GETs the registry answered.
    fn blob_gets(&self) -> usize {
        self.blob_log().len()
    }
}

fn skopeo(policy: &Path) -> Command {
    let mut cmd = Command::new("skopeo");
    cmd.arg("--policy").arg(policy);
    cmd
}

struct Node {
    dart: DartProcess,
    admin: SocketAddr,
    _dir: TempDir,
}

/// Node `i` of the cluster `peers` (with its peer listener on `port`), or a node alone; with
/// the registry's credentials in `auth` (`--registry-auth`), or none.
fn start_node(
    i: usize,
    cluster: Option<(&str, u16)>,
    registry: SocketAddr,
    auth: Option<&Path>,
) -> Node {
    let dir = temp_dir("registry-real", &format!("node-{i}"));
    let mut cmd = dart_command();
    cmd.args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--registry", &format!("http://{registry}")])
        .args(["--block-size", BLOCK, "--chunk-size", CHUNK]);
    if let Some(file) = auth {
        cmd.arg("--registry-auth").arg(file);
    }
    if let Some((peers, port)) = cluster {
        cmd.args(["--peer-listen", &format!("127.0.0.1:{port}")]).args([
            "--self-id",
            &format!("node-{i}"),
            "--peers",
            peers,
        ]);
    }
    cmd.args(["--cache-size", "256MiB", "--mem-size", "16MiB"]).arg("--cache-dir").arg(&dir.0);
    let dart = spawn_dart(&mut cmd);
    let admin = dart.admin.expect("an admin listener");
    Node { dart, admin, _dir: dir }
}

async fn metric(node: &Node, series: &str) -> u64 {
    sample(&get(&format!("http://{}/metrics", node.admin), &[]).await.text(), series)
}

/// `skopeo copy` of the image through `node` into a fresh OCI directory under `dir`; returns
/// the directory and the wall time.
fn copy_through(policy: &Path, node: &Node, dir: &Path, name: &str) -> (PathBuf, Duration) {
    let out = dir.join(name);
    let started = Instant::now();
    run(skopeo(policy)
        .args(["copy", "--src-tls-verify=false"])
        .arg(format!("docker://{}/{IMAGE}", node.dart.client))
        .arg(format!("oci:{}:v1", out.display())));
    (out, started.elapsed())
}

/// Every blob in `digests` is in `copied` with the bytes `source` holds, and matches its digest.
fn assert_same_blobs(copied: &Path, digests: &[String], source: &Path) {
    for digest in digests {
        let hex = digest.strip_prefix("sha256:").expect("sha256");
        let got = std::fs::read(copied.join("blobs/sha256").join(hex))
            .unwrap_or_else(|e| panic!("{digest} missing from the copy: {e}"));
        let want = std::fs::read(source.join("blobs/sha256").join(hex)).expect("source blob");
        assert!(got == want, "{digest}: the copy differs from what was pushed");
        assert_eq!(&sha256_digest(&got), digest);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skopeo_and_containerd_pull_through_the_mirror_and_a_second_node_takes_blobs_from_the_first(
) {
    for (tool, package) in [
        ("docker-registry", "docker-registry"),
        ("skopeo", "skopeo"),
        ("containerd", "containerd"),
        ("ctr", "containerd"),
    ] {
        require(tool, package);
    }
    let work = temp_dir("registry-real", "work");
    std::fs::create_dir_all(&work.0).expect("work dir");
    let policy = work.0.join("policy.json");
    std::fs::write(&policy, r#"{"default":[{"type":"insecureAcceptAnything"}]}"#).expect("policy");
    let layout = work.0.join("layout");
    write_layout(&layout);
    let registry = Registry::start(&work.0).await;
    run(skopeo(&policy)
        .args(["copy", "--dest-tls-verify=false", "--dest-creds", CREDS])
        .arg(format!("oci:{}:v1", layout.display()))
        .arg(format!("docker://{}/{IMAGE}", registry.addr)));
    // skopeo compresses the layers on the way in: what the registry holds is the reference, read
    // from it directly.
    let direct = work.0.join("direct");
    run(skopeo(&policy)
        .args(["copy", "--src-tls-verify=false", "--src-creds", CREDS])
        .arg(format!("docker://{}/{IMAGE}", registry.addr))
        .arg(format!("oci:{}:v1", direct.display())));
    let raw = run(skopeo(&policy)
        .args(["inspect", "--raw", "--tls-verify=false", "--creds", CREDS])
        .arg(format!("docker://{}/{IMAGE}", registry.addr)));
    let manifest: serde_json::Value = serde_json::from_str(&raw).expect("manifest JSON");
    let mut digests: Vec<String> = manifest["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|l| l["digest"].as_str().expect("a layer digest").to_owned())
        .collect();
    assert_eq!(digests.len(), LAYERS.len());
    digests.push(manifest["config"]["digest"].as_str().expect("config digest").to_owned());
    let pushed_gets = registry.blob_gets();

    let ports = [free_port(), free_port()];
    let peers = format!("node-0@127.0.0.1:{},node-1@127.0.0.1:{}", ports[0], ports[1]);
    // The nodes hold the registry's credentials; no client below sends any.
    let auth = work.0.join("registry-auth.json");
    let entry = format!(r#"{{"{}": {{"username": "u", "password": "p"}}}}"#, registry.addr);
    std::fs::write(&auth, entry).expect("registry-auth");
    let a = start_node(0, Some((&peers, ports[0])), registry.addr, Some(&auth));
    let b = start_node(1, Some((&peers, ports[1])), registry.addr, Some(&auth));

    // skopeo inspect through the mirror (no credentials) sees what it sees at the registry
    // (with them): the manifest's digest and the layers pushed.
    let inspect = |at: SocketAddr, creds: &[&str]| {
        let text = run(skopeo(&policy)
            .args(["inspect", "--tls-verify=false"])
            .args(creds)
            .arg(format!("docker://{at}/{IMAGE}")));
        serde_json::from_str::<serde_json::Value>(&text).expect("skopeo inspect JSON")
    };
    let mirrored = inspect(a.dart.client, &[]);
    let direct_inspect = inspect(registry.addr, &["--creds", CREDS]);
    assert_eq!(mirrored["Digest"], direct_inspect["Digest"]);
    assert_eq!(mirrored["Layers"], direct_inspect["Layers"]);

    let (cold, cold_time) = copy_through(&policy, &a, &work.0, "copy-a-cold");
    assert_same_blobs(&cold, &digests, &direct);
    let after_a = registry.blob_gets();
    assert!(after_a > pushed_gets, "node A read the blobs from the registry");
    let (_, warm_time) = copy_through(&policy, &a, &work.0, "copy-a-warm");
    assert_eq!(
        registry.blob_gets(),
        after_a,
        "a warm copy through A asks the registry for no blob"
    );

    let origin_in = |n| metric(n, "dart_bytes_total{direction=\"origin_in\"}");
    let origin_before = origin_in(&a).await + origin_in(&b).await;
    let (second, second_time) = copy_through(&policy, &b, &work.0, "copy-b");
    assert_same_blobs(&second, &digests, &direct);
    // Node B asks the registry only for the size of blobs it never saw (a 1-byte probe each);
    // every blob byte came from the cluster.
    let log = registry.blob_log();
    let probe = |line: &String| line.contains("HTTP/1.1\" 206 1 ");
    assert!(
        log[after_a..].iter().all(probe),
        "node B read blob bytes from the registry: {:#?}",
        &log[after_a..]
    );
    assert!(log.len() - after_a <= digests.len(), "at most one probe per blob");
    let after_b = log.len();
    assert_eq!(origin_in(&a).await + origin_in(&b).await, origin_before);
    let b_cache = metric(&b, "dart_block_source_total{source=\"cache\"}").await;
    let b_peer = metric(&b, "dart_block_source_total{source=\"peer\"}").await;
    assert!(b_peer > 0, "node B took blocks from node A (cache {b_cache}, peer {b_peer})");
    let verified = metric(&b, "dart_registry_blob_digest_total{result=\"verified\"}").await;
    assert_eq!(verified, LAYERS.len() as u64 + 1, "every whole blob read through B was checked");

    // containerd, configured the way a user does, pulls and unpacks through node A.
    let (ctr_time, unpacked) = containerd_pull(&work.0, &a).await;
    for i in 0..LAYERS.len() {
        let file = unpacked.iter().find(|p| p.ends_with(format!("layer{i}/file.bin")));
        let file = file.unwrap_or_else(|| panic!("layer{i}/file.bin not unpacked: {unpacked:?}"));
        assert!(
            std::fs::read(file).expect("unpacked file") == layer_file(i),
            "layer{i}: wrong bytes"
        );
    }
    assert_eq!(registry.blob_gets(), after_b, "containerd's pull took no blob from the registry");

    // A node without the credentials answers the registry's own challenge, as the registry
    // would, and skopeo without credentials fails through it.
    let bare = start_node(3, None, registry.addr, None);
    let refused = get(&format!("http://{}/v2/test/app/manifests/v1", bare.dart.client), &[]).await;
    assert_eq!(refused.status, 401, "{}", refused.text());
    assert!(
        refused.header("www-authenticate").starts_with("Basic realm="),
        "{:?}",
        refused.headers
    );
    let blob = format!("http://{}/v2/test/app/blobs/{}", bare.dart.client, digests[0]);
    let refused = get(&blob, &[]).await;
    assert_eq!(refused.status, 401, "{}", refused.text());
    let out = skopeo(&policy)
        .args(["inspect", "--tls-verify=false"])
        .arg(format!("docker://{}/{IMAGE}", bare.dart.client))
        .output()
        .expect("skopeo");
    assert!(
        !out.status.success(),
        "skopeo read a private image through a node without credentials"
    );

    // One node alone, for the figures beside the pair's.
    let alone = start_node(2, None, registry.addr, Some(&auth));
    let (_, alone_cold) = copy_through(&policy, &alone, &work.0, "copy-alone-cold");
    let (_, alone_warm) = copy_through(&policy, &alone, &work.0, "copy-alone-warm");
    let started = Instant::now();
    run(skopeo(&policy)
        .args(["copy", "--src-tls-verify=false", "--src-creds", CREDS])
        .arg(format!("docker://{}/{IMAGE}", registry.addr))
        .arg(format!("oci:{}:v1", work.0.join("copy-registry").display())));
    let registry_time = started.elapsed();

    let size: usize = LAYERS.iter().sum();
    eprintln!(
        "pull of {size} bytes in {} layers (skopeo copy to an OCI directory): from the registry \
         directly {registry_time:?}; one node alone cold {alone_cold:?}, warm {alone_warm:?}; two \
         nodes: through A cold {cold_time:?}, warm {warm_time:?}, then through B {second_time:?}; \
         containerd pull and unpack through A (warm node, cold containerd) {ctr_time:?}",
        LAYERS.len()
    );
}

/// Starts containerd with a private root and socket, pulls the image through `node` with a
/// `hosts.toml` whose `server` is unreachable, and returns the pull's wall time and every file
/// in the unpacked snapshots.
async fn containerd_pull(work: &Path, node: &Node) -> (Duration, Vec<PathBuf>) {
    let dir = work.join("containerd");
    let hosts = dir.join("hosts/dart.test");
    std::fs::create_dir_all(&hosts).expect("hosts dir");
    let socket = dir.join("containerd.sock");
    let config = format!(
        "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
         disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.snapshotter.v1.btrfs\", \
         \"io.containerd.snapshotter.v1.zfs\", \"io.containerd.snapshotter.v1.devmapper\", \
         \"io.containerd.snapshotter.v1.aufs\"]\n\
         [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n\
         [debug]\n  address = \"\"\n[metrics]\n  address = \"\"\n",
        root = dir.join("root").display(),
        state = dir.join("state").display(),
        sock = socket.display(),
    );
    std::fs::write(dir.join("config.toml"), config).expect("containerd config");
    // The hosts.toml of docs/registry-mirror.md: the mirror first, and an upstream `server` that
    // cannot answer, so that nothing reaches the image but through the mirror.
    let hosts_toml = format!(
        "server = \"http://127.0.0.1:9\"\n\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
        node.dart.client
    );
    std::fs::write(hosts.join("hosts.toml"), hosts_toml).expect("hosts.toml");
    let config = dir.join("config.toml");
    let _daemon = Daemon::start(
        Command::new("containerd").arg("--config").arg(config),
        &dir.join("containerd.log"),
    );
    let ctr = || {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address").arg(&socket).args(["--namespace", "dart-test"]);
        cmd
    };
    wait_for("containerd", || ctr().arg("version").output().is_ok_and(|o| o.status.success()))
        .await;
    let started = Instant::now();
    run(ctr()
        .args(["images", "pull", "--snapshotter", "native", "--hosts-dir"])
        .arg(dir.join("hosts"))
        .arg(format!("dart.test/{IMAGE}")));
    let elapsed = started.elapsed();
    let mut files = Vec::new();
    let mut stack = vec![dir.join("root/io.containerd.snapshotter.v1.native/snapshots")];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    (elapsed, files)
}

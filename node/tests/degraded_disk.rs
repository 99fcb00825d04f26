//! A node whose cache disk fails at run time (issue 13, degraded disks): it keeps serving every
//! byte from the origin, says so on `/healthz`, `/admin/stats` and `/metrics`, and recovers when a
//! probe write succeeds. Faults are injected through the store's `StoreIo` seam (`FaultyIo`), whose
//! hand-moved clock stands in for the 30 s probe timer: no root, no mounts, no sleeps.

use bytes::Bytes;
use dart_core::engine::{BlockClass, Window};
use dart_core::hash::BlockKey;
use dart_net_tokio::cache::{BlockCache, CacheHealth, CacheStats};
use dart_net_tokio::origin_server::{generate, Behaviour};
use dart_net_tokio::seam::{SeamConnector, TokioDialer, TokioSeam};
use dart_net_tokio::store::{BlockStore, Fault, FaultyIo, StoreConfig, PROBE_INTERVAL};
use dart_node::cli::NodeFlags;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

mod support;
use support::{Origin, TempDir};

const SEED: u64 = 13;
const BLOCK: u64 = 64 * 1024;
const SIZE: u64 = 4 * BLOCK;

/// The disk store as the node uses it, plus what the tests wait on and check: a count of finished
/// puts, and whether any store call panicked (the driver would turn a panic into a miss, hiding
/// it).
///
/// It says it does not block, so the driver runs each put inline, before the flight publishes,
/// instead of on the blocking pool with a copy in its pending-put map (which would serve the
/// block until the put finished, and make "was this read served from the disk?" a race). The
/// store's code paths are the production ones.
struct Observed {
    store: Arc<BlockStore>,
    puts_done: watch::Sender<u64>,
    panicked: AtomicBool,
}

impl Observed {
    fn guard<R>(&self, f: impl FnOnce() -> R) -> R {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => r,
            Err(panic) => {
                self.panicked.store(true, Ordering::SeqCst);
                std::panic::resume_unwind(panic)
            }
        }
    }
}

impl BlockCache for Observed {
    fn get(&self, key: &BlockKey) -> Option<Bytes> {
        self.guard(|| BlockCache::get(&*self.store, key))
    }

    fn get_window(&self, key: &BlockKey, window: Window) -> Option<Bytes> {
        self.guard(|| BlockCache::get_window(&*self.store, key, window))
    }

    fn try_get_now(&self, key: &BlockKey, window: Option<Window>) -> Option<Option<Bytes>> {
        self.guard(|| BlockCache::try_get_now(&*self.store, key, window))
    }

    fn blocking(&self) -> bool {
        false
    }

    fn put(&self, key: BlockKey, data: &Bytes, class: BlockClass) {
        self.guard(|| BlockCache::put(&*self.store, key, data, class));
        self.puts_done.send_modify(|n| *n += 1);
    }

    fn delete(&self, key: &BlockKey) {
        self.guard(|| BlockCache::delete(&*self.store, key));
    }

    fn kept_keys(&self) -> Vec<BlockKey> {
        BlockCache::kept_keys(&*self.store)
    }

    fn stats(&self) -> CacheStats {
        BlockCache::stats(&*self.store)
    }

    fn health(&self) -> CacheHealth {
        BlockCache::health(&*self.store)
    }

    fn close(&self) {
        BlockCache::close(&*self.store);
    }
}

struct Harness {
    node: dart_node::Running,
    origin: Origin,
    io: Arc<FaultyIo>,
    cache: Arc<Observed>,
    puts_done: watch::Receiver<u64>,
    client: Client<SeamConnector<TokioDialer>, Empty<Bytes>>,
    dir: TempDir,
}

fn flags(dir: &TempDir) -> NodeFlags {
    NodeFlags {
        cache_size: 64 * BLOCK,
        mem_size: 0,
        chunk_size: 4 * BLOCK,
        block_size: BLOCK,
        drain_secs: 1,
        ..support::loopback_flags(dir)
    }
}

/// A node in front of a Range-honouring origin, on a disk store (RAM tier off, so every hit is a
/// disk read) whose I/O goes through a `FaultyIo`.
async fn harness(name: &str) -> Harness {
    let origin = support::origin(SEED, Behaviour::Honours, SIZE).await;
    let dir = support::temp_dir("degraded", name);
    let io = Arc::new(FaultyIo::new());
    let config = StoreConfig::new(&dir.0, 64 * BLOCK, 0, BLOCK);
    let store = Arc::new(BlockStore::open_with_io(config, io.clone()).expect("store opens"));
    let (puts_done, rx) = watch::channel(0);
    let cache = Arc::new(Observed { store, puts_done, panicked: AtomicBool::new(false) });
    let node = dart_node::start_on(TokioSeam, &flags(&dir), Some(cache.clone()))
        .await
        .expect("node starts");
    let client = Client::builder(TokioExecutor::new())
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(5)));
    Harness { node, origin, io, cache, puts_done: rx, client, dir }
}

impl Harness {
    async fn get(&self, url: &str, range: Option<&str>) -> (u16, Bytes) {
        let mut req = http::Request::builder().uri(url);
        if let Some(r) = range {
            req = req.header(http::header::RANGE, r);
        }
        let resp =
            self.client.request(req.body(Empty::new()).expect("request")).await.expect("response");
        let status = resp.status().as_u16();
        (status, resp.into_body().collect().await.expect("body").to_bytes())
    }

    /// Reads 100 bytes of block `i` through the node, checks them, and waits until at least
    /// `new_puts` puts have finished since the read began.
    async fn read_block(&mut self, i: u64, new_puts: u64) {
        let url = format!("http://{}/dart/http://{}/obj", self.node.client_addr, self.origin.addr);
        let start = i * BLOCK;
        let range = format!("bytes={start}-{}", start + 99);
        let want = *self.puts_done.borrow() + new_puts;
        let (status, body) = self.get(&url, Some(&range)).await;
        assert_eq!(status, 206, "block {i}");
        assert_eq!(body[..], generate(SEED, start, 100)[..], "block {i}: wrong bytes");
        tokio::time::timeout(Duration::from_secs(10), self.puts_done.wait_for(|n| *n >= want))
            .await
            .expect("the put finished")
            .expect("the cache is alive");
    }

    async fn admin(&self, path: &str) -> String {
        let admin = self.node.admin_addr.expect("admin on");
        let (status, body) = self.get(&format!("http://{admin}{path}"), None).await;
        assert_eq!(status, 200, "{path}");
        String::from_utf8(body.to_vec()).expect("text")
    }

    async fn store_health(&self) -> serde_json::Value {
        let stats: serde_json::Value =
            serde_json::from_str(&self.admin("/admin/stats").await).expect("json");
        stats["store_health"].clone()
    }

    fn origin_requests(&self) -> u64 {
        self.origin.stats.requests()
    }

    async fn stop(self) {
        assert!(!self.cache.panicked.load(Ordering::SeqCst), "a store call panicked");
        self.node.shutdown().await;
        drop(self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_fails_writes_degrades_the_node_which_serves_from_the_origin_and_recovers() {
    let cases = [
        (Fault::NoSpace, "no space left on device"),
        (Fault::ReadOnly, "read-only file system"),
        (Fault::Io, "io error: Input/output error"),
    ];
    for (fault, reason) in cases {
        let mut h = harness(&format!("{fault:?}")).await;
        h.read_block(0, 1).await;
        assert_eq!(h.admin("/healthz").await, "ok\n");
        let before = h.origin_requests();
        h.read_block(0, 0).await;
        assert_eq!(h.origin_requests(), before, "{fault:?}: a healthy disk serves its hit");

        h.io.fail_writes(Some(fault));
        h.read_block(1, 1).await;
        let healthz = h.admin("/healthz").await;
        assert!(healthz.starts_with(&format!("degraded: cache disk {reason}")), "{healthz}");
        let metrics = h.admin("/metrics").await;
        assert!(metrics.contains("\ndart_store_degraded 1\n"), "{metrics}");
        assert!(metrics.contains("dart_store_errors_total{op=\"write\"} 1\n"), "{metrics}");
        assert!(metrics.contains("dart_store_errors_total{op=\"read\"} 0\n"), "{metrics}");
        let health = h.store_health().await;
        assert_eq!(health["state"], "degraded", "{health}");
        assert!(health["reason"].as_str().is_some_and(|r| r.starts_with(reason)), "{health}");
        assert!(health["since_unix_secs"].as_u64().is_some_and(|s| s > 0), "{health}");
        assert_eq!(health["write_failures"], 1, "{health}");

        // Degraded: every read is still answered, the failed block is not served from the disk,
        // the disk block written before the failure still is, and no write is attempted.
        let calls = h.io.write_calls();
        let before = h.origin_requests();
        h.read_block(1, 1).await;
        assert_eq!(
            h.origin_requests(),
            before + 1,
            "{fault:?}: the failed block came from the origin"
        );
        h.read_block(2, 1).await;
        assert_eq!(h.origin_requests(), before + 2, "{fault:?}");
        h.read_block(0, 0).await;
        assert_eq!(
            h.origin_requests(),
            before + 2,
            "{fault:?}: a readable disk block still serves"
        );
        assert_eq!(h.io.write_calls(), calls, "{fault:?}: no disk write before the probe is due");

        // The disk comes back; after one probe interval the next put is the probe and succeeds.
        h.io.fail_writes(None);
        h.io.advance(PROBE_INTERVAL);
        h.read_block(3, 1).await;
        assert_eq!(h.admin("/healthz").await, "ok\n", "{fault:?}");
        let metrics = h.admin("/metrics").await;
        assert!(metrics.contains("\ndart_store_degraded 0\n"), "{metrics}");
        assert!(metrics.contains("dart_store_errors_total{op=\"write\"} 1\n"), "{metrics}");
        assert_eq!(h.store_health().await["state"], "healthy");
        let before = h.origin_requests();
        h.read_block(3, 0).await;
        assert_eq!(h.origin_requests(), before, "{fault:?}: the probe's block is cached");
        h.read_block(1, 1).await;
        h.read_block(1, 0).await;
        assert_eq!(h.origin_requests(), before + 1, "{fault:?}: caching works again");
        h.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_read_that_fails_is_a_miss_served_from_the_origin() {
    let mut h = harness("read").await;
    h.read_block(0, 1).await;
    h.io.fail_reads(Some(Fault::Io));
    let before = h.origin_requests();
    h.read_block(0, 1).await;
    assert_eq!(h.origin_requests(), before + 1, "the unreadable block came from the origin");
    let healthz = h.admin("/healthz").await;
    assert!(
        healthz.starts_with("degraded: cache disk read error: Input/output error"),
        "{healthz}"
    );
    let metrics = h.admin("/metrics").await;
    assert!(metrics.contains("dart_store_errors_total{op=\"read\"} 1\n"), "{metrics}");
    assert!(metrics.contains("\ndart_store_degraded 1\n"), "{metrics}");

    h.io.fail_reads(None);
    h.io.advance(PROBE_INTERVAL);
    h.read_block(0, 1).await;
    assert_eq!(h.origin_requests(), before + 2, "the unreadable slot was dropped, not retried");
    assert_eq!(h.admin("/healthz").await, "ok\n");
    h.read_block(0, 0).await;
    assert_eq!(h.origin_requests(), before + 2, "cached again");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_cache_directory_while_the_node_runs_degrades_it_and_reads_keep_working() {
    let mut h = harness("rmdir").await;
    h.read_block(0, 1).await;
    std::fs::remove_dir_all(&h.dir.0).expect("remove the cache directory");
    h.io.advance(PROBE_INTERVAL);
    // The next put checks that the arena files are still linked, finds them gone, and skips.
    h.read_block(1, 1).await;
    let healthz = h.admin("/healthz").await;
    assert!(healthz.starts_with("degraded: cache disk files removed"), "{healthz}");
    assert!(h.admin("/metrics").await.contains("\ndart_store_degraded 1\n"));
    let before = h.origin_requests();
    h.read_block(0, 0).await;
    assert_eq!(h.origin_requests(), before, "the open, unlinked file still serves its blocks");
    h.read_block(1, 1).await;
    assert_eq!(h.origin_requests(), before + 1, "nothing new is cached");
    h.read_block(2, 1).await;
    assert_eq!(h.origin_requests(), before + 2);
    let dir = h.dir.0.clone();
    let keep = support::TempDir(dir.clone());
    h.stop().await;

    // A restart recreates the directory and the node is healthy again.
    let node = dart_node::start(&flags(&keep)).await.expect("restart recreates the cache dir");
    assert!(dir.join("blocks.owned").exists());
    let admin = node.admin_addr.expect("admin on");
    let client: Client<SeamConnector<TokioDialer>, Empty<Bytes>> =
        Client::builder(TokioExecutor::new())
            .build(SeamConnector::new(TokioDialer, Duration::from_secs(5)));
    let resp = client.get(format!("http://{admin}/healthz").parse().expect("uri")).await;
    let body = resp.expect("response").into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"ok\n");
    node.shutdown().await;
}

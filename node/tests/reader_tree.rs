//! Five real `dart` processes on loopback with `--reader-tree`: three read one object at once and
//! JOIN its tracker over HTTP on the peer listener (the tracker is a fourth node, so every JOIN
//! crosses the wire); the tracker grants each of them and hosts the object's reader set; the
//! origin serves the object about once. Then the tracker is killed and the fifth node reads the
//! object: its JOIN fails, it routes over every member, and the read completes with correct bytes
//! (a read never fails because of the tracker).

mod support;

use dart_core::engine::route::Placement;
use dart_core::engine::{Engine, EngineConfig};
use dart_core::hash::ChunkKey;
use dart_core::membership::{Member, View};
use dart_net_tokio::origin_server::{generate, Behaviour};
use std::net::SocketAddr;
use support::TempDir;
use support::{dart_command, free_port, get, origin, sample, spawn_dart, temp_dir, DartProcess};

const NODES: usize = 5;
const SIZE: u64 = 32 << 20;
const SEED: u64 = 23;

struct Proc {
    dart: DartProcess,
    admin: SocketAddr,
    _dir: TempDir,
}

fn spawn(i: usize, peers: &str, port: u16) -> Proc {
    let dir = temp_dir("reader-tree", &format!("node-{i}"));
    let mut cmd = dart_command();
    cmd.args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--peer-listen", &format!("127.0.0.1:{port}")])
        .args(["--self-id", &format!("node-{i}"), "--peers", peers, "--reader-tree"])
        .args(["--cache-size", "128MiB", "--mem-size", "0"])
        .args(["--allow-upstream", "127.0.0.0/8", "--public-upstream", "127.0.0.0/8"])
        .arg("--cache-dir")
        .arg(&dir.0);
    let dart = spawn_dart(&mut cmd);
    let admin = dart.admin.expect("an admin listener");
    Proc { dart, admin, _dir: dir }
}

/// The index of the member that tracks `upstream` in a view of every node: the top of the HRW
/// ranking of the object's file key (spec/tracker.md §2).
fn tracker_of(view: &View, upstream: &str) -> usize {
    let config = EngineConfig::default();
    let id = Engine::new(config.clone()).identify(upstream);
    let key = ChunkKey::file_key(config.namespace.as_str(), &id.id);
    let placement = Placement::new(view.clone(), "node-0", 2, 1);
    let ranked = placement.ranked(key);
    ranked[0].trim_start_matches("node-").parse().expect("index")
}

async fn metrics(p: &Proc) -> String {
    let reply = get(&format!("http://{}/metrics", p.admin), &[]).await;
    assert_eq!(reply.status, 200);
    reply.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_join_their_tracker_over_http_and_a_dead_tracker_fails_no_read() {
    let origin = origin(SEED, Behaviour::Honours, SIZE).await;
    let ports: Vec<u16> = (0..NODES).map(|_| free_port()).collect();
    let entries: Vec<String> =
        ports.iter().enumerate().map(|(i, p)| format!("node-{i}@127.0.0.1:{p}")).collect();
    let peers = entries.join(",");
    let mut procs: Vec<Option<Proc>> =
        (0..NODES).map(|i| Some(spawn(i, &peers, ports[i]))).collect();
    let view = View::new(
        (0..NODES)
            .map(|i| Member::ready(&format!("node-{i}"), &format!("127.0.0.1:{}", ports[i])))
            .collect(),
    );
    let upstream = format!("http://{}/weights/model.bin", origin.addr);
    let tracker = tracker_of(&view, &upstream);
    let others: Vec<usize> = (0..NODES).filter(|i| *i != tracker).collect();
    let (readers, late) = (&others[..3], others[3]);
    println!("tracker node-{tracker}; readers {readers:?}; late reader node-{late}");
    let want = generate(SEED, 0, SIZE as usize);

    // Three readers at once.
    let mut tasks = Vec::new();
    for &i in readers {
        let url = format!("http://{}/dart/{upstream}", procs[i].as_ref().expect("up").dart.client);
        tasks.push(tokio::spawn(async move { get(&url, &[]).await }));
    }
    for t in tasks {
        let reply = t.await.expect("task");
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert!(reply.body[..] == want[..], "every byte correct");
    }
    let origin_bytes = origin.stats.bytes();
    let block = 4u64 << 20;
    assert!(
        (SIZE..SIZE + block).contains(&origin_bytes),
        "origin bytes {origin_bytes}: the object about once"
    );
    for &i in readers {
        let m = metrics(procs[i].as_ref().expect("up")).await;
        assert_eq!(sample(&m, "dart_tracker_join_total{result=\"granted\"}"), 1, "node-{i}");
        assert_eq!(sample(&m, "dart_tracker_join_total{result=\"failed\"}"), 0, "node-{i}");
        assert_eq!(sample(&m, "dart_tracker_files"), 0, "node-{i} tracks nothing");
    }
    let m = metrics(procs[tracker].as_ref().expect("up")).await;
    assert_eq!(sample(&m, "dart_tracker_joins_served_total"), 3, "the tracker granted each reader");
    assert_eq!(sample(&m, "dart_tracker_files"), 1, "the tracker hosts the object's set");
    assert_eq!(sample(&m, "dart_tracker_join_total{result=\"granted\"}"), 0, "it read nothing");

    // The tracker dies; a new reader's JOIN fails and its read goes on over every member.
    procs[tracker] = None; // SIGKILL
    let p = procs[late].as_ref().expect("up");
    let reply = get(&format!("http://{}/dart/{upstream}", p.dart.client), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.body[..] == want[..], "every byte correct without the tracker");
    let m = metrics(p).await;
    assert_eq!(sample(&m, "dart_tracker_join_total{result=\"failed\"}"), 1, "the JOIN failed");
    println!(
        "late read without its tracker: origin served {} more bytes",
        origin.stats.bytes() - origin_bytes
    );
}

//! Five real `dart` processes on loopback that know only the next one's address (a cyclic seed
//! list, `--discover static:`): their views converge on one epoch; one is killed and leaves every
//! view after forget-after, while reads through the survivors keep succeeding with correct bytes.
//! One stopped with SIGTERM instead announces its departure to its broadcast targets (here every
//! other member) and leaves every view at once, long before forget-after.
//!
//! The time bounds asserted here are wall-clock bounds for five processes and this test sharing a
//! possibly loaded machine, so they leave room ([`SLACK`]); the figures measured are printed. The
//! protocol's own bounds (views converge within three discovery rounds, a member met again within
//! three) are asserted in simulated time, deterministically, by the shared subset that runs the
//! real shell under turmoil and madsim (`tests/support/subset.rs`).

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::{dart_command, free_port, get, origin, spawn_dart, temp_dir, DartProcess, TempDir};

const NODES: usize = 5;
const INTERVAL: Duration = Duration::from_millis(1000);
const FORGET: Duration = Duration::from_millis(3000);
const SIZE: u64 = 4 << 20;
/// Room for a loaded machine on top of a protocol bound (see the module doc).
const SLACK: Duration = Duration::from_secs(3);

struct Proc {
    dart: DartProcess,
    admin: SocketAddr,
    _dir: TempDir,
}

fn spawn(i: usize, peer_port: u16, seed_port: u16) -> Proc {
    spawn_with("discovery", i, peer_port, seed_port, FORGET)
}

fn spawn_with(test: &str, i: usize, peer_port: u16, seed_port: u16, forget: Duration) -> Proc {
    let dir = temp_dir(test, &format!("node-{i}"));
    let mut cmd = dart_command();
    cmd.args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--peer-listen", &format!("127.0.0.1:{peer_port}")])
        .args(["--self-id", &format!("node-{i}")])
        .args(["--discover", &format!("static:127.0.0.1:{seed_port}")])
        .args(["--discover-interval", &format!("{}ms", INTERVAL.as_millis())])
        .args(["--forget-after", &format!("{}ms", forget.as_millis())])
        .args(["--cache-size", "64MiB", "--mem-size", "0"])
        .args(["--allow-upstream", "127.0.0.0/8", "--public-upstream", "127.0.0.0/8"])
        .arg("--cache-dir")
        .arg(&dir.0);
    let dart = spawn_dart(&mut cmd);
    let admin = dart.admin.expect("an admin listener");
    Proc { dart, admin, _dir: dir }
}

/// The node's view: its epoch and member ids.
async fn view(p: &Proc) -> (String, Vec<String>) {
    let reply = get(&format!("http://{}/admin/members", p.admin), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
    let ids = v["members"].as_array().expect("members").iter();
    let ids = ids.map(|m| m["id"].as_str().expect("id").to_owned()).collect();
    (v["epoch"].as_str().expect("epoch").to_owned(), ids)
}

/// The live processes whose view lists `id`.
async fn listing(procs: &[Option<Proc>], id: &str) -> Vec<usize> {
    let mut listed = Vec::new();
    for (i, p) in procs.iter().enumerate() {
        if let Some(p) = p {
            if view(p).await.1.iter().any(|m| m == id) {
                listed.push(i);
            }
        }
    }
    listed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_processes_with_cyclic_seeds_converge_and_forget_a_killed_one() {
    let origin = origin(11, dart_net_tokio::origin_server::Behaviour::Honours, SIZE).await;
    let ports: Vec<u16> = (0..NODES).map(|_| free_port()).collect();
    let mut procs: Vec<Option<Proc>> =
        (0..NODES).map(|i| Some(spawn(i, ports[i], ports[(i + 1) % NODES]))).collect();
    let started = Instant::now();

    // Convergence: every view holds all five, with one epoch.
    let all: Vec<String> = (0..NODES).map(|i| format!("node-{i}")).collect();
    let converged = loop {
        let mut views = Vec::new();
        for p in procs.iter().flatten() {
            views.push(view(p).await);
        }
        if views.iter().all(|(e, ids)| *ids == all && *e == views[0].0) {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < INTERVAL * 3 + SLACK,
            "views did not converge within 3 intervals (+ {SLACK:?}): {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("5 processes converged on one epoch {converged:?} after the last started");
    let p0 = procs[0].as_ref().expect("alive");
    let reply = get(&format!("http://{}/admin/members", p0.admin), &[]).await;
    let v: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
    assert!(v["discovery"]["rounds"].as_u64().is_some_and(|r| r >= 1), "{v}");
    for m in v["members"].as_array().expect("members") {
        let ago = m["last_contact_ms"].as_u64();
        if m["id"] == "node-0" {
            assert_eq!(ago, None, "self has no contact age");
        } else {
            let bound = (3 * INTERVAL + SLACK).as_millis() as u64;
            assert!(ago.is_some_and(|ms| ms <= bound), "{m}");
        }
    }

    // Reads through the cluster, then kill one member and keep reading through the others.
    let want = dart_net_tokio::origin_server::generate(11, 0, SIZE as usize);
    let url = |p: &Proc, name: &str| {
        format!("http://{}/dart/http://{}/{name}", p.dart.client, origin.addr)
    };
    let victim = 2;
    for p in procs.iter().flatten() {
        let r = get(&url(p, "before.bin"), &[]).await;
        assert!(r.status == 200 && r.body[..] == want[..], "a read before the kill");
    }
    procs[victim] = None; // SIGKILL
    let killed = Instant::now();
    let gone_id = format!("node-{victim}");
    let mut reads = 0;
    let left = loop {
        for (i, p) in procs.iter().enumerate() {
            let Some(p) = p else { continue };
            let r = get(&url(p, &format!("after-{reads}-{i}.bin")), &[]).await;
            assert!(r.status == 200 && r.body[..] == want[..], "a read after the kill on node-{i}");
        }
        reads += 1;
        let listed = listing(&procs, &gone_id).await;
        if listed.is_empty() {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < FORGET + INTERVAL + SLACK,
            "nodes {listed:?} still list the killed {gone_id} {:?} after the kill",
            killed.elapsed()
        );
    };
    println!(
        "the killed member left every view {left:?} after the kill (forget-after {FORGET:?} + interval {INTERVAL:?}); {} rounds of reads all served",
        reads
    );
    let (epoch, ids) = view(procs[0].as_ref().expect("alive")).await;
    assert_eq!(ids.len(), NODES - 1, "epoch {epoch}: {ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stopped_with_sigterm_leaves_every_view_long_before_forget_after() {
    // Forget-after long enough that only the announcement can explain a quick departure.
    let forget = Duration::from_secs(60);
    let ports: Vec<u16> = (0..NODES).map(|_| free_port()).collect();
    let mut procs: Vec<Option<Proc>> = (0..NODES)
        .map(|i| Some(spawn_with("drain", i, ports[i], ports[(i + 1) % NODES], forget)))
        .collect();
    let started = Instant::now();
    let all: Vec<String> = (0..NODES).map(|i| format!("node-{i}")).collect();
    loop {
        let mut views = Vec::new();
        for p in procs.iter().flatten() {
            views.push(view(p).await.1);
        }
        if views.iter().all(|ids| *ids == all) {
            break;
        }
        assert!(started.elapsed() < INTERVAL * 3 + SLACK, "views did not converge: {views:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The broadcast targets are pinged on every view change: the victim announces its departure
    // to the ones it has published, so wait until they are every other member.
    let victim = 3;
    let others: Vec<String> = all.iter().filter(|id| **id != all[victim]).cloned().collect();
    let published = Instant::now();
    loop {
        let p = procs[victim].as_ref().expect("alive");
        let reply = get(&format!("http://{}/admin/members", p.admin), &[]).await;
        let v: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
        let targets = v["broadcast_targets"].as_array().expect("broadcast targets are on");
        let mut targets: Vec<String> =
            targets.iter().map(|t| t.as_str().expect("an id").to_owned()).collect();
        targets.sort();
        if targets == others {
            break;
        }
        assert!(
            published.elapsed() < INTERVAL * 3 + SLACK,
            "node-{victim} publishes {targets:?} as broadcast targets, not {others:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut gone = procs[victim].take().expect("alive");
    let pid = gone.dart.child.id().to_string();
    let status = std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
    assert!(status.success());
    let stopped = Instant::now();
    let exit = loop {
        if let Some(exit) = gone.dart.child.try_wait().expect("wait") {
            break exit;
        }
        assert!(stopped.elapsed() < Duration::from_secs(15), "still running after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // A clean exit although nobody reads its stdout any more (the harness read the banner only).
    assert!(exit.success(), "{exit:?}");
    let gone_id = format!("node-{victim}");
    let left = loop {
        let listed = listing(&procs, &gone_id).await;
        if listed.is_empty() {
            break stopped.elapsed();
        }
        assert!(
            stopped.elapsed() < INTERVAL * 3,
            "nodes {listed:?} still list the stopped {gone_id} {:?} after SIGTERM (forget-after {forget:?})",
            stopped.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!("the member stopped with SIGTERM left every view {left:?} after it (forget-after {forget:?})");
}

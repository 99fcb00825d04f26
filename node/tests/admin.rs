//! The admin plane's cluster views and the opt-in warm start, through `dart_node::start`.

use bytes::Bytes;
use dart_net_tokio::origin_server::{generate, serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::seam::{SeamConnector, TokioDialer};
use dart_net_tokio::server::ServeOptions;
use dart_node::cli::NodeFlags;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;

mod support;
use support::TempDir;

async fn get_bytes(url: &str) -> (u16, Bytes) {
    let c: Client<SeamConnector<TokioDialer>, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(2)));
    let resp = c.get(url.parse().expect("uri")).await.expect("response");
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.expect("body").to_bytes())
}

async fn get(url: &str) -> (u16, String) {
    let (status, body) = get_bytes(url).await;
    (status, String::from_utf8(body.to_vec()).expect("admin answers are text"))
}

fn flags(d: &TempDir) -> NodeFlags {
    NodeFlags {
        cache_size: 4 << 20,
        mem_size: 0,
        block_size: 64 << 10,
        chunk_size: 256 << 10,
        drain_secs: 1,
        ..support::loopback_flags(d)
    }
}

#[tokio::test]
async fn members_and_ring_show_the_view_with_string_epochs_and_single_nodes_answer_503() {
    let d = support::temp_dir("admin", "cluster");
    let peer =
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let f = NodeFlags {
        self_id: "node-a".into(),
        peer_listen: peer.to_string(),
        peers: format!("node-a@{peer},node-b@127.0.0.1:1,node-c@127.0.0.1:2"),
        ..flags(&d)
    };
    let n = dart_node::start(&f).await.expect("start");
    let admin = n.admin_addr.expect("admin");
    let (status, body) = get(&format!("http://{admin}/admin/members")).await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["self_id"], "node-a");
    assert!(v["epoch"].is_string(), "epoch is a decimal string: {body}");
    let ids: Vec<&str> =
        v["members"].as_array().expect("members").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, ["node-a", "node-b", "node-c"]);
    assert_eq!(v["members"][0]["state"], "Ready");

    let (status, body) =
        get(&format!("http://{admin}/admin/ring?key=18446744073709551615&n=2")).await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["key"], "18446744073709551615");
    assert_eq!(v["order"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["order"][0]["rank"], 0);
    let (status, _) = get(&format!("http://{admin}/admin/ring?key=-1")).await;
    assert_eq!(status, 400);
    let (status, body) = get(&format!("http://{admin}/admin/ring?key=7&n=zero")).await;
    assert_eq!(status, 200, "an invalid n falls back to 8");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).expect("json")["order"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );
    n.shutdown().await;

    let d2 = support::temp_dir("admin", "single");
    let single = dart_node::start(&flags(&d2)).await.expect("start");
    let admin = single.admin_addr.expect("admin");
    assert_eq!(get(&format!("http://{admin}/admin/members")).await.0, 503);
    assert_eq!(get(&format!("http://{admin}/admin/ring?key=1")).await.0, 503);
    single.shutdown().await;
}

#[tokio::test]
async fn with_warm_start_kept_blocks_are_served_only_for_objects_that_never_change() {
    let size = 5 * (64 << 10) + 7;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let origin = l.local_addr().expect("addr");
    let stats = Arc::new(OriginStats::default());
    let object = OriginObject { seed: 5, size, behaviour: Behaviour::Honours };
    tokio::spawn(serve_origin(
        l,
        object,
        stats.clone(),
        std::future::pending(),
        ServeOptions::default(),
    ));
    let d = support::temp_dir("admin", "warm");
    let immutable = vec![format!("http://{origin}/")];
    let f = NodeFlags { warm_start: true, immutable, ..flags(&d) };
    let want = generate(5, 0, size as usize);
    let url =
        |n: &dart_node::Running| format!("http://{}/dart/http://{origin}/w.bin", n.client_addr);

    let n = dart_node::start(&f).await.expect("start");
    let (status, body) = get_bytes(&url(&n)).await;
    assert_eq!((status, &body[..]), (200, &want[..]));
    assert_eq!(stats.requests(), 7, "one probe and six blocks");
    n.shutdown().await;

    // Declared immutable: the kept blocks are served.
    let n = dart_node::start(&f).await.expect("restart on the same directory");
    let (status, body) = get_bytes(&url(&n)).await;
    assert_eq!((status, &body[..]), (200, &want[..]));
    assert_eq!(stats.requests(), 8, "only the size probe: every block came from the kept cache");
    n.shutdown().await;

    // Not declared immutable: the object may have changed while the node was down, and kept
    // blocks carry no version, so each is dropped unserved and read afresh.
    let f = NodeFlags { immutable: Vec::new(), ..f };
    let n = dart_node::start(&f).await.expect("restart without --immutable");
    let (status, body) = get_bytes(&url(&n)).await;
    assert_eq!((status, &body[..]), (200, &want[..]));
    assert_eq!(stats.requests(), 15, "a probe and six blocks again");
    let admin = n.admin_addr.expect("admin");
    let (_, metrics) = get(&format!("http://{admin}/metrics")).await;
    assert!(metrics.contains("dart_warm_blocks_dropped_total 6"), "{metrics}");
    n.shutdown().await;
}

//! Roster exchange over real loopback sockets (seeds/peer.md §3.7 and its §7 roster tests).

use dart_core::breaker::{Breaker, BreakerConfig, CircuitState, HardReason, Outcome};
use dart_core::engine::resolve::UpstreamMode;
use dart_core::engine::route::Placement;
use dart_core::engine::{Engine, EngineConfig, P2p};
use dart_core::membership::{Member, View};
use dart_core::node::{Bounds, Node, NodeConfig, Plane};
use dart_net_tokio::cache::MemCache;
use dart_net_tokio::client::HttpClient;
use dart_net_tokio::driver::NodeDriver;
use dart_net_tokio::seam::TokioDialer;
use dart_net_tokio::server::{serve, ServeOptions};
use std::net::SocketAddr;
use std::sync::Arc;

fn node(self_id: &str, members: Vec<Member>, advertise: &str) -> Arc<NodeDriver<TokioDialer>> {
    let mut engine = Engine::new(EngineConfig::default());
    let placement = Placement::new(View::new(members), self_id, 2, 1);
    let breaker = Breaker::new(BreakerConfig::default()).expect("breaker");
    engine.enable_p2p(P2p { placement, breaker });
    let config = NodeConfig {
        mode: UpstreamMode::prefix("dart"),
        bounds: Bounds::default(),
        self_id: self_id.to_owned(),
        advertise: advertise.to_owned(),
        access: dart_core::node::Access::trusting_loopback(),
    };
    let node = Node::new(engine, config).expect("bounds");
    let client = HttpClient::new(TokioDialer, None, 4, std::time::Duration::from_secs(90));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    std::mem::forget(stop);
    NodeDriver::start(node, Arc::new(MemCache::default()), client, stopped)
}

async fn server(self_id: &str, members: Vec<Member>) -> (SocketAddr, Arc<NodeDriver<TokioDialer>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let driver = node(self_id, members, &addr.to_string());
    let d = driver.clone();
    let handler = move |req| d.clone().handle(Plane::Peer, req);
    tokio::spawn(serve(l, handler, std::future::pending(), ServeOptions::default()));
    (addr, driver)
}

fn state(n: &NodeDriver<TokioDialer>, addr: &str) -> CircuitState {
    let now = n.clock().now();
    n.with_node(|n| n.engine().p2p().expect("p2p").breaker.state(&addr.to_owned(), now))
}

fn learned(n: &NodeDriver<TokioDialer>) -> std::collections::BTreeMap<String, String> {
    n.with_node(|n| n.learned().clone())
}

#[tokio::test]
async fn a_caller_holding_only_an_address_learns_the_responders_id_and_its_members() {
    let members = vec![Member::ready("b", "ignored:1"), Member::ready("c", "h3:9000")];
    let (addr, _plane) = server("b", members.clone()).await;
    let caller = node("a", vec![Member::ready("a", "h1:9000")], "h1:9000");
    let (roster, responder) = caller.fetch_roster(&addr.to_string()).await.expect("roster");
    assert_eq!(responder.as_deref(), Some("b"));
    let ids: Vec<&str> = roster.members.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["b", "c"]);
    assert_eq!(roster.epoch, View::new(members).epoch());
}

#[tokio::test]
async fn the_responder_learns_the_callers_advertised_address_not_its_source_port() {
    let (addr, plane) = server("b", vec![Member::ready("b", "h2:9000")]).await;
    let caller = node("a", vec![Member::ready("a", "h1:9000")], "10.1.2.3:9000");
    caller.fetch_roster(&addr.to_string()).await.expect("roster");
    let learned = learned(&plane);
    assert_eq!(learned.get("a").map(String::as_str), Some("10.1.2.3:9000"));
}

#[tokio::test]
async fn an_anonymous_caller_teaches_nothing_and_writes_are_refused() {
    let (addr, plane) = server("b", vec![Member::ready("b", "h2:9000")]).await;
    let c = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let uri = format!("http://{addr}/peer/v1/roster");
    let resp = c.get(uri.parse().expect("uri")).await.expect("response");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("x-dart-node").and_then(|v| v.to_str().ok()), Some("b"));
    assert!(resp.headers().get("x-dart-epoch").is_some());
    assert!(learned(&plane).is_empty());
    let post = http::Request::post(uri).body(http_body_util::Empty::new()).expect("req");
    let resp = c.request(post).await.expect("response");
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers().get("allow").and_then(|v| v.to_str().ok()), Some("GET"));
}

#[tokio::test]
async fn a_roster_fetch_goes_through_an_open_circuit_and_closes_it() {
    let (addr, _plane) = server("b", vec![Member::ready("b", "h2:9000")]).await;
    let caller = node("a", vec![Member::ready("a", "h1:9000")], "h1:9000");
    let peer = addr.to_string();
    let now = caller.clock().now();
    caller.with_node_mut(|n| {
        let b = &mut n.engine_mut().p2p_mut().expect("p2p").breaker;
        let permit = b.begin_data(&peer, now).permit().expect("admitted");
        b.complete(permit, Outcome::HardFailure(HardReason::Dial), now);
    });
    assert_eq!(state(&caller, &peer), CircuitState::Open);
    caller.fetch_roster(&peer).await.expect("roster despite the open circuit");
    assert_eq!(state(&caller, &peer), CircuitState::Closed);
}

#[tokio::test]
async fn a_failed_roster_dial_opens_the_circuit_for_the_data_path() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").to_string()
    };
    let caller = node("a", vec![Member::ready("a", "h1:9000")], "h1:9000");
    assert!(caller.fetch_roster(&closed).await.is_err());
    assert_eq!(state(&caller, &closed), CircuitState::Open);
}

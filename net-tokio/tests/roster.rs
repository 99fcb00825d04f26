//! Roster exchange over real loopback sockets (seeds/peer.md §3.7 and its §7 roster tests).

use dart_core::breaker::{Breaker, BreakerConfig, CircuitState, HardReason, Outcome};
use dart_core::engine::route::Placement;
use dart_core::engine::{Engine, EngineConfig, P2p};
use dart_core::membership::{Member, View};
use dart_net_tokio::cache::MemCache;
use dart_net_tokio::driver::NodeCore;
use dart_net_tokio::metrics::Metrics;
use dart_net_tokio::origin::{OriginConfig, OriginFetcher};
use dart_net_tokio::peer_client::{PeerClient, PeerConfig};
use dart_net_tokio::peer_plane::PeerPlane;
use dart_net_tokio::seam::{ShellClock, TokioDialer};
use dart_net_tokio::server::{serve, ServeOptions};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

fn node(self_id: &str, members: Vec<Member>) -> Arc<NodeCore<TokioDialer>> {
    let mut engine = Engine::new(EngineConfig::default());
    let placement = Placement::new(View::new(members), self_id, 2, 1);
    let breaker = Breaker::new(BreakerConfig::default()).expect("breaker");
    engine.enable_p2p(P2p { placement, breaker });
    let engine = Arc::new(Mutex::new(engine));
    let cache: Arc<MemCache> = Arc::new(MemCache::default());
    let clock = ShellClock::start();
    let metrics = Arc::new(Metrics::new(engine.clone(), cache.clone(), clock));
    Arc::new(NodeCore {
        engine,
        cache,
        origin: OriginFetcher::new(TokioDialer, OriginConfig::default()).expect("origin client"),
        peers: Some(PeerClient::new(TokioDialer, PeerConfig::default(), self_id)),
        metrics,
        clock,
    })
}

async fn server(self_id: &str, members: Vec<Member>) -> (SocketAddr, Arc<PeerPlane<TokioDialer>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let plane = Arc::new(PeerPlane::new(node(self_id, members), self_id, &addr.to_string()));
    let p = plane.clone();
    let handler = move |req| p.clone().handle(req);
    tokio::spawn(serve(l, handler, std::future::pending(), ServeOptions::default()));
    (addr, plane)
}

fn state(n: &NodeCore<TokioDialer>, addr: &str) -> CircuitState {
    let e = n.engine.lock().expect("engine");
    e.p2p().expect("p2p").breaker.state(&addr.to_owned(), n.clock.now())
}

#[tokio::test]
async fn a_caller_holding_only_an_address_learns_the_responders_id_and_its_members() {
    let members = vec![Member::ready("b", "ignored:1"), Member::ready("c", "h3:9000")];
    let (addr, _plane) = server("b", members.clone()).await;
    let caller = node("a", vec![Member::ready("a", "h1:9000")]);
    let (roster, responder) =
        caller.fetch_roster(&addr.to_string(), "h1:9000").await.expect("roster");
    assert_eq!(responder.as_deref(), Some("b"));
    let ids: Vec<&str> = roster.members.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["b", "c"]);
    assert_eq!(roster.epoch, View::new(members).epoch());
}

#[tokio::test]
async fn the_responder_learns_the_callers_advertised_address_not_its_source_port() {
    let (addr, plane) = server("b", vec![Member::ready("b", "h2:9000")]).await;
    let caller = node("a", vec![Member::ready("a", "h1:9000")]);
    caller.fetch_roster(&addr.to_string(), "10.1.2.3:9000").await.expect("roster");
    let learned = plane.learned.lock().expect("learned").clone();
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
    assert!(plane.learned.lock().expect("learned").is_empty());
    let post = http::Request::post(uri).body(http_body_util::Empty::new()).expect("req");
    let resp = c.request(post).await.expect("response");
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers().get("allow").and_then(|v| v.to_str().ok()), Some("GET"));
}

#[tokio::test]
async fn a_roster_fetch_goes_through_an_open_circuit_and_closes_it() {
    let (addr, _plane) = server("b", vec![Member::ready("b", "h2:9000")]).await;
    let caller = node("a", vec![Member::ready("a", "h1:9000")]);
    let peer = addr.to_string();
    {
        let mut e = caller.engine.lock().expect("engine");
        let b = &mut e.p2p_mut().expect("p2p").breaker;
        let permit = b.begin_data(&peer, caller.clock.now()).permit().expect("admitted");
        b.complete(permit, Outcome::HardFailure(HardReason::Dial), caller.clock.now());
    }
    assert_eq!(state(&caller, &peer), CircuitState::Open);
    caller.fetch_roster(&peer, "h1:9000").await.expect("roster despite the open circuit");
    assert_eq!(state(&caller, &peer), CircuitState::Closed);
}

#[tokio::test]
async fn a_failed_roster_dial_opens_the_circuit_for_the_data_path() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").to_string()
    };
    let caller = node("a", vec![Member::ready("a", "h1:9000")]);
    assert!(caller.fetch_roster(&closed, "h1:9000").await.is_err());
    assert_eq!(state(&caller, &closed), CircuitState::Open);
}

//! Carries out a core [`Read`]'s internal actions — probes, cache look-ups, peer and origin
//! fetches, stores — and hands back only what the caller must put on its own wire (the head,
//! body bytes, the end). The client plane and the peer server both drive reads through it, so a
//! client read and a relay take exactly the same decisions.

use crate::cache::BlockCache;
use crate::metrics::Metrics;
use crate::origin::{Fill, OriginFetcher, ProbeFill};
use crate::peer_client::PeerClient;
use crate::seam::{Dialer, ShellClock};
use bytes::Bytes;
use dart_core::breaker::{Observation, Permit};
use dart_core::codec::roster::Roster;
use dart_core::engine::origin::ProbeOutcome;
use dart_core::engine::{
    block_verdict, Action, Engine, FetchedBlock, Read, ReadFailure, ResponseHead, Verdict,
};
use std::sync::{Arc, Mutex};

/// What a read asks its caller to put on the wire.
#[derive(Debug)]
pub enum Outward {
    /// Send the response head.
    Respond(ResponseHead),
    /// Send these body bytes.
    Emit(Bytes),
    /// Done.
    Finish,
    /// Failed (before or after the head; see [`ReadFailure::committed`]).
    Fail(ReadFailure),
    /// Proxy the request verbatim to this Range-blind origin URL.
    Passthrough(String),
}

/// The node's shared machinery: the core engine and everything that performs its decisions.
pub struct NodeCore<D: Dialer> {
    /// The core engine (one per node).
    pub engine: Arc<Mutex<Engine>>,
    /// The block cache.
    pub cache: Arc<dyn BlockCache>,
    /// The origin fetcher.
    pub origin: OriginFetcher<D>,
    /// The peer client, when the peer path is on.
    pub peers: Option<PeerClient<D>>,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// The core's clock.
    pub clock: ShellClock,
}

/// Returns a breaker permit as abandoned if its request task is dropped before answering.
pub struct PermitGuard<'a> {
    /// The permit, until it is answered.
    pub permit: Option<Permit<String>>,
    /// The engine whose breaker issued it.
    pub engine: &'a Mutex<Engine>,
    /// The core's clock.
    pub clock: ShellClock,
}

impl Drop for PermitGuard<'_> {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            if let Ok(mut engine) = self.engine.lock() {
                engine.abandon(permit, self.clock.now());
            }
        }
    }
}

impl<D: Dialer> NodeCore<D> {
    fn engine(&self) -> std::sync::MutexGuard<'_, Engine> {
        self.engine.lock().expect("engine lock")
    }

    /// Fetches a peer's roster. Roster requests bypass the breaker's admission (discovery must
    /// reach peers whose circuit is open) but their outcome is recorded, so a successful one can
    /// close a recovered peer's circuit and a failed dial opens it for the data path.
    pub async fn fetch_roster(
        &self,
        addr: &str,
        advertise: &str,
    ) -> Result<(Roster, Option<String>), String> {
        let Some(peers) = &self.peers else { return Err("the peer path is off".into()) };
        let permit = {
            let mut engine = self.engine();
            let Some(p2p) = engine.p2p_mut() else { return Err("the peer path is off".into()) };
            p2p.breaker.begin_roster(&addr.to_owned(), self.clock.now())
        };
        let mut guard =
            PermitGuard { permit: Some(permit), engine: &self.engine, clock: self.clock };
        let result = peers.fetch_roster(addr, advertise).await;
        let permit = guard.permit.take().expect("taken once");
        let observation = match &result {
            Ok(_) => Observation::Served,
            Err((o, _)) => *o,
        };
        let now = self.clock.now();
        if let Some(p2p) = self.engine().p2p_mut() {
            p2p.breaker.complete(permit, observation.outcome(), now);
        }
        result.map_err(|(_, e)| e)
    }

    /// Runs `read` until it has something for the wire. Never returns for an internal action.
    pub async fn next(&self, read: &mut Read) -> Outward {
        loop {
            let Some(action) = read.poll_action() else {
                unreachable!("a read waiting for nothing: every question is answered inline");
            };
            if let Some(out) = self.perform(read, action).await {
                return out;
            }
        }
    }

    /// Carries out one action: answers a question (returning `None`) or hands back what goes on
    /// the wire.
    pub async fn perform(&self, read: &mut Read, action: Action) -> Option<Outward> {
        {
            match action {
                Action::Probe { url } => {
                    let object = read.object().clone();
                    let engine = self.engine.clone();
                    let fill: ProbeFill = Box::new(move |outcome: &ProbeOutcome| {
                        if let Ok(mut engine) = engine.lock() {
                            engine.record_probe(&object, *outcome);
                        }
                    });
                    let id = read.object().id.clone();
                    let answer = self.origin.probe(&id, &url, Some(fill)).await;
                    read.handle_probe(&mut self.engine(), answer, self.clock.now());
                }
                Action::Lookup { key } => {
                    let hit = self.cache.get(&key);
                    read.handle_lookup(&mut self.engine(), hit, self.clock.now());
                }
                Action::FetchPeer { peer, key, url, hop, expected_len, permit, .. } => {
                    let Some(peers) = &self.peers else {
                        unreachable!("the engine routes to peers only when the peer path is on")
                    };
                    let mut guard = PermitGuard {
                        permit: Some(permit),
                        engine: &self.engine,
                        clock: self.clock,
                    };
                    let t0 = tokio::time::Instant::now();
                    let answer = peers.fetch_block(&peer.addr, key, &url, hop, expected_len).await;
                    self.metrics.observe_fetch("peer", t0.elapsed().as_secs_f64());
                    let permit = guard.permit.take().expect("taken once");
                    read.handle_peer(&mut self.engine(), permit, answer, self.clock.now());
                }
                Action::FetchOrigin { key, url, start, end, expected_len, object_size, class } => {
                    let id = read.object().id.clone();
                    let cache = self.cache.clone();
                    let fill: Fill = Box::new(move |b: &FetchedBlock| {
                        if block_verdict(object_size, expected_len, b) == Verdict::Cache {
                            cache.put(key, &b.data, class);
                        }
                    });
                    let t0 = tokio::time::Instant::now();
                    let got = self.origin.fetch(&id, &url, start, end, Some(fill)).await;
                    self.metrics.observe_fetch("origin", t0.elapsed().as_secs_f64());
                    read.handle_fetch(&mut self.engine(), got);
                }
                Action::Store { key, data, class } => self.cache.put(key, &data, class),
                Action::Respond(head) => return Some(Outward::Respond(head)),
                Action::Emit(bytes) => return Some(Outward::Emit(bytes)),
                Action::Finish => return Some(Outward::Finish),
                Action::Fail(f) => return Some(Outward::Fail(f)),
                Action::Passthrough { url } => return Some(Outward::Passthrough(url)),
            }
        }
        None
    }
}

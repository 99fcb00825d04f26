//! The peer client: fetches one whole block from a peer with three bounds (dial, response head,
//! whole request) and classifies how the request ended into the core's [`Observation`]; the
//! breaker decision that follows is the core's.

use crate::seam::{Dialer, SeamConnector};
use bytes::{Bytes, BytesMut};
use dart_core::breaker::Observation;
use dart_core::codec::roster::{decode_roster, Roster, ROSTER_BYTES_MAX};
use dart_core::codec::wire::{
    block_path, HEADER_HOP, HEADER_NODE, HEADER_ORIGIN, HEADER_PEER_ADDR, HEADER_UPSTREAM_STATUS,
    ROSTER_PATH,
};
use dart_core::engine::PeerAnswer;
use dart_core::hash::BlockKey;
use http::header::CONTENT_LENGTH;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::time::Duration;

/// Bounds and pool of the peer client (seeds/peer.md §3.3).
#[derive(Clone, Debug)]
pub struct PeerConfig {
    /// A peer whose machine is gone sends no RST: give up connecting after this long.
    pub dial_timeout: Duration,
    /// A peer that accepted but never answers: give up on the response head after this long.
    /// Must exceed a relay's legitimate time to first byte.
    pub response_header_timeout: Duration,
    /// Bounds the whole exchange, body included.
    pub request_timeout: Duration,
    /// Idle connections kept per peer.
    pub idle_per_host: usize,
    /// Idle connections are closed after this long.
    pub idle_timeout: Duration,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            dial_timeout: Duration::from_secs(1),
            response_header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            idle_per_host: 32,
            idle_timeout: Duration::from_secs(90),
        }
    }
}

/// A pooled HTTP/1.1 peer client.
pub struct PeerClient<D: Dialer> {
    client: Client<SeamConnector<D>, Empty<Bytes>>,
    config: PeerConfig,
    self_id: String,
}

impl<D: Dialer> PeerClient<D> {
    /// A client identifying itself as `self_id`. Must be called inside a tokio runtime.
    pub fn new(dialer: D, config: PeerConfig, self_id: &str) -> Self {
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(config.idle_timeout)
            .pool_max_idle_per_host(config.idle_per_host)
            .build(SeamConnector::new(dialer, config.dial_timeout));
        PeerClient { client, config, self_id: self_id.to_owned() }
    }

    /// The configured bounds.
    pub fn config(&self) -> &PeerConfig {
        &self.config
    }

    /// Asks the peer at `addr` for block `key` of `url` at relay depth `hop`, reading at most
    /// `expected + 1` body bytes. An empty `url` asks for the peer's cached copy only.
    pub async fn fetch_block(
        &self,
        addr: &str,
        key: BlockKey,
        url: &str,
        hop: u64,
        expected: u64,
    ) -> PeerAnswer {
        let exchange = async {
            match self.open_block(addr, key, url, hop, expected).await {
                Ok(body) => read_bounded(body, expected).await,
                Err(observation) => PeerAnswer::Failed(observation),
            }
        };
        let bound = self.config.request_timeout;
        tokio::time::timeout(bound, exchange)
            .await
            .unwrap_or(PeerAnswer::Failed(Observation::TimedOut))
    }

    /// Sends `req` and waits for its head within the response-header bound; a failure is
    /// classified for the breaker (a failed or timed-out dial is a dial failure).
    async fn send(
        &self,
        req: Request<Empty<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, (Observation, String)> {
        let bound = self.config.response_header_timeout;
        match tokio::time::timeout(bound, self.client.request(req)).await {
            Err(_) => Err((Observation::TimedOut, format!("no response head within {bound:?}"))),
            Ok(Err(e)) if e.is_connect() => Err((Observation::DialFailed, e.to_string())),
            Ok(Err(e)) => Err((Observation::BodyInterrupted, e.to_string())),
            Ok(Ok(resp)) => Ok(resp),
        }
    }

    /// Sends the request and waits for a 200 head (bounded by the dial and response-header
    /// bounds); any other outcome is classified. The caller reads the body, bounded by the
    /// request bound, with [`read_bounded`] or by streaming it (cut-through relays).
    pub async fn open_block(
        &self,
        addr: &str,
        key: BlockKey,
        url: &str,
        hop: u64,
        expected: u64,
    ) -> Result<hyper::body::Incoming, Observation> {
        let uri = format!("http://{addr}{}", block_path(key));
        let mut req = Request::get(uri.as_str()).header(HEADER_HOP, hop);
        // An empty URL is a transport-only request: the header is absent, never empty.
        if !url.is_empty() {
            if let Ok(v) = HeaderValue::try_from(url) {
                req = req.header(HEADER_ORIGIN, v);
            }
        }
        if let Ok(v) = HeaderValue::try_from(self.self_id.as_str()) {
            req = req.header(HEADER_NODE, v);
        }
        let Ok(req) = req.body(Empty::new()) else {
            return Err(Observation::UnexpectedStatus(400));
        };
        let resp = self.send(req).await.map_err(|(observation, _)| observation)?;
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok());
        let upstream = header(HEADER_UPSTREAM_STATUS).and_then(|v| v.parse::<u16>().ok());
        let announced = header(CONTENT_LENGTH.as_str()).and_then(|v| v.parse::<u64>().ok());
        let status = resp.status().as_u16();
        if let Some(observation) = Observation::of_block_head(status, upstream, announced, expected)
        {
            return Err(observation);
        }
        Ok(resp.into_body())
    }
}

impl<D: Dialer> PeerClient<D> {
    /// Fetches the roster of the peer at `addr`, identifying this node and its advertised address
    /// so the peer can learn it. Returns the roster and the responder's self-reported id (credit
    /// liveness to that id, never to the dialed address), or the observation for the breaker.
    pub async fn fetch_roster(
        &self,
        addr: &str,
        advertise: &str,
    ) -> Result<(Roster, Option<String>), (Observation, String)> {
        let bound = self.config.request_timeout;
        match tokio::time::timeout(bound, self.roster_exchange(addr, advertise)).await {
            Ok(r) => r,
            Err(_) => Err((Observation::TimedOut, "roster request timed out".into())),
        }
    }

    async fn roster_exchange(
        &self,
        addr: &str,
        advertise: &str,
    ) -> Result<(Roster, Option<String>), (Observation, String)> {
        let uri = format!("http://{addr}{ROSTER_PATH}");
        let mut req = Request::get(uri.as_str());
        for (name, value) in [(HEADER_NODE, self.self_id.as_str()), (HEADER_PEER_ADDR, advertise)] {
            if let Ok(v) = HeaderValue::try_from(value) {
                req = req.header(name, v);
            }
        }
        let req = req
            .body(Empty::new())
            .map_err(|e| (Observation::UnexpectedStatus(400), e.to_string()))?;
        let resp = self.send(req).await?;
        if resp.status() != StatusCode::OK {
            let status = resp.status().as_u16();
            return Err((Observation::UnexpectedStatus(status), format!("roster status {status}")));
        }
        let responder =
            resp.headers().get(HEADER_NODE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let limited = http_body_util::Limited::new(resp.into_body(), ROSTER_BYTES_MAX);
        let body = limited
            .collect()
            .await
            .map_err(|e| (Observation::BodyInterrupted, e.to_string()))?
            .to_bytes();
        let roster = decode_roster(&body, responder.as_deref(), addr)
            .map_err(|e| (Observation::MalformedBody, e.to_string()))?;
        Ok((roster, responder))
    }
}

/// Reads at most `expected + 1` bytes of a body and judges its length.
pub async fn read_bounded(mut body: hyper::body::Incoming, expected: u64) -> PeerAnswer {
    let limit = expected.saturating_add(1);
    let mut buf = BytesMut::with_capacity(usize::try_from(expected).unwrap_or(0).min(64 << 20));
    while (buf.len() as u64) < limit {
        match body.frame().await {
            None => break,
            Some(Err(_)) => return PeerAnswer::Failed(Observation::BodyInterrupted),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let room = (limit - buf.len() as u64) as usize;
                    buf.extend_from_slice(&data[..data.len().min(room)]);
                }
            }
        }
    }
    if buf.len() as u64 != expected {
        return PeerAnswer::Failed(Observation::WrongLength);
    }
    PeerAnswer::Block(buf.freeze())
}

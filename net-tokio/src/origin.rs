//! The origin fetcher: performs size probes, block-window fetches and passthrough requests with a
//! pooled hyper client, and coalesces concurrent identical fetches through the core's
//! [`FlightTable`] (who leads, who joins, when a flight is stale and what a joiner does are core
//! decisions; this module only moves bytes).
//!
//! Bounds: every dial gives up after `dial_timeout`, every response head after
//! `response_header_timeout`, and every probe or block fetch (head and body) after
//! `request_timeout`. A flight runs in its own task under the flight bound, so a caller that goes
//! away returns at once while the others keep waiting for the shared result.

use crate::seam::{Dialer, SeamConnector, ShellClock};
use bytes::{Bytes, BytesMut};
use dart_core::codec::redact::redact_url;
use dart_core::engine::flight::{joiner_action, FlightId, FlightTable, JoinerAction, Role};
use dart_core::engine::origin::{
    classify_probe, finish_range_body, plan_range_response, OriginError, ProbeOutcome,
};
use dart_core::engine::FetchedBlock;
use http::header::{CONTENT_LENGTH, CONTENT_RANGE, RANGE};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Bounds and pool settings of the origin client.
#[derive(Clone, Debug)]
pub struct OriginConfig {
    /// Gives up connecting after this long.
    pub dial_timeout: Duration,
    /// Gives up waiting for a response head after this long.
    pub response_header_timeout: Duration,
    /// Bounds a whole probe or block fetch, body included.
    pub request_timeout: Duration,
    /// Bounds one coalesced flight (spec: MaxFlight, 10 min).
    pub max_flight: Duration,
    /// Idle connections kept per origin host.
    pub idle_per_host: usize,
    /// Idle connections are closed after this long.
    pub idle_timeout: Duration,
    /// DER certificates of private CAs trusted for `https://` origins, besides the Mozilla roots.
    pub extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig {
            dial_timeout: Duration::from_secs(10),
            response_header_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(300),
            max_flight: dart_core::engine::flight::DEFAULT_MAX_FLIGHT,
            idle_per_host: 32,
            idle_timeout: Duration::from_secs(90),
            extra_roots: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum FlightKey {
    Probe(String),
    Block(String, u64, u64),
}

#[derive(Clone, Debug)]
enum FlightOutput {
    Probe(ProbeOutcome),
    Block(FetchedBlock),
}

type Shared = Result<FlightOutput, OriginError>;

struct Flights {
    table: FlightTable<FlightKey>,
    senders: BTreeMap<FlightId, watch::Sender<Option<Shared>>>,
}

/// Work a flight's leader does with a successful block before the flight ends (the client plane
/// fills the cache here, so a reader arriving after the flight finds the block instead of
/// starting a second fetch).
pub type Fill = Box<dyn FnOnce(&FetchedBlock) + Send>;

/// Work a probe flight's leader does with a successful probe before the flight ends (the driver
/// records the size in the engine here, so a read arriving after the flight never probes again).
pub type ProbeFill = Box<dyn FnOnce(&ProbeOutcome) + Send>;

enum FlightFill {
    Block(Fill),
    Probe(ProbeFill),
}

/// Counters of origin traffic, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OriginCounters {
    /// Requests sent to the origin (probes, block fetches and passthrough).
    pub requests: u64,
    /// Callers that joined another caller's flight.
    pub coalesced: u64,
}

type HttpClient<D> = Client<SeamConnector<D>, Empty<Bytes>>;

/// The origin fetcher; cheap to clone (shared pool and flight table).
pub struct OriginFetcher<D: Dialer> {
    client: HttpClient<D>,
    config: OriginConfig,
    clock: ShellClock,
    flights: Arc<Mutex<Flights>>,
    counters: Arc<Mutex<OriginCounters>>,
}

impl<D: Dialer> Clone for OriginFetcher<D> {
    fn clone(&self) -> Self {
        OriginFetcher {
            client: self.client.clone(),
            config: self.config.clone(),
            clock: self.clock,
            flights: self.flights.clone(),
            counters: self.counters.clone(),
        }
    }
}

fn transport(url: &str, what: &str, e: impl std::fmt::Display) -> OriginError {
    OriginError::Transport(format!("{what} {}: {e}", redact_url(url)))
}

fn header_bytes(headers: &HeaderMap, name: http::header::HeaderName) -> Option<&[u8]> {
    headers.get(name).map(HeaderValue::as_bytes)
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

impl<D: Dialer> OriginFetcher<D> {
    /// A fetcher dialing through `dialer`, speaking TLS to `https://` origins. Must be called
    /// inside a tokio runtime. Fails only when an extra root certificate is malformed.
    pub fn new(dialer: D, config: OriginConfig) -> Result<Self, rustls::Error> {
        let tls = crate::seam::tls_client_config(&config.extra_roots)?;
        let connector = SeamConnector::with_tls(dialer, config.dial_timeout, tls);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(config.idle_timeout)
            .pool_max_idle_per_host(config.idle_per_host)
            .build(connector);
        let flights =
            Flights { table: FlightTable::new(config.max_flight), senders: BTreeMap::new() };
        Ok(OriginFetcher {
            client,
            config,
            clock: ShellClock::start(),
            flights: Arc::new(Mutex::new(flights)),
            counters: Arc::new(Mutex::new(OriginCounters::default())),
        })
    }

    /// Origin traffic so far.
    pub fn counters(&self) -> OriginCounters {
        *self.counters.lock().expect("counters lock")
    }

    /// Sends `GET url` with extra headers and waits for the response head (bounded).
    async fn send(
        &self,
        url: &str,
        headers: &HeaderMap,
    ) -> Result<Response<Incoming>, OriginError> {
        let uri: http::Uri = url
            .parse()
            .map_err(|_| OriginError::InvalidRequest("upstream URL is not a valid URI"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(OriginError::InvalidRequest("upstream URL must be http or https"));
        }
        let mut req = Request::get(uri);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let req = req.body(Empty::new()).map_err(|e| transport(url, "build", e))?;
        self.counters.lock().expect("counters lock").requests += 1;
        let bound = self.config.response_header_timeout;
        match tokio::time::timeout(bound, self.client.request(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => {
                let cause = std::error::Error::source(&e).map(|s| s.to_string());
                Err(transport(url, "request", cause.unwrap_or_else(|| e.to_string())))
            }
            Err(_) => Err(transport(url, "response header", format!("timed out after {bound:?}"))),
        }
    }

    async fn probe_once(&self, url: &str) -> Result<ProbeOutcome, OriginError> {
        let mut headers = HeaderMap::new();
        headers.insert(RANGE, HeaderValue::from_static("bytes=0-0"));
        let resp = self.send(url, &headers).await?;
        let h = resp.headers();
        let cr = header_bytes(h, CONTENT_RANGE);
        classify_probe(resp.status().as_u16(), cr, content_length(h))
        // The body is dropped unread: a Range-blind 200 may be the whole object.
    }

    async fn fetch_once(
        &self,
        url: &str,
        start: u64,
        end: u64,
    ) -> Result<FetchedBlock, OriginError> {
        if end < start {
            return Err(OriginError::InvalidRequest("end before start"));
        }
        let mut headers = HeaderMap::new();
        let range = HeaderValue::try_from(format!("bytes={start}-{end}")).expect("ascii range");
        headers.insert(RANGE, range);
        let resp = self.send(url, &headers).await?;
        let (parts, mut body) = resp.into_parts();
        let cr = header_bytes(&parts.headers, CONTENT_RANGE);
        let plan = plan_range_response(
            start,
            end,
            parts.status.as_u16(),
            cr,
            content_length(&parts.headers),
        )?;
        let mut skip = plan.skip;
        let cap = usize::try_from(plan.read_max.min(64 << 20)).expect("bounded");
        let mut buf = BytesMut::with_capacity(cap);
        while (buf.len() as u64) < plan.read_max {
            let Some(frame) = body.frame().await else { break };
            let frame = frame.map_err(|e| transport(url, "body", e))?;
            let Ok(mut data) = frame.into_data() else { continue };
            if skip > 0 {
                let n = skip.min(data.len() as u64);
                skip -= n;
                data = data.slice(n as usize..);
            }
            let room = plan.read_max - buf.len() as u64;
            let take = (data.len() as u64).min(room) as usize;
            buf.extend_from_slice(&data[..take]);
        }
        // Whatever is left of the body is aborted by dropping it.
        let judged = finish_range_body(&plan, skip == 0, buf.len() as u64)?;
        Ok(FetchedBlock { data: buf.freeze(), body: judged, coalesced: false })
    }

    async fn bounded<T>(
        &self,
        url: &str,
        fut: impl std::future::Future<Output = Result<T, OriginError>>,
    ) -> Result<T, OriginError> {
        let bound = self.config.request_timeout;
        match tokio::time::timeout(bound, fut).await {
            Ok(r) => r,
            Err(_) => Err(transport(url, "request", format!("timed out after {bound:?}"))),
        }
    }

    /// Probes the size of the object at `url` (a `bytes=0-0` GET, never HEAD), coalesced with
    /// concurrent probes of the same object identity. If this caller leads the flight, `fill` runs
    /// on a successful outcome before the flight ends.
    pub async fn probe(
        &self,
        identity: &str,
        url: &str,
        fill: Option<ProbeFill>,
    ) -> Result<ProbeOutcome, OriginError> {
        let key = FlightKey::Probe(identity.to_owned());
        let out = self.coalesced(key, url, fill.map(FlightFill::Probe)).await?;
        match out {
            (FlightOutput::Probe(p), _) => Ok(p),
            (FlightOutput::Block(_), _) => unreachable!("probe key yields probe output"),
        }
    }

    /// Fetches the inclusive window `start..=end` of `url`, coalesced with concurrent fetches of
    /// the same window of the same object identity. If this caller leads the flight, `fill` runs
    /// on the result before the flight ends.
    pub async fn fetch(
        &self,
        identity: &str,
        url: &str,
        start: u64,
        end: u64,
        fill: Option<Fill>,
    ) -> Result<FetchedBlock, OriginError> {
        let key = FlightKey::Block(identity.to_owned(), start, end);
        match self.coalesced(key, url, fill.map(FlightFill::Block)).await? {
            (FlightOutput::Block(mut b), coalesced) => {
                b.coalesced = coalesced;
                Ok(b)
            }
            (FlightOutput::Probe(_), _) => unreachable!("block key yields block output"),
        }
    }

    async fn run(&self, key: &FlightKey, url: &str) -> Shared {
        match key {
            FlightKey::Probe(_) => {
                self.bounded(url, self.probe_once(url)).await.map(FlightOutput::Probe)
            }
            FlightKey::Block(_, s, e) => {
                self.bounded(url, self.fetch_once(url, *s, *e)).await.map(FlightOutput::Block)
            }
        }
    }

    async fn coalesced(
        &self,
        key: FlightKey,
        url: &str,
        fill: Option<FlightFill>,
    ) -> Result<(FlightOutput, bool), OriginError> {
        let (role, rx) = {
            let mut f = self.flights.lock().expect("flights lock");
            let role = f.table.begin(&key, self.clock.now());
            let rx = match role {
                Role::Lead(id) => {
                    let (tx, rx) = watch::channel(None);
                    f.senders.insert(id, tx);
                    Some(rx)
                }
                Role::Join(id) => f.senders.get(&id).map(watch::Sender::subscribe),
                Role::Alone => None,
            };
            (role, rx)
        };
        match (role, rx) {
            (Role::Lead(id), Some(rx)) => {
                self.spawn_flight(key, id, url.to_owned(), fill);
                wait(rx).await.map(|o| (o, false))
            }
            (Role::Join(_), Some(rx)) => {
                self.counters.lock().expect("counters lock").coalesced += 1;
                match wait(rx).await {
                    Ok(o) => Ok((o, true)),
                    Err(e) => match joiner_action(Some(&e), true) {
                        JoinerAction::RetryAlone => self.run(&key, url).await.map(|o| (o, false)),
                        JoinerAction::Use => Err(e),
                    },
                }
            }
            (Role::Lead(_) | Role::Join(_), None) | (Role::Alone, _) => {
                self.run(&key, url).await.map(|o| (o, false))
            }
        }
    }

    fn spawn_flight(&self, key: FlightKey, id: FlightId, url: String, fill: Option<FlightFill>) {
        let this = self.clone();
        let bound = self.config.max_flight;
        tokio::spawn(async move {
            let result = match tokio::time::timeout(bound, this.run(&key, &url)).await {
                Ok(r) => r,
                Err(_) => Err(transport(&url, "flight", format!("exceeded {bound:?}"))),
            };
            match (&result, fill) {
                (Ok(FlightOutput::Block(b)), Some(FlightFill::Block(fill))) => fill(b),
                (Ok(FlightOutput::Probe(p)), Some(FlightFill::Probe(fill))) => fill(p),
                _ => {}
            }
            // Remove the flight before publishing: a caller arriving after this point starts a
            // fresh fetch instead of joining a finished one (no error replay).
            let tx = {
                let mut f = this.flights.lock().expect("flights lock");
                f.table.finish(&key, id);
                f.senders.remove(&id)
            };
            if let Some(tx) = tx {
                let _ = tx.send(Some(result));
            }
        });
    }

    /// Opens a passthrough request for a Range-blind origin: `GET url` with the client's `Range`
    /// and conditional headers forwarded, the response returned live. Not coalesced.
    pub async fn open(
        &self,
        url: &str,
        client: &HeaderMap,
    ) -> Result<Response<Incoming>, OriginError> {
        let mut headers = HeaderMap::new();
        for name in [RANGE, http::header::IF_RANGE, http::header::ACCEPT] {
            if let Some(v) = client.get(&name) {
                headers.insert(name, v.clone());
            }
        }
        self.send(url, &headers).await
    }
}

async fn wait(mut rx: watch::Receiver<Option<Shared>>) -> Shared {
    loop {
        if let Some(r) = rx.borrow_and_update().as_ref() {
            return r.clone();
        }
        if rx.changed().await.is_err() {
            // The flight task ended without publishing (it panicked or was aborted).
            let last = rx.borrow().clone();
            return last.unwrap_or_else(|| {
                Err(OriginError::Transport("origin flight ended without a result".into()))
            });
        }
    }
}

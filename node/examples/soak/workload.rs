//! The soak's clients: random ranges, whole reads and herds through every node, every byte of
//! every answer checked against the generator, every outcome classified.

use super::cluster::Node;
use super::origin::{fill, Object};
use bytes::Bytes;
use dart_net_tokio::seam::{SeamConnector, TokioDialer};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The bound on one request, first byte to last; a request to a live node that takes longer is
/// counted unanswered.
pub const REQUEST_BOUND: Duration = Duration::from_secs(120);
/// How long a client waits after a connection error before its next request (a node that is down
/// refuses at once; without a pause its clients would spin).
const ERROR_PAUSE: Duration = Duration::from_millis(100);
/// Error messages kept for the report, per kind.
const SAMPLES_MAX: usize = 8;

/// The workload's generator: core's seeded ChaCha RNG, so a run replays from its seed.
pub struct Rng(dart_core::rng::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(dart_core::rng::from_seed(seed))
    }

    pub fn next(&mut self) -> u64 {
        rand::RngCore::next_u64(&mut self.0)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// What a request asks for.
#[derive(Clone, Copy, Debug)]
pub enum Ask {
    /// `bytes=start-end` (inclusive), answered 206.
    Range { start: u64, end: u64 },
    /// `bytes=start-`, answered 206 to the end.
    From { start: u64 },
    /// `bytes=-len`, the last `len` bytes, answered 206.
    Suffix { len: u64 },
    /// No range: the whole object, answered 200.
    Whole,
}

impl Ask {
    fn header(&self) -> Option<String> {
        match *self {
            Ask::Range { start, end } => Some(format!("bytes={start}-{end}")),
            Ask::From { start } => Some(format!("bytes={start}-")),
            Ask::Suffix { len } => Some(format!("bytes=-{len}")),
            Ask::Whole => None,
        }
    }

    /// The window `(start, len)` of an object of `size` bytes that the answer must carry.
    fn window(&self, size: u64) -> (u64, u64) {
        match *self {
            Ask::Range { start, end } => (start, end.min(size - 1) - start + 1),
            Ask::From { start } => (start, size - start),
            Ask::Suffix { len } => (size - len.min(size), len.min(size)),
            Ask::Whole => (0, size),
        }
    }

    /// A random ask on an object of `size` bytes: mostly ranges of 1 byte to 8 MiB (log-uniform),
    /// some open-ended and suffix ranges, a fifth whole reads.
    pub fn draw(rng: &mut Rng, size: u64) -> Ask {
        let len = 1u64 << rng.below(23);
        let len = rng.between(len, 2 * len).min(size);
        match rng.below(10) {
            0..=5 => {
                let start = rng.below(size - len + 1);
                Ask::Range { start, end: start + len - 1 }
            }
            6 => Ask::From { start: size - rng.between(1, len) },
            7 => Ask::Suffix { len },
            _ => Ask::Whole,
        }
    }
}

/// The kinds of request, for the counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Range,
    Whole,
    Herd,
}

/// Everything counted over the run.
#[derive(Default)]
pub struct Stats {
    pub requests: AtomicU64,
    /// Complete, correct answers.
    pub ok: AtomicU64,
    pub ok_bytes: AtomicU64,
    /// Bytes that differed from the generator (must stay 0).
    pub wrong_bytes: AtomicU64,
    /// Answers with the wrong status (a 4xx to a valid request), length or `Content-Range`
    /// (must stay 0).
    pub wrong_answers: AtomicU64,
    /// Transport failures of requests that overlapped a down window of their node.
    pub node_down: AtomicU64,
    /// Complete 5xx answers (a clean error status) from a live node.
    pub error_status: AtomicU64,
    /// Requests to a node that stayed up that got no complete answer: a connection error, a cut
    /// body, a timeout (must stay 0).
    pub unanswered: AtomicU64,
    pub herds: AtomicU64,
    pub detail: Mutex<Detail>,
}

/// Counts by kind and status, latencies, and samples of what went wrong.
#[derive(Default)]
pub struct Detail {
    pub by_kind: BTreeMap<Kind, u64>,
    pub statuses: BTreeMap<u16, u64>,
    pub latencies_ms: Vec<u32>,
    pub samples: BTreeMap<&'static str, Vec<String>>,
}

impl Stats {
    fn sample(&self, kind: &'static str, text: String) {
        let mut d = self.detail.lock().expect("detail");
        let v = d.samples.entry(kind).or_default();
        if v.len() < SAMPLES_MAX {
            v.push(text);
        }
    }
}

pub type HttpClient = Client<SeamConnector<TokioDialer>, Empty<Bytes>>;

/// A client that opens a connection per request: a connection pooled before a node restarted
/// would fail its next request for a reason that is not the node's.
pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(2)))
}

/// How one request ended.
enum Outcome {
    Ok {
        bytes: u64,
    },
    /// Complete answer, wrong in these ways.
    Wrong {
        wrong_bytes: u64,
        why: String,
    },
    /// A complete 5xx answer.
    ErrorStatus(u16),
    /// A 4xx answer to a valid request, with its body's text.
    BadStatus(u16, String),
    /// No complete answer.
    Failed(String),
}

/// Reads `ask` of `object` through `node` and checks the answer against the generator.
async fn read(c: &HttpClient, node: &Node, object: &Object, ask: Ask) -> Outcome {
    let url = format!("http://{}/dart/http://{}{}", node.client, origin_authority(), object.path);
    let mut req = http::Request::get(url);
    if let Some(h) = ask.header() {
        req = req.header(http::header::RANGE, h);
    }
    let req = req.body(Empty::new()).expect("request");
    let resp = match c.request(req).await {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(format!("request: {e:?}")),
    };
    let status = resp.status().as_u16();
    if status >= 400 {
        let body = resp.into_body().collect().await;
        return match body {
            Ok(_) if status >= 500 => Outcome::ErrorStatus(status),
            Ok(b) => {
                let text = String::from_utf8_lossy(&b.to_bytes()).chars().take(200).collect();
                Outcome::BadStatus(status, text)
            }
            Err(e) => Outcome::Failed(format!("{status} body: {e}")),
        };
    }
    let (start, len) = ask.window(object.size);
    if let Some(why) = check_head(&resp, ask, start, len, object.size) {
        return Outcome::Wrong { wrong_bytes: 0, why };
    }
    let mut body = resp.into_body();
    let (mut at, mut wrong, mut want) = (start, 0u64, Vec::new());
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => return Outcome::Failed(format!("body cut at {} of {len}: {e}", at - start)),
        };
        let Ok(data) = frame.into_data() else { continue };
        if at + data.len() as u64 > start + len {
            return Outcome::Wrong { wrong_bytes: 0, why: format!("body longer than {len}") };
        }
        want.resize(data.len(), 0);
        fill(object.seed, at, &mut want);
        wrong += data.iter().zip(&want).filter(|(a, b)| a != b).count() as u64;
        at += data.len() as u64;
    }
    if at != start + len {
        return Outcome::Failed(format!("body ended at {} of {len}", at - start));
    }
    if wrong > 0 {
        let why = format!("{wrong} wrong bytes in {start}+{len}");
        return Outcome::Wrong { wrong_bytes: wrong, why };
    }
    Outcome::Ok { bytes: len }
}

/// The origin's `host:port`, set once at start.
pub static ORIGIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn origin_authority() -> &'static str {
    ORIGIN.get().expect("origin set")
}

/// The status and framing the answer to `ask` must have; `None` when it has them.
fn check_head(
    resp: &http::Response<hyper::body::Incoming>,
    ask: Ask,
    start: u64,
    len: u64,
    size: u64,
) -> Option<String> {
    let header = |name| resp.headers().get(name).and_then(|v| v.to_str().ok());
    let length = header(http::header::CONTENT_LENGTH).and_then(|v| v.parse::<u64>().ok());
    let (status, range) = (resp.status().as_u16(), header(http::header::CONTENT_RANGE));
    let want_range = format!("bytes {start}-{}/{size}", start + len - 1);
    let ok = match ask {
        Ask::Whole => status == 200 && range.is_none(),
        _ => status == 206 && range == Some(want_range.as_str()),
    };
    (!ok || length.is_some_and(|l| l != len)).then(|| {
        format!("{ask:?}: status {status}, content-range {range:?}, content-length {length:?}")
    })
}

/// One request through `node`, counted. Returns whether it failed on the transport.
pub async fn request(
    c: &HttpClient,
    stats: &Stats,
    node: &Node,
    object: &Object,
    ask: Ask,
    kind: Kind,
) -> bool {
    let generation = node.generation.load(Ordering::SeqCst);
    let was_down = node.down.load(Ordering::SeqCst);
    let t0 = Instant::now();
    let outcome =
        tokio::time::timeout(REQUEST_BOUND, read(c, node, object, ask)).await.unwrap_or_else(
            |_| Outcome::Failed(format!("no complete answer within {REQUEST_BOUND:?}")),
        );
    let overlapped_down = was_down
        || node.down.load(Ordering::SeqCst)
        || node.generation.load(Ordering::SeqCst) != generation;
    stats.requests.fetch_add(1, Ordering::Relaxed);
    let what = format!("{} {} {ask:?} ({kind:?})", node.id, object.path);
    let mut d = stats.detail.lock().expect("detail");
    *d.by_kind.entry(kind).or_default() += 1;
    match &outcome {
        Outcome::Ok { .. } => d.latencies_ms.push(t0.elapsed().as_millis() as u32),
        Outcome::ErrorStatus(s) | Outcome::BadStatus(s, _) => {
            *d.statuses.entry(*s).or_default() += 1;
        }
        Outcome::Wrong { .. } | Outcome::Failed(_) => {}
    }
    drop(d);
    match outcome {
        Outcome::Ok { bytes } => {
            stats.ok.fetch_add(1, Ordering::Relaxed);
            stats.ok_bytes.fetch_add(bytes, Ordering::Relaxed);
            false
        }
        Outcome::Wrong { wrong_bytes, why } => {
            stats.wrong_bytes.fetch_add(wrong_bytes, Ordering::Relaxed);
            stats.wrong_answers.fetch_add(u64::from(wrong_bytes == 0), Ordering::Relaxed);
            stats.sample("wrong", format!("{what}: {why}"));
            false
        }
        Outcome::ErrorStatus(s) => {
            stats.error_status.fetch_add(1, Ordering::Relaxed);
            stats.sample("error status", format!("{what}: {s}"));
            false
        }
        Outcome::BadStatus(s, text) => {
            stats.wrong_answers.fetch_add(1, Ordering::Relaxed);
            stats.sample("wrong", format!("{what}: status {s}: {text}"));
            false
        }
        Outcome::Failed(why) if overlapped_down => {
            stats.node_down.fetch_add(1, Ordering::Relaxed);
            stats.sample("node down", format!("{what}: {why}"));
            true
        }
        Outcome::Failed(why) => {
            stats.unanswered.fetch_add(1, Ordering::Relaxed);
            stats.sample("unanswered", format!("{what}: {why}"));
            true
        }
    }
}

/// A client: random asks of random objects through random nodes until `stop`.
pub async fn client(
    seed: u64,
    nodes: Arc<Vec<Node>>,
    objects: Arc<Vec<Object>>,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
) {
    let mut rng = Rng::new(seed);
    let c = http_client();
    while !stop.load(Ordering::SeqCst) {
        let node = &nodes[rng.below(nodes.len() as u64) as usize];
        let object = &objects[rng.below(objects.len() as u64) as usize];
        let ask = Ask::draw(&mut rng, object.size);
        let kind = if matches!(ask, Ask::Whole) { Kind::Whole } else { Kind::Range };
        if request(&c, &stats, node, object, ask, kind).await {
            tokio::time::sleep(ERROR_PAUSE).await;
        }
    }
}

/// A herd: `readers` clients read one whole object at once, spread over the nodes.
pub async fn herd(nodes: Arc<Vec<Node>>, object: Object, readers: usize, stats: Arc<Stats>) {
    stats.herds.fetch_add(1, Ordering::Relaxed);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..readers {
        let (nodes, object, stats) = (nodes.clone(), object.clone(), stats.clone());
        tasks.spawn(async move {
            let node = &nodes[i % nodes.len()];
            request(&http_client(), &stats, node, &object, Ask::Whole, Kind::Herd).await;
        });
    }
    while tasks.join_next().await.is_some() {}
}

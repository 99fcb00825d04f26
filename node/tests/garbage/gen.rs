//! What the fuzzer sends: valid requests of each listener mutated past the request line, random
//! byte streams, and how each connection ends. Pure functions of a seed and a connection index.

use super::rng::Rng;
use dart_core::codec::wire::block_path;
use dart_core::engine::{Engine, EngineConfig};
use dart_core::geometry::Geometry;
use dart_core::peer_auth::{ClusterSecret, Covered};
use std::net::SocketAddr;

/// The listener a connection goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Plane {
    Client,
    Peer,
    Admin,
}

/// What one item of a connection is.
#[derive(Clone, Debug)]
pub enum Kind {
    /// A valid ranged read (not counted as malformed): its answer must be these exact bytes.
    Control { start: u64, len: u64 },
    /// A valid request of the listener after these mutations.
    Mutated(Vec<&'static str>),
    /// A random byte stream of this flavour.
    Random(&'static str),
}

/// One request (or what stands in for one) on a connection.
pub struct Item {
    pub bytes: Vec<u8>,
    pub kind: Kind,
}

impl Item {
    /// Whether its request line is a `HEAD` (after the empty lines a server skips): its answer
    /// then has no body.
    pub fn is_head(&self) -> bool {
        let start = self.bytes.iter().position(|b| !matches!(b, b'\r' | b'\n'));
        start.is_some_and(|s| self.bytes[s..].starts_with(b"HEAD "))
    }
}

/// How a connection ends once its bytes are written (the last item of a dropped or stalled
/// connection is a truncated head).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Half-close (FIN) and read every answer until the node closes.
    HalfClose,
    /// Drop the connection mid-head without reading.
    Drop,
    /// Keep the connection open mid-head until the node's head timeout closes it.
    Stall,
}

/// Everything one connection sends.
pub struct Plan {
    pub plane: Plane,
    pub items: Vec<Item>,
    pub ending: Ending,
}

impl Plan {
    pub fn bytes(&self) -> Vec<u8> {
        self.items.iter().flat_map(|i| i.bytes.iter().copied()).collect()
    }

    /// Items that count as malformed requests (everything but controls).
    pub fn malformed(&self) -> u64 {
        self.items.iter().filter(|i| !matches!(i.kind, Kind::Control { .. })).count() as u64
    }
}

/// What generation needs to know about the node under test and its origin.
pub struct Ctx {
    pub origin: SocketAddr,
    pub client: SocketAddr,
    pub peer: SocketAddr,
    pub admin: SocketAddr,
    pub self_id: String,
    pub secret: ClusterSecret,
    pub other_secret: ClusterSecret,
    pub size: u64,
    pub block: u64,
    pub chunk: u64,
    /// Object paths on the origin (it serves the same generated object at every path).
    pub paths: Vec<String>,
}

impl Ctx {
    pub fn object_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.origin)
    }

    /// The URL of one of the objects, drawn from `rng`.
    pub fn random_url(&self, rng: &mut Rng) -> String {
        let path = rng.pick(&self.paths);
        self.object_url(&path)
    }

    /// The peer path of block `index` of `url`, keyed as the node keys it.
    pub fn block_target(&self, url: &str, index: u64) -> String {
        let geometry = Geometry::new(self.chunk, self.block).expect("geometry");
        let engine = Engine::new(EngineConfig { geometry, ..EngineConfig::default() });
        block_path(engine.block_key(&engine.identify(url), index))
    }

    fn blocks(&self) -> u64 {
        self.size.div_ceil(self.block)
    }
}

/// A request before serialisation; header lines are kept whole so that malformed ones fit.
#[derive(Clone)]
pub struct Req {
    pub method: Vec<u8>,
    pub target: Vec<u8>,
    pub version: Vec<u8>,
    pub headers: Vec<Vec<u8>>,
    pub body: Vec<u8>,
}

impl Req {
    fn new(method: &str, target: String) -> Req {
        Req {
            method: method.into(),
            target: target.into_bytes(),
            version: b"HTTP/1.1".to_vec(),
            headers: vec![b"Host: 127.0.0.1".to_vec(), b"User-Agent: dart-garbage".to_vec()],
            body: Vec::new(),
        }
    }

    pub fn set(&mut self, name: &str, value: &[u8]) {
        self.remove(name);
        self.add(name, value);
    }

    pub fn add(&mut self, name: &str, value: &[u8]) {
        let mut line = format!("{name}: ").into_bytes();
        line.extend_from_slice(value);
        self.headers.push(line);
    }

    pub fn remove(&mut self, name: &str) {
        self.headers.retain(|l| header_value(l, name).is_none());
    }

    /// The first value of header `name`, as hyper would hand it to the node.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find_map(|l| header_value(l, name))
    }

    pub fn serialise(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.target.len() + 256);
        for part in [&self.method[..], b" ", &self.target, b" ", &self.version, b"\r\n"] {
            out.extend_from_slice(part);
        }
        for line in &self.headers {
            out.extend_from_slice(line);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        out
    }

    /// Adds a valid `X-DART-Auth` over the request's covered fields as they now are.
    pub fn sign(&mut self, secret: &ClusterSecret, unix: u64) {
        let (Ok(method), Ok(target)) =
            (std::str::from_utf8(&self.method), std::str::from_utf8(&self.target))
        else {
            return;
        };
        let auth = Covered {
            method,
            target,
            hop: self.get("x-dart-hop").unwrap_or_default(),
            origin: self.get("x-dart-origin").unwrap_or_default(),
            node: self.get("x-dart-node").unwrap_or_default(),
            peer_addr: self.get("x-dart-peer-addr").unwrap_or_default(),
            body: &[],
        }
        .sign(secret, unix);
        self.set("X-DART-Auth", auth.as_bytes());
    }
}

fn header_value<'a>(line: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let colon = line.iter().position(|b| *b == b':')?;
    line[..colon].eq_ignore_ascii_case(name.as_bytes()).then(|| trim(&line[colon + 1..]))
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t')).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !matches!(b, b' ' | b'\t')).map_or(start, |e| e + 1);
    &v[start..end.max(start)]
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("1970").as_secs()
}

/// A valid request of `plane` (peer requests unsigned: signing comes after the mutations).
pub fn template(plane: Plane, rng: &mut Rng, ctx: &Ctx) -> Req {
    match plane {
        Plane::Client => {
            let url = ctx.random_url(rng);
            let method = if rng.percent(15) { "HEAD" } else { "GET" };
            let mut req = Req::new(method, format!("/dart/{url}"));
            if rng.percent(70) {
                let a = rng.below(ctx.size);
                let b = rng.between(a, (a + 3 * ctx.block).min(ctx.size - 1));
                req.add("Range", format!("bytes={a}-{b}").as_bytes());
            }
            req
        }
        Plane::Peer if rng.percent(85) => {
            let url = ctx.random_url(rng);
            let mut req = Req::new("GET", ctx.block_target(&url, rng.below(ctx.blocks())));
            req.add("X-DART-Hop", b"0");
            req.add("X-DART-Origin", url.as_bytes());
            req
        }
        Plane::Peer => {
            let mut req = Req::new("GET", "/peer/v1/roster".into());
            req.add("X-DART-Node", format!("member-{}", rng.below(4)).as_bytes());
            req.add("X-DART-Peer-Addr", b"127.0.0.1:9");
            req
        }
        Plane::Admin => {
            let paths = ["/healthz", "/metrics", "/admin/stats", "/admin/members"];
            let target = if rng.percent(25) {
                format!("/admin/ring?key={}&n={}", rng.next(), rng.between(1, 4))
            } else {
                rng.pick(&paths).to_string()
            };
            Req::new("GET", target)
        }
    }
}

/// A control read: a valid ranged GET through the prefix API.
pub fn control(rng: &mut Rng, ctx: &Ctx) -> Item {
    let start = rng.below(ctx.size);
    let end = rng.between(start, (start + 2 * ctx.block).min(ctx.size - 1));
    let url = ctx.random_url(rng);
    let mut req = Req::new("GET", format!("/dart/{url}"));
    req.add("Range", format!("bytes={start}-{end}").as_bytes());
    Item { bytes: req.serialise(), kind: Kind::Control { start, len: end - start + 1 } }
}

/// Whether every URL authority in `bytes` names an address literal, `localhost`, a form the
/// upstream policy refuses outright, or nothing: a name could make the node resolve it, and this
/// test must never send a packet off the machine (DNS included), even if the node is wrong.
pub fn hosts_are_local(bytes: &[u8]) -> bool {
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(3).position(|w| w == b"://") {
        let rest = &bytes[at + found + 3..];
        let end = rest
            .iter()
            .position(|b| matches!(b, b'/' | b'?' | b'#' | b' ' | b'\r' | b'\n'))
            .unwrap_or(rest.len());
        let Ok(authority) = std::str::from_utf8(&rest[..end]) else { return false };
        if !local_authority(authority) {
            return false;
        }
        at += found + 3;
    }
    true
}

fn local_authority(authority: &str) -> bool {
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, _)) => h,
            None => v6,
        }
    } else {
        host_port.rsplit_once(':').map_or(host_port, |(h, _)| h)
    };
    let numeric = !host.is_empty()
        && host.as_bytes()[0].is_ascii_digit()
        && host.split('.').all(|l| {
            let l = l.strip_prefix("0x").or_else(|| l.strip_prefix("0X")).unwrap_or(l);
            !l.is_empty() && l.bytes().all(|b| b.is_ascii_hexdigit())
        });
    host.is_empty()
        || host.parse::<std::net::IpAddr>().is_ok()
        || host.eq_ignore_ascii_case("localhost")
        || numeric
}

/// The shape of connection `index`: drawn first and from its own stream, so that the number of
/// malformed requests of a run is known before anything is sent.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub plane: Plane,
    /// One random byte stream and nothing else.
    pub random_only: bool,
    /// A control read first.
    pub control: bool,
    /// Mutated requests after it.
    pub mutated: u64,
    /// A random byte stream after them.
    pub trailing_random: bool,
    /// A truncated head last.
    pub truncated: bool,
    pub ending: Ending,
}

impl Shape {
    pub fn of(seed: u64, index: u64) -> Shape {
        let mut rng = Rng::new(seed, index, 0);
        let plane = [Plane::Client, Plane::Peer, Plane::Admin][rng.weighted(&[45, 40, 15])];
        let ending = match rng.below(1000) {
            0..=1 => Ending::Stall,
            2..=81 => Ending::Drop,
            _ => Ending::HalfClose,
        };
        let random_only = ending == Ending::HalfClose && rng.percent(20);
        Shape {
            plane,
            random_only,
            control: !random_only && plane == Plane::Client && rng.percent(30),
            mutated: if random_only { 0 } else { rng.between(1, 6) },
            trailing_random: !random_only && ending == Ending::HalfClose && rng.percent(40),
            truncated: !random_only && (ending != Ending::HalfClose || rng.percent(40)),
            ending,
        }
    }

    /// How many malformed requests the connection sends.
    pub fn malformed(&self) -> u64 {
        u64::from(self.random_only)
            + self.mutated
            + u64::from(self.trailing_random)
            + u64::from(self.truncated)
    }
}

/// Connection `index`'s plan under `seed`. A draw whose URLs name anything but address literals
/// is drawn again from the next stream (see [`hosts_are_local`]).
pub fn plan(seed: u64, index: u64, ctx: &Ctx) -> Plan {
    let shape = Shape::of(seed, index);
    for stream in 1..64 {
        let plan = draw(shape, &mut Rng::new(seed, index, stream), ctx);
        if hosts_are_local(&plan.bytes()) {
            return plan;
        }
    }
    panic!("connection {index}: no local-only draw in 63 streams (seed {seed:#x})")
}

fn draw(shape: Shape, rng: &mut Rng, ctx: &Ctx) -> Plan {
    let mut items = Vec::new();
    if shape.random_only {
        items.push(random_stream(rng));
    }
    if shape.control {
        items.push(control(rng, ctx));
    }
    for _ in 0..shape.mutated {
        items.push(mutated(shape.plane, rng, ctx));
    }
    if shape.trailing_random {
        items.push(random_stream(rng));
    }
    if shape.truncated {
        let bytes = template(shape.plane, rng, ctx).serialise();
        let keep = rng.between(1, bytes.len() as u64 - 3) as usize;
        items.push(Item {
            bytes: bytes[..keep].to_vec(),
            kind: Kind::Mutated(vec!["truncated-head"]),
        });
    }
    Plan { plane: shape.plane, items, ending: shape.ending }
}

/// A valid request of `plane` after one to three structural mutations, then perhaps a byte edit;
/// a peer request is signed after its structural mutations unless its MAC was one of them.
fn mutated(plane: Plane, rng: &mut Rng, ctx: &Ctx) -> Item {
    let mut req = template(plane, rng, ctx);
    let table = super::mutate::structural(plane);
    let weights: Vec<u64> = table.iter().map(|(w, _)| *w).collect();
    let mut names = Vec::new();
    let structural = if rng.percent(80) { rng.between(1, 3) } else { 0 };
    for _ in 0..structural {
        let (name, mutation) = table[rng.weighted(&weights)].1;
        mutation(&mut req, rng, ctx);
        names.push(name);
    }
    if plane == Plane::Peer && !names.contains(&"x-dart-auth") && rng.percent(75) {
        super::mutate::sign(&mut req, ctx);
    }
    let mut bytes = req.serialise();
    if names.is_empty() || rng.percent(25) {
        names.push(super::mutate::bytes(&mut bytes, rng));
    }
    Item { bytes, kind: Kind::Mutated(names) }
}

const TOKENS: &[&[u8]] = &[
    b"GET",
    b"HEAD",
    b"POST",
    b" ",
    b"/",
    b"/dart/",
    b"/peer/v1/block/",
    b"/peer/v1/roster",
    b"/admin/ring?key=",
    b"/healthz",
    b"HTTP/1.1",
    b"HTTP/1.0",
    b"\r\n",
    b"\n",
    b":",
    b"Host",
    b"Range",
    b"bytes=",
    b"-",
    b",",
    b"X-DART-Hop",
    b"X-DART-Origin",
    b"X-DART-Auth",
    b"v1",
    b"Transfer-Encoding",
    b"chunked",
    b"Content-Length",
    b"0",
    b"1",
    b"99999999999999999999",
    b"%",
    b"%zz",
    b"\x00",
    b"\xff",
    b"\t",
    b"?",
    b"&",
    b"=",
    b"http://",
    b"127.0.0.1",
    b"\r\n\r\n",
];

/// A random byte stream: uniform bytes, printable text, or a soup of HTTP words.
fn random_stream(rng: &mut Rng) -> Item {
    let len = if rng.percent(5) { rng.between(4096, 65_536) } else { rng.between(1, 2048) };
    let len = len as usize;
    let (flavour, bytes) = match rng.below(3) {
        0 => ("binary", rng.bytes(len)),
        1 => {
            let text = (0..len).map(|_| match rng.below(40) {
                0 => b'\r',
                1 => b'\n',
                _ => rng.between(0x20, 0x7e) as u8,
            });
            ("text", text.collect())
        }
        _ => {
            let mut soup = Vec::with_capacity(len);
            while soup.len() < len {
                soup.extend_from_slice(rng.pick(TOKENS));
            }
            ("http-words", soup)
        }
    };
    Item { bytes, kind: Kind::Random(flavour) }
}

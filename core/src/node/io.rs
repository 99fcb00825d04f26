//! The vocabulary between a [`super::Node`] and its driver: what comes in (requests, exchange
//! progress, store answers, cancellations) and what goes out (exchanges to start or abandon,
//! store operations, response parts, events).

use crate::breaker::{BreakerEvent, Observation};
use crate::codec::roster::Roster;
use crate::engine::BlockClass;
use crate::hash::BlockKey;
use bytes::Bytes;
use std::fmt;
use std::ops::Range;
use std::time::Duration;

/// Most header fields a node looks at in one request or response; the rest are ignored.
pub const HEADERS_MAX: usize = 128;

/// An inbound request's id, chosen by the driver and unique among the node's live requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// An outbound exchange's id, chosen by the node; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IoId(pub u64);

/// A store operation's id, chosen by the node; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreOp(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "q{}", self.0)
    }
}

impl fmt::Display for IoId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "x{}", self.0)
    }
}

/// Header fields as the wire carried them: names lower case, values raw bytes, in order.
///
/// Held in one buffer (each field's name, then its value) with the fields' ends beside it: two
/// allocations per set of fields, not two per field (header fields were a good part of the
/// allocations per exchange, in the node and in the simulator).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers {
    bytes: Vec<u8>,
    /// Per field, where its name ends and where its value ends in `bytes` (its name starts where
    /// the field before it ends).
    ends: Vec<(u32, u32)>,
}

impl Headers {
    /// No fields.
    pub fn new() -> Self {
        Headers::default()
    }

    /// Appends a field (the name is lower-cased); fields past [`HEADERS_MAX`] are dropped, and
    /// so is a field that would take the fields past 4 GiB.
    pub fn push(&mut self, name: &str, value: impl AsRef<[u8]>) {
        let value = value.as_ref();
        let fits = u32::try_from(self.bytes.len() + name.len() + value.len()).is_ok();
        if self.ends.len() >= HEADERS_MAX || !fits {
            return;
        }
        if self.ends.is_empty() {
            // Room for a typical head at once, instead of growing field by field.
            self.bytes.reserve(FIELD_BYTES_RESERVE.max(name.len() + value.len()));
            self.ends.reserve(FIELDS_RESERVE);
        }
        self.bytes.extend(name.bytes().map(|b| b.to_ascii_lowercase()));
        let name_end = self.bytes.len() as u32;
        self.bytes.extend_from_slice(value);
        self.ends.push((name_end, self.bytes.len() as u32));
    }

    /// Builder form of [`Headers::push`].
    pub fn with(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.push(name, value);
        self
    }

    /// The first value of `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields().find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes())).map(|(_, v)| v)
    }

    /// The first value of `name` as text, if it is UTF-8.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The first value of `name` as a decimal `u64`.
    pub fn get_u64(&self, name: &str) -> Option<u64> {
        self.get_str(name)?.trim().parse().ok()
    }

    /// Every field as bytes, in order.
    fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        spans(self.ends.iter().copied()).map(|(n, v)| (&self.bytes[n], &self.bytes[v]))
    }

    /// Every field, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.fields().map(|(n, v)| {
            // A name is a `&str` lower-cased byte by byte in ASCII: still UTF-8.
            (std::str::from_utf8(n).expect("a header name is UTF-8"), v)
        })
    }

    /// The fields' bytes as one shared buffer, and each field's name and value as ranges of it,
    /// in order: a shell hands the values on as slices of the one buffer (no copy, no allocation
    /// per field).
    pub fn into_shared(self) -> (Bytes, impl Iterator<Item = (Range<usize>, Range<usize>)>) {
        (Bytes::from(self.bytes), spans(self.ends.into_iter()))
    }

    /// How many fields.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when there is no field.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

/// Each field's name and value as ranges of a [`Headers`] buffer, from the fields' ends: a plain
/// walk (each field starts where the one before it ended), since a look-up runs several times per
/// exchange.
fn spans(
    ends: impl Iterator<Item = (u32, u32)>,
) -> impl Iterator<Item = (Range<usize>, Range<usize>)> {
    ends.scan(0, |start, (name_end, end)| {
        let (from, name_end, end) = (*start, name_end as usize, end as usize);
        *start = end;
        Some((from..name_end, name_end..end))
    })
}

/// Bytes of fields a set of fields makes room for at its first field.
const FIELD_BYTES_RESERVE: usize = 512;
/// Fields a set of fields makes room for at its first field.
const FIELDS_RESERVE: usize = 12;

/// Header fields whose values are credentials: their [`fmt::Debug`] form names their length only.
const SECRET_FIELDS: [&str; 4] = ["authorization", "proxy-authorization", "cookie", "set-cookie"];

/// As the list of `(name, value)` pairs it holds (what it printed when it was one), with the
/// value of a credential field ([`SECRET_FIELDS`]) replaced by its length: a debug print of an
/// exchange or an input never shows a requester's credential.
impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        /// A field's value as printed.
        enum Shown<'a> {
            Value(&'a [u8]),
            Secret(usize),
        }
        impl fmt::Debug for Shown<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    Shown::Value(v) => v.fmt(f),
                    Shown::Secret(n) => write!(f, "<redacted, {n} bytes>"),
                }
            }
        }
        let fields: Vec<(&str, Shown<'_>)> = self
            .iter()
            .map(|(name, value)| match SECRET_FIELDS.contains(&name) {
                true => (name, Shown::Secret(value.len())),
                false => (name, Shown::Value(value)),
            })
            .collect();
        f.debug_tuple("Headers").field(&fields).finish()
    }
}

/// Which listener a request arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Plane {
    /// The client listener: byte ranges of objects.
    Client,
    /// The peer listener: block transport and roster exchange.
    Peer,
}

/// An inbound request as the driver's server parsed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inbound {
    /// The method, as sent (`GET`, `HEAD`, ...).
    pub method: String,
    /// The raw request-target: path and query, uncleaned.
    pub target: String,
    /// The request's header fields.
    pub headers: Headers,
    /// The request body: empty for a `GET`; a peer-plane `POST` (the tracker) carries at most
    /// [`crate::tracker::BODY_MAX`] bytes, and the driver passes one byte more when the body was
    /// longer (the node refuses it; the driver never buffers more).
    pub body: Bytes,
}

impl Inbound {
    /// How much of the body of a `method` request on `plane` the driver reads and hands over:
    /// `None` for requests whose body is left unread (everything but a peer-plane `POST`, the
    /// tracker's JOIN and LEAVE); `Some(max)` means read at most `max + 1` bytes, so that the
    /// node sees a body past `max` and refuses it, while the driver never buffers more.
    pub fn body_max(plane: Plane, method: &str) -> Option<usize> {
        (plane == Plane::Peer && method == "POST").then_some(crate::tracker::BODY_MAX)
    }
}

/// A response head the driver writes as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// Status code.
    pub status: u16,
    /// Every header field to send, `content-length` included when the length is known.
    pub headers: Headers,
    /// Whether a body follows ([`Output::Body`] parts, or a [`Output::Pipe`]). A `HEAD` answer
    /// carries the length it describes and no body.
    pub body: bool,
}

impl Head {
    /// The announced `Content-Length`, if any.
    pub fn content_length(&self) -> Option<u64> {
        self.headers.get_u64("content-length")
    }
}

/// Which kind of endpoint an exchange talks to (origins may be `https://`; the peer plane is
/// plaintext by design).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Endpoint {
    /// An origin server.
    Origin,
    /// Another node's peer listener.
    Peer,
}

/// What an exchange is for (for logs, metrics and the simulator's bookkeeping; the driver treats
/// every exchange alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Purpose {
    /// An origin size probe (`Range: bytes=0-0`).
    Probe,
    /// An origin block window.
    Window,
    /// The bytes of one client read deep in a block window the node is fetching, asked for
    /// beside the window so that they need not wait for the bytes before them
    /// (`crate::node::lead_in`).
    LeadIn,
    /// A verbatim passthrough to a Range-blind origin.
    Passthrough,
    /// A block from a peer.
    PeerBlock,
    /// A peer's roster.
    Roster,
    /// A JOIN to an object's tracker.
    Tracker,
    /// A credential check: the requester's exact URL and `Authorization` on `Range: bytes=0-0`.
    Check,
}

/// An outbound request the driver must send: a `GET`, or a `POST` with a small body (a tracker
/// exchange).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoRequest {
    /// The exchange.
    pub id: IoId,
    /// Whom it goes to.
    pub endpoint: Endpoint,
    /// What it is for.
    pub purpose: Purpose,
    /// The one request it serves, if any (a flight serves several; a roster fetch none).
    pub request: Option<RequestId>,
    /// The absolute URL (`http://host:port/path?query`, or `https://` for an origin).
    pub url: String,
    /// `GET`, or `POST` when [`IoRequest::body`] is not empty.
    pub method: &'static str,
    /// Header fields to send besides `host` (and `content-length`, which the driver adds for a
    /// body).
    pub headers: Headers,
    /// The request body (empty for a `GET`).
    pub body: Bytes,
}

/// Why an exchange broke, as the driver's transport saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoError {
    /// No connection could be made (refused, unreachable, name not found, TLS handshake).
    Connect(String),
    /// The connection broke or the peer spoke broken HTTP, before or during the body.
    Broken(String),
    /// The request could not be formed (an unusable URL or header value).
    Invalid(String),
    /// The upstream policy refused every address the host resolved to; nothing was sent.
    Refused(crate::policy::Refusal),
}

impl IoError {
    /// How a peer exchange that ended this way is judged for the breaker: a connection never
    /// made is a dial failure (hard), a broken one an interrupted body (soft), a request that
    /// could not be formed an unexpected status.
    pub fn observation(&self) -> Observation {
        match self {
            IoError::Connect(_) => Observation::DialFailed,
            IoError::Broken(_) => Observation::BodyInterrupted,
            IoError::Invalid(_) => Observation::UnexpectedStatus(400),
            IoError::Refused(_) => Observation::UnexpectedStatus(403),
        }
    }
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IoError::Connect(e) => write!(f, "connect: {e}"),
            IoError::Broken(e) => write!(f, "broken: {e}"),
            IoError::Invalid(e) => write!(f, "invalid request: {e}"),
            IoError::Refused(r) => write!(f, "refused by the upstream policy: {}", r.explain()),
        }
    }
}

/// Progress of an exchange. Per exchange the driver reports, in this order: at most one
/// `Connected`, then one `Head`, any number of `Body`, then `End`; or `Failed` at any point. After
/// [`Output::Cancel`] it reports nothing more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoEvent {
    /// A connection exists (dialed, or taken from the pool): the dial bound no longer applies.
    Connected,
    /// The response head arrived.
    Head {
        /// Status code.
        status: u16,
        /// Header fields.
        headers: Headers,
    },
    /// Body bytes, in order.
    Body(Bytes),
    /// The body ended cleanly.
    End,
    /// The exchange broke.
    Failed(IoError),
}

/// An input to the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// A request arrived on `plane`; the driver registered `id` to receive its response parts.
    Request {
        /// Its id.
        id: RequestId,
        /// The listener.
        plane: Plane,
        /// The request.
        request: Inbound,
    },
    /// The requester went away (connection closed, response dropped).
    Cancel {
        /// The request.
        id: RequestId,
    },
    /// One [`Output::Body`] part of this request was taken by the transport (flow control).
    Drained {
        /// The request.
        id: RequestId,
    },
    /// The answer to [`Output::Seal`]: the digest of every body part of this response.
    Sealed {
        /// The request.
        id: RequestId,
        /// The digest value.
        digest: Vec<u8>,
    },
    /// Progress of an exchange.
    Io {
        /// The exchange.
        id: IoId,
        /// What happened.
        event: IoEvent,
    },
    /// The answer to [`Output::StoreGet`]: the block's bytes if held (a store error is a miss).
    Store {
        /// The operation.
        op: StoreOp,
        /// The bytes, if held.
        block: Option<Bytes>,
    },
    /// Fetch one block from the peer at `addr` directly, through the breaker (admission and
    /// outcome) but outside any read (diagnostics and transport tests); the answer is an
    /// [`Event::BlockFetched`] carrying `ticket`.
    FetchBlock {
        /// Chosen by the driver, echoed in the event.
        ticket: u64,
        /// The peer's address.
        addr: String,
        /// The block.
        key: BlockKey,
        /// `X-DART-Origin` (empty: cache-only).
        url: String,
        /// `X-DART-Hop`.
        hop: u64,
        /// The block's length; the body is read to at most one byte more.
        expected: u64,
    },
    /// The node is about to stop: it announces its departure to its broadcast targets
    /// (`POST /peer/v1/leave`), and reports [`Event::Left`] once every announcement ended (at
    /// once without targets). A second drain does nothing. The shell feeds it on SIGTERM and
    /// waits for the event at most [`crate::node::LEAVE_BOUND`] before it stops.
    Drain,
    /// The wall clock read `unix_ms` (Unix time in milliseconds) at the `now` of this call. Peer
    /// MACs carry and check wall-clock timestamps; the node extrapolates from the last reading
    /// with its monotonic clock. Feed it at start and whenever convenient (the shells feed it
    /// with every inbound request).
    WallClock {
        /// Milliseconds since the Unix epoch.
        unix_ms: u64,
    },
    /// The answer to [`Output::Resolve`]: the seed name's addresses joined with the port
    /// (`host:port`), or why the name did not resolve.
    Resolved {
        /// The resolution's ticket.
        ticket: u64,
        /// The addresses, or the error.
        result: Result<Vec<String>, String>,
    },
    /// Fetch the roster of the peer at `addr` (diagnostics and tests; discovery fetches its
    /// own); the answer is an [`Event::Roster`] carrying `ticket`.
    FetchRoster {
        /// Chosen by the driver, echoed in the event.
        ticket: u64,
        /// The peer's address.
        addr: String,
    },
}

/// Where a block a request served came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BlockSource {
    /// The local store.
    Cache,
    /// An origin fetch this request's flight led (or made alone).
    Origin,
    /// Another request's origin flight.
    Coalesced,
    /// A peer.
    Peer,
}

/// How a fetch an exchange made ended, for the latency histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FetchKind {
    /// A peer block fetch.
    Peer,
    /// An origin probe or block fetch.
    Origin,
}

/// Something that happened, for metrics, logs, traces and the simulator's oracle.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A peer's circuit changed state.
    Circuit(BreakerEvent<String>),
    /// The published broadcast targets changed; this many now.
    BroadcastTargets {
        /// Targets published.
        targets: usize,
    },
    /// A whole block found in the store no longer hashed to the digest it was stored with
    /// (disk or memory corruption): it was dropped and is read afresh ([`crate::integrity`]).
    BlockRotten {
        /// The block.
        key: crate::hash::BlockKey,
    },
    /// A drain's departure announcements ended ([`Input::Drain`]).
    Left {
        /// Targets told.
        announced: usize,
        /// Of those, the ones that answered.
        answered: usize,
    },
    /// A request served one block.
    Block {
        /// The request.
        request: RequestId,
        /// Client read or relay.
        plane: Plane,
        /// The block.
        key: BlockKey,
        /// From where.
        source: BlockSource,
    },
    /// A peer block exchange ended with this observation (`Served` for a valid block).
    PeerAnswer {
        /// The peer's address.
        addr: String,
        /// How it ended.
        observation: Observation,
    },
    /// An exchange finished after `elapsed`.
    Fetched {
        /// Peer or origin.
        kind: FetchKind,
        /// From send to end.
        elapsed: Duration,
    },
    /// A request failed; `committed` means its head was out and the body is truncated.
    Failed {
        /// The request.
        request: RequestId,
        /// The status answered, when not committed.
        status: u16,
        /// The head was already sent.
        committed: bool,
        /// The cause.
        error: String,
    },
    /// A direct block fetch ended: the classified answer, or `None` when the peer's circuit is
    /// open (nothing was sent) or the peer path is off.
    BlockFetched {
        /// The driver's ticket.
        ticket: u64,
        /// How it ended.
        answer: Option<crate::engine::PeerAnswer>,
    },
    /// A roster fetch ended.
    Roster {
        /// The driver's ticket.
        ticket: u64,
        /// The roster and the responder's self-reported id, or why not.
        result: Result<(Roster, Option<String>), String>,
    },
    /// The membership view changed (discovery): placement uses it from now on.
    View {
        /// The new epoch.
        epoch: u64,
        /// Members in the view, self included.
        members: usize,
        /// Ids that joined.
        joined: Vec<String>,
        /// Ids that left.
        left: Vec<String>,
    },
    /// Discovery went wrong (a seed name did not resolve, a roster carried invalid ids). At
    /// most one per minute is reported; `suppressed` counts those held back since the last.
    Discovery {
        /// What went wrong.
        message: String,
        /// Reports held back since the last one.
        suppressed: u64,
    },
    /// A JOIN to an object's tracker failed: the object's reads route over every member until
    /// a JOIN succeeds. At most one per minute is reported; `suppressed` counts those held back
    /// since the last (every one counts in `NodeCounters::tracker_join_failed`).
    TrackerJoinFailed {
        /// The object (its file key's identity).
        file: String,
        /// Why.
        error: String,
        /// Reports held back since the last one.
        suppressed: u64,
    },
    /// Handling an input panicked; the requests it touched were failed and forgotten.
    Panicked {
        /// The requests failed because of it.
        requests: Vec<RequestId>,
        /// The panic message.
        message: String,
    },
}

/// An output of the node, drained with [`super::Node::poll_output`].
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// Resolve the seed `name` (A/AAAA) and answer with [`Input::Resolved`] carrying `ticket`,
    /// each address joined with `port`.
    Resolve {
        /// Echoed in the answer.
        ticket: u64,
        /// The name.
        name: String,
        /// The peer port.
        port: u16,
    },
    /// Send this `GET` and report its progress with [`Input::Io`].
    Send(IoRequest),
    /// Abandon this exchange: drop its connection (or its unread body) and report nothing more.
    Cancel(IoId),
    /// Passthrough: stream the exchange's body (whose head was already answered) straight into
    /// the request's response body with the transport's own backpressure, then report the
    /// exchange's `End` or `Failed`.
    Pipe {
        /// The exchange.
        io: IoId,
        /// The request whose body it becomes.
        to: RequestId,
    },
    /// Look a block up and answer with [`Input::Store`]: the whole block, or with a `window`
    /// only those bytes, and only if the stored block has exactly the window's `block_len`
    /// (otherwise a miss). A window lets a store read just the bytes a range needs.
    StoreGet {
        /// The operation.
        op: StoreOp,
        /// The block.
        key: BlockKey,
        /// The part of the block wanted, if not all of it.
        window: Option<crate::engine::Window>,
    },
    /// Drop these blocks from the store: the object they belong to changed at the origin, and
    /// its old version must never be served again.
    StoreDrop {
        /// The blocks (every block of the old version's size; most are usually not held).
        keys: Vec<BlockKey>,
    },
    /// Store a validated block; best effort (a refusal never fails anything).
    StorePut {
        /// The block.
        key: BlockKey,
        /// Its exact bytes.
        data: Bytes,
        /// The budget it is charged to.
        class: BlockClass,
        /// Its block digest ([`crate::integrity::xxh3_128`] of `data`) when the node hashed it
        /// for this put, so that a store that checksums what it writes need not hash the bytes
        /// again; `None` when the node kept the key's digest already (it did not hash again).
        digest: Option<crate::integrity::BlockDigest>,
    },
    /// Send this response head.
    Respond {
        /// The request.
        id: RequestId,
        /// The head.
        head: Head,
    },
    /// Send these body bytes; report [`Input::Drained`] when the transport took them.
    Body {
        /// The request.
        id: RequestId,
        /// The bytes.
        data: Bytes,
    },
    /// The response's bytes must match a digest (a whole registry blob): hash every
    /// [`Output::Body`] part of it, in order, off the machine's thread, and hold the most recent
    /// part back (unwritten) until the next part arrives or the response ends: the verdict is
    /// the machine's, and nothing of the last part may reach the requester before it.
    Hash {
        /// The request.
        id: RequestId,
        /// The algorithm.
        algorithm: crate::registry::DigestAlgorithm,
    },
    /// Every body part of a hashed response was handed over: answer [`Input::Sealed`] with the
    /// digest of them all (the held part included), then wait for [`Output::End`] (write the
    /// held part, end) or [`Output::Abort`] (drop it, reset).
    Seal {
        /// The request.
        id: RequestId,
    },
    /// The response is complete.
    End {
        /// The request.
        id: RequestId,
    },
    /// The response cannot complete: reset it (the requester sees a truncated body).
    Abort {
        /// The request.
        id: RequestId,
    },
    /// The node has had no live request for [`super::IDLE_RELEASE_AFTER`] after work: give
    /// memory kept for reuse back to the system ([`crate::bufpool::release_idle`], and the
    /// allocator's free pages where it can). Nothing the node serves depends on it.
    ReleaseMemory,
    /// Something worth recording.
    Event(Event),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-buffer fields answer as the list of pairs they replaced, over random fields, and
    /// so do their spans in the shared buffer.
    #[test]
    fn headers_answer_as_a_list_of_lower_cased_pairs() {
        use rand::{Rng as _, SeedableRng as _};
        let seed = 0x4ead_u64;
        println!("seed {seed}");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let names = ["Range", "range", "X-DART-Hop", "content-length", "ETag", "", "é-x"];
        for case in 0..200 {
            let mut headers = Headers::new();
            let mut model: Vec<(String, Vec<u8>)> = Vec::new();
            for _ in 0..rng.random_range(0..HEADERS_MAX + 10) {
                let name = names[rng.random_range(0..names.len())];
                let value: Vec<u8> =
                    (0..rng.random_range(0..700)).map(|_| rng.random::<u8>()).collect();
                headers.push(name, &value);
                if model.len() < HEADERS_MAX {
                    model.push((name.to_ascii_lowercase(), value));
                }
            }
            assert_eq!(headers.len(), model.len(), "case {case}");
            assert_eq!(headers.is_empty(), model.is_empty());
            let got: Vec<(String, Vec<u8>)> =
                headers.iter().map(|(n, v)| (n.to_owned(), v.to_vec())).collect();
            assert_eq!(got, model, "case {case}");
            for name in names {
                let want = model
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.as_slice());
                assert_eq!(headers.get(name), want, "case {case} {name}");
                assert_eq!(headers.get(&name.to_ascii_uppercase()), want);
            }
            assert_eq!(format!("{headers:?}"), format!("Headers({model:?})"), "prints as before");
            let (buf, spans) = headers.into_shared();
            let shared: Vec<(String, Vec<u8>)> = spans
                .map(|(n, v)| {
                    (String::from_utf8(buf[n].to_vec()).expect("a name"), buf.slice(v).to_vec())
                })
                .collect();
            assert_eq!(shared, model, "case {case}: the shared buffer's spans are the fields");
        }
        let h = Headers::new().with("Content-Length", "42").with("x", b"\xff");
        assert_eq!((h.get_u64("content-length"), h.get_str("x")), (Some(42), None));
    }

    /// A debug print of header fields names a credential's length, never its value, whatever
    /// the case of its name; other fields print as they are.
    #[test]
    fn a_debug_print_of_headers_never_shows_a_credential() {
        let h = Headers::new()
            .with("Authorization", "Bearer s3cr3t-token")
            .with("range", "bytes=0-9")
            .with("Cookie", "session=s3cr3t")
            .with("proxy-authorization", "Basic s3cr3t")
            .with("Set-Cookie", "id=s3cr3t");
        let shown = format!("{h:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("(\"authorization\", <redacted, 19 bytes>)"), "{shown}");
        assert!(shown.contains(&format!("(\"range\", {:?})", b"bytes=0-9")), "{shown}");
        assert_eq!(h.get_str("authorization"), Some("Bearer s3cr3t-token"), "the value is kept");
    }
}

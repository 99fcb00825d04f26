//! One client read as a state machine.

use super::origin::{OriginError, ProbeOutcome, RangeBody};
use super::{BlockClass, Engine, ObjectInfo};
use crate::codec::range::{
    content_range_header, resolve_range, unsatisfied_content_range, RangeOutcome,
};
use crate::geometry::{Segment, Segments};
use crate::hash::BlockKey;
use crate::identity::ObjectId;
use bytes::Bytes;
use std::collections::VecDeque;
use thiserror::Error;

/// The client's method; anything else is refused by the shell with 405 before a read starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Headers and body.
    Get,
    /// Headers only; never sent upstream as HEAD.
    Head,
}

/// A client read: the resolved upstream URL, the method and the raw `Range` header.
#[derive(Clone, Debug)]
pub struct ReadRequest {
    /// Upstream URL (may carry a presigned query; it is a credential).
    pub url: String,
    /// GET or HEAD.
    pub method: Method,
    /// The raw `Range` header, if any.
    pub range: Option<Vec<u8>>,
}

/// Status line and framing of the client response. `Accept-Ranges: bytes` always accompanies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHead {
    /// 200, 206 or 416.
    pub status: u16,
    /// Exact body length: the block path never uses chunked framing.
    pub content_length: u64,
    /// `Content-Range` value for 206 and 416.
    pub content_range: Option<String>,
}

/// A block fetched from the origin, with the fetcher's judgement of the response.
#[derive(Clone, Debug)]
pub struct FetchedBlock {
    /// The bytes of the window.
    pub data: Bytes,
    /// What the response revealed (total, Range ignored).
    pub body: RangeBody,
    /// The bytes came from another caller's flight (not counted as origin wire bytes).
    pub coalesced: bool,
}

/// Why a read failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReadError {
    /// The origin failed or refused (probe or block fetch).
    #[error(transparent)]
    Origin(#[from] OriginError),
    /// A fetched block did not have the length the geometry requires.
    #[error("block {block} has {got} bytes, geometry requires {want}")]
    BlockLength {
        /// Global block index.
        block: u64,
        /// Required length.
        want: u64,
        /// Received length.
        got: u64,
    },
    /// The origin's total changed under us: the object is not immutable.
    #[error("object size changed from {known} to {now}")]
    SizeChanged {
        /// Size learnt by the probe.
        known: u64,
        /// Size the block response reported.
        now: u64,
    },
}

/// A failed read: before the head is committed the shell answers `status`; after, it can only
/// truncate the body (the client sees a short Content-Length body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadFailure {
    /// The response head was already emitted.
    pub committed: bool,
    /// Status to answer when not committed: 404 when the origin said 404, else 502.
    pub status: u16,
    /// The cause.
    pub error: ReadError,
}

/// What the shell must do next.
#[derive(Clone, Debug)]
pub enum Action {
    /// Send `GET url` with `Range: bytes=0-0` and answer with [`Read::handle_probe`].
    Probe {
        /// Upstream URL.
        url: String,
    },
    /// The origin ignores Range: proxy this request verbatim (fetch.md §6). Terminal.
    Passthrough {
        /// Upstream URL.
        url: String,
    },
    /// Send the response head.
    Respond(ResponseHead),
    /// Look `key` up in the local store and answer with [`Read::handle_lookup`].
    Lookup {
        /// The block.
        key: BlockKey,
    },
    /// Fetch `start..=end` of `url` from the origin (coalesced by the shell's flight table) and
    /// answer with [`Read::handle_fetch`].
    FetchOrigin {
        /// The block being filled.
        key: BlockKey,
        /// Upstream URL.
        url: String,
        /// First byte.
        start: u64,
        /// Last byte (inclusive), already clamped to the object.
        end: u64,
        /// The block's geometry length (`end - start + 1`).
        expected_len: u64,
        /// The object's size as the probe learnt it.
        object_size: u64,
        /// Budget the block is charged to if the flight fills the cache (see [`block_verdict`]).
        class: BlockClass,
    },
    /// Store a validated block (best effort: a refusal never fails the read).
    Store {
        /// The block.
        key: BlockKey,
        /// Its exact bytes.
        data: Bytes,
        /// Budget to charge.
        class: BlockClass,
    },
    /// Write these bytes to the client, in order.
    Emit(Bytes),
    /// The response is complete. Terminal.
    Finish,
    /// The read failed. Terminal.
    Fail(ReadFailure),
}

/// What may be done with a fetched block (decided identically by a read and by the shell's
/// flight, which fills the cache before it ends so that later readers find the block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Exact length, Range honoured: serve and cache.
    Cache,
    /// Exact length but sliced from a Range-ignoring 200: serve, never cache.
    ServeOnly,
    /// Wrong length or a changed object: serve nothing, cache nothing.
    Reject(ReadError),
}

/// Judges a fetched block of an object of `size` bytes whose geometry length is `expected`.
pub fn block_verdict(size: u64, expected: u64, block: &FetchedBlock) -> Verdict {
    if let Some(total) = block.body.total {
        if total != size && !block.body.range_ignored {
            return Verdict::Reject(ReadError::SizeChanged { known: size, now: total });
        }
    }
    let got = block.data.len() as u64;
    if got != expected {
        return Verdict::Reject(ReadError::BlockLength { block: 0, want: expected, got });
    }
    if block.body.range_ignored {
        Verdict::ServeOnly
    } else {
        Verdict::Cache
    }
}

#[derive(Debug)]
enum State {
    AwaitProbe,
    AwaitLookup { seg: Segment, key: BlockKey, expected: u64 },
    AwaitFetch { seg: Segment, key: BlockKey, expected: u64 },
    Streaming,
    Done,
}

/// One client read.
///
/// # Driving contract
///
/// Create with [`Engine::begin_read`]. Loop on [`Read::poll_action`] until it returns `None`,
/// carrying out each [`Action`]. Three actions ask a question ([`Action::Probe`],
/// [`Action::Lookup`], [`Action::FetchOrigin`]): the shell answers it with the matching
/// `handle_*` call (passing the same engine) before polling again. [`Action::Finish`],
/// [`Action::Fail`] and [`Action::Passthrough`] are terminal: nothing follows them.
///
/// # Invariants
/// - Emitted bytes are exactly bytes `start..=end` of the object, in order, and their total equals
///   the head's `Content-Length` on success.
/// - A block is offered to the store only with the exact geometry length and never when the
///   origin ignored Range.
/// - Nothing is learnt about an object from a failed probe.
pub struct Read {
    url: String,
    object: ObjectId,
    method: Method,
    range: Option<Vec<u8>>,
    size: u64,
    segments: Option<Segments>,
    head_sent: bool,
    emitted: u64,
    content_length: u64,
    state: State,
    out: VecDeque<Action>,
}

impl Read {
    pub(super) fn new(engine: &mut Engine, request: ReadRequest) -> Read {
        let object = engine.identify(&request.url);
        let mut read = Read {
            url: request.url,
            object,
            method: request.method,
            range: request.range,
            size: 0,
            segments: None,
            head_sent: false,
            emitted: 0,
            content_length: 0,
            state: State::AwaitProbe,
            out: VecDeque::new(),
        };
        match engine.object(&read.object) {
            Some(ObjectInfo::Sized(size)) => read.respond(engine, size),
            Some(ObjectInfo::RangeBlind) => read.passthrough(engine),
            None => read.out.push_back(Action::Probe { url: read.url.clone() }),
        }
        read
    }

    /// The object's identity.
    pub fn object(&self) -> &ObjectId {
        &self.object
    }

    /// The next action, or `None` while waiting for an answer or after a terminal action.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.out.pop_front()
    }

    /// True once a terminal action was emitted.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// The answer to [`Action::Probe`]: the classified origin response or the failure.
    pub fn handle_probe(&mut self, engine: &mut Engine, answer: Result<ProbeOutcome, OriginError>) {
        assert!(matches!(self.state, State::AwaitProbe), "probe answer out of turn");
        match answer {
            Ok(outcome) => {
                engine.learn(&self.object, outcome);
                match outcome {
                    ProbeOutcome::Size(size) => self.respond(engine, size),
                    ProbeOutcome::RangeBlind { .. } => self.passthrough(engine),
                }
            }
            Err(e) => self.fail(e.into()),
        }
    }

    /// The answer to [`Action::Lookup`]: the cached bytes, if any.
    pub fn handle_lookup(&mut self, engine: &mut Engine, cached: Option<Bytes>) {
        let State::AwaitLookup { seg, key, expected } = self.state else {
            panic!("lookup answer out of turn: {:?}", self.state);
        };
        match cached {
            Some(data) if data.len() as u64 == expected => {
                engine.stats.block_source_cache += 1;
                self.emit_segment(engine, seg, &data);
                self.next_block(engine);
            }
            Some(_) | None => {
                if cached.is_some() {
                    engine.stats.cache_corrupt += 1;
                }
                let start = seg.block_index * engine.config.geometry.block_bytes();
                self.out.push_back(Action::FetchOrigin {
                    key,
                    url: self.url.clone(),
                    start,
                    end: start + expected - 1,
                    expected_len: expected,
                    object_size: self.size,
                    class: engine.class_of(&key),
                });
                self.state = State::AwaitFetch { seg, key, expected };
            }
        }
    }

    /// The answer to [`Action::FetchOrigin`].
    pub fn handle_fetch(
        &mut self,
        engine: &mut Engine,
        fetched: Result<FetchedBlock, OriginError>,
    ) {
        let State::AwaitFetch { seg, key, expected } = self.state else {
            panic!("fetch answer out of turn: {:?}", self.state);
        };
        let block = match fetched {
            Ok(block) => block,
            Err(e) => return self.fail(e.into()),
        };
        if !block.coalesced {
            engine.stats.origin_bytes += block.data.len() as u64;
        }
        match block_verdict(self.size, expected, &block) {
            Verdict::Cache => {
                let class = engine.class_of(&key);
                self.out.push_back(Action::Store { key, data: block.data.clone(), class });
            }
            Verdict::ServeOnly => engine.stats.uncacheable += 1,
            Verdict::Reject(err) => {
                let err = match err {
                    ReadError::BlockLength { want, got, .. } => {
                        ReadError::BlockLength { block: seg.block_index, want, got }
                    }
                    other => other,
                };
                return self.fail(err);
            }
        }
        engine.stats.block_source_origin += 1;
        self.emit_segment(engine, seg, &block.data);
        self.next_block(engine);
    }

    fn respond(&mut self, engine: &mut Engine, size: u64) {
        self.size = size;
        let head = match resolve_range(self.range.as_deref(), size) {
            Ok(RangeOutcome::Whole) => {
                if size > 0 {
                    self.segments = Some(engine.config.geometry.segments(0, size - 1));
                }
                ResponseHead { status: 200, content_length: size, content_range: None }
            }
            Ok(RangeOutcome::Partial { start, end }) => {
                debug_assert!(start <= end && end < size);
                self.segments = Some(engine.config.geometry.segments(start, end));
                ResponseHead {
                    status: 206,
                    content_length: end - start + 1,
                    content_range: Some(content_range_header(start, end, size)),
                }
            }
            Err(_) => ResponseHead {
                status: 416,
                content_length: 0,
                content_range: Some(unsatisfied_content_range(size)),
            },
        };
        self.content_length = head.content_length;
        self.head_sent = true;
        self.out.push_back(Action::Respond(head));
        if self.method == Method::Head {
            self.segments = None;
        }
        self.state = State::Streaming;
        self.next_block(engine);
    }

    fn next_block(&mut self, engine: &mut Engine) {
        let next = self.segments.as_mut().and_then(Iterator::next);
        match next {
            Some(seg) => {
                let geometry = engine.config.geometry;
                let expected = geometry
                    .block_len(self.size, seg.block_index)
                    .expect("segments lie inside the object");
                let key = engine.block_key(&self.object, seg.block_index);
                self.out.push_back(Action::Lookup { key });
                self.state = State::AwaitLookup { seg, key, expected };
            }
            None => {
                if self.method == Method::Get {
                    assert_eq!(
                        self.emitted, self.content_length,
                        "emitted bytes != Content-Length"
                    );
                }
                self.out.push_back(Action::Finish);
                self.state = State::Done;
            }
        }
    }

    fn emit_segment(&mut self, engine: &mut Engine, seg: Segment, block: &Bytes) {
        let block_start = seg.block_index * engine.config.geometry.block_bytes();
        let from = usize::try_from(seg.from - block_start).expect("offset inside a block");
        let to = usize::try_from(seg.to - block_start).expect("offset inside a block");
        let slice = block.slice(from..=to);
        self.emitted += slice.len() as u64;
        engine.stats.client_bytes += slice.len() as u64;
        self.out.push_back(Action::Emit(slice));
    }

    fn passthrough(&mut self, engine: &mut Engine) {
        engine.stats.passthrough += 1;
        self.out.push_back(Action::Passthrough { url: self.url.clone() });
        self.state = State::Done;
    }

    fn fail(&mut self, error: ReadError) {
        let status = match &error {
            ReadError::Origin(e) if e.status() == Some(404) => 404,
            ReadError::Origin(_)
            | ReadError::BlockLength { .. }
            | ReadError::SizeChanged { .. } => 502,
        };
        let failure = ReadFailure { committed: self.head_sent, status, error };
        self.out.push_back(Action::Fail(failure));
        self.state = State::Done;
    }
}

//! Lead-ins: a cold client read whose range starts deep in a block gets its bytes without
//! waiting for the bytes before them.
//!
//! A block's origin flight asks for the whole window from its first byte (a block is fetched,
//! hashed and stored whole), and a client read of the window's version streams its span as the
//! window arrives ([`Node::forward_origin_streams`]). A read whose span starts deep in the
//! block waits for every byte before it first: at 20 MB/s a 64 KiB read 2 MiB into a cold
//! block took 105 ms to its first byte, where the first 64 KiB took 2 ms. Random-access readers
//! (a Parquet footer, a tensor by offset) pay that on every cold block.
//!
//! # Contract
//!
//! - **Who.** When a client `GET` (not a read ahead, not a relay) leads a block's origin flight,
//!   or joins one, and the window is at least a quarter of the block from the read's span,
//!   which is no longer than the bytes the window must still bring before it
//!   ([`wants_lead_in`]), the node also asks the origin for exactly the read's span, under the
//!   read's own URL and `Authorization`: a leader's before its window, a joiner's when it
//!   joins. The extra origin bytes are at most the bytes the read would have waited for; the
//!   window is fetched, stored and shared with joiners and relays as before, so a herd still
//!   costs the origin one window per block (plus the spans of this node's own deep reads).
//! - **What it may pass on.** Only a `206` whose `Content-Range` is exactly the span asked for,
//!   with the object's size as the read knows it, and whose validators name the read's version
//!   ([`crate::engine::Read::origin_stream_span`], the check the window's stream makes). Any
//!   other head ends the lead-in; the read goes on with the window, which judges the object's
//!   version as before. The lead-in's bytes are never stored (they are not a block).
//! - **One counter for both sources.** The read's waiter on the flight counts the bytes of its
//!   span passed on (`Waiter::streamed`); the window and the lead-in each pass on what follows
//!   it and advance it, so the client gets every byte once and in order, from whichever source
//!   has it first. The block's last byte goes out only after an end that proves a length (the
//!   window's, or the lead-in's own).
//! - **Ends.** With its span passed on the read leaves the flight (which goes on to fill the
//!   store) and moves on. A lead-in that fails, expires or is refused ends quietly: the read
//!   takes the rest from the window. A read that leaves its flight for any reason (it went
//!   away, the window ended first, a block landed by another path) ends its lead-in
//!   ([`Node::end_lead_in`], called from `leave_flight` and where a flight publishes).
//!
//! - **A failed window.** A window that fails while the read streams (from either source) cuts
//!   its response short, as a streamed window's failure always did: the read does not go on
//!   with its lead-in alone. Without the lead-in, a window that failed before it reached the
//!   read's range would have failed (or retried) the read before any byte went out.
//!
//! The lead-in helps the node that reads from the origin: a single node, or the root of a
//! block's tree. A leaf's read goes to its parent, whose relay streams the window from its
//! first byte; that whole-tree change is not made.

use super::body::BodyBuf;
use super::exchange::{Expiry, Job};
use super::io::{Endpoint, Headers, IoEvent, IoId, Output, Plane, RequestId};
use super::requests::Wait;
use super::{Node, BODY_WINDOW};
use crate::codec::content_range::parse_content_range;
use crate::engine::flight::FlightId;
use crate::engine::ObjectMeta;
use crate::time::Instant;

/// A lead-in is for a span that starts at least `1 / DEPTH_SHARE` of the block in.
const DEPTH_SHARE: u64 = 4;

/// Whether a client read whose span of a `block_len`-byte block is `span` (first and last
/// offsets within it) gets a lead-in while the block's window has brought its first `have`
/// bytes: the window is at least a quarter of the block from the span, and the span is no
/// longer than the bytes the window must still bring before it, so the origin sends at most as
/// many extra bytes as the read would otherwise wait for.
pub(super) fn wants_lead_in(span: (u64, u64), have: u64, block_len: u64) -> bool {
    let (first, last) = span;
    if last < first || first < have {
        return false;
    }
    let ahead = first - have;
    ahead >= block_len.div_ceil(DEPTH_SHARE).max(1) && last - first < ahead
}

/// A lead-in exchange's state.
#[derive(Debug)]
pub(super) struct LeadIn {
    /// The read it serves, and the flight that read waits on.
    pub request: RequestId,
    pub flight: FlightId,
    /// The read's span of the block (offsets within it, first and last): what it asks for.
    pub span: (u64, u64),
    /// The offset of the block's first byte in the object.
    pub block_start: u64,
    /// The block's length and the object's size, as the flight expects them.
    pub expected: u64,
    pub size: u64,
    /// The bytes of the span so far (after a head that passed [`Node::lead_in_head`]).
    pub buf: BodyBuf,
}

impl LeadIn {
    fn len(&self) -> u64 {
        self.span.1 - self.span.0 + 1
    }
}

impl Node {
    /// Request `rid` leads or joins flight `fid` for the block at `block_start` (`expected`
    /// bytes of an object of `size`), whose window has brought `have` bytes: asks `url` with
    /// `auth` for its span beside the window if [`wants_lead_in`] says so.
    pub(super) fn start_lead_in(
        &mut self,
        rid: RequestId,
        fid: FlightId,
        (block_start, expected, size, have): (u64, u64, u64, u64),
        url: &str,
        auth: Option<&[u8]>,
        now: Instant,
    ) {
        let Some(req) = self.requests.get(&rid) else { return };
        if !self.engine.config().lead_in || req.plane != Plane::Client {
            return;
        }
        let Some(span) = req.read.client_block_span(&self.engine) else { return };
        if !wants_lead_in(span, have, expected) || span.1 >= expected {
            return;
        }
        let range = format!("bytes={}-{}", block_start + span.0, block_start + span.1);
        let mut headers = Headers::new().with("range", range);
        if let Some(auth) = auth {
            headers.push("authorization", auth);
        }
        let len = (span.1 - span.0 + 1) as usize;
        let buf = BodyBuf::with_reserve(len);
        let lead = LeadIn { request: rid, flight: fid, span, block_start, expected, size, buf };
        let io = self.start_exchange(
            Endpoint::Origin,
            url.to_owned(),
            headers,
            Job::LeadIn(Box::new(lead)),
            now,
        );
        self.lead_ins.insert(rid, io);
        self.counters.origin_lead_ins += 1;
    }

    /// Ends request `rid`'s lead-in, if it has one: the read left its flight, or has its bytes.
    pub(super) fn end_lead_in(&mut self, rid: RequestId) {
        if let Some(io) = self.lead_ins.remove(&rid) {
            if self.remove_exchange(io).is_some() {
                self.emit(Output::Cancel(io));
            }
        }
    }

    /// Lead-in `io` is over (`cancel`: the driver still runs it); its read goes on with the
    /// window.
    fn drop_lead_in(&mut self, io: IoId, cancel: bool) {
        if let Some(x) = self.remove_exchange(io) {
            if let Job::LeadIn(lead) = &x.job {
                self.lead_ins.remove(&lead.request);
            }
            if cancel {
                self.emit(Output::Cancel(io));
            }
        }
    }

    pub(super) fn lead_in_expired(&mut self, io: IoId, _expiry: Expiry) {
        self.drop_lead_in(io, true);
    }

    pub(super) fn lead_in_io(&mut self, io: IoId, event: IoEvent, now: Instant) {
        match event {
            IoEvent::Connected => unreachable!("handled by the exchange"),
            IoEvent::Head { status, headers } => {
                if !self.lead_in_head(io, status, &headers, now) {
                    self.drop_lead_in(io, true);
                }
            }
            IoEvent::Body(data) => {
                let x = self.exchanges.get_mut(&io).expect("routed to a live exchange");
                let Job::LeadIn(lead) = &mut x.job else { unreachable!("a lead-in") };
                let n = data.len() as u64;
                self.engine.note_origin_bytes(n);
                if lead.buf.len() as u64 + n > lead.len() {
                    // Longer than its Content-Range: not the bytes it named.
                    return self.drop_lead_in(io, true);
                }
                lead.buf.push(data);
                self.forward_lead_in(io, false, now);
            }
            IoEvent::End => {
                let x = &self.exchanges[&io];
                let Job::LeadIn(lead) = &x.job else { unreachable!("a lead-in") };
                if lead.buf.len() as u64 == lead.len() {
                    self.forward_lead_in(io, true, now);
                }
                self.drop_lead_in(io, false);
            }
            IoEvent::Failed(_) => self.drop_lead_in(io, false),
        }
    }

    /// Judges lead-in `io`'s head; on `true` its read streams its span (started now unless the
    /// window started it first).
    fn lead_in_head(&mut self, io: IoId, status: u16, headers: &Headers, now: Instant) -> bool {
        let Job::LeadIn(lead) = &self.exchanges[&io].job else { unreachable!("a lead-in") };
        let (rid, fid, span, size) = (lead.request, lead.flight, lead.span, lead.size);
        let first = lead.block_start + span.0;
        let last = lead.block_start + span.1;
        let range = headers.get("content-range").and_then(|v| parse_content_range(v).ok());
        let exact =
            range.is_some_and(|cr| cr.range == Some((first, last)) && cr.total == Some(size));
        let length_ok = headers.get_u64("content-length").is_none_or(|l| l == last - first + 1);
        if status != 206 || !exact || !length_ok {
            return false;
        }
        let meta = ObjectMeta::from_fields(|n| headers.get(n));
        let Some(req) = self.requests.get(&rid).filter(|r| !r.cancelled) else { return false };
        if req.wait != Wait::Flight(fid) {
            return false;
        }
        let Some(flight) = self.flight_state.get(&fid) else { return false };
        let Some(w) = flight.waiters.iter().find(|w| w.request == rid) else { return false };
        if w.streamed.is_some() {
            // The window's head came first and started the stream: the lead-in adds its bytes,
            // if they are of the same version.
            return w.client && w.span == span && req.read.serves_version(&self.engine, &meta);
        }
        if req.read.origin_stream_span(&self.engine, &meta, Some(size)) != Some(span) {
            return false;
        }
        self.start_waiter_stream(fid, rid, span, true, now);
        true
    }

    /// Passes on what lead-in `io` holds beyond what its read has: all of its span after the
    /// read's next byte, but the block's last byte only `at_end` (the lead-in's whole length
    /// came). A read that has its whole span leaves the flight and moves on.
    fn forward_lead_in(&mut self, io: IoId, at_end: bool, now: Instant) {
        let Some(x) = self.exchanges.get(&io) else { return };
        let Job::LeadIn(lead) = &x.job else { return };
        let (rid, span) = (lead.request, lead.span);
        let Some(flight) = self.flight_state.get_mut(&lead.flight) else { return };
        let Some(w) = flight.waiters.iter_mut().find(|w| w.request == rid) else { return };
        let Some(done) = w.streamed else { return };
        let next = span.0 + done;
        let have = span.0 + lead.buf.len() as u64;
        let limit = if at_end || span.1 + 1 < lead.expected { span.1 + 1 } else { span.1 };
        let to = have.min(limit);
        let room = self.requests.get(&rid).is_some_and(|r| !r.cancelled && r.window < BODY_WINDOW);
        if to <= next || !room {
            return;
        }
        let data = lead.buf.slice((next - span.0) as usize..(to - span.0) as usize);
        w.streamed = Some(to - span.0);
        let whole = to == span.1 + 1;
        if whole {
            flight.waiters.retain(|w| w.request != rid);
        }
        self.pass_origin_part(rid, data, whole, now);
        if whole {
            self.drop_lead_in(io, !at_end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lead_in_is_for_a_span_deep_in_its_block_and_no_longer_than_the_bytes_before_it() {
        let block = 1024;
        assert!(!wants_lead_in((0, 99), 0, block), "at the block's start");
        assert!(!wants_lead_in((255, 300), 0, block), "less than a quarter in");
        assert!(wants_lead_in((256, 300), 0, block), "a quarter in");
        assert!(wants_lead_in((256, 511), 0, block), "as long as the bytes before it");
        assert!(!wants_lead_in((256, 512), 0, block), "longer than the bytes before it");
        assert!(wants_lead_in((1000, 1023), 0, block), "a footer");
        assert!(!wants_lead_in((10, 5), 0, block), "no span");
        // A block of one byte, or an empty one, never: there is nothing before the span.
        assert!(!wants_lead_in((0, 0), 0, 1));
        assert!(!wants_lead_in((0, 0), 0, 0));
        // A window under way: what it must still bring before the span counts.
        assert!(wants_lead_in((900, 1000), 600, block), "300 bytes still to come, 101 asked");
        assert!(!wants_lead_in((900, 1000), 700, block), "200 bytes still to come");
        assert!(!wants_lead_in((900, 1000), 950, block), "the window is inside the span");
        assert!(!wants_lead_in((900, 1099), 600, 2048), "longer than the bytes still to come");
    }
}

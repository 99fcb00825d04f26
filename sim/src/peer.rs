//! The node's peer plane against the simulator: the server side mirrors `net-tokio`'s
//! `peer_plane` (core `relay_check`, then a relay read driven like any other; the whole block is
//! held before the head, so every failure is a clean status), the client side mirrors
//! `peer_client` (bounded read of at most `expected + 1` bytes, classification into the core's
//! `Observation`). Hostile peers lie here, after their honest relay read finished.

use crate::calls::{CallAnswer, CallFailure, CallId, CallRequest, PeerReply};
use crate::fault::Lie;
use crate::node::{ActiveRead, ReadId, ReadKind, Waiting};
use crate::report::{BlockEvent, BlockSource};
use crate::sim::Sim;
use bytes::Bytes;
use dart_core::breaker::Observation;
use dart_core::engine::route::{relay_check, RelayPlan};
use dart_core::engine::{PeerAnswer, ReadFailure, ResponseHead};
use dart_core::hash::BlockKey;

/// Classifies a peer exchange as `net-tokio`'s peer client does.
pub fn classify(answer: Result<CallAnswer, CallFailure>, expected: u64) -> PeerAnswer {
    let reply = match answer {
        Ok(CallAnswer::Peer(reply)) => reply,
        Ok(CallAnswer::Origin(_)) => unreachable!("a peer call gets a peer answer"),
        Err(CallFailure::DialFailed) => return PeerAnswer::Failed(Observation::DialFailed),
        Err(CallFailure::HeaderTimeout | CallFailure::BodyTimeout) => {
            return PeerAnswer::Failed(Observation::TimedOut)
        }
        Err(CallFailure::Reset) => return PeerAnswer::Failed(Observation::BodyInterrupted),
    };
    let head = Observation::of_block_head(
        reply.status,
        reply.upstream_status,
        reply.content_length,
        expected,
    );
    if let Some(observation) = head {
        return PeerAnswer::Failed(observation);
    }
    if reply.interrupted {
        return PeerAnswer::Failed(Observation::BodyInterrupted);
    }
    let limit = usize::try_from(expected.saturating_add(1)).unwrap_or(usize::MAX);
    let body = reply.body.slice(..reply.body.len().min(limit));
    if body.len() as u64 != expected {
        return PeerAnswer::Failed(Observation::WrongLength);
    }
    PeerAnswer::Block(body)
}

impl Sim {
    /// Peer request `id` reached node `j`'s peer server.
    pub(crate) fn peer_arrive(&mut self, id: CallId, j: usize) {
        let call = &self.calls[&id];
        let CallRequest::Peer(req) = &call.request else {
            unreachable!("peer calls carry peer requests");
        };
        let req = req.clone();
        let node = &mut self.nodes[j];
        if node.peer_faults.stalls > 0 {
            self.trace.line(self.now, format_args!("serve {id} n{j} stalled"));
            return; // accepted, never answered: the caller's header bound ends it
        }
        let plan = relay_check(&node.engine, req.key, Some(&req.url), req.hop);
        self.trace
            .line(self.now, format_args!("serve {id} n{j} {} hop {} {plan:?}", req.key, req.hop));
        let (url, next_hop) = match plan {
            Ok(RelayPlan::CacheOnly) => (None, req.hop),
            Ok(RelayPlan::FetchOnBehalf { next_hop }) => (Some(req.url.clone()), next_hop),
            Err(_) => {
                node.engine.note_relay_declined();
                self.touch(j);
                let reply = self.lie(j, id, req.key, not_held());
                self.peer_respond(id, reply);
                return;
            }
        };
        let read = node.engine.begin_relay(req.key, url, next_hop);
        let object = crate::origin::parse_url(&req.url).map_or(0, |(o, _)| o);
        let kind = ReadKind::Relay {
            call: id,
            key: req.key,
            head: None,
            body: None,
            streaming: false,
            copy: None,
        };
        let active = ActiveRead {
            read,
            kind,
            object,
            waiting: None,
            permit: None,
            last_range_ignored: false,
            just_looked_up: false,
        };
        let rid = ReadId(self.next_read);
        self.next_read += 1;
        node.reads.insert(rid, active);
        self.touch(j);
        self.drive(j, rid);
    }

    /// A relay read on node `n` ended: answer its caller (an honest relay serves only correct
    /// blocks; a lying one then distorts the answer).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn relay_done(
        &mut self,
        n: usize,
        rid: ReadId,
        call: CallId,
        key: BlockKey,
        streaming: bool,
        head: Option<ResponseHead>,
        body: Option<Bytes>,
        failure: Option<ReadFailure>,
    ) {
        let reply = match failure {
            None => {
                let (Some(head), Some(body)) = (head, body) else {
                    self.violate(Some(n), format!("relay {rid} finished without head and body"));
                    return;
                };
                if head.status != 200 || head.content_length != body.len() as u64 {
                    self.violate(
                        Some(n),
                        format!("relay {rid} head {head:?} for {} bytes", body.len()),
                    );
                    return;
                }
                if let Err(what) = self.check_block(key, &body) {
                    self.violate(Some(n), format!("relay {rid} served a wrong block: {what}"));
                    return;
                }
                PeerReply {
                    status: 200,
                    upstream_status: None,
                    content_length: Some(head.content_length),
                    body,
                    interrupted: false,
                }
            }
            // A stream already under way can only be cut short.
            Some(f) if streaming && f.committed => PeerReply {
                status: 200,
                upstream_status: None,
                content_length: head.map(|h| h.content_length),
                body: Bytes::new(),
                interrupted: true,
            },
            Some(f) => PeerReply {
                status: f.status,
                upstream_status: f.upstream_status,
                content_length: Some(0),
                body: Bytes::new(),
                interrupted: false,
            },
        };
        self.trace.line(self.now, format_args!("relay-end {rid} n{n} {call} {}", reply.status));
        let reply = self.lie(n, call, key, reply);
        self.peer_respond(call, reply);
    }

    /// What node `n`'s peer plane actually sends, given the lies it is under.
    fn lie(&mut self, n: usize, call: CallId, key: BlockKey, mut reply: PeerReply) -> PeerReply {
        let Some(&lie) = self.nodes[n].peer_faults.lies.last() else {
            return reply;
        };
        let expected = match &self.calls.get(&call).map(|c| &c.request) {
            Some(CallRequest::Peer(p)) => p.expected_len,
            Some(CallRequest::Origin(_)) | None => return reply,
        };
        self.trace.line(self.now, format_args!("lie {call} n{n} {key} {lie:?}"));
        match lie {
            Lie::WrongLength if reply.status == 200 && !reply.body.is_empty() => {
                reply.body = reply.body.slice(..reply.body.len() - 1);
                reply.content_length = Some(reply.body.len() as u64);
            }
            Lie::Corrupt if reply.status == 200 && !reply.body.is_empty() => {
                let mut v = reply.body.to_vec();
                let i = (key.block as usize).wrapping_mul(7919) % v.len();
                v[i] ^= 0x5a;
                reply.body = Bytes::from(v);
            }
            Lie::Garbage => {
                reply = PeerReply {
                    status: 200,
                    upstream_status: None,
                    content_length: Some(expected + 4096),
                    body: Bytes::from(vec![0xAB; 64]),
                    interrupted: true,
                };
            }
            Lie::WrongLength | Lie::Corrupt => {}
        }
        reply
    }

    /// Node `n`'s peer request for read `rid` ended: classify, return the permit, drive on.
    pub(crate) fn peer_done(
        &mut self,
        n: usize,
        rid: ReadId,
        answer: Result<CallAnswer, CallFailure>,
        expected: u64,
        peer: usize,
    ) {
        let now = self.now;
        let node = &mut self.nodes[n];
        let Some(active) = node.reads.get_mut(&rid) else { return };
        let (Some(Waiting::Peer), Some(permit)) = (active.waiting.take(), active.permit.take())
        else {
            self.violate(Some(n), format!("read {rid} got a peer answer it did not ask for"));
            return;
        };
        active.just_looked_up = false;
        active.last_range_ignored = false;
        let answer = classify(answer, expected);
        if let (ReadKind::Relay { streaming: true, copy, .. }, PeerAnswer::Block(b)) =
            (&mut active.kind, &answer)
        {
            *copy = Some(b.clone());
        }
        let kind = describe(&answer);
        self.trace.line(now, format_args!("peer-answer {rid} n{n} n{peer} {kind}"));
        let kind = if kind.starts_with("block") { "Block".to_owned() } else { kind };
        *self.peer_answers.entry((peer, kind)).or_default() += 1;
        if matches!(answer, PeerAnswer::Block(_)) && active.record().is_some() {
            self.blocks.push(BlockEvent { at: now, node: n, source: BlockSource::Peer });
        }
        active.read.handle_peer(&mut node.engine, permit, answer, now);
        self.drive(n, rid);
    }
}

impl Sim {
    /// The 200 head of read `rid`'s cut-through upstream fetch arrived: the relay commits its own
    /// head (the requester's first byte now follows the upstream's first byte).
    pub(crate) fn peer_started(&mut self, n: usize, rid: ReadId) {
        let node = &mut self.nodes[n];
        let Some(active) = node.reads.get_mut(&rid) else { return };
        let ReadKind::Relay { streaming, .. } = &mut active.kind else {
            self.violate(Some(n), format!("client read {rid} was offered a stream"));
            return;
        };
        *streaming = true;
        active.read.handle_peer_started(&mut node.engine);
        self.drive(n, rid);
    }
}

fn not_held() -> PeerReply {
    PeerReply {
        status: 404,
        upstream_status: None,
        content_length: Some(0),
        body: Bytes::new(),
        interrupted: false,
    }
}

fn describe(a: &PeerAnswer) -> String {
    match a {
        PeerAnswer::Block(b) => format!("block {}B", b.len()),
        PeerAnswer::Failed(o) => format!("{o:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &'static [u8]) -> Result<CallAnswer, CallFailure> {
        Ok(CallAnswer::Peer(PeerReply {
            status,
            upstream_status: None,
            content_length: Some(body.len() as u64),
            body: Bytes::from_static(body),
            interrupted: false,
        }))
    }

    #[test]
    fn answers_are_classified_like_the_tokio_peer_client() {
        assert_eq!(
            classify(reply(200, b"abcd"), 4),
            PeerAnswer::Block(Bytes::from_static(b"abcd"))
        );
        assert_eq!(classify(reply(200, b"abc"), 4), PeerAnswer::Failed(Observation::WrongLength));
        assert_eq!(classify(reply(200, b"abcde"), 4), PeerAnswer::Failed(Observation::WrongLength));
        assert_eq!(classify(reply(404, b""), 4), PeerAnswer::Failed(Observation::Miss));
        assert_eq!(
            classify(reply(500, b""), 4),
            PeerAnswer::Failed(Observation::UnexpectedStatus(500))
        );
        assert_eq!(
            classify(Err(CallFailure::DialFailed), 4),
            PeerAnswer::Failed(Observation::DialFailed)
        );
        assert_eq!(
            classify(Err(CallFailure::HeaderTimeout), 4),
            PeerAnswer::Failed(Observation::TimedOut)
        );
        let refused = Ok(CallAnswer::Peer(PeerReply {
            status: 502,
            upstream_status: Some(403),
            content_length: Some(0),
            body: Bytes::new(),
            interrupted: false,
        }));
        assert_eq!(
            classify(refused, 4),
            PeerAnswer::Failed(Observation::UpstreamRefused { status: 403 })
        );
    }
}

//! Classification of what a peer request ended with into a breaker [`Outcome`] (peer.md §3.5,
//! §3.6). The shell maps its transport errors onto an [`Observation`]; the rule lives here so the
//! simulator and production classify identically.

use super::permit::{HardReason, Outcome};

/// How a peer request (block or roster) ended, as the shell saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Observation {
    /// 200 with a complete block (validated, where validation applies) or a decoded roster.
    Served,
    /// 404: the peer does not hold the block. A legitimate answer, never a failure.
    Miss,
    /// 502 with `X-DART-Upstream-Status`: the relay's origin refused the requester's own
    /// credential. The peer did its job.
    UpstreamRefused {
        /// The origin's status code from the header.
        status: u16,
    },
    /// 504 with `X-DART-Upstream-Status: 504`: the relay's own upstream did not answer within
    /// the requester's budget. The relay did its job; its upstream is charged by the relay.
    UpstreamSlow,
    /// The caller's own context ended first (hedge loser, client disconnect mid-body).
    CallerCancelled,
    /// Connecting failed or timed out: the peer's machine is not there.
    DialFailed,
    /// Our own dial-independent bound fired (response header or request timeout) while the caller
    /// was still waiting: the peer was genuinely slow.
    TimedOut,
    /// Any other status: a 500, a 502 without the upstream header, a 400, ...
    UnexpectedStatus(u16),
    /// The connection broke or ended mid-body: a transport error keeps its transport class.
    BodyInterrupted,
    /// A response body that could not be decoded (e.g. a malformed roster).
    MalformedBody,
    /// A complete block body of the wrong length (`ErrBlockLength`): a protocol violation.
    WrongLength,
    /// The block validator rejected a complete, correctly sized body.
    ValidationFailed,
    /// The peer answered for another version of the object (its validator differs from the
    /// requester's): not the peer's fault, and not a block the requester may use.
    VersionMismatch,
}

impl Observation {
    /// Judges a peer's block response head: `None` means read the body (a 200 whose announced
    /// length does not exceed the `expected` block); otherwise how the request ended. A 502 spares
    /// the relay only when `X-DART-Upstream-Status` names a credential refusal (401/403): any
    /// other upstream status is a relay fault. A Content-Length above the block is refused before
    /// a body byte is read.
    pub fn of_block_head(
        status: u16,
        upstream_status: Option<u16>,
        content_length: Option<u64>,
        expected: u64,
    ) -> Option<Observation> {
        match status {
            200 if content_length.is_some_and(|n| n > expected) => Some(Observation::WrongLength),
            200 => None,
            404 => Some(Observation::Miss),
            // The relay refused the caller (no cluster secret) or the origin (its upstream
            // policy): an answer about the request, not a failure of the relay.
            status @ (401 | 403) => Some(Observation::UpstreamRefused { status }),
            504 if upstream_status == Some(504) => Some(Observation::UpstreamSlow),
            502 => Some(match upstream_status {
                Some(status @ (401 | 403)) => Observation::UpstreamRefused { status },
                Some(_) | None => Observation::UnexpectedStatus(502),
            }),
            other => Some(Observation::UnexpectedStatus(other)),
        }
    }

    /// The breaker outcome for this observation.
    pub fn outcome(self) -> Outcome {
        match self {
            Observation::Served
            | Observation::Miss
            | Observation::UpstreamRefused { .. }
            | Observation::UpstreamSlow
            | Observation::VersionMismatch => Outcome::Answered,
            Observation::CallerCancelled => Outcome::Cancelled,
            Observation::DialFailed => Outcome::HardFailure(HardReason::Dial),
            Observation::TimedOut
            | Observation::UnexpectedStatus(_)
            | Observation::BodyInterrupted
            | Observation::MalformedBody => Outcome::SoftFailure,
            Observation::WrongLength | Observation::ValidationFailed => {
                Outcome::HardFailure(HardReason::Validation)
            }
        }
    }
}

#[cfg(test)]
mod head_tests {
    use super::*;

    #[test]
    fn block_heads_are_judged_before_the_body() {
        let judge = Observation::of_block_head;
        assert_eq!(judge(200, None, Some(4), 4), None);
        assert_eq!(judge(200, None, None, 4), None);
        assert_eq!(judge(200, None, Some(5), 4), Some(Observation::WrongLength));
        assert_eq!(judge(404, None, None, 4), Some(Observation::Miss));
        assert_eq!(
            judge(502, Some(403), None, 4),
            Some(Observation::UpstreamRefused { status: 403 })
        );
        assert_eq!(
            judge(502, Some(401), None, 4),
            Some(Observation::UpstreamRefused { status: 401 })
        );
        assert_eq!(judge(502, Some(500), None, 4), Some(Observation::UnexpectedStatus(502)));
        assert_eq!(judge(502, None, None, 4), Some(Observation::UnexpectedStatus(502)));
        assert_eq!(judge(500, None, None, 4), Some(Observation::UnexpectedStatus(500)));
    }
}

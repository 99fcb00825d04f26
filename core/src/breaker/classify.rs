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
}

impl Observation {
    /// The breaker outcome for this observation.
    pub fn outcome(self) -> Outcome {
        match self {
            Observation::Served | Observation::Miss | Observation::UpstreamRefused { .. } => {
                Outcome::Answered
            }
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

//! What a request carries through the breaker: its admission, its permit and its outcome.

use std::fmt;

/// Which kind of request a [`Permit`] belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PermitKind {
    /// A block fetch admitted by a closed circuit.
    Data,
    /// A block fetch admitted by a half-open circuit: it holds one probe slot.
    Probe,
    /// A roster fetch: bypasses admission, holds no slot, still records its outcome.
    Roster,
    /// Issued by a disabled breaker (`failure_threshold == 0`); its outcome is ignored.
    Untracked,
}

/// The right to send one request to a peer, bound to the entry and generation it started under.
///
/// Not `Clone`: it is consumed exactly once by [`super::Breaker::complete`]. A permit dropped
/// without completion records nothing in the core; the shell's drop guard reports
/// [`Outcome::Abandoned`], and a probe nobody reports at all is reclaimed at its deadline.
#[must_use = "a permit must be completed with Breaker::complete (the shell's guard reports Abandoned)"]
#[derive(Debug, PartialEq, Eq)]
pub struct Permit<K> {
    pub(super) addr: K,
    /// The entry's slot in the peer table; checked against `incarnation` on completion.
    pub(super) slot: usize,
    pub(super) incarnation: u64,
    pub(super) generation: u64,
    pub(super) kind: PermitKind,
    pub(super) id: u64,
}

impl<K> Permit<K> {
    /// The peer this permit is for.
    pub fn addr(&self) -> &K {
        &self.addr
    }

    /// The kind of request.
    pub fn kind(&self) -> PermitKind {
        self.kind
    }

    /// Whether this permit holds a half-open probe slot.
    pub fn is_probe(&self) -> bool {
        self.kind == PermitKind::Probe
    }

    /// The circuit generation the request started under.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// This permit's breaker-unique id (for traces).
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// The answer to [`super::Breaker::begin_data`].
#[must_use = "a rejected admission means: do not dial; an admitted one carries a permit to complete"]
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<K> {
    /// Go ahead; complete the permit when the request ends.
    Admitted(Permit<K>),
    /// The circuit is open (or half-open with no free probe slot): do not dial, route elsewhere.
    Rejected,
}

impl<K> Admission<K> {
    /// The permit, if admitted.
    pub fn permit(self) -> Option<Permit<K>> {
        match self {
            Admission::Admitted(permit) => Some(permit),
            Admission::Rejected => None,
        }
    }

    /// Whether the request was admitted.
    pub fn is_admitted(&self) -> bool {
        match self {
            Admission::Admitted(_) => true,
            Admission::Rejected => false,
        }
    }
}

/// Why a failure is definitive rather than suspicious; a hard failure opens at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HardReason {
    /// Connecting failed or timed out: the peer is not there.
    Dial,
    /// A validated protocol violation, e.g. a complete block of the wrong length or one the
    /// validator rejected.
    Validation,
}

impl fmt::Display for HardReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HardReason::Dial => "dial",
            HardReason::Validation => "validation",
        })
    }
}

/// How a request ended, as far as the peer's health is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// The peer answered: a block, a 404, or an upstream-credential refusal it relayed correctly.
    /// Clears the failure count; a probe's answer counts towards closing.
    Answered,
    /// The caller went away (hedge loser, client gone) while the request ran. Recorded exactly as
    /// [`Outcome::Answered`] (peer.md §3.5: the peer is not charged and a probe slot is
    /// released by counting it answered); counted apart for metrics.
    Cancelled,
    /// A timeout of our own, an unexpected status, an interrupted body: spends one unit of the
    /// failure budget; a probe's soft failure reopens.
    SoftFailure,
    /// A definitive failure: opens at once.
    HardFailure(HardReason),
    /// The permit was dropped without anybody reporting an outcome. Carries no information about
    /// the peer: a data or roster request records nothing, a probe gives its slot back without
    /// counting as a success (and without reopening: its caller going away says nothing about
    /// the peer).
    Abandoned,
}

/// What [`super::Breaker::complete`] did with a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Disposition {
    /// The report belonged to the current generation and was applied.
    Applied,
    /// The circuit has moved on (opened or recovered) since the request started: ignored.
    Superseded,
    /// The entry the request started under was evicted: ignored, and not recreated.
    Forgotten,
    /// The breaker is disabled: ignored.
    Untracked,
}

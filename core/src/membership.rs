//! Cluster membership views (spec/cluster.md §1–§3): members, canonical views, the Ready set
//! that placement ranks, the epoch, and member-id validation.
//!
//! A [`View`] is an immutable, canonical snapshot: construction sorts by id and keeps one entry
//! per id (the one most able to serve), so input order never matters and two nodes with the same
//! membership compute the same view and the same epoch.

use crate::hash::epoch;
use std::fmt;
use thiserror::Error;

/// A member's lifecycle state. Only `Ready` members take part in placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemberState {
    /// Announced, not serving yet.
    Joining,
    /// Serving.
    Ready,
    /// Possibly failed; still tried for reads, not placed on.
    Suspect,
    /// Going away.
    Leaving,
}

impl MemberState {
    /// Dedup rank: the state "most able to serve" wins for a duplicated id.
    fn rank(self) -> u8 {
        match self {
            MemberState::Ready => 3,
            MemberState::Suspect => 2,
            MemberState::Joining => 1,
            MemberState::Leaving => 0,
        }
    }
}

impl fmt::Display for MemberState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemberState::Joining => "Joining",
            MemberState::Ready => "Ready",
            MemberState::Suspect => "Suspect",
            MemberState::Leaving => "Leaving",
        })
    }
}

/// Why a member id was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MemberIdError {
    /// The id was empty.
    #[error("member id is empty")]
    Empty,
    /// The id holds a byte outside visible ASCII (0x21..=0x7E), e.g. a space or a separator.
    #[error("member id {id:?} has byte 0x{byte:02x} outside visible ASCII 0x21-0x7E")]
    NotVisibleAscii {
        /// The offending id (escaped when printed).
        id: String,
        /// The first offending byte.
        byte: u8,
    },
}

/// Checks a member id: non-empty, every byte visible ASCII (ADR-0002: the epoch framing uses
/// 0x1F/0x1E, so ids must never contain them; sanitising was rejected as two ids could collide).
pub fn validate_member_id(id: &str) -> Result<(), MemberIdError> {
    if id.is_empty() {
        return Err(MemberIdError::Empty);
    }
    match id.bytes().find(|b| !(0x21..=0x7e).contains(b)) {
        Some(byte) => Err(MemberIdError::NotVisibleAscii { id: id.to_owned(), byte }),
        None => Ok(()),
    }
}

/// One member of the cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// Stable id (the node name, never a pod IP).
    pub id: String,
    /// Peer-plane address `host:port`.
    pub addr: String,
    /// Placement weight as stored; `<= 0` (or NaN) ranks as 1.
    pub weight: f64,
    /// Lifecycle state.
    pub state: MemberState,
}

impl Member {
    /// A Ready member of weight 1.
    pub fn ready(id: &str, addr: &str) -> Self {
        Member { id: id.to_owned(), addr: addr.to_owned(), weight: 1.0, state: MemberState::Ready }
    }
}

/// An immutable canonical membership snapshot. Clones share one copy of the member list and
/// one memo of HRW rankings and of the address index (a simulated cluster of N nodes holds one
/// of each, not N).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct View {
    members: std::sync::Arc<[Member]>,
    ready: std::sync::Arc<[usize]>,
    epoch: u64,
    rankings: Rankings,
}

/// Most chunks whose rankings a view keeps; past it the memo starts again.
pub const RANKINGS_MAX: usize = 1024;

/// One chunk's HRW ranking of the Ready members (their indices in [`View::ready`], best first)
/// and its inverse: `positions[k]` is where Ready member `k` stands in `order`.
#[derive(Clone, Debug)]
pub struct Ranking {
    /// Ready indices, best ranked first.
    pub order: std::sync::Arc<[u32]>,
    /// `order`'s inverse: the rank of each Ready index.
    pub positions: std::sync::Arc<[u32]>,
}

/// Memos of pure functions of a view, shared by its clones: HRW rankings by chunk key, and the
/// Ready members by address. They never make two views differ (equal whatever they hold).
#[derive(Clone, Default)]
struct Rankings(std::sync::Arc<Memos>);

#[derive(Default)]
struct Memos {
    rankings: std::sync::Mutex<std::collections::BTreeMap<u64, Ranking>>,
    addresses: std::sync::OnceLock<Addresses>,
    /// The roster wire form of the view and its tag ([`crate::codec::roster::roster_body`]).
    roster: std::sync::OnceLock<(bytes::Bytes, u64)>,
}

/// The Ready members by address (their indices in [`View::ready`]).
struct Addresses {
    /// Those with an empty address, ascending.
    none: Vec<u32>,
    /// Those with an address, ordered by address (then index).
    by_addr: Vec<u32>,
}

impl PartialEq for Rankings {
    fn eq(&self, _: &Rankings) -> bool {
        true
    }
}

impl fmt::Debug for Rankings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Rankings")
    }
}

impl View {
    /// Canonicalises `members`: sorted by id (then state rank descending, weight ascending), one
    /// entry per id. Does not validate ids (ingress does).
    pub fn new(mut members: Vec<Member>) -> Self {
        members.sort_by(|a, b| {
            a.id.cmp(&b.id)
                .then(b.state.rank().cmp(&a.state.rank()))
                .then(a.weight.total_cmp(&b.weight))
        });
        members.dedup_by(|later, first| later.id == first.id);
        let ready =
            (0..members.len()).filter(|&i| members[i].state == MemberState::Ready).collect();
        let epoch = epoch(members.iter().map(|m| (m.id.as_str(), m.weight)));
        let view = View { members: members.into(), ready, epoch, rankings: Rankings::default() };
        view.check_invariants();
        view
    }

    /// Every member, sorted by id.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Ready members, sorted by id: the only input to placement.
    pub fn ready(&self) -> impl ExactSizeIterator<Item = &Member> + '_ {
        self.ready.iter().map(|&i| &self.members[i])
    }

    /// The `k`-th Ready member in id order (the index HRW rankings are over).
    pub fn ready_member(&self, k: usize) -> &Member {
        &self.members[self.ready[k]]
    }

    /// The Ready members (their indices in [`View::ready`]) ranked for `key` by HRW, best
    /// first; memoised, and shared by every clone of this view.
    pub fn ranking(&self, key: u64) -> std::sync::Arc<[u32]> {
        self.ranking_with_positions(key).order
    }

    /// [`View::ranking`] with its inverse (each Ready member's rank), from the same memo.
    pub fn ranking_with_positions(&self, key: u64) -> Ranking {
        let memos = &self.rankings.0;
        let lock = || memos.rankings.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(ranking) = lock().get(&key) {
            return ranking.clone();
        }
        let ready: Vec<(&str, f64)> = self.ready().map(|m| (m.id.as_str(), m.weight)).collect();
        let order: std::sync::Arc<[u32]> = crate::hrw::rank(key, &ready)
            .into_iter()
            .map(|i| u32::try_from(i).expect("fewer than 2^32 members"))
            .collect();
        let mut positions = vec![0u32; order.len()];
        for (rank, &k) in order.iter().enumerate() {
            positions[k as usize] = u32::try_from(rank).expect("fewer than 2^32 members");
        }
        let ranking = Ranking { order, positions: positions.into() };
        let mut memo = lock();
        if memo.len() >= RANKINGS_MAX {
            memo.clear();
        }
        memo.insert(key, ranking.clone());
        ranking
    }

    /// The index in [`View::ready`] of the Ready member `id`, found by bisection.
    pub fn ready_index(&self, id: &str) -> Option<u32> {
        let k = self.ready.binary_search_by(|&i| self.members[i].id.as_str().cmp(id)).ok()?;
        Some(u32::try_from(k).expect("fewer than 2^32 members"))
    }

    /// The Ready members (indices in [`View::ready`], ascending) with no address.
    pub fn ready_without_addr(&self) -> &[u32] {
        &self.addresses().none
    }

    /// The Ready members (indices in [`View::ready`]) whose address is `addr` (non-empty).
    pub fn ready_at_addr(&self, addr: &str) -> &[u32] {
        let by_addr = &self.addresses().by_addr;
        let addr_of = |k: &u32| self.ready_member(*k as usize).addr.as_str();
        let from = by_addr.partition_point(|k| addr_of(k) < addr);
        let to = from + by_addr[from..].partition_point(|k| addr_of(k) == addr);
        &by_addr[from..to]
    }

    /// The address index, built on first use and shared by every clone.
    fn addresses(&self) -> &Addresses {
        self.rankings.0.addresses.get_or_init(|| {
            let all = (0..self.ready.len()).map(|k| u32::try_from(k).expect("fewer than 2^32"));
            let (none, mut by_addr): (Vec<u32>, Vec<u32>) =
                all.partition(|&k| self.ready_member(k as usize).addr.is_empty());
            by_addr.sort_by(|&a, &b| {
                let addr = |k: u32| self.ready_member(k as usize).addr.as_str();
                addr(a).cmp(addr(b)).then(a.cmp(&b))
            });
            Addresses { none, by_addr }
        })
    }

    /// `make`'s value once per view, shared by every clone: the roster body of the view and its
    /// tag, for [`crate::codec::roster::roster_body`] (which alone calls it, with one function).
    pub(crate) fn roster_memo(
        &self,
        make: impl FnOnce() -> (bytes::Bytes, u64),
    ) -> (bytes::Bytes, u64) {
        self.rankings.0.roster.get_or_init(make).clone()
    }

    /// Number of Ready members.
    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// The member with this id.
    pub fn get(&self, id: &str) -> Option<&Member> {
        self.members.binary_search_by(|m| m.id.as_str().cmp(id)).ok().map(|i| &self.members[i])
    }

    /// The epoch over `(id, weight)` of every member, state and address excluded.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Asserts the view's invariants.
    pub fn check_invariants(&self) {
        for w in self.members.windows(2) {
            assert!(w[0].id < w[1].id, "members sorted by id, unique");
        }
        assert!(self.ready.iter().all(|&i| self.members[i].state == MemberState::Ready));
    }
}

/// Why a `--peers` list was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PeersError {
    /// An entry was not `id@host:port` with both parts non-empty.
    #[error("peer entry {0:?} is not id@host:port")]
    Entry(String),
    /// An entry's id is invalid.
    #[error(transparent)]
    Id(#[from] MemberIdError),
    /// The list named no peer.
    #[error("peer list is empty")]
    Empty,
}

/// Parses a fixed member list `id@host:port,...` (blanks skipped); all Ready, weight 1.
pub fn parse_peers(list: &str) -> Result<Vec<Member>, PeersError> {
    let mut out = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (id, addr) = entry.split_once('@').ok_or_else(|| PeersError::Entry(entry.into()))?;
        if id.is_empty() || addr.is_empty() || !addr.contains(':') {
            return Err(PeersError::Entry(entry.into()));
        }
        validate_member_id(id)?;
        out.push(Member::ready(id, addr));
    }
    if out.is_empty() {
        return Err(PeersError::Empty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: &str, w: f64, s: MemberState) -> Member {
        Member { id: id.into(), addr: format!("{id}:9000"), weight: w, state: s }
    }

    #[test]
    fn epoch_matches_the_golden_membership_whatever_the_states() {
        let v = View::new(vec![
            m("node-c", 1.0, MemberState::Ready),
            m("node-a", 1.0, MemberState::Ready),
            m("node-b", 2.0, MemberState::Suspect),
        ]);
        assert_eq!(v.epoch(), 448884658194799021);
        assert_eq!(View::new(vec![]).epoch(), 17280346270528514342);
    }

    #[test]
    fn epoch_excludes_state_and_address() {
        let a = View::new(vec![m("x", 1.0, MemberState::Ready)]);
        let mut other = m("x", 1.0, MemberState::Joining);
        other.addr = "elsewhere:1".into();
        assert_eq!(a.epoch(), View::new(vec![other]).epoch());
    }

    #[test]
    fn a_duplicate_id_keeps_its_serving_report_whatever_the_order() {
        let joining = m("a", 1.0, MemberState::Joining);
        let ready = m("a", 1.0, MemberState::Ready);
        for input in [vec![joining.clone(), ready.clone()], vec![ready.clone(), joining.clone()]] {
            let v = View::new(input);
            assert_eq!(v.members().len(), 1);
            assert_eq!(v.get("a").map(|x| x.state), Some(MemberState::Ready));
        }
    }

    #[test]
    fn only_ready_members_are_placed() {
        let v = View::new(vec![
            m("a", 1.0, MemberState::Ready),
            m("b", 1.0, MemberState::Suspect),
            m("c", 1.0, MemberState::Joining),
            m("d", 1.0, MemberState::Ready),
        ]);
        let ids: Vec<_> = v.ready().map(|x| x.id.as_str()).collect();
        assert_eq!(ids, ["a", "d"]);
    }

    #[test]
    fn member_ids_must_be_visible_ascii() {
        for good in [
            "node-a",
            "worker-0.default.svc",
            "10.0.0.1",
            "a",
            "550e8400-e29b-41d4-a716-446655440000",
        ] {
            assert_eq!(validate_member_id(good), Ok(()), "{good}");
        }
        for bad in ["", "a\u{1f}b", "a\u{1e}b", "a\nb", "a b", "\t", "node\0", "nödé"] {
            assert!(validate_member_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn peers_flag_parses_id_at_address_lists() {
        let got = parse_peers(" a@h1:9000, ,b@h2:9000 ").expect("parses");
        assert_eq!(got, vec![Member::ready("a", "h1:9000"), Member::ready("b", "h2:9000")]);
        assert_eq!(parse_peers(""), Err(PeersError::Empty));
        assert!(matches!(parse_peers("a@"), Err(PeersError::Entry(_))));
        assert!(matches!(parse_peers("@h:1"), Err(PeersError::Entry(_))));
        assert!(matches!(parse_peers("a b@h:1"), Err(PeersError::Id(_))));
    }
}

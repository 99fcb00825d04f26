//! Placement and routing decisions over a membership view (spec/geometry.md §4–§5, seeds/engine.md
//! §3.3, §3.5, §3.7): who owns a chunk, which ancestors a node pulls a missed block from, and
//! whether a peer's relay request is declined before any work is done.

use super::{BlockClass, Engine, ObjectInfo};
use crate::codec::wire::MAX_HOP;
use crate::hash::{BlockKey, ChunkKey};
use crate::membership::View;
use crate::tree::Tree;
use thiserror::Error;

/// The tree fanout beyond [`CHAIN_MEMBERS_MAX`] members under [`AUTO_FANOUT`].
pub const DEFAULT_FANOUT: usize = 2;
/// A fanout of 0 asks for [`auto_fanout`] (the node's default, `--fanout 0`).
pub const AUTO_FANOUT: usize = 0;
/// Most members a tree of fanout 1 (a chain) is laid over under [`AUTO_FANOUT`].
pub const CHAIN_MEMBERS_MAX: usize = 16;

/// The fanout of the tree laid over `members` usable members when the fanout is automatic: a
/// chain (fanout 1) up to [`CHAIN_MEMBERS_MAX`] members, else [`DEFAULT_FANOUT`].
///
/// A node of fanout `k` uploads each block `k` times, so where links are the bottleneck a herd
/// takes about `k` times one read alone: measured on 8 real nodes at 100 Mbit/s reading 128 MiB,
/// fanout 2 took 23.3 s against 11.4 s alone, a chain 11.3 s (`docs/benchmarks.md`). Relays cut
/// through, so a chain's depth costs only per-hop latency, which is why it stops at a depth of
/// 15: past it a cold read's hops, a stall's reach and the relay hop bound grow with the cluster,
/// and a binary tree is used instead.
pub fn auto_fanout(members: usize) -> usize {
    if members <= CHAIN_MEMBERS_MAX {
        1
    } else {
        DEFAULT_FANOUT
    }
}
/// Default number of HRW owners of a chunk.
pub const DEFAULT_REPLICAS: usize = 1;
/// Most upstream candidates a read considers for one block (primary and backup).
pub const UPSTREAMS_MAX: usize = 2;

/// A peer to ask.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PeerRef {
    /// Member id.
    pub id: String,
    /// Peer-plane address.
    pub addr: String,
}

/// Most chunk rankings a view remembers (shared by its clones); past it the memo is cleared
/// (rankings are pure functions of the view, so forgetting costs only recomputation).
pub use crate::membership::RANKINGS_MAX;

/// This node's place in a cluster: the view, its own id, and the tree parameters.
#[derive(Clone, Debug)]
pub struct Placement {
    view: View,
    self_id: String,
    fanout: usize,
    replicas: usize,
    /// This node's index in the Ready list, if it is Ready.
    self_ready: Option<u32>,
    /// The last reader set seen and which Ready members it names: consecutive reads of one
    /// object route over the same set, so the set is matched against the view once, not once
    /// per candidate per block.
    readers_memo: std::cell::RefCell<Option<(ReadersKey, std::sync::Arc<ReaderFlags>)>>,
    /// The last answer of [`Placement::upstreams_tagged`] and what it was asked: the blocks of
    /// one chunk are looked up one after another with the same readers and the same circuits.
    upstreams_memo: std::cell::RefCell<Option<UpstreamsMemo>>,
}

/// Which reader set a memo of [`ReaderFlags`] is of: a tagged set by its tag (no copy of the
/// set is kept), an untagged one by its contents.
#[derive(Clone, Debug)]
enum ReadersKey {
    Tag(u64),
    Set(Vec<String>),
}

/// An answer of [`Placement::upstreams_tagged`] with its question.
#[derive(Clone, Debug)]
struct UpstreamsMemo {
    chunk: ChunkKey,
    /// The reader set's tag, if the tree was asked over one.
    readers: Option<u64>,
    /// The addresses whose circuits refused.
    refused: Vec<String>,
    out: Vec<PeerRef>,
}

/// Which Ready members a reader set names (by Ready index, with an address), and whether it
/// names this node. O(readers), not O(members): a bitmap over the view cost every node of a
/// 10,000-member cluster 10 KB per reader set (about 100 MB in the 10,000-node herd).
#[derive(Debug)]
struct ReaderFlags {
    /// The Ready indices of the readers, ascending and unique.
    list: Vec<u32>,
    names_self: bool,
}

impl ReaderFlags {
    /// Whether the set names Ready member `k` (O(log readers)).
    fn names(&self, k: u32) -> bool {
        self.list.binary_search(&k).is_ok()
    }
}

impl Placement {
    /// A placement for `self_id` over `view`; fanout 0 is [`AUTO_FANOUT`] (see
    /// [`auto_fanout`]), replicas < 1 becomes 1.
    pub fn new(view: View, self_id: &str, fanout: usize, replicas: usize) -> Self {
        let self_ready = view.ready_index(self_id);
        Placement {
            view,
            self_id: self_id.to_owned(),
            fanout,
            replicas: replicas.max(1),
            self_ready,
            readers_memo: Default::default(),
            upstreams_memo: Default::default(),
        }
    }

    /// The view.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// The same placement over another view (a membership change); the rankings are the new
    /// view's.
    pub fn with_view(&self, view: View) -> Placement {
        Placement::new(view, &self.self_id, self.fanout, self.replicas)
    }

    /// This node's id.
    pub fn self_id(&self) -> &str {
        &self.self_id
    }

    /// Ready members ranked for `chunk`, best first (ids).
    pub fn ranked(&self, chunk: ChunkKey) -> Vec<&str> {
        let order = self.ranking(chunk);
        let ready: Vec<&str> = self.view.ready().map(|m| m.id.as_str()).collect();
        order.iter().map(|&i| ready[i as usize]).collect()
    }

    /// The first of [`Placement::ranked`] (its id), without building the list.
    pub fn first_ranked(&self, chunk: ChunkKey) -> Option<&str> {
        let order = self.ranking(chunk);
        let first = *order.first()?;
        Some(self.view.ready_member(first as usize).id.as_str())
    }

    /// When this node is the home of `chunk` (first of [`Placement::ranked`]), the member ranked
    /// next: the one every reader's tree puts at the top while the home is unusable to them (a
    /// dead home is *replaced* by it). `None` when this node is not the home, or is alone.
    pub fn successor(&self, chunk: ChunkKey) -> Option<PeerRef> {
        let order = self.ranking(chunk);
        if order.first().copied() != self.self_ready {
            return None;
        }
        let m = self.view.ready_member(*order.get(1)? as usize);
        (!m.addr.is_empty()).then(|| PeerRef { id: m.id.clone(), addr: m.addr.clone() })
    }

    /// [`ReaderFlags`] of `readers` (any order; `tag`: its grant's tag, if it has one), from the
    /// memo when it is the last set seen.
    fn reader_flags(&self, readers: &[String], tag: Option<u64>) -> std::sync::Arc<ReaderFlags> {
        if let Some((key, flags)) = self.readers_memo.borrow().as_ref() {
            let same = match (key, tag) {
                (ReadersKey::Tag(memo), Some(tag)) => *memo == tag,
                (ReadersKey::Set(set), None) => set.as_slice() == readers,
                _ => false,
            };
            if same {
                return flags.clone();
            }
        }
        // Each reader looked up in the view (O(readers · log members)) rather than each member
        // in the set: a set is bounded (tracker READERS_MAX), a view is not.
        let mut list: Vec<u32> = readers
            .iter()
            .filter_map(|id| self.view.ready_index(id))
            .filter(|&k| !self.view.ready_member(k as usize).addr.is_empty())
            .collect();
        list.sort_unstable();
        list.dedup();
        let names_self = readers.contains(&self.self_id);
        let flags = std::sync::Arc::new(ReaderFlags { list, names_self });
        let key = match tag {
            Some(tag) => ReadersKey::Tag(tag),
            None => ReadersKey::Set(readers.to_vec()),
        };
        *self.readers_memo.borrow_mut() = Some((key, flags.clone()));
        flags
    }

    fn ranking(&self, chunk: ChunkKey) -> std::sync::Arc<[u32]> {
        self.view.ranking(chunk.0)
    }

    /// Owned iff this node is among the first `replicas` of the ranking over all Ready members.
    pub fn class_of(&self, chunk: ChunkKey) -> BlockClass {
        // By Ready-list index, as `ranked` would give it by id: no list of ids is built.
        let order = self.ranking(chunk);
        if order.iter().take(self.replicas).any(|&k| Some(k) == self.self_ready) {
            BlockClass::Owned
        } else {
            BlockClass::Borrowed
        }
    }

    /// The ancestors to pull a missed block of `chunk` from, nearest first, at most
    /// [`UPSTREAMS_MAX`]. Empty: this node is the root — fetch the origin. A node outside the
    /// ranked set may only ask rank 0.
    ///
    /// The tree is laid over the members that are usable from here (known, with an address, and
    /// `usable(addr)`, i.e. circuit not open), not over all of them: a dead member is *replaced*
    /// — the next-ranked member takes its place for everyone who sees it dead — instead of each
    /// of its descendants falling to the origin on its own. Every ancestor in any such tree is
    /// better ranked than its descendant, so nodes that disagree about who is dead still never
    /// ask each other in a cycle.
    pub fn upstreams(&self, chunk: ChunkKey, usable: impl Fn(&str) -> bool) -> Vec<PeerRef> {
        self.upstreams_among(chunk, None, usable)
    }

    /// [`Placement::upstreams_among`] over a tagged reader set (the set and its
    /// [`crate::tracker::ReaderCache::peek_tagged`] tag: one tag, one set) with every member
    /// usable but the addresses in `refused` (the circuits that refuse now). Asked again with
    /// the same chunk, tag and refusals, it answers from a memo of the last answer instead of
    /// walking the ranking again.
    pub fn upstreams_tagged(
        &self,
        chunk: ChunkKey,
        readers: Option<(&[String], u64)>,
        refused: &[&String],
    ) -> Vec<PeerRef> {
        let tag = readers.map(|(_, tag)| tag);
        if let Some(m) = self.upstreams_memo.borrow().as_ref() {
            let same_refused = m.refused.len() == refused.len()
                && m.refused.iter().zip(refused).all(|(a, b)| a == *b);
            if m.chunk == chunk && m.readers == tag && same_refused {
                return m.out.clone();
            }
        }
        let out = self.upstreams_refusing(chunk, readers, refused);
        let refused = refused.iter().map(|r| (*r).clone()).collect();
        *self.upstreams_memo.borrow_mut() =
            Some(UpstreamsMemo { chunk, readers: tag, refused, out: out.clone() });
        out
    }

    /// [`Placement::upstreams`] with the tree laid over an object's readers (the tracker's reader
    /// set, spec/tracker.md §5) instead of over every Ready member: the readers known in the view
    /// with an address, when at least two remain and this node is one of them; else over every
    /// Ready member.
    ///
    /// The readers' tree hangs below the chunk's home, the root of the tree over every member
    /// (the best-ranked usable member), which is its root whether or not it reads: only the home
    /// reads the origin, so readers that come after the set has changed or lapsed, or that
    /// route over every member, still find the chunk cached at the home instead of paying the
    /// origin again (spec/tracker.md §5 has the best-ranked reader read the origin; in the
    /// `some-read-staggered` scenario that cost 1.7x the object). A home that does not read
    /// routes its relay reads over every member, where it is the root.
    ///
    /// A node the published set does not name yet (it joined since the tracker's last tick)
    /// routes over every member, unlike spec/tracker.md §5, under which it would still use the
    /// set. Both readings of that are worse: asking the set's first reader, which may rank below
    /// this node and, routing over every member, ask it back (a cycle only the hop bound ends);
    /// or taking its place among the readers, which in a cold herd makes every node ranked above
    /// the first joiner a root that reads the origin until the next tick.
    ///
    /// HRW ranks every member independently, so the order among the readers is the order of the
    /// full ranking: every ancestor in a readers' tree is better ranked than its descendant in any
    /// tree, and nodes that route over different sets (another reader set, or none) still never
    /// ask each other in a cycle.
    pub fn upstreams_among(
        &self,
        chunk: ChunkKey,
        readers: Option<&[String]>,
        usable: impl Fn(&str) -> bool,
    ) -> Vec<PeerRef> {
        self.upstreams_over(chunk, readers.map(|set| (set, None)), usable)
    }

    /// [`Placement::upstreams_over`]'s answer with every member usable but those at a `refused`
    /// address, found from the members the tree leaves out instead of by a walk over the whole
    /// ranking: O((left out + reader set) · log) per question, not O(members), so a node of a
    /// cluster of 10,000 pays for the members it cannot ask and the readers, not for every
    /// member (a new reader set costs O(readers · log members), [`Placement::reader_flags`]).
    /// The tree is the same: `the_tree_from_the_members_left_out_is_the_tree_of_the_whole_walk`
    /// checks the two against each other.
    fn upstreams_refusing(
        &self,
        chunk: ChunkKey,
        readers: Option<(&[String], u64)>,
        refused: &[&String],
    ) -> Vec<PeerRef> {
        let ranking = self.view.ranking_with_positions(chunk.0);
        let (order, rank) = (&ranking.order, &ranking.positions);
        let n = order.len();
        let is_self = |k: u32| Some(k) == self.self_ready;
        // The Ready members that are neither this node nor askable (no address, or a refused
        // one), ascending and unique; and their ranks, ascending.
        let mut out_of_reach: Vec<u32> = self.view.ready_without_addr().to_vec();
        for addr in refused {
            out_of_reach.extend_from_slice(self.view.ready_at_addr(addr));
        }
        out_of_reach.retain(|&k| !is_self(k));
        out_of_reach.sort_unstable();
        out_of_reach.dedup();
        let askable = |k: u32| !is_self(k) && out_of_reach.binary_search(&k).is_err();
        let as_peer = |k: u32| {
            let m = self.view.ready_member(k as usize);
            PeerRef { id: m.id.clone(), addr: m.addr.clone() }
        };
        let mut skipped: Vec<u32> = out_of_reach.iter().map(|&k| rank[k as usize]).collect();
        skipped.sort_unstable();
        // The `j`-th rank (from 0) that is not skipped.
        let nth_kept = |j: usize| {
            let mut at = j;
            for &x in &skipped {
                if x as usize <= at {
                    at += 1;
                } else {
                    break;
                }
            }
            at
        };
        // Over the readers and the chunk's home (the best-ranked member this node or askable),
        // as `upstreams_over` decides it.
        let mut over_readers = None;
        if let Some((readers, tag)) = readers {
            let flags = self.reader_flags(readers, Some(tag));
            if flags.list.len() >= 2 && flags.names_self {
                let home = Some(nth_kept(0)).filter(|&at| at < n).map(|at| order[at]);
                over_readers = Some((flags, home));
            }
        }
        let in_tree = |k: u32| match &over_readers {
            None => true,
            Some((flags, home)) => flags.names(k) || Some(k) == *home,
        };
        let me = match self.self_ready {
            Some(me) if in_tree(me) => me,
            // Outside the tree: the best-ranked member in it, if askable.
            _ => {
                let first = match &over_readers {
                    None => order.first().copied(),
                    Some((flags, home)) => {
                        flags.list.iter().chain(home).copied().min_by_key(|&k| rank[k as usize])
                    }
                };
                return first.filter(|&k| askable(k)).map(as_peer).into_iter().collect();
            }
        };
        let my_rank = rank[me as usize];
        // The tree's size, this node's position in it, and (over readers) the ranks of the
        // members in it ranked above this node, ascending: the tree's first positions.
        let (live, position, readers_above) = match &over_readers {
            None => {
                let position = my_rank as usize - skipped.partition_point(|&x| x < my_rank);
                (n - skipped.len(), position, None)
            }
            Some((flags, home)) => {
                let home_extra = home.filter(|&h| !flags.names(h));
                let tree = flags.list.iter().chain(home_extra.iter()).copied();
                let ranks: Vec<u32> =
                    tree.filter(|&k| is_self(k) || askable(k)).map(|k| rank[k as usize]).collect();
                let live = ranks.len();
                let mut above: Vec<u32> = ranks.into_iter().filter(|&r| r < my_rank).collect();
                above.sort_unstable();
                (live, above.len(), Some(above))
            }
        };
        let above = |i: usize| match &readers_above {
            None => nth_kept(i),
            Some(ranks) => ranks[i] as usize,
        };
        let fanout = if self.fanout == AUTO_FANOUT { auto_fanout(live) } else { self.fanout };
        Tree::new(live, fanout)
            .ancestors(position)
            .map(|i| as_peer(order[above(i)]))
            .take(UPSTREAMS_MAX)
            .collect()
    }

    /// [`Placement::upstreams_among`] with the reader set's tag, if it has one.
    fn upstreams_over(
        &self,
        chunk: ChunkKey,
        readers: Option<(&[String], Option<u64>)>,
        usable: impl Fn(&str) -> bool,
    ) -> Vec<PeerRef> {
        // Ready members by their index in the Ready list (what rankings hold): no look-up by id
        // and no string comparison against this node's id per candidate.
        let order = self.ranking(chunk);
        let member = |k: u32| self.view.ready_member(k as usize);
        let is_self = |k: u32| Some(k) == self.self_ready;
        let askable = |k: u32| {
            let m = member(k);
            !is_self(k) && !m.addr.is_empty() && usable(&m.addr)
        };
        let as_peer = |k: u32| {
            let m = member(k);
            PeerRef { id: m.id.clone(), addr: m.addr.clone() }
        };
        // The members the tree is laid over, in ranking order: every Ready member, or the readers
        // and the chunk's home (the root of the tree over every member, as this node sees it)
        // when at least two readers are known and this node is one of them. One pass over the
        // ranking, nothing collected but the live members ranked above this node.
        let mut over_readers = None;
        if let Some((readers, tag)) = readers {
            let flags = self.reader_flags(readers, tag);
            if flags.list.len() >= 2 && flags.names_self {
                let home = order.iter().copied().find(|&k| is_self(k) || askable(k));
                over_readers = Some((flags, home));
            }
        }
        let in_tree = |k: u32| match &over_readers {
            None => true,
            Some((flags, home)) => flags.names(k) || Some(k) == *home,
        };
        if !self.self_ready.is_some_and(in_tree) {
            return order
                .iter()
                .copied()
                .find(|&k| in_tree(k))
                .filter(|&k| askable(k))
                .map(as_peer)
                .into_iter()
                .collect();
        }
        // `above`: the live members ranked above this node (its position in the live list is
        // `above.len()`); `live`: how many there are in all (the tree's shape depends on it).
        let mut above: Vec<u32> = Vec::new();
        let mut me = None;
        let mut live = 0;
        for k in order.iter().copied().filter(|&k| in_tree(k)) {
            if is_self(k) {
                me = Some(live);
            } else if !askable(k) {
                continue;
            } else if me.is_none() {
                above.push(k);
            }
            live += 1;
        }
        let me = me.expect("self is in the tree");
        debug_assert_eq!(me, above.len());
        let fanout = if self.fanout == AUTO_FANOUT { auto_fanout(live) } else { self.fanout };
        let tree = Tree::new(live, fanout);
        let out: Vec<PeerRef> = tree
            .ancestors(me)
            .filter(|&i| askable(above[i]))
            .map(|i| as_peer(above[i]))
            .take(UPSTREAMS_MAX)
            .collect();
        debug_assert!(out.len() <= UPSTREAMS_MAX);
        out
    }
}

/// Why a relay request is declined: a 404 to the requester, never charged to this relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RelayDecline {
    /// The block index cannot be represented in signed range arithmetic (issue #52).
    #[error("block index above the geometry maximum")]
    IndexOverflow,
    /// The wire chunk key disagrees with the origin URL's identity, namespace and chunk.
    #[error("chunk key does not match the origin URL")]
    ChunkMismatch,
    /// The relay chain reached the hop bound.
    #[error("hop bound reached")]
    HopLimit,
    /// The object's origin ignores Range: the requester proxies it itself.
    #[error("object is Range-blind")]
    RangeBlind,
}

/// What a relay may do for a peer's block request that passed the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayPlan {
    /// Serve only what the local store holds (no `X-DART-Origin`).
    CacheOnly,
    /// Serve from the store, else fetch on the requester's behalf with this hop.
    FetchOnBehalf {
        /// Hop to send upstream (`hop + 1`).
        next_hop: u64,
    },
}

/// Checks a peer's relay request before any cache lookup, probe or upstream access, in the order
/// that keeps overflowing indices away from all arithmetic.
pub fn relay_check(
    engine: &Engine,
    key: BlockKey,
    origin_url: Option<&str>,
    hop: u64,
) -> Result<RelayPlan, RelayDecline> {
    let geometry = engine.config().geometry;
    if key.block > geometry.max_block_index() {
        return Err(RelayDecline::IndexOverflow);
    }
    let Some(url) = origin_url else {
        return Ok(RelayPlan::CacheOnly);
    };
    let id = engine.identify(url);
    if engine.block_key(&id, key.block) != key {
        return Err(RelayDecline::ChunkMismatch);
    }
    if hop >= MAX_HOP {
        return Err(RelayDecline::HopLimit);
    }
    if engine.object(&id) == Some(ObjectInfo::RangeBlind) {
        return Err(RelayDecline::RangeBlind);
    }
    Ok(RelayPlan::FetchOnBehalf { next_hop: hop + 1 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineConfig;
    use crate::membership::Member;

    fn view(n: usize) -> View {
        View::new(
            (0..n).map(|i| Member::ready(&format!("node-{i:02}"), &format!("h{i}:9000"))).collect(),
        )
    }

    /// `upstreams_among` as it was before it worked on Ready-list indices (ids looked up in
    /// the view, readers scanned linearly): the reference the faster one must equal.
    fn reference_upstreams_among(
        p: &Placement,
        chunk: ChunkKey,
        readers: Option<&[String]>,
        usable: impl Fn(&str) -> bool,
    ) -> Vec<PeerRef> {
        let mut ranked = p.ranked(chunk);
        let as_peer = |id: &str| {
            let m = p.view.get(id)?;
            (!m.addr.is_empty() && m.id != p.self_id && usable(&m.addr))
                .then(|| PeerRef { id: m.id.clone(), addr: m.addr.clone() })
        };
        if let Some(readers) = readers {
            let known = |id: &str| p.view.get(id).is_some_and(|m| !m.addr.is_empty());
            let is_reader = |id: &str| known(id) && readers.iter().any(|r| r == id);
            // The chunk's home: the root of the tree over every member, as this node sees it.
            let home = ranked.iter().copied().find(|id| *id == p.self_id || as_peer(id).is_some());
            let among: Vec<&str> =
                ranked.iter().copied().filter(|id| is_reader(id) || Some(*id) == home).collect();
            let readers_known = among.iter().filter(|id| is_reader(id)).count();
            if readers_known >= 2 && readers.contains(&p.self_id) {
                ranked = among;
            }
        }
        if !ranked.contains(&p.self_id.as_str()) {
            return ranked.first().and_then(|id| as_peer(id)).into_iter().collect();
        }
        let live: Vec<&str> =
            ranked.iter().copied().filter(|id| *id == p.self_id || as_peer(id).is_some()).collect();
        let me = live.iter().position(|id| *id == p.self_id).expect("self is kept");
        let fanout = if p.fanout == AUTO_FANOUT { auto_fanout(live.len()) } else { p.fanout };
        let tree = Tree::new(live.len(), fanout);
        let out: Vec<PeerRef> =
            tree.ancestors(me).filter_map(|i| as_peer(live[i])).take(UPSTREAMS_MAX).collect();
        debug_assert!(out.len() <= UPSTREAMS_MAX);
        out
    }

    #[test]
    fn upstreams_among_equals_the_reference_over_random_views_readers_and_circuits() {
        use rand::{Rng as _, SeedableRng as _};
        let seed = 0x5eed_u64;
        println!("seed {seed}");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for case in 0..400 {
            let n = rng.random_range(1..40usize);
            let mut members: Vec<Member> = (0..n)
                .map(|i| {
                    let addr =
                        if rng.random_bool(0.1) { String::new() } else { format!("n{i}:9000") };
                    Member { addr, ..Member::ready(&format!("n{i}"), "x") }
                })
                .collect();
            if rng.random_bool(0.2) {
                members.retain(|m| m.id != "n0");
            }
            let view = View::new(members);
            let me = format!("n{}", rng.random_range(0..n + 2));
            let fanout = [0, 1, 2, 3][rng.random_range(0..4)];
            let p = Placement::new(view, &me, fanout, 1);
            let readers: Option<Vec<String>> = rng.random_bool(0.6).then(|| {
                (0..n + 2).filter(|_| rng.random_bool(0.4)).map(|i| format!("n{i}")).collect()
            });
            let dead: Vec<String> =
                (0..n).filter(|_| rng.random_bool(0.2)).map(|i| format!("n{i}:9000")).collect();
            let usable = |a: &str| !dead.iter().any(|d| d == a);
            for c in 0..8u64 {
                let chunk = ChunkKey(c.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ case);
                let got = p.upstreams_among(chunk, readers.as_deref(), usable);
                let want = reference_upstreams_among(&p, chunk, readers.as_deref(), usable);
                assert_eq!(got, want, "case {case} chunk {c} me {me} readers {readers:?}");
                // The index-based shortcuts agree with the ranking by id.
                let ranked = p.ranked(chunk);
                assert_eq!(p.first_ranked(chunk), ranked.first().copied());
                let owned = ranked.iter().take(1).any(|id| *id == me);
                let class = if owned { BlockClass::Owned } else { BlockClass::Borrowed };
                assert_eq!(p.class_of(chunk), class, "case {case} chunk {c} me {me}");
            }
        }
    }

    /// The walk over the whole ranking (`upstreams_among`) and the answer from the members left
    /// out (`upstreams_tagged`) on views with what makes members unaskable or not placed: no
    /// address, an address two members share, states other than Ready, a node missing from its
    /// own view; over reader sets naming unknown ids and duplicates; at sizes where the tree is
    /// a chain and where it branches.
    #[test]
    fn the_tree_from_the_members_left_out_is_the_tree_of_the_whole_walk() {
        use crate::membership::MemberState;
        use rand::{Rng as _, SeedableRng as _};
        let seed = 0x7a67_u64;
        println!("seed {seed}");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for case in 0..300 {
            let n = rng.random_range(1..80usize);
            let states = [MemberState::Ready, MemberState::Suspect, MemberState::Joining];
            let members: Vec<Member> = (0..n)
                .map(|i| {
                    let addr = match rng.random_range(0..10) {
                        0 => String::new(),
                        1 => "shared:9000".to_owned(),
                        _ => format!("n{i}:9000"),
                    };
                    let state = if rng.random_bool(0.1) {
                        states[rng.random_range(1..3)]
                    } else {
                        states[0]
                    };
                    Member { addr, state, ..Member::ready(&format!("n{i}"), "x") }
                })
                .collect();
            let view = View::new(members);
            let me = format!("n{}", rng.random_range(0..n + 2));
            let fanout = [0, 1, 2, 3][rng.random_range(0..4)];
            let p = Placement::new(view, &me, fanout, 1);
            let sets: Vec<Vec<String>> = (0..3)
                .map(|_| {
                    let p = rng.random_range(0.0..1.0);
                    let mut set: Vec<String> = (0..n + 3)
                        .filter(|_| rng.random_bool(p))
                        .map(|i| format!("n{i}"))
                        .collect();
                    if !set.is_empty() && rng.random_bool(0.3) {
                        set.push(set[0].clone());
                    }
                    set
                })
                .collect();
            let addrs: Vec<String> = (0..n).map(|i| format!("n{i}:9000")).collect();
            for step in 0..30 {
                let chunk = ChunkKey(rng.random_range(0..4u64));
                let set = rng.random_range(0..4usize);
                let readers = sets.get(set).map(|s| (s.as_slice(), 100 * case + set as u64));
                let p_dead = [0.0, 0.1, 0.5][rng.random_range(0..3)];
                let mut dead: Vec<String> =
                    addrs.iter().filter(|_| rng.random_bool(p_dead)).cloned().collect();
                if rng.random_bool(0.2) {
                    dead.push("shared:9000".to_owned());
                }
                if rng.random_bool(0.1) {
                    dead.push("elsewhere:1".to_owned());
                }
                dead.sort();
                let refused: Vec<&String> = dead.iter().collect();
                let got = p.upstreams_tagged(chunk, readers, &refused);
                let usable = |a: &str| !dead.iter().any(|d| d == a);
                let want = p.upstreams_among(chunk, readers.map(|(s, _)| s), usable);
                assert_eq!(got, want, "case {case} step {step} n {n} me {me} fanout {fanout}");
            }
        }
    }

    #[test]
    fn upstreams_tagged_answers_as_upstreams_among_across_repeated_and_changed_questions() {
        use rand::{Rng as _, SeedableRng as _};
        let seed = 0x7a66_u64;
        println!("seed {seed}");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for case in 0..100 {
            let n = rng.random_range(1..30usize);
            let view = View::new(
                (0..n)
                    .map(|i| Member {
                        addr: format!("n{i}:9000"),
                        ..Member::ready(&format!("n{i}"), "x")
                    })
                    .collect(),
            );
            let me = format!("n{}", rng.random_range(0..n));
            let p = Placement::new(view, &me, [0, 1, 2][rng.random_range(0..3)], 1);
            // A few reader sets, each with its own tag, and a few refusal sets, asked in a
            // random order so that questions repeat and change.
            let sets: Vec<Vec<String>> = (0..3)
                .map(|_| (0..n).filter(|_| rng.random_bool(0.5)).map(|i| format!("n{i}")).collect())
                .collect();
            let deads: Vec<Vec<String>> = (0..3)
                .map(|_| {
                    (0..n).filter(|_| rng.random_bool(0.15)).map(|i| format!("n{i}:9000")).collect()
                })
                .collect();
            for step in 0..40 {
                let chunk = ChunkKey(rng.random_range(0..3u64));
                let set = rng.random_range(0..4usize);
                let readers = sets.get(set).map(|s| (s.as_slice(), set as u64));
                let dead = &deads[rng.random_range(0..3usize)];
                let refused: Vec<&String> = dead.iter().collect();
                let got = p.upstreams_tagged(chunk, readers, &refused);
                let usable = |a: &str| !dead.iter().any(|d| d == a);
                let want = p.upstreams_among(chunk, readers.map(|(s, _)| s), usable);
                assert_eq!(got, want, "case {case} step {step}");
            }
        }
    }

    #[test]
    fn the_root_has_no_upstream_and_others_walk_their_ancestors() {
        let v = view(7);
        let chunk = ChunkKey(0xDEAD_BEEF);
        let ranked: Vec<String> = Placement::new(v.clone(), "node-00", 2, 1)
            .ranked(chunk)
            .iter()
            .map(|s| s.to_string())
            .collect();
        let root = Placement::new(v.clone(), &ranked[0], 2, 1);
        assert!(root.upstreams(chunk, |_| true).is_empty());
        // Position 2's ancestors in the n=7,k=2 golden tree are 1 then 0.
        let p = Placement::new(v.clone(), &ranked[2], 2, 1);
        let ups: Vec<_> = p.upstreams(chunk, |_| true).into_iter().map(|r| r.id).collect();
        assert_eq!(ups, vec![ranked[1].clone(), ranked[0].clone()]);
    }

    #[test]
    fn an_open_parent_is_skipped_and_the_grandparent_promoted() {
        let v = view(7);
        let chunk = ChunkKey(42);
        let ranked: Vec<String> = Placement::new(v.clone(), "x", 2, 1)
            .ranked(chunk)
            .iter()
            .map(|s| s.to_string())
            .collect();
        let p = Placement::new(v.clone(), &ranked[2], 2, 1);
        let parent_addr = v.get(&ranked[1]).map(|m| m.addr.clone()).expect("member");
        let ups: Vec<_> =
            p.upstreams(chunk, |a| a != parent_addr).into_iter().map(|r| r.id).collect();
        assert_eq!(ups, vec![ranked[0].clone()]);
        assert!(p.upstreams(chunk, |_| false).is_empty(), "all open: origin with zero dials");
    }

    #[test]
    fn a_dead_root_is_replaced_by_the_next_ranked_member_for_everyone_who_sees_it_dead() {
        let v = view(15);
        let chunk = ChunkKey(7);
        let ranked: Vec<String> = Placement::new(v.clone(), "x", 2, 1)
            .ranked(chunk)
            .iter()
            .map(|s| s.to_string())
            .collect();
        let root_addr = v.get(&ranked[0]).map(|m| m.addr.clone()).expect("member");
        let alive = |a: &str| a != root_addr;
        // The next-ranked member becomes the root (it fetches the origin itself) ...
        assert!(Placement::new(v.clone(), &ranked[1], 2, 1).upstreams(chunk, alive).is_empty());
        // ... and every other member's chain of parents ends at it, not at the origin.
        for me in &ranked[2..] {
            let mut at = me.clone();
            loop {
                let ups = Placement::new(v.clone(), &at, 2, 1).upstreams(chunk, alive);
                assert!(ups.iter().all(|p| p.addr != root_addr), "{me}: asks the dead root");
                match ups.first() {
                    Some(parent) => at = parent.id.clone(),
                    None => break,
                }
            }
            assert_eq!(at, ranked[1], "{me}: its chain ends at the replacement root");
        }
    }

    #[test]
    fn a_readers_tree_spans_the_readers_and_falls_back_to_every_member_below_two() {
        let v = view(8);
        let chunk = ChunkKey(7);
        let ranked: Vec<String> = Placement::new(v.clone(), "x", 1, 1)
            .ranked(chunk)
            .iter()
            .map(|s| s.to_string())
            .collect();
        let me = ranked[5].clone();
        let p = Placement::new(v.clone(), &me, 1, 1);
        let ids = |ups: Vec<PeerRef>| ups.into_iter().map(|u| u.id).collect::<Vec<_>>();
        // Over every member: the chain's parent and grandparent.
        assert_eq!(ids(p.upstreams(chunk, |_| true)), vec![ranked[4].clone(), ranked[3].clone()]);
        // Over the readers {1, 3, me}: the chain among them (at most two ancestors).
        let readers = vec![ranked[1].clone(), ranked[3].clone(), me.clone()];
        let got = ids(p.upstreams_among(chunk, Some(&readers), |_| true));
        assert_eq!(got, vec![ranked[3].clone(), ranked[1].clone()]);
        // Over {3, me}: below the chunk's home (rank 0, the root over every member), which
        // reads nothing.
        let pair = vec![ranked[3].clone(), me.clone()];
        let got = ids(p.upstreams_among(chunk, Some(&pair), |_| true));
        assert_eq!(got, vec![ranked[3].clone(), ranked[0].clone()]);
        // The home unusable (circuit open): the next usable member is the home.
        let home = v.get(&ranked[0]).expect("member").addr.clone();
        let got = ids(p.upstreams_among(chunk, Some(&pair), |a| a != home));
        assert_eq!(got, vec![ranked[3].clone(), ranked[1].clone()]);
        // A home that reads is one reader among the others: two readers do not make a tree
        // without this node, three do.
        let with_home = vec![ranked[0].clone(), me.clone()];
        let got = ids(p.upstreams_among(chunk, Some(&with_home), |_| true));
        assert_eq!(got, vec![ranked[0].clone()]);
        // The home itself, reading: the root of the readers' tree, reading the origin.
        let h = Placement::new(v.clone(), &ranked[0], 1, 1);
        assert!(h.upstreams_among(chunk, Some(&readers), |_| true).is_empty());
        // A reader unknown to the view does not count; fewer than two known: every member.
        let lonely = vec![me.clone(), "stranger".to_owned()];
        assert_eq!(
            ids(p.upstreams_among(chunk, Some(&lonely), |_| true)),
            ids(p.upstreams(chunk, |_| true))
        );
        // A set that does not name this node (it joined after the set was published): every
        // member, as without a set.
        let others = vec![ranked[2].clone(), ranked[6].clone()];
        let got = ids(p.upstreams_among(chunk, Some(&others), |_| true));
        assert_eq!(got, ids(p.upstreams(chunk, |_| true)));
        // An excluded (open-circuit) reader is skipped as in the members' tree.
        let open = v.get(&ranked[3]).expect("member").addr.clone();
        let got = ids(p.upstreams_among(chunk, Some(&readers), |a| a != open));
        assert_eq!(got, vec![ranked[1].clone(), ranked[0].clone()]);
    }

    #[test]
    fn readers_trees_and_members_trees_never_ask_in_a_cycle() {
        // Nodes routing over different reader sets (or none) still ask only better-ranked
        // members: HRW ranks each member on its own.
        let v = view(10);
        let chunk = ChunkKey(1234);
        let ranked: Vec<String> = Placement::new(v.clone(), "x", 2, 1)
            .ranked(chunk)
            .iter()
            .map(|s| s.to_string())
            .collect();
        let rank = |id: &str| ranked.iter().position(|r| r == id).expect("ranked");
        for mask in 0u32..1024 {
            let readers: Vec<String> =
                (0..10).filter(|b| mask & (1 << b) != 0).map(|b| ranked[b].clone()).collect();
            for me in &ranked {
                for fanout in [1, 2] {
                    let p = Placement::new(v.clone(), me, fanout, 1);
                    for up in p.upstreams_among(chunk, Some(&readers), |_| true) {
                        assert!(rank(&up.id) < rank(me), "{} above {me} over {readers:?}", up.id);
                    }
                }
            }
        }
    }

    #[test]
    fn ancestors_are_always_better_ranked_whoever_is_excluded() {
        // Nodes that disagree about who is dead never ask each other in a cycle.
        let v = view(12);
        let chunk = ChunkKey(99);
        let ranked: Vec<String> = Placement::new(v.clone(), "x", 3, 1)
            .ranked(chunk)
            .iter()
            .map(|s| s.to_string())
            .collect();
        let rank = |id: &str| ranked.iter().position(|r| r == id).expect("ranked");
        for dead_mask in 0u32..64 {
            let dead: Vec<String> = (0..6)
                .filter(|b| dead_mask & (1 << b) != 0)
                .map(|b| v.get(&ranked[b]).map(|m| m.addr.clone()).expect("member"))
                .collect();
            for me in &ranked {
                let p = Placement::new(v.clone(), me, 3, 1);
                for up in p.upstreams(chunk, |a| !dead.iter().any(|d| d == a)) {
                    assert!(rank(&up.id) < rank(me), "{} above {me}", up.id);
                }
            }
        }
    }

    #[test]
    fn a_non_member_asks_only_the_owner() {
        let v = view(5);
        let chunk = ChunkKey(7);
        let p = Placement::new(v.clone(), "outsider", 2, 1);
        let ups = p.upstreams(chunk, |_| true);
        assert_eq!(ups.len(), 1);
        assert_eq!(ups[0].id, p.ranked(chunk)[0]);
    }

    #[test]
    fn owned_iff_in_the_top_replicas() {
        let v = view(5);
        let chunk = ChunkKey(99);
        let ranked: Vec<String> = Placement::new(v.clone(), "x", 2, 1)
            .ranked(chunk)
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(Placement::new(v.clone(), &ranked[0], 2, 1).class_of(chunk), BlockClass::Owned);
        assert_eq!(
            Placement::new(v.clone(), &ranked[1], 2, 1).class_of(chunk),
            BlockClass::Borrowed
        );
        assert_eq!(Placement::new(v.clone(), &ranked[2], 2, 3).class_of(chunk), BlockClass::Owned);
        for id in &ranked {
            assert_eq!(Placement::new(v.clone(), id, 2, 5).class_of(chunk), BlockClass::Owned);
        }
    }

    #[test]
    fn relay_declines_overflowing_indices_mismatched_keys_hop_bound_and_range_blind() {
        let engine = Engine::new(EngineConfig::default());
        let url = "http://o/x";
        let id = engine.identify(url);
        let good = engine.block_key(&id, 3);
        assert_eq!(
            relay_check(&engine, good, Some(url), 0),
            Ok(RelayPlan::FetchOnBehalf { next_hop: 1 })
        );
        assert_eq!(
            relay_check(&engine, good, Some(url), MAX_HOP - 1),
            Ok(RelayPlan::FetchOnBehalf { next_hop: MAX_HOP })
        );
        assert_eq!(relay_check(&engine, good, Some(url), MAX_HOP), Err(RelayDecline::HopLimit));
        assert_eq!(relay_check(&engine, good, None, 0), Ok(RelayPlan::CacheOnly));
        let max = engine.config().geometry.max_block_index();
        for bad in [max + 1, 1 << 63, u64::MAX] {
            let key = BlockKey { chunk: good.chunk, block: bad };
            assert_eq!(relay_check(&engine, key, Some(url), 0), Err(RelayDecline::IndexOverflow));
            assert_eq!(relay_check(&engine, key, None, 0), Err(RelayDecline::IndexOverflow));
        }
        let other = BlockKey { chunk: ChunkKey(good.chunk.0 ^ 1), block: 3 };
        assert_eq!(relay_check(&engine, other, Some(url), 0), Err(RelayDecline::ChunkMismatch));
    }
}

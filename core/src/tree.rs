//! The preorder k-ary distribution tree laid over a ranking (spec/geometry.md §5).
//!
//! Positions `0..n` are ranks in an HRW ordering; position 0 is the root (the chunk owner or the
//! stream source). A subtree rooted at `lo` spanning `[lo, hi]` splits `[lo+1, hi]` into up to `k`
//! contiguous segments whose sizes differ by at most one (the larger ones first); the first
//! position of each segment is a child of `lo`, and the split recurses into every segment.
//!
//! Nothing is materialised: [`Tree::parent`], [`Tree::depth`] and [`Tree::ancestors`] locate a
//! position by descending from `[0, n-1]` with integer arithmetic alone, so they never allocate.
//! For `k >= 2` a descent takes at most [`Tree::max_depth`] steps, which is the height of a
//! complete k-ary tree with `n` nodes (the preorder split is exactly as shallow as a heap).
//!
//! # Stability when a member leaves
//!
//! The tree is a function of `(n, k)` only, so when a member leaves the ranking (its later ranks
//! shift down by one) the whole tree over `n - 1` positions is recomputed. The tempting claim
//! "removing a member re-parents only its own subtree" is **false** for this layout: with `n = 7,
//! k = 2`, removing rank 2 moves rank 6 from parent 4 to parent 5, although 6 is not below 2.
//! What does hold, and is checked by a property test in this module, is this: descend from the
//! root towards the removed member `m`. At every split exactly one child segment shrinks by one
//! (index `extra - 1`, or the last one when `extra == 0`), all others keep their size. While `m`
//! lies in the shrinking segment the disturbance stays inside it, so descend; if `m` is the root
//! of the current subtree, the *disturbed window* is that subtree (i.e. `m`'s own subtree).
//! Otherwise, at the first split where `m`'s segment differs from the shrinking one, the window is
//! the contiguous run of child segments between the two, inclusive. Every surviving member outside
//! the window keeps the same parent (as a member, not a rank) and the same depth. Consequently the
//! naive claim holds whenever `m` sits in the shrinking segment at every split above it (always
//! for `k = 1`). The window is an upper bound, not an exact set: members inside it often keep
//! their parent (removing one leaf of a star moves nobody), but for random `n <= 300`, `k <= 8`
//! and `m` the window averages about half the members and the naive claim fails about four times
//! in five. Callers must treat a membership change as reshaping the tree.

use std::iter::FusedIterator;

/// The fanout used when a fanout below 1 is configured (DART's default).
pub const DEFAULT_FANOUT: usize = 2;

/// A preorder k-ary tree over positions `0..n` of a ranking; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tree {
    n: usize,
    k: usize,
}

/// Where a descent towards one position ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Located {
    /// The subtree root visited just before the position, `None` for the root.
    parent: Option<usize>,
    /// Edges from the root.
    depth: usize,
    /// Last position of the position's own subtree.
    hi: usize,
}

/// The child segment `[start, end]` of the subtree `[lo, hi]` that contains `i`, by the
/// arithmetic segment-locate of spec §5 (no allocation, no loop over segments).
fn child_segment(lo: usize, hi: usize, k: usize, i: usize) -> (usize, usize) {
    debug_assert!(k >= 1 && lo < i && i <= hi, "child_segment({lo}, {hi}, {k}, {i})");
    let r = hi - lo;
    let base = r / k;
    let extra = r % k;
    let boundary = lo + 1 + extra * (base + 1);
    let (start, end) = if i < boundary {
        let c = (i - lo - 1) / (base + 1);
        let start = lo + 1 + c * (base + 1);
        (start, start + base)
    } else {
        // i >= boundary implies base >= 1: with base == 0 the boundary is hi + 1.
        let c = extra + (i - boundary) / base;
        let start = boundary + (c - extra) * base;
        (start, start + base - 1)
    };
    debug_assert!(lo < start && start <= i && i <= end && end <= hi);
    (start, end)
}

impl Tree {
    /// A tree over `n` positions with fanout `fanout`; a fanout below 1 becomes
    /// [`DEFAULT_FANOUT`].
    pub fn new(n: usize, fanout: usize) -> Self {
        let k = if fanout < 1 { DEFAULT_FANOUT } else { fanout };
        let tree = Tree { n, k };
        debug_assert!(tree.k >= 1);
        tree
    }

    /// Number of positions.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the tree has no positions.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The effective fanout (always at least 1).
    pub fn fanout(&self) -> usize {
        self.k
    }

    /// Descends from the root to `i`; `None` when `i` is not a position.
    fn locate(&self, i: usize) -> Option<Located> {
        if i >= self.n {
            return None;
        }
        if self.k == 1 {
            // A chain: the general descent would take i steps to say the same thing.
            return Some(Located { parent: i.checked_sub(1), depth: i, hi: self.n - 1 });
        }
        let (mut lo, mut hi) = (0, self.n - 1);
        let mut located = Located { parent: None, depth: 0, hi };
        while lo != i {
            let (start, end) = child_segment(lo, hi, self.k, i);
            located = Located { parent: Some(lo), depth: located.depth + 1, hi: end };
            (lo, hi) = (start, end);
            debug_assert!(located.depth <= self.max_depth(), "descent deeper than the bound");
        }
        debug_assert!(located.parent.is_none_or(|p| p < i) && located.hi < self.n);
        Some(located)
    }

    /// The parent of position `i`: `None` for the root and for `i >= len()`.
    pub fn parent(&self, i: usize) -> Option<usize> {
        let parent = self.locate(i)?.parent;
        debug_assert_eq!(parent.is_none(), i == 0);
        parent
    }

    /// The children of position `i`, ascending; empty for a leaf and for `i >= len()`.
    pub fn children(&self, i: usize) -> Vec<usize> {
        let Some(located) = self.locate(i) else {
            return Vec::new();
        };
        let r = located.hi - i;
        let (base, extra) = (r / self.k, r % self.k);
        let count = r.min(self.k);
        let children: Vec<usize> = (0..count).map(|c| i + 1 + c * base + c.min(extra)).collect();
        debug_assert!(children.len() <= self.k);
        debug_assert!(children.windows(2).all(|w| w[0] < w[1]));
        debug_assert!(children.last().is_none_or(|&c| c <= located.hi));
        children
    }

    /// Edges from the root to position `i`; `None` for `i >= len()`.
    pub fn depth(&self, i: usize) -> Option<usize> {
        let depth = self.locate(i)?.depth;
        debug_assert!(depth <= i, "every edge goes to a strictly earlier rank");
        Some(depth)
    }

    /// The ancestors of position `i`, parent first and root last; empty for the root and for
    /// `i >= len()`. Each step re-descends from the root, so it never allocates.
    pub fn ancestors(&self, i: usize) -> Ancestors {
        Ancestors { tree: *self, next: self.parent(i) }
    }

    /// The largest depth of any position: the smallest `d` with `n <= (k^(d+1) - 1) / (k - 1)`
    /// (the height of a complete k-ary tree) for `k >= 2`, `n - 1` for the chain `k = 1`, and 0
    /// for an empty tree. The bound is tight: some position always has exactly this depth.
    pub fn max_depth(&self) -> usize {
        if self.n == 0 {
            return 0;
        }
        if self.k == 1 {
            return self.n - 1;
        }
        // capacity = nodes of a complete k-ary tree of depth `depth`.
        let (mut depth, mut capacity, mut level) = (0usize, 1usize, 1usize);
        while capacity < self.n {
            level = level.saturating_mul(self.k);
            capacity = capacity.saturating_add(level);
            depth += 1;
        }
        debug_assert!(depth < usize::BITS as usize, "k >= 2 keeps the height logarithmic");
        depth
    }
}

/// Iterator over the ancestors of a position, parent first and root last; see
/// [`Tree::ancestors`].
#[derive(Clone, Debug)]
pub struct Ancestors {
    tree: Tree,
    next: Option<usize>,
}

impl Iterator for Ancestors {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let current = self.next?;
        self.next = self.tree.parent(current);
        debug_assert!(self.next.is_none_or(|p| p < current), "ancestors strictly decrease");
        Some(current)
    }
}

impl FusedIterator for Ancestors {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Parents as the spec's golden arrays write them: -1 for none.
    fn parents(tree: &Tree) -> Vec<i64> {
        (0..tree.len()).map(|i| tree.parent(i).map_or(-1, |p| p as i64)).collect()
    }

    /// Reference model: builds the parent array by explicit recursion over the segment starts
    /// `lo + 1 + c*base + min(c, extra)`, independently of the arithmetic locate.
    fn model_parents(n: usize, k: usize) -> Vec<Option<usize>> {
        fn split(lo: usize, hi: usize, k: usize, parent: &mut [Option<usize>]) {
            let r = hi - lo;
            let (base, extra) = (r / k, r % k);
            for c in 0..k {
                let size = if c < extra { base + 1 } else { base };
                if size == 0 {
                    continue;
                }
                let start = lo + 1 + c * base + c.min(extra);
                parent[start] = Some(lo);
                split(start, start + size - 1, k, parent);
            }
        }
        let mut parent = vec![None; n];
        if n > 0 {
            split(0, n - 1, k, &mut parent);
        }
        parent
    }

    /// The disturbed window of removing rank `m`, as described in the module docs.
    fn removal_window(n: usize, k: usize, m: usize) -> (usize, usize) {
        let (mut lo, mut hi) = (0, n - 1);
        loop {
            if lo == m {
                return (lo, hi);
            }
            let r = hi - lo;
            let (base, extra) = (r / k, r % k);
            let segment = |c: usize| {
                let start = lo + 1 + c * base + c.min(extra);
                (start, start + if c < extra { base } else { base - 1 })
            };
            let shrinking = if extra > 0 { extra - 1 } else { k - 1 };
            let (start, end) = child_segment(lo, hi, k, m);
            let holder = (0..k).find(|&c| segment(c).0 == start).expect("segment of m");
            debug_assert_eq!(segment(holder).1, end);
            if holder == shrinking {
                (lo, hi) = (start, end);
                continue;
            }
            return (segment(holder.min(shrinking)).0, segment(holder.max(shrinking)).1);
        }
    }

    #[test]
    fn seven_positions_fanout_two_match_the_golden_tree() {
        let tree = Tree::new(7, 2);
        assert_eq!(parents(&tree), [-1, 0, 1, 1, 0, 4, 4]);
        assert_eq!(tree.children(0), [1, 4]);
        assert_eq!(tree.children(1), [2, 3]);
        assert_eq!(tree.children(4), [5, 6]);
        for leaf in [2, 3, 5, 6] {
            assert!(tree.children(leaf).is_empty(), "{leaf} is a leaf");
        }
        let depths: Vec<_> = (0..7).map(|i| tree.depth(i).expect("in range")).collect();
        assert_eq!(depths, [0, 1, 2, 2, 1, 2, 2]);
    }

    #[test]
    fn fanout_one_is_a_chain() {
        let tree = Tree::new(8, 1);
        for i in 0..8 {
            assert_eq!(tree.parent(i), i.checked_sub(1));
            assert_eq!(tree.depth(i), Some(i));
        }
        assert_eq!(tree.children(3), [4]);
        assert!(tree.children(7).is_empty());
        assert_eq!(tree.ancestors(3).collect::<Vec<_>>(), [2, 1, 0]);
    }

    #[test]
    fn derived_parent_arrays_match() {
        assert_eq!(parents(&Tree::new(10, 2)), [-1, 0, 1, 2, 1, 4, 0, 6, 7, 6]);
        assert_eq!(parents(&Tree::new(10, 3)), [-1, 0, 1, 1, 0, 4, 4, 0, 7, 7]);
        assert_eq!(parents(&Tree::new(16, 4)), [-1, 0, 1, 1, 1, 0, 5, 5, 5, 0, 9, 9, 9, 0, 13, 13]);
        assert_eq!(parents(&Tree::new(6, 8)), [-1, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn fanout_below_one_becomes_two() {
        let tree = Tree::new(7, 0);
        assert_eq!(tree.fanout(), 2);
        assert_eq!(tree, Tree::new(7, 2));
    }

    #[test]
    fn positions_outside_the_tree_have_no_relatives() {
        let tree = Tree::new(7, 2);
        assert_eq!(tree.parent(7), None);
        assert_eq!(tree.depth(7), None);
        assert!(tree.children(7).is_empty());
        assert_eq!(tree.ancestors(usize::MAX).count(), 0);
        let empty = Tree::new(0, 3);
        assert!(empty.is_empty());
        assert_eq!((empty.parent(0), empty.depth(0), empty.max_depth()), (None, None, 0));
        assert!(empty.children(0).is_empty());
    }

    #[test]
    fn ancestors_run_from_parent_to_root() {
        let tree = Tree::new(10, 2);
        assert_eq!(tree.ancestors(9).collect::<Vec<_>>(), [6, 0]);
        assert_eq!(tree.ancestors(3).collect::<Vec<_>>(), [2, 1, 0]);
        assert_eq!(tree.ancestors(0).count(), 0);
    }

    #[test]
    fn huge_trees_locate_without_materialising() {
        let tree = Tree::new(usize::MAX, 2);
        let last = usize::MAX - 1;
        let depth = tree.depth(last).expect("in range");
        assert!(depth <= tree.max_depth());
        assert_eq!(tree.max_depth(), usize::BITS as usize - 1);
        assert_eq!(tree.ancestors(last).count(), depth);
        assert_eq!(tree.ancestors(last).last(), Some(0));
    }

    #[test]
    fn removing_a_member_can_move_members_outside_its_subtree() {
        // n = 7, k = 2: parents [-1,0,1,1,0,4,4]; rank 2 is a leaf. Without it, old ranks 3..=6
        // become 2..=5 in a tree whose parents are [-1,0,1,1,0,4].
        let (old, new) = (Tree::new(7, 2), Tree::new(6, 2));
        let to_old = |x: usize| if x < 2 { x } else { x + 1 };
        assert!(old.children(2).is_empty(), "rank 2's subtree is just itself");
        assert_eq!(old.parent(6), Some(4));
        // Old rank 6 is new rank 5; its new parent is new rank 4, which is old rank 5.
        let new_parent_of_6 = new.parent(5).map(to_old);
        assert_eq!(new_parent_of_6, Some(5), "member 6 moved from member 4 to member 5");
        // The window rule predicts exactly this: 2 sits in segment 0 of the root, but the root
        // split's shrinking segment is 1, so both root segments are disturbed.
        assert_eq!(removal_window(7, 2, 2), (1, 6));
    }

    #[test]
    fn max_depth_is_the_complete_tree_height() {
        assert_eq!(Tree::new(1, 2).max_depth(), 0);
        assert_eq!(Tree::new(3, 2).max_depth(), 1);
        assert_eq!(Tree::new(4, 2).max_depth(), 2);
        assert_eq!(Tree::new(7, 2).max_depth(), 2);
        assert_eq!(Tree::new(8, 2).max_depth(), 3);
        assert_eq!(Tree::new(21, 4).max_depth(), 2);
        assert_eq!(Tree::new(22, 4).max_depth(), 3);
        assert_eq!(Tree::new(9, 8).max_depth(), 1);
        assert_eq!(Tree::new(5, 1).max_depth(), 4);
    }

    fn tree_shape() -> impl Strategy<Value = (usize, usize)> {
        (1usize..=2000, 1usize..=8)
    }

    proptest! {
        #[test]
        fn arithmetic_locate_agrees_with_the_recursive_split((n, k) in tree_shape()) {
            let tree = Tree::new(n, k);
            let model = model_parents(n, k);
            for (i, want) in model.iter().enumerate() {
                prop_assert_eq!(tree.parent(i), *want, "parent of {}", i);
            }
        }

        #[test]
        fn every_member_has_one_path_to_the_root_through_earlier_ranks(
            (n, k) in tree_shape(),
        ) {
            let tree = Tree::new(n, k);
            for i in 0..n {
                let path: Vec<usize> = tree.ancestors(i).collect();
                prop_assert_eq!(path.first().copied(), tree.parent(i));
                prop_assert!(path.windows(2).all(|w| w[1] < w[0]), "strictly decreasing, no cycle");
                prop_assert!(path.iter().all(|&a| a < i));
                prop_assert_eq!(path.last().copied(), (i != 0).then_some(0));
                prop_assert_eq!(Some(path.len()), tree.depth(i));
            }
        }

        #[test]
        fn children_partition_the_non_roots_consistently_with_parent((n, k) in tree_shape()) {
            let tree = Tree::new(n, k);
            let mut seen = vec![false; n];
            for i in 0..n {
                let children = tree.children(i);
                prop_assert!(children.len() <= k);
                for c in children {
                    prop_assert!(!seen[c], "{} listed twice", c);
                    seen[c] = true;
                    prop_assert_eq!(tree.parent(c), Some(i));
                }
            }
            prop_assert!(!seen[0]);
            prop_assert!(seen[1..].iter().all(|&s| s), "every non-root is someone's child");
        }

        #[test]
        fn every_prefix_of_the_ranking_is_connected(
            (n, k) in tree_shape(), cut in any::<prop::sample::Index>(),
        ) {
            let tree = Tree::new(n, k);
            let m = cut.index(n) + 1;
            for i in 1..m {
                let parent = tree.parent(i).expect("non-root");
                prop_assert!(parent < m);
            }
        }

        #[test]
        fn depth_never_exceeds_the_complete_tree_height_and_reaches_it(
            (n, k) in tree_shape(),
        ) {
            let tree = Tree::new(n, k);
            let bound = tree.max_depth();
            let deepest = (0..n).map(|i| tree.depth(i).expect("in range")).max();
            prop_assert_eq!(deepest, Some(bound));
            if k >= 2 {
                // The spec's rough bound: the height never exceeds ceil(log_k(n)).
                let mut ceil_log = 0u32;
                while (k as u128).pow(ceil_log) < n as u128 {
                    ceil_log += 1;
                }
                prop_assert!(bound <= ceil_log as usize);
            }
        }

        #[test]
        fn a_large_fanout_is_a_star(n in 1usize..200, extra in 0usize..5) {
            let tree = Tree::new(n, (n.max(2) - 1) + extra);
            for i in 1..n {
                prop_assert_eq!(tree.parent(i), Some(0));
            }
        }

        #[test]
        fn removing_a_member_disturbs_only_its_window(
            (n, k) in (2usize..=2000, 1usize..=8), pick in any::<prop::sample::Index>(),
        ) {
            let m = pick.index(n);
            let (old, new) = (Tree::new(n, k), Tree::new(n - 1, k));
            let to_new = |x: usize| if x < m { x } else { x - 1 };
            let (first, last) = removal_window(n, k, m);
            prop_assert!(first <= m && m <= last);
            let subtree_only = first == m && old.ancestors(last).chain([last]).any(|a| a == m);
            let mut moved_outside_subtree = false;
            for x in (0..n).filter(|&x| x != m) {
                let kept = match old.parent(x) {
                    None => new.parent(to_new(x)).is_none(),
                    Some(p) => p != m && new.parent(to_new(x)) == Some(to_new(p)),
                };
                let inside_subtree = old.ancestors(x).any(|a| a == m);
                if (first..=last).contains(&x) {
                    moved_outside_subtree |= !kept && !inside_subtree;
                    continue;
                }
                prop_assert!(kept, "member {} outside window {}..={} moved", x, first, last);
                prop_assert_eq!(new.depth(to_new(x)), old.depth(x));
            }
            if subtree_only {
                prop_assert!(!moved_outside_subtree, "window is m's subtree: nothing else moves");
            }
        }
    }
}

//! The preorder k-ary distribution tree over a ranking (spec/geometry.md §5).
//!
//! CONTRACT (to be implemented):
//! - `pub struct Tree` built by `Tree::new(n: usize, fanout: usize)` (fanout < 1 becomes 2)
//! - `parent(i) -> Option<usize>`, `children(i) -> Vec<usize>`, `depth(i) -> Option<usize>`,
//!   `ancestors(i) -> impl Iterator<Item = usize>` (parent first, root last), zero allocation
//!   for parent/depth/ancestors.

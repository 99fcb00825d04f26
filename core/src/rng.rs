//! Seeded randomness: every random decision in dart draws from a ChaCha RNG whose seed descends
//! from one root seed, so a whole run replays from that seed.
//!
//! A child's seed is drawn from its parent and mixed with a label, so adding a new child does not
//! shift the streams of the others as long as children are created in a fixed order.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The RNG type used everywhere in core and sim.
pub type Rng = ChaCha8Rng;

/// A root RNG from a 64-bit seed (the seed users see and replay).
pub fn from_seed(seed: u64) -> Rng {
    Rng::seed_from_u64(seed)
}

/// A child RNG: its seed is drawn from `parent` and mixed with `label`.
pub fn child(parent: &mut Rng, label: &str) -> Rng {
    let drawn = parent.next_u64();
    Rng::seed_from_u64(drawn ^ crate::hash::fnv1a64(label.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_children() {
        let mut a = from_seed(7);
        let mut b = from_seed(7);
        let (mut ca, mut cb) = (child(&mut a, "node-1"), child(&mut b, "node-1"));
        assert_eq!(ca.next_u64(), cb.next_u64());
    }

    #[test]
    fn labels_separate_streams() {
        let mut a = from_seed(7);
        let mut b = from_seed(7);
        assert_ne!(child(&mut a, "x").next_u64(), child(&mut b, "y").next_u64());
    }
}

//! TinyLFU admission for borrowed blocks (spec/store.md §4): a frequency estimator of 4-bit
//! count-min counters behind a doorkeeper bloom filter, halved periodically, and the verdict a full
//! budget applies to a candidate against its LRU victim. Pure: the disk store and the simulator's
//! cache both call it, so the admission scenarios run is the admission production makes.

use crate::hash::{fmix64, BlockKey};

/// The 64-bit golden-ratio constant DART mixes keys with.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
/// The estimator is sized for at least this many keys: a tiny sketch aliases every key, and an
/// unseen candidate would inherit a warm key's count.
pub const MIN_KEYS: u64 = 256;
/// A 4-bit counter saturates here.
const COUNTER_MAX: u64 = 15;
/// Counters per `u64` word.
const COUNTERS_PER_WORD: u64 = 16;

/// Owned share of a store's slots by default (`--owned-fraction`, spec/store.md §3).
pub const DEFAULT_OWNED_FRACTION: f64 = 0.8;

/// The owned and borrowed budgets of `slots` slots (at least 2) under owned share `fraction`
/// (strictly inside (0, 1)), spec/store.md §3: `owned = floor(slots * fraction)` but at least 1,
/// `borrowed = slots - owned` but at least 1, taking the slot from owned. The disk store and the
/// simulator's cache both split so.
pub fn split_slots(slots: u64, fraction: f64) -> (u64, u64) {
    assert!(slots >= 2 && fraction > 0.0 && fraction < 1.0);
    // slots <= cache_bytes is far below 2^53 for any budget a store accepts, so the product is
    // exact enough; clamp anyway so float rounding can never hand out more than `slots`.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
    let floored = (slots as f64 * fraction).floor() as u64;
    let mut owned = floored.clamp(1, slots);
    let mut borrowed = slots - owned;
    if borrowed < 1 {
        borrowed = 1;
        if owned > 1 {
            owned -= 1;
        }
    }
    assert!(owned >= 1 && borrowed >= 1 && owned + borrowed == slots);
    (owned, borrowed)
}

/// The estimator's hash of `key`: `fmix64(chunk ^ (block * GOLDEN))`.
pub fn key_hash(key: &BlockKey) -> u64 {
    fmix64(key.chunk.0 ^ key.block.wrapping_mul(GOLDEN))
}

/// The four probe positions of hash `h`, before masking.
fn probes(h: u64) -> [u64; 4] {
    let h2 = fmix64(h ^ GOLDEN);
    [h, h >> 16, h2, h2 >> 16]
}

/// Whether a full budget admits `candidate` by evicting `victim`: only if the candidate is at least
/// as popular (TinyLFU; ties admit, so a cold cache still turns over).
pub fn admits(sketch: &Sketch, candidate: &BlockKey, victim: &BlockKey) -> bool {
    sketch.estimate(candidate) >= sketch.estimate(victim)
}

/// Count-min sketch of 4-bit counters with a doorkeeper.
#[derive(Clone, Debug)]
pub struct Sketch {
    /// Packed 4-bit counters, 16 per word; `counter_mask + 1` of them.
    counters: Vec<u64>,
    counter_mask: u64,
    /// Doorkeeper bloom filter bits; `door_mask + 1` of them.
    door: Vec<u64>,
    door_mask: u64,
    /// Counted increments since the last halving.
    increments: u64,
    /// Halve after this many counted increments: 10 × the sized key count.
    halve_at: u64,
}

impl Sketch {
    /// An estimator for a cache of `slots` entries, sized for `max(slots, 256)` keys.
    pub fn new(slots: u64) -> Self {
        let keys = slots.max(MIN_KEYS);
        let counters = (keys * 4).next_power_of_two();
        let door_bits = (keys * 8).next_power_of_two();
        let sketch = Sketch {
            counters: vec![0; usize::try_from(counters / COUNTERS_PER_WORD).expect("sketch fits")],
            counter_mask: counters - 1,
            door: vec![0; usize::try_from(door_bits / 64).expect("sketch fits")],
            door_mask: door_bits - 1,
            increments: 0,
            halve_at: keys * 10,
        };
        sketch.check_invariants();
        sketch
    }

    /// Records one access of `key`: a first sighting only enters the doorkeeper.
    pub fn increment(&mut self, key: &BlockKey) {
        let positions = probes(key_hash(key));
        if !self.door_contains(positions) {
            for p in positions {
                let bit = p & self.door_mask;
                self.door[(bit / 64) as usize] |= 1 << (bit % 64);
            }
            return;
        }
        for p in positions {
            let i = p & self.counter_mask;
            let (word, shift) = ((i / COUNTERS_PER_WORD) as usize, (i % COUNTERS_PER_WORD) * 4);
            if (self.counters[word] >> shift) & 0xf < COUNTER_MAX {
                self.counters[word] += 1 << shift;
            }
        }
        self.increments += 1;
        if self.increments >= self.halve_at {
            self.halve();
        }
    }

    /// Estimated access count of `key`: the minimum of its counters, plus 1 if the doorkeeper
    /// has seen it.
    pub fn estimate(&self, key: &BlockKey) -> u64 {
        let positions = probes(key_hash(key));
        let min = positions
            .iter()
            .map(|&p| {
                let i = p & self.counter_mask;
                (self.counters[(i / COUNTERS_PER_WORD) as usize] >> ((i % COUNTERS_PER_WORD) * 4))
                    & 0xf
            })
            .min()
            .expect("four probes");
        min + u64::from(self.door_contains(positions))
    }

    /// Ages the sketch: halves every counter and clears the doorkeeper.
    fn halve(&mut self) {
        for word in &mut self.counters {
            *word = (*word >> 1) & 0x7777_7777_7777_7777;
        }
        self.door.fill(0);
        self.increments = 0;
    }

    fn door_contains(&self, positions: [u64; 4]) -> bool {
        positions.iter().all(|&p| {
            let bit = p & self.door_mask;
            self.door[(bit / 64) as usize] & (1 << (bit % 64)) != 0
        })
    }

    /// Sized key count, counter count and doorkeeper bit count.
    #[cfg(test)]
    pub fn dimensions(&self) -> (u64, u64, u64) {
        (self.halve_at / 10, self.counter_mask + 1, self.door_mask + 1)
    }

    /// Asserts the table sizes are powers of two and consistent with their masks.
    pub fn check_invariants(&self) {
        let counters = self.counter_mask + 1;
        let door_bits = self.door_mask + 1;
        assert!(counters.is_power_of_two() && door_bits.is_power_of_two());
        assert_eq!(self.counters.len() as u64 * COUNTERS_PER_WORD, counters);
        assert_eq!(self.door.len() as u64 * 64, door_bits);
        assert!(self.halve_at >= MIN_KEYS * 10 && self.increments < self.halve_at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::ChunkKey;

    fn key(chunk: u64, block: u64) -> BlockKey {
        BlockKey { chunk: ChunkKey(chunk), block }
    }

    #[test]
    fn key_hash_mixes_block_with_the_golden_ratio_before_fmix64() {
        let k = key(0x0123_4567_89ab_cdef, 42);
        assert_eq!(key_hash(&k), fmix64(0x0123_4567_89ab_cdef ^ 42u64.wrapping_mul(GOLDEN)));
        assert_ne!(key_hash(&key(1, 2)), key_hash(&key(2, 1)));
    }

    #[test]
    fn first_sighting_only_sets_the_doorkeeper() {
        let mut s = Sketch::new(64);
        let k = key(7, 3);
        assert_eq!(s.estimate(&k), 0);
        s.increment(&k);
        assert_eq!(s.estimate(&k), 1);
        assert_eq!(s.increments, 0);
        s.increment(&k);
        assert_eq!(s.estimate(&k), 2);
        assert_eq!(s.increments, 1);
    }

    #[test]
    fn counters_saturate_at_fifteen() {
        let mut s = Sketch::new(10_000);
        let k = key(1, 1);
        for _ in 0..100 {
            s.increment(&k);
        }
        assert_eq!(s.estimate(&k), COUNTER_MAX + 1);
        s.check_invariants();
    }

    #[test]
    fn ten_times_capacity_increments_halve_counters_and_clear_the_doorkeeper() {
        let mut s = Sketch::new(1);
        let warm = key(9, 9);
        for _ in 0..8 {
            s.increment(&warm);
        }
        assert_eq!(s.estimate(&warm), 8, "7 counted + the doorkeeper");
        assert_eq!(s.halve_at, MIN_KEYS * 10);
        s.increments = s.halve_at - 2;
        s.increment(&warm);
        assert_eq!(s.estimate(&warm), 9);
        s.increment(&warm);
        assert_eq!(s.increments, 0);
        assert_eq!(s.estimate(&warm), 4, "9 counted, halved, doorkeeper cleared");
        assert!(s.door.iter().all(|&w| w == 0));
        s.check_invariants();
    }

    #[test]
    fn the_sketch_is_sized_for_at_least_256_keys() {
        assert_eq!(Sketch::new(1).dimensions(), (256, 1024, 2048));
        assert_eq!(Sketch::new(256).dimensions(), (256, 1024, 2048));
        assert_eq!(Sketch::new(300).dimensions(), (300, 2048, 4096));
    }

    #[test]
    fn with_the_256_floor_unseen_keys_do_not_inherit_a_warm_count() {
        // A one-slot borrowed budget: without the floor the sketch would have 4 counters and every
        // unseen candidate would look as warm as the hottest key.
        let mut s = Sketch::new(1);
        let warm = key(0xfeed, 1);
        for _ in 0..20 {
            s.increment(&warm);
        }
        assert!(s.estimate(&warm) >= 15);
        let unseen_warm = (0..1000).filter(|&i| s.estimate(&key(i, i)) >= 2).count();
        assert!(unseen_warm < 20, "{unseen_warm} of 1000 unseen keys alias the warm key");
    }

    #[test]
    fn a_full_budget_admits_a_candidate_only_if_it_is_at_least_as_popular_as_the_victim() {
        let mut s = Sketch::new(1024);
        let (hot, cold) = (key(1, 1), key(2, 2));
        assert!(admits(&s, &cold, &hot), "ties admit: a cold cache turns over");
        for _ in 0..4 {
            s.increment(&hot);
        }
        assert!(!admits(&s, &cold, &hot), "an unseen key never evicts a popular one");
        assert!(admits(&s, &hot, &cold));
    }
}

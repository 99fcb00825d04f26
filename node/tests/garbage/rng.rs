//! A small seeded generator: every connection's bytes are a pure function of the run's seed and
//! the connection's index, so a failing run replays from its printed seed. It draws from core's
//! seeded ChaCha RNG (`dart_core::rng`).

pub struct Rng(dart_core::rng::Rng);

impl Rng {
    /// The generator for stream `stream` of connection `index` under `seed`.
    pub fn new(seed: u64, index: u64, stream: u64) -> Rng {
        let mixed = seed ^ index.wrapping_mul(0xA24B_AED4_963E_E407) ^ stream.rotate_left(32);
        Rng(dart_core::rng::from_seed(mixed))
    }

    pub fn next(&mut self) -> u64 {
        rand::RngCore::next_u64(&mut self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next() % n
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi);
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize].clone()
    }

    /// An index into `weights` drawn with those weights.
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        let mut x = self.below(total);
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        unreachable!("x < total")
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }

    /// Random bytes, `lo..=hi` of them.
    pub fn bytes_between(&mut self, lo: u64, hi: u64) -> Vec<u8> {
        let len = self.between(lo, hi) as usize;
        self.bytes(len)
    }
}

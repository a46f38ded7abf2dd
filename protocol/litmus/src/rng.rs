//! SplitMix64: the suite's only source of randomness, so a seed fixes a run.

use dmem_layout::mix::{GOLDEN_GAMMA, splitmix64_finalize};

/// A SplitMix64 generator (Steele, Lea, Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA'14).
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator started at `seed`.
    #[must_use]
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        splitmix64_finalize(self.0)
    }

    /// A number in `0..n` (`n > 0`; slightly biased, which a test does not mind).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Mixes several words into one seed.
#[must_use]
pub fn mix(words: &[u64]) -> u64 {
    let mut r = SplitMix::new(0x6C69_746D_7573);
    for &w in words {
        r = SplitMix::new(r.next_u64() ^ w);
    }
    r.next_u64()
}

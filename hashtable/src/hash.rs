//! Hashing: the bin of a 64-bit key, and a small `Hasher` for the typed maps.

use core::hash::{BuildHasher, Hasher};

/// Mixes a 64-bit key into a well-spread 64-bit hash: two xor-shift-multiply rounds, a
/// bijection.
///
/// Keys of the `u64` fast path are often dense (`0..n`) or structured (table id in the top
/// bits); the bin is taken from the high bits of this mix, so every input bit matters. Each
/// high bit of a product depends on every lower bit of its factor, and the xor-shifts fold
/// the high input bits into the low ones first. A third xor-shift (as in MurmurHash3's
/// `fmix64`) would change only the low 32 bits, which no bin below 2^32 bins reads, so it is
/// left out: 3 instructions less on every Get.
#[inline(always)]
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 32;
    x = x.wrapping_mul(0xd6e8_feb8_6659_fd93);
    x ^= x >> 32;
    x.wrapping_mul(0xd6e8_feb8_6659_fd93)
}

/// The bin of hash `h` in a table of `nbins` bins: `floor(h * nbins / 2^64)`.
///
/// One multiply, no power-of-two requirement, and doubling the table sends bin `b` to bins
/// `2b` and `2b + 1` only — the resize relies on that.
#[inline(always)]
pub(crate) fn bin_of(h: u64, nbins: usize) -> usize {
    ((u128::from(h) * nbins as u128) >> 64) as usize
}

/// A fast, seedable, non-cryptographic `Hasher` for [`crate::BoxedMap`] keys.
///
/// Not resistant to hash flooding: maps whose keys an adversary chooses should pass a keyed
/// `BuildHasher` (for instance `std::collections::hash_map::RandomState`).
#[derive(Clone, Debug)]
pub struct WordHasher {
    state: u64,
}

impl Hasher for WordHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            // The length keeps "ab" and "ab\0" apart.
            self.write_u64(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.state = (self.state ^ i)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        mix64(self.state)
    }
}

/// Builds [`WordHasher`]s from a fixed seed (the default for [`crate::BoxedMap`]).
#[derive(Clone, Copy, Debug)]
pub struct WordHasherBuilder {
    seed: u64,
}

impl WordHasherBuilder {
    /// A builder whose hashers start from `seed`.
    pub const fn with_seed(seed: u64) -> Self {
        WordHasherBuilder { seed }
    }
}

impl Default for WordHasherBuilder {
    fn default() -> Self {
        WordHasherBuilder::with_seed(0x5851_f42d_4c95_7f2d)
    }
}

impl BuildHasher for WordHasherBuilder {
    type Hasher = WordHasher;
    #[inline]
    fn build_hasher(&self) -> WordHasher {
        WordHasher { state: self.seed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubling_sends_a_bin_to_its_two_children() {
        for i in 0..10_000u64 {
            let h = mix64(i);
            for n in [1usize, 3, 7, 1000, 1 << 20] {
                let b = bin_of(h, n);
                assert!(b < n);
                let c = bin_of(h, 2 * n);
                assert!(c == 2 * b || c == 2 * b + 1);
            }
        }
    }
}

//! 64-bit mixing functions: the one copy of each that the crates share.
//!
//! Placement, routing and seeded draws hash with these, and every node of a cluster (and
//! every replay of a simulation) must compute them alike: changing one changes where
//! records live and what a seed replays. Two functions are here because their users
//! genuinely differ in whether the input is first advanced by the golden-ratio increment.

/// SplitMix64's increment: 2^64 divided by the golden ratio.
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (Stafford's "Mix13" variant of MurmurHash3's finaliser),
/// without the increment: a bijection of `u64` that spreads every input bit over the
/// output.
#[must_use]
#[inline]
pub const fn splitmix64_finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64 (Steele, Lea, Flood, OOPSLA'14) as a hash: [`splitmix64_finalize`] of `x`
/// advanced by the golden-ratio increment. The output of a SplitMix64 generator whose
/// state was `x`; a bijection, so `splitmix64(0)` is not 0.
#[must_use]
#[inline]
pub const fn splitmix64(x: u64) -> u64 {
    splitmix64_finalize(x.wrapping_add(GOLDEN_GAMMA))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference outputs of SplitMix64 seeded with 1234567 (the C reference
    /// `splitmix64.c` by Vigna): the functions must never change.
    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        let mut state: u64 = 1_234_567;
        let mut next = || {
            let out = splitmix64(state);
            state = state.wrapping_add(GOLDEN_GAMMA);
            out
        };
        assert_eq!(next(), 6_457_827_717_110_365_317);
        assert_eq!(next(), 3_203_168_211_198_807_973);
        assert_eq!(next(), 9_817_491_932_198_370_423);
    }

    #[test]
    fn splitmix64_is_the_finalizer_of_the_advanced_input() {
        for x in [0, 1, 42, u64::MAX, GOLDEN_GAMMA] {
            assert_eq!(
                splitmix64(x),
                splitmix64_finalize(x.wrapping_add(GOLDEN_GAMMA))
            );
        }
        assert_eq!(splitmix64_finalize(0), 0);
    }
}

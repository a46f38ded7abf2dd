//! Random choices: the portable generator, key distributions (uniform, Zipf, TATP's
//! non-uniform subscriber ids, TPC-C's NURand), mix selection and benchmark strings.
//!
//! Everything here is deterministic per seed on every platform: the generator is
//! xoshiro256++ (rand's named portable generator, seeded through SplitMix64), and the Zipf
//! sampler is `rand_distr::Zipf` built on `libm` (software floating point functions, the
//! same results everywhere).

use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// The generator every workload uses.
pub type WorkloadRng = rand::rngs::Xoshiro256PlusPlus;

/// SplitMix64 as a bijective 64-bit mixer.
pub use dmem_layout::mix::splitmix64 as mix64;

/// A generator for one independent stream: `(seed, stream)` pairs give unrelated sequences.
/// Loaders use one stream per record group (so a record does not depend on load order),
/// generators one per coordinator.
#[must_use]
pub fn rng_for(seed: u64, stream: u64) -> WorkloadRng {
    WorkloadRng::seed_from_u64(mix64(seed ^ mix64(stream)))
}

/// How keys are drawn from `[0, n)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDistribution {
    /// Every key equally likely.
    Uniform,
    /// Zipf: key of rank `r` (1-based) has probability ∝ `1 / r^theta`. θ = 0.99 is the
    /// skewed default of LOTUS §8.1 and OOCC §VI.
    Zipf {
        /// The skew θ (≥ 0; 0 is uniform).
        theta: f64,
    },
}

/// Draws keys from `[0, n)` by a [`KeyDistribution`].
///
/// Zipf uses `rand_distr::Zipf` (rejection sampling, O(1) setup and O(1) expected time per
/// draw) instead of YCSB's Gray et al. generator, whose setup sums `n` terms (20M for LOTUS's
/// KVS). With `scramble`, rank `r` maps to key `(a·r + b) mod n` for a fixed `a` coprime to
/// `n`: a bijection that spreads the hot keys over the key space as YCSB's scrambled Zipfian
/// does; without it, key `r - 1` is the `r`-th hottest.
#[derive(Debug, Clone)]
pub struct KeyChooser {
    n: u64,
    zipf: Option<Zipf<f64>>,
    scramble: Option<(u64, u64)>,
}

impl KeyChooser {
    /// A chooser over `[0, n)`.
    ///
    /// # Panics
    /// If `n == 0` or θ is negative or NaN.
    #[must_use]
    pub fn new(n: u64, distribution: KeyDistribution, scramble: bool) -> Self {
        assert!(n > 0, "an empty key space");
        let zipf = match distribution {
            KeyDistribution::Uniform => None,
            KeyDistribution::Zipf { theta } => {
                Some(Zipf::new(n as f64, theta).expect("zipf theta must be >= 0"))
            }
        };
        let scramble = scramble.then(|| {
            let mut a = (0x9e37_79b9_7f4a_7c15 % n) | 1;
            while gcd(a, n) != 1 {
                a += 2;
            }
            (a, mix64(n) % n)
        });
        Self { n, zipf, scramble }
    }

    /// The key-space size.
    #[must_use]
    pub const fn len(&self) -> u64 {
        self.n
    }

    /// Whether the key space is empty (never: `new` refuses that).
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The next key.
    pub fn next_key(&self, rng: &mut WorkloadRng) -> u64 {
        let rank = match &self.zipf {
            None => rng.random_range(0..self.n),
            Some(z) => (z.sample(rng) as u64).clamp(1, self.n) - 1,
        };
        match self.scramble {
            None => rank,
            Some((a, b)) => {
                ((u128::from(a) * u128::from(rank) + u128::from(b)) % u128::from(self.n)) as u64
            }
        }
    }
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

/// TATP's non-uniform subscriber id in `[1, p]` (TATP Benchmark Description 1.0, "Random
/// number generation"): `((rnd(0, A) | rnd(1, P)) % P) + 1`, with `A = 65535` when
/// `P ≤ 1,000,000`, `1,048,575` when `P ≤ 10,000,000`, and `2,097,151` above.
///
/// # Panics
/// If `p == 0`.
pub fn tatp_subscriber_id(rng: &mut WorkloadRng, p: u64) -> u64 {
    assert!(p > 0, "no subscribers");
    let a = tatp_a(p);
    ((rng.random_range(0..=a) | rng.random_range(1..=p)) % p) + 1
}

/// TATP's `A` for a population of `p` subscribers.
#[must_use]
pub const fn tatp_a(p: u64) -> u64 {
    if p <= 1_000_000 {
        65_535
    } else if p <= 10_000_000 {
        1_048_575
    } else {
        2_097_151
    }
}

/// TPC-C NURand (TPC-C 5.11, clause 2.1.6):
/// `NURand(A, x, y) = (((random(0, A) | random(x, y)) + C) % (y - x + 1)) + x`.
pub fn nurand(rng: &mut WorkloadRng, a: u64, c: u64, x: u64, y: u64) -> u64 {
    (((rng.random_range(0..=a) | rng.random_range(x..=y)) + c) % (y - x + 1)) + x
}

/// The run-time constants `C` of TPC-C's NURand (clause 2.1.6), one set per run and shared by
/// every terminal. `c_last_load` is the constant the loader used for C_LAST (clause
/// 4.3.2.3); `c_last_run` differs from it by a `C_delta` in `[65, 119]`, not 96 or 112
/// (clause 2.1.6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NuRandConstants {
    /// C for C_LAST at load time (A = 255).
    pub c_last_load: u64,
    /// C for C_LAST at run time (A = 255).
    pub c_last_run: u64,
    /// C for C_ID (A = 1023).
    pub c_id: u64,
    /// C for OL_I_ID (A = 8191).
    pub ol_i_id: u64,
}

impl NuRandConstants {
    /// Constants drawn from `seed` that satisfy clause 2.1.6.1.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        let mut rng = rng_for(seed, 0x4e55_5241_4e44);
        let c_last_load = rng.random_range(0..=255u64);
        let c_last_run = loop {
            let run = rng.random_range(0..=255u64);
            let delta = run.abs_diff(c_last_load);
            if (65..=119).contains(&delta) && delta != 96 && delta != 112 {
                break run;
            }
        };
        Self {
            c_last_load,
            c_last_run,
            c_id: rng.random_range(0..=1023),
            ol_i_id: rng.random_range(0..=8191),
        }
    }
}

/// Picks a transaction type by weight.
#[derive(Debug, Clone)]
pub struct Mix {
    cumulative: Vec<u64>,
}

impl Mix {
    /// A mix over these weights (at least one must be positive).
    ///
    /// # Panics
    /// If every weight is zero.
    #[must_use]
    pub fn new(weights: impl IntoIterator<Item = u32>) -> Self {
        let mut total = 0u64;
        let cumulative: Vec<u64> = weights
            .into_iter()
            .map(|w| {
                total += u64::from(w);
                total
            })
            .collect();
        assert!(total > 0, "a mix with no weight");
        Self { cumulative }
    }

    /// The index of the next type.
    pub fn pick(&self, rng: &mut WorkloadRng) -> usize {
        let total = *self.cumulative.last().expect("non-empty");
        let x = rng.random_range(0..total);
        self.cumulative.partition_point(|&c| c <= x)
    }
}

const ALNUM: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Fills `out[..len]` with a random alphanumeric string of length in `[min, max]` (TPC-C's
/// "a-string", clause 4.3.2.2) and zeroes the rest; returns the length.
pub fn astring(rng: &mut WorkloadRng, out: &mut [u8], min: usize, max: usize) -> usize {
    let len = rng.random_range(min..=max.min(out.len()));
    for b in &mut out[..len] {
        *b = ALNUM[rng.random_range(0..ALNUM.len())];
    }
    out[len..].fill(0);
    len
}

/// Fills `out[..len]` with random decimal digits, length in `[min, max]` (TPC-C "n-string").
pub fn nstring(rng: &mut WorkloadRng, out: &mut [u8], min: usize, max: usize) -> usize {
    let len = rng.random_range(min..=max.min(out.len()));
    for b in &mut out[..len] {
        *b = b'0' + rng.random_range(0..10u8);
    }
    out[len..].fill(0);
    len
}

/// Fills `out` with random upper-case letters (TATP's data fields).
pub fn upper(rng: &mut WorkloadRng, out: &mut [u8]) {
    for b in out {
        *b = b'A' + rng.random_range(0..26u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let c = KeyChooser::new(1000, KeyDistribution::Zipf { theta: 0.99 }, false);
        let mut rng = rng_for(1, 2);
        let mut hits = [0u32; 1000];
        for _ in 0..20_000 {
            hits[c.next_key(&mut rng) as usize] += 1;
        }
        // rank 1 gets ~1/H(1000, 0.99) ≈ 13 % of the draws.
        assert!(hits[0] > 2000, "{}", hits[0]);
        assert!(hits[0] > 5 * hits[10]);
    }

    #[test]
    fn scramble_is_a_permutation() {
        for n in [1u64, 2, 10, 97, 1000] {
            let c = KeyChooser::new(n, KeyDistribution::Uniform, true);
            let (a, b) = c.scramble.expect("scrambled");
            let mut seen = vec![false; n as usize];
            for r in 0..n {
                let k = ((u128::from(a) * u128::from(r) + u128::from(b)) % u128::from(n)) as usize;
                assert!(!seen[k]);
                seen[k] = true;
            }
        }
    }

    #[test]
    fn tatp_ids_in_range_and_non_uniform() {
        let mut rng = rng_for(3, 4);
        let p = 100_000;
        let mut low_half = 0;
        for _ in 0..10_000 {
            let s = tatp_subscriber_id(&mut rng, p);
            assert!((1..=p).contains(&s));
            if s <= p / 2 {
                low_half += 1;
            }
        }
        // OR-ing with rnd(0, 65535) pushes ids up: fewer than half land in the lower half.
        assert!(low_half < 5000, "{low_half}");
        assert_eq!(tatp_a(1_000_000), 65_535);
        assert_eq!(tatp_a(1_000_001), 1_048_575);
        assert_eq!(tatp_a(20_000_000), 2_097_151);
    }

    #[test]
    fn nurand_constants_obey_clause_2_1_6_1() {
        for seed in 0..200 {
            let c = NuRandConstants::new(seed);
            let d = c.c_last_run.abs_diff(c.c_last_load);
            assert!((65..=119).contains(&d) && d != 96 && d != 112);
            assert!(c.c_id <= 1023 && c.ol_i_id <= 8191);
        }
        let mut rng = rng_for(5, 6);
        for _ in 0..1000 {
            let v = nurand(&mut rng, 1023, 7, 1, 3000);
            assert!((1..=3000).contains(&v));
        }
    }

    #[test]
    fn mix_picks_by_weight() {
        let m = Mix::new([0, 3, 1]);
        let mut rng = rng_for(7, 8);
        let mut n = [0u32; 3];
        for _ in 0..4000 {
            n[m.pick(&mut rng)] += 1;
        }
        assert_eq!(n[0], 0);
        assert!((2800..3200).contains(&n[1]), "{n:?}");
    }
}

//! How the benchmarks' retry loop ([`crate::execute_with_reasons`]) waits before trying an
//! aborted transaction again.
//!
//! [`Backoff::None`] retries at once (the harness's behaviour before this policy, and its
//! default). [`Backoff::Exponential`] is randomized exponential backoff with full jitter:
//! after the `n`-th failed try of a transaction the coordinator waits a delay drawn
//! uniformly from `[0, min(cap, base × 2^(n−1))]` before the next try. The draws come from
//! a per-coordinator seeded generator, so a simulator run stays deterministic, and the wait
//! is a sleep on the coordinator's [`Clock`] (virtual time in the simulator, real time on
//! a fabric): the policy names no executor.
//!
//! Full jitter rather than a fixed doubling: coordinators that aborted on the same hot
//! record at the same instant (TPC-C's WAREHOUSE and DISTRICT rows) would otherwise retry
//! in lockstep and meet again.

use core::fmt;
use core::str::FromStr;
use std::cell::Cell;
use std::rc::Rc;

use dmem_layout::mix::splitmix64;
use dmem_verbs::{Clock, Nanos};
use dmem_workloads::Pause;

/// The longest base or cap accepted, µs (one second): a longer wait is a typo, not a
/// policy.
pub const MAX_BACKOFF_US: f64 = 1_000_000.0;

/// A retry policy's wait between a failed try and the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backoff {
    /// Retry at once.
    #[default]
    None,
    /// Randomized exponential backoff (full jitter): after the `n`-th failed try wait a
    /// uniform draw from `[0, min(cap_ns, base_ns × 2^(n−1))]`.
    Exponential {
        /// The bound of the first wait, ns (at least 1).
        base_ns: Nanos,
        /// The largest bound, ns (at least `base_ns`).
        cap_ns: Nanos,
    },
}

/// A backoff that could not be parsed (`none` or `exp:BASE_US:CAP_US`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("backoff `{given}`: {why} (expected `none` or `exp:BASE_US:CAP_US`, e.g. `exp:10:200`)")]
pub struct BadBackoff {
    given: String,
    why: &'static str,
}

impl Backoff {
    /// The bound of the wait after `failed` failed tries (at least 1): `min(cap, base ×
    /// 2^(failed−1))`, 0 for [`Backoff::None`].
    #[must_use]
    pub fn ceiling(self, failed: u32) -> Nanos {
        match self {
            Backoff::None => 0,
            Backoff::Exponential { base_ns, cap_ns } => {
                let doublings = failed.saturating_sub(1).min(63);
                base_ns
                    .checked_mul(1 << doublings)
                    .map_or(cap_ns, |b| b.min(cap_ns))
            }
        }
    }
}

impl fmt::Display for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Backoff::None => f.write_str("none"),
            #[expect(
                clippy::cast_precision_loss,
                reason = "display of a bound below one second"
            )]
            Backoff::Exponential { base_ns, cap_ns } => {
                write!(f, "exp:{}:{}", base_ns as f64 / 1e3, cap_ns as f64 / 1e3)
            }
        }
    }
}

impl FromStr for Backoff {
    type Err = BadBackoff;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why| BadBackoff {
            given: s.to_owned(),
            why,
        };
        if s == "none" {
            return Ok(Backoff::None);
        }
        let mut parts = s.split(':');
        if parts.next() != Some("exp") {
            return Err(bad("unknown policy"));
        }
        let (Some(base), Some(cap), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("`exp` takes a base and a cap in µs"));
        };
        let micros = |v: &str, what| -> Result<Nanos, BadBackoff> {
            let us: f64 = v.trim().parse().map_err(|_| bad(what))?;
            if !us.is_finite() || us <= 0.0 || us > MAX_BACKOFF_US {
                return Err(bad("base and cap must be positive µs, at most one second"));
            }
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "checked positive and at most one second"
            )]
            let ns = (us * 1e3).round().max(1.0) as Nanos;
            Ok(ns)
        };
        let base_ns = micros(base, "the base is not a number of µs")?;
        let cap_ns = micros(cap, "the cap is not a number of µs")?;
        if cap_ns < base_ns {
            return Err(bad("the cap is below the base"));
        }
        Ok(Backoff::Exponential { base_ns, cap_ns })
    }
}

/// One coordinator's [`Backoff`]: its seeded draws and its clock ([`Pause`] for
/// [`dmem_workloads::execute_noting`]).
pub struct BackoffPause<K> {
    backoff: Backoff,
    clock: K,
    random: u64,
    /// Where the waits are summed (ns), shared by a run's coordinators.
    waited: Rc<Cell<Nanos>>,
}

impl<K: Clock> BackoffPause<K> {
    /// `backoff` for coordinator `coordinator` of a run seeded `seed`, sleeping on `clock`:
    /// its draws are seeded from both (each coordinator its own sequence), its waits summed
    /// into `waited`.
    #[must_use]
    pub fn new(
        backoff: Backoff,
        clock: K,
        seed: u64,
        coordinator: u16,
        waited: Rc<Cell<Nanos>>,
    ) -> Self {
        Self {
            backoff,
            clock,
            random: splitmix64(seed ^ 0xbac0_ff00 ^ (u64::from(coordinator) << 24)),
            waited,
        }
    }

    /// The wait after `failed` failed tries: a uniform draw from `[0,
    /// backoff.ceiling(failed)]` (no draw for [`Backoff::None`]).
    pub fn delay(&mut self, failed: u32) -> Nanos {
        let ceiling = self.backoff.ceiling(failed);
        if ceiling == 0 {
            return 0;
        }
        self.random = splitmix64(self.random);
        self.random % (ceiling + 1)
    }
}

impl<K: Clock> Pause for BackoffPause<K> {
    async fn before_retry(&mut self, failed: u32) {
        let delay = self.delay(failed);
        if delay > 0 {
            self.waited.set(self.waited.get().saturating_add(delay));
            self.clock.sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock that never sleeps (only [`BackoffPause::delay`] is exercised).
    struct Still;

    impl Clock for Still {
        fn now(&self) -> Nanos {
            0
        }
        async fn sleep_until(&self, _deadline: Nanos) {}
        fn cpu(&self, _ns: Nanos) {}
    }

    fn pause(backoff: &str, seed: u64) -> BackoffPause<Still> {
        BackoffPause::new(
            backoff.parse().expect("valid"),
            Still,
            seed,
            0,
            Rc::default(),
        )
    }

    #[test]
    fn parses_and_refuses_with_one_line() {
        assert_eq!("none".parse(), Ok(Backoff::None));
        assert_eq!(
            "exp:10:200".parse(),
            Ok(Backoff::Exponential {
                base_ns: 10_000,
                cap_ns: 200_000
            })
        );
        assert_eq!(
            "exp:0.5:2".parse(),
            Ok(Backoff::Exponential {
                base_ns: 500,
                cap_ns: 2_000
            })
        );
        assert_eq!(
            "exp:0.5:2".parse::<Backoff>().map(|b| b.to_string()),
            Ok("exp:0.5:2".into())
        );
        for bad in [
            "",
            "exp",
            "exp:10",
            "exp:10:5",
            "exp:0:10",
            "exp:-1:10",
            "exp:x:10",
            "exp:10:y",
            "exp:10:20:30",
            "linear:1:2",
            "exp:1:2000000",
            "exp:NaN:10",
        ] {
            let e = bad.parse::<Backoff>().expect_err(bad).to_string();
            assert!(!e.contains('\n') && e.contains("exp:BASE_US:CAP_US"), "{e}");
        }
    }

    #[test]
    fn ceilings_double_from_the_base_up_to_the_cap() {
        let b: Backoff = "exp:10:75".parse().expect("valid");
        let ceilings: Vec<Nanos> = (1..=6).map(|n| b.ceiling(n)).collect();
        assert_eq!(ceilings, [10_000, 20_000, 40_000, 75_000, 75_000, 75_000]);
        assert_eq!(b.ceiling(u32::MAX), 75_000, "no overflow past 63 doublings");
        assert_eq!(Backoff::None.ceiling(5), 0);
    }

    #[test]
    fn delays_stay_within_their_ceiling_and_spread_over_it() {
        let mut p = pause("exp:1:64", 7);
        for failed in 1..=10 {
            let ceiling = Backoff::Exponential {
                base_ns: 1_000,
                cap_ns: 64_000,
            }
            .ceiling(failed);
            let draws: Vec<Nanos> = (0..2_000).map(|_| p.delay(failed)).collect();
            assert!(draws.iter().all(|&d| d <= ceiling), "failed {failed}");
            // Full jitter: both halves of [0, ceiling] are drawn.
            assert!(draws.iter().any(|&d| d < ceiling / 2), "failed {failed}");
            assert!(draws.iter().any(|&d| d > ceiling / 2), "failed {failed}");
        }
        let mut none = pause("none", 7);
        assert!((1..100).all(|n| none.delay(n) == 0));
    }

    #[test]
    fn the_same_seed_draws_the_same_delays_and_another_seed_others() {
        let draws = |seed| {
            let mut p = pause("exp:5:500", seed);
            (1..=40).map(|n| p.delay(n % 8 + 1)).collect::<Vec<_>>()
        };
        assert_eq!(draws(1), draws(1));
        assert_ne!(draws(1), draws(2));
    }
}

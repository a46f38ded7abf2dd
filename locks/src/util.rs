//! Small helpers shared by the protocols: backoff, a seeded generator, waiting for a
//! message with a deadline.

use core::future::{Future, poll_fn};
use core::pin::pin;
use core::task::Poll;

use dmem_verbs::{Clock, Message, Nanos, Verbs, VerbsError};

/// Truncated exponential backoff (DecLock §2.3 on DSLR+, after SMART): the `k`-th
/// consecutive wait lasts a uniformly random time in `[d/2, d]` with
/// `d = min(base_ns * 2^k, max_ns)`. `base_ns == 0` disables waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First delay bound, ns (0: no backoff).
    pub base_ns: Nanos,
    /// Largest delay, ns (the truncation).
    pub max_ns: Nanos,
}

impl Backoff {
    /// No waiting between retries.
    pub const NONE: Self = Self {
        base_ns: 0,
        max_ns: 0,
    };

    /// The delay before retry number `attempt` (0-based), drawn with `rng`.
    #[must_use]
    pub fn delay(&self, attempt: u32, rng: &mut Rng) -> Nanos {
        if self.base_ns == 0 {
            return 0;
        }
        let bound = self
            .base_ns
            .saturating_mul(1u64 << attempt.min(32))
            .min(self.max_ns.max(self.base_ns));
        let half = bound / 2;
        half + rng.below(bound - half + 1)
    }

    /// Sleeps before retry number `attempt`.
    pub(crate) async fn wait<C: Clock>(&self, clock: &C, attempt: u32, rng: &mut Rng) {
        let d = self.delay(attempt, rng);
        if d > 0 {
            clock.sleep(d).await;
        }
    }
}

/// xorshift64* generator for backoff jitter: deterministic per seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value).
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Either of two outcomes.
pub(crate) enum Either<A, B> {
    Left(A),
    Right(B),
}

/// Polls both futures; resolves with the first that is ready (`a` wins ties). The other is
/// dropped: a backend's receive future must not lose a message it has not returned.
pub(crate) async fn select<A: Future, B: Future>(a: A, b: B) -> Either<A::Output, B::Output> {
    let mut a = pin!(a);
    let mut b = pin!(b);
    poll_fn(|cx| {
        if let Poll::Ready(x) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::Left(x));
        }
        if let Poll::Ready(y) = b.as_mut().poll(cx) {
            return Poll::Ready(Either::Right(y));
        }
        Poll::Pending
    })
    .await
}

/// The next message for `ctx`, or `None` once `deadline` has passed:
/// [`dmem_verbs::recv_until`], except that past `deadline` it only takes a message already
/// queued and arms no receive (an armed receive would wake the lock's task later for
/// nothing).
pub(crate) async fn recv_before<V: Verbs + Clock>(
    ctx: &V,
    deadline: Nanos,
) -> Result<Option<Message>, VerbsError> {
    if ctx.now() >= deadline {
        return ctx.try_recv();
    }
    dmem_verbs::recv_until(ctx, deadline).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_truncated_and_jittered() {
        let b = Backoff {
            base_ns: 1000,
            max_ns: 8000,
        };
        let mut rng = Rng::new(7);
        for attempt in 0..40 {
            let d = b.delay(attempt, &mut rng);
            let bound = (1000u64 << attempt.min(20)).min(8000);
            assert!(d >= bound / 2 && d <= bound, "attempt {attempt}: {d}");
        }
        assert_eq!(Backoff::NONE.delay(5, &mut rng), 0);
    }
}

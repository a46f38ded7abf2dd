//! The reader-writer CAS spinlock of FORD/Sherman-style systems (DecLock §2.2, the
//! reader-writer variant the paper compares against).
//!
//! One 8-byte word:
//!
//! ```text
//!  63   62            32 31                     0
//! +----+----------------+------------------------+
//! | W  | writer id      | shared holder count    |
//! +----+----------------+------------------------+
//! ```
//!
//! * Exclusive acquire: `CAS(0 → W | id)`, retried until it succeeds.
//! * Shared acquire: `CAS(c → c + 1)` with a guess `c` of the current count (first 0);
//!   a failed CAS returns the word, which becomes the next guess unless a writer holds it.
//! * Exclusive release: `FAA(−(W | id))`; shared release: `FAA(−1)`.
//!
//! Waiters retry blindly: this is the fail-and-retry design whose MN-NIC cost DecLock
//! measures (§2.2 Issue #1). Backoff between retries is optional ([`Backoff::NONE`] by
//! default, as in FORD).

use dmem_verbs::{Clock, Nanos, RemoteAddr, Verbs, VerbsExt};

use crate::util::Rng;
use crate::{Backoff, HeldLock, LockError, LockLayout, LockMode, LockStats, RwLockClient};

/// Writer bit.
pub const WRITER: u64 = 1 << 63;
const COUNT_MASK: u64 = (1 << 32) - 1;

/// The word an exclusive holder `client` installs.
#[must_use]
pub const fn exclusive_word(client: u32) -> u64 {
    WRITER | (((client & 0x7FFF_FFFF) as u64) << 32)
}

/// Given the word a failed shared CAS returned, the guess for the next attempt: the word
/// itself if no writer holds the lock, else 0 (wait for the free lock).
#[must_use]
pub const fn next_shared_guess(observed: u64) -> u64 {
    if observed & WRITER != 0 { 0 } else { observed }
}

/// Whether a CAS that expected `expect` and returned `observed` succeeded.
#[must_use]
pub const fn cas_succeeded(expect: u64, observed: u64) -> bool {
    expect == observed
}

/// Layout of a CAS lock: one zero word.
#[must_use]
pub fn layout() -> LockLayout {
    LockLayout {
        bytes: 8,
        initial: alloc::vec![0; 8],
    }
}

/// Settings of [`CasLockClient`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CasLockConfig {
    /// Wait between failed CASes.
    pub backoff: Backoff,
}

impl Default for CasLockConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff::NONE,
        }
    }
}

/// One CAS-spinlock client.
#[derive(Debug)]
pub struct CasLockClient<V> {
    ctx: V,
    id: u32,
    config: CasLockConfig,
    stats: LockStats,
    rng: Rng,
}

impl<V: Verbs + Clock> CasLockClient<V> {
    /// A client with id `id` (stored in the word while it holds a lock exclusively).
    pub fn new(ctx: V, id: u32, config: CasLockConfig, seed: u64) -> Self {
        Self {
            ctx,
            id,
            config,
            stats: LockStats::default(),
            rng: Rng::new(seed),
        }
    }

    /// The verbs context.
    pub fn context(&self) -> &V {
        &self.ctx
    }

    async fn acquire_inner(
        &mut self,
        lock: RemoteAddr,
        mode: LockMode,
    ) -> Result<HeldLock, LockError> {
        let mut attempt = 0u32;
        let mut guess = 0u64;
        loop {
            let swap = match mode {
                LockMode::Exclusive => exclusive_word(self.id),
                LockMode::Shared => guess + 1,
            };
            let observed = self.ctx.cas(lock, guess, swap).await?;
            self.stats.acquire_mn_ops += 1;
            if cas_succeeded(guess, observed) {
                self.stats.acquisitions += 1;
                return Ok(HeldLock::new(lock, mode));
            }
            self.stats.retries += 1;
            if mode == LockMode::Shared {
                guess = next_shared_guess(observed);
                if observed & WRITER == 0 {
                    // Readers only raced each other: retry at once with the fresh count.
                    continue;
                }
            }
            self.config
                .backoff
                .wait(&self.ctx, attempt, &mut self.rng)
                .await;
            attempt = attempt.saturating_add(1);
        }
    }
}

impl<V: Verbs + Clock> RwLockClient for CasLockClient<V> {
    async fn acquire(&mut self, lock: RemoteAddr, mode: LockMode) -> Result<HeldLock, LockError> {
        self.acquire_inner(lock, mode).await
    }

    async fn release(&mut self, held: HeldLock) -> Result<(), LockError> {
        let delta = match held.mode {
            LockMode::Exclusive => exclusive_word(self.id).wrapping_neg(),
            LockMode::Shared => 1u64.wrapping_neg(),
        };
        let before = self.ctx.faa(held.addr, delta).await?;
        self.stats.release_mn_ops += 1;
        self.stats.releases += 1;
        let ok = match held.mode {
            LockMode::Exclusive => before == exclusive_word(self.id),
            LockMode::Shared => before & WRITER == 0 && before & COUNT_MASK > 0,
        };
        if ok {
            Ok(())
        } else {
            Err(LockError::Corrupt(
                "CAS lock released in a mode it was not held in",
            ))
        }
    }

    async fn idle_until(&mut self, deadline: Nanos) -> Result<(), LockError> {
        self.ctx.sleep_until(deadline).await;
        Ok(())
    }

    fn stats(&self) -> &LockStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_decisions() {
        let w = exclusive_word(5);
        assert_ne!(w & WRITER, 0);
        assert_eq!((w >> 32) & 0x7FFF_FFFF, 5);
        assert_eq!(next_shared_guess(w), 0);
        assert_eq!(next_shared_guess(3), 3);
        assert!(cas_succeeded(3, 3));
        assert!(!cas_succeeded(0, 3));
        // The release FAA of a writer returns the word to zero.
        assert_eq!(w.wrapping_add(exclusive_word(5).wrapping_neg()), 0);
    }
}

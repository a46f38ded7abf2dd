//! DSLR+: DSLR's reader-writer ticket lock on one FAA-able word, with truncated
//! exponential backoff between checks (DecLock §2.3; DSLR, SIGMOD'18).
//!
//! ```text
//!  63          48 47          32 31          16 15           0
//! +--------------+--------------+--------------+--------------+
//! | max_x        | max_s        | n_x          | n_s          |
//! | writer tickets issued       | writers out  | readers out  |
//! +--------------+--------------+--------------+--------------+
//! ```
//!
//! * Acquire: FAA adds 1 to `max_x` (exclusive) or `max_s` (shared); the returned word is
//!   the ticket. A reader holds once `n_x` reaches the ticket's `max_x` (every earlier
//!   writer left); a writer once `n_x` and `n_s` reach the ticket's `max_x` and `max_s`
//!   (every earlier client left). Until then the client READs the word, waiting
//!   between READs with truncated exponential backoff (the "+" of DSLR+, after SMART).
//! * Release: FAA adds 1 to `n_x` or `n_s`.
//!
//! Ticket exhaustion (DSLR §4.3): counters are 16 bits and FAA cannot be bounded, so a
//! ticket whose `max_x` or `max_s` is at least [`THRESHOLD`] (2^15) is invalid: its
//! holder undoes its FAA and retries later. Valid tickets are a prefix of the FAA order
//! (once a counter reaches the threshold every later FAA sees it), so no valid client
//! waits for an invalid one. The client whose FAA takes a counter to the threshold holds
//! a normal ticket and, after its release, waits until every valid ticket is released and
//! every invalid increment undone, then CASes the word back to zero. Counters stay below
//! `2^15 + clients`, so no field carries into the next.

use dmem_verbs::{Clock, Nanos, PostList, RemoteAddr, Verbs, VerbsExt};

use crate::util::Rng;
use crate::{Backoff, HeldLock, LockError, LockLayout, LockMode, LockStats, RwLockClient};

/// Tickets at or above this value are invalid until the word is reset.
pub const THRESHOLD: u64 = 1 << 15;

/// The four counters of a DSLR word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DslrWord {
    /// Writer tickets issued.
    pub max_x: u64,
    /// Reader tickets issued.
    pub max_s: u64,
    /// Writers released.
    pub n_x: u64,
    /// Readers released.
    pub n_s: u64,
}

impl DslrWord {
    /// Decodes a native word.
    #[must_use]
    pub const fn from_raw(raw: u64) -> Self {
        Self {
            max_x: raw >> 48,
            max_s: (raw >> 32) & 0xFFFF,
            n_x: (raw >> 16) & 0xFFFF,
            n_s: raw & 0xFFFF,
        }
    }

    /// Encodes the word.
    #[must_use]
    pub const fn raw(self) -> u64 {
        (self.max_x << 48) | (self.max_s << 32) | (self.n_x << 16) | self.n_s
    }

    /// FAA delta that takes a ticket in `mode`.
    #[must_use]
    pub const fn acquire_delta(mode: LockMode) -> u64 {
        match mode {
            LockMode::Exclusive => 1 << 48,
            LockMode::Shared => 1 << 32,
        }
    }

    /// FAA delta that releases a ticket of `mode`.
    #[must_use]
    pub const fn release_delta(mode: LockMode) -> u64 {
        match mode {
            LockMode::Exclusive => 1 << 16,
            LockMode::Shared => 1,
        }
    }

    /// Whether the ticket this word was returned as (the value before the caller's FAA)
    /// is valid, i.e. taken before the counters reached [`THRESHOLD`].
    #[must_use]
    pub const fn ticket_is_valid(self) -> bool {
        self.max_x < THRESHOLD && self.max_s < THRESHOLD
    }

    /// Whether the valid ticket `ticket` in `mode` makes the caller responsible for the
    /// reset: its FAA takes a counter to [`THRESHOLD`].
    #[must_use]
    pub const fn ticket_resets(ticket: Self, mode: LockMode) -> bool {
        match mode {
            LockMode::Exclusive => ticket.max_x + 1 == THRESHOLD,
            LockMode::Shared => ticket.max_s + 1 == THRESHOLD,
        }
    }

    /// Whether a client holding ticket `ticket` in `mode` owns the lock, given the current
    /// word `self`.
    #[must_use]
    pub const fn grants(self, ticket: Self, mode: LockMode) -> bool {
        match mode {
            LockMode::Shared => self.n_x >= ticket.max_x,
            LockMode::Exclusive => self.n_x >= ticket.max_x && self.n_s >= ticket.max_s,
        }
    }

    /// The lease-reset barrier (DSLR §4.4): every counter at [`THRESHOLD`], a state the
    /// exhaustion path never reaches (only one counter can pass the threshold there). A
    /// word stuck with holders that never release is CASed here: tickets taken on it are
    /// invalid (undone and retried, as for exhaustion), waiters of the old tickets see it
    /// and give them up, and once it has stood unchanged for a reset lease it is CASed to
    /// zero like an exhausted word.
    pub const BARRIER: Self = Self {
        max_x: THRESHOLD,
        max_s: THRESHOLD,
        n_x: THRESHOLD,
        n_s: THRESHOLD,
    };

    /// Whether the word is the barrier, possibly with undone-to-be tickets on it.
    #[must_use]
    pub const fn is_barrier(self) -> bool {
        self.n_x == THRESHOLD && self.n_s == THRESHOLD
    }

    /// Whether the word is drained after the valid tickets up to `max_x`/`max_s`: all of
    /// them released and no invalid increment outstanding, so it may be CASed to zero.
    #[must_use]
    pub const fn drained(self, max_x: u64, max_s: u64) -> bool {
        self.max_x == max_x && self.max_s == max_s && self.n_x == max_x && self.n_s == max_s
    }
}

/// Layout of a DSLR lock: one zero word.
#[must_use]
pub fn layout() -> LockLayout {
    LockLayout {
        bytes: 8,
        initial: alloc::vec![0; 8],
    }
}

/// Settings of [`DslrClient`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DslrConfig {
    /// Wait between READs of the word while waiting for the ticket's turn.
    pub backoff: Backoff,
}

impl Default for DslrConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff {
                base_ns: 1_000,
                max_ns: 32_000,
            },
        }
    }
}

/// One DSLR+ client.
#[derive(Debug)]
pub struct DslrClient<V> {
    ctx: V,
    config: DslrConfig,
    stats: LockStats,
    rng: Rng,
}

impl<V: Verbs + Clock> DslrClient<V> {
    /// A client; `seed` drives its backoff jitter.
    pub fn new(ctx: V, config: DslrConfig, seed: u64) -> Self {
        Self {
            ctx,
            config,
            stats: LockStats::default(),
            rng: Rng::new(seed),
        }
    }

    /// The verbs context.
    pub fn context(&self) -> &V {
        &self.ctx
    }

    async fn read_word(&mut self, lock: RemoteAddr) -> Result<DslrWord, LockError> {
        let mut list = PostList::new();
        let id = list.read(lock, 8);
        let bytes = self.ctx.post(list).await?.take_bytes(id);
        let raw = u64::from_le_bytes(
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| LockError::Corrupt("short READ of a DSLR word"))?,
        );
        Ok(DslrWord::from_raw(raw))
    }
}

impl<V: Verbs + Clock> RwLockClient for DslrClient<V> {
    async fn acquire(&mut self, lock: RemoteAddr, mode: LockMode) -> Result<HeldLock, LockError> {
        let mut attempt = 0u32;
        loop {
            let ticket =
                DslrWord::from_raw(self.ctx.faa(lock, DslrWord::acquire_delta(mode)).await?);
            self.stats.acquire_mn_ops += 1;
            if !ticket.ticket_is_valid() {
                // Undo and wait for the reset (DSLR §4.3).
                self.ctx
                    .faa(lock, DslrWord::acquire_delta(mode).wrapping_neg())
                    .await?;
                self.stats.acquire_mn_ops += 1;
                self.stats.retries += 1;
                self.config
                    .backoff
                    .wait(&self.ctx, attempt, &mut self.rng)
                    .await;
                attempt = attempt.saturating_add(1);
                continue;
            }
            let mut now = ticket;
            let mut waits = 0u32;
            while !now.grants(ticket, mode) {
                self.config
                    .backoff
                    .wait(&self.ctx, waits, &mut self.rng)
                    .await;
                waits = waits.saturating_add(1);
                now = self.read_word(lock).await?;
                self.stats.acquire_mn_ops += 1;
                self.stats.retries += 1;
            }
            self.stats.acquisitions += 1;
            let mut held = HeldLock::new(lock, mode);
            if DslrWord::ticket_resets(ticket, mode) {
                let (x, s) = match mode {
                    LockMode::Exclusive => (ticket.max_x + 1, ticket.max_s),
                    LockMode::Shared => (ticket.max_x, ticket.max_s + 1),
                };
                held.token = 1;
                held.aux = (x << 16) | s;
            }
            return Ok(held);
        }
    }

    async fn release(&mut self, held: HeldLock) -> Result<(), LockError> {
        self.ctx
            .faa(held.addr, DslrWord::release_delta(held.mode))
            .await?;
        self.stats.release_mn_ops += 1;
        self.stats.releases += 1;
        if held.token == 1 {
            // This client's ticket reached the threshold: drain and reset the word.
            let (max_x, max_s) = (held.aux >> 16, held.aux & 0xFFFF);
            let mut attempt = 0u32;
            loop {
                let now = self.read_word(held.addr).await?;
                self.stats.release_mn_ops += 1;
                if now.drained(max_x, max_s) {
                    let seen = self.ctx.cas(held.addr, now.raw(), 0).await?;
                    self.stats.release_mn_ops += 1;
                    if seen == now.raw() {
                        break;
                    }
                }
                self.config
                    .backoff
                    .wait(&self.ctx, attempt, &mut self.rng)
                    .await;
                attempt = attempt.saturating_add(1);
            }
        }
        Ok(())
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

    const S: LockMode = LockMode::Shared;
    const X: LockMode = LockMode::Exclusive;

    #[test]
    fn tickets_grant_in_fifo_order() {
        // Sequence: S1, X1, S2 take tickets on a fresh word.
        let mut word = 0u64;
        let mut take = |mode| {
            let t = DslrWord::from_raw(word);
            word = word.wrapping_add(DslrWord::acquire_delta(mode));
            t
        };
        let s1 = take(S);
        let x1 = take(X);
        let s2 = take(S);
        let now = DslrWord::from_raw(word);
        assert!(now.grants(s1, S));
        assert!(!now.grants(x1, X), "writer waits for the earlier reader");
        assert!(!now.grants(s2, S), "reader waits for the earlier writer");
        let after_s1 = DslrWord::from_raw(word + DslrWord::release_delta(S));
        assert!(after_s1.grants(x1, X));
        assert!(!after_s1.grants(s2, S));
        let after_x1 =
            DslrWord::from_raw(word + DslrWord::release_delta(S) + DslrWord::release_delta(X));
        assert!(after_x1.grants(s2, S));
    }

    #[test]
    fn threshold_marks_invalid_tickets_and_the_resetter() {
        let t = DslrWord {
            max_x: THRESHOLD - 1,
            max_s: 4,
            n_x: THRESHOLD - 1,
            n_s: 4,
        };
        assert!(t.ticket_is_valid());
        assert!(DslrWord::ticket_resets(t, X));
        assert!(!DslrWord::ticket_resets(t, S));
        let late = DslrWord::from_raw(t.raw() + DslrWord::acquire_delta(X));
        assert!(!late.ticket_is_valid());
        assert!(DslrWord::from_raw(late.raw()).drained(THRESHOLD, 4) == (late.n_x == THRESHOLD));
        let drained = DslrWord {
            max_x: THRESHOLD,
            max_s: 4,
            n_x: THRESHOLD,
            n_s: 4,
        };
        assert!(drained.drained(THRESHOLD, 4));
        assert_eq!(DslrWord::from_raw(drained.raw()), drained);
        assert!(
            !drained.is_barrier(),
            "exhaustion never looks like the barrier"
        );
        let b = DslrWord::BARRIER;
        assert!(b.is_barrier());
        let taken = DslrWord::from_raw(b.raw() + DslrWord::acquire_delta(X));
        assert!(!b.ticket_is_valid() && taken.is_barrier());
        assert_eq!(DslrWord::from_raw(b.raw()), b);
    }
}

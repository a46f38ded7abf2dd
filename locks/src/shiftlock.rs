//! A ShiftLock-style MCS reader-writer lock (DecLock §2.3; ShiftLock, FAST'25), built
//! from DecLock's description: waiting writers are linked MCS-style and handed ownership
//! by their predecessors over CN↔CN messages; readers are counted in the lock state and
//! check it repeatedly; after a few consecutive writer-to-writer hand-overs the lock is
//! handed to every waiting reader (phase-fair batching).
//!
//! This is dmem's own design of that description, not ShiftLock's code. MN state, three
//! 8-byte words:
//!
//! ```text
//! word 0  rin   | gen: 8 (63..56) | readers entered: 48 (55..8) | 0000000 | W (bit 0) |
//! word 1  rout  | readers left (64-bit counter)                                         |
//! word 2  tail  | client id + 1 of the last queued writer, 0 if none                    |
//! ```
//!
//! * Reader acquire: `FAA(rin, +1 reader)`. Without `W` it holds at once. Otherwise it
//!   READs `rin` (with backoff) until `W` is clear or `gen` changed — the writer phase
//!   it arrived in is over — and holds. Reader release: `FAA(rout, +1)`.
//! * Writer acquire: CAS loop that swings `tail` to itself, learning its predecessor. With
//!   a predecessor it sends it an [`LockMsgRepr::McsSuccessor`] and waits for an
//!   [`LockMsgRepr::McsGrant`]. A grant with the gate still closed is a direct hand-over:
//!   it holds. Otherwise (no predecessor, or the predecessor opened the gate) it closes
//!   the gate, `FAA(rin, W + 1 gen)`, and READs `rout` until every reader counted in
//!   the returned `rin` has left.
//! * Writer release: a successor already known and fewer than
//!   [`ShiftLockConfig::handovers`] consecutive hand-overs: grant with the gate closed.
//!   Otherwise open the gate (`FAA(rin, −W)`, letting the waiting readers in), then grant
//!   the successor (it closes the gate again behind those readers), or CAS `tail` from
//!   itself to 0 — if that fails a successor is on its way: wait for its message, grant.
//!
//! The gate is opened before `tail` is released so that a new first writer never adds
//! `W` to a word that still has it (the FAA would carry into the reader count). `gen`
//! sits in the top bits so its wrap leaves the word.

use alloc::vec::Vec;

use dmem_verbs::{Clock, Endpoint, Nanos, PostList, RemoteAddr, Verbs, VerbsExt};
use zerocopy::IntoBytes;

use crate::msg::LockMsgRepr;
use crate::util::Rng;
use crate::{
    Backoff, Directory, HeldLock, LockError, LockLayout, LockMode, LockStats, RwLockClient, lock_id,
};

/// Offset of `rin` in the lock.
pub const RIN: u64 = 0;
/// Offset of `rout`.
pub const ROUT: u64 = 8;
/// Offset of `tail`.
pub const TAIL: u64 = 16;

/// Writer-present bit of `rin`.
pub const W: u64 = 1;
/// One reader in `rin`.
pub const READER: u64 = 1 << 8;
/// One writer phase in `rin`'s `gen`.
pub const GEN: u64 = 1 << 56;
const COUNT_MASK: u64 = (1 << 48) - 1;

/// Readers counted in `rin`.
#[must_use]
pub const fn readers_in(rin: u64) -> u64 {
    (rin >> 8) & COUNT_MASK
}

/// Whether a reader whose FAA returned `arrived` may enter now that `rin` is `now`.
#[must_use]
pub const fn reader_may_enter(arrived: u64, now: u64) -> bool {
    arrived & W == 0 || now & W == 0 || (now >> 56) != (arrived >> 56)
}

/// Whether a writer that closed the gate when `rin` was `closed_at` sees every earlier
/// reader gone, given `rout`.
#[must_use]
pub const fn readers_drained(closed_at: u64, rout: u64) -> bool {
    rout & COUNT_MASK == readers_in(closed_at)
}

/// Layout of a ShiftLock-style lock: three zero words.
#[must_use]
pub fn layout() -> LockLayout {
    LockLayout {
        bytes: 24,
        initial: alloc::vec![0; 24],
    }
}

/// Settings of [`ShiftLockClient`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShiftLockConfig {
    /// Consecutive direct writer hand-overs before the waiting readers are let in.
    pub handovers: u64,
    /// Wait between READs of the lock state (readers waiting, writers draining readers).
    pub backoff: Backoff,
}

impl Default for ShiftLockConfig {
    fn default() -> Self {
        Self {
            handovers: 4,
            backoff: Backoff {
                base_ns: 1_000,
                max_ns: 16_000,
            },
        }
    }
}

/// One ShiftLock-style client.
#[derive(Debug)]
pub struct ShiftLockClient<V> {
    ctx: V,
    id: u32,
    directory: Directory,
    config: ShiftLockConfig,
    stats: LockStats,
    rng: Rng,
    /// Successors that announced themselves: (lock id, client id).
    successors: Vec<(u64, u32)>,
}

impl<V: Verbs + Clock> ShiftLockClient<V> {
    /// A client with id `id`; `directory` lists every client's endpoint.
    ///
    /// # Errors
    /// [`LockError::UnknownClient`] if `id` is not in the directory.
    pub fn new(
        ctx: V,
        id: u32,
        directory: Directory,
        config: ShiftLockConfig,
        seed: u64,
    ) -> Result<Self, LockError> {
        if directory.endpoint(id).is_none() || id == u32::MAX {
            return Err(LockError::UnknownClient(id));
        }
        Ok(Self {
            ctx,
            id,
            directory,
            config,
            stats: LockStats::default(),
            rng: Rng::new(seed),
            successors: Vec::new(),
        })
    }

    /// The verbs context.
    pub fn context(&self) -> &V {
        &self.ctx
    }

    async fn read_word(&mut self, at: RemoteAddr) -> Result<u64, LockError> {
        let mut list = PostList::new();
        let id = list.read(at, 8);
        let bytes = self.ctx.post(list).await?.take_bytes(id);
        bytes
            .as_slice()
            .try_into()
            .map(u64::from_le_bytes)
            .map_err(|_| LockError::Corrupt("short READ of a ShiftLock word"))
    }

    async fn send(&mut self, to_client: u32, msg: LockMsgRepr) -> Result<(), LockError> {
        let to: Endpoint = self
            .directory
            .endpoint(to_client)
            .ok_or(LockError::UnknownClient(to_client))?;
        self.ctx.send(to, msg.emit().as_bytes()).await?;
        self.stats.messages_sent += 1;
        Ok(())
    }

    /// Records a message; returns the grant for `lock` if it is one.
    fn absorb(&mut self, payload: &[u8], lock: Option<u64>) -> Option<(u64, bool)> {
        match LockMsgRepr::parse(payload) {
            Ok(LockMsgRepr::McsSuccessor { lock, client }) => {
                self.successors.push((lock, client));
                None
            }
            Ok(LockMsgRepr::McsGrant {
                lock: l,
                handovers,
                gate_closed,
            }) if Some(l) == lock => Some((handovers, gate_closed)),
            _ => {
                self.stats.stale_messages += 1;
                None
            }
        }
    }

    fn drain_messages(&mut self) -> Result<(), LockError> {
        while let Some(m) = self.ctx.try_recv()? {
            self.absorb(&m.payload, None);
        }
        Ok(())
    }

    fn take_successor(&mut self, lock: u64) -> Option<u32> {
        let i = self.successors.iter().position(|&(l, _)| l == lock)?;
        Some(self.successors.swap_remove(i).1)
    }

    /// Closes the gate and waits for the readers that entered before it.
    async fn close_gate_and_drain(&mut self, addr: RemoteAddr) -> Result<(), LockError> {
        let closed_at = self.ctx.faa(addr.add(RIN), W + GEN).await?;
        self.stats.acquire_mn_ops += 1;
        let mut attempt = 0u32;
        loop {
            // The first check could piggyback on the FAA; a READ keeps it one op per check.
            let rout = self.read_word(addr.add(ROUT)).await?;
            self.stats.acquire_mn_ops += 1;
            if readers_drained(closed_at, rout) {
                return Ok(());
            }
            self.stats.retries += 1;
            self.config
                .backoff
                .wait(&self.ctx, attempt, &mut self.rng)
                .await;
            attempt = attempt.saturating_add(1);
        }
    }

    async fn acquire_writer(&mut self, addr: RemoteAddr) -> Result<HeldLock, LockError> {
        let lock = lock_id(addr);
        let me = u64::from(self.id) + 1;
        let mut guess = 0u64;
        let pred = loop {
            let seen = self.ctx.cas(addr.add(TAIL), guess, me).await?;
            self.stats.acquire_mn_ops += 1;
            if seen == guess {
                break guess;
            }
            self.stats.retries += 1;
            guess = seen;
        };
        let mut held = HeldLock::new(addr, LockMode::Exclusive);
        if pred == 0 {
            self.close_gate_and_drain(addr).await?;
            return Ok(held);
        }
        let announce = LockMsgRepr::McsSuccessor {
            lock,
            client: self.id,
        };
        self.send((pred - 1) as u32, announce).await?;
        let (handovers, gate_closed) = loop {
            let m = self.ctx.recv().await?;
            if let Some(g) = self.absorb(&m.payload, Some(lock)) {
                break g;
            }
        };
        if gate_closed {
            held.token = handovers;
        } else {
            self.close_gate_and_drain(addr).await?;
        }
        Ok(held)
    }

    async fn acquire_reader(&mut self, addr: RemoteAddr) -> Result<HeldLock, LockError> {
        let arrived = self.ctx.faa(addr.add(RIN), READER).await?;
        self.stats.acquire_mn_ops += 1;
        let mut attempt = 0u32;
        let mut now = arrived;
        while !reader_may_enter(arrived, now) {
            self.stats.retries += 1;
            self.config
                .backoff
                .wait(&self.ctx, attempt, &mut self.rng)
                .await;
            attempt = attempt.saturating_add(1);
            now = self.read_word(addr.add(RIN)).await?;
            self.stats.acquire_mn_ops += 1;
        }
        Ok(HeldLock::new(addr, LockMode::Shared))
    }

    async fn release_writer(&mut self, held: HeldLock) -> Result<(), LockError> {
        let addr = held.addr;
        let lock = lock_id(addr);
        self.drain_messages()?;
        let known = self.take_successor(lock);
        if let Some(next) = known
            && held.token + 1 < self.config.handovers
        {
            let grant = LockMsgRepr::McsGrant {
                lock,
                handovers: held.token + 1,
                gate_closed: true,
            };
            return self.send(next, grant).await;
        }
        // Let the waiting readers in; the successor closes the gate behind them.
        self.ctx.faa(addr.add(RIN), W.wrapping_neg()).await?;
        self.stats.release_mn_ops += 1;
        let next = match known {
            Some(next) => next,
            None => {
                let me = u64::from(self.id) + 1;
                let seen = self.ctx.cas(addr.add(TAIL), me, 0).await?;
                self.stats.release_mn_ops += 1;
                if seen == me {
                    return Ok(());
                }
                // A successor swung the tail; its announcement is on the way.
                loop {
                    if let Some(next) = self.take_successor(lock) {
                        break next;
                    }
                    let m = self.ctx.recv().await?;
                    self.absorb(&m.payload, None);
                }
            }
        };
        let grant = LockMsgRepr::McsGrant {
            lock,
            handovers: 0,
            gate_closed: false,
        };
        self.send(next, grant).await
    }
}

impl<V: Verbs + Clock> RwLockClient for ShiftLockClient<V> {
    async fn acquire(&mut self, lock: RemoteAddr, mode: LockMode) -> Result<HeldLock, LockError> {
        let held = match mode {
            LockMode::Exclusive => self.acquire_writer(lock).await?,
            LockMode::Shared => self.acquire_reader(lock).await?,
        };
        self.stats.acquisitions += 1;
        Ok(held)
    }

    async fn release(&mut self, held: HeldLock) -> Result<(), LockError> {
        self.stats.releases += 1;
        match held.mode {
            LockMode::Exclusive => self.release_writer(held).await,
            LockMode::Shared => {
                self.ctx.faa(held.addr.add(ROUT), 1).await?;
                self.stats.release_mn_ops += 1;
                Ok(())
            }
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
    fn reader_gate_decisions() {
        // Free lock: a reader enters at once.
        assert!(reader_may_enter(0, 0));
        // A writer holds (W, gen 1): the reader waits while the phase lasts.
        let closed = W + GEN;
        let arrived = closed + READER;
        assert!(!reader_may_enter(arrived, arrived + READER));
        // The writer opened the gate.
        assert!(reader_may_enter(arrived, arrived - W));
        // Another writer already closed it again: the phase changed, the reader is in.
        assert!(reader_may_enter(arrived, arrived - W + W + GEN));
        // gen wraps out of the word without touching the reader count.
        let top = 255 * GEN + 3 * READER;
        assert_eq!(readers_in(top.wrapping_add(GEN)), 3);
    }

    #[test]
    fn writer_waits_for_readers_counted_before_it() {
        let rin = 5 * READER;
        assert!(!readers_drained(rin, 4));
        assert!(readers_drained(rin, 5));
        assert!(readers_drained((1 << 48) * READER, 1 << 48));
    }
}

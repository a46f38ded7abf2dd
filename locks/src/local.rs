//! DecLock's per-CN local lock table for hierarchical locking (DecLock §5.1 Fig. 9 right,
//! §5.2 Fig. 10, §5.3).
//!
//! Every CN keeps one [`LocalLockTable`], shared by all its clients (coroutines, or
//! threads on a real multi-threaded CN). Clients of one CN contend here first; only the
//! local owner that finds the CN without the CQL lock (the *representative*) enqueues in
//! the MN's CQL queue, so the queue holds at most one entry per CN. Ownership moves
//! between local clients without MN operations while policy allows.
//!
//! A local lock is the paper's `{mtx, state, holdercnt, cqlheld, wq}` plus the prefetched
//! remote timestamp and the CN's reset counter of the lock (§4.4):
//!
//! ```text
//! LocalLock
//! +-------------+----------------+------------------+--------------------------------+
//! | owner mode  | holders (ids)  | cql: NotHeld |   | wq: (client, mode, ts, waker)* |
//! | Free/S/X    | = holdercnt    | Acquiring | Held | remote_ts, generation,         |
//! |             |                | {mode, count} |  | reset_count                    |
//! |             |                | Releasing        |                                |
//! +-------------+----------------+------------------+--------------------------------+
//! ```
//!
//! Deviations from Fig. 10, each because dmem's lock calls are `async`:
//! * the paper holds `mtx` across the CQL acquisition and release; a spinlock must not be
//!   held across an `.await`, so the CQL lock has the explicit states `Acquiring` and
//!   `Releasing`, during which arriving clients queue in `wq` (as they would block on
//!   `mtx`). This also keeps the invariant "one CQL entry per CN";
//! * holders are kept by id, not only counted, so that a reset signal (§4.4) can tell a
//!   local holder (answers after its release) from a waiter (answers at once);
//! * a reader joins a CN's shared ownership (Fig. 10 lines 4–5) only while the CQL hold
//!   predates no reset signal, and local hand-over with the CQL lock also requires that,
//!   so a lock under reset is never handed on;
//! * only one prefetch of the remote timestamp is outstanding per CQL hold (§5.3 has
//!   every new local waiter prefetch; a second concurrent READ would fetch the same).
//!
//! The mutex is `crate::sync::SpinMutex`, one per shard of locks; under `--cfg loom` its
//! atomics come from loom and `tests/loom.rs` model-checks acquire, release and hand-over.

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;
use core::task::Waker;

use dmem_layout::cql::CqlTimestamp;
use dmem_verbs::Nanos;

use crate::sync::{AtomicU64, Ordering, SpinMutex};
use crate::{LockError, LockMode};

/// How a CN shares a lock between its own waiters and remote ones (DecLock §5.3
/// "Fairness policies").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FairnessPolicy {
    /// Task-fair (DecLock-TF): a reader shares ownership with the adjacent readers at the
    /// head of the wait queue, stopping at a writer or at a waiter later than the earliest
    /// remote waiter; after a CQL release the first local waiter reacquires.
    TaskFair,
    /// Phase-fair (DecLock-PF): a reader shares ownership with every waiting reader; after
    /// a writer's release the first waiting reader is chosen.
    PhaseFair,
}

/// The CN's relation to the CQL lock in MN memory (the paper's `cqlheld`, extended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqlHold {
    /// The CN has no entry in the CQL queue.
    NotHeld,
    /// A local owner (the representative) is enqueuing or waiting for the CQL lock.
    Acquiring,
    /// The CN holds the CQL lock in `mode`, acquired while the CN's reset counter of the
    /// lock was `reset_count`.
    Held {
        /// Mode of the CQL hold.
        mode: LockMode,
        /// The CN's reset counter when the acquiring FAA was sent.
        reset_count: u32,
    },
    /// The last local holder is dequeuing the CN from the CQL queue.
    Releasing,
}

/// What a client does after [`LocalLockTable::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalAcquire {
    /// It holds the lock: it joined the CN's shared ownership (Fig. 10 lines 4–5).
    Joined,
    /// It owns the local lock and must acquire the CQL lock, then report with
    /// [`LocalLockTable::cql_acquired`] (Fig. 10 lines 12–15).
    AcquireCql,
    /// It waits in the local wait queue ([`LocalLockTable::poll_grant`]). With
    /// `prefetch: Some(generation)` it should first READ the CQL queue and report the
    /// earliest remote timestamp with [`LocalLockTable::set_remote_ts`] (§5.3).
    Wait {
        /// Generation of the CQL hold the prefetch is for.
        prefetch: Option<u64>,
    },
}

/// How a waiting client was granted the local lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalGrant {
    /// Ownership came with the CN's CQL hold: the client holds the lock.
    WithCql,
    /// The client owns the local lock but the CN does not hold the CQL lock: it must
    /// acquire it (Fig. 11 ➂).
    AcquireCql,
}

/// What a releasing client does after [`LocalLockTable::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalRelease {
    /// Other local clients still hold the lock (Fig. 10 lines 21–23), or ownership and
    /// the CQL lock went to local waiters (Fig. 11 ➃): nothing to do on the MN.
    Done,
    /// Release the CQL lock held in `mode`, then call
    /// [`LocalLockTable::finish_cql_release`] (Fig. 10 lines 26–28).
    ReleaseCql {
        /// Mode the CN held the CQL lock in.
        mode: LockMode,
    },
}

#[derive(Debug)]
struct Waiter {
    client: u32,
    mode: LockMode,
    ts: CqlTimestamp,
    waker: Option<Waker>,
}

/// One local lock (Fig. 9 right). Plain data; the table guards it with its shard's mutex.
#[derive(Debug)]
pub struct LocalLock {
    owner: Option<LockMode>,
    holders: Vec<u32>,
    cql: CqlHold,
    wq: VecDeque<Waiter>,
    writers_waiting: usize,
    granted: Vec<(u32, LocalGrant)>,
    remote_ts: Option<CqlTimestamp>,
    generation: u64,
    prefetching: bool,
    reset_count: u32,
}

impl LocalLock {
    fn new() -> Self {
        Self {
            owner: None,
            holders: Vec::new(),
            cql: CqlHold::NotHeld,
            wq: VecDeque::new(),
            writers_waiting: 0,
            granted: Vec::new(),
            remote_ts: None,
            generation: 0,
            prefetching: false,
            reset_count: 0,
        }
    }

    fn is_idle(&self) -> bool {
        self.owner.is_none() && self.wq.is_empty() && self.granted.is_empty()
    }

    fn hold_is_current(&self) -> bool {
        matches!(self.cql, CqlHold::Held { reset_count, .. } if reset_count == self.reset_count)
    }

    /// Whether waiter `w` may go before the earliest remote waiter (§5.3): yes if none is
    /// known (not prefetched means none, or none earlier than every local waiter).
    fn before_remote(&self, w: &Waiter) -> bool {
        self.remote_ts.is_none_or(|r| w.ts.is_earlier_than(r))
    }

    fn grant(&mut self, i: usize, how: LocalGrant, wakers: &mut Vec<Waker>) -> LockMode {
        let w = self.wq.remove(i).expect("index from the queue");
        if w.mode == LockMode::Exclusive {
            self.writers_waiting -= 1;
        }
        self.holders.push(w.client);
        self.granted.push((w.client, how));
        wakers.extend(w.waker);
        w.mode
    }

    /// Fig. 10 lines 16–17: a reader owning the lock with a current CQL hold shares it.
    fn share_with_readers(&mut self, policy: FairnessPolicy, wakers: &mut Vec<Waker>) {
        if !self.hold_is_current() {
            return;
        }
        match policy {
            FairnessPolicy::TaskFair => {
                while let Some(w) = self.wq.front() {
                    if w.mode != LockMode::Shared || !self.before_remote(w) {
                        break;
                    }
                    self.grant(0, LocalGrant::WithCql, wakers);
                }
            }
            FairnessPolicy::PhaseFair => {
                let mut i = 0;
                while i < self.wq.len() {
                    if self.wq[i].mode == LockMode::Shared {
                        self.grant(i, LocalGrant::WithCql, wakers);
                    } else {
                        i += 1;
                    }
                }
            }
        }
    }

    /// The local waiter that gets ownership next (§5.3 "Fairness policies").
    fn select(&self, policy: FairnessPolicy, released: LockMode) -> Option<usize> {
        if self.wq.is_empty() {
            return None;
        }
        match (policy, released) {
            (FairnessPolicy::PhaseFair, LockMode::Exclusive) => Some(
                self.wq
                    .iter()
                    .position(|w| w.mode == LockMode::Shared)
                    .unwrap_or(0),
            ),
            _ => Some(0),
        }
    }

    /// Fig. 10 lines 2–11.
    fn acquire(
        &mut self,
        client: u32,
        mode: LockMode,
        ts: CqlTimestamp,
    ) -> Result<LocalAcquire, LockError> {
        if self.holders.contains(&client) || self.wq.iter().any(|w| w.client == client) {
            return Err(LockError::AlreadyHeld);
        }
        if self.owner == Some(LockMode::Shared)
            && mode == LockMode::Shared
            && self.writers_waiting == 0
            && self.hold_is_current()
        {
            self.holders.push(client);
            return Ok(LocalAcquire::Joined);
        }
        if self.owner.is_none() {
            self.owner = Some(mode);
            self.holders.push(client);
            self.cql = CqlHold::Acquiring;
            return Ok(LocalAcquire::AcquireCql);
        }
        if mode == LockMode::Exclusive {
            self.writers_waiting += 1;
        }
        self.wq.push_back(Waiter {
            client,
            mode,
            ts,
            waker: None,
        });
        let prefetch = matches!(self.cql, CqlHold::Held { .. })
            && self.remote_ts.is_none()
            && !self.prefetching;
        self.prefetching |= prefetch;
        Ok(LocalAcquire::Wait {
            prefetch: prefetch.then_some(self.generation),
        })
    }

    fn poll_grant(
        &mut self,
        client: u32,
        waker: Option<&Waker>,
    ) -> Result<Option<LocalGrant>, LockError> {
        if let Some(i) = self.granted.iter().position(|&(c, _)| c == client) {
            return Ok(Some(self.granted.swap_remove(i).1));
        }
        let w = self
            .wq
            .iter_mut()
            .find(|w| w.client == client)
            .ok_or(LockError::Corrupt("local lock: waiter not queued"))?;
        if let Some(waker) = waker
            && !w.waker.as_ref().is_some_and(|old| old.will_wake(waker))
        {
            w.waker = Some(waker.clone());
        }
        Ok(None)
    }

    fn cql_acquired(
        &mut self,
        mode: LockMode,
        reset_count: u32,
        remote_ts: Option<CqlTimestamp>,
        generation: u64,
        policy: FairnessPolicy,
        wakers: &mut Vec<Waker>,
    ) {
        self.cql = CqlHold::Held { mode, reset_count };
        self.remote_ts = remote_ts;
        self.generation = generation;
        self.prefetching = false;
        if mode == LockMode::Shared {
            self.share_with_readers(policy, wakers);
        }
    }

    /// Fig. 10 lines 19–33.
    fn release(
        &mut self,
        client: u32,
        policy: FairnessPolicy,
        wakers: &mut Vec<Waker>,
    ) -> Result<LocalRelease, LockError> {
        let i = self
            .holders
            .iter()
            .position(|&c| c == client)
            .ok_or(LockError::Corrupt("local lock: release by a non-holder"))?;
        self.holders.swap_remove(i);
        if !self.holders.is_empty() {
            return Ok(LocalRelease::Done);
        }
        let CqlHold::Held { mode, .. } = self.cql else {
            return Err(LockError::Corrupt(
                "local lock: released without the CQL lock",
            ));
        };
        if let Some(i) = self.select(policy, mode) {
            let w = &self.wq[i];
            // §5.3: keep the CQL lock for the local waiter if it is earlier than every
            // remote waiter and needs the same mode (otherwise the CQL lock "must be
            // reacquired to update its state").
            if w.mode == mode && self.before_remote(w) && self.hold_is_current() {
                let granted = self.grant(i, LocalGrant::WithCql, wakers);
                self.owner = Some(granted);
                if granted == LockMode::Shared {
                    self.share_with_readers(policy, wakers);
                }
                return Ok(LocalRelease::Done);
            }
        }
        self.cql = CqlHold::Releasing;
        Ok(LocalRelease::ReleaseCql { mode })
    }

    /// The CN no longer holds the CQL lock (released in `released` mode, or its
    /// acquisition was abandoned): the selected waiter, if any, becomes owner and
    /// reacquires it (Fig. 11 ➂).
    fn cql_gone(&mut self, released: LockMode, policy: FairnessPolicy, wakers: &mut Vec<Waker>) {
        self.cql = CqlHold::NotHeld;
        self.remote_ts = None;
        self.prefetching = false;
        match self.select(policy, released) {
            None => self.owner = None,
            Some(i) => {
                let mode = self.grant(i, LocalGrant::AcquireCql, wakers);
                self.owner = Some(mode);
                self.cql = CqlHold::Acquiring;
            }
        }
    }
}

/// Locks per shard mutex: enough shards that unrelated locks of one CN rarely share one.
const SHARDS: usize = 64;

#[derive(Debug)]
struct Shard {
    locks: BTreeMap<u64, LocalLock>,
    generation: u64,
}

/// A CN's table of local locks, keyed by lock id ([`crate::lock_id`]), shared by all the
/// CN's clients (`Send + Sync`; wrap it in an `Arc`).
#[derive(Debug)]
pub struct LocalLockTable {
    shards: Box<[SpinMutex<Shard>]>,
    policy: FairnessPolicy,
    /// Synchronised time origin (§5.3), `u64::MAX` until the first synchronisation.
    epoch: AtomicU64,
}

/// Wakes local waiters after the shard mutex is released.
fn wake(wakers: Vec<Waker>) {
    for w in wakers {
        w.wake();
    }
}

impl LocalLockTable {
    /// An empty table with fairness policy `policy`.
    #[must_use]
    pub fn new(policy: FairnessPolicy) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| {
                    SpinMutex::new(Shard {
                        locks: BTreeMap::new(),
                        generation: 0,
                    })
                })
                .collect(),
            policy,
            epoch: AtomicU64::new(u64::MAX),
        }
    }

    /// The table's fairness policy.
    pub fn policy(&self) -> FairnessPolicy {
        self.policy
    }

    /// The synchronised time origin, once set.
    pub fn epoch(&self) -> Option<Nanos> {
        match self.epoch.load(Ordering::Acquire) {
            u64::MAX => None,
            e => Some(e),
        }
    }

    /// Records the synchronised time origin (§5.3 "Synchronized time").
    pub fn set_epoch(&self, epoch: Nanos) {
        self.epoch.store(epoch.min(u64::MAX - 1), Ordering::Release);
    }

    fn with<R>(&self, lock: u64, f: impl FnOnce(&mut LocalLock, &mut u64) -> R) -> R {
        let h = (lock ^ (lock >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        self.shards[h as usize % SHARDS].with(|shard| {
            let l = shard.locks.entry(lock).or_insert_with(LocalLock::new);
            let r = f(l, &mut shard.generation);
            if l.is_idle() && l.reset_count == 0 {
                shard.locks.remove(&lock);
            }
            r
        })
    }

    /// A client asks for `lock` in `mode` at timestamp `ts` (Fig. 10 lines 2–11).
    ///
    /// # Errors
    /// [`LockError::AlreadyHeld`] if the client holds or waits for the lock.
    pub fn acquire(
        &self,
        lock: u64,
        client: u32,
        mode: LockMode,
        ts: CqlTimestamp,
    ) -> Result<LocalAcquire, LockError> {
        self.with(lock, |l, _| l.acquire(client, mode, ts))
    }

    /// Whether waiting `client` has been granted `lock`; if not, `waker` is woken when it
    /// is.
    ///
    /// # Errors
    /// [`LockError::Corrupt`] if the client neither waits nor was granted.
    pub fn poll_grant(
        &self,
        lock: u64,
        client: u32,
        waker: Option<&Waker>,
    ) -> Result<Option<LocalGrant>, LockError> {
        self.with(lock, |l, _| l.poll_grant(client, waker))
    }

    /// The representative got the CQL lock in `mode`; `reset_count` is the CN's counter
    /// when its FAA went out, `remote_ts` the earliest remote waiter from the notification
    /// (§5.3: refreshes the prefetched timestamp). A reader shares with waiting readers.
    pub fn cql_acquired(
        &self,
        lock: u64,
        mode: LockMode,
        reset_count: u32,
        remote_ts: Option<CqlTimestamp>,
    ) {
        let policy = self.policy;
        let mut wakers = Vec::new();
        self.with(lock, |l, generation| {
            *generation += 1;
            l.cql_acquired(
                mode,
                reset_count,
                remote_ts,
                *generation,
                policy,
                &mut wakers,
            );
        });
        wake(wakers);
    }

    /// The representative gave up acquiring the CQL lock (an error): ownership passes on.
    pub fn abandon_cql(&self, lock: u64, client: u32) {
        let policy = self.policy;
        let mut wakers = Vec::new();
        self.with(lock, |l, _| {
            l.holders.retain(|&c| c != client);
            if l.holders.is_empty() {
                l.cql_gone(LockMode::Exclusive, policy, &mut wakers);
            }
        });
        wake(wakers);
    }

    /// A holder releases `lock` (Fig. 10 lines 19–33). Local waiters granted here are
    /// woken.
    ///
    /// # Errors
    /// [`LockError::Corrupt`] if `client` does not hold the lock.
    pub fn release(&self, lock: u64, client: u32) -> Result<LocalRelease, LockError> {
        let policy = self.policy;
        let mut wakers = Vec::new();
        let r = self.with(lock, |l, _| l.release(client, policy, &mut wakers));
        wake(wakers);
        r
    }

    /// The CN's CQL release (after [`LocalRelease::ReleaseCql`]) is done: the selected
    /// local waiter becomes owner and reacquires the CQL lock.
    pub fn finish_cql_release(&self, lock: u64, released: LockMode) {
        let policy = self.policy;
        let mut wakers = Vec::new();
        self.with(lock, |l, _| l.cql_gone(released, policy, &mut wakers));
        wake(wakers);
    }

    /// A prefetch for CQL hold `generation` found `ts` as the earliest remote waiter
    /// (`None`: no remote waiter) (§5.3 "Prefetched remote timestamp").
    pub fn set_remote_ts(&self, lock: u64, generation: u64, ts: Option<CqlTimestamp>) {
        self.with(lock, |l, _| {
            if l.generation == generation && matches!(l.cql, CqlHold::Held { .. }) {
                l.prefetching = false;
                if ts.is_some() {
                    l.remote_ts = ts;
                }
            }
        });
    }

    /// The CN's reset counter of `lock` (§4.4, kept per CN as the paper says).
    pub fn reset_count(&self, lock: u64) -> u32 {
        self.with(lock, |l, _| l.reset_count)
    }

    /// Raises the CN's reset counter of `lock` to at least `count`.
    pub fn raise_reset_count(&self, lock: u64, count: u32) {
        self.with(lock, |l, _| l.reset_count = l.reset_count.max(count));
    }

    /// A reset signal with `count` reached `client`: raises the counter (so the stale CQL
    /// hold is no longer shared or handed on) and says whether `client` holds the lock
    /// under the CN's CQL hold (then it answers only after its release, §4.4 step 2).
    pub fn note_reset(&self, lock: u64, client: u32, count: u32) -> bool {
        self.with(lock, |l, _| {
            l.reset_count = l.reset_count.max(count);
            l.holders.contains(&client) && matches!(l.cql, CqlHold::Held { .. })
        })
    }

    /// The CN's CQL state of `lock` and its number of local holders (tests, debugging).
    pub fn inspect(&self, lock: u64) -> (CqlHold, usize, usize) {
        self.with(lock, |l, _| (l.cql, l.holders.len(), l.wq.len()))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const S: LockMode = LockMode::Shared;
    const X: LockMode = LockMode::Exclusive;

    fn ts(t: u16) -> CqlTimestamp {
        CqlTimestamp(t)
    }

    #[test]
    fn first_owner_acquires_cql_and_readers_join() {
        let t = LocalLockTable::new(FairnessPolicy::TaskFair);
        assert_eq!(t.acquire(1, 0, S, ts(1)).unwrap(), LocalAcquire::AcquireCql);
        // While the representative enqueues, another reader waits (it would block on mtx).
        assert_eq!(
            t.acquire(1, 1, S, ts(2)).unwrap(),
            LocalAcquire::Wait { prefetch: None }
        );
        t.cql_acquired(1, S, 0, None);
        assert_eq!(t.poll_grant(1, 1, None).unwrap(), Some(LocalGrant::WithCql));
        assert_eq!(t.acquire(1, 2, S, ts(3)).unwrap(), LocalAcquire::Joined);
        assert_eq!(t.release(1, 0).unwrap(), LocalRelease::Done);
        assert_eq!(t.release(1, 2).unwrap(), LocalRelease::Done);
        assert_eq!(
            t.release(1, 1).unwrap(),
            LocalRelease::ReleaseCql { mode: S }
        );
        t.finish_cql_release(1, S);
        assert_eq!(t.inspect(1), (CqlHold::NotHeld, 0, 0));
    }

    #[test]
    fn a_waiting_writer_blocks_new_readers() {
        let t = LocalLockTable::new(FairnessPolicy::TaskFair);
        t.acquire(1, 0, S, ts(1)).unwrap();
        t.cql_acquired(1, S, 0, None);
        assert_eq!(
            t.acquire(1, 1, X, ts(2)).unwrap(),
            LocalAcquire::Wait { prefetch: Some(1) }
        );
        assert!(matches!(
            t.acquire(1, 2, S, ts(3)).unwrap(),
            LocalAcquire::Wait { prefetch: None }
        ));
        // The reader's release must reacquire the CQL lock for the writer (mode differs).
        assert_eq!(
            t.release(1, 0).unwrap(),
            LocalRelease::ReleaseCql { mode: S }
        );
        t.finish_cql_release(1, S);
        assert_eq!(
            t.poll_grant(1, 1, None).unwrap(),
            Some(LocalGrant::AcquireCql)
        );
        t.cql_acquired(1, X, 0, None);
        // Writer → reader: modes differ, so the CQL lock is released again.
        assert_eq!(
            t.release(1, 1).unwrap(),
            LocalRelease::ReleaseCql { mode: X }
        );
    }

    #[test]
    fn timestamps_decide_between_local_hand_over_and_remote_waiters() {
        for (remote, handed) in [(None, true), (Some(5), true), (Some(3), false)] {
            let t = LocalLockTable::new(FairnessPolicy::TaskFair);
            t.acquire(1, 0, X, ts(1)).unwrap();
            t.cql_acquired(1, X, 0, remote.map(ts));
            t.acquire(1, 1, X, ts(4)).unwrap();
            let r = t.release(1, 0).unwrap();
            if handed {
                assert_eq!(r, LocalRelease::Done, "remote {remote:?}");
                assert_eq!(t.poll_grant(1, 1, None).unwrap(), Some(LocalGrant::WithCql));
            } else {
                assert_eq!(r, LocalRelease::ReleaseCql { mode: X });
                t.finish_cql_release(1, X);
                assert_eq!(
                    t.poll_grant(1, 1, None).unwrap(),
                    Some(LocalGrant::AcquireCql)
                );
            }
        }
    }

    #[test]
    fn prefetched_timestamp_is_dropped_for_a_later_hold() {
        let t = LocalLockTable::new(FairnessPolicy::TaskFair);
        t.acquire(1, 0, X, ts(1)).unwrap();
        t.cql_acquired(1, X, 0, None);
        let LocalAcquire::Wait { prefetch: Some(g) } = t.acquire(1, 1, X, ts(4)).unwrap() else {
            panic!("prefetch expected");
        };
        t.set_remote_ts(1, g + 1, Some(ts(2)));
        assert_eq!(
            t.release(1, 0).unwrap(),
            LocalRelease::Done,
            "stale prefetch"
        );
        let t = LocalLockTable::new(FairnessPolicy::TaskFair);
        t.acquire(1, 0, X, ts(1)).unwrap();
        t.cql_acquired(1, X, 0, None);
        t.acquire(1, 1, X, ts(4)).unwrap();
        t.set_remote_ts(1, g, Some(ts(2)));
        assert_eq!(
            t.release(1, 0).unwrap(),
            LocalRelease::ReleaseCql { mode: X }
        );
    }

    #[test]
    fn phase_fair_lets_every_reader_in_and_task_fair_stops_at_a_writer() {
        for (policy, shared) in [
            (FairnessPolicy::TaskFair, 1usize),
            (FairnessPolicy::PhaseFair, 2),
        ] {
            let t = LocalLockTable::new(policy);
            t.acquire(1, 0, X, ts(1)).unwrap();
            t.cql_acquired(1, X, 0, None);
            t.acquire(1, 1, S, ts(2)).unwrap();
            t.acquire(1, 2, X, ts(3)).unwrap();
            t.acquire(1, 3, S, ts(4)).unwrap();
            assert_eq!(
                t.release(1, 0).unwrap(),
                LocalRelease::ReleaseCql { mode: X }
            );
            t.finish_cql_release(1, X);
            assert_eq!(
                t.poll_grant(1, 1, None).unwrap(),
                Some(LocalGrant::AcquireCql)
            );
            t.cql_acquired(1, S, 0, None);
            let (_, holders, _) = t.inspect(1);
            assert_eq!(holders, shared, "{policy:?}");
        }
    }

    #[test]
    fn a_reset_signal_stops_sharing_and_hand_over() {
        let t = LocalLockTable::new(FairnessPolicy::PhaseFair);
        t.acquire(1, 0, S, ts(1)).unwrap();
        t.cql_acquired(1, S, 0, None);
        assert!(t.note_reset(1, 0, 1), "a holder answers after release");
        assert!(!t.note_reset(1, 7, 1), "others answer at once");
        assert!(matches!(
            t.acquire(1, 1, S, ts(2)).unwrap(),
            LocalAcquire::Wait { .. }
        ));
        assert_eq!(
            t.release(1, 0).unwrap(),
            LocalRelease::ReleaseCql { mode: S }
        );
        t.finish_cql_release(1, S);
        assert_eq!(
            t.poll_grant(1, 1, None).unwrap(),
            Some(LocalGrant::AcquireCql)
        );
        assert_eq!(t.reset_count(1), 1);
    }
}

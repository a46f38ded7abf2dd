//! LOTUS's CN lock table (LOTUS §4.1, Fig. 6, Alg. 1): the locks a CN manages for the
//! shards it owns, in CN memory, taken with CPU CAS by the CN's own coordinators and by
//! the lock-RPC handlers that serve other CNs.
//!
//! * **Slots**: a fixed number of 64-byte buckets of eight 8-byte slots, each slot a native
//!   `AtomicU64` holding a [`LockSlot`] (7-byte fingerprint, 1-byte counter: 1 =
//!   write-locked, `2r` = `r` readers). The decision of Alg. 1 lines 7–18 is
//!   [`LockBucket::plan_lock`]; line 19 is one `compare_exchange` of the slot. A full
//!   bucket, a conflicting mode or a counter that would overflow refuses the request at
//!   once: LOTUS never waits for a lock, the transaction aborts.
//! * **Lock state** (Alg. 1 lines 5 and 21): per held lock its holders (transaction id, CN
//!   id, mode). It makes lock and unlock idempotent (a retransmitted request finds its entry
//!   and changes nothing) and lets recovery find every lock a failed CN holds
//!   ([`LotusLockTable::release_cn`], LOTUS §6).
//!
//! # Serialising a bucket (deviation, found by loom)
//!
//! Alg. 1 reads a bucket, picks a slot and CASes it. A bucket is eight words, not one, so
//! its read is not atomic: loom found the interleaving in which two writers of one key
//! both see it absent, each through a different free slot (one read before a third key's
//! unlock freed slot 0, the other after), and both CAS successfully into different slots
//! — two write locks on one key. So the lock state is sharded *by bucket*, and the check
//! of the state, the slot CAS and the state update of one request run under the shard's
//! spin mutex: requests on one bucket are serialised, requests on different shards run in
//! parallel. The slot is still updated by a CAS (it is what the CN's other readers of the
//! table, such as statistics, see), and the critical section is a bucket scan and one
//! CAS — what Alg. 1 does, made atomic.
//!
//! A CN [`fence`](LotusLockTable::fence)d by recovery gets no new lock; the fence is
//! checked under the same mutex, so after `fence` returns no request of that CN is
//! granted, and [`release_cn`](LotusLockTable::release_cn) then removes every entry it
//! holds and frees the slots.
//!
//! Upgrades (a read lock asked for again in write mode by the same transaction) succeed only
//! for the sole reader: `{fp, 2}` → `{fp, 1}` by CAS.

use alloc::boxed::Box;
use alloc::vec::Vec;

use dmem_layout::lock_slot::{
    LockBucket, LockFingerprint, LockRefusal, LockSlot, SLOTS_PER_BUCKET,
};

use crate::LockMode;
use crate::sync::{AtomicU64, Ordering, SpinMutex};

/// A transaction as the lock state names it: the coordinator-unique transaction id and the
/// CN it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holder {
    /// Transaction id (unique in the cluster).
    pub txn: u64,
    /// The CN the transaction runs on.
    pub cn: u16,
}

/// The outcome of a lock request (Alg. 1's return value, with the reason of a refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// Granted now.
    Granted,
    /// The transaction already held it in this mode (or a stronger one): nothing changed.
    AlreadyHeld,
    /// Refused; the transaction aborts.
    Refused(Refusal),
}

impl Acquired {
    /// Whether the transaction holds the lock after the request.
    #[must_use]
    pub fn is_held(self) -> bool {
        matches!(self, Acquired::Granted | Acquired::AlreadyHeld)
    }
}

/// Why a lock request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot of the key's bucket holds another fingerprint.
    BucketFull,
    /// Held in a conflicting mode (or the slot changed under the CAS).
    Conflict,
    /// 127 readers already.
    TooManyReaders,
    /// The requesting CN is fenced (declared failed by recovery).
    Fenced,
}

impl From<LockRefusal> for Refusal {
    fn from(r: LockRefusal) -> Self {
        match r {
            LockRefusal::BucketFull => Refusal::BucketFull,
            LockRefusal::TooManyReaders(_) => Refusal::TooManyReaders,
            _ => Refusal::Conflict,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StateEntry {
    key: u64,
    holder: Holder,
    mode: LockMode,
}

/// One shard of the lock state: the holder entries of the keys that hash to it.
#[derive(Debug, Default)]
struct StateShard {
    entries: Vec<StateEntry>,
}

impl StateShard {
    fn find(&self, key: u64, holder: Holder) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| e.key == key && e.holder == holder)
    }
}

/// A CN's lock table: slots and lock state (module docs).
#[derive(Debug)]
pub struct LotusLockTable {
    slots: Box<[AtomicU64]>,
    buckets: u64,
    state: Box<[SpinMutex<StateShard>]>,
    /// Bit `c` set: CN `c` is fenced (CN ids below 64; the simulated clusters have fewer).
    fenced: AtomicU64,
}

/// The 64-bit hash every node computes alike for a lock key (splitmix64's finaliser).
#[must_use]
pub const fn lock_hash(key: u64) -> u64 {
    dmem_layout::mix::splitmix64(key)
}

impl LotusLockTable {
    /// Bytes of one bucket.
    pub const BUCKET_BYTES: usize = 64;

    /// A table of `buckets` buckets (at least one) and `state_shards` lock-state shards (at
    /// least one). LOTUS §8.1 gives each CN a 32 MB table: 524,288 buckets.
    #[must_use]
    pub fn new(buckets: usize, state_shards: usize) -> Self {
        let buckets = buckets.max(1);
        Self {
            slots: (0..buckets * SLOTS_PER_BUCKET)
                .map(|_| AtomicU64::new(0))
                .collect(),
            buckets: buckets as u64,
            state: (0..state_shards.max(1))
                .map(|_| SpinMutex::new(StateShard::default()))
                .collect(),
            fenced: AtomicU64::new(0),
        }
    }

    /// A table of about `bytes` bytes of slots.
    #[must_use]
    pub fn with_bytes(bytes: usize, state_shards: usize) -> Self {
        Self::new(bytes / Self::BUCKET_BYTES, state_shards)
    }

    /// Buckets in the table.
    #[must_use]
    pub fn buckets(&self) -> u64 {
        self.buckets
    }

    fn place(&self, key: u64) -> (usize, LockFingerprint, usize) {
        let h = lock_hash(key);
        let bucket = (h % self.buckets) as usize;
        // Fingerprint from the top bits, never 0 (a zero fingerprint would look free).
        let fp = LockFingerprint::from_key_hash(h | 1 << 63);
        // The state shard is a function of the bucket: one mutex covers a bucket.
        let shard = bucket % self.state.len();
        (bucket, fp, shard)
    }

    fn load_bucket(&self, bucket: usize) -> LockBucket {
        let mut b = LockBucket::EMPTY;
        for (i, s) in b.slots_mut().iter_mut().enumerate() {
            *s = LockSlot::from_raw(
                self.slots[bucket * SLOTS_PER_BUCKET + i].load(Ordering::Acquire),
            );
        }
        b
    }

    fn slot(&self, bucket: usize, index: usize) -> &AtomicU64 {
        &self.slots[bucket * SLOTS_PER_BUCKET + index]
    }

    /// Whether CN `cn` is fenced.
    #[must_use]
    pub fn is_fenced(&self, cn: u16) -> bool {
        cn < 64 && self.fenced.load(Ordering::Acquire) & (1 << cn) != 0
    }

    /// Refuses every later request of CN `cn` (recovery, LOTUS §6).
    pub fn fence(&self, cn: u16) {
        if cn < 64 {
            self.fenced.fetch_or(1 << cn, Ordering::AcqRel);
        }
    }

    /// Lets CN `cn` lock again (its restarted incarnation).
    pub fn unfence(&self, cn: u16) {
        if cn < 64 {
            self.fenced.fetch_and(!(1 << cn), Ordering::AcqRel);
        }
    }

    /// One CAS attempt of Alg. 1 lines 7–19 (or an upgrade of a sole reader).
    fn cas_lock(
        &self,
        bucket: usize,
        fp: LockFingerprint,
        mode: LockMode,
        upgrade: bool,
    ) -> Result<(), Refusal> {
        let b = self.load_bucket(bucket);
        let (index, compare, swap) = if upgrade {
            let dmem_layout::lock_slot::SlotMatch::Held(i) = b.find_match(fp) else {
                return Err(Refusal::Conflict);
            };
            let cur = b.slots()[i];
            if cur.counter() != 2 {
                return Err(Refusal::Conflict);
            }
            (i, cur.raw(), LockSlot::from_parts(fp, 1).raw())
        } else {
            let cas = b.plan_lock(fp, mode)?;
            (cas.index, cas.compare, cas.swap)
        };
        self.slot(bucket, index)
            .compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(|_| Refusal::Conflict)
    }

    /// Decrements the slot of `fp` held in `mode` (CAS loop: readers of other
    /// transactions may change the counter meanwhile). A slot that does not hold the lock
    /// is left alone (cannot happen while the state says it is held).
    fn cas_unlock(&self, bucket: usize, fp: LockFingerprint, mode: LockMode) {
        loop {
            let b = self.load_bucket(bucket);
            let Ok(cas) = b.plan_unlock(fp, mode) else {
                return;
            };
            if self
                .slot(bucket, cas.index)
                .compare_exchange(cas.compare, cas.swap, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return;
            }
        }
    }

    /// The slot step of Alg. 1 alone (lines 7–19 for a lock, the counter decrement for an
    /// unlock): the bucket of `key` read, the slot planned, one CPU CAS — without the lock
    /// state and without the bucket's mutex. This is what [`acquire`](Self::acquire) and
    /// [`release`](Self::release) run on the slot words under that mutex, exposed so that
    /// the loom model can check that the CAS alone keeps a slot's counter exact when the
    /// CN's cores lock and unlock one slot at once (`tests/loom.rs`). On its own it is
    /// sound only while no other key can claim a free slot of the bucket meanwhile (the
    /// race the module docs describe), so the protocol never calls it.
    ///
    /// # Errors
    /// The refusal: full bucket, conflicting mode (or the slot changed under the CAS),
    /// reader overflow.
    #[doc(hidden)]
    pub fn slot_lock(&self, key: u64, mode: LockMode) -> Result<(), Refusal> {
        let (bucket, fp, _) = self.place(key);
        self.cas_lock(bucket, fp, mode, false)
    }

    /// Counterpart of [`slot_lock`](Self::slot_lock): the slot of `key` decremented as held
    /// in `mode` (a CAS loop), no lock state.
    #[doc(hidden)]
    pub fn slot_unlock(&self, key: u64, mode: LockMode) {
        let (bucket, fp, _) = self.place(key);
        self.cas_unlock(bucket, fp, mode);
    }

    /// Alg. 1 `ACQUIRE(key, is_write, cn_id, txn_id)`: locks `key` in `mode` for `holder`.
    /// A read lock followed by a write lock of the same transaction upgrades (sole reader
    /// only); a write lock covers a later read request.
    pub fn acquire(&self, key: u64, mode: LockMode, holder: Holder) -> Acquired {
        let (bucket, fp, shard) = self.place(key);
        self.state[shard].with(|s| {
            if self.is_fenced(holder.cn) {
                return Acquired::Refused(Refusal::Fenced);
            }
            // Line 5: CHECKLOCKSTATE.
            let existing = s.find(key, holder);
            let upgrade = match existing.map(|i| s.entries[i].mode) {
                Some(LockMode::Exclusive) => return Acquired::AlreadyHeld,
                Some(LockMode::Shared) if mode == LockMode::Shared => {
                    return Acquired::AlreadyHeld;
                }
                Some(LockMode::Shared) => true,
                None => false,
            };
            // Lines 7–19: one CAS.
            if let Err(r) = self.cas_lock(bucket, fp, mode, upgrade) {
                return Acquired::Refused(r);
            }
            // Line 21: UPDATELOCKSTATE.
            match existing {
                Some(i) => s.entries[i].mode = mode,
                None => s.entries.push(StateEntry { key, holder, mode }),
            }
            Acquired::Granted
        })
    }

    /// Releases `holder`'s lock on `key`, whatever its mode. Returns whether it was held
    /// (an unlock of a lock not held, e.g. a duplicate, changes nothing).
    pub fn release(&self, key: u64, holder: Holder) -> bool {
        let (bucket, fp, shard) = self.place(key);
        self.state[shard].with(|s| {
            let Some(i) = s.find(key, holder) else {
                return false;
            };
            let e = s.entries.swap_remove(i);
            self.cas_unlock(bucket, fp, e.mode);
            true
        })
    }

    /// Releases every lock CN `cn` holds (LOTUS §6, after its transactions were decided);
    /// returns how many. Fence the CN first so that no request of it is granted meanwhile.
    pub fn release_cn(&self, cn: u16) -> usize {
        let mut released = 0;
        for shard in self.state.iter() {
            released += shard.with(|s| {
                let mut n = 0;
                s.entries.retain(|e| {
                    if e.holder.cn != cn {
                        return true;
                    }
                    let (bucket, fp, _) = self.place(e.key);
                    self.cas_unlock(bucket, fp, e.mode);
                    n += 1;
                    false
                });
                n
            });
        }
        released
    }

    /// The holders of `key` with their modes (pending claims left out).
    #[must_use]
    pub fn holders(&self, key: u64) -> Vec<(Holder, LockMode)> {
        let (_, _, shard) = self.place(key);
        self.state[shard].with(|s| {
            s.entries
                .iter()
                .filter(|e| e.key == key)
                .map(|e| (e.holder, e.mode))
                .collect()
        })
    }

    /// Locks held in the table (lock-state entries), for tests and statistics.
    #[must_use]
    pub fn held(&self) -> usize {
        self.state.iter().map(|s| s.with(|s| s.entries.len())).sum()
    }

    /// Whether every slot is free (no lock held anywhere in the slots).
    #[must_use]
    pub fn slots_free(&self) -> bool {
        self.slots.iter().all(|s| s.load(Ordering::Acquire) == 0)
    }

    /// The raw slot word that `key` maps to now (0 if none holds its fingerprint).
    #[must_use]
    pub fn slot_of(&self, key: u64) -> u64 {
        let (bucket, fp, _) = self.place(key);
        let b = self.load_bucket(bucket);
        match b.find_match(fp) {
            dmem_layout::lock_slot::SlotMatch::Held(i) => b.slots()[i].raw(),
            _ => 0,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const S: LockMode = LockMode::Shared;
    const X: LockMode = LockMode::Exclusive;

    fn h(txn: u64, cn: u16) -> Holder {
        Holder { txn, cn }
    }

    #[test]
    fn read_write_conflicts_and_idempotency() {
        let t = LotusLockTable::new(16, 4);
        assert_eq!(t.acquire(1, X, h(1, 0)), Acquired::Granted);
        assert_eq!(t.acquire(1, X, h(1, 0)), Acquired::AlreadyHeld);
        assert_eq!(t.acquire(1, S, h(1, 0)), Acquired::AlreadyHeld);
        assert_eq!(
            t.acquire(1, S, h(2, 1)),
            Acquired::Refused(Refusal::Conflict)
        );
        assert_eq!(
            t.acquire(1, X, h(2, 1)),
            Acquired::Refused(Refusal::Conflict)
        );
        assert!(t.release(1, h(1, 0)));
        assert!(!t.release(1, h(1, 0)), "a duplicate unlock changes nothing");
        assert!(t.slots_free());
        // Shared: counter counts distinct transactions, not requests.
        assert_eq!(t.acquire(2, S, h(1, 0)), Acquired::Granted);
        assert_eq!(t.acquire(2, S, h(1, 0)), Acquired::AlreadyHeld);
        assert_eq!(t.acquire(2, S, h(2, 1)), Acquired::Granted);
        assert_eq!(t.slot_of(2) >> 56, 4);
        assert_eq!(
            t.acquire(2, X, h(1, 0)),
            Acquired::Refused(Refusal::Conflict)
        );
        assert!(t.release(2, h(2, 1)));
        // Sole reader upgrades.
        assert_eq!(t.acquire(2, X, h(1, 0)), Acquired::Granted);
        assert_eq!(t.slot_of(2) >> 56, 1);
        assert_eq!(t.holders(2), vec![(h(1, 0), X)]);
        assert!(t.release(2, h(1, 0)));
        assert!(t.slots_free() && t.held() == 0);
    }

    #[test]
    fn full_bucket_and_reader_overflow_refuse() {
        let t = LotusLockTable::new(1, 1);
        for k in 0..8 {
            assert_eq!(t.acquire(k, X, h(k, 0)), Acquired::Granted);
        }
        assert_eq!(
            t.acquire(100, S, h(100, 0)),
            Acquired::Refused(Refusal::BucketFull)
        );
        for k in 0..8 {
            assert!(t.release(k, h(k, 0)));
        }
        for r in 0..127 {
            assert_eq!(t.acquire(5, S, h(r, 0)), Acquired::Granted);
        }
        assert_eq!(
            t.acquire(5, S, h(999, 0)),
            Acquired::Refused(Refusal::TooManyReaders)
        );
        assert_eq!(t.held(), 127);
    }

    #[test]
    fn recovery_releases_a_fenced_cn() {
        let t = LotusLockTable::new(64, 8);
        for k in 0..20 {
            let cn = (k % 3) as u16;
            assert!(
                t.acquire(k, if k % 2 == 0 { X } else { S }, h(k, cn))
                    .is_held()
            );
        }
        t.fence(1);
        assert_eq!(
            t.acquire(500, X, h(500, 1)),
            Acquired::Refused(Refusal::Fenced)
        );
        let mine = (0..20).filter(|k| k % 3 == 1).count();
        assert_eq!(t.release_cn(1), mine);
        assert_eq!(t.release_cn(1), 0);
        assert_eq!(t.held(), 20 - mine);
        for k in (0..20).filter(|k| k % 3 == 1) {
            assert_eq!(t.slot_of(k), 0);
            // A survivor can now take what the failed CN held.
            assert_eq!(t.acquire(k, X, h(1000 + k, 0)), Acquired::Granted);
        }
        t.unfence(1);
        assert_eq!(t.acquire(600, X, h(600, 1)), Acquired::Granted);
    }
}

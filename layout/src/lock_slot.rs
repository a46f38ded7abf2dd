//! LOTUS's CN-side lock table entries: 8-byte lock slots in 64-byte buckets, and the
//! lock/unlock decisions of Algorithm 1 as pure functions (LOTUS §4.1, Fig. 6, Alg. 1).
//!
//! # Slot
//!
//! ```text
//!  byte 0 ........................ 6   7
//! +----------------------------------+---------+
//! | fingerprint (56 bits, LE)        | counter |
//! +----------------------------------+---------+
//! ```
//!
//! As a little-endian `u64` the fingerprint is the low 56 bits and the counter the top
//! byte. Counter values (§4.1): `0` free, `1` write-locked, a non-zero even `2r` read-locked
//! by `r` readers (at most 127, so the counter never exceeds 254); odd values other than 1
//! are not defined and are refused. A free slot is all zero: unlocking the last holder
//! clears the fingerprint too, which is why Alg. 1 can write-lock with `CAS(0, {fp, 1})`.
//!
//! # Bucket
//!
//! Eight slots form a 64-byte bucket, aligned to a cache line so that a bucket scan
//! touches one line. A key hashes to a bucket and a fingerprint; [`LockBucket::find_match`]
//! returns the slot holding the fingerprint, else a free slot, else reports the bucket
//! full (`slot = Null` in Alg. 1 line 8–9). Keys whose fingerprints collide in one bucket
//! share a slot and so a lock: a false conflict, never a missed one.
//!
//! # Use
//!
//! The CN lock table (a later crate) holds its slots as native atomics. It reads a
//! bucket, asks [`LockBucket::plan_lock`] (or [`LockBucket::plan_unlock`]) for one CAS, and
//! issues it; a failed CAS means someone changed the slot in between: the request fails
//! (Alg. 1 line 22) or is retried by the caller. The lock-state map for idempotency
//! (`CHECKLOCKSTATE`) and the version-table-cache invalidation are the table's, not the
//! slot's.

use core::mem::{align_of, size_of};

use static_assertions::const_assert_eq;
use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::LayoutError;
use crate::cql::LockMode;

/// The 7-byte key fingerprint stored in a lock slot (LOTUS §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockFingerprint(u64);

impl LockFingerprint {
    /// Largest fingerprint: 56 bits.
    pub const MAX: u64 = (1 << 56) - 1;

    /// A fingerprint, or [`LayoutError::DoesNotFit`] if `value` needs more than 56 bits.
    pub const fn new(value: u64) -> Result<Self, LayoutError> {
        if value > Self::MAX {
            Err(LayoutError::DoesNotFit {
                field: "lock fingerprint",
                value,
                max: Self::MAX,
            })
        } else {
            Ok(Self(value))
        }
    }

    /// The fingerprint of a 64-bit key hash: its top 56 bits. The table picks the bucket
    /// from the low bits, so fingerprint and bucket come from different hash bits.
    #[inline]
    pub const fn from_key_hash(hash: u64) -> Self {
        Self(hash >> 8)
    }

    /// The value.
    #[inline]
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// Decoded state of a lock slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// No lock (the slot is all zero).
    Free,
    /// Read-locked by `readers` readers (1..=127).
    ReadLocked {
        /// Fingerprint of the locked key.
        fingerprint: LockFingerprint,
        /// Number of readers holding the lock.
        readers: u8,
    },
    /// Write-locked.
    WriteLocked {
        /// Fingerprint of the locked key.
        fingerprint: LockFingerprint,
    },
}

/// Why a lock or unlock request on a slot is refused (LOTUS Alg. 1 line 9–10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LockRefusal {
    /// Every slot of the bucket holds another fingerprint (`slot = Null`).
    #[error("lock bucket full")]
    BucketFull,
    /// The key is locked in a conflicting mode (read-write or write-write).
    #[error("lock held in a conflicting mode")]
    Conflict,
    /// A read lock would overflow the 1-byte counter (127 readers already).
    #[error("too many readers: {0}")]
    TooManyReaders(LayoutError),
    /// The slot holds another key's fingerprint (the caller picked the wrong slot).
    #[error("slot holds another fingerprint")]
    FingerprintMismatch,
    /// An unlock for a lock that is not held in that mode.
    #[error("lock not held in this mode")]
    NotHeld,
    /// The slot's bytes are not a defined state.
    #[error(transparent)]
    Malformed(#[from] LayoutError),
}

/// One 8-byte lock slot: 7-byte fingerprint and 1-byte counter (LOTUS §4.1, Fig. 6);
/// layout in the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct LockSlot {
    word: U64,
}

const_assert_eq!(size_of::<LockSlot>(), 8);
const_assert_eq!(align_of::<LockSlot>(), 1);

impl LockSlot {
    const COUNTER_SHIFT: u32 = 56;
    const WRITE_LOCKED: u8 = 1;
    const READER_STEP: u8 = 2;
    /// Largest counter value: 127 readers.
    pub const MAX_COUNTER: u8 = 254;
    /// Most readers a slot can count.
    pub const MAX_READERS: u8 = Self::MAX_COUNTER / Self::READER_STEP;

    /// The free slot (all zero).
    pub const FREE: Self = Self { word: U64::ZERO };

    /// The slot with this fingerprint and counter; no check of the counter's meaning.
    #[inline]
    pub const fn from_parts(fingerprint: LockFingerprint, counter: u8) -> Self {
        Self::from_raw(((counter as u64) << Self::COUNTER_SHIFT) | fingerprint.get())
    }

    /// The slot whose native value is `raw` (an atomic load of the table's word).
    #[inline]
    pub const fn from_raw(raw: u64) -> Self {
        Self {
            word: U64::new(raw),
        }
    }

    /// The slot's native value: the compare/swap operand of the table's CAS.
    #[inline]
    pub const fn raw(self) -> u64 {
        self.word.get()
    }

    /// The fingerprint bits.
    #[inline]
    pub const fn fingerprint(self) -> LockFingerprint {
        LockFingerprint(self.raw() & LockFingerprint::MAX)
    }

    /// The counter byte.
    #[inline]
    pub const fn counter(self) -> u8 {
        (self.raw() >> Self::COUNTER_SHIFT) as u8
    }

    /// Decodes the slot; [`LayoutError::InvalidField`] for an odd counter other than 1, or
    /// a zero counter with a non-zero fingerprint.
    pub const fn state(self) -> Result<SlotState, LayoutError> {
        let counter = self.counter();
        let fingerprint = self.fingerprint();
        if counter == 0 {
            if fingerprint.get() != 0 {
                return Err(LayoutError::InvalidField {
                    field: "lock slot fingerprint of a free slot",
                });
            }
            Ok(SlotState::Free)
        } else if counter == Self::WRITE_LOCKED {
            Ok(SlotState::WriteLocked { fingerprint })
        } else if counter.is_multiple_of(Self::READER_STEP) {
            Ok(SlotState::ReadLocked {
                fingerprint,
                readers: counter / Self::READER_STEP,
            })
        } else {
            Err(LayoutError::InvalidField {
                field: "lock slot counter",
            })
        }
    }

    /// Whether the slot is free.
    #[inline]
    pub const fn is_free(self) -> bool {
        self.raw() == 0
    }

    /// Whether the slot holds a lock on `fingerprint` (any mode).
    #[inline]
    pub const fn holds(self, fingerprint: LockFingerprint) -> bool {
        !self.is_free() && self.fingerprint().get() == fingerprint.get()
    }

    fn check_owner(self, fingerprint: LockFingerprint) -> Result<SlotState, LockRefusal> {
        let state = self.state()?;
        match state {
            SlotState::Free => {}
            SlotState::ReadLocked {
                fingerprint: held, ..
            }
            | SlotState::WriteLocked { fingerprint: held } => {
                if held != fingerprint {
                    return Err(LockRefusal::FingerprintMismatch);
                }
            }
        }
        Ok(state)
    }

    /// The slot after a read lock on `fingerprint` (Alg. 1 lines 16–18: swap in
    /// `{fingerprint, counter + 2}`). Refused if write-locked, if the counter would exceed
    /// 254, or if the slot holds another fingerprint.
    pub fn try_lock_shared(self, fingerprint: LockFingerprint) -> Result<Self, LockRefusal> {
        match self.check_owner(fingerprint)? {
            SlotState::Free => Ok(Self::from_parts(fingerprint, Self::READER_STEP)),
            SlotState::WriteLocked { .. } => Err(LockRefusal::Conflict),
            SlotState::ReadLocked { readers, .. } if readers >= Self::MAX_READERS => {
                Err(LockRefusal::TooManyReaders(LayoutError::DoesNotFit {
                    field: "lock slot readers",
                    value: u64::from(readers) + 1,
                    max: u64::from(Self::MAX_READERS),
                }))
            }
            SlotState::ReadLocked { .. } => Ok(Self::from_parts(
                fingerprint,
                self.counter() + Self::READER_STEP,
            )),
        }
    }

    /// The slot after a write lock on `fingerprint` (Alg. 1 lines 11–13: CAS from 0 to
    /// `{fingerprint, 1}`). Refused unless the slot is free.
    pub fn try_lock_exclusive(self, fingerprint: LockFingerprint) -> Result<Self, LockRefusal> {
        match self.check_owner(fingerprint)? {
            SlotState::Free => Ok(Self::from_parts(fingerprint, Self::WRITE_LOCKED)),
            SlotState::ReadLocked { .. } | SlotState::WriteLocked { .. } => {
                Err(LockRefusal::Conflict)
            }
        }
    }

    /// The slot after one reader of `fingerprint` unlocks: counter minus 2, and all zero
    /// when the last reader leaves.
    pub fn unlock_shared(self, fingerprint: LockFingerprint) -> Result<Self, LockRefusal> {
        match self.check_owner(fingerprint)? {
            SlotState::ReadLocked { readers: 1, .. } => Ok(Self::FREE),
            SlotState::ReadLocked { .. } => Ok(Self::from_parts(
                fingerprint,
                self.counter() - Self::READER_STEP,
            )),
            SlotState::Free | SlotState::WriteLocked { .. } => Err(LockRefusal::NotHeld),
        }
    }

    /// The slot after the writer of `fingerprint` unlocks: all zero.
    pub fn unlock_exclusive(self, fingerprint: LockFingerprint) -> Result<Self, LockRefusal> {
        match self.check_owner(fingerprint)? {
            SlotState::WriteLocked { .. } => Ok(Self::FREE),
            SlotState::Free | SlotState::ReadLocked { .. } => Err(LockRefusal::NotHeld),
        }
    }

    /// The slot after locking `fingerprint` in `mode`.
    pub fn try_lock(
        self,
        fingerprint: LockFingerprint,
        mode: LockMode,
    ) -> Result<Self, LockRefusal> {
        match mode {
            LockMode::Shared => self.try_lock_shared(fingerprint),
            LockMode::Exclusive => self.try_lock_exclusive(fingerprint),
        }
    }

    /// The slot after unlocking `fingerprint` held in `mode`.
    pub fn unlock(self, fingerprint: LockFingerprint, mode: LockMode) -> Result<Self, LockRefusal> {
        match mode {
            LockMode::Shared => self.unlock_shared(fingerprint),
            LockMode::Exclusive => self.unlock_exclusive(fingerprint),
        }
    }
}

/// Where a fingerprint lands in a bucket (LOTUS Alg. 1 `FINDMATCH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotMatch {
    /// Slot `0` already holds a lock on the fingerprint.
    Held(usize),
    /// No slot holds it; slot `0` is the first free one.
    Free(usize),
    /// No slot holds it and none is free (`slot = Null`).
    Full,
}

/// The CAS the lock table issues on one slot of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotCas {
    /// Slot index in the bucket.
    pub index: usize,
    /// Value the slot must still hold (native).
    pub compare: u64,
    /// Value to install (native).
    pub swap: u64,
}

/// Slots per bucket (LOTUS §4.1: "Every 8 slots form a lock bucket").
pub const SLOTS_PER_BUCKET: usize = 8;

/// A 64-byte, cache-line aligned bucket of eight lock slots (LOTUS §4.1, Fig. 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C, align(64))]
pub struct LockBucket {
    slots: [LockSlot; SLOTS_PER_BUCKET],
}

const_assert_eq!(size_of::<LockBucket>(), 64);
const_assert_eq!(align_of::<LockBucket>(), 64);

impl LockBucket {
    /// A bucket of free slots.
    pub const EMPTY: Self = Self {
        slots: [LockSlot::FREE; SLOTS_PER_BUCKET],
    };

    /// A bucket holding these slot values (e.g. loaded from the table's atomics).
    pub const fn from_slots(slots: [LockSlot; SLOTS_PER_BUCKET]) -> Self {
        Self { slots }
    }

    /// The slots.
    #[inline]
    pub fn slots(&self) -> &[LockSlot; SLOTS_PER_BUCKET] {
        &self.slots
    }

    /// The slots, mutable.
    #[inline]
    pub fn slots_mut(&mut self) -> &mut [LockSlot; SLOTS_PER_BUCKET] {
        &mut self.slots
    }

    /// Finds the slot for `fingerprint`: the one holding it, else the first free one.
    pub fn find_match(&self, fingerprint: LockFingerprint) -> SlotMatch {
        let mut free = None;
        for (index, slot) in self.slots.iter().enumerate() {
            if slot.holds(fingerprint) {
                return SlotMatch::Held(index);
            }
            if free.is_none() && slot.is_free() {
                free = Some(index);
            }
        }
        free.map_or(SlotMatch::Full, SlotMatch::Free)
    }

    /// The CAS that locks `fingerprint` in `mode` (LOTUS Alg. 1 lines 7–19), or why the
    /// request fails at once.
    pub fn plan_lock(
        &self,
        fingerprint: LockFingerprint,
        mode: LockMode,
    ) -> Result<SlotCas, LockRefusal> {
        let index = match self.find_match(fingerprint) {
            SlotMatch::Held(index) | SlotMatch::Free(index) => index,
            SlotMatch::Full => return Err(LockRefusal::BucketFull),
        };
        let current = self.slots.get(index).copied().unwrap_or(LockSlot::FREE);
        let next = current.try_lock(fingerprint, mode)?;
        Ok(SlotCas {
            index,
            compare: current.raw(),
            swap: next.raw(),
        })
    }

    /// The CAS that unlocks `fingerprint` held in `mode`.
    pub fn plan_unlock(
        &self,
        fingerprint: LockFingerprint,
        mode: LockMode,
    ) -> Result<SlotCas, LockRefusal> {
        let SlotMatch::Held(index) = self.find_match(fingerprint) else {
            return Err(LockRefusal::NotHeld);
        };
        let current = self.slots.get(index).copied().unwrap_or(LockSlot::FREE);
        let next = current.unlock(fingerprint, mode)?;
        Ok(SlotCas {
            index,
            compare: current.raw(),
            swap: next.raw(),
        })
    }

    /// Applies a planned CAS if the slot still holds `compare` (as the table's atomic
    /// would); returns whether it did. For tests and single-threaded shells.
    pub fn apply(&mut self, cas: SlotCas) -> bool {
        match self.slots.get_mut(cas.index) {
            Some(slot) if slot.raw() == cas.compare => {
                *slot = LockSlot::from_raw(cas.swap);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::{Arbitrary, Gen};
    use quickcheck_macros::quickcheck;

    const S: LockMode = LockMode::Shared;
    const X: LockMode = LockMode::Exclusive;

    fn fp(v: u64) -> LockFingerprint {
        LockFingerprint::new(v).unwrap()
    }

    #[test]
    fn slot_encoding() {
        let slot = LockSlot::from_parts(fp(0x00AB_CDEF_0123_4567), 1);
        assert_eq!(
            slot.as_bytes(),
            &[0x67, 0x45, 0x23, 0x01, 0xEF, 0xCD, 0xAB, 1]
        );
        assert_eq!(
            slot.state(),
            Ok(SlotState::WriteLocked {
                fingerprint: fp(0x00AB_CDEF_0123_4567)
            })
        );
        assert_eq!(
            LockSlot::from_parts(fp(9), 6).state(),
            Ok(SlotState::ReadLocked {
                fingerprint: fp(9),
                readers: 3
            })
        );
        assert_eq!(
            LockSlot::from_parts(fp(9), 3).state(),
            Err(LayoutError::InvalidField {
                field: "lock slot counter"
            })
        );
        assert!(LockSlot::from_parts(fp(9), 0).state().is_err());
        assert_eq!(LockSlot::FREE.state(), Ok(SlotState::Free));
        assert!(LockFingerprint::new(1 << 56).is_err());
        assert_eq!(
            LockFingerprint::from_key_hash(u64::MAX).get(),
            LockFingerprint::MAX
        );
    }

    #[test]
    fn algorithm_1_sequence() {
        let a = fp(0xA);
        let mut bucket = LockBucket::EMPTY;
        // Write lock on a free slot: CAS(0, {a, 1}).
        let cas = bucket.plan_lock(a, X).unwrap();
        assert_eq!((cas.index, cas.compare, cas.swap), (0, 0, (1 << 56) | 0xA));
        assert!(bucket.apply(cas));
        // Write-write and read-write conflicts.
        assert_eq!(bucket.plan_lock(a, X), Err(LockRefusal::Conflict));
        assert_eq!(bucket.plan_lock(a, S), Err(LockRefusal::Conflict));
        // Unlock returns the slot to zero.
        assert!(bucket.apply(bucket.plan_unlock(a, X).unwrap()));
        assert!(bucket.slots()[0].is_free());
        // Two readers share: counter 2 then 4; the writer is refused.
        assert!(bucket.apply(bucket.plan_lock(a, S).unwrap()));
        assert!(bucket.apply(bucket.plan_lock(a, S).unwrap()));
        assert_eq!(bucket.slots()[0].counter(), 4);
        assert_eq!(bucket.plan_lock(a, X), Err(LockRefusal::Conflict));
        assert_eq!(bucket.plan_unlock(a, X), Err(LockRefusal::NotHeld));
        assert!(bucket.apply(bucket.plan_unlock(a, S).unwrap()));
        assert_eq!(bucket.slots()[0].counter(), 2);
        assert!(bucket.apply(bucket.plan_unlock(a, S).unwrap()));
        assert_eq!(bucket, LockBucket::EMPTY);
        assert_eq!(bucket.plan_unlock(a, S), Err(LockRefusal::NotHeld));
        // A stale CAS (slot changed since the plan) does not apply.
        let stale = bucket.plan_lock(a, X).unwrap();
        assert!(bucket.apply(bucket.plan_lock(a, S).unwrap()));
        assert!(!bucket.apply(stale));
    }

    #[test]
    fn reader_overflow_is_refused() {
        let a = fp(1);
        let mut slot = LockSlot::FREE;
        for _ in 0..LockSlot::MAX_READERS {
            slot = slot.try_lock_shared(a).unwrap();
        }
        assert_eq!(slot.counter(), 254);
        assert_eq!(
            slot.try_lock_shared(a),
            Err(LockRefusal::TooManyReaders(LayoutError::DoesNotFit {
                field: "lock slot readers",
                value: 128,
                max: 127
            }))
        );
    }

    #[test]
    fn bucket_fills_and_matches() {
        let mut bucket = LockBucket::EMPTY;
        for k in 1..=8 {
            let cas = bucket.plan_lock(fp(k), X).unwrap();
            assert_eq!(cas.index, (k - 1) as usize);
            assert!(bucket.apply(cas));
        }
        assert_eq!(bucket.find_match(fp(9)), SlotMatch::Full);
        assert_eq!(bucket.plan_lock(fp(9), S), Err(LockRefusal::BucketFull));
        assert_eq!(bucket.find_match(fp(5)), SlotMatch::Held(4));
        // Freeing slot 2 makes room; a held match still wins over an earlier free slot.
        assert!(bucket.apply(bucket.plan_unlock(fp(3), X).unwrap()));
        assert_eq!(bucket.find_match(fp(9)), SlotMatch::Free(2));
        assert_eq!(bucket.find_match(fp(7)), SlotMatch::Held(6));
        assert_eq!(
            LockSlot::from_parts(fp(1), 1).try_lock_shared(fp(2)),
            Err(LockRefusal::FingerprintMismatch)
        );
    }

    #[quickcheck]
    fn slot_round_trip(fingerprint: u64, readers: u8, write: bool) -> bool {
        let f = fp(fingerprint & LockFingerprint::MAX);
        let readers = readers % LockSlot::MAX_READERS + 1;
        let slot = if write {
            LockSlot::from_parts(f, 1)
        } else {
            LockSlot::from_parts(f, readers * 2)
        };
        let back = LockSlot::read_from_bytes(slot.as_bytes()).unwrap();
        let expected = if write {
            SlotState::WriteLocked { fingerprint: f }
        } else {
            SlotState::ReadLocked {
                fingerprint: f,
                readers,
            }
        };
        back == slot && back.state() == Ok(expected) && back.fingerprint() == f
    }

    #[derive(Debug, Clone)]
    struct Ops(Vec<(u8, bool, bool)>);

    impl Arbitrary for Ops {
        fn arbitrary(g: &mut Gen) -> Self {
            let len = usize::arbitrary(g) % 300;
            Ops((0..len)
                .map(|_| {
                    (
                        u8::arbitrary(g) % 12,
                        bool::arbitrary(g),
                        bool::arbitrary(g),
                    )
                })
                .collect())
        }
    }

    /// Against a model of per-key (readers, writer): locks succeed exactly when the model
    /// allows (or the bucket is full), and every slot always decodes.
    #[quickcheck]
    fn bucket_matches_lock_model(ops: Ops) -> bool {
        let mut bucket = LockBucket::EMPTY;
        let mut model = [(0u8, false); 12];
        for (key, lock, exclusive) in ops.0 {
            let f = fp(u64::from(key) + 1);
            let mode = if exclusive { X } else { S };
            let (readers, writer) = model[usize::from(key)];
            let held_keys = model.iter().filter(|(r, w)| *r > 0 || *w).count();
            if lock {
                let allowed = if exclusive {
                    readers == 0 && !writer
                } else {
                    !writer && readers < 127
                };
                match bucket.plan_lock(f, mode) {
                    Ok(cas) => {
                        if !allowed || !bucket.apply(cas) {
                            return false;
                        }
                        model[usize::from(key)] = if exclusive {
                            (0, true)
                        } else {
                            (readers + 1, false)
                        };
                    }
                    Err(LockRefusal::BucketFull) => {
                        if held_keys < SLOTS_PER_BUCKET || readers > 0 || writer {
                            return false;
                        }
                    }
                    Err(_) => {
                        if allowed {
                            return false;
                        }
                    }
                }
            } else {
                let held = if exclusive { writer } else { readers > 0 };
                match bucket.plan_unlock(f, mode) {
                    Ok(cas) => {
                        if !held || !bucket.apply(cas) {
                            return false;
                        }
                        model[usize::from(key)] = if exclusive {
                            (0, false)
                        } else {
                            (readers - 1, false)
                        };
                    }
                    Err(_) => {
                        if held {
                            return false;
                        }
                    }
                }
            }
            if bucket.slots().iter().any(|s| s.state().is_err()) {
                return false;
            }
        }
        true
    }
}

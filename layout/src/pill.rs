//! Pandora's Implicit Lock Logging (PILL): a lock word that names its owner coordinator,
//! and the set of failed coordinator ids that tells a stray lock from a live one
//! (Pandora §3.1.2).
//!
//! # Lock word
//!
//! One CAS-able 8-byte word per object, little-endian:
//!
//! ```text
//!  63     62 ........................ 16 15 ................ 0
//! +------+------------------------------+-------------------+
//! |locked| reserved, zero               | owner coordinator |
//! +------+------------------------------+-------------------+
//! ```
//!
//! * unlocked: the word is `0`; locked by coordinator `c`: `1 << 63 | c`.
//! * acquire: CAS `0 -> locked_by(me)`; release: CAS `locked_by(me) -> 0` (or a WRITE of 0
//!   by the owner); steal: CAS `locked_by(failed) -> locked_by(me)`.
//!
//! A failed acquire CAS returns the word, so the coordinator learns the owner without
//! another READ and checks it against the failed-id set: a lock held by a failed
//! coordinator is *stray* and is stolen with one more CAS, or, for a read, treated as not
//! locked (§3.1.2 "How does stealing work?").
//!
//! Deviation: the public Pandora code (a FORD fork) stores `coordinator id + 1` in the
//! lock; dmem uses an explicit locked bit so that coordinator id 0 is usable and every
//! one of the 64K ids fits beside the flag. The reserved bits must be zero; a word with
//! any of them set is refused by [`PillLockWord::state`].
//!
//! # Failed-id set
//!
//! [`FailedCoordinatorSet`] is a bitmap of all 2^16 coordinator ids: 8 KiB, one bit per id,
//! O(1) membership, no allocation (§3.1.2 "we implement failed-ids as a compact bitset
//! with 64K entries"). The failure detector ships it to every compute server in the
//! initial configuration and after each failure; its byte image is the wire format (bit
//! `id % 8` of byte `id / 8`).

use core::fmt;
use core::mem::{align_of, size_of};

use static_assertions::const_assert_eq;
use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::LayoutError;

/// The unique 16-bit id of a transaction coordinator, assigned by the failure detector
/// (Pandora §3.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CoordinatorId(pub u16);

/// Operands of one RDMA CAS on a lock word, as native values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CasOperands {
    /// Value the word must hold for the swap to happen.
    pub compare: u64,
    /// Value written if it does.
    pub swap: u64,
}

/// Decoded state of a PILL lock word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PillLockState {
    /// Nobody holds the lock.
    Unlocked,
    /// `owner` holds the lock (or held it and failed).
    Locked {
        /// The owner coordinator.
        owner: CoordinatorId,
    },
}

/// Who holds a lock, once checked against the failed-id set (Pandora §3.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockHolder {
    /// Nobody.
    Free,
    /// A live coordinator: a writer aborts (or waits), a reader sees the object locked.
    Live(CoordinatorId),
    /// A failed coordinator: the lock is stray; a writer steals it, a reader ignores it.
    Stray(CoordinatorId),
}

/// The PILL lock word: lock state and owner coordinator id in one CAS-able 8-byte word
/// (Pandora §3.1.2); layout in the module docs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct PillLockWord {
    word: U64,
}

const_assert_eq!(size_of::<PillLockWord>(), 8);
const_assert_eq!(align_of::<PillLockWord>(), 1);

impl PillLockWord {
    const LOCKED_BIT: u64 = 1 << 63;
    const OWNER_MASK: u64 = 0xFFFF;

    /// The unlocked word (zero).
    pub const UNLOCKED: Self = Self { word: U64::ZERO };

    /// The word of a lock held by `owner`.
    #[inline]
    pub const fn locked_by(owner: CoordinatorId) -> Self {
        Self::from_raw(Self::LOCKED_BIT | owner.0 as u64)
    }

    /// The word whose native value is `raw` (what a CAS returned or a READ fetched).
    #[inline]
    pub const fn from_raw(raw: u64) -> Self {
        Self {
            word: U64::new(raw),
        }
    }

    /// The word's native value.
    #[inline]
    pub const fn raw(self) -> u64 {
        self.word.get()
    }

    /// Decodes the word; [`LayoutError::InvalidField`] if a reserved bit is set or an
    /// unlocked word names an owner.
    pub const fn state(self) -> Result<PillLockState, LayoutError> {
        let raw = self.raw();
        if raw & !(Self::LOCKED_BIT | Self::OWNER_MASK) != 0 {
            return Err(LayoutError::InvalidField {
                field: "pill lock word reserved bits",
            });
        }
        if raw & Self::LOCKED_BIT == 0 {
            if raw != 0 {
                return Err(LayoutError::InvalidField {
                    field: "pill lock word owner",
                });
            }
            return Ok(PillLockState::Unlocked);
        }
        Ok(PillLockState::Locked {
            owner: CoordinatorId((raw & Self::OWNER_MASK) as u16),
        })
    }

    /// Who holds the lock, given the failed coordinators.
    pub fn holder(self, failed: &FailedCoordinatorSet) -> Result<LockHolder, LayoutError> {
        Ok(match self.state()? {
            PillLockState::Unlocked => LockHolder::Free,
            PillLockState::Locked { owner } if failed.contains(owner) => LockHolder::Stray(owner),
            PillLockState::Locked { owner } => LockHolder::Live(owner),
        })
    }

    /// Whether a reader must treat the object as locked: held by a live coordinator.
    /// A stray lock does not block reads (Pandora §3.1.2).
    pub fn blocks_readers(self, failed: &FailedCoordinatorSet) -> Result<bool, LayoutError> {
        Ok(matches!(self.holder(failed)?, LockHolder::Live(_)))
    }

    /// The CAS that acquires a free lock for `me`.
    #[inline]
    pub const fn acquire_cas(me: CoordinatorId) -> CasOperands {
        CasOperands {
            compare: 0,
            swap: Self::locked_by(me).raw(),
        }
    }

    /// The CAS that releases `me`'s lock.
    #[inline]
    pub const fn release_cas(me: CoordinatorId) -> CasOperands {
        CasOperands {
            compare: Self::locked_by(me).raw(),
            swap: 0,
        }
    }

    /// After a failed acquire CAS returned `self`: the CAS that steals the lock for `me` if
    /// it is stray, `None` if it is free (retry the acquire) or held by a live coordinator.
    pub fn steal_cas(
        self,
        me: CoordinatorId,
        failed: &FailedCoordinatorSet,
    ) -> Result<Option<CasOperands>, LayoutError> {
        Ok(match self.holder(failed)? {
            LockHolder::Stray(_) => Some(CasOperands {
                compare: self.raw(),
                swap: Self::locked_by(me).raw(),
            }),
            LockHolder::Free | LockHolder::Live(_) => None,
        })
    }

    /// The CAS the id-recycling scan issues for a word it read: unlock it if stray
    /// (Pandora §3.1.2 "Recycling coordinator-ids"), `None` otherwise.
    pub fn recycle_cas(
        self,
        failed: &FailedCoordinatorSet,
    ) -> Result<Option<CasOperands>, LayoutError> {
        Ok(match self.holder(failed)? {
            LockHolder::Stray(_) => Some(CasOperands {
                compare: self.raw(),
                swap: 0,
            }),
            LockHolder::Free | LockHolder::Live(_) => None,
        })
    }
}

/// Number of coordinator ids, and so of bits in [`FailedCoordinatorSet`].
pub const COORDINATOR_IDS: usize = 1 << 16;

/// The failed coordinator ids as a 64K-bit bitmap: 8 KiB, O(1) lookup, no allocation
/// (Pandora §3.1.2 "Failed-ids"). Bit `id % 8` of byte `id / 8` is set iff `id` failed.
#[derive(Clone, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct FailedCoordinatorSet {
    bits: [u8; COORDINATOR_IDS / 8],
}

const_assert_eq!(size_of::<FailedCoordinatorSet>(), 8192);
const_assert_eq!(align_of::<FailedCoordinatorSet>(), 1);

impl FailedCoordinatorSet {
    /// Size of the set's byte image.
    pub const SIZE: usize = size_of::<Self>();

    /// The empty set.
    pub const EMPTY: Self = Self {
        bits: [0; COORDINATOR_IDS / 8],
    };

    /// Parses a set received from the failure detector; `bytes` must be exactly
    /// [`Self::SIZE`] bytes. Every bit pattern is a set.
    pub fn parse(bytes: &[u8]) -> Result<&Self, LayoutError> {
        Self::ref_from_bytes(bytes).map_err(|_| {
            if bytes.len() < Self::SIZE {
                LayoutError::TooShort {
                    needed: Self::SIZE,
                    got: bytes.len(),
                }
            } else {
                LayoutError::TooLong {
                    max: Self::SIZE,
                    got: bytes.len(),
                }
            }
        })
    }

    #[inline]
    const fn byte_and_mask(id: CoordinatorId) -> (usize, u8) {
        ((id.0 >> 3) as usize, 1 << (id.0 & 7))
    }

    /// Whether `id` has failed.
    #[inline]
    pub const fn contains(&self, id: CoordinatorId) -> bool {
        let (byte, mask) = Self::byte_and_mask(id);
        // byte < 8192 = bits.len() for every u16 id, so the index is in bounds.
        self.bits[byte] & mask != 0
    }

    /// Marks `id` failed; returns whether it was not already.
    #[inline]
    pub fn insert(&mut self, id: CoordinatorId) -> bool {
        let (byte, mask) = Self::byte_and_mask(id);
        let slot = &mut self.bits[byte];
        let fresh = *slot & mask == 0;
        *slot |= mask;
        fresh
    }

    /// Forgets `id` (after the recycling scan released all its stray locks); returns
    /// whether it was in the set.
    #[inline]
    pub fn remove(&mut self, id: CoordinatorId) -> bool {
        let (byte, mask) = Self::byte_and_mask(id);
        let slot = &mut self.bits[byte];
        let present = *slot & mask != 0;
        *slot &= !mask;
        present
    }

    /// Number of failed ids.
    pub fn len(&self) -> usize {
        self.bits.iter().map(|b| b.count_ones() as usize).sum()
    }

    /// Whether no id has failed.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&b| b == 0)
    }

    /// The failed ids in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = CoordinatorId> + '_ {
        self.bits
            .iter()
            .enumerate()
            .filter(|(_, b)| **b != 0)
            .flat_map(|(byte, &b)| {
                (0..8u16)
                    .filter(move |bit| b & (1 << bit) != 0)
                    .map(move |bit| CoordinatorId((byte as u16) << 3 | bit))
            })
    }
}

impl Default for FailedCoordinatorSet {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl fmt::Debug for FailedCoordinatorSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter().map(|id| id.0)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck_macros::quickcheck;

    const ME: CoordinatorId = CoordinatorId(7);
    const DEAD: CoordinatorId = CoordinatorId(3);
    const ALIVE: CoordinatorId = CoordinatorId(4);

    fn failed() -> Box<FailedCoordinatorSet> {
        let mut set = Box::new(FailedCoordinatorSet::EMPTY);
        assert!(set.insert(DEAD));
        set
    }

    #[test]
    fn lock_word_encoding() {
        assert_eq!(PillLockWord::UNLOCKED.raw(), 0);
        assert_eq!(PillLockWord::locked_by(CoordinatorId(0)).raw(), 1 << 63);
        assert_eq!(
            PillLockWord::locked_by(CoordinatorId(0xFFFF)).raw(),
            (1 << 63) | 0xFFFF
        );
        assert_eq!(PillLockWord::UNLOCKED.state(), Ok(PillLockState::Unlocked));
        assert_eq!(
            PillLockWord::locked_by(ME).state(),
            Ok(PillLockState::Locked { owner: ME })
        );
        assert_eq!(
            PillLockWord::from_raw(1 << 20).state(),
            Err(LayoutError::InvalidField {
                field: "pill lock word reserved bits"
            })
        );
        assert_eq!(
            PillLockWord::from_raw(5).state(),
            Err(LayoutError::InvalidField {
                field: "pill lock word owner"
            })
        );
        assert_eq!(
            PillLockWord::locked_by(ME).as_bytes(),
            &((1u64 << 63) | 7).to_le_bytes()
        );
    }

    #[test]
    fn stealing_a_stray_lock() {
        // Pandora §3.1.2: coordinator 3 crashed holding the lock; coordinator 7's acquire
        // CAS fails and returns the word naming 3.
        let failed = failed();
        let mut word = PillLockWord::locked_by(DEAD);
        let acquire = PillLockWord::acquire_cas(ME);
        assert_ne!(word.raw(), acquire.compare);
        assert_eq!(word.holder(&failed), Ok(LockHolder::Stray(DEAD)));
        assert_eq!(word.blocks_readers(&failed), Ok(false));
        let steal = word.steal_cas(ME, &failed).unwrap().unwrap();
        assert_eq!(steal.compare, word.raw());
        word = PillLockWord::from_raw(steal.swap);
        assert_eq!(word.holder(&failed), Ok(LockHolder::Live(ME)));
        assert_eq!(word.blocks_readers(&failed), Ok(true));
        // A live owner's lock is not stolen, and not recycled.
        assert_eq!(
            PillLockWord::locked_by(ALIVE).steal_cas(ME, &failed),
            Ok(None)
        );
        assert_eq!(
            PillLockWord::locked_by(ALIVE).recycle_cas(&failed),
            Ok(None)
        );
        assert_eq!(PillLockWord::UNLOCKED.steal_cas(ME, &failed), Ok(None));
        // Release returns the word to zero.
        let release = PillLockWord::release_cas(ME);
        assert_eq!((release.compare, release.swap), (word.raw(), 0));
        // Recycling scan unlocks the stray lock of 3.
        assert_eq!(
            PillLockWord::locked_by(DEAD).recycle_cas(&failed),
            Ok(Some(CasOperands {
                compare: PillLockWord::locked_by(DEAD).raw(),
                swap: 0
            }))
        );
    }

    #[test]
    fn failed_set_operations() {
        let mut set = Box::new(FailedCoordinatorSet::EMPTY);
        assert!(set.is_empty());
        for id in [0u16, 1, 7, 8, 255, 4096, 65535] {
            assert!(set.insert(CoordinatorId(id)));
            assert!(!set.insert(CoordinatorId(id)));
        }
        assert_eq!(set.len(), 7);
        assert!(set.contains(CoordinatorId(65535)));
        assert!(!set.contains(CoordinatorId(65534)));
        let ids: Vec<u16> = set.iter().map(|c| c.0).collect();
        assert_eq!(ids, [0, 1, 7, 8, 255, 4096, 65535]);
        assert!(set.remove(CoordinatorId(8)));
        assert!(!set.remove(CoordinatorId(8)));
        assert_eq!(set.len(), 6);
        assert_eq!(format!("{set:?}"), "{0, 1, 7, 255, 4096, 65535}");
        let bytes = set.as_bytes();
        assert_eq!(bytes[0], 0b1000_0011);
        assert_eq!(FailedCoordinatorSet::parse(bytes), Ok(&*set));
        assert_eq!(
            FailedCoordinatorSet::parse(&bytes[1..]),
            Err(LayoutError::TooShort {
                needed: 8192,
                got: 8191
            })
        );
    }

    #[quickcheck]
    fn lock_word_round_trip(owner: u16) -> bool {
        let word = PillLockWord::locked_by(CoordinatorId(owner));
        let back = PillLockWord::read_from_bytes(word.as_bytes()).unwrap();
        back == word
            && back.state()
                == Ok(PillLockState::Locked {
                    owner: CoordinatorId(owner),
                })
    }

    #[quickcheck]
    fn any_word_decodes_or_errors(raw: u64) -> bool {
        match PillLockWord::from_raw(raw).state() {
            Ok(PillLockState::Unlocked) => raw == 0,
            Ok(PillLockState::Locked { owner }) => PillLockWord::locked_by(owner).raw() == raw,
            Err(_) => true,
        }
    }

    #[quickcheck]
    fn set_matches_model(ids: Vec<u16>, removed: Vec<u16>) -> bool {
        let mut set = Box::new(FailedCoordinatorSet::EMPTY);
        let mut model = std::collections::BTreeSet::new();
        for &id in &ids {
            set.insert(CoordinatorId(id));
            model.insert(id);
        }
        for &id in &removed {
            set.remove(CoordinatorId(id));
            model.remove(&id);
        }
        set.len() == model.len()
            && set.iter().map(|c| c.0).eq(model.iter().copied())
            && ids
                .iter()
                .chain(&removed)
                .all(|&id| set.contains(CoordinatorId(id)) == model.contains(&id))
            && FailedCoordinatorSet::read_from_bytes(set.as_bytes()).as_ref() == Ok(&*set)
    }
}

//! Dandelion key-value metadata (Dandelion §4.2, Table 3).
//!
//! Every key-value pair in Dandelion's hashtable carries a 29-bit version, a protocol lock
//! bit, a readable bit and a deleted bit. Together they are exactly one 32-bit word, which
//! [`KvMeta`] packs:
//!
//! ```text
//!  31   30   29   28                                              0
//! +----+----+----+-------------------------------------------------+
//! | D  | R  | L  |                  version (29)                   |
//! +----+----+----+-------------------------------------------------+
//!   D = deleted, R = readable, L = lock
//! ```
//!
//! (Table 3 says "29-bytes"; 29 + 1 + 1 + 1 = 32 makes clear it means bits.)

use core::fmt;

use bitflags::bitflags;
use static_assertions::{assert_eq_align, assert_eq_size};
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::LayoutError;

bitflags! {
    /// The three flag bits of a [`KvMeta`] word, in place (bits 29–31); the other 29 bits
    /// are the version.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct KvFlags: u32 {
        /// The protocol lock of the commit phase.
        const LOCKED = 1 << 29;
        /// `GetOne` may return the value (raised once the writer committed).
        const READABLE = 1 << 30;
        /// The key has been deleted.
        const DELETED = 1 << 31;
    }
}

/// Dandelion's per-key metadata word (Table 3), stored little-endian.
///
/// * **version** (29 bits): validated by equality in Locking and Read Validation (§4.2.2).
/// * **lock** (1 bit): the protocol-level lock of the commit phase (orthogonal to the
///   per-pair spin lock that gives thread safety).
/// * **readable** (1 bit): lowered in backups during Replication while a transaction holds
///   the lock on the primary, raised once it has committed; `GetOne` refuses a key that is
///   locked or not readable (§4.2.1). A fresh key is readable.
/// * **deleted** (1 bit): the key has been deleted; a `Get` reports an error (§4.2.1).
///
/// Every 32-bit pattern is a valid word, so the type is `FromBytes`.
///
/// # Version overflow: wraps
///
/// [`KvMeta::bumped`] **wraps** the version from 2^29 − 1 to 0 and keeps the flags. Versions
/// are only ever compared for equality with a version read earlier by the same transaction,
/// so a wrap is harmful only if exactly a multiple of 2^29 (536,870,912) commits hit one key
/// between a transaction's read and its validation, which at Dandelion's rates (tens of Mtps
/// spread over millions of keys) takes far longer than a transaction lives. Callers that
/// want to see the wrap use [`KvMeta::checked_bumped`], which refuses it.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct KvMeta(U32);

assert_eq_size!(KvMeta, [u8; 4]);
assert_eq_align!(KvMeta, u8);

impl KvMeta {
    /// Bits of the version field.
    pub const VERSION_BITS: u32 = 29;
    /// Largest version.
    pub const MAX_VERSION: u32 = (1 << Self::VERSION_BITS) - 1;
    /// The metadata of a freshly inserted key: version 0, unlocked, readable, not deleted.
    pub const INSERTED: Self = Self(U32::new(KvFlags::READABLE.bits()));

    /// Reinterprets a raw word (every 32-bit pattern is valid).
    pub const fn from_raw(raw: u32) -> Self {
        Self(U32::new(raw))
    }

    /// The raw word.
    pub const fn to_raw(self) -> u32 {
        self.0.get()
    }

    /// The 29-bit version.
    pub const fn version(self) -> u32 {
        self.to_raw() & Self::MAX_VERSION
    }

    /// The flag bits.
    pub const fn flags(self) -> KvFlags {
        KvFlags::from_bits_truncate(self.to_raw())
    }

    /// Whether the protocol lock is held.
    pub const fn is_locked(self) -> bool {
        self.flags().contains(KvFlags::LOCKED)
    }

    /// Whether `GetOne` may return the value.
    pub const fn is_readable(self) -> bool {
        self.flags().contains(KvFlags::READABLE)
    }

    /// Whether the key is deleted.
    pub const fn is_deleted(self) -> bool {
        self.flags().contains(KvFlags::DELETED)
    }

    /// Whether a `GetOne` (single-key transaction) may return the value (§4.2.1): not
    /// deleted, not locked, readable.
    pub const fn get_one_allowed(self) -> bool {
        !self.is_deleted() && !self.is_locked() && self.is_readable()
    }

    /// The same word with `version`; refuses a version wider than 29 bits.
    pub const fn with_version(self, version: u32) -> Result<Self, LayoutError> {
        if version > Self::MAX_VERSION {
            return Err(LayoutError::DoesNotFit {
                field: "version",
                value: version as u64,
                max: Self::MAX_VERSION as u64,
            });
        }
        Ok(Self(U32::new(
            (self.to_raw() & !Self::MAX_VERSION) | version,
        )))
    }

    /// The same word with the lock bit set or cleared.
    pub const fn with_locked(self, locked: bool) -> Self {
        self.with_flag(KvFlags::LOCKED, locked)
    }

    /// The same word with the readable bit set or cleared.
    pub const fn with_readable(self, readable: bool) -> Self {
        self.with_flag(KvFlags::READABLE, readable)
    }

    /// The same word with the deleted bit set or cleared.
    pub const fn with_deleted(self, deleted: bool) -> Self {
        self.with_flag(KvFlags::DELETED, deleted)
    }

    /// The same word with version + 1, wrapping from 2^29 − 1 to 0 (see the type docs).
    pub const fn bumped(self) -> Self {
        let version = (self.version() + 1) & Self::MAX_VERSION;
        Self(U32::new((self.to_raw() & !Self::MAX_VERSION) | version))
    }

    /// The same word with version + 1; refuses to wrap.
    pub const fn checked_bumped(self) -> Result<Self, LayoutError> {
        if self.version() == Self::MAX_VERSION {
            return Err(LayoutError::DoesNotFit {
                field: "version",
                value: Self::MAX_VERSION as u64 + 1,
                max: Self::MAX_VERSION as u64,
            });
        }
        Ok(self.bumped())
    }

    /// Whether a lock request that read `read_version` during execution may take the lock
    /// (§4.2.2 Locking): the key is unlocked and, if it was read, its version is unchanged.
    pub const fn can_lock(self, read_version: Option<u32>) -> bool {
        if self.is_locked() {
            return false;
        }
        match read_version {
            Some(v) => v == self.version(),
            None => true,
        }
    }

    const fn with_flag(self, flag: KvFlags, on: bool) -> Self {
        Self(U32::new(if on {
            self.to_raw() | flag.bits()
        } else {
            self.to_raw() & !flag.bits()
        }))
    }
}

impl Default for KvMeta {
    fn default() -> Self {
        Self::INSERTED
    }
}

impl fmt::Debug for KvMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvMeta")
            .field("version", &self.version())
            .field("locked", &self.is_locked())
            .field("readable", &self.is_readable())
            .field("deleted", &self.is_deleted())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck_macros::quickcheck;

    #[test]
    fn bit_positions() {
        let m = KvMeta::from_raw(0)
            .with_version(5)
            .unwrap()
            .with_locked(true);
        assert_eq!(m.to_raw(), (1 << 29) | 5);
        assert_eq!(m.with_readable(true).to_raw(), (1 << 30) | (1 << 29) | 5);
        assert_eq!(m.with_deleted(true).to_raw(), (1 << 31) | (1 << 29) | 5);
        assert_eq!(m.as_bytes(), &[5, 0, 0, 0x20]); // little-endian on the wire
        assert_eq!(KvMeta::INSERTED.version(), 0);
        assert!(KvMeta::INSERTED.get_one_allowed());
    }

    /// §4.2.2: Dnl-4 locks the primary, lowers readable in the backups during Replication,
    /// then unlocks the primary with a new version and raises readable after commit.
    #[test]
    fn dnl4_commit_of_one_write() {
        let primary = KvMeta::INSERTED.with_version(7).unwrap();
        let backup = primary;
        // Locking: the Get saw version 7.
        assert!(primary.can_lock(Some(7)));
        assert!(
            !primary.can_lock(Some(6)),
            "version changed since the read: abort"
        );
        let primary = primary.with_locked(true);
        assert!(!primary.can_lock(None), "already locked: no-wait abort");
        assert!(!primary.get_one_allowed());
        // Replication: apply the update in the backup, lower readable.
        let backup = backup.bumped().with_readable(false);
        assert!(
            !backup.get_one_allowed(),
            "GetOne from a local backup must refuse"
        );
        // Unlocking with commit: new version on the primary.
        let primary = primary.bumped().with_locked(false);
        assert_eq!((primary.version(), backup.version()), (8, 8));
        // Raising readable, piggybacked on a later message.
        let backup = backup.with_readable(true);
        assert!(primary.get_one_allowed() && backup.get_one_allowed());
        // Delete.
        assert!(!primary.with_deleted(true).get_one_allowed());
    }

    #[test]
    fn version_wraps_at_29_bits() {
        let top = KvMeta::INSERTED
            .with_version(KvMeta::MAX_VERSION)
            .unwrap()
            .with_locked(true);
        let wrapped = top.bumped();
        assert_eq!(wrapped.version(), 0);
        assert!(wrapped.is_locked() && wrapped.is_readable() && !wrapped.is_deleted());
        assert!(top.checked_bumped().is_err());
        assert_eq!(KvMeta::INSERTED.checked_bumped().unwrap().version(), 1);
        assert!(KvMeta::INSERTED.with_version(1 << 29).is_err());
    }

    #[quickcheck]
    fn qc_round_trip(version: u32, locked: bool, readable: bool, deleted: bool) -> bool {
        let version = version & KvMeta::MAX_VERSION;
        let m = KvMeta::from_raw(0)
            .with_version(version)
            .unwrap()
            .with_locked(locked)
            .with_readable(readable)
            .with_deleted(deleted);
        let back = KvMeta::read_from_bytes(m.as_bytes()).unwrap();
        back == m
            && back.version() == version
            && back.is_locked() == locked
            && back.is_readable() == readable
            && back.is_deleted() == deleted
    }

    #[quickcheck]
    fn qc_flags_are_the_top_three_bits(raw: u32) -> bool {
        let m = KvMeta::from_raw(raw);
        let f = m.flags();
        f.bits() == raw & !KvMeta::MAX_VERSION
            && f.contains(KvFlags::LOCKED) == m.is_locked()
            && f.contains(KvFlags::READABLE) == m.is_readable()
            && f.contains(KvFlags::DELETED) == m.is_deleted()
    }

    #[quickcheck]
    fn qc_bump_keeps_flags(raw: u32) -> bool {
        let m = KvMeta::from_raw(raw);
        let b = m.bumped();
        b.to_raw() & !KvMeta::MAX_VERSION == raw & !KvMeta::MAX_VERSION
            && b.version() == (m.version() + 1) % (1 << 29)
            && m.checked_bumped().is_ok() == (m.version() != KvMeta::MAX_VERSION)
    }
}

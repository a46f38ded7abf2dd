//! The data model: tables of fixed-size records addressed by 64-bit keys.

use core::fmt;

/// A table. Every table has fixed-size values (FORD, Motor and LOTUS all size records per
/// table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TableId(pub u32);

/// A record key inside its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Key(pub u64);

/// A version of one record.
///
/// Per record, versions are totally ordered by their number in the order they were
/// installed: the write-write order the checker relies on. `Version::INITIAL` is the state
/// the record was loaded in (present with its loaded value, or absent). Every protocol maps
/// its own scheme onto this: a per-record counter (FORD, Pandora, OCC), a commit timestamp
/// (Motor, LOTUS), a 29-bit wrapping counter widened to 64 bits (Dandelion).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Version(pub u64);

impl Version {
    /// The loaded state of a record.
    pub const INITIAL: Version = Version(0);
}

/// A transaction coordinator (Pandora's coordinator id: a CN coroutine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CoordinatorId(pub u32);

/// A transaction, unique in a run: the coordinator and its sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TxnId {
    /// The coordinator that ran it.
    pub coordinator: CoordinatorId,
    /// Its sequence number at that coordinator (retries get new numbers).
    pub seq: u64,
}

impl fmt::Display for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "T{}.{}", self.coordinator.0, self.seq)
    }
}

/// Whether a transaction may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum TxnKind {
    /// Declared read-only: protocols may take a cheaper path (OOCC's one-RTT reads, MVCC
    /// snapshots). A write is refused.
    ReadOnly,
    /// May read and write.
    ReadWrite,
}

/// What a write does to its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum WriteKind {
    /// Replaces the value of a present record.
    Update,
    /// Creates an absent record.
    Insert,
    /// Removes a present record (installs a tombstone version).
    Delete,
}

/// Where a table's *critical field* (the field with the most locality: TPC-C's warehouse,
/// TATP's subscriber, SmallBank's account) sits in its 64-bit keys: `bits` bits from bit
/// `shift` (LOTUS §4.2). Protocols that shard by it (LOTUS) take its low 12 bits as the
/// record's shard number; a table without one is sharded by a hash of the whole key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CriticalField {
    /// Lowest bit of the field in the key.
    pub shift: u8,
    /// Width of the field (1–64).
    pub bits: u8,
}

impl CriticalField {
    /// The whole key.
    pub const WHOLE_KEY: Self = Self { shift: 0, bits: 64 };

    /// The field's value in `key`.
    #[must_use]
    pub const fn value(self, key: Key) -> u64 {
        let v = if self.shift >= 64 {
            0
        } else {
            key.0 >> self.shift
        };
        if self.bits >= 64 {
            v
        } else {
            v & ((1 << self.bits) - 1)
        }
    }
}

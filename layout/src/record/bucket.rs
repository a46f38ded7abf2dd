//! The memory-node hash-index bucket a CN reads in one READ (FORD's hash buckets).

use static_assertions::{assert_eq_align, assert_eq_size, const_assert};
use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{RemoteAddr, need};
use crate::{CACHE_LINE, LayoutError};

/// One 16-byte slot of an [`IndexBucket`]: a key and the address of its record.
///
/// A slot is empty when its address is [`RemoteAddr::NULL`] (the key is then meaningless).
/// Slots are 16-byte aligned inside the bucket, so one never straddles a cache line and a
/// 16-byte insert WRITE becomes visible whole.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct IndexSlot {
    key: U64,
    addr: RemoteAddr,
}

assert_eq_size!(IndexSlot, [u8; 16]);
assert_eq_align!(IndexSlot, u8);

impl IndexSlot {
    /// An empty slot.
    pub const EMPTY: Self = Self {
        key: U64::ZERO,
        addr: RemoteAddr::NULL,
    };

    /// A slot mapping `key` to `addr`.
    pub const fn new(key: u64, addr: RemoteAddr) -> Self {
        Self {
            key: U64::new(key),
            addr,
        }
    }

    /// The key.
    pub const fn key(&self) -> u64 {
        self.key.get()
    }

    /// The record address (null when empty).
    pub const fn addr(&self) -> RemoteAddr {
        self.addr
    }

    /// Whether the slot is empty.
    pub const fn is_empty(&self) -> bool {
        self.addr.is_null()
    }
}

/// The 16-byte header of an [`IndexBucket`].
///
/// `next` is the overflow bucket (null at the end of the chain, FORD's next pointer);
/// `insert_lock` is an 8-byte CAS word that inserters hold while they pick and fill a slot
/// (readers never look at it). Both are 8-byte aligned in a bucket placed on a cache line.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct IndexBucketHeader {
    next: RemoteAddr,
    insert_lock: U64,
}

assert_eq_size!(IndexBucketHeader, [u8; 16]);
assert_eq_align!(IndexBucketHeader, u8);

impl IndexBucketHeader {
    /// Offset of the insert-lock word inside the bucket.
    pub const INSERT_LOCK_OFFSET: usize = 8;

    /// The overflow bucket (null if none).
    pub const fn next(&self) -> RemoteAddr {
        self.next
    }

    /// The raw insert-lock word (0 = free).
    pub const fn insert_lock(&self) -> u64 {
        self.insert_lock.get()
    }

    /// Sets the overflow pointer.
    pub fn set_next(&mut self, next: RemoteAddr) {
        self.next = next;
    }

    /// Sets the insert-lock word.
    pub fn set_insert_lock(&mut self, lock: u64) {
        self.insert_lock.set(lock);
    }
}

/// A bucket of the MN hash index that a CN reads with one READ (FORD's hash buckets): a
/// header and `SLOTS` key → record-address slots, sized to whole cache lines.
///
/// ```text
/// line 0: | next u64 | insert_lock u64 | slot 0 (key, addr) | slot 1 | slot 2 |
/// line 1: | slot 3 | slot 4 | slot 5 | slot 6 |                      (IndexBucket<7> ...)
/// ```
///
/// `(SLOTS + 1) * 16` must be a multiple of [`CACHE_LINE`]: 3, 7, 11, 15, ... slots. Every
/// use of a bucket type with another `SLOTS` fails to compile (the check is an associated
/// constant evaluated by [`IndexBucket::parse`], [`IndexBucket::lookup`] and
/// [`IndexBucket::new`]).
///
/// Deviation from FORD: FORD's buckets hold 22 whole data items inline. dmem's hold only
/// key + address, so a bucket is a few cache lines whatever the value size, at the price of
/// a second READ for the record (which a CN skips when it caches the address).
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct IndexBucket<const SLOTS: usize> {
    header: IndexBucketHeader,
    slots: [IndexSlot; SLOTS],
}

/// A one-cache-line bucket: 3 slots, 64 bytes.
pub type IndexBucket1 = IndexBucket<3>;
/// A four-cache-line bucket: 15 slots, 256 bytes.
pub type IndexBucket4 = IndexBucket<15>;

assert_eq_size!(IndexBucket1, [u8; CACHE_LINE]);
assert_eq_size!(IndexBucket4, [u8; 4 * CACHE_LINE]);
assert_eq_align!(IndexBucket4, u8);
const_assert!(IndexBucketHeader::INSERT_LOCK_OFFSET.is_multiple_of(8));

/// The result of looking a key up in one bucket.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BucketLookup {
    /// The key is in slot `slot`, and its record is at `addr`.
    Found {
        /// Index of the slot.
        slot: usize,
        /// Address of the record.
        addr: RemoteAddr,
    },
    /// Not in this bucket; READ the overflow bucket at this address next.
    Next(RemoteAddr),
    /// Not in this bucket, and the chain ends here: the key is absent.
    Absent,
}

impl<const SLOTS: usize> IndexBucket<SLOTS> {
    const WHOLE_LINES: () = assert!(
        SLOTS > 0 && ((SLOTS + 1) * 16).is_multiple_of(CACHE_LINE),
        "IndexBucket<SLOTS> must fill whole cache lines: SLOTS = 3, 7, 11, 15, ..."
    );
    /// Bytes of the bucket (a multiple of [`CACHE_LINE`]).
    pub const LEN: usize = core::mem::size_of::<Self>();
    /// Number of slots.
    pub const SLOTS: usize = SLOTS;

    /// An empty bucket with no overflow bucket.
    pub const fn new() -> Self {
        let () = Self::WHOLE_LINES;
        Self {
            header: IndexBucketHeader {
                next: RemoteAddr::NULL,
                insert_lock: U64::ZERO,
            },
            slots: [IndexSlot::EMPTY; SLOTS],
        }
    }

    /// Overlays a bucket on the bytes of one bucket READ; refuses any other length.
    pub fn parse(bytes: &[u8]) -> Result<&Self, LayoutError> {
        let () = Self::WHOLE_LINES;
        need(Self::LEN, bytes.len())?;
        if bytes.len() > Self::LEN {
            return Err(LayoutError::TooLong {
                max: Self::LEN,
                got: bytes.len(),
            });
        }
        Self::ref_from_bytes(bytes).map_err(|_| LayoutError::TooShort {
            needed: Self::LEN,
            got: bytes.len(),
        })
    }

    /// Byte offset of slot `index` inside the bucket (for a 16-byte insert WRITE), or
    /// `None` past the last slot.
    pub const fn slot_offset(index: usize) -> Option<usize> {
        if index < SLOTS {
            Some(core::mem::size_of::<IndexBucketHeader>() + index * 16)
        } else {
            None
        }
    }

    /// The header.
    pub const fn header(&self) -> &IndexBucketHeader {
        &self.header
    }

    /// The header, mutable.
    pub fn header_mut(&mut self) -> &mut IndexBucketHeader {
        &mut self.header
    }

    /// The slots.
    pub const fn slots(&self) -> &[IndexSlot; SLOTS] {
        &self.slots
    }

    /// The slots, mutable.
    pub fn slots_mut(&mut self) -> &mut [IndexSlot; SLOTS] {
        &mut self.slots
    }

    /// Looks `key` up among the non-empty slots (the first match wins).
    pub fn lookup(&self, key: u64) -> BucketLookup {
        let () = Self::WHOLE_LINES;
        for (slot, entry) in self.slots.iter().enumerate() {
            if !entry.is_empty() && entry.key() == key {
                return BucketLookup::Found {
                    slot,
                    addr: entry.addr(),
                };
            }
        }
        if self.header.next.is_null() {
            BucketLookup::Absent
        } else {
            BucketLookup::Next(self.header.next)
        }
    }

    /// The first empty slot, if any.
    pub fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(IndexSlot::is_empty)
    }
}

impl<const SLOTS: usize> Default for IndexBucket<SLOTS> {
    fn default() -> Self {
        Self::new()
    }
}

/// Looks `key` up in the bytes of one bucket READ: [`IndexBucket::parse`] then
/// [`IndexBucket::lookup`], without copying.
pub fn lookup_in_bucket<const SLOTS: usize>(
    bytes: &[u8],
    key: u64,
) -> Result<BucketLookup, LayoutError> {
    IndexBucket::<SLOTS>::parse(bytes).map(|bucket| bucket.lookup(key))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_lookup_follows_chain() {
        let mut bucket = IndexBucket4::new();
        let a = RemoteAddr::new(1, 0x1000).unwrap();
        let b = RemoteAddr::new(2, 0x2000).unwrap();
        bucket.slots_mut()[0] = IndexSlot::new(10, a);
        bucket.slots_mut()[14] = IndexSlot::new(20, b);
        bucket.slots_mut()[5] = IndexSlot::new(30, RemoteAddr::NULL); // empty: key ignored
        let bytes = bucket.as_bytes();
        assert_eq!(bytes.len(), 256);
        assert_eq!(
            lookup_in_bucket::<15>(bytes, 10),
            Ok(BucketLookup::Found { slot: 0, addr: a })
        );
        assert_eq!(
            lookup_in_bucket::<15>(bytes, 20),
            Ok(BucketLookup::Found { slot: 14, addr: b })
        );
        assert_eq!(lookup_in_bucket::<15>(bytes, 30), Ok(BucketLookup::Absent));
        assert_eq!(
            lookup_in_bucket::<15>(&bytes[..255], 1),
            Err(LayoutError::TooShort {
                needed: 256,
                got: 255
            })
        );
        bucket
            .header_mut()
            .set_next(RemoteAddr::new(1, 0x40).unwrap());
        assert_eq!(
            bucket.lookup(30),
            BucketLookup::Next(RemoteAddr::new(1, 0x40).unwrap())
        );
        assert_eq!(bucket.free_slot(), Some(1));
        assert_eq!(IndexBucket4::slot_offset(14), Some(240));
        assert_eq!(IndexBucket4::slot_offset(15), None);
        assert_eq!(
            IndexBucket1::parse(&[0u8; 65]).unwrap_err(),
            LayoutError::TooLong { max: 64, got: 65 }
        );
    }
}

//! The packed remote address (memory node + offset) every record and bucket uses.

use core::fmt;

use static_assertions::{assert_eq_align, assert_eq_size};
use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::LayoutError;

/// An address in the memory pool: memory-node id and byte offset packed in one 64-bit word.
///
/// ```text
///  63            48 47                                             0
/// +----------------+------------------------------------------------+
/// |   node (16)    |                 offset (48)                    |
/// +----------------+------------------------------------------------+
/// ```
///
/// FORD and LOTUS store "the 64-bit address of the corresponding record" (LOTUS §7.1); dmem
/// names the MN explicitly because its records are spread over several MNs and the
/// node id selects the queue pair. 48 bits address 256 TiB per node. The all-zero word is
/// [`RemoteAddr::NULL`]: offset 0 of every MN region is reserved and never holds a record,
/// so a null slot or a null overflow pointer needs no separate flag.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct RemoteAddr(U64);

assert_eq_size!(RemoteAddr, [u8; 8]);
assert_eq_align!(RemoteAddr, u8);

impl RemoteAddr {
    /// The null address (node 0, offset 0).
    pub const NULL: Self = Self(U64::ZERO);
    /// Bits of the offset field.
    pub const OFFSET_BITS: u32 = 48;
    /// Largest offset a remote address can hold.
    pub const MAX_OFFSET: u64 = (1 << Self::OFFSET_BITS) - 1;

    /// Packs `node` and `offset`; refuses an offset wider than 48 bits.
    pub const fn new(node: u16, offset: u64) -> Result<Self, LayoutError> {
        if offset > Self::MAX_OFFSET {
            return Err(LayoutError::DoesNotFit {
                field: "offset",
                value: offset,
                max: Self::MAX_OFFSET,
            });
        }
        Ok(Self(U64::new(
            ((node as u64) << Self::OFFSET_BITS) | offset,
        )))
    }

    /// Reinterprets a raw word (every 64-bit pattern is a valid address).
    pub const fn from_raw(raw: u64) -> Self {
        Self(U64::new(raw))
    }

    /// The raw word, as stored in memory.
    pub const fn to_raw(self) -> u64 {
        self.0.get()
    }

    /// The memory-node id.
    pub const fn node(self) -> u16 {
        (self.to_raw() >> Self::OFFSET_BITS) as u16
    }

    /// The byte offset in the node's registered region.
    pub const fn offset(self) -> u64 {
        self.to_raw() & Self::MAX_OFFSET
    }

    /// Whether this is [`RemoteAddr::NULL`].
    pub const fn is_null(self) -> bool {
        self.to_raw() == 0
    }

    /// The same node with another offset; refuses an offset wider than 48 bits.
    pub const fn with_offset(self, offset: u64) -> Result<Self, LayoutError> {
        Self::new(self.node(), offset)
    }

    /// The address `delta` bytes further on the same node; refuses to leave the 48-bit space.
    pub const fn checked_add(self, delta: u64) -> Result<Self, LayoutError> {
        match self.offset().checked_add(delta) {
            Some(offset) => self.with_offset(offset),
            None => Err(LayoutError::DoesNotFit {
                field: "offset",
                value: u64::MAX,
                max: Self::MAX_OFFSET,
            }),
        }
    }
}

impl fmt::Debug for RemoteAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_null() {
            f.write_str("RemoteAddr(null)")
        } else {
            write!(f, "RemoteAddr({}:{:#x})", self.node(), self.offset())
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck_macros::quickcheck;

    #[test]
    fn remote_addr_packing() {
        let a = RemoteAddr::new(0xBEEF, 0x1234_5678_9ABC).unwrap();
        assert_eq!(a.to_raw(), 0xBEEF_1234_5678_9ABC);
        assert_eq!(a.checked_add(4).unwrap().offset(), 0x1234_5678_9AC0);
        assert!(RemoteAddr::new(0, 1 << 48).is_err());
        assert!(
            RemoteAddr::new(0, RemoteAddr::MAX_OFFSET)
                .unwrap()
                .checked_add(1)
                .is_err()
        );
        assert!(RemoteAddr::NULL.is_null());
    }

    #[quickcheck]
    fn qc_remote_addr_round_trip(node: u16, offset: u64) -> bool {
        let offset = offset & RemoteAddr::MAX_OFFSET;
        let a = RemoteAddr::new(node, offset).unwrap();
        a.node() == node && a.offset() == offset && RemoteAddr::from_raw(a.to_raw()) == a
    }
}

//! The FORD/Pandora data item: version word, flags, header and view (Pandora §2.3, §3.1.2).

use core::fmt;

use static_assertions::{assert_eq_align, assert_eq_size, const_assert_eq};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{header_of, header_of_mut, need, pad8};
use crate::LayoutError;

/// The version word of a FORD data item: a 63-bit counter and FORD's "invisible" bit 63.
///
/// ```text
///  63  62                                                            0
/// +---+---------------------------------------------------------------+
/// | I |                        counter (63)                           |
/// +---+---------------------------------------------------------------+
/// ```
///
/// Validation (Pandora §2.3 step 2) compares the counter read in execution with the counter
/// read again; recovery (Pandora §3.2.2 step 3) compares it with the undo log's old version.
/// The invisible bit marks an item inserted by a transaction that has not committed yet
/// (FORD's "invisible" flag is bit 63 of its version word), so one READ of lock + version
/// tells a reader that the item must not be read.
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
pub struct DataVersion(U64);

assert_eq_size!(DataVersion, [u8; 8]);
assert_eq_align!(DataVersion, u8);

impl DataVersion {
    /// Bit position of the invisible flag.
    pub const INVISIBLE_BIT: u32 = 63;
    /// Largest counter value.
    pub const MAX_COUNTER: u64 = (1 << Self::INVISIBLE_BIT) - 1;

    /// A visible version with `counter`; refuses a counter wider than 63 bits.
    pub const fn new(counter: u64) -> Result<Self, LayoutError> {
        if counter > Self::MAX_COUNTER {
            return Err(LayoutError::DoesNotFit {
                field: "version",
                value: counter,
                max: Self::MAX_COUNTER,
            });
        }
        Ok(Self(U64::new(counter)))
    }

    /// Reinterprets a raw word (every 64-bit pattern is valid).
    pub const fn from_raw(raw: u64) -> Self {
        Self(U64::new(raw))
    }

    /// The raw word.
    pub const fn to_raw(self) -> u64 {
        self.0.get()
    }

    /// The 63-bit counter.
    pub const fn counter(self) -> u64 {
        self.to_raw() & Self::MAX_COUNTER
    }

    /// Whether the item is invisible (inserted, not yet committed).
    pub const fn is_invisible(self) -> bool {
        self.to_raw() >> Self::INVISIBLE_BIT != 0
    }

    /// The same word with another counter; refuses a counter wider than 63 bits.
    pub const fn with_counter(self, counter: u64) -> Result<Self, LayoutError> {
        if counter > Self::MAX_COUNTER {
            return Err(LayoutError::DoesNotFit {
                field: "version",
                value: counter,
                max: Self::MAX_COUNTER,
            });
        }
        Ok(Self(U64::new(
            (self.to_raw() & !Self::MAX_COUNTER) | counter,
        )))
    }

    /// The same word with the invisible bit set or cleared.
    pub const fn with_invisible(self, invisible: bool) -> Self {
        let raw = (self.to_raw() & Self::MAX_COUNTER) | ((invisible as u64) << Self::INVISIBLE_BIT);
        Self(U64::new(raw))
    }

    /// The next version a committing writer installs: counter + 1, **wrapping** to 0 after
    /// 2^63 − 1 (validation is by equality, and 2^63 commits to one item never happen
    /// between a read and its validation). The invisible bit is kept.
    pub const fn bumped(self) -> Self {
        let counter = (self.counter() + 1) & Self::MAX_COUNTER;
        Self(U64::new((self.to_raw() & !Self::MAX_COUNTER) | counter))
    }
}

impl fmt::Debug for DataVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataVersion")
            .field("counter", &self.counter())
            .field("invisible", &self.is_invisible())
            .finish()
    }
}

/// Per-item flags shared by [`DataItemHeader`] and [`OoccRecordHeader`](super::OoccRecordHeader).
///
/// `valid` is FORD's valid flag (the slot holds a live object; a committed delete clears it),
/// `user_insert` is FORD's user-insert flag (the object was inserted by a transaction rather
/// than by the loader, which recovery needs to roll an insert back; Pandora §5.1 "missing
/// insert logs"). The other 14 bits are undefined and must be zero; checked constructors
/// refuse a word that sets them.
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
pub struct ItemFlags(U16);

assert_eq_size!(ItemFlags, [u8; 2]);
assert_eq_align!(ItemFlags, u8);

bitflags::bitflags! {
    /// The meaning of an [`ItemFlags`] word's bits; any other bit is undefined.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct ItemFlagBits: u16 {
        /// A live object.
        const VALID = 1 << 0;
        /// Inserted by a transaction (not by the loader).
        const USER_INSERT = 1 << 1;
    }
}

impl ItemFlags {
    /// The bits that have a meaning.
    pub const DEFINED: u16 = ItemFlagBits::all().bits();
    /// No flag set: an empty (never used or deleted) slot.
    pub const EMPTY: Self = Self(U16::ZERO);
    /// A live object written by the loader.
    pub const LOADED: Self = Self(U16::new(ItemFlagBits::VALID.bits()));

    /// Parses a raw word, refusing undefined bits.
    pub const fn from_raw(raw: u16) -> Result<Self, LayoutError> {
        if raw & !Self::DEFINED != 0 {
            return Err(LayoutError::InvalidField { field: "flags" });
        }
        Ok(Self(U16::new(raw)))
    }

    /// The raw word.
    pub const fn to_raw(self) -> u16 {
        self.0.get()
    }

    /// The defined flags (undefined bits, which parsing refuses, left out).
    pub const fn bits(self) -> ItemFlagBits {
        ItemFlagBits::from_bits_truncate(self.to_raw())
    }

    /// Whether the object is live.
    pub const fn is_valid(self) -> bool {
        self.bits().contains(ItemFlagBits::VALID)
    }

    /// Whether the object was inserted by a transaction.
    pub const fn is_user_insert(self) -> bool {
        self.bits().contains(ItemFlagBits::USER_INSERT)
    }

    /// The same flags with `valid` set or cleared.
    pub const fn with_valid(self, valid: bool) -> Self {
        self.with_flag(ItemFlagBits::VALID, valid)
    }

    /// The same flags with `user_insert` set or cleared.
    pub const fn with_user_insert(self, user_insert: bool) -> Self {
        self.with_flag(ItemFlagBits::USER_INSERT, user_insert)
    }

    const fn with_flag(self, flag: ItemFlagBits, on: bool) -> Self {
        Self(U16::new(if on {
            self.to_raw() | flag.bits()
        } else {
            self.to_raw() & !flag.bits()
        }))
    }

    pub(super) const fn has_undefined_bits(self) -> bool {
        self.to_raw() & !Self::DEFINED != 0
    }
}

impl fmt::Debug for ItemFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ItemFlags")
            .field("valid", &self.is_valid())
            .field("user_insert", &self.is_user_insert())
            .finish()
    }
}

/// The fixed 40-byte front of a FORD/Pandora data item (Pandora §2.3, §3.1.2; FORD).
///
/// ```text
/// offset  0 +--------------------------------------+
///           | lock        u64  PILL lock word       |  CAS 0 -> coordinator id + 1
///         8 +--------------------------------------+
///           | version     DataVersion               |  validation READ = bytes 0..16
///        16 +--------------------------------------+
///           | writer      u64  installer of version |  (coordinator << 48) | seq; 0 = loaded
///        24 +--------------------------------------+
///           | key         u64                       |
///        32 +------------------+---------+---------+
///           | table_id u32     | vlen u16| flags   |
///        40 +------------------+---------+---------+
///           | value[vlen] ... padded to 8 bytes     |
///           +--------------------------------------+
/// ```
///
/// The writer word names the transaction that installed the current version, so a reader
/// can tell its history which transaction's version it observed (FORD's per-record counters
/// give the next writer the number of a rolled-back version, so the number alone does not
/// identify it). It sits right after the version: a commit WRITE from
/// [`DataItemHeader::VERSION_OFFSET`] installs both, and the item READ returns both. It is
/// packed by [`DataItemHeader::pack_writer`]; 0 ([`DataItemHeader::NO_WRITER`]) is the
/// loader's. Validation still compares only the version (bytes 0..16).
///
/// The lock word is stored as a raw little-endian `u64` holding the PILL encoding
/// (`crate::pill`): 0 is free, a locked word names its owner (Pandora's code CASes the
/// coordinator id + 1 into it). This module does not interpret it beyond "zero is free".
///
/// Deviation from FORD's `DataItem`: FORD orders the fields table id, value size, key, remote
/// offset, version, lock, value, valid, user-insert. dmem puts lock and version first so that
/// validation reads 16 bytes and the CAS target is at offset 0, moves the flags in front of
/// the value so that items of every value size share one header, drops the remote
/// offset (the coordinator knows the address it read from), and adds the writer word.
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct DataItemHeader {
    lock: U64,
    version: DataVersion,
    writer: U64,
    key: U64,
    table_id: U32,
    value_len: U16,
    flags: ItemFlags,
}

assert_eq_size!(DataItemHeader, [u8; 40]);
assert_eq_align!(DataItemHeader, u8);
const_assert_eq!(DataItemHeader::LOCK_OFFSET % 8, 0);
const_assert_eq!(DataItemHeader::LEN % 8, 0);
const_assert_eq!(
    DataItemHeader::WRITER_OFFSET,
    DataItemHeader::VALIDATION_LEN
);

impl DataItemHeader {
    /// Bytes of the header; the value starts here.
    pub const LEN: usize = core::mem::size_of::<Self>();
    /// Offset of the lock word (the CAS target).
    pub const LOCK_OFFSET: usize = 0;
    /// Offset of the version word.
    pub const VERSION_OFFSET: usize = 8;
    /// Bytes a validation READ fetches: lock + version.
    pub const VALIDATION_LEN: usize = 16;
    /// Offset of the writer word (the installer of the current version).
    pub const WRITER_OFFSET: usize = 16;
    /// The writer word of a version nobody installed: the loaded state.
    pub const NO_WRITER: u64 = 0;
    /// Largest sequence number [`DataItemHeader::pack_writer`] accepts (48 bits).
    pub const MAX_WRITER_SEQ: u64 = (1 << 48) - 1;
    /// Largest value a data item holds.
    pub const MAX_VALUE_LEN: usize = u16::MAX as usize;

    /// Bytes one item with a `value_len`-byte value occupies (header + value, padded to 8):
    /// the length of the single READ that returns lock + version + value.
    pub const fn item_len(value_len: usize) -> usize {
        pad8(Self::LEN + value_len)
    }

    /// A header for an unlocked item installed by the loader (writer
    /// [`DataItemHeader::NO_WRITER`]); add an installer with [`DataItemHeader::with_writer`].
    pub const fn new(
        key: u64,
        table_id: u32,
        value_len: u16,
        version: DataVersion,
        flags: ItemFlags,
    ) -> Self {
        Self {
            lock: U64::ZERO,
            version,
            writer: U64::ZERO,
            key: U64::new(key),
            table_id: U32::new(table_id),
            value_len: U16::new(value_len),
            flags,
        }
    }

    /// The writer word of a transaction: `(coordinator << 48) | seq`. `None` if `seq` does
    /// not fit in 48 bits, or for coordinator 0 with sequence number 0, which would read as
    /// [`DataItemHeader::NO_WRITER`] (start sequence numbers at 1).
    pub const fn pack_writer(coordinator: u16, seq: u64) -> Option<u64> {
        if seq > Self::MAX_WRITER_SEQ || (coordinator == 0 && seq == 0) {
            None
        } else {
            Some(((coordinator as u64) << 48) | seq)
        }
    }

    /// The `(coordinator, seq)` a writer word names, `None` for
    /// [`DataItemHeader::NO_WRITER`]. Every other word decodes.
    pub const fn unpack_writer(writer: u64) -> Option<(u16, u64)> {
        if writer == Self::NO_WRITER {
            None
        } else {
            Some(((writer >> 48) as u16, writer & Self::MAX_WRITER_SEQ))
        }
    }

    /// This header with its writer word set (see [`DataItemHeader::pack_writer`]).
    #[must_use]
    pub const fn with_writer(mut self, writer: u64) -> Self {
        self.writer = U64::new(writer);
        self
    }

    /// The raw lock word (PILL encoding; 0 = free).
    pub const fn lock_word(&self) -> u64 {
        self.lock.get()
    }

    /// The writer word: who installed the current version ([`DataItemHeader::NO_WRITER`]
    /// for the loader).
    pub const fn writer(&self) -> u64 {
        self.writer.get()
    }

    /// Whether the lock word is non-zero.
    pub const fn is_locked(&self) -> bool {
        self.lock_word() != 0
    }

    /// The version word.
    pub const fn version(&self) -> DataVersion {
        self.version
    }

    /// The key.
    pub const fn key(&self) -> u64 {
        self.key.get()
    }

    /// The table the item belongs to.
    pub const fn table_id(&self) -> u32 {
        self.table_id.get()
    }

    /// Length of the value in bytes.
    pub const fn value_len(&self) -> usize {
        self.value_len.get() as usize
    }

    /// The flags word (may carry undefined bits if it was not checked).
    pub const fn flags(&self) -> ItemFlags {
        self.flags
    }

    /// Sets the raw lock word.
    pub fn set_lock_word(&mut self, lock: u64) {
        self.lock.set(lock);
    }

    /// Sets the version word.
    pub fn set_version(&mut self, version: DataVersion) {
        self.version = version;
    }

    /// Sets the writer word.
    pub fn set_writer(&mut self, writer: u64) {
        self.writer.set(writer);
    }

    /// Sets the key.
    pub fn set_key(&mut self, key: u64) {
        self.key.set(key);
    }

    /// Sets the table id.
    pub fn set_table_id(&mut self, table_id: u32) {
        self.table_id.set(table_id);
    }

    /// Sets the flags.
    pub fn set_flags(&mut self, flags: ItemFlags) {
        self.flags = flags;
    }
}

/// A view of one FORD/Pandora data item (header + value) over a byte buffer.
///
/// Built from the bytes of one READ of [`DataItemHeader::item_len`] bytes; trailing bytes
/// (the padding, or a neighbouring item in a wider READ) are allowed and ignored.
/// Once [`DataItem::new_checked`] has accepted a buffer, no accessor panics.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DataItem<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> DataItem<T> {
    /// Wraps bytes this node wrote itself without checking them. Accessors panic if the
    /// buffer is shorter than the header plus the value length it declares.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps untrusted bytes: refuses a buffer shorter than the header or than the value
    /// length it declares, and flags with undefined bits.
    pub fn new_checked(buffer: T) -> Result<Self, LayoutError> {
        let item = Self::new_unchecked(buffer);
        item.check()?;
        Ok(item)
    }

    /// The checks [`DataItem::new_checked`] runs.
    pub fn check(&self) -> Result<(), LayoutError> {
        let buf = self.buffer.as_ref();
        need(DataItemHeader::LEN, buf.len())?;
        let header = self.header();
        if header.flags.has_undefined_bits() {
            return Err(LayoutError::InvalidField { field: "flags" });
        }
        need(DataItemHeader::LEN + header.value_len(), buf.len())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The fixed header.
    pub fn header(&self) -> &DataItemHeader {
        header_of(self.buffer.as_ref())
    }

    /// The raw lock word (PILL encoding; 0 = free).
    pub fn lock_word(&self) -> u64 {
        self.header().lock_word()
    }

    /// The version word.
    pub fn version(&self) -> DataVersion {
        self.header().version()
    }

    /// The writer word: who installed the current version.
    pub fn writer(&self) -> u64 {
        self.header().writer()
    }

    /// The key.
    pub fn key(&self) -> u64 {
        self.header().key()
    }

    /// The value bytes.
    pub fn value(&self) -> &[u8] {
        let len = self.header().value_len();
        &self.buffer.as_ref()[DataItemHeader::LEN..DataItemHeader::LEN + len]
    }

    /// Whether the item can be read by a transaction: unlocked, valid and visible.
    pub fn is_readable(&self) -> bool {
        let header = self.header();
        !header.is_locked() && header.flags().is_valid() && !header.version().is_invisible()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DataItem<T> {
    /// Writes an unlocked item with `header`'s fields and `value` into the front of
    /// `buffer`, zero-filling the padding up to [`DataItemHeader::item_len`]. Refuses a
    /// buffer that is too short and a value longer than `u16::MAX`; `buffer` is unchanged
    /// on error. The header's value length is taken from `value`.
    pub fn emit(mut buffer: T, header: DataItemHeader, value: &[u8]) -> Result<Self, LayoutError> {
        let value_len = u16::try_from(value.len()).map_err(|_| LayoutError::DoesNotFit {
            field: "value_len",
            value: value.len() as u64,
            max: u16::MAX.into(),
        })?;
        let total = DataItemHeader::item_len(value.len());
        let buf = buffer.as_mut();
        need(total, buf.len())?;
        let mut header = header;
        header.value_len = U16::new(value_len);
        header.lock = U64::ZERO;
        *header_of_mut::<DataItemHeader>(buf) = header;
        let end = DataItemHeader::LEN + value.len();
        buf[DataItemHeader::LEN..end].copy_from_slice(value);
        buf[end..total].fill(0);
        Ok(Self::new_unchecked(buffer))
    }

    /// The fixed header, mutable.
    pub fn header_mut(&mut self) -> &mut DataItemHeader {
        header_of_mut(self.buffer.as_mut())
    }

    /// The value bytes, mutable (the length is fixed by the header).
    pub fn value_mut(&mut self) -> &mut [u8] {
        let len = self.header().value_len();
        &mut self.buffer.as_mut()[DataItemHeader::LEN..DataItemHeader::LEN + len]
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck_macros::quickcheck;

    fn ford_header(key: u64, version: u64) -> DataItemHeader {
        DataItemHeader::new(
            key,
            7,
            0,
            DataVersion::new(version).unwrap(),
            ItemFlags::LOADED,
        )
    }

    #[test]
    fn data_item_one_read_returns_lock_version_value() {
        // Pandora Fig. 2: the coordinator locks Y (CAS 0 -> coordinator id + 1) and reads it.
        let value = [0x59u8; 40]; // LOTUS's KVS micro uses 40-byte values
        assert_eq!(DataItemHeader::item_len(value.len()), 80);
        let mut mn = [0u8; 80];
        let writer = DataItemHeader::pack_writer(41, 7).unwrap();
        let header = ford_header(0x59, 3).with_writer(writer);
        let mut item = DataItem::emit(&mut mn[..], header, &value).unwrap();
        item.header_mut().set_lock_word(41 + 1);
        let read = DataItem::new_checked(&mn[..]).unwrap();
        assert_eq!(read.lock_word(), 42);
        assert_eq!(read.version().counter(), 3);
        assert_eq!(DataItemHeader::unpack_writer(read.writer()), Some((41, 7)));
        assert_eq!(read.key(), 0x59);
        assert_eq!(read.value(), &value);
        assert!(!read.is_readable(), "a locked item is not readable");
        // Validation READs only the first 16 bytes and still sees lock and version.
        let v = DataItemHeader::VALIDATION_LEN;
        assert_eq!(&mn[..8], &42u64.to_le_bytes());
        assert_eq!(&mn[8..v], &3u64.to_le_bytes());
        // The installer follows the version, so a commit WRITE from the version on sets both.
        let w = DataItemHeader::WRITER_OFFSET;
        assert_eq!(&mn[w..w + 8], &((41u64 << 48) | 7).to_le_bytes());
    }

    #[test]
    fn writer_word_packing() {
        assert_eq!(ford_header(1, 1).writer(), DataItemHeader::NO_WRITER);
        assert_eq!(
            DataItemHeader::unpack_writer(DataItemHeader::NO_WRITER),
            None
        );
        assert_eq!(DataItemHeader::pack_writer(0, 0), None);
        assert_eq!(DataItemHeader::pack_writer(0, 1), Some(1));
        assert_eq!(
            DataItemHeader::pack_writer(u16::MAX, DataItemHeader::MAX_WRITER_SEQ),
            Some(u64::MAX)
        );
        assert_eq!(DataItemHeader::pack_writer(3, 1 << 48), None);
        let mut h = ford_header(1, 1);
        h.set_writer(99);
        assert_eq!(h.writer(), 99);
        assert_eq!(h.with_writer(5).writer(), 5);
    }

    #[quickcheck]
    fn qc_writer_word_round_trip(coordinator: u16, seq: u64) -> bool {
        let seq = seq & DataItemHeader::MAX_WRITER_SEQ;
        match DataItemHeader::pack_writer(coordinator, seq) {
            Some(w) => DataItemHeader::unpack_writer(w) == Some((coordinator, seq)),
            None => coordinator == 0 && seq == 0,
        }
    }

    #[test]
    fn data_item_emit_refuses_short_buffer_unchanged() {
        let mut mn = [0xAAu8; 48];
        let err = DataItem::emit(&mut mn[..], ford_header(1, 1), &[1u8; 9]).unwrap_err();
        assert_eq!(
            err,
            LayoutError::TooShort {
                needed: 56,
                got: 48
            }
        );
        assert!(mn.iter().all(|&b| b == 0xAA));
    }

    #[test]
    fn data_item_checked_refusals() {
        let mut mn = [0u8; 48];
        DataItem::emit(&mut mn[..], ford_header(1, 1), &[9u8; 8]).unwrap();
        assert_eq!(
            DataItem::new_checked(&mn[..20]).unwrap_err(),
            LayoutError::TooShort {
                needed: 40,
                got: 20
            }
        );
        assert_eq!(
            DataItem::new_checked(&mn[..47]).unwrap_err(),
            LayoutError::TooShort {
                needed: 48,
                got: 47
            }
        );
        mn[39] = 0x80; // an undefined flag bit
        assert_eq!(
            DataItem::new_checked(&mn[..]).unwrap_err(),
            LayoutError::InvalidField { field: "flags" }
        );
    }

    #[test]
    fn ford_invisible_insert() {
        // An inserted, uncommitted item carries bit 63 of its version (as in FORD).
        let v = DataVersion::new(5).unwrap().with_invisible(true);
        assert_eq!(v.to_raw(), (1 << 63) | 5);
        let mut mn = [0u8; 40];
        let header = DataItemHeader::new(1, 1, 0, v, ItemFlags::LOADED.with_user_insert(true));
        let item = DataItem::emit(&mut mn[..], header, &[]).unwrap();
        assert!(!item.is_readable());
        assert!(item.header().flags().is_user_insert());
        assert_eq!(DataVersion::from_raw(u64::MAX).bumped().to_raw(), 1 << 63);
    }

    #[quickcheck]
    fn qc_data_version_round_trip(counter: u64, invisible: bool) -> bool {
        let counter = counter & DataVersion::MAX_COUNTER;
        let v = DataVersion::new(counter).unwrap().with_invisible(invisible);
        v.counter() == counter
            && v.is_invisible() == invisible
            && DataVersion::from_raw(v.to_raw()) == v
    }

    #[quickcheck]
    fn qc_item_flags_round_trip(valid: bool, user_insert: bool, raw: u16) -> bool {
        let f = ItemFlags::EMPTY
            .with_valid(valid)
            .with_user_insert(user_insert);
        let parsed_ok = ItemFlags::from_raw(raw).is_ok() == (raw & !ItemFlags::DEFINED == 0);
        f.is_valid() == valid
            && f.is_user_insert() == user_insert
            && ItemFlags::from_raw(f.to_raw()) == Ok(f)
            && parsed_ok
    }

    #[quickcheck]
    fn qc_data_item_round_trip(
        key: u64,
        table: u32,
        counter: u64,
        lock: u64,
        writer: u64,
        value: Vec<u8>,
    ) -> bool {
        let version = DataVersion::new(counter & DataVersion::MAX_COUNTER).unwrap();
        let header =
            DataItemHeader::new(key, table, 0, version, ItemFlags::LOADED).with_writer(writer);
        let mut buf = vec![0u8; DataItemHeader::item_len(value.len())];
        let mut item = DataItem::emit(&mut buf[..], header, &value).unwrap();
        item.header_mut().set_lock_word(lock);
        let read = DataItem::new_checked(&buf[..]).unwrap();
        read.key() == key
            && read.header().table_id() == table
            && read.version() == version
            && read.lock_word() == lock
            && read.writer() == writer
            && read.value() == &value[..]
    }
}

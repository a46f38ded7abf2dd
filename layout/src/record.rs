//! One-sided records: the FORD/Pandora data item, the OOCC record and the memory-node (MN)
//! hash-index bucket.
//!
//! A coordinator on a compute node (CN) reaches these images only through one-sided RDMA
//! verbs, so each is laid out for the verbs that touch it:
//!
//! * [`DataItem`] (FORD as Pandora §2.3 describes it, with PILL's lock word from §3.1.2): the
//!   lock word and the version come first, so **one READ** of [`DataItemHeader::item_len`]
//!   bytes returns lock + version + value, and validation (Pandora §2.3 step 2) is one READ of
//!   the first [`DataItemHeader::VALIDATION_LEN`] bytes.
//! * [`OoccRecord`] (OOCC §IV–§V): the lock word sits at the **highest address**, so one RDMA
//!   WRITE of value + lock word installs the value and releases the lock ("one-op write
//!   unlock"), because a WRITE lands in increasing address order.
//! * [`IndexBucket`] (the MN hash index a CN reads in one READ): whole cache lines of
//!   16-byte `key → record address` slots behind a 16-byte header with the overflow pointer.
//!
//! # Value size: a run-time length over a byte view, not a const generic
//!
//! The value size of an item is a property of its table (TATP, SmallBank and TPC-C tables
//! each have their own), and dmem chooses the workload at run time (REFERENCE.md lists
//! FORD's and Motor's compile-time workload choice as a pain point). So the value length is
//! a header field and the record types are views over a byte buffer
//! ([`DataItem<T: AsRef<[u8]>>`](DataItem), [`OoccRecord<T>`](OoccRecord)) in smoltcp's wire
//! style: one compiled code path serves every table, and the fixed part of each record is a
//! `#[repr(C)]` zerocopy header whose size is pinned by `static_assertions`.
//!
//! # Alignment
//!
//! Every header here has alignment 1 (its integers are `zerocopy::little_endian` types), so a
//! view can be laid over any receive buffer. The 8-byte words that RDMA atomics touch (the
//! data-item lock, the OOCC lock word, the bucket insert lock) sit at offsets that are
//! multiples of 8 from the start of their record, and every record length is rounded up to a
//! multiple of 8 ([`DataItemHeader::item_len`], [`OoccRecordHeader::record_len`]); placing
//! records at 8-byte aligned MN addresses is the allocator's job.
//!
//! # The contract of the views
//!
//! `new_checked` validates length and every field with undefined bit patterns and returns a
//! [`LayoutError`], never panicking. **Once `new_checked` has accepted a buffer, no accessor
//! of the view panics.** `new_unchecked` is for bytes this node wrote itself; an accessor on
//! an unchecked view over a buffer that is too short panics, as in smoltcp.

use core::fmt;
use core::ops::Range;

use static_assertions::{assert_eq_align, assert_eq_size, const_assert, const_assert_eq};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::{CACHE_LINE, LayoutError};

/// Rounds `n` up to the next multiple of 8 (record strides keep 8-byte words aligned).
pub(crate) const fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// Returns `TooShort` unless `got >= needed`.
pub(crate) const fn need(needed: usize, got: usize) -> Result<(), LayoutError> {
    if got < needed {
        Err(LayoutError::TooShort { needed, got })
    } else {
        Ok(())
    }
}

/// Overlays the fixed-size header `H` on the front of `buf`.
///
/// Views call this only after `new_checked` proved `buf` long enough; an unchecked view over
/// a short buffer reaches the panic, which is the documented `new_unchecked` contract.
pub(crate) fn header_of<H: FromBytes + KnownLayout + Immutable>(buf: &[u8]) -> &H {
    match H::ref_from_prefix(buf) {
        Ok((header, _)) => header,
        Err(_) => {
            panic!("layout view built with new_unchecked over a buffer shorter than its header")
        }
    }
}

/// Mutable counterpart of [`header_of`], with the same contract.
pub(crate) fn header_of_mut<H: FromBytes + IntoBytes + KnownLayout>(buf: &mut [u8]) -> &mut H {
    match H::mut_from_prefix(buf) {
        Ok((header, _)) => header,
        Err(_) => {
            panic!("layout view built with new_unchecked over a buffer shorter than its header")
        }
    }
}

// ---------------------------------------------------------------------------------------
// Remote address
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// FORD / Pandora data item
// ---------------------------------------------------------------------------------------

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
/// (REFERENCE.md: FORD's "invisible" = bit 63 of the version), so one READ of lock + version
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

/// Per-item flags shared by [`DataItemHeader`] and [`OoccRecordHeader`].
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

impl ItemFlags {
    const VALID: u16 = 1 << 0;
    const USER_INSERT: u16 = 1 << 1;
    /// The bits that have a meaning.
    pub const DEFINED: u16 = Self::VALID | Self::USER_INSERT;
    /// No flag set: an empty (never used or deleted) slot.
    pub const EMPTY: Self = Self(U16::ZERO);
    /// A live object written by the loader.
    pub const LOADED: Self = Self(U16::new(Self::VALID));

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

    /// Whether the object is live.
    pub const fn is_valid(self) -> bool {
        self.to_raw() & Self::VALID != 0
    }

    /// Whether the object was inserted by a transaction.
    pub const fn is_user_insert(self) -> bool {
        self.to_raw() & Self::USER_INSERT != 0
    }

    /// The same flags with `valid` set or cleared.
    pub const fn with_valid(self, valid: bool) -> Self {
        Self(U16::new(if valid {
            self.to_raw() | Self::VALID
        } else {
            self.to_raw() & !Self::VALID
        }))
    }

    /// The same flags with `user_insert` set or cleared.
    pub const fn with_user_insert(self, user_insert: bool) -> Self {
        let raw = if user_insert {
            self.to_raw() | Self::USER_INSERT
        } else {
            self.to_raw() & !Self::USER_INSERT
        };
        Self(U16::new(raw))
    }

    const fn has_undefined_bits(self) -> bool {
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

/// The fixed 32-byte front of a FORD/Pandora data item (Pandora §2.3, §3.1.2; FORD).
///
/// ```text
/// offset  0 +--------------------------------------+
///           | lock        u64  PILL lock word       |  CAS 0 -> coordinator id + 1
///         8 +--------------------------------------+
///           | version     DataVersion               |  validation READ = bytes 0..16
///        16 +--------------------------------------+
///           | key         u64                       |
///        24 +------------------+---------+---------+
///           | table_id u32     | vlen u16| flags   |
///        32 +------------------+---------+---------+
///           | value[vlen] ... padded to 8 bytes     |
///           +--------------------------------------+
/// ```
///
/// The lock word is stored as a raw little-endian `u64` holding the PILL encoding
/// (`crate::pill`): 0 is free, a locked word names its owner (Pandora's code CASes the
/// coordinator id + 1 into it). This module does not interpret it beyond "zero is free".
///
/// Deviation from FORD's `DataItem`: FORD orders the fields table id, value size, key, remote
/// offset, version, lock, value, valid, user-insert. dmem puts lock and version first so that
/// validation reads 16 bytes and the CAS target is at offset 0, moves the flags in front of
/// the value so that items of every value size share one header, and drops the remote
/// offset (the coordinator knows the address it read from).
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct DataItemHeader {
    lock: U64,
    version: DataVersion,
    key: U64,
    table_id: U32,
    value_len: U16,
    flags: ItemFlags,
}

assert_eq_size!(DataItemHeader, [u8; 32]);
assert_eq_align!(DataItemHeader, u8);
const_assert_eq!(DataItemHeader::LOCK_OFFSET % 8, 0);
const_assert_eq!(DataItemHeader::LEN % 8, 0);

impl DataItemHeader {
    /// Bytes of the header; the value starts here.
    pub const LEN: usize = core::mem::size_of::<Self>();
    /// Offset of the lock word (the CAS target).
    pub const LOCK_OFFSET: usize = 0;
    /// Offset of the version word.
    pub const VERSION_OFFSET: usize = 8;
    /// Bytes a validation READ fetches: lock + version.
    pub const VALIDATION_LEN: usize = 16;
    /// Largest value a data item holds.
    pub const MAX_VALUE_LEN: usize = u16::MAX as usize;

    /// Bytes one item with a `value_len`-byte value occupies (header + value, padded to 8):
    /// the length of the single READ that returns lock + version + value.
    pub const fn item_len(value_len: usize) -> usize {
        pad8(Self::LEN + value_len)
    }

    /// A header for an unlocked item.
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
            key: U64::new(key),
            table_id: U32::new(table_id),
            value_len: U16::new(value_len),
            flags,
        }
    }

    /// The raw lock word (PILL encoding; 0 = free).
    pub const fn lock_word(&self) -> u64 {
        self.lock.get()
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

// ---------------------------------------------------------------------------------------
// OOCC record
// ---------------------------------------------------------------------------------------

/// State of an OOCC record's lock word (OOCC §IV "delayed write lock", Alg. 1).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum OoccLockState {
    /// Unlocked: readers take the implicit read lease.
    Free,
    /// Intention-locked by a read-write transaction (Alg. 1 line 8): other read-write
    /// transactions abort, read-only transactions may read but must validate (line 13).
    Intention,
    /// Write-locked (upgraded by an RDMA WRITE in Validate&Logging, line 19): every
    /// transaction that reads it aborts.
    Write,
}

/// The OOCC lock word: version, intention and write lock, owner, in one 8-byte word at the
/// highest address of an [`OoccRecord`].
///
/// ```text
///  63              48  47  46  45                                   0
/// +------------------+---+---+--------------------------------------+
/// |   owner (16)     | W | I |            version (46)              |
/// +------------------+---+---+--------------------------------------+
/// ```
///
/// OOCC §IV splits the write lock into an intention lock (set by CAS in Execution&Locking)
/// and a write lock that later "upgrades" it with an RDMA WRITE (§VI-A); §V puts the write
/// lock at the highest address so that the commit WRITE of value + lock releases it. dmem
/// keeps both locks, the owner and the version in this one word:
///
/// * the intention CAS compares against the whole free word, so it also checks that the
///   version is still the one read in execution;
/// * the upgrade is an 8-byte WRITE of the same word with `W` set (only the owner can write
///   it, because the intention lock excludes other writers);
/// * the commit WRITE of value + this word (version + 1, both bits clear) installs the value,
///   bumps the version and releases both locks in one operation;
/// * validation (Alg. 1 line 14) READs just these 8 bytes.
///
/// Valid states: `I=0 W=0` free (owner must be 0), `I=1 W=0` intention, `I=1 W=1` write.
/// `I=0 W=1` and a free word with an owner are undefined, and [`OoccLockWord::state`]
/// refuses them. The owner is the 16-bit coordinator id (as in Pandora §3.1.2), so a
/// recovering coordinator can tell whose lock it sees; the paper does not say what its lock
/// holds. The 46-bit version wraps (validation is by equality).
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
pub struct OoccLockWord(U64);

assert_eq_size!(OoccLockWord, [u8; 8]);
assert_eq_align!(OoccLockWord, u8);

impl OoccLockWord {
    /// Bits of the version field.
    pub const VERSION_BITS: u32 = 46;
    /// Largest version.
    pub const MAX_VERSION: u64 = (1 << Self::VERSION_BITS) - 1;
    const INTENTION: u64 = 1 << 46;
    const WRITE: u64 = 1 << 47;
    const OWNER_SHIFT: u32 = 48;

    /// A free word with `version`; refuses a version wider than 46 bits.
    pub const fn free(version: u64) -> Result<Self, LayoutError> {
        if version > Self::MAX_VERSION {
            return Err(LayoutError::DoesNotFit {
                field: "version",
                value: version,
                max: Self::MAX_VERSION,
            });
        }
        Ok(Self(U64::new(version)))
    }

    /// Reinterprets a raw word (for example the value an RDMA CAS returned); call
    /// [`OoccLockWord::state`] to validate it.
    pub const fn from_raw(raw: u64) -> Self {
        Self(U64::new(raw))
    }

    /// The raw word.
    pub const fn to_raw(self) -> u64 {
        self.0.get()
    }

    /// The version.
    pub const fn version(self) -> u64 {
        self.to_raw() & Self::MAX_VERSION
    }

    /// The owner's coordinator id (0 when free).
    pub const fn owner(self) -> u16 {
        (self.to_raw() >> Self::OWNER_SHIFT) as u16
    }

    /// The lock state; refuses the undefined bit patterns.
    pub const fn state(self) -> Result<OoccLockState, LayoutError> {
        let raw = self.to_raw();
        match (raw & Self::INTENTION != 0, raw & Self::WRITE != 0) {
            (false, false) if self.owner() == 0 => Ok(OoccLockState::Free),
            (false, false) => Err(LayoutError::InvalidField { field: "owner" }),
            (true, false) => Ok(OoccLockState::Intention),
            (true, true) => Ok(OoccLockState::Write),
            (false, true) => Err(LayoutError::InvalidField {
                field: "lock state",
            }),
        }
    }

    /// The word an intention-lock CAS swaps in: same version, intention bit, `owner`.
    /// Use it with `self` (a free word read in execution) as the CAS compare value.
    pub const fn with_intention_lock(self, owner: u16) -> Self {
        Self(U64::new(
            self.version() | Self::INTENTION | ((owner as u64) << Self::OWNER_SHIFT),
        ))
    }

    /// The word the upgrade WRITE stores: the same word with the write bit set.
    pub const fn with_write_lock(self) -> Self {
        Self(U64::new(self.to_raw() | Self::INTENTION | Self::WRITE))
    }

    /// The word the commit WRITE stores: free, owner 0, version + 1 (wrapping at 46 bits).
    pub const fn released_next_version(self) -> Self {
        Self(U64::new((self.version() + 1) & Self::MAX_VERSION))
    }

    /// The word an abort stores: free, owner 0, same version.
    pub const fn released_same_version(self) -> Self {
        Self(U64::new(self.version()))
    }
}

impl fmt::Debug for OoccLockWord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OoccLockWord")
            .field("state", &self.state())
            .field("owner", &self.owner())
            .field("version", &self.version())
            .finish()
    }
}

/// The fixed 16-byte front of an OOCC record (OOCC §III-B, §V).
///
/// ```text
/// offset 0 +------------------------------------------+
///          | key u64                                  |
///        8 +-------------------+-----------+----------+
///          | table_id u32      | vlen u16  | flags u16|
///       16 +-------------------+-----------+----------+
///          | value[vlen] ... zero-padded to 8 bytes   |
///  16+pad8 +------------------------------------------+
///  (vlen)  | OoccLockWord (highest address)           |
///          +------------------------------------------+
/// ```
///
/// Data and lock are co-located so that one READ returns both (§III-B); the commit WRITE
/// covers [`OoccRecordHeader::commit_range`] = value + padding + lock word.
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct OoccRecordHeader {
    key: U64,
    table_id: U32,
    value_len: U16,
    flags: ItemFlags,
}

assert_eq_size!(OoccRecordHeader, [u8; 16]);
assert_eq_align!(OoccRecordHeader, u8);
const_assert_eq!(OoccRecordHeader::LEN % 8, 0);

impl OoccRecordHeader {
    /// Bytes of the header; the value starts here.
    pub const LEN: usize = core::mem::size_of::<Self>();
    /// Bytes of the lock word at the end of the record.
    pub const LOCK_LEN: usize = core::mem::size_of::<OoccLockWord>();

    /// Offset of the lock word in a record with a `value_len`-byte value (a multiple of 8).
    pub const fn lock_offset(value_len: usize) -> usize {
        Self::LEN + pad8(value_len)
    }

    /// Bytes of a whole record: the single READ that returns value and lock.
    pub const fn record_len(value_len: usize) -> usize {
        Self::lock_offset(value_len) + Self::LOCK_LEN
    }

    /// The bytes the one-op write-unlock WRITE covers (§V): value, padding, lock word.
    pub const fn commit_range(value_len: usize) -> Range<usize> {
        Self::LEN..Self::record_len(value_len)
    }

    /// A header for a live record.
    pub const fn new(key: u64, table_id: u32, value_len: u16, flags: ItemFlags) -> Self {
        Self {
            key: U64::new(key),
            table_id: U32::new(table_id),
            value_len: U16::new(value_len),
            flags,
        }
    }

    /// The key.
    pub const fn key(&self) -> u64 {
        self.key.get()
    }

    /// The table id.
    pub const fn table_id(&self) -> u32 {
        self.table_id.get()
    }

    /// Length of the value in bytes.
    pub const fn value_len(&self) -> usize {
        self.value_len.get() as usize
    }

    /// The flags word.
    pub const fn flags(&self) -> ItemFlags {
        self.flags
    }

    /// Sets the flags.
    pub fn set_flags(&mut self, flags: ItemFlags) {
        self.flags = flags;
    }
}

/// A view of one OOCC record over a byte buffer; see [`OoccRecordHeader`] for the layout.
///
/// Once [`OoccRecord::new_checked`] has accepted a buffer, no accessor panics.
///
/// Torn reads: the record is read in increasing address order like it is written, but a
/// READ and a concurrent commit WRITE may interleave cache line by cache line, so a record
/// that spans several cache lines can be observed with an old value and a new, free lock
/// word. OOCC's read lease argument does not cover that case; a protocol that needs to
/// detect it wraps the value in cacheline versions (`crate::cacheline`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OoccRecord<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> OoccRecord<T> {
    /// Wraps bytes this node wrote itself. Accessors panic on a buffer shorter than
    /// [`OoccRecordHeader::record_len`] of the declared value length.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps untrusted bytes: refuses a short buffer, undefined flag bits and an undefined
    /// lock word. Trailing bytes after the lock word are ignored.
    pub fn new_checked(buffer: T) -> Result<Self, LayoutError> {
        let record = Self::new_unchecked(buffer);
        record.check()?;
        Ok(record)
    }

    /// The checks [`OoccRecord::new_checked`] runs.
    pub fn check(&self) -> Result<(), LayoutError> {
        let buf = self.buffer.as_ref();
        need(OoccRecordHeader::LEN, buf.len())?;
        let header = self.header();
        if header.flags.has_undefined_bits() {
            return Err(LayoutError::InvalidField { field: "flags" });
        }
        need(OoccRecordHeader::record_len(header.value_len()), buf.len())?;
        self.lock_word().state().map(|_| ())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The fixed header.
    pub fn header(&self) -> &OoccRecordHeader {
        header_of(self.buffer.as_ref())
    }

    /// The value bytes.
    pub fn value(&self) -> &[u8] {
        let len = self.header().value_len();
        &self.buffer.as_ref()[OoccRecordHeader::LEN..OoccRecordHeader::LEN + len]
    }

    /// The lock word at the highest address.
    pub fn lock_word(&self) -> OoccLockWord {
        let at = OoccRecordHeader::lock_offset(self.header().value_len());
        *header_of::<OoccLockWord>(&self.buffer.as_ref()[at..])
    }

    /// The lock state. A checked view always has a defined state; an unchecked view whose
    /// word is undefined reads as [`OoccLockState::Write`], the state that makes every
    /// transaction back off.
    pub fn lock_state(&self) -> OoccLockState {
        self.lock_word().state().unwrap_or(OoccLockState::Write)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> OoccRecord<T> {
    /// Writes a record with `header`'s fields, `value` and `lock` into the front of
    /// `buffer`, zero-filling the padding. The header's value length is taken from `value`.
    /// Refuses a short buffer, a value longer than `u16::MAX` and an undefined lock word;
    /// `buffer` is unchanged on error.
    pub fn emit(
        mut buffer: T,
        header: OoccRecordHeader,
        value: &[u8],
        lock: OoccLockWord,
    ) -> Result<Self, LayoutError> {
        let value_len = u16::try_from(value.len()).map_err(|_| LayoutError::DoesNotFit {
            field: "value_len",
            value: value.len() as u64,
            max: u16::MAX.into(),
        })?;
        lock.state()?;
        let total = OoccRecordHeader::record_len(value.len());
        let buf = buffer.as_mut();
        need(total, buf.len())?;
        let mut header = header;
        header.value_len = U16::new(value_len);
        *header_of_mut::<OoccRecordHeader>(buf) = header;
        let end = OoccRecordHeader::LEN + value.len();
        buf[OoccRecordHeader::LEN..end].copy_from_slice(value);
        let lock_at = OoccRecordHeader::lock_offset(value.len());
        buf[end..lock_at].fill(0);
        *header_of_mut::<OoccLockWord>(&mut buf[lock_at..]) = lock;
        Ok(Self::new_unchecked(buffer))
    }

    /// The fixed header, mutable.
    pub fn header_mut(&mut self) -> &mut OoccRecordHeader {
        header_of_mut(self.buffer.as_mut())
    }

    /// The value bytes, mutable.
    pub fn value_mut(&mut self) -> &mut [u8] {
        let len = self.header().value_len();
        &mut self.buffer.as_mut()[OoccRecordHeader::LEN..OoccRecordHeader::LEN + len]
    }

    /// Stores `lock` as the lock word.
    pub fn set_lock_word(&mut self, lock: OoccLockWord) {
        let at = OoccRecordHeader::lock_offset(self.header().value_len());
        *header_of_mut::<OoccLockWord>(&mut self.buffer.as_mut()[at..]) = lock;
    }

    /// Prepares the one-op write-unlock (OOCC §V, Alg. 1 line 25) in this local image:
    /// stores `new_value` and a free lock word with the next version, and returns the byte
    /// range to send in one RDMA WRITE (value first, lock word last).
    ///
    /// Refuses (image unchanged) a `new_value` whose length differs from the record's and a
    /// record that is not write-locked.
    pub fn prepare_commit(&mut self, new_value: &[u8]) -> Result<Range<usize>, LayoutError> {
        let len = self.header().value_len();
        if new_value.len() != len {
            return Err(LayoutError::DoesNotFit {
                field: "value_len",
                value: new_value.len() as u64,
                max: len as u64,
            });
        }
        let lock = self.lock_word();
        if lock.state()? != OoccLockState::Write {
            return Err(LayoutError::InvalidField {
                field: "lock state",
            });
        }
        self.value_mut().copy_from_slice(new_value);
        self.set_lock_word(lock.released_next_version());
        Ok(OoccRecordHeader::commit_range(len))
    }
}

// ---------------------------------------------------------------------------------------
// MN hash-index bucket
// ---------------------------------------------------------------------------------------

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

/// A bucket of the MN hash index that a CN reads with one READ (FORD's hash buckets,
/// REFERENCE.md): a header and `SLOTS` key → record-address slots, sized to whole cache
/// lines.
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
    use quickcheck::TestResult;
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
        assert_eq!(DataItemHeader::item_len(value.len()), 72);
        let mut mn = [0u8; 72];
        let mut item = DataItem::emit(&mut mn[..], ford_header(0x59, 3), &value).unwrap();
        item.header_mut().set_lock_word(41 + 1);
        let read = DataItem::new_checked(&mn[..]).unwrap();
        assert_eq!(read.lock_word(), 42);
        assert_eq!(read.version().counter(), 3);
        assert_eq!(read.key(), 0x59);
        assert_eq!(read.value(), &value);
        assert!(!read.is_readable(), "a locked item is not readable");
        // Validation READs only the first 16 bytes and still sees lock and version.
        let v = DataItemHeader::VALIDATION_LEN;
        assert_eq!(&mn[..8], &42u64.to_le_bytes());
        assert_eq!(&mn[8..v], &3u64.to_le_bytes());
    }

    #[test]
    fn data_item_emit_refuses_short_buffer_unchanged() {
        let mut mn = [0xAAu8; 40];
        let err = DataItem::emit(&mut mn[..], ford_header(1, 1), &[1u8; 9]).unwrap_err();
        assert_eq!(
            err,
            LayoutError::TooShort {
                needed: 48,
                got: 40
            }
        );
        assert!(mn.iter().all(|&b| b == 0xAA));
    }

    #[test]
    fn data_item_checked_refusals() {
        let mut mn = [0u8; 40];
        DataItem::emit(&mut mn[..], ford_header(1, 1), &[9u8; 8]).unwrap();
        assert_eq!(
            DataItem::new_checked(&mn[..20]).unwrap_err(),
            LayoutError::TooShort {
                needed: 32,
                got: 20
            }
        );
        assert_eq!(
            DataItem::new_checked(&mn[..39]).unwrap_err(),
            LayoutError::TooShort {
                needed: 40,
                got: 39
            }
        );
        mn[31] = 0x80; // an undefined flag bit
        assert_eq!(
            DataItem::new_checked(&mn[..]).unwrap_err(),
            LayoutError::InvalidField { field: "flags" }
        );
    }

    #[test]
    fn ford_invisible_insert() {
        // An inserted, uncommitted item carries bit 63 of its version (REFERENCE.md, FORD).
        let v = DataVersion::new(5).unwrap().with_invisible(true);
        assert_eq!(v.to_raw(), (1 << 63) | 5);
        let mut mn = [0u8; 32];
        let header = DataItemHeader::new(1, 1, 0, v, ItemFlags::LOADED.with_user_insert(true));
        let item = DataItem::emit(&mut mn[..], header, &[]).unwrap();
        assert!(!item.is_readable());
        assert!(item.header().flags().is_user_insert());
        assert_eq!(DataVersion::from_raw(u64::MAX).bumped().to_raw(), 1 << 63);
    }

    #[test]
    fn occ_lock_word_lifecycle() {
        // OOCC Alg. 1: CAS free -> intention, WRITE upgrade to write lock, commit WRITE.
        let read = OoccLockWord::free(9).unwrap();
        assert_eq!(read.state(), Ok(OoccLockState::Free));
        let intention = read.with_intention_lock(3);
        assert_eq!(intention.state(), Ok(OoccLockState::Intention));
        assert_eq!((intention.owner(), intention.version()), (3, 9));
        let write = intention.with_write_lock();
        assert_eq!(write.state(), Ok(OoccLockState::Write));
        let released = write.released_next_version();
        assert_eq!(released, OoccLockWord::free(10).unwrap());
        assert_eq!(write.released_same_version(), read);
        assert_eq!(
            OoccLockWord::free(OoccLockWord::MAX_VERSION)
                .unwrap()
                .with_write_lock()
                .released_next_version()
                .version(),
            0
        );
        assert_eq!(
            OoccLockWord::from_raw(1 << 47).state(),
            Err(LayoutError::InvalidField {
                field: "lock state"
            })
        );
        assert_eq!(
            OoccLockWord::from_raw(1 << 48).state(),
            Err(LayoutError::InvalidField { field: "owner" })
        );
        assert!(OoccLockWord::free(1 << 46).is_err());
    }

    /// OOCC §V: the commit WRITE lands in increasing address order; at every prefix that
    /// has landed, a reader either sees the write lock or the whole new value. The WRITE
    /// lands in aligned 8-byte units here (finer than the cache line the sim uses); the
    /// lock word is 8-byte aligned, so it is never split (byte-wise landing would tear it).
    #[test]
    fn occ_write_unlock_every_prefix_is_locked_or_complete() {
        let old = [0x11u8; 13];
        let new = [0x22u8; 13];
        let len = OoccRecordHeader::record_len(13);
        assert_eq!(len, 16 + 16 + 8);
        let mut mn = [0u8; 40];
        let header = OoccRecordHeader::new(0xB, 1, 0, ItemFlags::LOADED);
        let locked = OoccLockWord::free(4)
            .unwrap()
            .with_intention_lock(1)
            .with_write_lock();
        OoccRecord::emit(&mut mn[..], header, &old, locked).unwrap();
        let mut local = mn;
        let range = OoccRecord::new_checked(&mut local[..])
            .unwrap()
            .prepare_commit(&new)
            .unwrap();
        assert_eq!(range, 16..40);
        assert_eq!(
            range.end, len,
            "the lock word is the last thing the WRITE lands"
        );
        for landed in (0..=range.len()).step_by(8) {
            let mut remote = mn;
            remote[range.start..range.start + landed]
                .copy_from_slice(&local[range.start..range.start + landed]);
            let seen = OoccRecord::new_checked(&remote[..]).unwrap();
            match seen.lock_state() {
                OoccLockState::Write => assert!(landed < range.len()),
                OoccLockState::Free => {
                    assert_eq!(landed, range.len());
                    assert_eq!(seen.value(), &new);
                    assert_eq!(seen.lock_word().version(), 5);
                }
                OoccLockState::Intention => panic!("intention state never appears during commit"),
            }
        }
    }

    #[test]
    fn occ_prepare_commit_refusals() {
        let mut mn = [0u8; 40];
        let header = OoccRecordHeader::new(1, 1, 0, ItemFlags::LOADED);
        let intention = OoccLockWord::free(1).unwrap().with_intention_lock(2);
        let mut rec = OoccRecord::emit(&mut mn[..], header, &[1u8; 13], intention).unwrap();
        assert_eq!(
            rec.prepare_commit(&[2u8; 13]),
            Err(LayoutError::InvalidField {
                field: "lock state"
            })
        );
        assert!(rec.prepare_commit(&[2u8; 12]).is_err());
        assert_eq!(rec.value(), &[1u8; 13]);
        assert_eq!(
            OoccRecord::emit(
                &mut [0u8; 40][..],
                header,
                &[0u8; 13],
                OoccLockWord::from_raw(1 << 47)
            )
            .unwrap_err(),
            LayoutError::InvalidField {
                field: "lock state"
            }
        );
    }

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
    fn qc_occ_lock_word_round_trip(version: u64, owner: u16) -> bool {
        let version = version & OoccLockWord::MAX_VERSION;
        let free = OoccLockWord::free(version).unwrap();
        let i = free.with_intention_lock(owner);
        let w = i.with_write_lock();
        free.version() == version
            && (i.owner(), i.version()) == (owner, version)
            && (w.owner(), w.version()) == (owner, version)
            && i.state() == Ok(OoccLockState::Intention)
            && w.state() == Ok(OoccLockState::Write)
            && OoccLockWord::from_raw(w.to_raw()) == w
    }

    #[quickcheck]
    fn qc_data_item_round_trip(
        key: u64,
        table: u32,
        counter: u64,
        lock: u64,
        value: Vec<u8>,
    ) -> bool {
        let version = DataVersion::new(counter & DataVersion::MAX_COUNTER).unwrap();
        let header = DataItemHeader::new(key, table, 0, version, ItemFlags::LOADED);
        let mut buf = vec![0u8; DataItemHeader::item_len(value.len())];
        let mut item = DataItem::emit(&mut buf[..], header, &value).unwrap();
        item.header_mut().set_lock_word(lock);
        let read = DataItem::new_checked(&buf[..]).unwrap();
        read.key() == key
            && read.header().table_id() == table
            && read.version() == version
            && read.lock_word() == lock
            && read.value() == &value[..]
    }

    #[quickcheck]
    fn qc_occ_record_round_trip(
        key: u64,
        table: u32,
        version: u64,
        owner: u16,
        value: Vec<u8>,
    ) -> bool {
        let lock = OoccLockWord::free(version & OoccLockWord::MAX_VERSION)
            .unwrap()
            .with_intention_lock(owner);
        let header = OoccRecordHeader::new(key, table, 0, ItemFlags::LOADED);
        let mut buf = vec![0u8; OoccRecordHeader::record_len(value.len())];
        OoccRecord::emit(&mut buf[..], header, &value, lock).unwrap();
        let read = OoccRecord::new_checked(&buf[..]).unwrap();
        read.header().key() == key
            && read.header().table_id() == table
            && read.value() == &value[..]
            && read.lock_word() == lock
    }

    #[quickcheck]
    fn qc_any_bytes_parse_or_error(bytes: Vec<u8>) -> TestResult {
        // Checked constructors never panic, and accepted views never panic either.
        if let Ok(item) = DataItem::new_checked(&bytes[..]) {
            let _ = (item.value().len(), item.is_readable(), item.version());
        }
        if let Ok(rec) = OoccRecord::new_checked(&bytes[..]) {
            let _ = (rec.value().len(), rec.lock_state());
        }
        let _ = lookup_in_bucket::<3>(&bytes, 0);
        TestResult::passed()
    }
}

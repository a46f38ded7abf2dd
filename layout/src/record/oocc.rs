//! The OOCC record: lock word at the highest address, header and view (OOCC §IV–§V).

use core::fmt;
use core::ops::Range;

use static_assertions::{assert_eq_align, assert_eq_size, const_assert_eq};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{ItemFlags, header_of, header_of_mut, need, pad8};
use crate::LayoutError;

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

/// The fixed 24-byte front of an OOCC record (OOCC §III-B, §V).
///
/// ```text
/// offset 0 +------------------------------------------+
///          | key u64                                  |
///        8 +-------------------+-----------+----------+
///          | table_id u32      | vlen u16  | flags u16|
///       16 +-------------------+-----------+----------+
///          | writer u64 (installer of this value)     |
///       24 +------------------------------------------+
///          | value[vlen] ... zero-padded to 8 bytes   |
///  24+pad8 +------------------------------------------+
///  (vlen)  | OoccLockWord (highest address)           |
///          +------------------------------------------+
/// ```
///
/// Data and lock are co-located so that one READ returns both (§III-B); the commit WRITE
/// covers [`OoccRecordHeader::commit_range`] = writer + value + padding + lock word.
///
/// The writer word is dmem's addition (the paper's record has none): the transaction that
/// installed the value, in [`DataItemHeader::pack_writer`](super::DataItemHeader::pack_writer)'s
/// encoding, 0 for a loaded record. The commit WRITE carries it with the value, so a reader
/// learns who wrote what it read from memory itself, not from what the writer's protocol
/// reported (the history checker attributes each read to exactly that transaction). It costs
/// 8 bytes per record and per commit WRITE, no verb.
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct OoccRecordHeader {
    key: U64,
    table_id: U32,
    value_len: U16,
    flags: ItemFlags,
    writer: U64,
}

assert_eq_size!(OoccRecordHeader, [u8; 24]);
assert_eq_align!(OoccRecordHeader, u8);
const_assert_eq!(OoccRecordHeader::LEN % 8, 0);

impl OoccRecordHeader {
    /// Bytes of the header; the value starts here.
    pub const LEN: usize = core::mem::size_of::<Self>();
    /// Offset of the writer word: where the commit WRITE starts.
    pub const WRITER_OFFSET: usize = 16;
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

    /// The bytes the one-op write-unlock WRITE covers (§V): writer, value, padding, lock
    /// word.
    pub const fn commit_range(value_len: usize) -> Range<usize> {
        Self::WRITER_OFFSET..Self::record_len(value_len)
    }

    /// A header for a live record.
    pub const fn new(key: u64, table_id: u32, value_len: u16, flags: ItemFlags) -> Self {
        Self {
            key: U64::new(key),
            table_id: U32::new(table_id),
            value_len: U16::new(value_len),
            flags,
            writer: U64::new(0),
        }
    }

    /// The installer of the value (0: loaded, no transaction).
    pub const fn writer(&self) -> u64 {
        self.writer.get()
    }

    /// Sets the installer of the value.
    pub fn set_writer(&mut self, writer: u64) {
        self.writer = U64::new(writer);
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
    /// stores `writer` (the committing transaction), `new_value` and a free lock word with
    /// the next version, and returns the byte range to send in one RDMA WRITE (writer and
    /// value first, lock word last).
    ///
    /// Refuses (image unchanged) a `new_value` whose length differs from the record's and a
    /// record that is not write-locked.
    pub fn prepare_commit(
        &mut self,
        new_value: &[u8],
        writer: u64,
    ) -> Result<Range<usize>, LayoutError> {
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
        self.header_mut().set_writer(writer);
        self.value_mut().copy_from_slice(new_value);
        self.set_lock_word(lock.released_next_version());
        Ok(OoccRecordHeader::commit_range(len))
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck_macros::quickcheck;

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
        assert_eq!(len, 24 + 16 + 8);
        let mut mn = [0u8; 48];
        let header = OoccRecordHeader::new(0xB, 1, 0, ItemFlags::LOADED);
        let locked = OoccLockWord::free(4)
            .unwrap()
            .with_intention_lock(1)
            .with_write_lock();
        OoccRecord::emit(&mut mn[..], header, &old, locked).unwrap();
        let mut local = mn;
        let range = OoccRecord::new_checked(&mut local[..])
            .unwrap()
            .prepare_commit(&new, 0x0001_0000_0000_0007)
            .unwrap();
        assert_eq!(range, 16..48);
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
                    assert_eq!(seen.header().writer(), 0x0001_0000_0000_0007);
                }
                OoccLockState::Intention => panic!("intention state never appears during commit"),
            }
        }
    }

    #[test]
    fn occ_prepare_commit_refusals() {
        let mut mn = [0u8; 48];
        let header = OoccRecordHeader::new(1, 1, 0, ItemFlags::LOADED);
        let intention = OoccLockWord::free(1).unwrap().with_intention_lock(2);
        let mut rec = OoccRecord::emit(&mut mn[..], header, &[1u8; 13], intention).unwrap();
        assert_eq!(
            rec.prepare_commit(&[2u8; 13], 9),
            Err(LayoutError::InvalidField {
                field: "lock state"
            })
        );
        assert!(rec.prepare_commit(&[2u8; 12], 9).is_err());
        assert_eq!(rec.value(), &[1u8; 13]);
        assert_eq!(rec.header().writer(), 0, "a refused commit changes nothing");
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
}

//! Per-coordinator log regions and their records: FORD/Pandora undo records, OOCC redo
//! records and LOTUS commit records.
//!
//! Pandora gives every coordinator an exclusive log region on f + 1 memory nodes (32 KB per
//! coordinator, §3.1.4, §3.2.2) and writes the whole write-set's log with **one RDMA WRITE**
//! after validation (§3.1.4 "Logging phase"). Recovery READs the region, rebuilds the
//! write-set from it (§3.2.2 step 3) and truncates it by clearing the valid bit in its
//! header with a one-byte WRITE (§3.2.3). OOCC stores redo logs instead (§V), and LOTUS a
//! small commit log of new record addresses (§5.1 step 1, §6). All three share this frame:
//!
//! ```text
//! region: | LogRegionHeader (32 B) | record 0 | record 1 | ... |  (unused rest of region)
//!                                  <------------ body_len ----->
//! record: | fixed header (kind-specific) | payload (payload_len) | zero padding to 8 |
//! ```
//!
//! * [`LogRegionHeader`]: epoch, transaction id, body length, coordinator id, record
//!   count, a CRC-32C of header and body, magic, format and (last) the valid bit.
//! * [`UndoRecordHeader`] + old value (FORD/Pandora), [`RedoRecordHeader`] + new value
//!   (OOCC), [`CommitRecordHeader`] + [`CommitLogEntry`] array (LOTUS).
//! * [`LogWriter`] appends records into a caller buffer, refusing (buffer and log
//!   unchanged) whatever does not fit; [`LogRegion`] checks a region and iterates its records
//!   without copying.
//!
//! ```
//! use dmem_layout::log::{DataLogEntry, LogOp, LogRecord, LogRegion, LogWriter};
//! use dmem_layout::record::RemoteAddr;
//!
//! let mut region = [0u8; 128];
//! let mut writer = LogWriter::new(&mut region, 7, 1, 1000)?; // coordinator 7, epoch 1, txn 1000
//! let y = DataLogEntry { op: LogOp::Update, table_id: 1, key: 89, addr: RemoteAddr::new(2, 0x100)?, version: 4 };
//! writer.append_undo(&y, b"old Y")?;
//! let image = writer.finish(); // the bytes of the one log WRITE
//!
//! let log = LogRegion::new_checked(image)?;
//! assert!(log.is_valid());
//! let Some(LogRecord::Undo(undo)) = log.records().next() else { unreachable!() };
//! assert_eq!((undo.header.old_version(), undo.old_value), (4, &b"old Y"[..]));
//! # Ok::<(), dmem_layout::LayoutError>(())
//! ```
//!
//! # Why a checksum, and why the valid bit is the last header byte
//!
//! The coordinator writes header and records in one WRITE, and a WRITE lands in increasing
//! address order, so the header lands **first**. A coordinator that crashes mid-WRITE (the
//! sim lands a prefix of it; a crashing shm process may stop after any byte) leaves a header
//! that promises records which never arrived, followed by the stale records of an earlier
//! transaction, which parse perfectly. The header therefore carries a CRC-32C over its own
//! fields and the body, which tells recovery that this log is not "fully written" (LOTUS §6)
//! and its transaction is a NotLogged-Stray-Tx (Pandora §3.2.1).
//!
//! The CRC cannot cover the valid bit, because truncation flips that bit alone with a
//! one-byte WRITE (Pandora §3.2.3). So the state byte is the **last** byte of the header:
//! any landed prefix that sets the new valid bit has also landed every field the CRC covers
//! and the CRC itself, and a truncated old log cannot be resurrected by a new WRITE that
//! stops after the state byte (it would be, if the state byte came first). A prefix that
//! stops before the state byte leaves the old state byte over a half-new header, which the
//! CRC refuses. The papers do not say how they detect a torn log; this is dmem's choice.
//!
//! # Contract
//!
//! [`LogRegion::new_checked`] validates the header, the checksum and **every record**, and
//! returns a [`LayoutError`] on any malformed byte; it never panics. Once it has accepted a
//! region, no accessor panics and [`LogRegion::records`] yields exactly `record_count`
//! records. On a region made with [`LogRegion::new_unchecked`] iteration stops silently at
//! the first malformed record instead.

use static_assertions::{assert_eq_align, assert_eq_size, const_assert_eq};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, TryFromBytes, Unaligned};

use crate::LayoutError;
use crate::record::{RemoteAddr, header_of, header_of_mut, need, pad8};

// ---------------------------------------------------------------------------------------
// CRC-32C
// ---------------------------------------------------------------------------------------

const CRC32C_POLY_REFLECTED: u32 = 0x82F6_3B78;

const CRC32C_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ CRC32C_POLY_REFLECTED
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// Feeds `bytes` into a running (pre-inverted) CRC-32C state.
fn crc32c_update(mut state: u32, bytes: &[u8]) -> u32 {
    for &b in bytes {
        state = CRC32C_TABLE[((state ^ u32::from(b)) & 0xFF) as usize] ^ (state >> 8);
    }
    state
}

/// CRC-32C (Castagnoli) of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    !crc32c_update(!0, bytes)
}

/// The checksum a [`LogRegionHeader`] carries: CRC-32C of the header without its
/// `body_crc` and `state` fields, followed by the body.
fn region_crc(header: &LogRegionHeader, body: &[u8]) -> u32 {
    let bytes = header.as_bytes();
    let state = crc32c_update(!0, &bytes[..LogRegionHeader::CRC_OFFSET]);
    let state = crc32c_update(
        state,
        &bytes[LogRegionHeader::CRC_OFFSET + 4..LogRegionHeader::STATE_OFFSET],
    );
    !crc32c_update(state, body)
}

// ---------------------------------------------------------------------------------------
// Region header
// ---------------------------------------------------------------------------------------

crate::bits::one_bit_flag_byte! {
    /// The state byte of a [`LogRegionHeader`]: bit 0 is the valid bit, the other bits are
    /// undefined and must be zero.
    ///
    /// Valid means the region holds the log of a transaction that may still need recovery.
    /// Recovery truncates the log by writing [`LogState::TRUNCATED`] at
    /// [`LogRegionHeader::STATE_OFFSET`] (Pandora §3.2.3), and so does an aborting coordinator
    /// ("logs the decision by truncating logs", Pandora §3.1.5).
    pub struct LogState;
    field = "state";
    flag = "valid";
    /// A truncated (invalid) log.
    clear = TRUNCATED;
    /// A valid log.
    set = VALID_LOG;
    /// Whether the valid bit is set.
    get = is_valid;
    /// The same state with the valid bit set or cleared.
    with = with_valid;
}

/// The 32-byte header at the start of a coordinator's log region (Pandora §3.1.3–§3.2.3).
///
/// ```text
///  0 | epoch u64                                                            |
///  8 | txn_id u64                                                           |
/// 16 | body_len u32                 | coordinator_id u16 | record_count u16 |
/// 24 | body_crc u32                 | magic u16 "DL"     | format u8 | state|
/// ```
///
/// `body_crc` is the CRC-32C of bytes 0..24 and 28..31 of the header followed by the body;
/// `state` holds the valid bit and is deliberately the last byte (see the module docs).
/// `coordinator_id` is Pandora's 16-bit id (§3.1.2); `epoch` is the configuration epoch
/// the coordinator ran in (the failure detector's, or Dandelion's epoch id, §4.4), so that
/// recovery can ignore a log left over from an earlier incarnation; `txn_id` names the
/// transaction the records belong to. The record count is 16 bits: a 32 KB region holds at
/// most 1024 records of the smallest kind.
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct LogRegionHeader {
    epoch: U64,
    txn_id: U64,
    body_len: U32,
    coordinator_id: U16,
    record_count: U16,
    body_crc: U32,
    magic: U16,
    format: u8,
    state: LogState,
}

assert_eq_size!(LogRegionHeader, [u8; 32]);
assert_eq_align!(LogRegionHeader, u8);
const_assert_eq!(
    core::mem::offset_of!(LogRegionHeader, state),
    LogRegionHeader::STATE_OFFSET
);
const_assert_eq!(
    core::mem::offset_of!(LogRegionHeader, body_crc),
    LogRegionHeader::CRC_OFFSET
);
const_assert_eq!(LogRegionHeader::STATE_OFFSET, LogRegionHeader::LEN - 1);

impl LogRegionHeader {
    /// Bytes of the header; the body starts here.
    pub const LEN: usize = core::mem::size_of::<Self>();
    /// The magic number, the bytes `"DL"` in memory order.
    pub const MAGIC: u16 = u16::from_le_bytes(*b"DL");
    /// The format version this module reads and writes.
    pub const FORMAT: u8 = 1;
    /// Offset of the state byte (the last header byte): the target of the one-byte
    /// truncation WRITE.
    pub const STATE_OFFSET: usize = 31;
    /// Offset of the `body_crc` field.
    pub const CRC_OFFSET: usize = 24;

    /// The state byte (may carry undefined bits if it was not checked).
    pub const fn state(&self) -> LogState {
        self.state
    }

    /// Whether the log is valid (not truncated).
    pub const fn is_valid(&self) -> bool {
        self.state.is_valid()
    }

    /// The coordinator that owns the region.
    pub const fn coordinator_id(&self) -> u16 {
        self.coordinator_id.get()
    }

    /// Number of records in the body.
    pub const fn record_count(&self) -> u16 {
        self.record_count.get()
    }

    /// The epoch the log was written in.
    pub const fn epoch(&self) -> u64 {
        self.epoch.get()
    }

    /// The transaction the records belong to.
    pub const fn txn_id(&self) -> u64 {
        self.txn_id.get()
    }

    /// Bytes of the body.
    pub const fn body_len(&self) -> usize {
        self.body_len.get() as usize
    }

    /// The checksum of header fields and body.
    pub const fn body_crc(&self) -> u32 {
        self.body_crc.get()
    }

    /// Sets or clears the valid bit.
    pub fn set_valid(&mut self, valid: bool) {
        self.state = self.state.with_valid(valid);
    }
}

// ---------------------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------------------

/// What a log record is. The first byte of every record.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Debug,
    TryFromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(u8)]
pub enum LogRecordKind {
    /// FORD/Pandora undo record: old version and old value of one object.
    Undo = 1,
    /// OOCC redo record: new version and new value of one object.
    Redo = 2,
    /// LOTUS commit record: the new record addresses of one transaction.
    Commit = 3,
}

/// The operation a data record logs. The second byte of every record; a commit record
/// always carries [`LogOp::Update`] (each of its entries installs a new version).
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Debug,
    TryFromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(u8)]
pub enum LogOp {
    /// An in-place update of an existing object.
    Update = 0,
    /// An insert (roll-back deletes the object; Pandora §5.1 "missing insert logs").
    Insert = 1,
    /// A delete (roll-back revalidates the object).
    Delete = 2,
}

/// The first 4 bytes of every log record: kind, operation, payload length.
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, TryFromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct LogRecordPrefix {
    kind: LogRecordKind,
    op: LogOp,
    payload_len: U16,
}

assert_eq_size!(LogRecordPrefix, [u8; 4]);
assert_eq_align!(LogRecordPrefix, u8);

impl LogRecordPrefix {
    /// The record kind.
    pub const fn kind(&self) -> LogRecordKind {
        self.kind
    }

    /// The logged operation.
    pub const fn op(&self) -> LogOp {
        self.op
    }

    /// Bytes of payload after the fixed header (padding excluded).
    pub const fn payload_len(&self) -> usize {
        self.payload_len.get() as usize
    }
}

/// The fields of one undo or redo record, as a coordinator hands them to [`LogWriter`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DataLogEntry {
    /// The logged operation.
    pub op: LogOp,
    /// Table of the object.
    pub table_id: u32,
    /// Key of the object.
    pub key: u64,
    /// Address of the object's primary copy.
    pub addr: RemoteAddr,
    /// Old version (undo) or new version (redo), as the record stores it.
    pub version: u64,
}

/// Fixed header of a FORD/Pandora undo record; the object's old value follows.
///
/// ```text
///  0 | prefix (kind = Undo, op, payload_len = old value length) | table_id u32 |
///  8 | key u64                                                                |
/// 16 | addr RemoteAddr (primary copy)                                         |
/// 24 | old_version u64                                                        |
/// 32 | old value ... | zero padding to 8                                      |
/// ```
///
/// Recovery READs the object's version on every replica and compares it with
/// `old_version` to learn whether the stray transaction updated it, and writes the old
/// value back to roll it back (Pandora §3.2.2 step 3). The address is dmem's addition:
/// the papers' logs name the object, and recovery needs its location.
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, TryFromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct UndoRecordHeader {
    prefix: LogRecordPrefix,
    table_id: U32,
    key: U64,
    addr: RemoteAddr,
    old_version: U64,
}

assert_eq_size!(UndoRecordHeader, [u8; 32]);
assert_eq_align!(UndoRecordHeader, u8);

/// Fixed header of an OOCC redo record; the object's new value follows.
///
/// Same shape as [`UndoRecordHeader`] with the **new** version: OOCC replays a transaction
/// whose redo logs were stored (§V) by writing each new value and version.
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, TryFromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct RedoRecordHeader {
    prefix: LogRecordPrefix,
    table_id: U32,
    key: U64,
    addr: RemoteAddr,
    new_version: U64,
}

assert_eq_size!(RedoRecordHeader, [u8; 32]);
assert_eq_align!(RedoRecordHeader, u8);

macro_rules! data_record_accessors {
    ($ty:ty, $version:ident, $doc:literal) => {
        impl $ty {
            /// Bytes of the fixed header.
            pub const LEN: usize = core::mem::size_of::<Self>();

            /// The common prefix.
            pub const fn prefix(&self) -> &LogRecordPrefix {
                &self.prefix
            }

            /// The logged operation.
            pub const fn op(&self) -> LogOp {
                self.prefix.op
            }

            /// Table of the object.
            pub const fn table_id(&self) -> u32 {
                self.table_id.get()
            }

            /// Key of the object.
            pub const fn key(&self) -> u64 {
                self.key.get()
            }

            /// Address of the object's primary copy.
            pub const fn addr(&self) -> RemoteAddr {
                self.addr
            }

            #[doc = $doc]
            pub const fn $version(&self) -> u64 {
                self.$version.get()
            }

            /// The fields as a [`DataLogEntry`].
            pub const fn entry(&self) -> DataLogEntry {
                DataLogEntry {
                    op: self.prefix.op,
                    table_id: self.table_id.get(),
                    key: self.key.get(),
                    addr: self.addr,
                    version: self.$version.get(),
                }
            }
        }
    };
}

data_record_accessors!(
    UndoRecordHeader,
    old_version,
    "The version before the transaction."
);
data_record_accessors!(
    RedoRecordHeader,
    new_version,
    "The version the transaction installs."
);

/// Fixed header of a LOTUS commit record; `entry_count` [`CommitLogEntry`]s follow.
///
/// ```text
/// 0 | prefix (kind = Commit, op = Update, payload_len = 32 * entry_count) | entry_count u32 |
/// 8 | start_ts u64                                                                         |
/// ```
///
/// LOTUS writes it in commit step 1, before the commit timestamp exists, so it carries the
/// start timestamp (§5.1); recovery continues the commit of a transaction whose log is
/// complete and whose new CVT cells already carry a commit timestamp, and aborts the rest
/// (§6).
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, TryFromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct CommitRecordHeader {
    prefix: LogRecordPrefix,
    entry_count: U32,
    start_ts: U64,
}

assert_eq_size!(CommitRecordHeader, [u8; 16]);
assert_eq_align!(CommitRecordHeader, u8);

impl CommitRecordHeader {
    /// Bytes of the fixed header.
    pub const LEN: usize = core::mem::size_of::<Self>();

    /// Number of entries.
    pub const fn entry_count(&self) -> usize {
        self.entry_count.get() as usize
    }

    /// The transaction's start timestamp.
    pub const fn start_ts(&self) -> u64 {
        self.start_ts.get()
    }
}

/// One new version in a LOTUS commit record (§5.1 "new data addresses", §7.1 Fig. 11).
///
/// ```text
///  0 | table_id u32 | cell u16 | record_len u16 |
///  8 | key u64                                   |
/// 16 | cvt_addr RemoteAddr                       |
/// 24 | record_addr RemoteAddr                    |
/// ```
///
/// `cvt_addr` and `cell` locate the CVT cell whose version recovery inspects ("assigned a
/// commit timestamp"); `record_addr` and `record_len` locate the new full record.
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
pub struct CommitLogEntry {
    table_id: U32,
    cell: U16,
    record_len: U16,
    key: U64,
    cvt_addr: RemoteAddr,
    record_addr: RemoteAddr,
}

assert_eq_size!(CommitLogEntry, [u8; 32]);
assert_eq_align!(CommitLogEntry, u8);

impl CommitLogEntry {
    /// Bytes of one entry.
    pub const LEN: usize = core::mem::size_of::<Self>();

    /// An entry.
    pub const fn new(
        table_id: u32,
        key: u64,
        cvt_addr: RemoteAddr,
        cell: u16,
        record_addr: RemoteAddr,
        record_len: u16,
    ) -> Self {
        Self {
            table_id: U32::new(table_id),
            cell: U16::new(cell),
            record_len: U16::new(record_len),
            key: U64::new(key),
            cvt_addr,
            record_addr,
        }
    }

    /// Table of the record.
    pub const fn table_id(&self) -> u32 {
        self.table_id.get()
    }

    /// Key of the record.
    pub const fn key(&self) -> u64 {
        self.key.get()
    }

    /// Address of the record's CVT.
    pub const fn cvt_addr(&self) -> RemoteAddr {
        self.cvt_addr
    }

    /// Index of the CVT cell written for the new version.
    pub const fn cell(&self) -> u16 {
        self.cell.get()
    }

    /// Address of the new full record.
    pub const fn record_addr(&self) -> RemoteAddr {
        self.record_addr
    }

    /// Length of the new record.
    pub const fn record_len(&self) -> u16 {
        self.record_len.get()
    }
}

/// An undo record borrowed from a log region.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UndoRecord<'a> {
    /// The fixed header.
    pub header: &'a UndoRecordHeader,
    /// The old value.
    pub old_value: &'a [u8],
}

/// A redo record borrowed from a log region.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RedoRecord<'a> {
    /// The fixed header.
    pub header: &'a RedoRecordHeader,
    /// The new value.
    pub new_value: &'a [u8],
}

/// A commit record borrowed from a log region.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CommitRecord<'a> {
    /// The fixed header.
    pub header: &'a CommitRecordHeader,
    /// The new versions.
    pub entries: &'a [CommitLogEntry],
}

/// One record of a log region, borrowed (nothing is copied).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LogRecord<'a> {
    /// FORD/Pandora undo record.
    Undo(UndoRecord<'a>),
    /// OOCC redo record.
    Redo(RedoRecord<'a>),
    /// LOTUS commit record.
    Commit(CommitRecord<'a>),
}

impl LogRecord<'_> {
    /// The record kind.
    pub const fn kind(&self) -> LogRecordKind {
        match self {
            LogRecord::Undo(_) => LogRecordKind::Undo,
            LogRecord::Redo(_) => LogRecordKind::Redo,
            LogRecord::Commit(_) => LogRecordKind::Commit,
        }
    }
}

/// Maps a failed `try_ref_from_prefix` of a record header: the length was checked before,
/// so a failure means an undefined `op` byte (the kind byte was matched already).
fn header_error<E>(_: E) -> LayoutError {
    LayoutError::InvalidField { field: "op" }
}

/// Parses the record at the front of `body`; returns it and the bytes it occupies
/// (header + payload + padding).
fn parse_record(body: &[u8]) -> Result<(LogRecord<'_>, usize), LayoutError> {
    need(core::mem::size_of::<LogRecordPrefix>(), body.len())?;
    let (header_len, payload_len) = match body[0] {
        1 | 2 => (
            UndoRecordHeader::LEN,
            usize::from(u16::from_le_bytes([body[2], body[3]])),
        ),
        3 => (
            CommitRecordHeader::LEN,
            usize::from(u16::from_le_bytes([body[2], body[3]])),
        ),
        _ => return Err(LayoutError::InvalidField { field: "kind" }),
    };
    let end = header_len + payload_len;
    let stride = pad8(end);
    need(stride, body.len())?;
    if body[end..stride].iter().any(|&b| b != 0) {
        return Err(LayoutError::InvalidField { field: "padding" });
    }
    let payload = &body[header_len..end];
    let record = match body[0] {
        1 => {
            let (header, _) = UndoRecordHeader::try_ref_from_prefix(body).map_err(header_error)?;
            LogRecord::Undo(UndoRecord {
                header,
                old_value: payload,
            })
        }
        2 => {
            let (header, _) = RedoRecordHeader::try_ref_from_prefix(body).map_err(header_error)?;
            LogRecord::Redo(RedoRecord {
                header,
                new_value: payload,
            })
        }
        _ => {
            let (header, _) =
                CommitRecordHeader::try_ref_from_prefix(body).map_err(header_error)?;
            if header.prefix.op != LogOp::Update {
                return Err(LayoutError::InvalidField { field: "op" });
            }
            if header.entry_count().checked_mul(CommitLogEntry::LEN) != Some(payload_len) {
                return Err(LayoutError::InvalidField {
                    field: "entry_count",
                });
            }
            let entries = <[CommitLogEntry]>::ref_from_bytes(payload).map_err(|_| {
                LayoutError::InvalidField {
                    field: "entry_count",
                }
            })?;
            LogRecord::Commit(CommitRecord { header, entries })
        }
    };
    Ok((record, stride))
}

// ---------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------

/// A view of a coordinator's log region over a byte buffer (typically the bytes of the
/// recovery coordinator's READ of the whole region). Bytes after the body are ignored.
///
/// Once [`LogRegion::new_checked`] has accepted the buffer, no accessor panics.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LogRegion<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> LogRegion<T> {
    /// Wraps bytes this node wrote itself. Accessors panic on a buffer shorter than the
    /// header plus the body length it declares; iteration stops at a malformed record.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps untrusted bytes, refusing:
    ///
    /// * a buffer shorter than the header (`TooShort`), a wrong magic (`"magic"`), an
    ///   unknown format (`"format"`), undefined state bits (`"state"`);
    /// * a buffer shorter than header + `body_len` (`TooShort`);
    /// * header fields and body whose CRC-32C differs from `body_crc` (`"body_crc"`: a
    ///   torn log WRITE);
    /// * a record with an unknown kind (`"kind"`) or op (`"op"`), a header or payload past
    ///   the end of the body (`TooShort`), non-zero padding (`"padding"`), a commit record
    ///   whose entry count disagrees with its payload (`"entry_count"`);
    /// * fewer records than `record_count` (`"record_count"`) or bytes left in the body
    ///   after `record_count` records (`TooLong`).
    ///
    /// A truncated (invalid) region is accepted; check [`LogRegion::is_valid`].
    pub fn new_checked(buffer: T) -> Result<Self, LayoutError> {
        let region = Self::new_unchecked(buffer);
        region.check()?;
        Ok(region)
    }

    /// The checks [`LogRegion::new_checked`] runs.
    pub fn check(&self) -> Result<(), LayoutError> {
        let buf = self.buffer.as_ref();
        need(LogRegionHeader::LEN, buf.len())?;
        let header = self.header();
        if header.magic.get() != LogRegionHeader::MAGIC {
            return Err(LayoutError::InvalidField { field: "magic" });
        }
        if header.format != LogRegionHeader::FORMAT {
            return Err(LayoutError::InvalidField { field: "format" });
        }
        LogState::from_raw(header.state.to_raw())?;
        let end = LogRegionHeader::LEN.saturating_add(header.body_len());
        need(end, buf.len())?;
        let body = &buf[LogRegionHeader::LEN..end];
        if region_crc(header, body) != header.body_crc() {
            return Err(LayoutError::InvalidField { field: "body_crc" });
        }
        let mut rest = body;
        for _ in 0..header.record_count() {
            if rest.is_empty() {
                return Err(LayoutError::InvalidField {
                    field: "record_count",
                });
            }
            let (_, used) = parse_record(rest)?;
            rest = &rest[used..];
        }
        if !rest.is_empty() {
            return Err(LayoutError::TooLong {
                max: body.len() - rest.len(),
                got: body.len(),
            });
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The region header.
    pub fn header(&self) -> &LogRegionHeader {
        header_of(self.buffer.as_ref())
    }

    /// Whether the log is valid (not truncated).
    pub fn is_valid(&self) -> bool {
        self.header().is_valid()
    }

    /// The body (all records with their padding).
    pub fn body(&self) -> &[u8] {
        let len = self.header().body_len();
        &self.buffer.as_ref()[LogRegionHeader::LEN..LogRegionHeader::LEN + len]
    }

    /// The records, in the order they were appended.
    pub fn records(&self) -> LogRecords<'_> {
        LogRecords {
            rest: self.body(),
            remaining: self.header().record_count(),
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> LogRegion<T> {
    /// Clears the valid bit in this image (what recovery's one-byte WRITE does remotely).
    pub fn truncate(&mut self) {
        header_of_mut::<LogRegionHeader>(self.buffer.as_mut()).set_valid(false);
    }
}

/// Iterator over the records of a [`LogRegion`]; borrows, never copies.
#[derive(Clone, Debug)]
pub struct LogRecords<'a> {
    rest: &'a [u8],
    remaining: u16,
}

impl<'a> Iterator for LogRecords<'a> {
    type Item = LogRecord<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        match parse_record(self.rest) {
            Ok((record, used)) => {
                self.rest = &self.rest[used..];
                self.remaining -= 1;
                Some(record)
            }
            Err(_) => {
                self.remaining = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(usize::from(self.remaining)))
    }
}

// ---------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------

/// Builds a log region image in a caller buffer, to be sent with one RDMA WRITE.
///
/// The header is kept invalid while records are appended; [`LogWriter::finish`] fills in
/// count, length and checksum and sets the valid bit. An append that does not fit (buffer
/// space, a payload over 65,535 bytes, more than 65,535 records) returns
/// [`LayoutError::DoesNotFit`] and changes nothing.
#[derive(Debug)]
pub struct LogWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
    count: u16,
}

impl<'a> LogWriter<'a> {
    /// Starts an empty log for `txn_id` of `coordinator_id` in `epoch`; refuses a buffer
    /// shorter than the header or longer than header + `u32::MAX` bytes of body.
    pub fn new(
        buf: &'a mut [u8],
        coordinator_id: u16,
        epoch: u64,
        txn_id: u64,
    ) -> Result<Self, LayoutError> {
        need(LogRegionHeader::LEN, buf.len())?;
        let header = header_of_mut::<LogRegionHeader>(buf);
        *header = LogRegionHeader {
            magic: U16::new(LogRegionHeader::MAGIC),
            state: LogState::TRUNCATED,
            format: LogRegionHeader::FORMAT,
            coordinator_id: U16::new(coordinator_id),
            record_count: U16::ZERO,
            epoch: U64::new(epoch),
            txn_id: U64::new(txn_id),
            body_len: U32::ZERO,
            body_crc: U32::ZERO,
        };
        Ok(Self {
            buf,
            len: LogRegionHeader::LEN,
            count: 0,
        })
    }

    /// Records appended so far.
    pub const fn record_count(&self) -> u16 {
        self.count
    }

    /// Bytes used so far, header included.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether no record has been appended.
    pub const fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes still free in the buffer.
    pub const fn remaining(&self) -> usize {
        self.buf.len() - self.len
    }

    /// Checks that one more record of `header_len + payload_len` bytes fits and returns
    /// its payload length as stored and its padded size.
    fn fit(&self, header_len: usize, payload_len: usize) -> Result<(U16, usize), LayoutError> {
        let stored = u16::try_from(payload_len).map_err(|_| LayoutError::DoesNotFit {
            field: "payload_len",
            value: payload_len as u64,
            max: u16::MAX.into(),
        })?;
        if self.count == u16::MAX {
            return Err(LayoutError::DoesNotFit {
                field: "record_count",
                value: u64::from(u16::MAX) + 1,
                max: u16::MAX.into(),
            });
        }
        let stride = pad8(header_len + payload_len);
        let max = self
            .buf
            .len()
            .min(LogRegionHeader::LEN.saturating_add(u32::MAX as usize));
        if stride > max - self.len.min(max) {
            return Err(LayoutError::DoesNotFit {
                field: "log record",
                value: (self.len + stride) as u64,
                max: max as u64,
            });
        }
        Ok((U16::new(stored), stride))
    }

    /// Copies a header, payload and zero padding at the end of the log.
    fn put(&mut self, header: &[u8], payloads: &[&[u8]], stride: usize) {
        let start = self.len;
        let record = &mut self.buf[start..start + stride];
        record[..header.len()].copy_from_slice(header);
        let mut at = header.len();
        for payload in payloads {
            record[at..at + payload.len()].copy_from_slice(payload);
            at += payload.len();
        }
        record[at..].fill(0);
        self.len += stride;
        self.count += 1;
    }

    /// Appends a FORD/Pandora undo record: `entry.version` is the old version, `old_value`
    /// the value before the transaction.
    pub fn append_undo(
        &mut self,
        entry: &DataLogEntry,
        old_value: &[u8],
    ) -> Result<(), LayoutError> {
        let (payload_len, stride) = self.fit(UndoRecordHeader::LEN, old_value.len())?;
        let header = UndoRecordHeader {
            prefix: LogRecordPrefix {
                kind: LogRecordKind::Undo,
                op: entry.op,
                payload_len,
            },
            table_id: U32::new(entry.table_id),
            key: U64::new(entry.key),
            addr: entry.addr,
            old_version: U64::new(entry.version),
        };
        self.put(header.as_bytes(), &[old_value], stride);
        Ok(())
    }

    /// Appends an OOCC redo record: `entry.version` is the new version, `new_value` the
    /// value the transaction installs.
    pub fn append_redo(
        &mut self,
        entry: &DataLogEntry,
        new_value: &[u8],
    ) -> Result<(), LayoutError> {
        let (payload_len, stride) = self.fit(RedoRecordHeader::LEN, new_value.len())?;
        let header = RedoRecordHeader {
            prefix: LogRecordPrefix {
                kind: LogRecordKind::Redo,
                op: entry.op,
                payload_len,
            },
            table_id: U32::new(entry.table_id),
            key: U64::new(entry.key),
            addr: entry.addr,
            new_version: U64::new(entry.version),
        };
        self.put(header.as_bytes(), &[new_value], stride);
        Ok(())
    }

    /// Appends a LOTUS commit record with the transaction's start timestamp and its new
    /// versions.
    pub fn append_commit(
        &mut self,
        start_ts: u64,
        entries: &[CommitLogEntry],
    ) -> Result<(), LayoutError> {
        let payload = entries.as_bytes();
        let (payload_len, stride) = self.fit(CommitRecordHeader::LEN, payload.len())?;
        let header = CommitRecordHeader {
            prefix: LogRecordPrefix {
                kind: LogRecordKind::Commit,
                op: LogOp::Update,
                payload_len,
            },
            // payload_len fits in u16, so entries.len() <= 2047 fits in u32.
            entry_count: U32::new(entries.len() as u32),
            start_ts: U64::new(start_ts),
        };
        self.put(header.as_bytes(), &[payload], stride);
        Ok(())
    }

    /// Completes the header (record count, body length, CRC-32C, valid bit) and returns the
    /// image to WRITE: header and records, `len()` bytes.
    pub fn finish(self) -> &'a [u8] {
        let Self { buf, len, count } = self;
        let (image, _) = buf.split_at_mut(len);
        let (head, body) = image.split_at_mut(LogRegionHeader::LEN);
        let header = header_of_mut::<LogRegionHeader>(head);
        header.record_count = U16::new(count);
        // `fit` keeps the body within u32::MAX bytes.
        header.body_len = U32::new(body.len() as u32);
        header.body_crc = U32::new(region_crc(header, body));
        header.state = LogState::VALID_LOG;
        image
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::{Arbitrary, Gen, TestResult};
    use quickcheck_macros::quickcheck;

    fn addr(node: u16, offset: u64) -> RemoteAddr {
        RemoteAddr::new(node, offset).unwrap()
    }

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    /// Pandora Fig. 2(c): the transaction writes Y and Z; after validation the coordinator
    /// logs both with one WRITE; recovery reads them back, then truncates the log.
    #[test]
    fn pandora_undo_log_of_y_and_z() {
        let mut region = [0u8; 256];
        let mut w = LogWriter::new(&mut region, 17, 3, 0x7700).unwrap();
        let y = DataLogEntry {
            op: LogOp::Update,
            table_id: 1,
            key: b'Y'.into(),
            addr: addr(2, 0x100),
            version: 4,
        };
        let z = DataLogEntry {
            op: LogOp::Insert,
            table_id: 1,
            key: b'Z'.into(),
            addr: addr(2, 0x200),
            version: 0,
        };
        w.append_undo(&y, b"old Y").unwrap();
        w.append_undo(&z, &[]).unwrap();
        assert_eq!(w.record_count(), 2);
        let image_len = w.finish().len();
        assert_eq!(image_len, 32 + 40 + 32);

        let mut read = LogRegion::new_checked(&mut region[..]).unwrap();
        assert!(read.is_valid());
        assert_eq!(
            (
                read.header().coordinator_id(),
                read.header().epoch(),
                read.header().txn_id()
            ),
            (17, 3, 0x7700)
        );
        let records: Vec<_> = read.records().collect();
        assert_eq!(records.len(), 2);
        match records[0] {
            LogRecord::Undo(u) => {
                assert_eq!(u.header.entry(), y);
                assert_eq!(u.old_value, b"old Y");
            }
            other => panic!("expected undo, got {other:?}"),
        }
        match records[1] {
            LogRecord::Undo(u) => assert_eq!(
                (u.header.op(), u.header.old_version(), u.old_value.len()),
                (LogOp::Insert, 0, 0)
            ),
            other => panic!("expected undo, got {other:?}"),
        }
        // §3.2.3: truncation is a one-byte WRITE of the state byte; the CRC stays valid.
        read.truncate();
        assert_eq!(
            region[LogRegionHeader::STATE_OFFSET],
            LogState::TRUNCATED.to_raw()
        );
        assert_eq!(LogRegionHeader::STATE_OFFSET, 31);
        let read = LogRegion::new_checked(&region[..]).unwrap();
        assert!(!read.is_valid());
        assert_eq!(read.records().count(), 2);
    }

    /// A coordinator crashes in the middle of its log WRITE, after any byte: the region
    /// holds a prefix of the new image over an older transaction's log, valid or truncated.
    /// Recovery must see either the old log in its old state or the new log whole; in
    /// particular a truncated old log must never come back as valid.
    #[test]
    fn torn_log_write_is_detected_at_every_byte() {
        let e = DataLogEntry {
            op: LogOp::Update,
            table_id: 1,
            key: 1,
            addr: addr(0, 8),
            version: 1,
        };
        for old_truncated in [false, true] {
            let mut mn = [0u8; 128];
            {
                let mut w = LogWriter::new(&mut mn, 1, 1, 1).unwrap();
                w.append_undo(&e, b"first txn").unwrap();
                w.append_undo(&e, b"first txn").unwrap();
                w.finish();
            }
            if old_truncated {
                LogRegion::new_checked(&mut mn[..]).unwrap().truncate();
            }
            let mut local = [0u8; 128];
            let mut w = LogWriter::new(&mut local, 1, 1, 2).unwrap();
            w.append_undo(&DataLogEntry { key: 2, ..e }, b"second tx")
                .unwrap();
            w.append_undo(&DataLogEntry { key: 3, ..e }, b"second tx")
                .unwrap();
            let image = w.finish();
            for landed in 0..=image.len() {
                let mut torn = mn;
                torn[..landed].copy_from_slice(&image[..landed]);
                match LogRegion::new_checked(&torn[..]) {
                    Ok(region) if region.header().txn_id() == 2 => {
                        // Accepted only once every byte that differs has landed (the
                        // tail is zero padding, equal in both images).
                        assert_eq!(&torn[..image.len()], image, "new log accepted at {landed}");
                        assert!(region.is_valid());
                    }
                    Ok(region) => {
                        assert!(
                            landed < LogRegionHeader::CRC_OFFSET,
                            "old log accepted at {landed}"
                        );
                        assert_eq!(
                            region.is_valid(),
                            !old_truncated,
                            "state changed at {landed}"
                        );
                    }
                    Err(_) => assert!(landed > 0 && landed < image.len()),
                }
            }
        }
    }

    /// OOCC Fig. 8: T1 modifies A and B and stores redo logs in Validate&Logging.
    #[test]
    fn oocc_redo_log_of_a_and_b() {
        let mut buf = [0u8; 128];
        let mut w = LogWriter::new(&mut buf, 1, 0, 1).unwrap();
        let a = DataLogEntry {
            op: LogOp::Update,
            table_id: 0,
            key: 0xA,
            addr: addr(0, 0x40),
            version: 6,
        };
        w.append_redo(&a, &[0xAA; 8]).unwrap();
        w.append_redo(
            &DataLogEntry {
                key: 0xB,
                version: 9,
                ..a
            },
            &[0xBB; 8],
        )
        .unwrap();
        w.finish();
        let region = LogRegion::new_checked(&buf[..]).unwrap();
        let news: Vec<_> = region
            .records()
            .map(|r| match r {
                LogRecord::Redo(r) => (r.header.key(), r.header.new_version(), r.new_value[0]),
                other => panic!("expected redo, got {other:?}"),
            })
            .collect();
        assert_eq!(news, [(0xA, 6, 0xAA), (0xB, 9, 0xBB)]);
    }

    /// LOTUS Fig. 10: the transaction writes A and B; step 1 logs their new addresses.
    #[test]
    fn lotus_commit_log() {
        let entries = [
            CommitLogEntry::new(3, 0xA, addr(0, 0x1000), 1, addr(0, 0x8000), 48),
            CommitLogEntry::new(3, 0xB, addr(1, 0x2000), 0, addr(1, 0x9000), 48),
        ];
        let mut buf = [0u8; 128];
        let mut w = LogWriter::new(&mut buf, 9, 2, 55).unwrap();
        w.append_commit(1_000, &entries).unwrap();
        let len = w.finish().len();
        assert_eq!(len, 32 + 16 + 64);
        let region = LogRegion::new_checked(&buf[..len]).unwrap();
        match region.records().next() {
            Some(LogRecord::Commit(c)) => {
                assert_eq!(c.header.start_ts(), 1_000);
                assert_eq!(c.entries, &entries);
                assert_eq!(c.entries[1].record_addr(), addr(1, 0x9000));
            }
            other => panic!("expected commit, got {other:?}"),
        }
    }

    #[test]
    fn writer_refuses_what_does_not_fit_and_changes_nothing() {
        let mut buf = [0u8; 72];
        let mut w = LogWriter::new(&mut buf, 1, 1, 1).unwrap();
        let e = DataLogEntry {
            op: LogOp::Update,
            table_id: 1,
            key: 1,
            addr: addr(0, 8),
            version: 1,
        };
        w.append_undo(&e, &[1; 8]).unwrap();
        assert_eq!(w.remaining(), 0);
        assert_eq!(
            w.append_undo(&e, &[]),
            Err(LayoutError::DoesNotFit {
                field: "log record",
                value: 104,
                max: 72
            })
        );
        assert_eq!(w.record_count(), 1);
        let image = w.finish().to_vec();
        assert_eq!(
            LogRegion::new_checked(&image[..])
                .unwrap()
                .records()
                .count(),
            1
        );
        let mut big = vec![0u8; 70_000];
        let mut w = LogWriter::new(&mut big, 1, 1, 1).unwrap();
        assert!(matches!(
            w.append_redo(&e, &[0; 65_536]),
            Err(LayoutError::DoesNotFit {
                field: "payload_len",
                ..
            })
        ));
        assert!(LogWriter::new(&mut [0u8; 31], 1, 1, 1).is_err());
    }

    fn with_fixed_crc(mut image: Vec<u8>) -> Vec<u8> {
        if image.len() >= LogRegionHeader::LEN {
            let header = LogRegionHeader::read_from_prefix(&image).unwrap().0;
            let end = LogRegionHeader::LEN.saturating_add(header.body_len());
            if let Some(body) = image.get(LogRegionHeader::LEN..end) {
                let crc = region_crc(&header, body);
                image[24..28].copy_from_slice(&crc.to_le_bytes());
            }
        }
        image
    }

    #[test]
    fn reader_errors() {
        let mut buf = [0u8; 128];
        let mut w = LogWriter::new(&mut buf, 1, 1, 1).unwrap();
        let e = DataLogEntry {
            op: LogOp::Update,
            table_id: 1,
            key: 1,
            addr: addr(0, 8),
            version: 1,
        };
        w.append_undo(&e, &[7; 3]).unwrap();
        let good = w.finish().to_vec();
        let err = |bytes: Vec<u8>| LogRegion::new_checked(&bytes[..]).unwrap_err();
        assert_eq!(
            err(good[..31].to_vec()),
            LayoutError::TooShort {
                needed: 32,
                got: 31
            }
        );
        assert_eq!(
            err(good[..60].to_vec()),
            LayoutError::TooShort {
                needed: 72,
                got: 60
            }
        );
        let mut m = good.clone();
        m[28] = b'X';
        assert_eq!(err(m), LayoutError::InvalidField { field: "magic" });
        let mut m = good.clone();
        m[30] = 2;
        assert_eq!(err(m), LayoutError::InvalidField { field: "format" });
        let mut m = good.clone();
        m[31] = 0x81;
        assert_eq!(err(m), LayoutError::InvalidField { field: "state" });
        let mut m = good.clone();
        m[40] ^= 1;
        assert_eq!(err(m), LayoutError::InvalidField { field: "body_crc" });
        let mut m = good.clone();
        m[9] ^= 1; // txn_id: covered by the CRC too
        assert_eq!(err(m), LayoutError::InvalidField { field: "body_crc" });
        let mut m = good.clone();
        m[32] = 9;
        assert_eq!(
            err(with_fixed_crc(m)),
            LayoutError::InvalidField { field: "kind" }
        );
        let mut m = good.clone();
        m[33] = 3;
        assert_eq!(
            err(with_fixed_crc(m)),
            LayoutError::InvalidField { field: "op" }
        );
        let mut m = good.clone();
        m[32 + 32 + 3] = 1; // padding byte after the 3-byte value
        assert_eq!(
            err(with_fixed_crc(m)),
            LayoutError::InvalidField { field: "padding" }
        );
        let mut m = good.clone();
        m[22] = 2; // record_count 2, one record present
        assert_eq!(
            err(with_fixed_crc(m)),
            LayoutError::InvalidField {
                field: "record_count"
            }
        );
        let mut m = good.clone();
        m[22] = 0; // record_count 0, one record present
        assert_eq!(
            err(with_fixed_crc(m)),
            LayoutError::TooLong { max: 0, got: 40 }
        );
        let mut m = good.clone();
        m[34] = 200; // payload past the end of the body
        assert_eq!(
            err(with_fixed_crc(m)),
            LayoutError::TooShort {
                needed: 232,
                got: 40
            }
        );
    }

    /// An arbitrary log record, for the round-trip properties.
    #[derive(Clone, Debug)]
    enum Rec {
        Undo(u8, u32, u64, u64, u64, Vec<u8>),
        Redo(u8, u32, u64, u64, u64, Vec<u8>),
        Commit(u64, Vec<(u32, u64, u64, u16, u64, u16)>),
    }

    impl Arbitrary for Rec {
        fn arbitrary(g: &mut Gen) -> Self {
            match u8::arbitrary(g) % 3 {
                0 => Rec::Undo(
                    u8::arbitrary(g) % 3,
                    u32::arbitrary(g),
                    u64::arbitrary(g),
                    u64::arbitrary(g),
                    u64::arbitrary(g),
                    Vec::arbitrary(g),
                ),
                1 => Rec::Redo(
                    u8::arbitrary(g) % 3,
                    u32::arbitrary(g),
                    u64::arbitrary(g),
                    u64::arbitrary(g),
                    u64::arbitrary(g),
                    Vec::arbitrary(g),
                ),
                _ => Rec::Commit(u64::arbitrary(g), Vec::arbitrary(g)),
            }
        }
    }

    fn op(n: u8) -> LogOp {
        [LogOp::Update, LogOp::Insert, LogOp::Delete][usize::from(n % 3)]
    }

    fn entries(v: &[(u32, u64, u64, u16, u64, u16)]) -> Vec<CommitLogEntry> {
        v.iter()
            .map(|&(t, k, c, cell, r, len)| {
                CommitLogEntry::new(
                    t,
                    k,
                    RemoteAddr::from_raw(c),
                    cell,
                    RemoteAddr::from_raw(r),
                    len,
                )
            })
            .collect()
    }

    fn write_all(buf: &mut [u8], recs: &[Rec]) -> (usize, usize) {
        let mut w = LogWriter::new(buf, 5, 6, 7).unwrap();
        for rec in recs {
            let res = match rec {
                Rec::Undo(o, t, k, a, v, val) => w.append_undo(
                    &DataLogEntry {
                        op: op(*o),
                        table_id: *t,
                        key: *k,
                        addr: RemoteAddr::from_raw(*a),
                        version: *v,
                    },
                    val,
                ),
                Rec::Redo(o, t, k, a, v, val) => w.append_redo(
                    &DataLogEntry {
                        op: op(*o),
                        table_id: *t,
                        key: *k,
                        addr: RemoteAddr::from_raw(*a),
                        version: *v,
                    },
                    val,
                ),
                Rec::Commit(ts, es) => w.append_commit(*ts, &entries(es)),
            };
            if res.is_err() {
                break;
            }
        }
        let n = usize::from(w.record_count());
        (w.finish().len(), n)
    }

    #[quickcheck]
    fn qc_writer_then_reader_round_trip(recs: Vec<Rec>, cap: u16) -> bool {
        let mut buf = vec![0u8; 32 + usize::from(cap) % 4096];
        let (len, n) = write_all(&mut buf, &recs);
        let Ok(region) = LogRegion::new_checked(&buf[..len]) else {
            return false;
        };
        let read: Vec<_> = region.records().collect();
        read.len() == n
            && read.iter().zip(&recs).all(|(got, want)| match (got, want) {
                (LogRecord::Undo(u), Rec::Undo(o, t, k, a, v, val)) => {
                    u.header.entry()
                        == DataLogEntry {
                            op: op(*o),
                            table_id: *t,
                            key: *k,
                            addr: RemoteAddr::from_raw(*a),
                            version: *v,
                        }
                        && u.old_value == &val[..]
                }
                (LogRecord::Redo(r), Rec::Redo(o, t, k, a, v, val)) => {
                    r.header.entry()
                        == DataLogEntry {
                            op: op(*o),
                            table_id: *t,
                            key: *k,
                            addr: RemoteAddr::from_raw(*a),
                            version: *v,
                        }
                        && r.new_value == &val[..]
                }
                (LogRecord::Commit(c), Rec::Commit(ts, es)) => {
                    c.header.start_ts() == *ts && c.entries == &entries(es)[..]
                }
                _ => false,
            })
    }

    #[quickcheck]
    fn qc_region_header_round_trip(coord: u16, epoch: u64, txn: u64) -> bool {
        let mut buf = [0u8; 32];
        let image = LogWriter::new(&mut buf, coord, epoch, txn)
            .unwrap()
            .finish();
        let h = LogRegionHeader::read_from_bytes(image).unwrap();
        (
            h.coordinator_id(),
            h.epoch(),
            h.txn_id(),
            h.record_count(),
            h.body_len(),
            h.is_valid(),
        ) == (coord, epoch, txn, 0, 0, true)
    }

    #[quickcheck]
    fn qc_any_bytes_parse_or_error(bytes: Vec<u8>) -> TestResult {
        if let Ok(region) = LogRegion::new_checked(&bytes[..]) {
            let n = region.records().count();
            if n != usize::from(region.header().record_count()) {
                return TestResult::failed();
            }
        }
        // Same bytes with the checksum made right, so the record parser sees them.
        if let Ok(region) = LogRegion::new_checked(&with_fixed_crc(bytes)[..]) {
            let _ = region.records().count();
        }
        TestResult::passed()
    }

    #[quickcheck]
    fn qc_mutated_log_parse_or_error(
        recs: Vec<Rec>,
        flips: Vec<(u16, u8)>,
        cut: u16,
    ) -> TestResult {
        let mut buf = vec![0u8; 2048];
        let (len, _) = write_all(&mut buf, &recs);
        let mut image = buf[..len].to_vec();
        for (at, x) in flips {
            let at = usize::from(at) % image.len();
            image[at] ^= x;
        }
        image.truncate(usize::from(cut) % (image.len() + 1));
        if let Ok(region) = LogRegion::new_checked(&with_fixed_crc(image)[..]) {
            let n = region.records().count();
            return TestResult::from_bool(n == usize::from(region.header().record_count()));
        }
        TestResult::passed()
    }
}

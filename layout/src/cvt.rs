//! Consecutive version table (CVT): the per-record version metadata of LOTUS's MVCC store
//! (LOTUS §4.4, §5.1, §7.1 Fig. 11; the structure comes from Motor).
//!
//! A CVT is a header and `N` cells in one contiguous region so that one RDMA READ fetches
//! every version of a record. Each cell names one version: the commit timestamp, the
//! address of that version's full record image (a [`crate::cacheline`] image), and a
//! validity flag, fenced by a head and a tail cacheline version (CV).
//!
//! ```text
//! CvtHeader (16 B)                       CvtCell (32 B), repeated N times
//! +---------+----------+------------+    +----+-----+------+---------+---------+------+----+
//! | key u64 | table u32| length u32 |    | CV |valid| rsvd | address | version | rsvd | CV |
//! +---------+----------+------------+    +----+-----+------+---------+---------+------+----+
//!  0         8          12         16     0    1     2..8   8..16     16..24    24..31 31
//! ```
//!
//! All integers are little-endian. A CVT of `N` cells is `16 + 32 * N` bytes: 80 B for the
//! 2-cell tables LOTUS evaluates, 112 B and 144 B for Motor's 3- and 4-cell ones.
//!
//! # Deviation from the paper: 32-byte cells
//!
//! Fig. 11 lists five cell fields (head CV, valid, 64-bit address, 64-bit version, tail
//! CV), 19 bytes. dmem pads the cell to 32 bytes so that the address and the version sit
//! at 8-byte aligned offsets of the cell and, the CVT being 8-byte aligned in MN memory,
//! never straddle a cache line. This matters for step "Write Visible" of the commit phase
//! (LOTUS §5.1): the coordinator makes a version visible by writing only the 8-byte commit
//! version ([`Cvt::commit_version_offset`]); that write does not touch the CVs, so it must
//! land in one cache line to be atomic for readers. The 13 reserved bytes are written
//! as zero and ignored on read (Motor keeps per-cell attribute metadata there).
//!
//! # Reading a version (LOTUS §5.1)
//!
//! [`Cvt::pick_version_at`] returns, for a start timestamp `T_start`, the cell with the
//! largest committed version below `T_start` (what both read-only and read-write
//! transactions read), whether a committed version at or after `T_start` exists (a
//! read-write transaction under SR aborts then) and whether a version is still
//! [`INVISIBLE`] (being committed).

use core::mem::{align_of, size_of};

use static_assertions::const_assert_eq;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{ConvertError, Immutable, IntoBytes, KnownLayout, TryFromBytes, Unaligned};

use crate::LayoutError;
use crate::cacheline::{self, LineVersion};

/// Commit version of a cell whose version is written but not yet committed: the 64-bit
/// maximum, so no start timestamp ever sees it (LOTUS §5.1, "Write Data & Log").
pub const INVISIBLE: u64 = u64::MAX;

/// Identity of the record a CVT describes (LOTUS §7.1 Fig. 11: `Key`, `TableID`,
/// `Length`). Written once when the record is inserted.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, TryFromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct CvtHeader {
    key: U64,
    table_id: U32,
    record_len: U32,
}

const_assert_eq!(size_of::<CvtHeader>(), 16);
const_assert_eq!(align_of::<CvtHeader>(), 1);

impl CvtHeader {
    /// A header for record `key` (the 64-bit LOTUS key of §4.2) of table `table_id`, whose
    /// payload is `record_len` bytes.
    pub const fn new(key: u64, table_id: u32, record_len: u32) -> Self {
        Self {
            key: U64::new(key),
            table_id: U32::new(table_id),
            record_len: U32::new(record_len),
        }
    }

    /// The record's 64-bit key (its low 12 bits are the shard number, LOTUS §4.2).
    pub fn key(&self) -> u64 {
        self.key.get()
    }

    /// The table the record belongs to.
    pub fn table_id(&self) -> u32 {
        self.table_id.get()
    }

    /// Payload length of each version's record, in bytes (without CVs).
    pub fn record_len(&self) -> u32 {
        self.record_len.get()
    }

    /// Length of each version's cacheline-versioned image in MN memory
    /// ([`cacheline::image_len`] of the payload length).
    pub fn record_image_len(&self) -> usize {
        // u32 -> usize is lossless on every target dmem supports (32- and 64-bit).
        cacheline::image_len(self.record_len.get() as usize)
    }
}

/// Whether a CVT cell holds a version (LOTUS §7.1 Fig. 11, `Valid`). Any other byte value
/// is refused when the cell is parsed.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, TryFromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(u8)]
pub enum CellValidity {
    /// The cell is free: never written, or cleared by garbage collection.
    Free = 0,
    /// The cell holds a version (committed or [`INVISIBLE`]).
    Valid = 1,
}

/// One version of a record (LOTUS §7.1 Fig. 11): 32 bytes, see the module docs for the
/// layout and why it is wider than the paper's 19 bytes of fields.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, TryFromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct CvtCell {
    head_cv: u8,
    validity: CellValidity,
    reserved_head: [u8; 6],
    address: U64,
    version: U64,
    reserved_tail: [u8; 7],
    tail_cv: u8,
}

const_assert_eq!(size_of::<CvtCell>(), 32);
const_assert_eq!(align_of::<CvtCell>(), 1);
const_assert_eq!(CvtCell::VERSION_OFFSET % 8, 0);
const_assert_eq!(CvtCell::ADDRESS_OFFSET % 8, 0);

impl CvtCell {
    /// Offset of the 8-byte record address inside a cell.
    pub const ADDRESS_OFFSET: usize = 8;
    /// Offset of the 8-byte commit version inside a cell (target of "Write Visible").
    pub const VERSION_OFFSET: usize = 16;

    /// A free cell (all zero: CVs 0, not valid).
    pub const FREE: Self = Self {
        head_cv: 0,
        validity: CellValidity::Free,
        reserved_head: [0; 6],
        address: U64::ZERO,
        version: U64::ZERO,
        reserved_tail: [0; 7],
        tail_cv: 0,
    };

    /// A valid cell with both CVs `cv`, pointing at the record image at `address`, with
    /// commit version `version` ([`INVISIBLE`] while the writer has not committed).
    pub const fn new(cv: LineVersion, address: u64, version: u64) -> Self {
        Self {
            head_cv: cv,
            validity: CellValidity::Valid,
            reserved_head: [0; 6],
            address: U64::new(address),
            version: U64::new(version),
            reserved_tail: [0; 7],
            tail_cv: cv,
        }
    }

    /// The cell a writer installs in the CVT at commit step "Write Data & Log"
    /// (LOTUS §5.1): the CV after the cell's current one (the new record image is stamped
    /// with the same CV), the new record's address, and version [`INVISIBLE`].
    pub const fn next_invisible(&self, address: u64) -> Self {
        Self::new(cacheline::next_version(self.head_cv), address, INVISIBLE)
    }

    /// This cell with its commit version set: what step "Write Visible" makes of it.
    pub const fn with_commit_version(mut self, version: u64) -> Self {
        self.version = U64::new(version);
        self
    }

    /// The CV at the head of the cell.
    pub fn head_cv(&self) -> LineVersion {
        self.head_cv
    }

    /// The CV at the tail of the cell.
    pub fn tail_cv(&self) -> LineVersion {
        self.tail_cv
    }

    /// Whether the cell holds a version.
    pub fn is_valid(&self) -> bool {
        self.validity == CellValidity::Valid
    }

    /// MN address of this version's record image.
    pub fn address(&self) -> u64 {
        self.address.get()
    }

    /// Commit version (timestamp) of this version, [`INVISIBLE`] if not yet committed.
    pub fn commit_version(&self) -> u64 {
        self.version.get()
    }

    /// Whether the cell holds a committed version (valid and not [`INVISIBLE`]).
    pub fn is_committed(&self) -> bool {
        self.is_valid() && self.version.get() != INVISIBLE
    }

    /// Whether the cell was read whole: its head and tail CVs agree (LOTUS §7.1).
    pub fn is_consistent(&self) -> bool {
        self.head_cv == self.tail_cv
    }

    /// Whether `image`, read from [`Self::address`], is a consistent image of this very
    /// version: the cell is consistent, every line of the image carries one CV, and that
    /// CV is the cell's (LOTUS §7.1: "Readers compare the CVs in the cell and the data").
    pub fn matches_record(&self, image: &[u8]) -> bool {
        self.is_consistent() && cacheline::check_versions(image) == Ok(self.head_cv)
    }
}

/// What a reader with start timestamp `T_start` finds in a CVT (LOTUS §5.1, Phase 1 step 3
/// and "Processing Read-Only Transactions").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionPick {
    /// Index of the cell with the largest committed version below `T_start`, if any.
    pub visible: Option<usize>,
    /// Some committed version is at or after `T_start`: the record changed since the
    /// reader started; a read-write transaction aborts (SR, LOTUS §5.1).
    pub newer_committed: bool,
    /// Some valid cell is [`INVISIBLE`]: a writer is between "Write Data" and "Write
    /// Visible".
    pub pending: bool,
}

/// A consecutive version table of `N` cells (LOTUS §7.1 Fig. 11, Motor): `16 + 32 * N`
/// bytes, alignment 1 (place it 8-byte aligned in MN memory, see the module docs).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, TryFromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct Cvt<const N: usize> {
    header: CvtHeader,
    cells: [CvtCell; N],
}

const_assert_eq!(size_of::<Cvt<2>>(), 80);
const_assert_eq!(size_of::<Cvt<3>>(), 112);
const_assert_eq!(size_of::<Cvt<4>>(), 144);
const_assert_eq!(align_of::<Cvt<2>>(), 1);

impl<const N: usize> Cvt<N> {
    const HAS_CELLS: () = assert!(N > 0, "a CVT needs at least one cell");

    /// Size of the table in bytes: what one RDMA READ fetches.
    pub const SIZE: usize = size_of::<Self>();

    /// A new table for a record: the header and `N` free cells.
    pub const fn new(header: CvtHeader) -> Self {
        let () = Self::HAS_CELLS;
        Self {
            header,
            cells: [CvtCell::FREE; N],
        }
    }

    /// Parses a table read from MN memory. `bytes` must be exactly [`Self::SIZE`] bytes and
    /// every cell's valid byte must be 0 or 1; otherwise the error says which.
    pub fn parse(bytes: &[u8]) -> Result<&Self, LayoutError> {
        let () = Self::HAS_CELLS;
        Self::try_ref_from_bytes(bytes).map_err(|e| match e {
            ConvertError::Alignment(_) => LayoutError::Misaligned { align: 1 },
            ConvertError::Size(_) if bytes.len() < Self::SIZE => LayoutError::TooShort {
                needed: Self::SIZE,
                got: bytes.len(),
            },
            ConvertError::Size(_) => LayoutError::TooLong {
                max: Self::SIZE,
                got: bytes.len(),
            },
            ConvertError::Validity(_) => LayoutError::InvalidField {
                field: "cvt cell valid",
            },
        })
    }

    /// The header.
    pub fn header(&self) -> &CvtHeader {
        &self.header
    }

    /// The cells.
    pub fn cells(&self) -> &[CvtCell; N] {
        &self.cells
    }

    /// The cells, mutable (for building a table or the CN's version-table cache, §4.4).
    pub fn cells_mut(&mut self) -> &mut [CvtCell; N] {
        &mut self.cells
    }

    /// Offset of cell `index` from the start of the table: where a writer's RDMA WRITE of
    /// a whole cell goes. `None` if `index >= N`.
    pub const fn cell_offset(index: usize) -> Option<usize> {
        if index < N {
            Some(size_of::<CvtHeader>() + index * size_of::<CvtCell>())
        } else {
            None
        }
    }

    /// Offset of cell `index`'s commit version from the start of the table: where step
    /// "Write Visible" writes the commit timestamp (8 bytes, never straddling a cache line
    /// if the table is 8-byte aligned). `None` if `index >= N`.
    pub const fn commit_version_offset(index: usize) -> Option<usize> {
        match Self::cell_offset(index) {
            Some(offset) => Some(offset + CvtCell::VERSION_OFFSET),
            None => None,
        }
    }

    /// Whether the table was read whole: every cell's head and tail CVs agree. A reader
    /// that gets `false` rereads or aborts (LOTUS §7.1).
    pub fn is_consistent(&self) -> bool {
        self.cells.iter().all(CvtCell::is_consistent)
    }

    /// The version a reader with start timestamp `t_start` sees, in one pass over the
    /// cells (LOTUS §5.1): the largest committed version strictly below `t_start`, plus
    /// whether a newer committed version or an uncommitted one exists.
    pub fn pick_version_at(&self, t_start: u64) -> VersionPick {
        let mut pick = VersionPick {
            visible: None,
            newer_committed: false,
            pending: false,
        };
        let mut best = 0u64;
        for (index, cell) in self.cells.iter().enumerate() {
            if !cell.is_valid() {
                continue;
            }
            let version = cell.commit_version();
            if version == INVISIBLE {
                pick.pending = true;
            } else if version >= t_start {
                pick.newer_committed = true;
            } else if pick.visible.is_none() || version > best {
                best = version;
                pick.visible = Some(index);
            }
        }
        pick
    }

    /// The cell visible at start timestamp `t_start` (largest committed version below it),
    /// with its index.
    pub fn visible_version_at(&self, t_start: u64) -> Option<(usize, &CvtCell)> {
        let index = self.pick_version_at(t_start).visible?;
        self.cells.get(index).map(|cell| (index, cell))
    }

    /// The newest committed version in the table, with its cell index.
    pub fn newest_committed(&self) -> Option<(usize, &CvtCell)> {
        self.cells
            .iter()
            .enumerate()
            .filter(|(_, cell)| cell.is_committed())
            .max_by_key(|(_, cell)| cell.commit_version())
    }

    /// The cell a writer installs its new version in (LOTUS §7.1 "Lightweight Garbage
    /// Collection"): the first free cell, else the valid cell with the oldest commit
    /// version, whose memory is recycled. An [`INVISIBLE`] cell counts as the newest, so
    /// it is taken only when every cell is [`INVISIBLE`] (all left by failed writers,
    /// since the writer holds the record's write lock).
    pub fn cell_for_writer(&self) -> usize {
        let () = Self::HAS_CELLS;
        let mut oldest = 0;
        let mut oldest_version = u64::MAX;
        for (index, cell) in self.cells.iter().enumerate() {
            if !cell.is_valid() {
                return index;
            }
            if index == 0 || cell.commit_version() < oldest_version {
                oldest = index;
                oldest_version = cell.commit_version();
            }
        }
        oldest
    }

    /// Bit `i` set for each committed cell other than the newest whose commit version is
    /// below `horizon`: cells garbage collection may free (LOTUS §7.1 clears versions
    /// older than a time threshold). The newest committed version is never reported, so
    /// the record always keeps one readable version. Supports up to 64 cells.
    pub fn reclaimable_before(&self, horizon: u64) -> u64 {
        let newest = self.newest_committed().map(|(index, _)| index);
        let mut mask = 0u64;
        for (index, cell) in self.cells.iter().enumerate().take(64) {
            if Some(index) != newest && cell.is_committed() && cell.commit_version() < horizon {
                mask |= 1 << index;
            }
        }
        mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::{Arbitrary, Gen};
    use quickcheck_macros::quickcheck;
    use zerocopy::IntoBytes;

    fn two_versions() -> Cvt<2> {
        // LOTUS evaluates two versions per record: v10 at 0x1000 and v20 at 0x2000.
        let mut cvt = Cvt::<2>::new(CvtHeader::new(0xABCD_0001, 3, 40));
        cvt.cells_mut()[0] = CvtCell::new(1, 0x1000, 10);
        cvt.cells_mut()[1] = CvtCell::new(1, 0x2000, 20);
        cvt
    }

    #[test]
    fn sizes_and_offsets() {
        assert_eq!(Cvt::<2>::SIZE, 80);
        assert_eq!(Cvt::<2>::cell_offset(1), Some(48));
        assert_eq!(Cvt::<2>::cell_offset(2), None);
        assert_eq!(Cvt::<2>::commit_version_offset(0), Some(32));
        assert_eq!(Cvt::<2>::commit_version_offset(1), Some(64));
        // Every commit version of a 4-cell table at an 8-aligned base stays in one line.
        for i in 0..4 {
            let off = Cvt::<4>::commit_version_offset(i).unwrap();
            assert_eq!(off / 64, (off + 7) / 64);
        }
    }

    #[test]
    fn two_versions_read_between_them() {
        let cvt = two_versions();
        // Before the first version: nothing visible, the record changed after T_start.
        let pick = cvt.pick_version_at(5);
        assert_eq!(
            pick,
            VersionPick {
                visible: None,
                newer_committed: true,
                pending: false
            }
        );
        // Between v10 and v20: v10 is visible, and v20 is newer (an SR read-write
        // transaction must abort, a read-only one reads v10).
        let pick = cvt.pick_version_at(15);
        assert_eq!(
            pick,
            VersionPick {
                visible: Some(0),
                newer_committed: true,
                pending: false
            }
        );
        assert_eq!(
            cvt.visible_version_at(15).map(|(_, c)| c.address()),
            Some(0x1000)
        );
        // Equal to a version: strictly below, so v10.
        assert_eq!(cvt.visible_version_at(20).map(|(i, _)| i), Some(0));
        // After both: v20.
        let pick = cvt.pick_version_at(25);
        assert_eq!(
            pick,
            VersionPick {
                visible: Some(1),
                newer_committed: false,
                pending: false
            }
        );
        assert_eq!(cvt.newest_committed().map(|(i, _)| i), Some(1));
    }

    #[test]
    fn writer_recycles_oldest_and_commits() {
        let mut cvt = two_versions();
        // Both cells used: the writer overwrites the oldest (v10, cell 0).
        let target = cvt.cell_for_writer();
        assert_eq!(target, 0);
        let new_cell = cvt.cells()[target].next_invisible(0x3000);
        assert_eq!(new_cell.head_cv(), 2);
        cvt.cells_mut()[target] = new_cell;
        // While invisible, readers still see v20 and learn a commit is in flight.
        let pick = cvt.pick_version_at(100);
        assert_eq!(
            pick,
            VersionPick {
                visible: Some(1),
                newer_committed: false,
                pending: true
            }
        );
        // Next writer must not take the in-flight cell.
        assert_eq!(cvt.cell_for_writer(), 1);
        // Write Visible: commit at 30.
        cvt.cells_mut()[target] = new_cell.with_commit_version(30);
        assert_eq!(
            cvt.visible_version_at(100)
                .map(|(i, c)| (i, c.commit_version())),
            Some((0, 30))
        );
        assert_eq!(cvt.visible_version_at(25).map(|(i, _)| i), Some(1));
        // The bytes at commit_version_offset are the commit version.
        let off = Cvt::<2>::commit_version_offset(0).unwrap();
        assert_eq!(cvt.as_bytes()[off..off + 8], 30u64.to_le_bytes());
    }

    #[test]
    fn free_cell_first() {
        let mut cvt = Cvt::<3>::new(CvtHeader::new(1, 1, 8));
        assert_eq!(cvt.cell_for_writer(), 0);
        cvt.cells_mut()[0] = CvtCell::new(0, 0x10, 5);
        assert_eq!(cvt.cell_for_writer(), 1);
        cvt.cells_mut()[1] = CvtCell::new(0, 0x20, 3);
        assert_eq!(cvt.cell_for_writer(), 2);
        cvt.cells_mut()[2] = CvtCell::new(0, 0x30, 9);
        assert_eq!(cvt.cell_for_writer(), 1);
        assert_eq!(cvt.reclaimable_before(6), 0b011);
        assert_eq!(cvt.reclaimable_before(100), 0b011); // never the newest (cell 2)
        assert_eq!(cvt.reclaimable_before(4), 0b010);
    }

    #[test]
    fn torn_cell_and_record_detected() {
        let cvt = two_versions();
        assert!(cvt.is_consistent());
        let mut bytes = cvt.as_bytes().to_vec();
        // A WRITE of cell 1 (offset 48..80) landed its first line (..64) only: head CV new.
        bytes[48] = 2;
        let torn = Cvt::<2>::parse(&bytes).unwrap();
        assert!(!torn.is_consistent());
        assert!(!torn.cells()[1].is_consistent());

        // Record image check against the cell's CV.
        let cell = cvt.cells()[0];
        let payload = [7u8; 40];
        let mut image = vec![0u8; cvt.header().record_image_len()];
        cacheline::stamp(&payload, cell.head_cv(), &mut image).unwrap();
        assert!(cell.matches_record(&image));
        cacheline::stamp(&payload, 9, &mut image).unwrap();
        assert!(!cell.matches_record(&image));
    }

    #[test]
    fn parse_errors() {
        let cvt = two_versions();
        let bytes = cvt.as_bytes();
        assert_eq!(Cvt::<2>::parse(bytes), Ok(&cvt));
        assert_eq!(
            Cvt::<2>::parse(&bytes[..79]),
            Err(LayoutError::TooShort {
                needed: 80,
                got: 79
            })
        );
        let mut long = bytes.to_vec();
        long.push(0);
        assert_eq!(
            Cvt::<2>::parse(&long),
            Err(LayoutError::TooLong { max: 80, got: 81 })
        );
        let mut bad = bytes.to_vec();
        bad[16 + 1] = 2; // cell 0 valid byte
        assert_eq!(
            Cvt::<2>::parse(&bad),
            Err(LayoutError::InvalidField {
                field: "cvt cell valid"
            })
        );
    }

    #[derive(Debug, Clone)]
    struct Cells(Vec<(bool, u8, u64, u64)>);

    impl Arbitrary for Cells {
        fn arbitrary(g: &mut Gen) -> Self {
            Cells(
                (0..4)
                    .map(|_| {
                        let version = if bool::arbitrary(g) {
                            INVISIBLE
                        } else {
                            u64::from(u16::arbitrary(g))
                        };
                        (
                            bool::arbitrary(g),
                            u8::arbitrary(g),
                            u64::arbitrary(g),
                            version,
                        )
                    })
                    .collect(),
            )
        }
    }

    fn build(cells: &Cells) -> Cvt<4> {
        let mut cvt = Cvt::<4>::new(CvtHeader::new(7, 1, 100));
        for (slot, &(valid, cv, addr, version)) in cvt.cells_mut().iter_mut().zip(&cells.0) {
            *slot = if valid {
                CvtCell::new(cv, addr, version)
            } else {
                CvtCell::FREE
            };
        }
        cvt
    }

    #[quickcheck]
    fn header_and_cell_round_trip(
        key: u64,
        table: u32,
        len: u32,
        cv: u8,
        addr: u64,
        version: u64,
    ) -> bool {
        let header = CvtHeader::new(key, table, len);
        let cell = CvtCell::new(cv, addr, version);
        let h2 = CvtHeader::try_read_from_bytes(header.as_bytes()).unwrap();
        let c2 = CvtCell::try_read_from_bytes(cell.as_bytes()).unwrap();
        h2 == header
            && (h2.key(), h2.table_id(), h2.record_len()) == (key, table, len)
            && c2 == cell
            && (
                c2.head_cv(),
                c2.tail_cv(),
                c2.address(),
                c2.commit_version(),
            ) == (cv, cv, addr, version)
            && c2.is_valid()
    }

    #[quickcheck]
    fn pick_matches_definition(cells: Cells, t_start: u16) -> bool {
        let t_start = u64::from(t_start);
        let cvt = build(&cells);
        let pick = cvt.pick_version_at(t_start);
        let committed = || cvt.cells().iter().filter(|c| c.is_committed());
        let expected_best = committed()
            .map(CvtCell::commit_version)
            .filter(|&v| v < t_start)
            .max();
        let picked = pick.visible.map(|i| cvt.cells()[i].commit_version());
        picked == expected_best
            && pick.visible.is_none_or(|i| cvt.cells()[i].is_committed())
            && pick.newer_committed == committed().any(|c| c.commit_version() >= t_start)
            && pick.pending
                == cvt
                    .cells()
                    .iter()
                    .any(|c| c.is_valid() && c.commit_version() == INVISIBLE)
    }

    #[quickcheck]
    fn writer_takes_free_or_oldest(cells: Cells) -> bool {
        let cvt = build(&cells);
        let target = cvt.cell_for_writer();
        let chosen = cvt.cells()[target];
        match cvt.cells().iter().position(|c| !c.is_valid()) {
            Some(free) => target == free,
            None => cvt
                .cells()
                .iter()
                .all(|c| c.commit_version() >= chosen.commit_version()),
        }
    }

    #[quickcheck]
    fn parse_arbitrary_bytes_never_panics(bytes: Vec<u8>) -> bool {
        match Cvt::<2>::parse(&bytes) {
            Ok(cvt) => bytes.len() == 80 && cvt.as_bytes() == &bytes[..],
            Err(_) => true,
        }
    }
}

//! The multi-version store on the MNs (Motor; LOTUS §4.4, §7.1): one *block* per record,
//! found through the MN hash index of `dmem-store`, replicated on the record's primary and
//! backups (distinct MNs of the placement ring) at the same offset.
//!
//! ```text
//! block (64-byte aligned, a multiple of 64 bytes)
//! +0   lock u64        Motor's header lock: 0 free, else the holder (CAS 0 -> holder)
//! +8   floor u64       largest commit version ever evicted or collected (0: none)
//! +16  CvtHeader       key u64, table u32, payload length u32   (layout::cvt)
//! +32  CvtCell[N]      32 B each: CVs, valid, image address, commit version
//! ...  pad to 64
//! +M   image[0..N]     one cacheline-versioned image per cell (layout::cacheline),
//!                      each 64-byte aligned: payload = writer u64, flags u64, value
//! ```
//!
//! Reading a record is one READ of the first `32 + 32 N` bytes (the *meta*: lock, floor and
//! CVT), then one READ of the image of the version chosen. Cell `i` always points at image
//! `i`; a writer takes a free cell, else overwrites the oldest (LOTUS §7.1, lightweight GC)
//! and raises `floor` to the evicted version, so a reader whose snapshot needed it aborts
//! instead of taking the record as absent; cells older than the GC threshold are cleared
//! when a writer sees them. Each image carries its cell's CV, so a reader detects an image
//! overwritten between its two READs.
//!
//! # Two version layouts ([`VersionLayout`])
//!
//! * [`VersionLayout::FullRecords`] (above, LOTUS §4.4 "RDMA-Friendly Memory Store"): every
//!   version is a full image; any version is one READ. LOTUS uses it.
//! * [`VersionLayout::Deltas`] (Motor's own layout, its code's `txn/process/commit.cc` and
//!   `read_value.cc`): one *full value* holding the newest version, plus per cell a *delta*
//!   holding the attributes the version it replaced had (LOTUS §4.4: "one full record along
//!   with delta values"). A commit WRITEs the full value, the delta, the cell — three WRITEs
//!   per replica where full records need two — and reading an older version READs the full
//!   value and the deltas of every newer cell in one doorbell, then patches backwards.
//!
//! ```text
//! block (deltas)
//! +0   lock, floor, CVT header, cells     as above; cell i points at delta i
//! +M   full value      cacheline-versioned: writer u64, flags u64, commit u64, value
//! ...  delta[0..N]     cacheline-versioned: commit u64, previous writer u64, flags u64,
//!                      attribute bitmap u64, the previous version's changed attributes
//! ```
//!
//! Attributes are the value's 8-byte words (wider for values over 512 bytes, so that a
//! 64-bit bitmap covers them): dmem's workloads hand the store opaque values, where Motor
//! declares per-table columns. Each delta slot is as large as a value and is written
//! whole (its unchanged attributes zero), so a delta WRITE carries up to a value's bytes
//! where Motor's carries only the changed attributes: the same WRITEs, more bytes for wide
//! values (the store's workloads are IOPS-bound on the MN NIC, not bandwidth-bound).
//!
//! Deviations from Motor's header (table id, lock, key, remote offsets, value size,
//! inserted flag) and cell (anchors, valid, version, attribute offset/bitmap): the image
//! and delta offsets are implied by the cell index, "inserted" is a committed cell, the
//! attribute bitmap sits in the delta instead of the cell, and Motor's per-thread delta
//! region is a per-record delta slot per cell; each image stores its installer's
//! transaction id so that histories name who wrote what a reader saw.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use dmem_layout::cacheline::{self, LineVersion};
use dmem_layout::cvt::{CvtCell, CvtHeader};
use dmem_store::{
    BUCKET_SLOTS, ItemLoc, LoadIndex, Store, StoreConfig, StoreError, TableDemand,
    index_slot_bytes, slot_offset,
};
use dmem_txn::{Key, TableId, TxnId};
use dmem_verbs::NodeId;
use zerocopy::{IntoBytes, TryFromBytes};

/// Offset of the lock word in a block.
pub const LOCK_OFFSET: u64 = 0;
/// Offset of the floor word in a block.
pub const FLOOR_OFFSET: u64 = 8;
/// Offset of the CVT header in a block.
pub const CVT_OFFSET: usize = 16;
/// Bytes of a CVT cell.
pub const CELL_LEN: usize = 32;
/// Bytes an image's payload carries before the value: installer id, flags.
pub const PAYLOAD_PREFIX: usize = 16;
/// Bytes a full value's payload carries before the value in the delta layout: installer
/// id, flags, commit version.
pub const VALUE_PREFIX: usize = 24;
/// Bytes a delta's payload carries before the attributes: commit version, previous
/// installer, flags, attribute bitmap.
pub const DELTA_PREFIX: usize = 32;
/// Flag bit of a tombstone (a committed delete); in a delta: the previous version was
/// absent or a tombstone.
const DELETED: u64 = 1;

/// How a record's versions sit in its block (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum VersionLayout {
    /// A full image per version (LOTUS §4.4).
    #[default]
    FullRecords,
    /// One full value (the newest version) plus an attribute delta per version (Motor).
    Deltas,
}

/// Versions per record Motor uses for a workload (LOTUS §8 runs Motor with these; TPC-C,
/// micro-benchmarks and anything else: 4).
#[must_use]
pub fn cells_for_workload(workload: Option<&str>) -> usize {
    match workload {
        Some("tatp") => 2,
        Some("smallbank") => 3,
        _ => 4,
    }
}

/// The shape of one table's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockShape {
    /// Cells (versions) per record.
    pub cells: usize,
    /// Bytes of a value.
    pub value_len: usize,
    /// Full records or deltas.
    pub layout: VersionLayout,
}

impl BlockShape {
    /// A full-records shape of `cells` cells (at least 1) for `value_len`-byte values.
    #[must_use]
    pub fn new(cells: usize, value_len: usize) -> Self {
        Self {
            cells: cells.max(1),
            value_len,
            layout: VersionLayout::FullRecords,
        }
    }

    /// The same shape with `layout`.
    #[must_use]
    pub fn with_layout(mut self, layout: VersionLayout) -> Self {
        self.layout = layout;
        self
    }

    fn deltas(&self) -> bool {
        self.layout == VersionLayout::Deltas
    }

    /// Bytes of one attribute in the delta layout: 8, or wider for values over 512 bytes
    /// so that 64 attributes cover the value.
    #[must_use]
    pub fn attr_width(&self) -> usize {
        self.value_len.div_ceil(64).next_multiple_of(8).max(8)
    }

    /// Bytes of the meta (lock, floor, CVT): what one READ fetches.
    #[must_use]
    pub fn meta_len(&self) -> usize {
        CVT_OFFSET + 16 + CELL_LEN * self.cells
    }

    /// Bytes of what a cell points at: a version's image (full records) or a delta.
    #[must_use]
    pub fn image_len(&self) -> usize {
        if self.deltas() {
            cacheline::image_len(DELTA_PREFIX + self.value_len)
        } else {
            cacheline::image_len(PAYLOAD_PREFIX + self.value_len)
        }
    }

    /// Bytes of the full value (delta layout; for full records, an image).
    #[must_use]
    pub fn value_image_len(&self) -> usize {
        if self.deltas() {
            cacheline::image_len(VALUE_PREFIX + self.value_len)
        } else {
            self.image_len()
        }
    }

    /// Offset of the full value in the block (delta layout).
    #[must_use]
    pub fn value_offset(&self) -> usize {
        self.meta_span()
    }

    fn meta_span(&self) -> usize {
        self.meta_len().next_multiple_of(64)
    }

    fn image_stride(&self) -> usize {
        self.image_len().next_multiple_of(64)
    }

    fn value_stride(&self) -> usize {
        if self.deltas() {
            self.value_image_len().next_multiple_of(64)
        } else {
            0
        }
    }

    /// Bytes of a block (a multiple of 64).
    #[must_use]
    pub fn block_len(&self) -> usize {
        self.meta_span() + self.value_stride() + self.cells * self.image_stride()
    }

    /// Offset of cell `i` in the block.
    #[must_use]
    pub fn cell_offset(&self, i: usize) -> usize {
        CVT_OFFSET + 16 + CELL_LEN * i
    }

    /// Offset in the block of what cell `i` points at: image `i` (full records) or delta
    /// `i`.
    #[must_use]
    pub fn image_offset(&self, i: usize) -> usize {
        self.meta_span() + self.value_stride() + i * self.image_stride()
    }
}

/// The per-table block shapes of a deployment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shapes(HashMap<TableId, BlockShape>);

impl Shapes {
    /// `cells` cells for every table of `tables`.
    #[must_use]
    pub fn uniform(tables: &[TableDemand], cells: usize) -> Self {
        Self(
            tables
                .iter()
                .map(|t| (t.id, BlockShape::new(cells, t.value_len)))
                .collect(),
        )
    }

    /// The same shapes with `layout`.
    #[must_use]
    pub fn with_layout(mut self, layout: VersionLayout) -> Self {
        for s in self.0.values_mut() {
            s.layout = layout;
        }
        self
    }

    /// The shape of `table`.
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`].
    pub fn get(&self, table: TableId) -> Result<BlockShape, StoreError> {
        self.0
            .get(&table)
            .copied()
            .ok_or(StoreError::UnknownTable(table.0))
    }
}

/// The store configuration for `tables` on `mns` MNs with `replicas` replicas: the index of
/// `dmem-store` with each record slot a block. No log regions (Motor keeps none, see the
/// crate docs).
#[must_use]
pub fn store_config(
    mns: u16,
    tables: &[TableDemand],
    shapes: &Shapes,
    replicas: u16,
    slack: u64,
    exact: bool,
) -> StoreConfig {
    store_config_with_logs(mns, tables, shapes, replicas, slack, exact, 0, 0)
}

/// [`store_config`] plus one log region of `log_region_bytes` per coordinator on every MN
/// (LOTUS §5.1 writes a commit log there; Motor keeps none).
#[allow(clippy::too_many_arguments)]
#[must_use]
pub fn store_config_with_logs(
    mns: u16,
    tables: &[TableDemand],
    shapes: &Shapes,
    replicas: u16,
    slack: u64,
    exact: bool,
    coordinators: u16,
    log_region_bytes: u32,
) -> StoreConfig {
    let layout = if exact {
        StoreConfig::for_exact_tables
    } else {
        StoreConfig::for_tables
    };
    let mut cfg =
        layout(mns, tables, coordinators, log_region_bytes, slack).replicas(replicas.min(mns));
    for t in tables {
        if let Ok(shape) = shapes.get(t.id) {
            cfg = cfg.with_item_len(t.id, shape.block_len());
        }
    }
    cfg
}

/// Where the MN bytes of a configuration go (computed before anything is allocated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Footprint {
    /// Bytes every MN region needs ([`StoreConfig::bytes_per_mn`]).
    pub bytes_per_mn: u64,
    /// Bytes of index buckets per MN.
    pub index_bytes: u64,
    /// Bytes of blocks over all partitions (slots included whether used or not; a pooled
    /// table's whole pool).
    pub block_bytes: u64,
    /// Bytes the loaded records' blocks occupy over all replicas (the data set itself).
    pub loaded_bytes: u64,
}

/// The footprint of `cfg` for `tables`.
///
/// # Errors
/// [`StoreError`] if `cfg` cannot be laid out.
pub fn footprint(cfg: &StoreConfig, tables: &[TableDemand]) -> Result<Footprint, StoreError> {
    let bytes_per_mn = cfg.bytes_per_mn()?;
    let mut f = Footprint {
        bytes_per_mn,
        ..Footprint::default()
    };
    let mns = u64::from(cfg.mns);
    for t in &cfg.tables {
        let buckets = u64::from(t.buckets_per_partition.max(1)) * mns;
        let item = t.item_len.unwrap_or(0) as u64;
        f.index_bytes += buckets * t.bucket_len() as u64;
        // Blocks per partition: one per slot, or a pooled table's pool (loader's records
        // and every coordinator's insert share).
        let blocks = match t.pool {
            Some(pool) => (pool.loaded + pool.per_coordinator * u64::from(cfg.coordinators)) * mns,
            None => buckets * BUCKET_SLOTS as u64,
        };
        f.block_bytes += blocks * item;
        if let Some(d) = tables.iter().find(|d| d.id == t.id) {
            f.loaded_bytes += d.expected_records * item * u64::from(cfg.replicas);
        }
    }
    Ok(f)
}

/// A parsed meta: lock, floor, key and the cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// The lock word (0: free).
    pub lock: u64,
    /// The largest evicted commit version (0: none evicted).
    pub floor: u64,
    /// The key in the CVT header (0 and table 0 for a block never written).
    pub key: u64,
    /// The cells.
    pub cells: Vec<CvtCell>,
}

impl Meta {
    /// The meta of an empty block (no version).
    #[must_use]
    pub fn empty(cells: usize) -> Self {
        Self {
            lock: 0,
            floor: 0,
            key: 0,
            cells: vec![CvtCell::FREE; cells],
        }
    }

    /// Parses the first [`BlockShape::meta_len`] bytes of a block; `None` if a cell's valid
    /// byte is corrupt or the bytes are short.
    #[must_use]
    pub fn parse(bytes: &[u8], shape: BlockShape) -> Option<Self> {
        if bytes.len() < shape.meta_len() {
            return None;
        }
        let word = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap_or([0; 8]));
        let header = CvtHeader::try_read_from_bytes(&bytes[CVT_OFFSET..CVT_OFFSET + 16]).ok()?;
        let mut cells = Vec::with_capacity(shape.cells);
        for i in 0..shape.cells {
            let o = shape.cell_offset(i);
            cells.push(CvtCell::try_read_from_bytes(&bytes[o..o + CELL_LEN]).ok()?);
        }
        Some(Self {
            lock: word(0),
            floor: word(8),
            key: header.key(),
            cells,
        })
    }

    /// Whether every cell was read whole (head and tail CVs agree).
    #[must_use]
    pub fn is_consistent(&self) -> bool {
        self.cells.iter().all(CvtCell::is_consistent)
    }
}

/// The bytes from [`FLOOR_OFFSET`] to the end of the meta: floor, CVT header, cells (what a
/// writer WRITEs when it clears or evicts cells; the lock word is not touched).
#[must_use]
pub fn encode_meta_tail(
    key: u64,
    table: TableId,
    shape: BlockShape,
    floor: u64,
    cells: &[CvtCell],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(shape.meta_len() - 8);
    out.extend_from_slice(&floor.to_le_bytes());
    let payload = u32::try_from(PAYLOAD_PREFIX + shape.value_len).unwrap_or(u32::MAX);
    out.extend_from_slice(CvtHeader::new(key, table.0, payload).as_bytes());
    for c in cells {
        out.extend_from_slice(c.as_bytes());
    }
    out
}

/// The installer id stored in an image: `(coordinator + 1) << 40 | seq`, 0 for loaded
/// records.
#[must_use]
pub fn pack_writer(id: TxnId) -> u64 {
    ((u64::from(id.coordinator.0) + 1) << 40) | (id.seq & ((1 << 40) - 1))
}

/// The transaction [`pack_writer`] packed, `None` for 0.
#[must_use]
pub fn unpack_writer(w: u64) -> Option<TxnId> {
    (w != 0).then(|| TxnId {
        coordinator: dmem_txn::CoordinatorId(u32::try_from((w >> 40) - 1).unwrap_or(u32::MAX)),
        seq: w & ((1 << 40) - 1),
    })
}

/// One version's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// Its installer ([`pack_writer`]), 0 for loaded records.
    pub writer: u64,
    /// The value; `None` for a tombstone.
    pub value: Option<Vec<u8>>,
}

/// The image of a version: `value` (`None`: a tombstone, zero-filled) written by `writer`,
/// every line stamped `cv`.
#[must_use]
pub fn encode_image(
    shape: BlockShape,
    writer: u64,
    value: Option<&[u8]>,
    cv: LineVersion,
) -> Vec<u8> {
    let mut payload = vec![0u8; PAYLOAD_PREFIX + shape.value_len];
    payload[..8].copy_from_slice(&writer.to_le_bytes());
    let flags = if value.is_none() { DELETED } else { 0 };
    payload[8..16].copy_from_slice(&flags.to_le_bytes());
    if let Some(v) = value {
        let n = v.len().min(shape.value_len);
        payload[PAYLOAD_PREFIX..PAYLOAD_PREFIX + n].copy_from_slice(&v[..n]);
    }
    let mut image = vec![0u8; shape.image_len()];
    // The buffer is exactly image_len(payload), so stamping cannot fail.
    let _ = cacheline::stamp(&payload, cv, &mut image);
    image
}

/// Decodes an image READ for `cell`: `None` if it is torn or belongs to another version
/// than the cell (its CVs differ from the cell's).
#[must_use]
pub fn decode_image(shape: BlockShape, cell: &CvtCell, image: &[u8]) -> Option<Payload> {
    if !cell.matches_record(image) {
        return None;
    }
    let mut payload = vec![0u8; PAYLOAD_PREFIX + shape.value_len];
    cacheline::extract(image, &mut payload).ok()?;
    let word = |o: usize| u64::from_le_bytes(payload[o..o + 8].try_into().unwrap_or([0; 8]));
    let (writer, flags) = (word(0), word(8));
    Some(Payload {
        writer,
        value: (flags & DELETED == 0).then(|| payload[PAYLOAD_PREFIX..].to_vec()),
    })
}

/// The full value of the delta layout: `value` (`None`: a tombstone) of version `commit`
/// written by `writer`, every line stamped `cv` (the CV of the newest cell).
#[must_use]
pub fn encode_value(
    shape: BlockShape,
    writer: u64,
    commit: u64,
    value: Option<&[u8]>,
    cv: LineVersion,
) -> Vec<u8> {
    let mut payload = vec![0u8; VALUE_PREFIX + shape.value_len];
    payload[..8].copy_from_slice(&writer.to_le_bytes());
    let flags = if value.is_none() { DELETED } else { 0 };
    payload[8..16].copy_from_slice(&flags.to_le_bytes());
    payload[16..24].copy_from_slice(&commit.to_le_bytes());
    if let Some(v) = value {
        let n = v.len().min(shape.value_len);
        payload[VALUE_PREFIX..VALUE_PREFIX + n].copy_from_slice(&v[..n]);
    }
    let mut image = vec![0u8; shape.value_image_len()];
    // The buffer is exactly image_len(payload), so stamping cannot fail.
    let _ = cacheline::stamp(&payload, cv, &mut image);
    image
}

/// The delta installed with version `commit` (stamped with its cell's CV `cv`): what
/// turns `new` (the value `commit` installs) back into `prev`, the version it replaced,
/// written by `prev_writer` (`None`: absent or a tombstone). Attributes that differ are
/// kept (a tombstone counts as zeros).
#[must_use]
pub fn encode_delta(
    shape: BlockShape,
    commit: u64,
    prev_writer: u64,
    prev: Option<&[u8]>,
    new: Option<&[u8]>,
    cv: LineVersion,
) -> Vec<u8> {
    let mut payload = vec![0u8; DELTA_PREFIX + shape.value_len];
    payload[..8].copy_from_slice(&commit.to_le_bytes());
    payload[8..16].copy_from_slice(&prev_writer.to_le_bytes());
    let mut bitmap = 0u64;
    match prev {
        None => payload[16..24].copy_from_slice(&DELETED.to_le_bytes()),
        Some(prev) => {
            let w = shape.attr_width();
            let mut at = DELTA_PREFIX;
            for (a, old) in prev.chunks(w).enumerate().take(64) {
                let from = a * w;
                let cur = new.and_then(|n| n.get(from..from + old.len()));
                let changed = match cur {
                    Some(cur) => cur != old,
                    None => old.iter().any(|&b| b != 0),
                };
                if changed && at + old.len() <= payload.len() {
                    bitmap |= 1 << a;
                    payload[at..at + old.len()].copy_from_slice(old);
                    at += old.len();
                }
            }
        }
    }
    payload[24..32].copy_from_slice(&bitmap.to_le_bytes());
    let mut image = vec![0u8; shape.image_len()];
    // The buffer is exactly image_len(payload), so stamping cannot fail.
    let _ = cacheline::stamp(&payload, cv, &mut image);
    image
}

/// Committed cells of `meta` newer than cell `i`, newest first: the deltas that lead from
/// the full value back to version `i` (delta layout).
#[must_use]
pub fn newer_cells(meta: &Meta, i: usize) -> Vec<usize> {
    let Some(v) = meta.cells.get(i).map(CvtCell::commit_version) else {
        return Vec::new();
    };
    let mut newer: Vec<usize> = (0..meta.cells.len())
        .filter(|&k| meta.cells[k].is_committed() && meta.cells[k].commit_version() > v)
        .collect();
    newer.sort_by_key(|&k| std::cmp::Reverse(meta.cells[k].commit_version()));
    newer
}

/// The READs (absolute offsets on the record's MN, lengths) that fetch the version of cell
/// `i` of `meta` in the block at `block`, in the order [`decode_version`] takes them: the
/// image (full records), or the full value and the delta of every newer cell (deltas; all
/// in one doorbell, as Motor's `ReadValueRO` does).
#[must_use]
pub fn version_reads(shape: BlockShape, meta: &Meta, block: u64, i: usize) -> Vec<(u64, usize)> {
    match shape.layout {
        VersionLayout::FullRecords => meta
            .cells
            .get(i)
            .map(|c| vec![(c.address(), shape.image_len())])
            .unwrap_or_default(),
        VersionLayout::Deltas => {
            let mut reads = vec![(block + shape.value_offset() as u64, shape.value_image_len())];
            reads.extend(
                newer_cells(meta, i)
                    .into_iter()
                    .map(|k| (meta.cells[k].address(), shape.image_len())),
            );
            reads
        }
    }
}

/// Decodes the READs of [`version_reads`] into the version of cell `i`: `None` if any part
/// is torn or belongs to another version than its cell (a writer overwrote it between the
/// reader's READ of the CVT and this one).
#[must_use]
pub fn decode_version(
    shape: BlockShape,
    meta: &Meta,
    i: usize,
    parts: &[&[u8]],
) -> Option<Payload> {
    if shape.layout == VersionLayout::FullRecords {
        return decode_image(shape, meta.cells.get(i)?, parts.first()?);
    }
    let newer = newer_cells(meta, i);
    let newest = meta.cells.get(*newer.first().unwrap_or(&i))?;
    if parts.len() != newer.len() + 1 || !newest.matches_record(parts[0]) {
        return None;
    }
    let mut payload = vec![0u8; VALUE_PREFIX + shape.value_len];
    cacheline::extract(parts[0], &mut payload).ok()?;
    let word = |p: &[u8], o: usize| u64::from_le_bytes(p[o..o + 8].try_into().unwrap_or([0; 8]));
    if word(&payload, 16) != newest.commit_version() {
        return None;
    }
    let mut writer = word(&payload, 0);
    let mut value = (word(&payload, 8) & DELETED == 0).then(|| payload[VALUE_PREFIX..].to_vec());
    let w = shape.attr_width();
    for (k, part) in newer.iter().zip(&parts[1..]) {
        let cell = &meta.cells[*k];
        if !cell.matches_record(part) {
            return None;
        }
        let mut d = vec![0u8; DELTA_PREFIX + shape.value_len];
        cacheline::extract(part, &mut d).ok()?;
        if word(&d, 0) != cell.commit_version() {
            return None;
        }
        writer = word(&d, 8);
        if word(&d, 16) & DELETED != 0 {
            value = None;
            continue;
        }
        let bitmap = word(&d, 24);
        let mut v = value.unwrap_or_else(|| vec![0u8; shape.value_len]);
        let mut at = DELTA_PREFIX;
        for a in (0..64).filter(|a| bitmap & (1 << a) != 0) {
            let from = a * w;
            let len = w.min(shape.value_len.checked_sub(from)?);
            v[from..from + len].copy_from_slice(d.get(at..at + len)?);
            at += len;
        }
        value = Some(v);
    }
    Some(Payload { writer, value })
}

/// What a commit WRITEs into a record's block (offsets in the block, bytes; the same on
/// every replica) besides its CVT: the new version's image (full records), or the full
/// value and the delta back to the version it replaces (deltas).
#[allow(clippy::too_many_arguments)]
#[must_use]
pub fn install_images(
    shape: BlockShape,
    cell: usize,
    cv: LineVersion,
    commit: u64,
    writer: u64,
    value: Option<&[u8]>,
    prev_writer: u64,
    prev: Option<&[u8]>,
) -> Vec<(u64, Vec<u8>)> {
    match shape.layout {
        VersionLayout::FullRecords => vec![(
            shape.image_offset(cell) as u64,
            encode_image(shape, writer, value, cv),
        )],
        VersionLayout::Deltas => vec![
            (
                shape.value_offset() as u64,
                encode_value(shape, writer, commit, value, cv),
            ),
            (
                shape.image_offset(cell) as u64,
                encode_delta(shape, commit, prev_writer, prev, value, cv),
            ),
        ],
    }
}

/// Writes initial records (version 0, no installer) into every replica out of band, and
/// their index slots.
#[derive(Debug)]
pub struct MvccLoader {
    store: Rc<Store>,
    shapes: Rc<Shapes>,
    loaded: Rc<RefCell<LoadIndex>>,
}

impl MvccLoader {
    /// A loader for an empty (zeroed) store.
    #[must_use]
    pub fn new(store: Rc<Store>, shapes: Rc<Shapes>) -> Self {
        Self {
            store,
            shapes,
            loaded: Rc::default(),
        }
    }

    /// The keys loaded so far and where, shared (what a warm
    /// [`AddressCache`](dmem_store::AddressCache) answers from).
    #[must_use]
    pub fn loaded(&self) -> Rc<RefCell<LoadIndex>> {
        Rc::clone(&self.loaded)
    }

    /// Loads one record through `write(node, offset, bytes)`.
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`], [`StoreError::ValueSize`], [`StoreError::BucketFull`],
    /// [`StoreError::DuplicateKey`].
    pub fn load(
        &mut self,
        table: TableId,
        key: Key,
        value: &[u8],
        mut write: impl FnMut(NodeId, u64, &[u8]),
    ) -> Result<ItemLoc, StoreError> {
        let shape = self.shapes.get(table)?;
        if value.len() != shape.value_len {
            return Err(StoreError::ValueSize {
                table: table.0,
                expected: shape.value_len,
                got: value.len(),
            });
        }
        let loc = self.loaded.borrow_mut().place(&self.store, table, key)?;
        let (bucket, slot) = (loc.bucket, loc.slot);
        let mut cells = vec![CvtCell::FREE; shape.cells];
        cells[0] = CvtCell::new(0, loc.offset + shape.image_offset(0) as u64, 0);
        let meta = encode_meta_tail(key.0, table, shape, 0, &cells);
        // Version 0 replaces nothing: no delta is ever read for it.
        let (image_at, image) = match shape.layout {
            VersionLayout::FullRecords => (
                shape.image_offset(0),
                encode_image(shape, 0, Some(value), 0),
            ),
            VersionLayout::Deltas => (
                shape.value_offset(),
                encode_value(shape, 0, 0, Some(value), 0),
            ),
        };
        let packed =
            dmem_layout::record::RemoteAddr::new(bucket.partition, loc.offset).map_err(|_| {
                StoreError::TooLarge {
                    needed: loc.offset,
                    have: dmem_layout::record::RemoteAddr::MAX_OFFSET,
                    node: self.store.mn_node(bucket.partition),
                }
            })?;
        let slot_bytes = index_slot_bytes(key.0, packed);
        for mn in self.store.replicas(bucket.partition) {
            let node = self.store.mn_node(mn);
            write(node, loc.offset + FLOOR_OFFSET, &meta);
            write(node, loc.offset + image_at as u64, &image);
            write(node, bucket.offset + slot_offset(slot), &slot_bytes);
        }
        Ok(loc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_verbs::{MemoryRegion, RKey};

    fn demand(id: u32, value_len: usize, records: u64) -> TableDemand {
        TableDemand {
            id: TableId(id),
            value_len,
            expected_records: records,
            grows: false,
        }
    }

    #[test]
    fn shapes_are_line_aligned() {
        for cells in [2, 3, 4] {
            for value_len in [8, 40, 672] {
                let s = BlockShape::new(cells, value_len);
                assert_eq!(s.block_len() % 64, 0);
                assert_eq!(s.meta_len(), 32 + 32 * cells);
                for i in 0..cells {
                    assert_eq!(s.image_offset(i) % 64, 0);
                    assert!(s.image_offset(i) >= s.meta_len());
                    // a cell never straddles a line
                    assert_eq!(s.cell_offset(i) / 64, (s.cell_offset(i) + 31) / 64);
                }
            }
        }
        // SmallBank: 3 cells of 8-byte accounts is 128 B of meta and three 64 B images.
        assert_eq!(BlockShape::new(3, 8).block_len(), 128 + 3 * 64);
        assert_eq!(cells_for_workload(Some("tatp")), 2);
        assert_eq!(cells_for_workload(Some("smallbank")), 3);
        assert_eq!(cells_for_workload(Some("tpcc")), 4);
        assert_eq!(cells_for_workload(None), 4);
    }

    #[test]
    fn image_round_trip_and_mismatch() {
        let s = BlockShape::new(2, 40);
        let cell = CvtCell::new(3, 0x1000, 77);
        let img = encode_image(s, 9, Some(&[5; 40]), 3);
        assert_eq!(
            decode_image(s, &cell, &img),
            Some(Payload {
                writer: 9,
                value: Some(vec![5; 40])
            })
        );
        let stale = encode_image(s, 9, Some(&[5; 40]), 4);
        assert_eq!(decode_image(s, &cell, &stale), None);
        let tomb = encode_image(s, 9, None, 3);
        assert_eq!(decode_image(s, &cell, &tomb).unwrap().value, None);
        let id = TxnId {
            coordinator: dmem_txn::CoordinatorId(7),
            seq: 12,
        };
        assert_eq!(unpack_writer(pack_writer(id)), Some(id));
        assert_eq!(unpack_writer(0), None);
    }

    #[test]
    fn loader_writes_every_replica_and_sizing_is_exact() {
        let tables = [demand(1, 8, 1000), demand(2, 40, 100)];
        let shapes = Shapes::uniform(&tables, 3);
        let cfg = store_config(3, &tables, &shapes, 3, 2, false);
        let fp = footprint(&cfg, &tables).unwrap();
        let bytes = fp.bytes_per_mn;
        assert!(fp.index_bytes + fp.block_bytes <= bytes);
        assert_eq!(
            fp.loaded_bytes,
            3 * (1000 * BlockShape::new(3, 8).block_len() as u64
                + 100 * BlockShape::new(3, 40).block_len() as u64)
        );
        let regions: Vec<MemoryRegion> = (0..3)
            .map(|i| MemoryRegion {
                node: NodeId(i),
                rkey: RKey(1),
                len: bytes,
            })
            .collect();
        let store = Rc::new(Store::new(cfg.clone(), regions.clone()).unwrap());
        let too_small: Vec<_> = regions
            .iter()
            .map(|r| MemoryRegion {
                len: bytes - 1,
                ..*r
            })
            .collect();
        assert!(Store::new(cfg, too_small).is_err());
        let mut mem = vec![vec![0u8; bytes as usize]; 3];
        let mut loader = MvccLoader::new(Rc::clone(&store), Rc::new(shapes.clone()));
        let mut write = |n: NodeId, off: u64, b: &[u8]| {
            let off = off as usize;
            mem[usize::from(n.0)][off..off + b.len()].copy_from_slice(b);
        };
        let loc = loader
            .load(TableId(2), Key(42), &[7; 40], &mut write)
            .unwrap();
        assert!(matches!(
            loader.load(TableId(2), Key(42), &[7; 40], &mut write),
            Err(StoreError::DuplicateKey { .. })
        ));
        assert_eq!(loc.offset % 64, 0);
        let shape = shapes.get(TableId(2)).unwrap();
        for mn in store.replicas(loc.bucket.partition) {
            let m = &mem[usize::from(mn)];
            let off = loc.offset as usize;
            let meta = Meta::parse(&m[off..off + shape.meta_len()], shape).unwrap();
            assert_eq!((meta.lock, meta.floor, meta.key), (0, 0, 42));
            let cell = meta.cells[0];
            assert!(cell.is_committed() && cell.commit_version() == 0);
            assert!(!meta.cells[1].is_valid());
            let a = cell.address() as usize;
            let p = decode_image(shape, &cell, &m[a..a + shape.image_len()]).unwrap();
            assert_eq!(p.value, Some(vec![7; 40]));
        }
    }

    /// A sparse table (200 records in a key space of 100 000) pooled as `dmem-store` pools
    /// FORD's: its blocks sit in a pool per partition, far fewer than one per key, and a
    /// loaded record's slot names its pool block, whose CVT and image read back.
    #[test]
    fn a_sparse_table_is_pooled_and_its_slots_name_their_blocks() {
        let tables = [TableDemand {
            grows: true,
            ..demand(1, 40, 200)
        }];
        let shapes = Shapes::uniform(&tables, 2);
        let in_slots = store_config(3, &tables, &shapes, 3, 2, false)
            .coordinators(4)
            .with_direct_indexes(&[(TableId(1), 100_000)]);
        let cfg = in_slots
            .clone()
            .with_sparse_indexes(&tables, &[(TableId(1), 100_000)]);
        assert!(cfg.tables[0].pool.is_some());
        let (fp, fp_slots) = (
            footprint(&cfg, &tables).unwrap(),
            footprint(&in_slots, &tables).unwrap(),
        );
        assert!(
            fp.block_bytes * 10 < fp_slots.block_bytes,
            "{fp:?} vs {fp_slots:?}"
        );
        assert!(fp.index_bytes + fp.block_bytes <= fp.bytes_per_mn * 3);
        let bytes = fp.bytes_per_mn;
        let regions: Vec<MemoryRegion> = (0..3)
            .map(|i| MemoryRegion {
                node: NodeId(i),
                rkey: RKey(1),
                len: bytes,
            })
            .collect();
        let store = Rc::new(Store::new(cfg, regions).unwrap());
        let mut mem = vec![vec![0u8; bytes as usize]; 3];
        let mut loader = MvccLoader::new(Rc::clone(&store), Rc::new(shapes.clone()));
        let shape = shapes.get(TableId(1)).unwrap();
        for key in [99_999, 3, 50_000] {
            let loc = loader
                .load(TableId(1), Key(key), &[key as u8; 40], |n, off, b| {
                    let off = off as usize;
                    mem[usize::from(n.0)][off..off + b.len()].copy_from_slice(b);
                })
                .unwrap();
            assert_eq!(loc.offset % 64, 0);
            for mn in store.replicas(loc.bucket.partition) {
                let m = &mem[usize::from(mn)];
                let b = loc.bucket.offset as usize;
                let bucket = &m[b..b + loc.bucket.read_len() as usize];
                let found = store.item_in_bucket(loc.bucket, loc.slot, bucket).unwrap();
                assert_eq!(found, loc);
                let off = loc.offset as usize;
                let meta = Meta::parse(&m[off..off + shape.meta_len()], shape).unwrap();
                assert_eq!(meta.key, key);
                let cell = meta.cells[0];
                let a = cell.address() as usize;
                let p = decode_image(shape, &cell, &m[a..a + shape.image_len()]).unwrap();
                assert_eq!(p.value, Some(vec![key as u8; 40]));
            }
        }
    }

    /// Replays `values` (one per commit; `None` a delete) into one block in memory the way
    /// a Motor commit does, and after every commit decodes every version the CVT still
    /// holds: each must be the value that version installed, and its installer.
    fn replay(layout: VersionLayout, cells: usize, value_len: usize, values: &[Option<Vec<u8>>]) {
        let shape = BlockShape::new(cells, value_len).with_layout(layout);
        let block = 4096u64;
        let mut mem = vec![0u8; block as usize + shape.block_len()];
        let write = |mem: &mut Vec<u8>, off: u64, b: &[u8]| {
            let off = off as usize;
            mem[off..off + b.len()].copy_from_slice(b);
        };
        // Version 0 as the loader writes it.
        let first = vec![0xA5; value_len];
        let mut cells0 = vec![CvtCell::FREE; cells];
        cells0[0] = CvtCell::new(0, block + shape.image_offset(0) as u64, 0);
        write(
            &mut mem,
            block + FLOOR_OFFSET,
            &encode_meta_tail(7, TableId(1), shape, 0, &cells0),
        );
        let (at, img) = match layout {
            VersionLayout::FullRecords => (
                shape.image_offset(0),
                encode_image(shape, 0, Some(&first), 0),
            ),
            VersionLayout::Deltas => (
                shape.value_offset(),
                encode_value(shape, 0, 0, Some(&first), 0),
            ),
        };
        write(&mut mem, block + at as u64, &img);
        let mut installed: Vec<(u64, u64, Option<Vec<u8>>)> = vec![(0, 0, Some(first))];
        for (n, v) in values.iter().enumerate() {
            let c = 10 * (n as u64 + 1);
            let writer = 100 + n as u64;
            let b = block as usize;
            let meta = Meta::parse(&mem[b..b + shape.meta_len()], shape).unwrap();
            let plan = crate::logic::plan_commit(&meta, shape, block, c, 0);
            let (_, pw, prev) = installed.last().cloned().unwrap();
            let cv = plan.cells[plan.cell].head_cv();
            for (o, bytes) in install_images(
                shape,
                plan.cell,
                cv,
                c,
                writer,
                v.as_deref(),
                pw,
                prev.as_deref(),
            ) {
                write(&mut mem, block + o, &bytes);
            }
            write(
                &mut mem,
                block + FLOOR_OFFSET,
                &encode_meta_tail(7, TableId(1), shape, plan.floor, &plan.cells),
            );
            installed.push((c, writer, v.clone()));
            check_versions(shape, block, &mem, &installed);
        }
    }

    /// Decodes every version the CVT of the block at `block` in `mem` holds: each must be
    /// the value `installed` (commit version, installer, value) says, and its installer.
    fn check_versions(
        shape: BlockShape,
        block: u64,
        mem: &[u8],
        installed: &[(u64, u64, Option<Vec<u8>>)],
    ) {
        let b = block as usize;
        let meta = Meta::parse(&mem[b..b + shape.meta_len()], shape).unwrap();
        for (i, cell) in meta
            .cells
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_committed())
        {
            let parts: Vec<&[u8]> = version_reads(shape, &meta, block, i)
                .into_iter()
                .map(|(at, len)| &mem[at as usize..at as usize + len])
                .collect();
            if shape.layout == VersionLayout::Deltas {
                assert_eq!(parts.len(), 1 + newer_cells(&meta, i).len());
            }
            let got = decode_version(shape, &meta, i, &parts).unwrap();
            let want = installed
                .iter()
                .find(|x| x.0 == cell.commit_version())
                .unwrap();
            assert_eq!(
                (got.writer, got.value),
                (want.1, want.2.clone()),
                "version {}",
                want.0
            );
        }
    }

    fn word_values(seed: u64, len: usize, n: usize) -> Vec<Option<Vec<u8>>> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut cur = vec![0u8; len];
        (0..n)
            .map(|_| {
                let r = next();
                if r % 7 == 0 {
                    return None;
                }
                // Change a few words (or bytes inside one), as updates do.
                for _ in 0..=(r % 3) {
                    let at = (next() as usize) % len;
                    cur[at] = cur[at].wrapping_add((next() % 255) as u8 + 1);
                }
                Some(cur.clone())
            })
            .collect()
    }

    #[test]
    fn every_kept_version_decodes_in_both_layouts() {
        for layout in [VersionLayout::FullRecords, VersionLayout::Deltas] {
            for (cells, len) in [(2, 8), (3, 8), (3, 40), (4, 100), (4, 672), (3, 1000)] {
                for seed in 1..20 {
                    replay(layout, cells, len, &word_values(seed, len, 12));
                }
            }
        }
    }

    #[test]
    fn a_delta_keeps_only_changed_attributes_and_detects_overwrites() {
        let shape = BlockShape::new(3, 40).with_layout(VersionLayout::Deltas);
        assert_eq!(shape.attr_width(), 8);
        assert_eq!(BlockShape::new(3, 672).attr_width(), 16);
        let prev = [1u8; 40];
        let mut new = prev;
        new[17] = 9; // word 2
        let d = encode_delta(shape, 5, 3, Some(&prev), Some(&new), 1);
        let mut payload = vec![0u8; DELTA_PREFIX + 40];
        cacheline::extract(&d, &mut payload).unwrap();
        assert_eq!(
            u64::from_le_bytes(payload[24..32].try_into().unwrap()),
            1 << 2
        );
        assert_eq!(&payload[DELTA_PREFIX..DELTA_PREFIX + 8], &[1u8; 8]);
        // A full value stamped for another cell, or of another commit, is refused.
        let cells = vec![
            CvtCell::new(1, 0, 5),
            CvtCell::new(2, 1000 + shape.image_offset(1) as u64, 9),
            CvtCell::FREE,
        ];
        let meta = Meta {
            lock: 0,
            floor: 0,
            key: 1,
            cells,
        };
        let full = encode_value(shape, 4, 9, Some(&new), 2);
        let delta = encode_delta(shape, 9, 3, Some(&prev), Some(&new), 2);
        let ok = decode_version(shape, &meta, 0, &[&full, &delta]).unwrap();
        assert_eq!((ok.writer, ok.value), (3, Some(prev.to_vec())));
        let stale = encode_value(shape, 4, 8, Some(&new), 2);
        assert_eq!(decode_version(shape, &meta, 0, &[&stale, &delta]), None);
        let torn = encode_value(shape, 4, 9, Some(&new), 3);
        assert_eq!(decode_version(shape, &meta, 0, &[&torn, &delta]), None);
        assert_eq!(decode_version(shape, &meta, 0, &[&full]), None);
    }
}

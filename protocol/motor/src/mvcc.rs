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
//! Deviations from Motor's header (table id, lock, key, remote offsets, value size,
//! inserted flag) and cell (anchors, valid, version, attribute offset/bitmap): the image
//! offsets are implied by the cell index, "inserted" is a committed cell, and values are
//! written whole (no attribute deltas); each image stores its installer's transaction id
//! so that histories name who wrote what a reader saw.

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
/// Flag bit of a tombstone (a committed delete).
const DELETED: u64 = 1;

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
}

impl BlockShape {
    /// A shape of `cells` cells (at least 1) for `value_len`-byte values.
    #[must_use]
    pub fn new(cells: usize, value_len: usize) -> Self {
        Self {
            cells: cells.max(1),
            value_len,
        }
    }

    /// Bytes of the meta (lock, floor, CVT): what one READ fetches.
    #[must_use]
    pub fn meta_len(&self) -> usize {
        CVT_OFFSET + 16 + CELL_LEN * self.cells
    }

    /// Bytes of one image.
    #[must_use]
    pub fn image_len(&self) -> usize {
        cacheline::image_len(PAYLOAD_PREFIX + self.value_len)
    }

    fn meta_span(&self) -> usize {
        self.meta_len().next_multiple_of(64)
    }

    fn image_stride(&self) -> usize {
        self.image_len().next_multiple_of(64)
    }

    /// Bytes of a block (a multiple of 64).
    #[must_use]
    pub fn block_len(&self) -> usize {
        self.meta_span() + self.cells * self.image_stride()
    }

    /// Offset of cell `i` in the block.
    #[must_use]
    pub fn cell_offset(&self, i: usize) -> usize {
        CVT_OFFSET + 16 + CELL_LEN * i
    }

    /// Offset of image `i` in the block.
    #[must_use]
    pub fn image_offset(&self, i: usize) -> usize {
        self.meta_span() + i * self.image_stride()
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
    /// Bytes of blocks per MN (slots included whether used or not).
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
        f.index_bytes += buckets * dmem_store::BUCKET_LEN as u64;
        f.block_bytes += buckets * BUCKET_SLOTS as u64 * item;
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
        let image = encode_image(shape, 0, Some(value), 0);
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
            write(node, loc.offset + shape.image_offset(0) as u64, &image);
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
}

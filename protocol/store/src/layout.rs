//! Where every table, partition, bucket, record and log region is on every MN: offsets
//! computed from a [`StoreConfig`] alone, so they are the same on every node.
//!
//! # Symmetric layout
//!
//! Every MN has the same layout, and a record occupies **the same offset on every replica**,
//! so a CN needs one offset per record, not one per replica:
//!
//! ```text
//! offset 0    | reserved (64 B: offset 0 is the null address)                      |
//!             | table 0, partition 0: buckets[nb] (128 B each) | items[nb * 7]      |
//!             |   (a pooled table: buckets[nb] | loader's records | insert shares)  |
//!             | table 0, partition 1: ...                                           |
//!             | ... every table, every partition ...                                |
//!             | log region of coordinator 0 | coordinator 1 | ...                   |
//! ```
//!
//! Partition `p`'s area exists on every MN but is used only on `p`'s replicas (the rest is
//! slack: `mns / (f + 1)` times the data, acceptable for the simulator and simple to address).

use std::collections::HashMap;

use dmem_layout::record::{DataItemHeader, RemoteAddr as PackedAddr};
use dmem_txn::TableId;
use dmem_verbs::NodeId;

use crate::encoding::BUCKET_SLOTS;
use crate::error::StoreError;
use crate::sizing::{StoreConfig, TableSpec};
#[cfg(doc)]
use crate::{WIDE_BUCKET_SLOTS, parse_bucket};

/// Bytes reserved at offset 0 of every MN (so that offset 0 is never a record).
const RESERVED: u64 = 64;

/// The offsets of a configuration, independent of the regions.
pub(crate) struct Layout {
    pub(crate) tables: HashMap<TableId, TableLayout>,
    pub(crate) log_base: u64,
    pub(crate) bytes_per_mn: u64,
}

impl Layout {
    pub(crate) fn compute(config: &StoreConfig) -> Result<Self, StoreError> {
        if config.replicas == 0 || config.replicas > config.mns || config.mns > 64 {
            return Err(StoreError::Replication {
                replicas: config.replicas,
                mns: config.mns,
            });
        }
        let mut tables = HashMap::new();
        let mut next = RESERVED;
        for spec in &config.tables {
            let item_len = spec
                .item_len
                .unwrap_or_else(|| DataItemHeader::item_len(spec.value_len));
            if spec.item_len.is_some() {
                // Multi-version blocks hold cacheline-versioned images: keep them aligned.
                next = next.next_multiple_of(64);
            }
            let buckets = u64::from(spec.buckets_per_partition.max(1));
            let records = match spec.pool {
                Some(pool) => pool
                    .per_coordinator
                    .saturating_mul(u64::from(config.coordinators))
                    .saturating_add(pool.loaded),
                None => buckets * BUCKET_SLOTS as u64,
            };
            let partition_bytes = records
                .saturating_mul(item_len as u64)
                .saturating_add(buckets * spec.bucket_len() as u64);
            let layout = TableLayout {
                spec: TableSpec {
                    buckets_per_partition: spec.buckets_per_partition.max(1),
                    ..*spec
                },
                item_len,
                base: next,
                partition_bytes,
                records_per_partition: records,
            };
            if tables.insert(spec.id, layout).is_some() {
                return Err(StoreError::DuplicateTable(spec.id.0));
            }
            next = partition_bytes
                .checked_mul(u64::from(config.mns))
                .and_then(|b| b.checked_add(next))
                .filter(|&b| b <= PackedAddr::MAX_OFFSET)
                .ok_or(StoreError::TooLarge {
                    needed: u64::MAX,
                    have: PackedAddr::MAX_OFFSET,
                    node: NodeId(0),
                })?;
        }
        let log_base = next.next_multiple_of(64);
        let bytes_per_mn =
            log_base + u64::from(config.coordinators) * u64::from(config.log_region_bytes);
        Ok(Self {
            tables,
            log_base,
            bytes_per_mn,
        })
    }
}

/// Where one table lives (the same on every MN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableLayout {
    /// The table's spec.
    pub spec: TableSpec,
    /// Bytes of one item (header + value, padded).
    pub item_len: usize,
    /// Offset of partition 0's area.
    pub base: u64,
    /// Bytes of one partition's area (buckets then records).
    pub partition_bytes: u64,
    /// Records of one partition's area: `7 × buckets`, or the pool's records.
    pub records_per_partition: u64,
}

impl TableLayout {
    fn bucket_offset(&self, partition: u16, bucket: u32) -> u64 {
        self.base
            + u64::from(partition) * self.partition_bytes
            + u64::from(bucket) * self.spec.bucket_len() as u64
    }

    /// The bucket `bucket` of `partition` (its offset and width).
    pub(crate) fn bucket_loc(&self, partition: u16, bucket: u32) -> BucketLoc {
        BucketLoc {
            table: self.spec.id,
            partition,
            bucket,
            offset: self.bucket_offset(partition, bucket),
            slots: self.spec.bucket_slots() as u8,
        }
    }

    /// Offset of record 0 of `partition` (records follow the buckets).
    #[must_use]
    pub fn records_offset(&self, partition: u16) -> u64 {
        self.base
            + u64::from(partition) * self.partition_bytes
            + u64::from(self.spec.buckets_per_partition) * self.spec.bucket_len() as u64
    }

    pub(crate) fn record_offset(&self, partition: u16, record: u64) -> u64 {
        self.records_offset(partition) + record * self.item_len as u64
    }

    pub(crate) fn item_offset(&self, partition: u16, bucket: u32, slot: usize) -> u64 {
        self.record_offset(
            partition,
            u64::from(bucket) * BUCKET_SLOTS as u64 + slot as u64,
        )
    }

    /// Whether the table's records live in a pool apart from the slots.
    #[must_use]
    pub fn is_pooled(&self) -> bool {
        self.spec.pool.is_some()
    }

    /// Whether an insert of an absent key into a bucket whose used slots are `used` (as
    /// [`parse_bucket`] gives them) must give up because another insert is half done: in a
    /// hashed pooled table an insert takes the bucket's first free slot by a CAS of its
    /// address word and WRITEs the key after, so a used slot without a key may be an insert
    /// of the very key looked up, which a second insert would index again in another free
    /// slot. (Direct-mapped tables fix each key's slot, so the slot CAS alone arbitrates;
    /// in the slot-fixed layout the record's lock does.)
    #[must_use]
    pub fn slot_being_claimed(&self, used: &[(usize, u64)]) -> bool {
        self.spec.pool.is_some()
            && self.spec.direct_keys.is_none()
            && used.iter().any(|&(_, key)| key == 0)
    }

    /// The slot an insert of an absent key may claim in a bucket whose READ gave `(used,
    /// free)` ([`parse_bucket`]): `free`, or none while a slot is half claimed
    /// ([`slot_being_claimed`](Self::slot_being_claimed)).
    #[must_use]
    pub fn insert_slot(&self, used: &[(usize, u64)], free: Option<usize>) -> Option<usize> {
        free.filter(|_| !self.slot_being_claimed(used))
    }
}

/// Where a key's index bucket is: partition and bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketLoc {
    /// The table.
    pub table: TableId,
    /// The partition (primary MN index when every MN is alive).
    pub partition: u16,
    /// The bucket inside the partition.
    pub bucket: u32,
    /// Offset of the bucket on every replica.
    pub offset: u64,
    /// Slots of the bucket: [`BUCKET_SLOTS`], or [`WIDE_BUCKET_SLOTS`] in a hashed pooled
    /// table ([`TableSpec::bucket_slots`]).
    pub slots: u8,
}

impl BucketLoc {
    /// Bytes of the bucket: what its one READ fetches and [`parse_bucket`] parses.
    #[must_use]
    pub const fn read_len(&self) -> u32 {
        (self.slots as u32 + 1) * 16
    }

    /// Slots of the bucket, as a count.
    #[must_use]
    pub const fn slot_count(&self) -> usize {
        self.slots as usize
    }
}

/// Where a record is: its bucket slot and the item's offset on every replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ItemLoc {
    /// The bucket that indexes it.
    pub bucket: BucketLoc,
    /// Its slot in the bucket.
    pub slot: usize,
    /// Offset of the item on every replica.
    pub offset: u64,
}

/// Sizing that needs the computed layout (kept here so that `sizing` does not depend on
/// `layout`).
impl StoreConfig {
    /// Bytes every MN region needs for this layout, computed without any region (so a
    /// cluster can be sized before it is built).
    ///
    /// # Errors
    /// [`StoreError::DuplicateTable`] or [`StoreError::Replication`].
    pub fn bytes_per_mn(&self) -> Result<u64, StoreError> {
        Ok(Layout::compute(self)?.bytes_per_mn)
    }
}

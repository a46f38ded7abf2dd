//! Key → bucket → record: the lookups of the MN hash index of a [`Store`] (which bucket a
//! key hashes to, which record a slot names, which record an insert takes).
//!
//! # Index (FORD's hash buckets, one READ)
//!
//! Each partition of a table has `buckets` [`IndexBucket<7>`](IndexBucket) of 128 bytes
//! (a hashed pooled table: [`WideBucket`]s of 15 slots, 256 bytes); a key hashes to one
//! bucket, read with one READ of [`BucketLoc::read_len`] bytes. Slot `s` of bucket `b` maps its key to item
//! `b * 7 + s` of the partition, so the item of every slot is fixed and an insert only has to
//! claim a slot (a pooled table's slot names a record of its partition's pool instead, see
//! module `sizing`, "Sparse tables"). Slots are claimed in order (first free), never freed (a delete leaves an
//! invalid item behind that a later insert of the same key reuses), so the used slots of a
//! bucket are always a prefix. Deviation from FORD: no overflow buckets (a full bucket
//! refuses the insert with [`StoreError::BucketFull`]); buckets hold addresses, not items.

use dmem_layout::record::RemoteAddr as PackedAddr;
use dmem_txn::{Key, TableId};

use crate::encoding::{BUCKET_SLOTS, slot_offset};
use crate::error::StoreError;
use crate::layout::{BucketLoc, ItemLoc};
use crate::mix64;
use crate::store::Store;
#[cfg(doc)]
use crate::{InsertPool, WideBucket};
#[cfg(doc)]
use dmem_layout::record::IndexBucket;

impl Store {
    /// The bucket `key` of `table` hashes to.
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`].
    pub fn bucket_of(&self, table: TableId, key: Key) -> Result<BucketLoc, StoreError> {
        let layout = self.table(table)?;
        let mns = u64::from(self.config.mns);
        let buckets = u64::from(layout.spec.buckets_per_partition);
        let (partition, bucket) = if layout.spec.direct_keys.is_some() {
            // Direct-mapped: the `mns` keys of row `k / mns` go to distinct partitions, in a
            // rotation hashed from the table and the row (so the same key of two tables
            // shares an MN as often as under hashing); seven rows per bucket (keys beyond
            // the key space wrap around).
            let rank = key.0 / mns;
            let rotation = mix64(mix64(u64::from(table.0)) ^ rank) % mns;
            (
                ((key.0 % mns + rotation) % mns) as u16,
                ((rank / BUCKET_SLOTS as u64) % buckets) as u32,
            )
        } else {
            let h = mix64(mix64(u64::from(table.0)) ^ key.0);
            ((h % mns) as u16, ((h >> 20) % buckets) as u32)
        };
        Ok(layout.bucket_loc(partition, bucket))
    }

    /// Bucket `bucket` of `partition` of `table` (for scans).
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`].
    pub fn bucket_of_index(
        &self,
        table: TableId,
        partition: u16,
        bucket: u32,
    ) -> Result<BucketLoc, StoreError> {
        Ok(self.table(table)?.bucket_loc(partition, bucket))
    }

    /// The item that slot `slot` of `bucket` indexes when records live in the slots.
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`], or [`StoreError::Pooled`] for a table whose records
    /// live apart from the slots (use [`item_in_bucket`](Self::item_in_bucket)).
    pub fn item_at(&self, bucket: BucketLoc, slot: usize) -> Result<ItemLoc, StoreError> {
        let layout = self.table(bucket.table)?;
        if layout.is_pooled() {
            return Err(StoreError::Pooled(bucket.table.0));
        }
        Ok(ItemLoc {
            bucket,
            slot,
            offset: layout.item_offset(bucket.partition, bucket.bucket, slot),
        })
    }

    /// The item used slot `slot` of `bucket` indexes, given the bucket's bytes as READ
    /// ([`BucketLoc::read_len`] bytes, checked): the slot's fixed record, or for a pooled
    /// table the record whose address the slot holds, checked to be a record of the
    /// partition's pool.
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`], [`StoreError::BadBucketRead`] for bytes of another
    /// length or a slot beyond the bucket's, [`StoreError::BadSlotAddress`].
    pub fn item_in_bucket(
        &self,
        bucket: BucketLoc,
        slot: usize,
        bucket_bytes: &[u8],
    ) -> Result<ItemLoc, StoreError> {
        let expected = bucket.read_len() as usize;
        let at = slot_offset(slot) as usize;
        let slot_bytes = bucket_bytes
            .get(at..at + 16)
            .filter(|_| bucket_bytes.len() == expected && slot < bucket.slot_count())
            .ok_or(StoreError::BadBucketRead {
                table: bucket.table.0,
                slot,
                got: bucket_bytes.len(),
                expected,
            })?;
        self.item_in_slot(bucket, slot, slot_bytes)
    }

    /// [`item_in_bucket`](Self::item_in_bucket) from the 16 bytes of the slot alone (key,
    /// then the packed address).
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`], [`StoreError::BadSlotAddress`].
    pub fn item_in_slot(
        &self,
        bucket: BucketLoc,
        slot: usize,
        slot_bytes: &[u8],
    ) -> Result<ItemLoc, StoreError> {
        let layout = self.table(bucket.table)?;
        if !layout.is_pooled() {
            return self.item_at(bucket, slot);
        }
        let raw = slot_bytes
            .get(8..16)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes);
        let bad = StoreError::BadSlotAddress {
            table: bucket.table.0,
            slot,
            raw,
        };
        let addr = PackedAddr::from_raw(raw);
        let first = layout.records_offset(bucket.partition);
        let rel = addr.offset().checked_sub(first).ok_or(bad.clone())?;
        let item_len = layout.item_len as u64;
        if addr.node() != bucket.partition
            || rel % item_len != 0
            || rel / item_len >= layout.records_per_partition
        {
            return Err(bad);
        }
        Ok(ItemLoc {
            bucket,
            slot,
            offset: addr.offset(),
        })
    }

    /// Record `record` of the pool of `bucket`'s partition, for slot `slot` of `bucket`.
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`], or [`StoreError::PoolExhausted`] past the pool.
    pub fn pool_item(
        &self,
        bucket: BucketLoc,
        slot: usize,
        record: u64,
    ) -> Result<ItemLoc, StoreError> {
        let layout = self.table(bucket.table)?;
        if record >= layout.records_per_partition || !layout.is_pooled() {
            return Err(StoreError::PoolExhausted {
                table: bucket.table.0,
                partition: bucket.partition,
                what: "pool".into(),
            });
        }
        Ok(ItemLoc {
            bucket,
            slot,
            offset: layout.record_offset(bucket.partition, record),
        })
    }

    /// The item a run-time insert into free slot `slot` of `bucket` writes: the slot's
    /// fixed record, or for a pooled table record `n` of `coordinator`'s insert share of the
    /// partition's pool (`n` counts the slots the coordinator claimed in that partition
    /// before, see [`InsertPool`]).
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`], [`StoreError::NoLogRegion`] for a coordinator without
    /// a share, [`StoreError::PoolExhausted`] when its share is used up.
    pub fn insert_item(
        &self,
        bucket: BucketLoc,
        slot: usize,
        coordinator: u16,
        n: u64,
    ) -> Result<ItemLoc, StoreError> {
        let layout = self.table(bucket.table)?;
        let Some(pool) = layout.spec.pool else {
            return self.item_at(bucket, slot);
        };
        if coordinator >= self.config.coordinators {
            return Err(StoreError::NoLogRegion(coordinator));
        }
        if n >= pool.per_coordinator {
            return Err(StoreError::PoolExhausted {
                table: bucket.table.0,
                partition: bucket.partition,
                what: format!("coordinator {coordinator}"),
            });
        }
        self.pool_item(
            bucket,
            slot,
            pool.loaded + u64::from(coordinator) * pool.per_coordinator + n,
        )
    }

    /// Offset and count of every record of `partition` of `table` (contiguous in both
    /// layouts: what a scan of every record reads).
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`].
    pub fn record_area(&self, table: TableId, partition: u16) -> Result<(u64, u64), StoreError> {
        let layout = self.table(table)?;
        Ok((
            layout.records_offset(partition),
            layout.records_per_partition,
        ))
    }

    /// The slot a loaded key takes: its own slot in a direct-mapped table (`Ok(Some)`),
    /// none fixed in a hashed one (`Ok(None)`: the next free slot of its bucket).
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`], or [`StoreError::KeyOutOfRange`] for a key outside a
    /// direct-mapped table's key space.
    pub fn direct_slot(&self, table: TableId, key: Key) -> Result<Option<usize>, StoreError> {
        let layout = self.table(table)?;
        match layout.spec.direct_keys {
            None => Ok(None),
            Some(key_space) if key.0 >= key_space => Err(StoreError::KeyOutOfRange {
                table: table.0,
                key: key.0,
                key_space,
            }),
            Some(_) => {
                let rank = key.0 / u64::from(self.config.mns);
                Ok(Some((rank % BUCKET_SLOTS as u64) as usize))
            }
        }
    }
}

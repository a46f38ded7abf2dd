//! The out-of-band loader ([`Loader`]) and what it leaves behind: the compact index of
//! where every loaded key went ([`LoadIndex`]), which warm address caches answer from.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use dmem_layout::record::{DataVersion, ItemFlags, RemoteAddr as PackedAddr};
use dmem_txn::{Key, TableId};
use dmem_verbs::NodeId;

#[cfg(doc)]
use crate::AddressCache;
use crate::encoding::{encode_item, index_slot_bytes, slot_offset};
use crate::error::StoreError;
use crate::layout::{BucketLoc, ItemLoc};
use crate::sizing::RecordPool;
use crate::store::Store;

/// Writes initial records into MN memory out of band (the simulator's `write_memory`, a
/// shm mapping, a bulk RDMA load), through a `FnMut(NodeId, offset, bytes)` writer.
///
/// Loaded records have [`dmem_txn::Version::INITIAL`] (counter 0) and are valid; every
/// replica gets the item and the index slot.
#[derive(Debug)]
pub struct Loader<'s> {
    store: StoreRef<'s>,
    loaded: Rc<RefCell<LoadIndex>>,
}

/// The keys loaded so far and the slot each took: duplicate detection and slot choice for a
/// loader, and the locations a warm [`AddressCache`] answers from.
///
/// Compact, so that paper-scale data sets fit: one bit per key of a direct-mapped table's key
/// space (its slot follows from the key), four bytes per key of a pooled table's key space
/// (its pool record), and for a hashed table one byte per bucket (used slots) plus one map
/// entry (the slot) per loaded key.
///
/// `Clone + Send + Sync`: once loading is done, one copy is the placement every core of a
/// CN process shares ([`AddressCache::warm_from_placed`]) instead of loading again.
#[derive(Debug, Default, Clone)]
pub struct LoadIndex {
    /// Direct-mapped tables: bit `k` set when key `k` is loaded.
    direct: HashMap<TableId, Vec<u64>>,
    /// Direct-mapped pooled tables: `1 +` the pool record of key `k` (0: not loaded).
    pooled: HashMap<TableId, Vec<u32>>,
    /// Pooled tables: records the loader placed in each `(table, partition)`.
    pool_next: HashMap<(TableId, u16), u64>,
    /// Hashed tables: the slot of every loaded key (and its pool record in a pooled one).
    hashed: HashMap<(TableId, Key), HashedEntry>,
    /// Hashed tables: used slots of every bucket, per `(table, partition)`.
    fill: HashMap<(TableId, u16), Vec<u8>>,
    /// Keys loaded.
    count: u64,
}

impl LoadIndex {
    /// Nothing loaded.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Keys loaded so far.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.count
    }

    /// Whether nothing is loaded.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Claims the slot of `key` (not loaded before) in `store`: its own slot in a
    /// direct-mapped table, the next free slot of its bucket in a hashed one.
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`], [`StoreError::KeyOutOfRange`],
    /// [`StoreError::DuplicateKey`], [`StoreError::BucketFull`].
    pub fn place(
        &mut self,
        store: &Store,
        table: TableId,
        key: Key,
    ) -> Result<ItemLoc, StoreError> {
        let bucket = store.bucket_of(table, key)?;
        let duplicate = StoreError::DuplicateKey {
            table: table.0,
            key: key.0,
        };
        let layout = *store.table(table)?;
        if let (Some(slot), Some(pool)) = (store.direct_slot(table, key)?, layout.spec.pool) {
            let key_space = layout.spec.direct_keys.unwrap_or(0);
            let records = self
                .pooled
                .entry(table)
                .or_insert_with(|| vec![0; usize::try_from(key_space).unwrap_or(0)]);
            let entry = &mut records[key.0 as usize];
            if *entry != 0 {
                return Err(duplicate);
            }
            let record = Self::take_loader_record(&mut self.pool_next, bucket, pool)?;
            let loc = store.pool_item(bucket, slot, u64::from(record))?;
            *entry = record + 1;
            self.count += 1;
            return Ok(loc);
        }
        let slot = if let Some(slot) = store.direct_slot(table, key)? {
            let key_space = layout.spec.direct_keys.unwrap_or(0);
            let bits = self
                .direct
                .entry(table)
                .or_insert_with(|| vec![0; usize::try_from(key_space.div_ceil(64)).unwrap_or(0)]);
            let (word, bit) = ((key.0 / 64) as usize, key.0 % 64);
            if bits[word] & (1 << bit) != 0 {
                return Err(duplicate);
            }
            bits[word] |= 1 << bit;
            slot
        } else {
            if self.hashed.contains_key(&(table, key)) {
                return Err(duplicate);
            }
            let buckets = store.table(table)?.spec.buckets_per_partition as usize;
            let fill = self
                .fill
                .entry((table, bucket.partition))
                .or_insert_with(|| vec![0; buckets]);
            let used = &mut fill[bucket.bucket as usize];
            if usize::from(*used) >= bucket.slot_count() {
                return Err(StoreError::BucketFull {
                    table: table.0,
                    key: key.0,
                });
            }
            let slot = *used;
            *used += 1;
            if let Some(pool) = layout.spec.pool {
                // A pooled hashed table: the slot names the next record of the loader's share.
                let record = Self::take_loader_record(&mut self.pool_next, bucket, pool)?;
                self.hashed
                    .insert((table, key), HashedEntry { slot, record });
                self.count += 1;
                return store.pool_item(bucket, usize::from(slot), u64::from(record));
            }
            self.hashed
                .insert((table, key), HashedEntry { slot, record: 0 });
            usize::from(slot)
        };
        self.count += 1;
        store.item_at(bucket, slot)
    }

    /// Where `key` of `table` was loaded, if it was.
    #[must_use]
    pub fn loc(&self, store: &Store, table: TableId, key: Key) -> Option<ItemLoc> {
        if let Some(records) = self.pooled.get(&table) {
            let slot = store.direct_slot(table, key).ok()??;
            let record = *records.get(usize::try_from(key.0).ok()?)?;
            let bucket = store.bucket_of(table, key).ok()?;
            return store
                .pool_item(bucket, slot, u64::from(record.checked_sub(1)?))
                .ok();
        }
        let slot = match store.direct_slot(table, key).ok()? {
            Some(slot) => {
                let word = self.direct.get(&table)?.get((key.0 / 64) as usize)?;
                if word & (1 << (key.0 % 64)) == 0 {
                    return None;
                }
                slot
            }
            None => {
                let entry = *self.hashed.get(&(table, key))?;
                if store.table(table).ok()?.is_pooled() {
                    let bucket = store.bucket_of(table, key).ok()?;
                    return store
                        .pool_item(bucket, usize::from(entry.slot), u64::from(entry.record))
                        .ok();
                }
                usize::from(entry.slot)
            }
        };
        store.item_at(store.bucket_of(table, key).ok()?, slot).ok()
    }
}

impl<'s> Loader<'s> {
    /// A loader for an empty (zeroed) store.
    #[must_use]
    pub fn new(store: &'s Store) -> Self {
        Self {
            store: StoreRef::Borrowed(store),
            loaded: Rc::default(),
        }
    }

    /// A loader holding a shared store, so that it can live next to the `Rc<Store>` in a
    /// deployment that loads record by record.
    #[must_use]
    pub fn shared(store: Rc<Store>) -> Loader<'static> {
        Loader {
            store: StoreRef::Shared(store),
            loaded: Rc::default(),
        }
    }

    /// The keys loaded so far and where, shared (what [`AddressCache::warm_from`] answers
    /// from).
    #[must_use]
    pub fn loaded(&self) -> Rc<RefCell<LoadIndex>> {
        Rc::clone(&self.loaded)
    }

    /// Loads one record.
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
        let store: &Store = match &self.store {
            StoreRef::Borrowed(s) => s,
            StoreRef::Shared(s) => s,
        };
        let layout = *store.table(table)?;
        if value.len() != layout.spec.value_len {
            return Err(StoreError::ValueSize {
                table: table.0,
                expected: layout.spec.value_len,
                got: value.len(),
            });
        }
        let loc = self.loaded.borrow_mut().place(store, table, key)?;
        let (bucket, slot) = (loc.bucket, loc.slot);
        let item = encode_item(
            key.0,
            table.0,
            DataVersion::from_raw(0),
            ItemFlags::LOADED,
            value,
            layout.item_len,
        );
        let primary_addr =
            PackedAddr::new(bucket.partition, loc.offset).map_err(|_| StoreError::TooLarge {
                needed: loc.offset,
                have: PackedAddr::MAX_OFFSET,
                node: store.mn_node(bucket.partition),
            })?;
        let slot_bytes = index_slot_bytes(key.0, primary_addr);
        let slot_offset = bucket.offset + slot_offset(slot);
        for mn in store.replicas(bucket.partition) {
            let node = store.mn_node(mn);
            write(node, loc.offset, &item);
            write(node, slot_offset, &slot_bytes);
        }
        Ok(loc)
    }
}

/// The store a [`Loader`] writes into: borrowed, or shared.
#[derive(Debug)]
enum StoreRef<'s> {
    Borrowed(&'s Store),
    Shared(Rc<Store>),
}

/// What the loader remembers of a key of a hashed table: its slot, and in a pooled table
/// the record of the partition's pool the slot names (8 bytes: the map entry stays 24
/// bytes, as with the slot alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashedEntry {
    /// The slot in the key's bucket.
    pub slot: u8,
    /// The record of the partition's pool (0 in a table whose records are in the slots).
    pub record: u32,
}

impl LoadIndex {
    /// The next record of the loader's share of `bucket`'s partition of a pooled table.
    pub(crate) fn take_loader_record(
        pool_next: &mut HashMap<(TableId, u16), u64>,
        bucket: BucketLoc,
        pool: RecordPool,
    ) -> Result<u32, StoreError> {
        let next = pool_next
            .entry((bucket.table, bucket.partition))
            .or_insert(0);
        // `u32::MAX - 1` at most: a direct-mapped pooled table stores `record + 1`.
        let record = u32::try_from(*next)
            .ok()
            .filter(|&r| u64::from(r) < pool.loaded && r < u32::MAX - 1)
            .ok_or_else(|| StoreError::PoolExhausted {
                table: bucket.table.0,
                partition: bucket.partition,
                what: "loader".into(),
            })?;
        *next += 1;
        Ok(record)
    }
}

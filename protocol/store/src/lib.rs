//! How tables live in memory-node (MN) memory: placement, the MN hash index, record
//! addresses, per-coordinator log regions, the out-of-band loader and the CN-side address
//! cache.
//!
//! Nothing here is FORD-specific except the record format ([`DataItem`]); the placement, the
//! index and the cache are shared by every one-sided protocol (FORD and Pandora today,
//! Motor/LOTUS and OCC/DrTM/OOCC later), which is why this crate sits below them.
//!
//! # Sizing
//!
//! [`StoreConfig::for_tables`] turns a workload-neutral [`TableDemand`] list into a
//! configuration with index room for `slack` times the records, and
//! [`StoreConfig::bytes_per_mn`] says how much MN memory it needs *before* any region is
//! allocated. The index has no overflow buckets, so a caller that meets
//! [`StoreError::BucketFull`] while loading doubles the slack and lays out again; only hashed
//! tables grow with the slack, direct-mapped ones never fill.
//!
//! # Direct-mapped tables (memory proportional to the data)
//!
//! A record lives at the record slot of its index slot, so a hashed table holds `7 × buckets`
//! record slots whatever it stores: with the slack a hash index without overflow buckets needs
//! (2, doubled until no bucket overflows, 4–8 in practice) a table takes 4–8 times its data.
//! A table whose keys are dense integers in `0..k` ([`StoreConfig::with_direct_index`]) is
//! indexed directly instead, as Motor's own code indexes SmallBank: key `k` is slot
//! `(k / mns) % 7` of bucket `k / mns / 7` of partition `(k + r) % mns`, where the rotation
//! `r` is a hash of the table and the row `k / mns` (so the same key of two tables shares an
//! MN as often as under hashing, 1 in `mns`, and every MN holds the same number of keys).
//! Every bucket indexes
//! exactly seven keys of the space, so it never fills, needs no slack and no doubling; the
//! table takes `k` record slots and `k / 7` buckets (18 bytes of index per key). The record
//! format, the bucket READ and the address in the slot are the same as for a hashed table,
//! so the verbs of a transaction are unchanged (one bucket READ on a cold lookup, none with a
//! warm cache). A run-time insert of a new key claims the first free slot of its bucket by
//! CAS as in a hashed table; the bucket has room for every key of the space that maps to it.
//!
//! # Sparse tables (records in a pool apart from the slots)
//!
//! A direct-mapped table whose keys fill little of their space (TATP's CALL_FORWARDING,
//! keyed `s_id << 4 | type << 2 | start / 8`, fills 23 %; ACCESS_INFO and
//! SPECIAL_FACILITY 62 %) would hold a record slot per key of the space. Such a table keeps
//! the direct-mapped index (one 18-byte index slot per key of the space, buckets that never
//! fill) but lays its records out apart from the slots, in a pool per partition
//! ([`RecordPool`], [`StoreConfig::with_record_pool`]); [`StoreConfig::with_sparse_indexes`]
//! pools every direct-mapped table whose pool would be smaller than its key space. The
//! index slot holds the record's packed address, as in every table, and a protocol follows
//! it ([`Store::item_in_bucket`], checked to name a record of the partition's pool) instead
//! of computing the record from the slot ([`Store::item_at`] refuses a pooled table). So a
//! lookup posts what it posted: one bucket READ on a cold lookup (whose bytes carry the
//! address), none with a warm cache, the same record format.
//!
//! A partition's pool holds the loader's records (the table's expected records plus 1/16
//! and 64, placed in load order; more is [`StoreError::PoolExhausted`], never an overwrite)
//! and then an equal insert share per coordinator (for a table that grows: as many inserts
//! again as records, plus 4096). A run-time insert takes the next record of its
//! coordinator's share of the bucket's partition ([`InsertPool`]): no verb, no contention,
//! and safe without any MN-side cursor because a share belongs to one coordinator id and
//! Pandora never reuses the id of a failed coordinator (its locks stay stray under PILL, so
//! its unused records are simply left).
//!
//! Claiming the slot changes by one verb kind. In the slot-fixed layout two inserts into one
//! free slot lock the same record, so the record's lock CAS arbitrates and the slot is only
//! READ in the lock batch; with a pool each locks a record of its own, so FORD's lock batch
//! CASes the slot's address word on the primary from empty to its record instead of READing
//! the slot (the same number of verbs: one READ becomes a CAS, for an insert of an absent
//! key into a pooled table only). The winner WRITEs the whole slot (key and address) to every
//! replica right away, as the claim WRITE did before; the loser aborts and its retry finds
//! the key. The record counts as taken once that CAS is posted (a lost CAS leaves one unused
//! record in the share). A coordinator that crashes between the CAS and the WRITE leaves a
//! slot with an address and no key on the primary only: no key matches it, and it stays
//! used, so its bucket has one slot fewer (in a direct-mapped bucket of seven keys, the last
//! of them to be inserted would find the bucket full); nothing repairs such a slot today.
//! Records never move, so addresses in logs (which name partition and offset) and cached
//! locations stay valid; a scan of every record ([`Store::record_area`]) covers both
//! layouts.
//!
//! Hashed tables (keys that are not dense) can be pooled the same way
//! ([`StoreConfig::with_hashed_pools`], module `hashed_pool`): the hash index stays, records
//! move to a pool, and the index is sized per table by [`buckets_for`], in 15-slot
//! [`WideBucket`]s of 256 bytes (one READ each) instead of 7-slot ones (module `hashed_pool`,
//! "Wide buckets").
//!
//! FORD and Pandora (`dmem-ford`, laid out by `dmem-protocols`) pool sparse tables and, outside
//! the litmus tests' exact layout, hashed tables. Motor
//! and LOTUS compute the record from the slot and keep the slot-fixed layout
//! ([`StoreConfig::with_direct_indexes`]); OCC, DrTM and OOCC have their own store. A
//! protocol that brings a crashed coordinator back under its old id (LOTUS §6 restarts CNs)
//! could not use the shares as they are: the restarted coordinator's cursor would have to be
//! recovered first (the first record of its share that no slot names), which is one reason
//! Motor and LOTUS were left on the slot-fixed layout.
//!
//! Memory regions are zeroed on allocation and never touched where no record lives (the
//! areas of partitions an MN does not replicate, the slots of absent keys), so those pages
//! cost address space, not resident memory.
//!
//! # Placement (Pandora §2.1, §3.2.5)
//!
//! A record's *partition* is `hash(table, key) % mns`; its primary is MN `partition` and its
//! `f` backups are the next `f` MNs, wrapping around (a static ring, which is what
//! consistent hashing degenerates to with a fixed MN set). When an MN fails, the first live
//! replica becomes the primary (§3.2.5); every CN computes the same answer from the same
//! [`MnView`].
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
//!
//! # Index (FORD's hash buckets, one READ)
//!
//! Each partition of a table has `buckets` [`IndexBucket<7>`](IndexBucket) of 128 bytes
//! (a hashed pooled table: [`WideBucket`]s of 15 slots, 256 bytes); a key hashes to one
//! bucket, read with one READ of [`BucketLoc::read_len`] bytes. Slot `s` of bucket `b` maps its key to item
//! `b * 7 + s` of the partition, so the item of every slot is fixed and an insert only has to
//! claim a slot (a pooled table's slot names a record of its partition's pool instead, see
//! "Sparse tables"). Slots are claimed in order (first free), never freed (a delete leaves an
//! invalid item behind that a later insert of the same key reuses), so the used slots of a
//! bucket are always a prefix. Deviation from FORD: no overflow buckets (a full bucket
//! refuses the insert with [`StoreError::BucketFull`]); buckets hold addresses, not items.

#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use dmem_layout::log::LogRegionHeader;
use dmem_layout::record::{
    DataItem, DataItemHeader, DataVersion, IndexBucket, IndexSlot, ItemFlags,
    RemoteAddr as PackedAddr,
};
use dmem_txn::{Key, TableId};
use dmem_verbs::{MemoryRegion, NodeId, RemoteAddr};

mod hashed_pool;
pub use hashed_pool::{Footprint, HashedEntry, OVERFLOW_BUDGET, TableFootprint, buckets_for};

/// Slots per index bucket (a two-cache-line [`IndexBucket`]).
pub const BUCKET_SLOTS: usize = 7;
/// The index bucket type.
pub type Bucket = IndexBucket<BUCKET_SLOTS>;
/// Bytes of one index bucket.
pub const BUCKET_LEN: usize = Bucket::LEN;
/// Slots of the wide bucket of a hashed pooled table (module `hashed_pool`, "Wide buckets"):
/// the bytes of two 7-slot buckets, one READ, one header.
pub const WIDE_BUCKET_SLOTS: usize = 15;
/// The wide index bucket type of hashed pooled tables.
pub type WideBucket = IndexBucket<WIDE_BUCKET_SLOTS>;
/// Bytes of one wide index bucket.
pub const WIDE_BUCKET_LEN: usize = WideBucket::LEN;
/// Bytes reserved at offset 0 of every MN (so that offset 0 is never a record).
const RESERVED: u64 = 64;

/// Why a store could not be laid out, loaded or addressed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A table id used twice in the schema.
    #[error("table {0} declared twice")]
    DuplicateTable(u32),
    /// A table id not in the schema.
    #[error("unknown table {0}")]
    UnknownTable(u32),
    /// More replicas than MNs, or none.
    #[error("replication degree {replicas} needs 1..={mns} MNs")]
    Replication {
        /// Replicas per record asked for.
        replicas: u16,
        /// MNs available.
        mns: u16,
    },
    /// The layout does not fit into the MN regions.
    #[error("layout needs {needed} bytes per MN, the region of {node} has {have}")]
    TooLarge {
        /// Bytes per MN the layout needs.
        needed: u64,
        /// Bytes the region has.
        have: u64,
        /// The MN.
        node: NodeId,
    },
    /// The number of regions does not match the number of MNs.
    #[error("{got} MN regions for {mns} MNs")]
    Regions {
        /// Regions given.
        got: usize,
        /// MNs in the configuration.
        mns: u16,
    },
    /// A value of the wrong size.
    #[error("value of {got} bytes for table {table} of {expected}-byte values")]
    ValueSize {
        /// The table.
        table: u32,
        /// Its value size.
        expected: usize,
        /// The size offered.
        got: usize,
    },
    /// The key's bucket has no free slot.
    #[error("bucket of key {key} in table {table} is full")]
    BucketFull {
        /// The table.
        table: u32,
        /// The key.
        key: u64,
    },
    /// A key outside the key space of a direct-mapped table.
    #[error("key {key} is outside the key space 0..{key_space} of direct-mapped table {table}")]
    KeyOutOfRange {
        /// The table.
        table: u32,
        /// The key.
        key: u64,
        /// Keys of the table are in `0..key_space`.
        key_space: u64,
    },
    /// The key was loaded twice.
    #[error("key {key} loaded twice into table {table}")]
    DuplicateKey {
        /// The table.
        table: u32,
        /// The key.
        key: u64,
    },
    /// A pooled table's record pool has no room left: the loader's share of a partition
    /// (more records than the table's demand said) or a coordinator's insert share.
    #[error("record pool of table {table}, partition {partition} is exhausted ({what})")]
    PoolExhausted {
        /// The table.
        table: u32,
        /// The partition.
        partition: u16,
        /// Whose share: `loader` or `coordinator N`.
        what: String,
    },
    /// A record of a pooled table has no fixed slot: its address is in its index slot
    /// ([`Store::item_in_bucket`]).
    #[error("records of table {0} are pooled: their addresses are in the index slots")]
    Pooled(u32),
    /// An index slot of a pooled table names no record of its partition's pool (remote
    /// memory is checked before it is followed).
    #[error("index slot {slot} of table {table} holds address {raw:#x}, not a record of its pool")]
    BadSlotAddress {
        /// The table.
        table: u32,
        /// The slot.
        slot: usize,
        /// The raw packed address found.
        raw: u64,
    },
    /// The bytes given as a bucket's READ are not that bucket's (another length), or a slot
    /// beyond the bucket's.
    #[error("{got} bytes / slot {slot} given for a {expected}-byte bucket of table {table}")]
    BadBucketRead {
        /// The table.
        table: u32,
        /// The slot asked for.
        slot: usize,
        /// Bytes given.
        got: usize,
        /// Bytes of the bucket.
        expected: usize,
    },
    /// A coordinator id beyond the configured log regions.
    #[error("coordinator {0} has no log region (configure more coordinators)")]
    NoLogRegion(u16),
    /// Every replica of a partition is on a failed MN.
    #[error("every replica of partition {0} has failed")]
    PartitionLost(u16),
}

/// How a transaction sees a store error, the same for every protocol on this store (FORD,
/// Pandora, Motor, LOTUS): a full index bucket and a used-up insert share abort the
/// transaction (a retry may find room: another slot, or the key inserted by someone else);
/// an unknown table and a wrong value size are the caller's mistakes; anything else (a lost
/// partition, a missing log region) aborts as "store unavailable".
impl From<StoreError> for dmem_txn::TxnError {
    fn from(e: StoreError) -> Self {
        use dmem_txn::{AbortReason, TxnError};
        match e {
            StoreError::UnknownTable(t) => TxnError::UnknownTable(t),
            StoreError::ValueSize { expected, got, .. } => TxnError::ValueSize { expected, got },
            StoreError::BucketFull { .. } => TxnError::Aborted(AbortReason::IndexBucketFull),
            StoreError::PoolExhausted { .. } => {
                TxnError::Aborted(AbortReason::RecordPoolShareUsedUp)
            }
            _ => TxnError::Aborted(AbortReason::StoreUnavailable),
        }
    }
}

/// One table of the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSpec {
    /// The table id.
    pub id: TableId,
    /// Size of every value of the table, bytes.
    pub value_len: usize,
    /// Index buckets per partition (each holds [`BUCKET_SLOTS`] records).
    pub buckets_per_partition: u32,
    /// Bytes of one record slot when the protocol's record format is not FORD's
    /// [`DataItem`] (Motor's and LOTUS's multi-version blocks: lock, CVT and version images);
    /// `None` sizes slots as [`DataItemHeader::item_len`] of the value. Must be a multiple of
    /// 8 (of 64 for cacheline-versioned images, which then stay line-aligned).
    pub item_len: Option<usize>,
    /// `Some(k)`: a direct-mapped index for keys in `0..k` (see the crate docs, "Direct-mapped
    /// tables"): key `k` is slot `(k / mns) % 7` of bucket `k / mns / 7` of a partition
    /// rotated per row, so every bucket indexes exactly seven keys of the key space and never
    /// fills.
    pub direct_keys: Option<u64>,
    /// `Some`: records live apart from the index slots in a per-partition pool, each slot
    /// holding its record's address (see the crate docs, "Sparse tables"); `None`: record
    /// `b * 7 + s` of a partition is the record of slot `s` of bucket `b`.
    pub pool: Option<RecordPool>,
}

/// The record pool of one partition of a sparse table: the loader's records first, then an
/// equal share for each coordinator's run-time inserts (no verb allocates: a coordinator
/// takes the records of its own share in order; Pandora never reuses a failed
/// coordinator's id, so a share is never taken twice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordPool {
    /// Records of each partition the loader may place.
    pub loaded: u64,
    /// Records of each partition each coordinator may insert.
    pub per_coordinator: u64,
}

impl TableSpec {
    /// Slots of each of the table's index buckets: [`WIDE_BUCKET_SLOTS`] for a hashed
    /// pooled table (hashed keys, records in a pool), [`BUCKET_SLOTS`] for every other
    /// table (direct-mapped, sparse, or records in the slots).
    #[must_use]
    pub const fn bucket_slots(&self) -> usize {
        if self.pool.is_some() && self.direct_keys.is_none() {
            WIDE_BUCKET_SLOTS
        } else {
            BUCKET_SLOTS
        }
    }

    /// Bytes of each of the table's index buckets (what one bucket READ fetches).
    #[must_use]
    pub const fn bucket_len(&self) -> usize {
        if self.bucket_slots() == WIDE_BUCKET_SLOTS {
            WIDE_BUCKET_LEN
        } else {
            BUCKET_LEN
        }
    }

    /// A table of `value_len`-byte values sized for about `records` records (buckets at
    /// most half full on average, so hashing rarely fills one).
    #[must_use]
    pub fn sized_for(id: TableId, value_len: usize, records: u64, mns: u16) -> Self {
        let per_partition = records.div_ceil(u64::from(mns.max(1)));
        let buckets = (per_partition * 2).div_ceil(BUCKET_SLOTS as u64).max(4);
        Self {
            id,
            value_len,
            buckets_per_partition: u32::try_from(buckets).unwrap_or(u32::MAX),
            item_len: None,
            direct_keys: None,
            pool: None,
        }
    }
}

/// The shape of a store: MNs, replication, tables, log regions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Number of MNs.
    pub mns: u16,
    /// Replicas per record, `f + 1` (default 3, capped by `mns`).
    pub replicas: u16,
    /// The tables.
    pub tables: Vec<TableSpec>,
    /// Coordinator ids `0..coordinators` get a log region on every MN.
    pub coordinators: u16,
    /// Bytes of each coordinator's log region (Pandora uses 32 KB, §3.2.2).
    pub log_region_bytes: u32,
}

impl StoreConfig {
    /// `mns` MNs, `min(3, mns)` replicas, no tables, 64 coordinators with 4 KiB logs.
    #[must_use]
    pub fn new(mns: u16) -> Self {
        Self {
            mns,
            replicas: mns.min(3),
            tables: Vec::new(),
            coordinators: 64,
            log_region_bytes: 4096,
        }
    }

    /// Sets the replication degree (`f + 1`).
    #[must_use]
    pub fn replicas(mut self, replicas: u16) -> Self {
        self.replicas = replicas;
        self
    }

    /// Adds a table.
    #[must_use]
    pub fn table(mut self, spec: TableSpec) -> Self {
        self.tables.push(spec);
        self
    }

    /// Sets the number of coordinator log regions.
    #[must_use]
    pub fn coordinators(mut self, n: u16) -> Self {
        self.coordinators = n;
        self
    }

    /// Sets the bytes of each log region.
    #[must_use]
    pub fn log_region_bytes(mut self, bytes: u32) -> Self {
        self.log_region_bytes = bytes;
        self
    }

    /// A configuration on `mns` MNs for `tables`, with index room for `slack` times the
    /// records each table holds (a table that grows gets room for as many inserts again).
    ///
    /// The index has no overflow buckets (a full bucket refuses a record), so it is
    /// over-provisioned: start with `slack` 2 (buckets a quarter full on average) and double
    /// it when loading meets [`StoreError::BucketFull`].
    #[must_use]
    pub fn for_tables(
        mns: u16,
        tables: &[TableDemand],
        coordinators: u16,
        log_region_bytes: u32,
        slack: u64,
    ) -> Self {
        let mut cfg = Self::new(mns)
            .coordinators(coordinators)
            .log_region_bytes(log_region_bytes);
        for t in tables {
            cfg = cfg.table(TableSpec::sized_for(
                t.id,
                t.value_len,
                t.index_records().saturating_mul(slack.max(1)),
                mns,
            ));
        }
        cfg
    }

    /// Like [`for_tables`](Self::for_tables) but with index room for exactly `slack` times
    /// each table's `expected_records`, no margin and no growth room: for small fixed key
    /// sets (the litmus tests) whose runs must keep one layout.
    #[must_use]
    pub fn for_exact_tables(
        mns: u16,
        tables: &[TableDemand],
        coordinators: u16,
        log_region_bytes: u32,
        slack: u64,
    ) -> Self {
        let mut cfg = Self::new(mns)
            .coordinators(coordinators)
            .log_region_bytes(log_region_bytes);
        for t in tables {
            cfg = cfg.table(TableSpec::sized_for(
                t.id,
                t.value_len,
                t.expected_records.saturating_mul(slack.max(1)),
                mns,
            ));
        }
        cfg
    }

    /// Sets the record slot length of `table` (see [`TableSpec::item_len`]): for protocols
    /// whose record format is not FORD's. Unknown tables are ignored.
    #[must_use]
    pub fn with_item_len(mut self, table: TableId, item_len: usize) -> Self {
        for t in &mut self.tables {
            if t.id == table {
                t.item_len = Some(item_len);
            }
        }
        self
    }

    /// Gives `table` a direct-mapped index for keys in `0..key_space` (see
    /// [`TableSpec::direct_keys`]): one index slot and one record slot per key of the key
    /// space, whatever the slack, so the table never meets [`StoreError::BucketFull`] and
    /// needs no index doubling. For dense integer keys (SmallBank accounts, TATP
    /// subscribers, KVS keys), as Motor's own code indexes SmallBank. Unknown tables are
    /// ignored.
    #[must_use]
    pub fn with_direct_index(mut self, table: TableId, key_space: u64) -> Self {
        let mns = u64::from(self.mns.max(1));
        for t in &mut self.tables {
            if t.id == table {
                let per_partition = key_space.div_ceil(mns);
                let buckets = per_partition.div_ceil(BUCKET_SLOTS as u64).max(1);
                t.buckets_per_partition = u32::try_from(buckets).unwrap_or(u32::MAX);
                t.direct_keys = Some(key_space);
            }
        }
        self
    }

    /// Lays the records of direct-mapped `table` apart from its index slots, in a pool per
    /// partition with room for the records `demand` loads (plus 1/16 and 64 per partition)
    /// and, for a table that grows, for as many inserts again plus 4096, shared equally by
    /// the coordinators (see the crate docs, "Sparse tables"). Call after
    /// [`with_direct_index`](Self::with_direct_index) and
    /// [`coordinators`](Self::coordinators). Unknown tables are ignored.
    #[must_use]
    pub fn with_record_pool(mut self, demand: &TableDemand) -> Self {
        let mns = u64::from(self.mns.max(1));
        let coordinators = u64::from(self.coordinators.max(1));
        for t in &mut self.tables {
            if t.id == demand.id {
                let records = demand.expected_records;
                let loaded = (records + records / 16).div_ceil(mns) + 64;
                let inserts = if demand.grows {
                    (records + 4096).div_ceil(mns)
                } else {
                    0
                };
                t.pool = Some(RecordPool {
                    loaded,
                    per_coordinator: inserts.div_ceil(coordinators),
                });
            }
        }
        self
    }

    /// Direct-mapped indexes for every `(table, key_space)`, each table's records pooled
    /// ([`with_record_pool`](Self::with_record_pool)) when its pool is smaller than its
    /// key space (a sparse table: TATP's ACCESS_INFO, SPECIAL_FACILITY and
    /// CALL_FORWARDING) and in the slots otherwise (dense keys: SmallBank's accounts).
    /// What a protocol that follows the address in an index slot lays out.
    #[must_use]
    pub fn with_sparse_indexes(self, demands: &[TableDemand], tables: &[(TableId, u64)]) -> Self {
        let mut cfg = self.with_direct_indexes(tables);
        for &(id, key_space) in tables {
            let Some(demand) = demands.iter().find(|d| d.id == id) else {
                continue;
            };
            let pooled = cfg.clone().with_record_pool(demand);
            let pool = pooled
                .tables
                .iter()
                .find(|t| t.id == id)
                .and_then(|t| t.pool);
            if let Some(pool) = pool {
                let mns = u64::from(cfg.mns.max(1));
                let per_partition = pool
                    .loaded
                    .saturating_add(pool.per_coordinator * u64::from(cfg.coordinators.max(1)));
                if per_partition.saturating_mul(mns) < key_space {
                    cfg = pooled;
                }
            }
        }
        cfg
    }

    /// [`with_direct_index`](Self::with_direct_index) for every `(table, key_space)`.
    #[must_use]
    pub fn with_direct_indexes(self, tables: &[(TableId, u64)]) -> Self {
        tables
            .iter()
            .fold(self, |cfg, &(t, k)| cfg.with_direct_index(t, k))
    }

    /// Bytes every MN region needs for this layout, computed without any region (so a
    /// cluster can be sized before it is built).
    ///
    /// # Errors
    /// [`StoreError::DuplicateTable`] or [`StoreError::Replication`].
    pub fn bytes_per_mn(&self) -> Result<u64, StoreError> {
        Ok(Layout::compute(self)?.bytes_per_mn)
    }
}

/// What a table needs from the store, independent of any workload crate: the deployment
/// layer converts a workload's schema into these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableDemand {
    /// The table id.
    pub id: TableId,
    /// Bytes of every value.
    pub value_len: usize,
    /// Records after loading.
    pub expected_records: u64,
    /// Whether transactions insert into the table while they run.
    pub grows: bool,
}

impl TableDemand {
    /// Records the index must hold: the loaded ones plus a margin, and for a growing table
    /// as many inserts again plus 4096.
    #[must_use]
    pub fn index_records(&self) -> u64 {
        if self.grows {
            self.expected_records * 2 + 4096
        } else {
            self.expected_records + 64
        }
    }
}

/// The offsets of a configuration, independent of the regions.
struct Layout {
    tables: HashMap<TableId, TableLayout>,
    log_base: u64,
    bytes_per_mn: u64,
}

impl Layout {
    fn compute(config: &StoreConfig) -> Result<Self, StoreError> {
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
    fn bucket_loc(&self, partition: u16, bucket: u32) -> BucketLoc {
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

    fn record_offset(&self, partition: u16, record: u64) -> u64 {
        self.records_offset(partition) + record * self.item_len as u64
    }

    fn item_offset(&self, partition: u16, bucket: u32, slot: usize) -> u64 {
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

/// Which MNs are alive, as every CN sees it (Pandora §3.2.5: all CNs are notified of an MN
/// failure and recompute primaries deterministically).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MnView {
    failed: u64,
}

impl MnView {
    /// Every MN alive.
    #[must_use]
    pub const fn all_alive() -> Self {
        Self { failed: 0 }
    }

    /// Marks MN index `mn` failed.
    pub fn mark_failed(&mut self, mn: u16) {
        if mn < 64 {
            self.failed |= 1 << mn;
        }
    }

    /// Whether MN index `mn` is alive.
    #[must_use]
    pub const fn is_alive(&self, mn: u16) -> bool {
        mn >= 64 || self.failed & (1 << mn) == 0
    }

    /// The failed MNs as a bitmask (bit `i` = MN index `i`), what an MN-failure
    /// notification carries.
    #[must_use]
    pub const fn failed_mask(&self) -> u64 {
        self.failed
    }

    /// Adds the failed MNs of `mask` (idempotent and commutative, so every CN that applied
    /// the same notifications has the same view, whatever their order).
    pub fn merge_failed(&mut self, mask: u64) {
        self.failed |= mask;
    }
}

/// The computed layout of a store plus the MN regions it lives in.
///
/// Shared (behind an `Rc`) by every coordinator, the loader and the recovery coordinator.
#[derive(Debug, Clone)]
pub struct Store {
    config: StoreConfig,
    tables: HashMap<TableId, TableLayout>,
    regions: Vec<MemoryRegion>,
    log_base: u64,
    bytes_per_mn: u64,
    view: Rc<RefCell<MnView>>,
}

/// splitmix64 finaliser: a fixed, well-mixed hash every node computes alike.
#[must_use]
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Store {
    /// Lays `config` out over `regions` (one per MN, in MN order).
    ///
    /// # Errors
    /// A [`StoreError`] if the schema is inconsistent or does not fit a region.
    pub fn new(config: StoreConfig, regions: Vec<MemoryRegion>) -> Result<Self, StoreError> {
        if regions.len() != usize::from(config.mns) {
            return Err(StoreError::Regions {
                got: regions.len(),
                mns: config.mns,
            });
        }
        let Layout {
            tables,
            log_base,
            bytes_per_mn,
        } = Layout::compute(&config)?;
        for region in &regions {
            if region.len < bytes_per_mn {
                return Err(StoreError::TooLarge {
                    needed: bytes_per_mn,
                    have: region.len,
                    node: region.node,
                });
            }
        }
        Ok(Self {
            config,
            tables,
            regions,
            log_base,
            bytes_per_mn,
            view: Rc::new(RefCell::new(MnView::all_alive())),
        })
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Bytes of every MN region the layout uses.
    #[must_use]
    pub fn bytes_per_mn(&self) -> u64 {
        self.bytes_per_mn
    }

    /// The layout of `table`.
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`].
    pub fn table(&self, table: TableId) -> Result<&TableLayout, StoreError> {
        self.tables
            .get(&table)
            .ok_or(StoreError::UnknownTable(table.0))
    }

    /// The MN node of MN index `mn`.
    #[must_use]
    pub fn mn_node(&self, mn: u16) -> NodeId {
        self.regions[usize::from(mn)].node
    }

    /// The MN index of node `node`, if it is one of the store's MNs.
    #[must_use]
    pub fn mn_index(&self, node: NodeId) -> Option<u16> {
        self.regions
            .iter()
            .position(|r| r.node == node)
            .and_then(|i| u16::try_from(i).ok())
    }

    /// The address of `offset` on MN index `mn`.
    #[must_use]
    pub fn addr(&self, mn: u16, offset: u64) -> RemoteAddr {
        let region = &self.regions[usize::from(mn)];
        RemoteAddr {
            node: region.node,
            rkey: region.rkey,
            offset,
        }
    }

    /// The shared view of live MNs (Pandora §3.2.5).
    #[must_use]
    pub fn view(&self) -> &Rc<RefCell<MnView>> {
        &self.view
    }

    /// The same layout with a view of its own, starting as a copy of this one. Each CN (and
    /// the failure detector) holds its own fork, so that it changes its view only when *it*
    /// learns of an MN failure (Pandora §3.2.5); a plain `clone` shares the view.
    #[must_use]
    pub fn fork_view(&self) -> Self {
        let view = self.view.borrow().clone();
        Self {
            view: Rc::new(RefCell::new(view)),
            ..self.clone()
        }
    }

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

    /// Every replica of `partition` (MN indices, primary first, failed MNs included).
    #[must_use]
    pub fn replicas(&self, partition: u16) -> Vec<u16> {
        (0..self.config.replicas)
            .map(|i| (partition + i) % self.config.mns)
            .collect()
    }

    /// The live replicas of `partition`, primary first (Pandora §3.2.5: the first live
    /// replica is the new primary).
    #[must_use]
    pub fn live_replicas(&self, partition: u16) -> Vec<u16> {
        let view = self.view.borrow();
        self.replicas(partition)
            .into_iter()
            .filter(|&m| view.is_alive(m))
            .collect()
    }

    /// The current primary of `partition`.
    ///
    /// # Errors
    /// [`StoreError::PartitionLost`] if every replica failed.
    pub fn primary(&self, partition: u16) -> Result<u16, StoreError> {
        self.live_replicas(partition)
            .first()
            .copied()
            .ok_or(StoreError::PartitionLost(partition))
    }

    /// Offset of coordinator `coordinator`'s log region (the same on every MN).
    ///
    /// # Errors
    /// [`StoreError::NoLogRegion`].
    pub fn log_offset(&self, coordinator: u16) -> Result<u64, StoreError> {
        if coordinator >= self.config.coordinators {
            return Err(StoreError::NoLogRegion(coordinator));
        }
        Ok(self.log_base + u64::from(coordinator) * u64::from(self.config.log_region_bytes))
    }

    /// Bytes of one log region.
    #[must_use]
    pub fn log_region_bytes(&self) -> usize {
        self.config.log_region_bytes as usize
    }

    /// The `f + 1` MNs that hold `coordinator`'s Pandora log (§3.1.4): consecutive MNs
    /// starting at `coordinator % mns`, live ones only.
    #[must_use]
    pub fn pandora_log_mns(&self, coordinator: u16) -> Vec<u16> {
        let start = coordinator % self.config.mns;
        let view = self.view.borrow();
        (0..self.config.replicas)
            .map(|i| (start + i) % self.config.mns)
            .filter(|&m| view.is_alive(m))
            .collect()
    }

    /// Bytes of a log header (the first READ of a log region can stop there).
    #[must_use]
    pub const fn log_header_len() -> usize {
        LogRegionHeader::LEN
    }
}

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

/// Byte offset of slot `slot` inside a bucket (the same in a 7-slot and a wide bucket:
/// a 16-byte header, then 16-byte slots).
#[must_use]
pub fn slot_offset(slot: usize) -> u64 {
    WideBucket::slot_offset(slot).map_or(0, |o| o as u64)
}

/// The 16 bytes of an index slot mapping `key` to `addr`.
#[must_use]
pub fn index_slot_bytes(key: u64, addr: PackedAddr) -> [u8; 16] {
    let slot = IndexSlot::new(key, addr);
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&slot.key().to_le_bytes());
    out[8..].copy_from_slice(&slot.addr().to_raw().to_le_bytes());
    out
}

/// The image of an unlocked item, `item_len` bytes, with no recorded installer (loaded
/// records).
#[must_use]
pub fn encode_item(
    key: u64,
    table: u32,
    version: DataVersion,
    flags: ItemFlags,
    value: &[u8],
    item_len: usize,
) -> Vec<u8> {
    encode_item_by(
        key,
        table,
        version,
        flags,
        value,
        item_len,
        DataItemHeader::NO_WRITER,
    )
}

/// The image of an unlocked item whose version was installed by `writer` (a packed
/// transaction id, [`DataItemHeader::pack_writer`]), so that readers can tell the history
/// checker which transaction wrote what they saw.
#[must_use]
pub fn encode_item_by(
    key: u64,
    table: u32,
    version: DataVersion,
    flags: ItemFlags,
    value: &[u8],
    item_len: usize,
    writer: u64,
) -> Vec<u8> {
    let mut buf = vec![0u8; item_len];
    let header = DataItemHeader::new(
        key,
        table,
        u16::try_from(value.len()).unwrap_or(u16::MAX),
        version,
        flags,
    )
    .with_writer(writer);
    // The buffer is item_len(value.len()) bytes and values are at most u16::MAX (checked by
    // the table spec), so emit cannot fail; on a failure the buffer stays zero (free, absent).
    let _ = DataItem::emit(&mut buf[..], header, value);
    buf
}

/// The slots of one bucket READ ([`BucketLoc::read_len`] bytes: a 7-slot bucket, or a
/// wide one of a hashed pooled table): `(slot, key)` of every used slot, in order, and the
/// first free slot. Bytes of any other length hold no slot and no free slot (a lookup finds
/// nothing, an insert finds no room).
#[must_use]
pub fn parse_bucket(bytes: &[u8]) -> (Vec<(usize, u64)>, Option<usize>) {
    fn used_and_free(
        slots: &[IndexSlot],
        free: Option<usize>,
    ) -> (Vec<(usize, u64)>, Option<usize>) {
        let used = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .map(|(i, s)| (i, s.key()))
            .collect();
        (used, free)
    }
    match bytes.len() {
        BUCKET_LEN => Bucket::parse(bytes).map(|b| used_and_free(b.slots(), b.free_slot())),
        WIDE_BUCKET_LEN => {
            WideBucket::parse(bytes).map(|b| used_and_free(b.slots(), b.free_slot()))
        }
        _ => return (Vec::new(), None),
    }
    .unwrap_or((Vec::new(), None))
}

/// A coordinator's cursors into its insert shares of the record pools (see [`RecordPool`]):
/// how many records it has claimed per `(table, partition)`. CN-side only, no verbs: the
/// share is the coordinator's alone. A record counts as claimed once a verb that may make an
/// index slot name it is posted ([`claimed`](Self::claimed), called before the slot CAS); a
/// record picked for an insert that gave up before that is picked again by the next insert.
#[derive(Debug, Default, Clone)]
pub struct InsertPool {
    claimed: HashMap<(TableId, u16), u64>,
}

impl InsertPool {
    /// No record claimed.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The item an insert of `coordinator` into free slot `slot` of `bucket` would write
    /// ([`Store::insert_item`]).
    ///
    /// # Errors
    /// As [`Store::insert_item`].
    pub fn next(
        &self,
        store: &Store,
        coordinator: u16,
        bucket: BucketLoc,
        slot: usize,
    ) -> Result<ItemLoc, StoreError> {
        let n = self
            .claimed
            .get(&(bucket.table, bucket.partition))
            .copied()
            .unwrap_or(0);
        store.insert_item(bucket, slot, coordinator, n)
    }

    /// Notes that the record [`next`](Self::next) gave for `bucket` is now named by an
    /// index slot (a no-op for tables whose records live in the slots).
    pub fn claimed(&mut self, store: &Store, bucket: BucketLoc) {
        if store.table(bucket.table).is_ok_and(TableLayout::is_pooled) {
            *self
                .claimed
                .entry((bucket.table, bucket.partition))
                .or_insert(0) += 1;
        }
    }
}

/// Where a warm [`AddressCache`] finds the loaded records.
#[derive(Debug, Clone)]
enum WarmIndex {
    /// A loader of this thread's, which may still load more.
    Loading(Rc<RefCell<LoadIndex>>),
    /// A finished load, shared read-only by the cores of a CN process.
    Placed(Arc<LoadIndex>),
}

/// The CN-side address cache: `(table, key) → item location`, filled by index lookups so
/// that a repeated access skips the bucket READ (FORD's address cache).
///
/// Locations never change (slots are never freed), so entries never go stale; the cache is
/// bounded only by the keys a CN touches.
#[derive(Debug, Default, Clone)]
pub struct AddressCache {
    map: HashMap<(TableId, Key), ItemLoc>,
    /// The loaded records every CN knows at start-up (a warm cache), shared by all CNs
    /// instead of copied into each map.
    warm: Option<(Rc<Store>, WarmIndex)>,
    hits: u64,
    misses: u64,
}

impl AddressCache {
    /// An empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Looks a key up, counting hits and misses.
    pub fn get(&mut self, table: TableId, key: Key) -> Option<ItemLoc> {
        let found = self.map.get(&(table, key)).copied().or_else(|| {
            let (store, loaded) = self.warm.as_ref()?;
            match loaded {
                WarmIndex::Loading(loaded) => loaded.borrow().loc(store, table, key),
                WarmIndex::Placed(placed) => placed.loc(store, table, key),
            }
        });
        if found.is_some() {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        found
    }

    /// Remembers a location.
    pub fn put(&mut self, table: TableId, key: Key, loc: ItemLoc) {
        self.map.insert((table, key), loc);
    }

    /// Remembers many locations at once, e.g. the ones [`Loader::load`] returned: the warm
    /// cache of a CN that scanned the index at start-up, so that its first access to a
    /// loaded record skips the bucket READ. Counts neither hits nor misses.
    pub fn fill(&mut self, locs: impl IntoIterator<Item = (TableId, Key, ItemLoc)>) {
        self.map
            .extend(locs.into_iter().map(|(t, k, loc)| ((t, k), loc)));
    }

    /// Answers for every record `loaded` holds, now and later, as if [`fill`](Self::fill)
    /// had been given their locations, without a copy per CN: what a paper-scale warm cache
    /// needs (the locations of a direct-mapped table are computed from the key).
    pub fn warm_from(&mut self, store: Rc<Store>, loaded: Rc<RefCell<LoadIndex>>) {
        self.warm = Some((store, WarmIndex::Loading(loaded)));
    }

    /// [`warm_from`](Self::warm_from) a loader's finished index shared across threads (the
    /// one dry load of a CN process, which every core's deployment takes as its placement)
    /// instead of one that is still loading.
    pub fn warm_from_placed(&mut self, store: Rc<Store>, placed: Arc<LoadIndex>) {
        self.warm = Some((store, WarmIndex::Placed(placed)));
    }

    /// `(hits, misses)` so far.
    #[must_use]
    pub fn stats(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    /// Number of cached locations.
    #[must_use]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the cache is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use dmem_verbs::RKey;

    /// One region of `len` bytes on each of MNs `0..n` (also `hashed_pool`'s tests).
    pub(crate) fn regions(n: u16, len: u64) -> Vec<MemoryRegion> {
        (0..n)
            .map(|i| MemoryRegion {
                node: NodeId(i),
                rkey: RKey(u32::from(i) + 1),
                len,
            })
            .collect()
    }

    fn store() -> Store {
        let cfg = StoreConfig::new(3)
            .table(TableSpec::sized_for(TableId(1), 16, 100, 3))
            .table(TableSpec::sized_for(TableId(2), 100, 50, 3))
            .coordinators(8);
        Store::new(cfg, regions(3, 1 << 20)).unwrap()
    }

    #[test]
    fn replicas_are_distinct_and_primary_first() {
        let s = store();
        for p in 0..3 {
            let r = s.replicas(p);
            assert_eq!(r.len(), 3);
            assert_eq!(r[0], p);
            let mut d = r.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), 3);
        }
        s.view().borrow_mut().mark_failed(1);
        assert_eq!(s.primary(1).unwrap(), 2);
        assert_eq!(s.live_replicas(0), vec![0, 2]);
    }

    #[test]
    fn areas_do_not_overlap_and_items_are_aligned() {
        let s = store();
        let t1 = *s.table(TableId(1)).unwrap();
        let t2 = *s.table(TableId(2)).unwrap();
        assert!(t1.base + t1.partition_bytes * 3 <= t2.base);
        assert!(t2.base + t2.partition_bytes * 3 <= s.log_offset(0).unwrap());
        assert_eq!(
            s.log_offset(7).unwrap() + 4096,
            s.bytes_per_mn(),
            "the last log region ends the layout"
        );
        assert!(s.log_offset(8).is_err());
        for key in 0..200 {
            let b = s.bucket_of(TableId(2), Key(key)).unwrap();
            for slot in 0..BUCKET_SLOTS {
                let loc = s.item_at(b, slot).unwrap();
                assert_eq!(loc.offset % 8, 0);
                assert!(loc.offset >= t2.base && loc.offset < t2.base + 3 * t2.partition_bytes);
            }
        }
    }

    #[test]
    fn loader_writes_every_replica_and_refuses_duplicates() {
        let s = store();
        let mut mem = vec![vec![0u8; 1 << 20]; 3];
        let mut loader = Loader::new(&s);
        let mut write = |n: NodeId, off: u64, b: &[u8]| {
            let off = off as usize;
            mem[usize::from(n.0)][off..off + b.len()].copy_from_slice(b);
        };
        let loc = loader
            .load(TableId(1), Key(42), &[7; 16], &mut write)
            .unwrap();
        assert_eq!(
            loader.load(TableId(1), Key(42), &[7; 16], &mut write),
            Err(StoreError::DuplicateKey { table: 1, key: 42 })
        );
        assert!(matches!(
            loader.load(TableId(1), Key(43), &[7; 3], &mut write),
            Err(StoreError::ValueSize { .. })
        ));
        for mn in s.replicas(loc.bucket.partition) {
            let m = &mem[usize::from(mn)];
            let off = loc.offset as usize;
            let item = DataItem::new_checked(&m[off..off + DataItemHeader::item_len(16)]).unwrap();
            assert_eq!((item.key(), item.value()), (42, &[7u8; 16][..]));
            assert!(item.is_readable());
            let b = loc.bucket.offset as usize;
            let (used, free) = parse_bucket(&m[b..b + BUCKET_LEN]);
            assert_eq!(used, vec![(0, 42)]);
            assert_eq!(free, Some(1));
        }
    }

    #[test]
    fn sizing_matches_the_layout_and_grows_with_slack() {
        let demand = [
            TableDemand {
                id: TableId(1),
                value_len: 16,
                expected_records: 1000,
                grows: false,
            },
            TableDemand {
                id: TableId(2),
                value_len: 40,
                expected_records: 100,
                grows: true,
            },
        ];
        let cfg = StoreConfig::for_tables(3, &demand, 8, 1024, 2);
        let bytes = cfg.bytes_per_mn().unwrap();
        let laid = Store::new(cfg.clone(), regions(3, bytes)).unwrap();
        assert_eq!(laid.bytes_per_mn(), bytes);
        assert!(matches!(
            Store::new(cfg, regions(3, bytes - 1)),
            Err(StoreError::TooLarge { .. })
        ));
        let bigger = StoreConfig::for_tables(3, &demand, 8, 1024, 4);
        assert!(bigger.bytes_per_mn().unwrap() > bytes);
        assert_eq!(demand[1].index_records(), 100 * 2 + 4096);
        let dup = StoreConfig::new(3)
            .table(TableSpec::sized_for(TableId(1), 8, 10, 3))
            .table(TableSpec::sized_for(TableId(1), 8, 10, 3));
        assert_eq!(dup.bytes_per_mn(), Err(StoreError::DuplicateTable(1)));
    }

    #[test]
    fn fill_warms_the_cache_from_loaded_locations() {
        let s = store();
        let mut loader = Loader::new(&s);
        let mut locs = Vec::new();
        for k in 0..20 {
            let loc = loader
                .load(TableId(1), Key(k), &[1; 16], |_, _, _| {})
                .unwrap();
            locs.push((TableId(1), Key(k), loc));
        }
        let mut c = AddressCache::new();
        c.fill(locs.iter().copied());
        assert_eq!(c.len(), 20);
        assert_eq!(c.stats(), (0, 0));
        assert_eq!(c.get(TableId(1), Key(7)), Some(locs[7].2));
        assert_eq!(c.get(TableId(1), Key(20)), None);
    }

    fn direct_store(key_space: u64) -> Store {
        let demand = [TableDemand {
            id: TableId(1),
            value_len: 16,
            expected_records: key_space,
            grows: false,
        }];
        let cfg = StoreConfig::for_tables(3, &demand, 2, 1024, 2)
            .with_direct_index(TableId(1), key_space);
        let bytes = cfg.bytes_per_mn().unwrap();
        Store::new(cfg, regions(3, bytes)).unwrap()
    }

    #[test]
    fn direct_index_holds_every_key_of_its_space_in_its_own_slot() {
        let key_space = 1000;
        let s = direct_store(key_space);
        let t = *s.table(TableId(1)).unwrap();
        // One record slot per key (rounded up to whole buckets), not per slack.
        assert_eq!(u64::from(t.spec.buckets_per_partition), 334_u64.div_ceil(7));
        let mut loader = Loader::new(&s);
        let mut seen = std::collections::HashSet::new();
        for k in (0..key_space).rev() {
            let loc = loader
                .load(TableId(1), Key(k), &[1; 16], |_, _, _| {})
                .unwrap();
            assert_eq!(Some(loc.slot), s.direct_slot(TableId(1), Key(k)).unwrap());
            assert!(
                seen.insert(loc.offset),
                "two keys share record {}",
                loc.offset
            );
        }
        assert_eq!(
            loader.load(TableId(1), Key(5), &[1; 16], |_, _, _| {}),
            Err(StoreError::DuplicateKey { table: 1, key: 5 })
        );
        assert_eq!(
            loader.load(TableId(1), Key(key_space), &[1; 16], |_, _, _| {}),
            Err(StoreError::KeyOutOfRange {
                table: 1,
                key: key_space,
                key_space
            })
        );
        assert_eq!(loader.loaded().borrow().len(), key_space);
    }

    #[test]
    fn warm_cache_answers_loaded_keys_only() {
        let s = Rc::new(direct_store(100));
        let mut loader = Loader::shared(Rc::clone(&s));
        let mut cache = AddressCache::new();
        cache.warm_from(Rc::clone(&s), loader.loaded());
        let loc = loader
            .load(TableId(1), Key(42), &[1; 16], |_, _, _| {})
            .unwrap();
        assert_eq!(cache.get(TableId(1), Key(42)), Some(loc));
        assert_eq!(cache.get(TableId(1), Key(43)), None);
        assert_eq!(cache.stats(), (1, 1));
        // Hashed tables answer from the slot each key took.
        let h = store();
        let mut loader = Loader::new(&h);
        let locs: Vec<_> = (0..30)
            .map(|k| {
                loader
                    .load(TableId(2), Key(k), &[0; 100], |_, _, _| {})
                    .unwrap()
            })
            .collect();
        for (k, loc) in locs.iter().enumerate() {
            assert_eq!(
                loader.loaded().borrow().loc(&h, TableId(2), Key(k as u64)),
                Some(*loc)
            );
        }
        assert_eq!(loader.loaded().borrow().loc(&h, TableId(2), Key(30)), None);
        // A finished load shared across threads answers the same, on another thread's store.
        let placed = Arc::new(loader.loaded().borrow().clone());
        let answers = std::thread::spawn(move || {
            let h = Rc::new(store());
            let mut cache = AddressCache::new();
            cache.warm_from_placed(Rc::clone(&h), placed);
            (0..31)
                .map(|k| cache.get(TableId(2), Key(k)))
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap();
        assert_eq!(
            answers[..30],
            locs.iter().copied().map(Some).collect::<Vec<_>>()
        );
        assert_eq!(answers[30], None);
    }

    /// A sparse table: 1,000 records in a key space of 16,000, growing, on 3 MNs with 4
    /// coordinators.
    fn pooled_store() -> (Store, TableDemand) {
        let demand = TableDemand {
            id: TableId(1),
            value_len: 16,
            expected_records: 1000,
            grows: true,
        };
        let cfg = StoreConfig::for_tables(3, &[demand], 4, 1024, 2)
            .with_sparse_indexes(&[demand], &[(TableId(1), 16_000)]);
        let bytes = cfg.bytes_per_mn().unwrap();
        (Store::new(cfg, regions(3, bytes)).unwrap(), demand)
    }

    #[test]
    fn sparse_tables_pool_their_records_and_dense_ones_do_not() {
        let (s, demand) = pooled_store();
        let t = *s.table(TableId(1)).unwrap();
        let pool = t
            .spec
            .pool
            .expect("a table filling 6 % of its key space is pooled");
        // Room for the records (+1/16 + 64 per partition) and as many inserts again.
        assert_eq!(pool.loaded, (1000 + 1000 / 16_u64).div_ceil(3) + 64);
        assert_eq!(
            pool.per_coordinator,
            (1000 + 4096_u64).div_ceil(3).div_ceil(4)
        );
        assert_eq!(
            t.records_per_partition,
            pool.loaded + 4 * pool.per_coordinator
        );
        let direct = StoreConfig::for_tables(3, &[demand], 4, 1024, 2)
            .with_direct_index(TableId(1), 16_000)
            .bytes_per_mn()
            .unwrap();
        assert!(
            s.bytes_per_mn() < direct,
            "{} >= {direct}",
            s.bytes_per_mn()
        );
        // A dense table keeps its records in the slots.
        let dense = StoreConfig::for_tables(3, &[demand], 4, 1024, 2)
            .with_sparse_indexes(&[demand], &[(TableId(1), 1000)]);
        assert_eq!(dense.tables[0].pool, None);
        assert_eq!(dense.tables[0].direct_keys, Some(1000));
    }

    #[test]
    fn pooled_records_are_found_through_their_slots() {
        let (s, _) = pooled_store();
        let bytes = s.bytes_per_mn() as usize;
        let mut mem = vec![vec![0u8; bytes]; 3];
        let mut loader = Loader::new(&s);
        let mut seen = std::collections::HashSet::new();
        for k in (0..16_000).step_by(16) {
            let loc = loader
                .load(TableId(1), Key(k), &[3; 16], |n, off, b| {
                    let off = off as usize;
                    mem[usize::from(n.0)][off..off + b.len()].copy_from_slice(b);
                })
                .unwrap();
            assert!(
                seen.insert(loc.offset),
                "two keys share record {}",
                loc.offset
            );
            assert_eq!(s.item_at(loc.bucket, loc.slot), Err(StoreError::Pooled(1)));
            for mn in s.replicas(loc.bucket.partition) {
                let m = &mem[usize::from(mn)];
                let b = loc.bucket.offset as usize;
                let bucket = &m[b..b + BUCKET_LEN];
                let (used, _) = parse_bucket(bucket);
                let slot = used.iter().find(|(_, key)| *key == k).unwrap().0;
                assert_eq!(s.item_in_bucket(loc.bucket, slot, bucket), Ok(loc));
                let off = loc.offset as usize;
                let item = DataItem::new_checked(&m[off..off + DataItemHeader::item_len(16)]);
                assert_eq!(item.unwrap().key(), k);
            }
            assert_eq!(
                loader.loaded().borrow().loc(&s, TableId(1), Key(k)),
                Some(loc)
            );
        }
        assert_eq!(loader.loaded().borrow().loc(&s, TableId(1), Key(1)), None);
        assert_eq!(
            loader.load(TableId(1), Key(16), &[3; 16], |_, _, _| {}),
            Err(StoreError::DuplicateKey { table: 1, key: 16 })
        );
        // A slot naming anything but a record of its partition's pool is refused.
        let loc = loader
            .loaded()
            .borrow()
            .loc(&s, TableId(1), Key(0))
            .unwrap();
        let other = (loc.bucket.partition + 1) % 3;
        for raw in [
            PackedAddr::new(other, loc.offset).unwrap(),
            PackedAddr::new(loc.bucket.partition, loc.offset + 8).unwrap(),
            PackedAddr::new(loc.bucket.partition, loc.bucket.offset).unwrap(),
            PackedAddr::NULL,
        ] {
            let slot = index_slot_bytes(0, raw);
            assert!(matches!(
                s.item_in_slot(loc.bucket, 0, &slot),
                Err(StoreError::BadSlotAddress { .. })
            ));
        }
    }

    #[test]
    fn loader_and_coordinators_take_disjoint_parts_of_a_pool() {
        let (s, _) = pooled_store();
        let pool = s.table(TableId(1)).unwrap().spec.pool.unwrap();
        let mut loader = Loader::new(&s);
        let mut loaded = std::collections::HashSet::new();
        let mut k = 0;
        // Fill partition 0's loader share, then one more key of it is refused.
        let mut in_p0 = 0;
        let refused = loop {
            let b = s.bucket_of(TableId(1), Key(k)).unwrap();
            if b.partition == 0 {
                match loader.load(TableId(1), Key(k), &[0; 16], |_, _, _| {}) {
                    Ok(loc) => {
                        loaded.insert(loc.offset);
                        in_p0 += 1;
                    }
                    Err(e) => break e,
                }
            }
            k += 1;
        };
        assert_eq!(in_p0, pool.loaded);
        assert!(matches!(
            refused,
            StoreError::PoolExhausted { partition: 0, .. }
        ));
        let bucket = s.bucket_of(TableId(1), Key(k)).unwrap();
        let mut pools = [InsertPool::new(), InsertPool::new()];
        let mut inserted = std::collections::HashSet::new();
        for n in 0..pool.per_coordinator {
            for (c, p) in pools.iter_mut().enumerate() {
                let c = c as u16;
                let loc = p.next(&s, c, bucket, 3).unwrap();
                assert_eq!(p.next(&s, c, bucket, 3).unwrap(), loc, "not claimed yet");
                assert_eq!(s.insert_item(bucket, 3, c, n), Ok(loc));
                p.claimed(&s, bucket);
                assert!(!loaded.contains(&loc.offset));
                assert!(
                    inserted.insert(loc.offset),
                    "record {} taken twice",
                    loc.offset
                );
                assert_eq!(
                    s.item_in_slot(
                        bucket,
                        3,
                        &index_slot_bytes(k, PackedAddr::new(0, loc.offset).unwrap())
                    ),
                    Ok(loc)
                );
            }
        }
        assert!(matches!(
            pools[0].next(&s, 0, bucket, 3),
            Err(StoreError::PoolExhausted { .. })
        ));
        assert_eq!(
            s.insert_item(bucket, 3, 4, 0),
            Err(StoreError::NoLogRegion(4))
        );
        let (first, records) = s.record_area(TableId(1), 0).unwrap();
        for off in loaded.iter().chain(&inserted) {
            assert!(
                *off >= first
                    && *off < first + records * s.table(TableId(1)).unwrap().item_len as u64
            );
        }
    }

    /// TATP at LOTUS's size (3M subscribers, 64 coordinators, 3 MNs; the demands and key
    /// spaces `dmem-workloads` declares): pooling its three sparse tables shrinks the
    /// regions by 32 % (the README's figures print with `--nocapture`).
    #[test]
    fn tatp_at_lotus_size_is_smaller_pooled() {
        let p = 3_000_000_u64;
        let ids = p + 1;
        let table = |id, value_len, records, grows| TableDemand {
            id: TableId(id),
            value_len,
            expected_records: records,
            grows,
        };
        let demands = [
            table(0, 48, p, false),
            table(1, 16, p * 5 / 2, false),
            table(2, 8, p * 5 / 2, false),
            table(3, 16, p * 15 / 4, true),
        ];
        let spaces = [
            (TableId(0), ids),
            (TableId(1), ids << 2),
            (TableId(2), ids << 2),
            (TableId(3), ids << 4),
        ];
        let base = StoreConfig::for_tables(3, &demands, 64, 4096, 2);
        let direct = base.clone().with_direct_indexes(&spaces);
        let pooled = base.with_sparse_indexes(&demands, &spaces);
        let (d, s) = (
            direct.bytes_per_mn().unwrap(),
            pooled.bytes_per_mn().unwrap(),
        );
        println!("bytes per MN: direct {d}, pooled {s}");
        // Resident: the index and the loaded records, on every replica.
        let touched: u64 = demands
            .iter()
            .zip(&spaces)
            .map(|(t, &(_, k))| {
                k.div_ceil(3).div_ceil(7) * 3 * BUCKET_LEN as u64
                    + t.expected_records * DataItemHeader::item_len(t.value_len) as u64
            })
            .sum();
        println!("index + records per replica: {touched}");
        assert!(s * 10 < d * 7, "{s} vs {d}");
        assert!(touched < s);
    }

    #[test]
    fn cache_counts_hits() {
        let s = store();
        let mut c = AddressCache::new();
        assert!(c.get(TableId(1), Key(1)).is_none());
        let loc = s
            .item_at(s.bucket_of(TableId(1), Key(1)).unwrap(), 0)
            .unwrap();
        c.put(TableId(1), Key(1), loc);
        assert_eq!(c.get(TableId(1), Key(1)), Some(loc));
        assert_eq!(c.stats(), (1, 1));
    }
}

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

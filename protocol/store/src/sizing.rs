//! What a store is asked to hold, before any MN region exists: the tables
//! ([`TableSpec`], [`TableDemand`]) and the configuration built from them ([`StoreConfig`]).
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
//! FORD, Pandora, Motor and LOTUS (`dmem-ford`, `dmem-motor`, `dmem-lotus`, laid out by
//! `dmem-protocols`) pool sparse tables and, outside the litmus tests' exact layout, hashed
//! tables (Motor's and LOTUS's multi-version blocks as FORD's records). LOTUS with CN
//! restarts keeps every block in its slot ([`StoreConfig::with_direct_indexes`]): a
//! protocol that brings a crashed coordinator back under its old id (LOTUS §6) could not
//! use the shares as they are, because the restarted coordinator's cursor would have to be
//! recovered first (the first record of its share that no slot names), which is not done.
//! OCC, DrTM and OOCC have their own store (`dmem-occ`).
//!
//! Memory regions are zeroed on allocation and never touched where no record lives (the
//! areas of partitions an MN does not replicate, the slots of absent keys), so those pages
//! cost address space, not resident memory.

use dmem_txn::TableId;

use crate::encoding::{BUCKET_LEN, BUCKET_SLOTS, WIDE_BUCKET_LEN, WIDE_BUCKET_SLOTS};
#[cfg(doc)]
use crate::{InsertPool, Store, StoreError, WideBucket, buckets_for};
#[cfg(doc)]
use dmem_layout::record::{DataItem, DataItemHeader};

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
    /// `Some(k)`: a direct-mapped index for keys in `0..k` (see module `sizing`, "Direct-mapped
    /// tables"): key `k` is slot `(k / mns) % 7` of bucket `k / mns / 7` of a partition
    /// rotated per row, so every bucket indexes exactly seven keys of the key space and never
    /// fills.
    pub direct_keys: Option<u64>,
    /// `Some`: records live apart from the index slots in a per-partition pool, each slot
    /// holding its record's address (see module `sizing`, "Sparse tables"); `None`: record
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
    /// the coordinators (see module `sizing`, "Sparse tables"). Call after
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

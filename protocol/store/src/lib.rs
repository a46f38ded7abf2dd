//! How tables live in memory-node (MN) memory: placement, the MN hash index, record
//! addresses, per-coordinator log regions, the out-of-band loader and the CN-side address
//! cache.
//!
//! Nothing here is FORD-specific except the record format ([`DataItem`]); the placement,
//! the index and the cache are shared by FORD, Pandora, Motor and LOTUS (Motor and LOTUS
//! bring their own record format, [`TableSpec::item_len`]), which is why this crate sits
//! below them. OCC, DrTM and OOCC (`dmem-occ`) have their own store.
//!
//! # Modules, by job
//!
//! Each depends only on the ones above it (links in docs aside):
//!
//! * `encoding`: the bytes of buckets, index slots and FORD's records ([`parse_bucket`],
//!   [`index_slot_bytes`], [`encode_item`]);
//! * `error`: [`StoreError`], and how a transaction sees it;
//! * `sizing`: what a store is asked to hold ([`TableDemand`], [`TableSpec`],
//!   [`StoreConfig`]); its docs explain direct-mapped and sparse (pooled) tables;
//! * `hashed_pool`: hashed tables with pooled records, wide buckets, where a layout's bytes
//!   go ([`Footprint`]);
//! * `layout`: the symmetric MN layout, the same offsets on every MN ([`TableLayout`],
//!   [`BucketLoc`], [`ItemLoc`], [`StoreConfig::bytes_per_mn`]);
//! * `store`: the laid-out [`Store`] over the MN regions, placement of partitions on
//!   replicas ([`MnView`]), log regions;
//! * `index`: key → bucket → record lookups of the hash index ([`Store::bucket_of`],
//!   [`Store::item_in_bucket`], [`Store::insert_item`]);
//! * `loader`: the out-of-band [`Loader`] and its compact [`LoadIndex`];
//! * `insert_pool`: a coordinator's cursors into its insert shares ([`InsertPool`]);
//! * `addr_cache`: the CN-side [`AddressCache`].

#![forbid(unsafe_code)]

mod addr_cache;
mod encoding;
mod error;
mod hashed_pool;
mod index;
mod insert_pool;
mod layout;
mod loader;
mod sizing;
mod store;
#[cfg(test)]
mod tests;

pub use addr_cache::AddressCache;
pub use encoding::{
    BUCKET_LEN, BUCKET_SLOTS, Bucket, WIDE_BUCKET_LEN, WIDE_BUCKET_SLOTS, WideBucket, encode_item,
    encode_item_by, index_slot_bytes, parse_bucket, slot_offset,
};
pub use error::StoreError;
pub use hashed_pool::{Footprint, OVERFLOW_BUDGET, TableFootprint, buckets_for};
pub use insert_pool::InsertPool;
pub use layout::{BucketLoc, ItemLoc, TableLayout};
pub use loader::{HashedEntry, LoadIndex, Loader};
pub use sizing::{RecordPool, StoreConfig, TableDemand, TableSpec};
pub use store::{MnView, Store};

#[cfg(doc)]
use dmem_layout::record::DataItem;

/// The placement hash every node computes alike: the workspace's one splitmix64.
pub use dmem_layout::mix::splitmix64 as mix64;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

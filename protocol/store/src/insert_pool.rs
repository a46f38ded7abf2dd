//! A coordinator's cursors into its insert shares of the record pools (CN-side, no verbs).

use std::collections::HashMap;

use dmem_txn::TableId;

#[cfg(doc)]
use crate::RecordPool;
use crate::error::StoreError;
use crate::layout::{BucketLoc, ItemLoc, TableLayout};
use crate::store::Store;

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

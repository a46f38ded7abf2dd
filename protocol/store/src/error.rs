//! Why a store could not be laid out, loaded or addressed, and how a transaction sees it.

use dmem_verbs::NodeId;

#[cfg(doc)]
use crate::Store;

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

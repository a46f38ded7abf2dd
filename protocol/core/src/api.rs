//! The coordinator API every protocol implements.
//!
//! A workload is written once against [`Transaction`]; `dmem bench` picks the protocol at run
//! time and runs the same workload code on each (the traits are generic, dispatch happens
//! once per run, not per operation).

use alloc::vec::Vec;
use core::future::Future;

use dmem_verbs::VerbsError;

use crate::model::{Key, TableId, TxnKind};

/// Why a transaction operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxnError {
    /// The protocol aborted the transaction (conflict, failed validation, lock not granted).
    /// The caller may retry it as a new transaction.
    #[error("transaction aborted: {0}")]
    Aborted(&'static str),
    /// A write in a transaction declared read-only.
    #[error("write in a read-only transaction")]
    ReadOnly,
    /// The table does not exist in the schema.
    #[error("unknown table {0}")]
    UnknownTable(u32),
    /// A value of the wrong size for its table.
    #[error("value of {got} bytes for a table of {expected}-byte values")]
    ValueSize {
        /// The table's value size.
        expected: usize,
        /// The size offered.
        got: usize,
    },
    /// An insert of a key that exists, or an update/delete of a key that does not.
    #[error("key {0} exists / does not exist as the operation requires")]
    KeyState(u64),
    /// The fabric failed (a node does not answer, access revoked, this CN crashed).
    #[error(transparent)]
    Verbs(#[from] VerbsError),
}

impl TxnError {
    /// Whether retrying as a new transaction may succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, TxnError::Aborted(_))
    }
}

/// One running transaction.
///
/// Reads return the record's value, or `None` if it is absent. Writes are buffered or
/// applied as the protocol does (FORD locks at `read_for_update`, LOTUS at `write`); every
/// method may abort. After an error the transaction is over: call [`abort`](Self::abort).
pub trait Transaction {
    /// Reads a record.
    fn read(
        &mut self,
        table: TableId,
        key: Key,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, TxnError>>;

    /// Reads a record the transaction will write (protocols lock it now or validate it later).
    fn read_for_update(
        &mut self,
        table: TableId,
        key: Key,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, TxnError>>;

    /// Replaces the value of a present record.
    fn write(
        &mut self,
        table: TableId,
        key: Key,
        value: &[u8],
    ) -> impl Future<Output = Result<(), TxnError>>;

    /// Creates an absent record.
    fn insert(
        &mut self,
        table: TableId,
        key: Key,
        value: &[u8],
    ) -> impl Future<Output = Result<(), TxnError>>;

    /// Removes a present record.
    fn delete(&mut self, table: TableId, key: Key) -> impl Future<Output = Result<(), TxnError>>;

    /// Tries to commit; `Err(TxnError::Aborted)` if it could not.
    fn commit(self) -> impl Future<Output = Result<(), TxnError>>;

    /// Aborts, releasing whatever the transaction holds.
    fn abort(self) -> impl Future<Output = ()>;
}

/// A coordinator: starts transactions of one protocol on one CN context.
pub trait Coordinator {
    /// The transaction type.
    type Txn<'a>: Transaction
    where
        Self: 'a;

    /// Begins a transaction.
    fn begin(&mut self, kind: TxnKind) -> Self::Txn<'_>;
}

//! The coordinator API every protocol implements.
//!
//! A workload is written once against [`Transaction`]; `dmem bench` picks the protocol at run
//! time and runs the same workload code on each.
//!
//! # Rounds
//!
//! A transaction's work is a sequence of *rounds*. In one round the workload names every
//! record it can already name — each read-only ([`Access::Read`]) or for update
//! ([`Access::ForUpdate`], which also covers the keys it will insert or delete, so that
//! protocols that lock eagerly lock them now) — and [`Transaction::read_round`] returns all
//! their values together. A protocol turns a round into one post list per memory node
//! (FORD, Motor: READ for read-only records, CAS + READ for the others; FORD `dtx.cc`), one
//! lock message per lock-owning CN (LOTUS §4.1) or one batched RPC per destination
//! (Dandelion §5). A protocol without batching inherits the sequential default, which
//! issues the round's reads one after the other and is always correct.
//!
//! [`Coordinator::begin`] is async so that multi-version protocols can take a start
//! timestamp from a timestamp service before the first round (Motor, LOTUS §5.1).
//!
//! # Static and dynamic dispatch
//!
//! The traits are generic (`impl Future` returns), so a benchmark compiled for one protocol
//! pays no virtual call. A protocol chosen by name at run time is driven through the
//! object-safe mirror [`DynCoordinator`] / [`DynTransaction`]: every [`Coordinator`] is a
//! `DynCoordinator`, and a `Box<dyn DynCoordinator>` is again a [`Coordinator`], so the
//! workload code is the same either way. The price of the dynamic form is one boxed future
//! per operation.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::future::Future;
use core::pin::Pin;

use dmem_verbs::VerbsError;

use crate::abort::AbortReason;
use crate::model::{Key, TableId, TxnKind};

/// Why a transaction operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxnError {
    /// The protocol aborted the transaction (conflict, failed validation, lock not granted).
    /// The caller may retry it as a new transaction.
    #[error("transaction aborted: {0}")]
    Aborted(AbortReason),
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
    /// The store has no room left for a record the transaction inserts: the run outgrew
    /// the insert room it was sized for. Not retryable.
    #[error("out of room: {0}")]
    OutOfRoom(&'static str),
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

/// How a round accesses one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Read only: protocols validate it at commit (OCC) or read a snapshot (MVCC).
    Read,
    /// Read a record the transaction will write, insert or delete: protocols that lock
    /// eagerly (FORD, Motor, LOTUS) lock it in this round.
    ForUpdate,
}

/// One record of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadReq {
    /// The table.
    pub table: TableId,
    /// The key.
    pub key: Key,
    /// Read-only or for update.
    pub access: Access,
}

impl ReadReq {
    /// A read-only access to `(table, key)`.
    #[must_use]
    pub const fn read(table: TableId, key: Key) -> Self {
        Self {
            table,
            key,
            access: Access::Read,
        }
    }

    /// A for-update access to `(table, key)`.
    #[must_use]
    pub const fn for_update(table: TableId, key: Key) -> Self {
        Self {
            table,
            key,
            access: Access::ForUpdate,
        }
    }
}

/// The values a round returns, one per [`ReadReq`] in order (`None`: absent).
pub type RoundValues = Vec<Option<Vec<u8>>>;

/// A round's requests split into those a transaction answers from what it already holds
/// and the distinct records it must fetch — the first step of every batching protocol's
/// round (Motor, LOTUS).
///
/// A record asked for twice is fetched once, for update if either request was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundPlan {
    /// Per request: its value, or the index of the fetch that answers it.
    answers: Vec<Result<Option<Vec<u8>>, usize>>,
    /// The distinct records to fetch, in first-asked order.
    pub fetches: Vec<ReadReq>,
}

impl RoundPlan {
    /// Plans `reqs`: `local` answers a request from the transaction's own read and write
    /// sets (`Some(value)`), or says it must be fetched (`None`).
    pub fn new(
        reqs: &[ReadReq],
        mut local: impl FnMut(&ReadReq) -> Option<Option<Vec<u8>>>,
    ) -> Self {
        let mut answers = Vec::with_capacity(reqs.len());
        let mut fetches: Vec<ReadReq> = Vec::new();
        for r in reqs {
            if let Some(v) = local(r) {
                answers.push(Ok(v));
            } else if let Some(n) = fetches
                .iter()
                .position(|f| f.table == r.table && f.key == r.key)
            {
                if r.access == Access::ForUpdate {
                    fetches[n].access = Access::ForUpdate;
                }
                answers.push(Err(n));
            } else {
                fetches.push(*r);
                answers.push(Err(fetches.len() - 1));
            }
        }
        Self { answers, fetches }
    }

    /// The round's values in request order, fetch `n`'s value from `fetched(n)`.
    pub fn values(self, mut fetched: impl FnMut(usize) -> Option<Vec<u8>>) -> RoundValues {
        self.answers
            .into_iter()
            .map(|a| match a {
                Ok(v) => v,
                Err(n) => fetched(n),
            })
            .collect()
    }
}

/// One running transaction.
///
/// Reads return the record's value, or `None` if it is absent. Writes are buffered or
/// applied as the protocol does (FORD locks at `read_for_update`, LOTUS at `write`); every
/// method may abort. After an error the transaction is over: call [`abort`](Self::abort).
pub trait Transaction {
    /// Executes one round: every request is issued together and the values come back
    /// together, in request order. The default issues them one after the other (correct
    /// for any protocol); batching protocols override it.
    fn read_round(
        &mut self,
        reqs: &[ReadReq],
    ) -> impl Future<Output = Result<RoundValues, TxnError>> {
        async move {
            let mut values = Vec::with_capacity(reqs.len());
            for r in reqs {
                values.push(match r.access {
                    Access::Read => self.read(r.table, r.key).await?,
                    Access::ForUpdate => self.read_for_update(r.table, r.key).await?,
                });
            }
            Ok(values)
        }
    }

    /// Reads a record: a round of one read-only access. The default runs
    /// [`read_round`](Self::read_round); a protocol implements `read_round`, or `read` and
    /// `read_for_update` (whose defaults call each other the other way). One that implements
    /// neither does not compile (the two default futures would contain each other).
    fn read(
        &mut self,
        table: TableId,
        key: Key,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, TxnError>> {
        async move {
            Ok(self
                .read_round(&[ReadReq::read(table, key)])
                .await?
                .pop()
                .flatten())
        }
    }

    /// Reads a record the transaction will write: a round of one for-update access (the
    /// default runs [`read_round`](Self::read_round)).
    fn read_for_update(
        &mut self,
        table: TableId,
        key: Key,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, TxnError>> {
        async move {
            Ok(self
                .read_round(&[ReadReq::for_update(table, key)])
                .await?
                .pop()
                .flatten())
        }
    }

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
    type Txn<'a>: Transaction + 'a
    where
        Self: 'a;

    /// Begins a transaction (MVCC protocols take their start timestamp here).
    fn begin(&mut self, kind: TxnKind) -> impl Future<Output = Result<Self::Txn<'_>, TxnError>>;

    /// Network round trips this coordinator has awaited so far, for a protocol whose round
    /// trips are not its context's post lists (two-sided RPCs: Dandelion, FaSST). `None`,
    /// the default: a runner counts the post lists the coordinator's context awaited.
    fn round_trips(&self) -> Option<u64> {
        None
    }
}

/// A boxed, not necessarily `Send`, future (the simulated cluster and the per-core
/// executors run every coordinator on one thread).
pub type LocalBoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// The object-safe mirror of [`Transaction`] (see the module docs). Implemented for every
/// `Transaction`; a `Box<dyn DynTransaction>` is a `Transaction` again.
#[allow(missing_docs)] // each method is its `Transaction` namesake
pub trait DynTransaction<'a> {
    fn dyn_read_round<'s>(
        &'s mut self,
        reqs: &'s [ReadReq],
    ) -> LocalBoxFuture<'s, Result<RoundValues, TxnError>>
    where
        'a: 's;
    fn dyn_read<'s>(
        &'s mut self,
        table: TableId,
        key: Key,
    ) -> LocalBoxFuture<'s, Result<Option<Vec<u8>>, TxnError>>
    where
        'a: 's;
    fn dyn_read_for_update<'s>(
        &'s mut self,
        table: TableId,
        key: Key,
    ) -> LocalBoxFuture<'s, Result<Option<Vec<u8>>, TxnError>>
    where
        'a: 's;
    fn dyn_write<'s>(
        &'s mut self,
        table: TableId,
        key: Key,
        value: &'s [u8],
    ) -> LocalBoxFuture<'s, Result<(), TxnError>>
    where
        'a: 's;
    fn dyn_insert<'s>(
        &'s mut self,
        table: TableId,
        key: Key,
        value: &'s [u8],
    ) -> LocalBoxFuture<'s, Result<(), TxnError>>
    where
        'a: 's;
    fn dyn_delete<'s>(
        &'s mut self,
        table: TableId,
        key: Key,
    ) -> LocalBoxFuture<'s, Result<(), TxnError>>
    where
        'a: 's;
    fn dyn_commit(self: Box<Self>) -> LocalBoxFuture<'a, Result<(), TxnError>>;
    fn dyn_abort(self: Box<Self>) -> LocalBoxFuture<'a, ()>;
}

impl<'a, T: Transaction + 'a> DynTransaction<'a> for T {
    fn dyn_read_round<'s>(
        &'s mut self,
        reqs: &'s [ReadReq],
    ) -> LocalBoxFuture<'s, Result<RoundValues, TxnError>>
    where
        'a: 's,
    {
        Box::pin(self.read_round(reqs))
    }
    fn dyn_read<'s>(
        &'s mut self,
        table: TableId,
        key: Key,
    ) -> LocalBoxFuture<'s, Result<Option<Vec<u8>>, TxnError>>
    where
        'a: 's,
    {
        Box::pin(self.read(table, key))
    }
    fn dyn_read_for_update<'s>(
        &'s mut self,
        table: TableId,
        key: Key,
    ) -> LocalBoxFuture<'s, Result<Option<Vec<u8>>, TxnError>>
    where
        'a: 's,
    {
        Box::pin(self.read_for_update(table, key))
    }
    fn dyn_write<'s>(
        &'s mut self,
        table: TableId,
        key: Key,
        value: &'s [u8],
    ) -> LocalBoxFuture<'s, Result<(), TxnError>>
    where
        'a: 's,
    {
        Box::pin(self.write(table, key, value))
    }
    fn dyn_insert<'s>(
        &'s mut self,
        table: TableId,
        key: Key,
        value: &'s [u8],
    ) -> LocalBoxFuture<'s, Result<(), TxnError>>
    where
        'a: 's,
    {
        Box::pin(self.insert(table, key, value))
    }
    fn dyn_delete<'s>(
        &'s mut self,
        table: TableId,
        key: Key,
    ) -> LocalBoxFuture<'s, Result<(), TxnError>>
    where
        'a: 's,
    {
        Box::pin(self.delete(table, key))
    }
    fn dyn_commit(self: Box<Self>) -> LocalBoxFuture<'a, Result<(), TxnError>> {
        Box::pin((*self).commit())
    }
    fn dyn_abort(self: Box<Self>) -> LocalBoxFuture<'a, ()> {
        Box::pin((*self).abort())
    }
}

/// A transaction of a protocol chosen at run time.
pub type BoxTransaction<'a> = Box<dyn DynTransaction<'a> + 'a>;

impl<'a> Transaction for BoxTransaction<'a> {
    // `async fn` here: its future names only the captured lifetimes (the boxed future's
    // own lifetime is their intersection, which an `impl Future` return cannot name).
    async fn read_round(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        (**self).dyn_read_round(reqs).await
    }
    fn read(
        &mut self,
        table: TableId,
        key: Key,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, TxnError>> {
        (**self).dyn_read(table, key)
    }
    fn read_for_update(
        &mut self,
        table: TableId,
        key: Key,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, TxnError>> {
        (**self).dyn_read_for_update(table, key)
    }
    async fn write(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        (**self).dyn_write(table, key, value).await
    }
    async fn insert(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        (**self).dyn_insert(table, key, value).await
    }
    fn delete(&mut self, table: TableId, key: Key) -> impl Future<Output = Result<(), TxnError>> {
        (**self).dyn_delete(table, key)
    }
    fn commit(self) -> impl Future<Output = Result<(), TxnError>> {
        self.dyn_commit()
    }
    fn abort(self) -> impl Future<Output = ()> {
        self.dyn_abort()
    }
}

/// The object-safe mirror of [`Coordinator`]. Implemented for every `Coordinator`; a
/// `Box<dyn DynCoordinator>` ([`BoxCoordinator`]) is a `Coordinator` again.
pub trait DynCoordinator {
    /// [`Coordinator::begin`].
    fn dyn_begin(
        &mut self,
        kind: TxnKind,
    ) -> LocalBoxFuture<'_, Result<BoxTransaction<'_>, TxnError>>;
    /// [`Coordinator::round_trips`].
    fn dyn_round_trips(&self) -> Option<u64>;
}

impl<C: Coordinator> DynCoordinator for C {
    fn dyn_begin(
        &mut self,
        kind: TxnKind,
    ) -> LocalBoxFuture<'_, Result<BoxTransaction<'_>, TxnError>> {
        Box::pin(async move {
            let txn = self.begin(kind).await?;
            Ok(Box::new(txn) as BoxTransaction<'_>)
        })
    }

    fn dyn_round_trips(&self) -> Option<u64> {
        self.round_trips()
    }
}

/// A coordinator of a protocol chosen at run time.
pub type BoxCoordinator = Box<dyn DynCoordinator>;

impl Coordinator for BoxCoordinator {
    type Txn<'a> = BoxTransaction<'a>;

    fn begin(
        &mut self,
        kind: TxnKind,
    ) -> impl Future<Output = Result<BoxTransaction<'_>, TxnError>> {
        (**self).dyn_begin(kind)
    }

    fn round_trips(&self) -> Option<u64> {
        (**self).dyn_round_trips()
    }
}

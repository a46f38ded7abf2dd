//! A single-threaded, serial, in-memory store for tests and for checking a workload's logic —
//! not a protocol.
//!
//! [`ReferenceStore`] keeps one `HashMap<u64, Vec<u8>>` per table. A transaction
//! ([`RefTxn`]) borrows the store mutably, so transactions run one after another; it buffers
//! its writes, reads its own writes, and applies them at commit. It enforces the
//! [`Transaction`] contract (value sizes, insert of an absent key, update/delete of a present
//! key, no writes in a read-only transaction) and never aborts on its own. Its futures never
//! pend, so [`block_on`] runs them.
//!
//! Uses: the workloads' own tests, the expected final state of a deterministic serial run
//! (an oracle for a protocol run with one coordinator), and a state to plant violations in.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use dmem_txn::{Coordinator, Key, TableId, Transaction, TxnError, TxnKind};

use crate::{Executed, Outcome, TableSpec, TxnGenerator, TxnInfo, Workload, execute};

#[derive(Debug, Clone)]
struct RefTable {
    value_size: usize,
    rows: HashMap<u64, Vec<u8>>,
}

/// A serial in-memory store (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct ReferenceStore {
    tables: HashMap<TableId, RefTable>,
}

impl ReferenceStore {
    /// An empty store with these tables.
    #[must_use]
    pub fn new(tables: &[TableSpec]) -> Self {
        let tables = tables
            .iter()
            .map(|t| {
                (
                    t.id,
                    RefTable {
                        value_size: t.value_size,
                        rows: HashMap::new(),
                    },
                )
            })
            .collect();
        Self { tables }
    }

    /// A store with `workload`'s tables, loaded with its initial records.
    ///
    /// # Errors
    /// If the loader produces a record for an unknown table, of the wrong size, or twice.
    pub fn loaded<W: Workload>(workload: &W) -> Result<Self, TxnError> {
        let mut store = Self::new(&workload.tables());
        store.load(workload.loader())?;
        Ok(store)
    }

    /// Inserts records (loading: no transaction).
    ///
    /// # Errors
    /// An unknown table, a value of the wrong size, or a duplicate key.
    pub fn load(
        &mut self,
        records: impl IntoIterator<Item = (TableId, Key, Vec<u8>)>,
    ) -> Result<(), TxnError> {
        for (table, key, value) in records {
            let t = self.table_mut(table)?;
            check_size(t.value_size, &value)?;
            if t.rows.insert(key.0, value).is_some() {
                return Err(TxnError::KeyState(key.0));
            }
        }
        Ok(())
    }

    fn table(&self, table: TableId) -> Result<&RefTable, TxnError> {
        self.tables
            .get(&table)
            .ok_or(TxnError::UnknownTable(table.0))
    }

    fn table_mut(&mut self, table: TableId) -> Result<&mut RefTable, TxnError> {
        self.tables
            .get_mut(&table)
            .ok_or(TxnError::UnknownTable(table.0))
    }

    /// The committed value of a record.
    #[must_use]
    pub fn get(&self, table: TableId, key: Key) -> Option<&[u8]> {
        self.tables.get(&table)?.rows.get(&key.0).map(Vec::as_slice)
    }

    /// Overwrites or creates a record outside any transaction (to plant a violation).
    ///
    /// # Errors
    /// An unknown table or a value of the wrong size.
    pub fn put(&mut self, table: TableId, key: Key, value: Vec<u8>) -> Result<(), TxnError> {
        let t = self.table_mut(table)?;
        check_size(t.value_size, &value)?;
        t.rows.insert(key.0, value);
        Ok(())
    }

    /// Removes a record outside any transaction (to plant a violation); returns its value.
    pub fn remove(&mut self, table: TableId, key: Key) -> Option<Vec<u8>> {
        self.tables.get_mut(&table)?.rows.remove(&key.0)
    }

    /// Records in a table (0 for an unknown table).
    #[must_use]
    pub fn len(&self, table: TableId) -> usize {
        self.tables.get(&table).map_or(0, |t| t.rows.len())
    }

    /// Whether every table is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tables.values().all(|t| t.rows.is_empty())
    }

    /// A state reader for [`Workload::check`].
    pub fn reader(&self) -> impl Fn(TableId, Key) -> Option<Vec<u8>> + '_ {
        |table, key| self.get(table, key).map(<[u8]>::to_vec)
    }

    /// Begins a transaction.
    pub fn begin(&mut self, kind: TxnKind) -> RefTxn<'_> {
        RefTxn {
            store: self,
            kind,
            pending: HashMap::new(),
        }
    }

    /// Runs `count` transactions from `generator` serially to their end (no transaction
    /// aborts here, so each runs once) and tallies them.
    ///
    /// # Errors
    /// The first transaction that failed (the workload broke the `Transaction` contract).
    pub fn run<W: Workload>(
        &mut self,
        workload: &W,
        generator: &mut W::Generator,
        count: u64,
    ) -> Result<RunTally, TxnError> {
        let mut tally = RunTally {
            per_type: vec![TypeTally::default(); workload.txn_types().len()],
            ..RunTally::default()
        };
        for _ in 0..count {
            let txn = generator.next_txn();
            let ty = &mut tally.per_type[txn.type_index()];
            match block_on(execute(workload, self, &txn, 1)) {
                Executed::Committed { outcome, .. } => {
                    ty.committed += 1;
                    match outcome {
                        Outcome::Commit { delta } => tally.committed_delta += delta,
                        Outcome::CommitMissed(_) => ty.missed += 1,
                        Outcome::Rollback(_) => unreachable!("execute aborts rollbacks"),
                    }
                }
                Executed::RolledBack { .. } => ty.rolled_back += 1,
                Executed::Failed { error, .. } => return Err(error),
            }
        }
        Ok(tally)
    }
}

/// Counts of one transaction type in a [`ReferenceStore::run`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TypeTally {
    /// Committed (including `missed`).
    pub committed: u64,
    /// Committed but unsuccessful ([`Outcome::CommitMissed`]).
    pub missed: u64,
    /// Rolled back by the benchmark's rule.
    pub rolled_back: u64,
}

/// The result of a [`ReferenceStore::run`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunTally {
    /// Per transaction type, in [`Workload::txn_types`] order.
    pub per_type: Vec<TypeTally>,
    /// Sum of the committed transactions' deltas (the `committed_delta` of
    /// [`Workload::check`]).
    pub committed_delta: i64,
}

fn check_size(expected: usize, value: &[u8]) -> Result<(), TxnError> {
    if value.len() == expected {
        Ok(())
    } else {
        Err(TxnError::ValueSize {
            expected,
            got: value.len(),
        })
    }
}

/// A transaction on a [`ReferenceStore`].
#[derive(Debug)]
pub struct RefTxn<'a> {
    store: &'a mut ReferenceStore,
    kind: TxnKind,
    /// Buffered writes: `Some(value)` to install, `None` to delete.
    pending: HashMap<(TableId, u64), Option<Vec<u8>>>,
}

impl RefTxn<'_> {
    fn current(&self, table: TableId, key: Key) -> Result<Option<Vec<u8>>, TxnError> {
        let t = self.store.table(table)?;
        Ok(match self.pending.get(&(table, key.0)) {
            Some(v) => v.clone(),
            None => t.rows.get(&key.0).cloned(),
        })
    }

    fn stage(
        &mut self,
        table: TableId,
        key: Key,
        value: Option<&[u8]>,
        must_exist: bool,
    ) -> Result<(), TxnError> {
        if self.kind == TxnKind::ReadOnly {
            return Err(TxnError::ReadOnly);
        }
        let size = self.store.table(table)?.value_size;
        if let Some(v) = value {
            check_size(size, v)?;
        }
        if self.current(table, key)?.is_some() != must_exist {
            return Err(TxnError::KeyState(key.0));
        }
        self.pending
            .insert((table, key.0), value.map(<[u8]>::to_vec));
        Ok(())
    }
}

impl Transaction for RefTxn<'_> {
    async fn read(&mut self, table: TableId, key: Key) -> Result<Option<Vec<u8>>, TxnError> {
        self.current(table, key)
    }

    async fn read_for_update(
        &mut self,
        table: TableId,
        key: Key,
    ) -> Result<Option<Vec<u8>>, TxnError> {
        if self.kind == TxnKind::ReadOnly {
            return Err(TxnError::ReadOnly);
        }
        self.current(table, key)
    }

    async fn write(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.stage(table, key, Some(value), true)
    }

    async fn insert(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.stage(table, key, Some(value), false)
    }

    async fn delete(&mut self, table: TableId, key: Key) -> Result<(), TxnError> {
        self.stage(table, key, None, true)
    }

    async fn commit(self) -> Result<(), TxnError> {
        for ((table, key), value) in self.pending {
            let rows = &mut self.store.table_mut(table)?.rows;
            match value {
                Some(v) => {
                    rows.insert(key, v);
                }
                None => {
                    rows.remove(&key);
                }
            }
        }
        Ok(())
    }

    async fn abort(self) {}
}

impl Coordinator for ReferenceStore {
    type Txn<'a> = RefTxn<'a>;

    async fn begin(&mut self, kind: TxnKind) -> Result<RefTxn<'_>, TxnError> {
        Ok(ReferenceStore::begin(self, kind))
    }
}

/// Runs a future that never pends (every future of the reference store).
///
/// # Panics
/// If the future returns `Pending`: it waits for something, and nothing here would wake it.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("block_on: the future pended (it is not a reference-store future)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> ReferenceStore {
        ReferenceStore::new(&[TableSpec {
            id: TableId(0),
            name: "t",
            value_size: 2,
            expected_records: 0,
            grows: true,
        }])
    }

    #[test]
    fn contract_is_enforced_and_writes_are_buffered() {
        let mut s = store();
        s.load([(TableId(0), Key(1), vec![1, 1])]).unwrap();
        let mut tx = s.begin(TxnKind::ReadWrite);
        assert_eq!(
            block_on(tx.insert(TableId(0), Key(1), &[2, 2])),
            Err(TxnError::KeyState(1))
        );
        assert_eq!(
            block_on(tx.write(TableId(0), Key(2), &[2, 2])),
            Err(TxnError::KeyState(2))
        );
        assert!(matches!(
            block_on(tx.write(TableId(0), Key(1), &[2])),
            Err(TxnError::ValueSize { .. })
        ));
        block_on(tx.write(TableId(0), Key(1), &[3, 3])).unwrap();
        block_on(tx.insert(TableId(0), Key(2), &[4, 4])).unwrap();
        block_on(tx.delete(TableId(0), Key(2))).unwrap();
        assert_eq!(
            block_on(tx.read(TableId(0), Key(1))).unwrap(),
            Some(vec![3, 3])
        );
        block_on(tx.commit()).unwrap();
        assert_eq!(s.get(TableId(0), Key(1)), Some(&[3u8, 3][..]));
        assert_eq!(s.get(TableId(0), Key(2)), None);

        let mut ro = s.begin(TxnKind::ReadOnly);
        assert_eq!(
            block_on(ro.write(TableId(0), Key(1), &[0, 0])),
            Err(TxnError::ReadOnly)
        );
        block_on(ro.abort());

        let mut tx = s.begin(TxnKind::ReadWrite);
        block_on(tx.write(TableId(0), Key(1), &[9, 9])).unwrap();
        block_on(tx.abort());
        assert_eq!(s.get(TableId(0), Key(1)), Some(&[3u8, 3][..]));
    }
}

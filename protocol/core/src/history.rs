//! Recorded histories: the input of the checker.

use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::RefCell;

use dmem_verbs::Nanos;

use crate::model::{Key, TableId, TxnId, Version, WriteKind};

/// A read and the version it observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadEvent {
    /// Table read.
    pub table: TableId,
    /// Key read.
    pub key: Key,
    /// Version observed (of a present record, or of the tombstone / initial absence for a
    /// record found absent).
    pub version: Version,
}

/// A write and the version it installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteEvent {
    /// Table written.
    pub table: TableId,
    /// Key written.
    pub key: Key,
    /// Version installed (unique per record, larger than the one it replaced).
    pub version: Version,
    /// Update, insert or delete.
    pub kind: WriteKind,
}

/// How a transaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Committed: its writes are visible.
    Committed,
    /// Aborted: its writes must never be observed.
    Aborted,
    /// Never decided (its coordinator crashed); recovery decides whether its writes survive,
    /// and the checker treats versions it installed by what was later observed.
    Unknown,
}

/// One transaction as a protocol recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnRecord {
    /// Its id.
    pub id: TxnId,
    /// When it began (before its first operation).
    pub begin: Nanos,
    /// When it ended (after commit or abort returned).
    pub end: Nanos,
    /// How it ended.
    pub outcome: TxnOutcome,
    /// Reads in program order.
    pub reads: Vec<ReadEvent>,
    /// Writes (for a committed transaction: the versions it installed).
    pub writes: Vec<WriteEvent>,
}

/// The transactions of one run, in any order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// Every recorded transaction.
    pub txns: Vec<TxnRecord>,
}

impl History {
    /// An empty history.
    #[must_use]
    pub const fn new() -> Self {
        Self { txns: Vec::new() }
    }

    /// Appends a transaction.
    pub fn push(&mut self, txn: TxnRecord) {
        self.txns.push(txn);
    }

    /// Number of committed transactions.
    #[must_use]
    pub fn committed(&self) -> usize {
        self.txns
            .iter()
            .filter(|t| t.outcome == TxnOutcome::Committed)
            .count()
    }
}

/// Where a protocol records its transactions (for the checker).
///
/// A transaction that reaches its commit decision is recorded with
/// [`TxnOutcome::Unknown`] *before* its first commit write and resolved once it is
/// acknowledged, so a coordinator that crashes mid-commit leaves an `Unknown` record whose
/// writes recovery may or may not keep.
pub trait HistorySink {
    /// Records a transaction.
    fn record(&self, txn: TxnRecord);
    /// Sets the outcome and end time of a transaction recorded earlier.
    fn resolve(&self, id: TxnId, outcome: TxnOutcome, end: Nanos);
}

impl HistorySink for Rc<RefCell<History>> {
    fn record(&self, txn: TxnRecord) {
        self.borrow_mut().push(txn);
    }

    fn resolve(&self, id: TxnId, outcome: TxnOutcome, end: Nanos) {
        let mut h = self.borrow_mut();
        if let Some(t) = h.txns.iter_mut().rev().find(|t| t.id == id) {
            t.outcome = outcome;
            t.end = end;
        }
    }
}

/// A sink that forgets everything (benchmarks that do not check).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHistory;

impl HistorySink for NoHistory {
    fn record(&self, _: TxnRecord) {}
    fn resolve(&self, _: TxnId, _: TxnOutcome, _: Nanos) {}
}

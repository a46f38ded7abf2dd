//! Recorded histories: the input of the checker.

use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::RefCell;

use dmem_verbs::Nanos;

use crate::model::{Key, TableId, TxnId, Version, WriteKind};

/// A read and the version it observed.
///
/// Build one with [`ReadEvent::new`] and, when the protocol knows which transaction installed
/// the observed version, [`ReadEvent::written_by`]:
///
/// ```
/// use dmem_txn::{CoordinatorId, Key, ReadEvent, TableId, TxnId, Version};
///
/// let installer = TxnId { coordinator: CoordinatorId(3), seq: 17 };
/// let read = ReadEvent::new(TableId(0), Key(42), Version(5)).written_by(installer);
/// assert_eq!(read.writer, Some(installer));
/// assert_eq!(ReadEvent::new(TableId(0), Key(42), Version::INITIAL).writer, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ReadEvent {
    /// Table read.
    pub table: TableId,
    /// Key read.
    pub key: Key,
    /// Version observed (of a present record, or of the tombstone / initial absence for a
    /// record found absent).
    pub version: Version,
    /// The transaction that installed the observed version, when the protocol can tell (for
    /// example from an installer id stored next to the version in the record).
    ///
    /// `None` means unknown: the loaded state [`Version::INITIAL`] (which has no installer),
    /// or a protocol that records only version numbers. With `Some`, the checker attributes
    /// the read to exactly that transaction, so a version number installed by an aborted
    /// transaction and later reused by a committed one (FORD's per-record counters after a
    /// roll-back) cannot hide a dirty read; a writer that did not install this version of this
    /// record is reported as a malformed history. Without it, the checker falls back to the
    /// version number and real time (see [`crate::checker`]).
    pub writer: Option<TxnId>,
}

impl ReadEvent {
    /// A read of `version` of `(table, key)` whose installer is unknown.
    #[must_use]
    pub const fn new(table: TableId, key: Key, version: Version) -> Self {
        Self {
            table,
            key,
            version,
            writer: None,
        }
    }

    /// The same read, observed as installed by `writer`.
    #[must_use]
    pub const fn written_by(self, writer: TxnId) -> Self {
        Self {
            writer: Some(writer),
            ..self
        }
    }
}

/// A write and the version it installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum TxnOutcome {
    /// Committed: its writes are visible.
    Committed,
    /// Aborted: its writes must never be observed. If it installed versions before it
    /// decided to abort, it rolled them back before its recorded end.
    Aborted,
    /// Never decided (its coordinator crashed); recovery decides whether its writes survive,
    /// and the checker treats versions it installed by what was later observed.
    Unknown,
}

/// One transaction as a protocol recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
    /// Writes: the versions it installed.
    ///
    /// For a committed transaction, every version it installed. An [`TxnOutcome::Aborted`]
    /// or [`TxnOutcome::Unknown`] transaction lists the versions it *physically* installed
    /// (a protocol that writes before it decides, or a coordinator that crashed in the middle
    /// of its commit writes), and may list nothing if it installed nothing. Recording them
    /// lets the checker name the aborted installer of a version a committed transaction read
    /// (G1a) even when a committed transaction later installs the same version number.
    pub writes: Vec<WriteEvent>,
}

/// The transactions of one run, in any order.
///
/// A history may be *closed*: it then keeps the transactions it has and ignores new ones, so
/// that a long run's memory stays bounded. A runner closes it only at a quiescent point (no
/// transaction in flight), so that no transaction it holds can have observed a write of one
/// it dropped: the checker judges a closed history's transactions completely.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct History {
    /// Every recorded transaction.
    pub txns: Vec<TxnRecord>,
    /// Whether new transactions are ignored (see [`History::close`]).
    #[cfg_attr(feature = "serde", serde(skip))]
    pub closed: bool,
}

impl History {
    /// An empty history.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            txns: Vec::new(),
            closed: false,
        }
    }

    /// An empty, closed history: records nothing (a run that does not check).
    #[must_use]
    pub const fn discarding() -> Self {
        Self {
            txns: Vec::new(),
            closed: true,
        }
    }

    /// Ignores transactions recorded or resolved from now on. Call it only when no
    /// transaction is in flight (see the type's docs).
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Appends a transaction, unless the history is closed. Its reads and writes are
    /// shrunk to their length (a recorder that pushed them one by one left room for four:
    /// about 120 bytes per SmallBank transaction).
    pub fn push(&mut self, mut txn: TxnRecord) {
        if !self.closed {
            txn.reads.shrink_to_fit();
            txn.writes.shrink_to_fit();
            self.txns.push(txn);
        }
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
        // Closed with nothing in flight: every recorded transaction is resolved already, and
        // a search for one that was not recorded would scan the whole history each time.
        if h.closed {
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CoordinatorId;

    fn txn(seq: u64) -> TxnRecord {
        TxnRecord {
            id: TxnId {
                coordinator: CoordinatorId(0),
                seq,
            },
            begin: seq,
            end: seq + 1,
            outcome: TxnOutcome::Unknown,
            reads: Vec::new(),
            writes: Vec::new(),
        }
    }

    #[test]
    fn a_closed_history_keeps_what_it_has_and_ignores_the_rest() {
        let h = Rc::new(RefCell::new(History::new()));
        h.record(txn(1));
        h.resolve(txn(1).id, TxnOutcome::Committed, 9);
        h.borrow_mut().close();
        h.record(txn(2));
        h.resolve(txn(2).id, TxnOutcome::Committed, 9);
        h.resolve(txn(1).id, TxnOutcome::Aborted, 10);
        let h = h.borrow();
        assert_eq!(h.txns.len(), 1);
        assert_eq!(
            (h.txns[0].outcome, h.txns[0].end),
            (TxnOutcome::Committed, 9)
        );
        let mut d = History::discarding();
        d.push(txn(3));
        assert!(d.txns.is_empty());
    }
}

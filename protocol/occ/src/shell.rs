//! What the OCC family's transactions share, written once: the trace each records into
//! the history ([`Trace`], OOCC, DrTM and DSLR 2PL alike) and the `Transaction` shell of
//! the two lock-based baselines (DrTM, DSLR 2PL), which both expose `round`, `set`,
//! `commit_inner`, `fail` and a `done` flag and end the same way.

use dmem_txn::{CoordinatorId, HistorySink, ReadEvent, TxnId, TxnOutcome, TxnRecord, WriteEvent};
use dmem_verbs::Nanos;

/// A running transaction's history so far: its id, its begin on the true clock and the
/// reads it made, in program order; [`finish`](Self::finish) records it once it ends.
#[derive(Debug)]
pub(crate) struct Trace {
    pub(crate) id: TxnId,
    pub(crate) begin: Nanos,
    pub(crate) reads: Vec<ReadEvent>,
}

impl Trace {
    /// The trace of coordinator `coordinator`'s next transaction (`seq` counts them),
    /// begun at `begin` on the true clock.
    pub(crate) fn start(seq: &mut u64, coordinator: u16, begin: Nanos) -> Self {
        *seq += 1;
        Self {
            id: TxnId {
                coordinator: CoordinatorId(u32::from(coordinator)),
                seq: *seq,
            },
            begin,
            reads: Vec::new(),
        }
    }

    /// Records the transaction into `history`: it ended at `end` with `outcome`, having
    /// installed `writes`; the reads move into the record.
    pub(crate) fn finish(
        &mut self,
        history: &impl HistorySink,
        end: Nanos,
        outcome: TxnOutcome,
        writes: Vec<WriteEvent>,
    ) {
        history.record(TxnRecord {
            id: self.id,
            begin: self.begin,
            end,
            outcome,
            reads: std::mem::take(&mut self.reads),
            writes,
        });
    }
}

/// Implements `dmem_txn::Transaction` for `$txn<'_, C>` over its `round` / `set` /
/// `commit_inner` / `fail` methods: an error in a round or at commit aborts the transaction
/// (releasing what it holds) before it is returned; a finished transaction refuses more work.
macro_rules! lock_based_transaction {
    ($txn:ident) => {
        impl<C: Verbs + Clock> Transaction for $txn<'_, C> {
            async fn read_round(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
                if self.done {
                    return Err(TxnError::Aborted(AbortReason::TransactionIsOver));
                }
                match self.round(reqs).await {
                    Ok(v) => Ok(v),
                    Err(e) => Err(self.fail(e).await),
                }
            }

            async fn write(
                &mut self,
                table: TableId,
                key: Key,
                value: &[u8],
            ) -> Result<(), TxnError> {
                self.set(table, key, Some(value), true).await
            }

            async fn insert(
                &mut self,
                table: TableId,
                key: Key,
                value: &[u8],
            ) -> Result<(), TxnError> {
                self.set(table, key, Some(value), false).await
            }

            async fn delete(&mut self, table: TableId, key: Key) -> Result<(), TxnError> {
                self.set(table, key, None, true).await
            }

            async fn commit(mut self) -> Result<(), TxnError> {
                if self.done {
                    return Err(TxnError::Aborted(AbortReason::TransactionIsOver));
                }
                match self.commit_inner().await {
                    Ok(()) => Ok(()),
                    Err(e) if self.done => Err(e),
                    Err(e) => Err(self.fail(e).await),
                }
            }

            async fn abort(mut self) {
                let _ = self.fail(TxnError::Aborted(AbortReason::ByTheCaller)).await;
            }
        }
    };
}

pub(crate) use lock_based_transaction;

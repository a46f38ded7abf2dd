//! The `Transaction` shell shared by the two lock-based baselines (DrTM, DSLR 2PL): both
//! expose `round`, `set`, `commit_inner`, `fail` and a `done` flag, and end the same way —
//! written once here instead of once per protocol.

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

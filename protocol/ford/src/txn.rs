//! FORD / Pandora coordinators and transactions: the async shell around [`crate::logic`].
//!
//! Phases (Pandora §2.3, §3.1.5):
//!
//! 1. **Execution.** `read` READs the item (after one bucket READ unless the address is
//!    cached) and aborts on a lock held by a live coordinator. `read_for_update`, `insert`
//!    and `delete` lock eagerly with a doorbell-batched CAS + READ to the primary; a failed
//!    CAS on a stray lock is followed by a stealing CAS (PILL, §3.1.2). A blind `write`
//!    defers its lock to commit.
//! 2. **Validation**, strictly after every lock is held: one READ of lock + version per
//!    read-set item (a bucket READ for a key read as absent).
//! 3. **Logging** (only if validation succeeded, §3.1.4): Pandora WRITEs one log of the
//!    whole write-set to its coordinator's f + 1 log MNs; FORD WRITEs undo records to every
//!    replica of each written object.
//! 4. **Commit**: WRITE the new items to every replica, then (the ack point) unlock the
//!    primaries with WRITEs. **Abort**: truncate a written log, then unlock what was
//!    acquired.
//!
//! With [`ProtocolConfig::lock_logging`] (the traditional scheme of Pandora §6.1) every
//! lock CAS (or commit-time batch of CASes) waits for a WRITE of the lock's address to the
//! coordinator's lock log first, and PILL stealing is off.

use std::rc::Rc;

use dmem_txn::{
    AbortReason, Access, Coordinator, CoordinatorId, HistorySink, Key, ReadReq, RoundValues,
    TableId, Transaction, TxnError, TxnId, TxnKind, TxnOutcome, TxnRecord, WriteEvent, WriteKind,
};
use dmem_verbs::{
    BatchResult, Clock, Nanos, NodeId, Op, Phase, PostList, RemoteAddr, Verbs, VerbsError, WrId,
};

use crate::cn::CnShared;
use crate::config::ProtocolConfig;
use crate::logic::{self, AfterCas, Decision};
use crate::recovery::{CoordinatorRecovery, RecoveryError, apply_recovery};
use crate::round::{Answer, ItemWrs, Located, RoundPlan, access_list};
use crate::state::{
    AfterSteal, CommitSchedule, Env, ItemRead, LockState, ReadSeen, SlotAccess, SlotSeen, TxnState,
    after_steal, logs_before_lock_results, parse_item, slot_verdict,
};
use crate::store::{
    BucketLoc, InsertPool, ItemLoc, Store, StoreError, index_slot_bytes, parse_bucket, slot_offset,
};
use crate::wire::{self, ControlMsg};

/// Counters of one coordinator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    /// Committed transactions.
    pub committed: u64,
    /// Aborted transactions.
    pub aborted: u64,
    /// Stray locks stolen (PILL).
    pub steals: u64,
    /// Stray locks a read ignored (PILL).
    pub stray_reads: u64,
    /// Transactions in their commit phase at an MN failure that were rolled forward
    /// (§3.2.5; also counted in `committed`).
    pub mn_rolled_forward: u64,
    /// Transactions in their commit phase at an MN failure that were rolled back
    /// (§3.2.5; counted in `aborted`, not in `committed`).
    pub mn_rolled_back: u64,
    /// Transactions aborted because the MN view changed before their commit phase.
    pub mn_aborted: u64,
}

/// The commit-time lock batch's results (`None`: nothing posted), its deferred entries'
/// CAS and READ, and the validation READs it carried.
type CommitLockBatch = (
    Option<BatchResult>,
    Vec<(usize, WrId, WrId)>,
    Vec<(usize, WrId)>,
);

/// A FORD or Pandora coordinator on one CN context.
#[derive(Debug)]
pub struct FordCoordinator<V, H> {
    ctx: V,
    store: Rc<Store>,
    cfg: ProtocolConfig,
    id: u16,
    epoch: u64,
    seq: u64,
    shared: CnShared,
    history: H,
    stats: CoordinatorStats,
    /// Records of this coordinator's insert shares claimed so far (pooled tables).
    inserts: InsertPool,
}

impl<V: Verbs + Clock, H: HistorySink> FordCoordinator<V, H> {
    /// A coordinator with the unique 16-bit id `id` (Pandora §3.1.2: assigned by the
    /// failure detector; it also selects the log region).
    ///
    /// # Errors
    /// [`StoreError::NoLogRegion`] if the store has no log region for `id`.
    pub fn new(
        ctx: V,
        store: Rc<Store>,
        cfg: ProtocolConfig,
        id: u16,
        shared: CnShared,
        history: H,
    ) -> Result<Self, StoreError> {
        store.log_offset(id)?;
        Ok(Self {
            ctx,
            store,
            cfg,
            id,
            epoch: 1,
            seq: 0,
            shared,
            history,
            stats: CoordinatorStats::default(),
            inserts: InsertPool::new(),
        })
    }

    /// The coordinator id.
    #[must_use]
    pub fn id(&self) -> u16 {
        self.id
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> CoordinatorStats {
        self.stats
    }

    /// The context.
    #[must_use]
    pub fn context(&self) -> &V {
        &self.ctx
    }

    /// Begins a transaction (the inherent form of [`Coordinator::begin`]).
    pub fn begin_txn(&mut self, kind: TxnKind) -> FordTxn<'_, V, H> {
        self.seq += 1;
        let id = TxnId {
            coordinator: CoordinatorId(u32::from(self.id)),
            seq: self.seq,
        };
        let begin = self.ctx.now();
        let mn_epoch = self.shared.mn.borrow_mut().begin();
        FordTxn {
            co: self,
            id,
            kind,
            begin,
            st: TxnState::default(),
            decided: false,
            mn_epoch,
            mn_failed: false,
        }
    }

    /// Reports MN `mn` to the failure detector (once per CN) and waits until this CN's view
    /// has dropped it (Pandora §3.2.5: the detector confirms and notifies every CN).
    async fn await_mn_failure(&self, mn: u16) {
        let (detector, poll, first) = {
            let mut m = self.shared.mn.borrow_mut();
            let first = m.report(mn);
            (m.detector, m.poll.max(1), first)
        };
        if let (Some(fd), true) = (detector, first) {
            // A lost report only delays detection: the detector also probes the MNs.
            let _ = self
                .ctx
                .send(fd, &ControlMsg::MnSuspect { mn }.emit())
                .await;
        }
        while self.store.view().borrow().is_alive(mn) {
            self.ctx.sleep(poll).await;
        }
    }
}

impl<V: Verbs + Clock, H: HistorySink> Coordinator for FordCoordinator<V, H> {
    type Txn<'a>
        = FordTxn<'a, V, H>
    where
        Self: 'a;

    async fn begin(&mut self, kind: TxnKind) -> Result<Self::Txn<'_>, TxnError> {
        Ok(self.begin_txn(kind))
    }
}

/// A running FORD/Pandora transaction. Always finish it with `commit` or `abort`: dropping
/// it releases nothing.
#[derive(Debug)]
pub struct FordTxn<'a, V, H> {
    co: &'a mut FordCoordinator<V, H>,
    id: TxnId,
    kind: TxnKind,
    begin: Nanos,
    st: TxnState,
    /// The commit decision was taken: failures after it must not abort.
    decided: bool,
    /// The CN's MN view epoch when the transaction began (§3.2.5).
    mn_epoch: u64,
    /// The transaction was stopped by an MN failure (view change or an MN not answering).
    mn_failed: bool,
}

impl<V, H> Drop for FordTxn<'_, V, H> {
    fn drop(&mut self) {
        self.co.shared.mn.borrow_mut().end(self.mn_epoch);
    }
}

impl<V: Verbs + Clock, H: HistorySink> FordTxn<'_, V, H> {
    /// The transaction's id.
    #[must_use]
    pub fn id(&self) -> TxnId {
        self.id
    }

    fn store(&self) -> &Store {
        &self.co.store
    }

    fn env(&self) -> Env<'_> {
        Env {
            store: &self.co.store,
            cfg: &self.co.cfg,
            coordinator: self.co.id,
            epoch: self.co.epoch,
            seq: self.id.seq,
        }
    }

    /// Whether the CN's MN view changed since the transaction began.
    fn view_changed(&self) -> bool {
        let m = self.co.shared.mn.borrow();
        m.enabled() && m.epoch() != self.mn_epoch
    }

    /// The MN index of `node` if MN-failure handling is on and `node` is an MN.
    fn mn_failure_handled(&self, node: NodeId) -> Option<u16> {
        if self.co.shared.mn.borrow().enabled() {
            self.store().mn_index(node)
        } else {
            None
        }
    }

    /// Every post of a running transaction goes through here (Pandora §3.2.5, "stop"):
    /// a transaction of an older MN view stops before and after each post; one of the
    /// current view waits while its CN is paused; an MN that does not answer is reported
    /// and the transaction stops once the CN's view has dropped it. `phase` names the
    /// protocol step for fault injection ([`Verbs::mark_phase`]).
    async fn post(&mut self, phase: Phase, list: PostList) -> Result<BatchResult, TxnError> {
        loop {
            let (enabled, epoch, paused, poll) = {
                let m = self.co.shared.mn.borrow();
                (m.enabled(), m.epoch(), m.paused(), m.poll.max(1))
            };
            if !enabled {
                break;
            }
            if epoch != self.mn_epoch {
                self.mn_failed = true;
                return Err(TxnError::Aborted(AbortReason::MemoryNodeViewChanged));
            }
            if !paused {
                break;
            }
            self.co.ctx.sleep(poll).await;
        }
        // The lock CASes (0 to this coordinator's word) of the batch: if an MN fails under
        // it, the parts sent to the live MNs still run, but which locks they took never
        // comes back; they are released below by CAS from this coordinator's word.
        let lock_cas = if self.co.shared.mn.borrow().enabled() {
            self.lock_cas_of(&list)
        } else {
            Vec::new()
        };
        self.co.ctx.mark_phase(phase);
        match self.co.ctx.post(list).await {
            Ok(res) => {
                if self.view_changed() {
                    // The batch's results are dropped with the transaction: so are its locks.
                    self.release_lost_locks(&lock_cas).await;
                    self.mn_failed = true;
                    return Err(TxnError::Aborted(AbortReason::MemoryNodeViewChanged));
                }
                Ok(res)
            }
            Err(VerbsError::ConnectionLost { node }) => match self.mn_failure_handled(node) {
                Some(mn) => {
                    self.co.await_mn_failure(mn).await;
                    self.release_lost_locks(&lock_cas).await;
                    self.mn_failed = true;
                    Err(TxnError::Aborted(AbortReason::MemoryNodeFailed))
                }
                None => Err(VerbsError::ConnectionLost { node }.into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// The addresses `list` tries to lock for this coordinator (CAS from 0 to its word).
    fn lock_cas_of(&self, list: &PostList) -> Vec<RemoteAddr> {
        let me = logic::my_lock(self.co.id);
        list.clone().finish().map_or_else(
            |_| Vec::new(),
            |wrs| {
                wrs.iter()
                    .filter_map(|wr| match wr.op {
                        Op::Cas {
                            addr,
                            expect: 0,
                            swap,
                        } if swap == me => Some(addr),
                        _ => None,
                    })
                    .collect()
            },
        )
    }

    /// Releases, on the MNs the CN's view still counts as live, every lock of `addrs` this
    /// coordinator may hold (CAS from its word to 0; a lock it did not take is untouched).
    /// Best effort: a further failed MN is met by the abort that follows.
    async fn release_lost_locks(&self, addrs: &[RemoteAddr]) {
        let me = logic::my_lock(self.co.id);
        let view = self.store().view().borrow().clone();
        let mut list = PostList::new();
        for &addr in addrs {
            if self
                .store()
                .mn_index(addr.node)
                .is_some_and(|mn| view.is_alive(mn))
            {
                list.cas(addr, me, 0);
            }
        }
        if !list.is_empty() {
            self.co.ctx.mark_phase(Phase::ReleaseLostLocks);
            let _ = self.co.ctx.post(list).await;
        }
    }

    /// Decides a transaction stopped by an MN failure in its commit phase (Pandora §3.2.5):
    /// the criterion of log recovery (§3.2.2 step 3) applied by the coordinator itself to
    /// the live replicas — roll forward iff every live replica of every write is updated,
    /// else restore the updated ones from the undo images — then truncate the log and
    /// release the remaining locks.
    ///
    /// Deviation: the undo images come from the coordinator's memory rather than a READ of
    /// its log; they are the bytes it logged (the paper: a CN "has complete knowledge of
    /// the state of its transactions").
    async fn decide_after_mn_failure(&mut self) -> Result<(), TxnError> {
        let txn = self.st.local_log(&self.env());
        let mut attempts = usize::from(self.store().config().mns) + 1;
        let decision = loop {
            let mut report = CoordinatorRecovery {
                coordinator: self.co.id,
                txn: Some(txn.txn),
                decision: None,
                restored: 0,
                unlocked: 0,
            };
            match apply_recovery(&self.co.ctx, &self.co.store, self.co.id, &txn, &mut report).await
            {
                Ok(()) => break report.decision.unwrap_or(Decision::RollBack),
                Err(RecoveryError::Verbs(VerbsError::ConnectionLost { node })) if attempts > 0 => {
                    let Some(mn) = self.mn_failure_handled(node) else {
                        return Err(VerbsError::ConnectionLost { node }.into());
                    };
                    self.co.await_mn_failure(mn).await;
                    attempts -= 1;
                }
                Err(RecoveryError::Verbs(e)) => return Err(e.into()),
                Err(RecoveryError::Store(e)) => return Err(TxnError::from(e)),
                // Only the detector's view changes wait for answers, never this decision.
                Err(RecoveryError::NoAnswer { .. }) => {
                    return Err(TxnError::Aborted(
                        AbortReason::MemoryNodeFailureDecisionInterrupted,
                    ));
                }
            }
        };
        // Truncate the log; release what the decision did not (lock-only entries).
        self.abort_inner().await?;
        let now = self.co.ctx.now();
        match decision {
            Decision::RollForward => {
                self.co.stats.mn_rolled_forward += 1;
                self.co.history.resolve(self.id, TxnOutcome::Committed, now);
                Ok(())
            }
            Decision::RollBack => {
                self.co.stats.mn_rolled_back += 1;
                self.co.stats.committed = self.co.stats.committed.saturating_sub(1);
                self.co.stats.aborted += 1;
                self.co.history.resolve(self.id, TxnOutcome::Aborted, now);
                Err(TxnError::Aborted(
                    AbortReason::RolledBackAfterMemoryNodeFailure,
                ))
            }
        }
    }

    fn value_len(&self, table: TableId) -> Result<usize, TxnError> {
        Ok(self
            .store()
            .table(table)
            .map_err(TxnError::from)?
            .spec
            .value_len)
    }

    fn item_len(&self, table: TableId) -> Result<usize, TxnError> {
        Ok(self.store().table(table).map_err(TxnError::from)?.item_len)
    }

    fn primary_addr(&self, loc: &ItemLoc) -> Result<dmem_verbs::RemoteAddr, TxnError> {
        let p = self
            .store()
            .primary(loc.bucket.partition)
            .map_err(TxnError::from)?;
        Ok(self.store().addr(p, loc.offset))
    }

    async fn locate(&mut self, table: TableId, key: Key) -> Result<Located, TxnError> {
        if let Some(loc) = self.co.shared.cache.borrow_mut().get(table, key) {
            return Ok(Located::Found(loc));
        }
        if let Some((bucket, free)) = self.st.take_absent(table, key) {
            // A round of this transaction found the key absent: reuse what its bucket READ
            // showed (an insert that follows needs no second READ; if the free slot was
            // taken meanwhile, the slot READ of the lock batch sees it and aborts).
            return Ok(Located::Absent { bucket, free });
        }
        let bucket = self.store().bucket_of(table, key).map_err(TxnError::from)?;
        let p = self
            .store()
            .primary(bucket.partition)
            .map_err(TxnError::from)?;
        let mut list = PostList::new();
        let id = list.read(self.store().addr(p, bucket.offset), bucket.read_len());
        let bytes = self.post(Phase::Locate, list).await?.take_bytes(id);
        let (used, free) = parse_bucket(&bytes);
        if let Some(&(slot, _)) = used.iter().find(|(_, k)| *k == key.0) {
            let loc = self
                .store()
                .item_in_bucket(bucket, slot, &bytes)
                .map_err(TxnError::from)?;
            self.co.shared.cache.borrow_mut().put(table, key, loc);
            Ok(Located::Found(loc))
        } else {
            let free = self
                .store()
                .table(table)
                .map_err(TxnError::from)?
                .insert_slot(&used, free);
            Ok(Located::Absent { bucket, free })
        }
    }

    /// Posts CAS + READ to the primary and steals a stray lock (PILL). Returns the old image
    /// if the lock is now held; records the entry either way.
    async fn lock_and_read(
        &mut self,
        table: TableId,
        key: Key,
        loc: ItemLoc,
        slot_access: SlotAccess,
    ) -> Result<(ItemRead, Option<SlotSeen>), TxnError> {
        let addr = self.primary_addr(&loc)?;
        let item_len = self.item_len(table)? as u32;
        let me = logic::my_lock(self.co.id);
        self.log_locks(&[loc]).await?;
        let mut list = PostList::new();
        let cas = list.cas(addr, 0, me);
        let rd = list.read(addr, item_len);
        let slot_addr = dmem_verbs::RemoteAddr {
            offset: loc.bucket.offset + slot_offset(loc.slot),
            ..addr
        };
        let slot_wr = match slot_access {
            SlotAccess::None => None,
            SlotAccess::Read => Some(list.read(slot_addr, 16)),
            // The slot's address word (bytes 8..16) of the primary, empty -> the record.
            SlotAccess::Claim(packed) => Some(list.cas(slot_addr.add(8), 0, packed)),
        };
        let mut res = self.post(Phase::Lock, list).await?;
        let old = res.atomic(cas);
        let bytes = res.take_bytes(rd);
        let slot_seen = slot_wr.map(|id| match slot_access {
            SlotAccess::Claim(_) => SlotSeen::Address(res.atomic(id)),
            _ => SlotSeen::Bytes(res.take_bytes(id)),
        });
        if matches!(slot_seen, Some(SlotSeen::Address(0))) {
            // The CAS won the slot: name the key in it on every replica at once (the CAS set
            // only the primary's address word), whatever this transaction does next.
            self.write_slot(loc.bucket, loc.slot, key, loc.offset)
                .await?;
        }
        // Held from here on if the CAS won: an abort (even one caused by the log write
        // below) releases it.
        let idx = self.st.record_lock_attempt(table, key, loc, old, &bytes)?;
        if logs_before_lock_results(&self.co.cfg) {
            // The corner case of Pandora §5.1: the undo record goes out before the
            // coordinator has looked at what its CAS returned.
            self.write_logs(true).await?;
        }
        let item = self.settle_lock(table, key, loc, idx, old, bytes).await?;
        Ok((item, slot_seen))
    }

    /// WRITEs slot `slot` of `bucket` naming `key` at record `offset` to every live replica.
    async fn write_slot(
        &mut self,
        bucket: BucketLoc,
        slot: usize,
        key: Key,
        offset: u64,
    ) -> Result<(), TxnError> {
        let packed = logic::pack_location(bucket.partition, offset);
        let bytes = index_slot_bytes(key.0, packed);
        let mut list = PostList::new();
        for mn in self.store().live_replicas(bucket.partition) {
            let a = self.store().addr(mn, bucket.offset + slot_offset(slot));
            list.write(a, &bytes);
        }
        self.post(Phase::ClaimSlot, list).await?;
        Ok(())
    }

    fn add_log_writes(&mut self, list: &mut PostList, early: bool) -> Result<(), TxnError> {
        let base = self
            .store()
            .log_offset(self.co.id)
            .map_err(TxnError::from)?;
        for (mn, image) in self.st.log_images(&self.env(), early)? {
            list.write_owned(self.store().addr(mn, base), image);
            if !self.st.logged.contains(&mn) {
                self.st.logged.push(mn);
            }
        }
        Ok(())
    }

    async fn write_logs(&mut self, early: bool) -> Result<(), TxnError> {
        let mut list = PostList::new();
        self.add_log_writes(&mut list, early)?;
        if !list.is_empty() {
            self.post(Phase::Log, list).await?;
        }
        Ok(())
    }

    /// Traditional lock logging ("log before lock", Pandora §6.1, §6.2.1): appends the
    /// addresses of `locs` to the transaction's lock log and WRITEs it to the coordinator's
    /// log MNs, waiting for the WRITEs before the caller posts the lock CASes. Nothing
    /// without [`ProtocolConfig::lock_logging`].
    async fn log_locks(&mut self, locs: &[ItemLoc]) -> Result<(), TxnError> {
        if !self.co.cfg.lock_logging || locs.is_empty() {
            return Ok(());
        }
        if self.st.lock_log.len() + locs.len() > wire::LOCK_LOG_SLOTS {
            return Err(TxnError::Aborted(AbortReason::LockLogFull));
        }
        let at = wire::lock_log_offset(self.store().log_region_bytes())
            .ok_or(TxnError::Aborted(AbortReason::LogRegionTooSmallForLockLog))?;
        self.st.lock_log.extend(
            locs.iter()
                .map(|l| logic::pack_location(l.bucket.partition, l.offset)),
        );
        let log = wire::LockLog {
            coordinator: self.co.id,
            addrs: std::mem::take(&mut self.st.lock_log),
        };
        let image = log.emit();
        self.st.lock_log = log.addrs;
        let base = self
            .store()
            .log_offset(self.co.id)
            .map_err(TxnError::from)?;
        let mut list = PostList::new();
        for mn in self.store().pandora_log_mns(self.co.id) {
            list.write(self.store().addr(mn, base + at as u64), &image);
        }
        if !list.is_empty() {
            self.post(Phase::LockLog, list).await?;
        }
        Ok(())
    }

    /// The abort path (Pandora §3.1.5 (3)): truncate the log, then unlock.
    ///
    /// With MN-failure handling on (§3.2.5) it survives a failed MN: an MN that does not
    /// answer is reported, the coordinator waits until its CN's view drops it and aborts
    /// again (every step is idempotent) on the live MNs only. After a view change the locks
    /// are released with a CAS from this coordinator's word: a lock taken on a failed
    /// primary is gone, and the new primary's word (never locked, as backups are not) must
    /// not be overwritten blindly.
    async fn abort_inner(&mut self) -> Result<(), TxnError> {
        let mut attempts = usize::from(self.store().config().mns) + 1;
        loop {
            match self.abort_once().await {
                Err(VerbsError::ConnectionLost { node }) if attempts > 0 => {
                    let Some(mn) = self.mn_failure_handled(node) else {
                        return Err(VerbsError::ConnectionLost { node }.into());
                    };
                    self.co.await_mn_failure(mn).await;
                    attempts -= 1;
                }
                r => return r.map_err(TxnError::from),
            }
        }
    }

    async fn abort_once(&mut self) -> Result<(), VerbsError> {
        let list = self.st.truncate_list(&self.env());
        if !list.is_empty() {
            self.co.ctx.mark_phase(Phase::AbortTruncate);
            self.co.ctx.post(list).await?;
        }
        let view_changed = self.view_changed() || self.mn_failed;
        let list = self.st.abort_unlock_list(&self.env(), view_changed);
        if !list.is_empty() {
            self.co.ctx.mark_phase(Phase::AbortUnlock);
            self.co.ctx.post(list).await?;
        }
        Ok(())
    }

    fn record_aborted(&mut self) {
        self.co.stats.aborted += 1;
        let end = self.co.ctx.now();
        self.co.history.record(TxnRecord {
            id: self.id,
            begin: self.begin,
            end,
            outcome: TxnOutcome::Aborted,
            reads: std::mem::take(&mut self.st.events),
            writes: Vec::new(),
        });
    }

    async fn fail(&mut self, err: TxnError) -> TxnError {
        if self.decided {
            // Past the decision: recovery, not an abort, settles this transaction.
            return err;
        }
        if self.mn_failed {
            self.co.stats.mn_aborted += 1;
        }
        // Best effort: if the fabric itself failed, the abort may fail too.
        let _ = self.abort_inner().await;
        self.record_aborted();
        err
    }

    /// The commit phase (Pandora §2.3 steps 2-4, §3.1.4): lock the deferred (blind-write)
    /// entries, validate, log, install, release. Where the validation READs and the log
    /// WRITEs go is [`CommitSchedule`]'s decision (FORD's relaxed-locks, lost-decision and
    /// log-without-lock bugs move them).
    async fn commit_inner(&mut self) -> Result<(), TxnError> {
        let deferred = self.st.deferred();
        let deferred_locs: Vec<ItemLoc> = deferred.iter().map(|&i| self.st.writes[i].loc).collect();
        self.log_locks(&deferred_locs).await?;
        let sched = CommitSchedule::new(&self.co.cfg, self.st.single_read(), !deferred.is_empty());
        let (mut res, lock_ids, mut validation) = self.commit_lock_batch(&sched, &deferred).await?;
        if let Some(res) = res.as_mut() {
            self.settle_commit_locks(res, &lock_ids).await?;
        }
        if sched.validate_after_locks {
            let mut list = PostList::new();
            validation = self.st.validation_reads(self.store(), &mut list)?;
            if sched.log_with_validation {
                self.add_log_writes(&mut list, false)?;
            }
            if !list.is_empty() {
                res = Some(self.post(sched.validation_phase(), list).await?);
            }
        }
        self.judge_validation(res.as_mut(), validation)?;
        if !self.st.has_writes() {
            // Read-only (or lock-only): release locks, done.
            self.release_held(false).await?;
            self.record_committed(Vec::new(), false);
            return Ok(());
        }
        if sched.logging_phase {
            // Pandora §3.1.4: only after validation succeeded.
            self.write_logs(false).await?;
        }
        self.install().await
    }

    /// The commit-time lock batch: a CAS + READ of every deferred entry, with the
    /// validation READs ahead of them and the log WRITEs behind them where `sched` says.
    /// Returns the batch's results (`None`: nothing to post), the deferred entries' CAS and
    /// READ, and the validation READs posted.
    async fn commit_lock_batch(
        &mut self,
        sched: &CommitSchedule,
        deferred: &[usize],
    ) -> Result<CommitLockBatch, TxnError> {
        let me = logic::my_lock(self.co.id);
        let mut list = PostList::new();
        let mut validation = Vec::new();
        if sched.validate_with_locks {
            // Relaxed locks: validation READs go out first, ahead of (and overlapping) the
            // lock CASes of the same batch.
            validation = self.st.validation_reads(self.store(), &mut list)?;
        }
        let mut lock_ids: Vec<(usize, WrId, WrId)> = Vec::new();
        for &i in deferred {
            let w = &self.st.writes[i];
            let addr = self.primary_addr(&w.loc)?;
            let len = self.item_len(w.table)? as u32;
            let c = list.cas(addr, 0, me);
            let r = list.read(addr, len);
            lock_ids.push((i, c, r));
        }
        if sched.early_log_with_locks {
            // Log the blind writes with the values read in execution, in the same doorbell
            // as their lock CAS (Pandora §5.1 "Logging without locking").
            self.st.old_images_from_reads(deferred);
            self.add_log_writes(&mut list, true)?;
        }
        if sched.log_with_locks {
            self.add_log_writes(&mut list, false)?;
        }
        let res = if list.is_empty() {
            None
        } else {
            Some(self.post(sched.lock_phase(), list).await?)
        };
        Ok((res, lock_ids, validation))
    }

    /// Takes the commit-time lock batch's CASes: each acquired, stolen from a failed
    /// coordinator (PILL, Pandora §3.1.2; one more CAS + READ) or a conflict.
    async fn settle_commit_locks(
        &mut self,
        res: &mut BatchResult,
        lock_ids: &[(usize, WrId, WrId)],
    ) -> Result<(), TxnError> {
        // Every CAS of this batch that found the lock free acquired it: mark it held
        // before judging any entry, so that an early return below (a conflict on
        // another entry of the batch) still releases it in the abort path.
        for &(i, c, _) in lock_ids {
            if res.atomic(c) == 0 {
                self.st.writes[i].lock = LockState::Held;
            }
        }
        let me = logic::my_lock(self.co.id);
        for &(i, c, r) in lock_ids {
            let old = res.atomic(c);
            let bytes = res.take_bytes(r);
            let (table, key, loc) = (
                self.st.writes[i].table,
                self.st.writes[i].key,
                self.st.writes[i].loc,
            );
            let mut item = parse_item(&bytes, table, key)?;
            let next = logic::after_cas(old, &self.co.shared.failed.borrow(), &self.co.cfg);
            match next {
                AfterCas::Acquired => {}
                AfterCas::Steal { observed } => {
                    let addr = self.primary_addr(&loc)?;
                    let mut l = PostList::new();
                    let cas = l.cas(addr, observed, me);
                    let rd = l.read(addr, self.item_len(table)? as u32);
                    let mut r2 = self.post(Phase::Steal, l).await?;
                    if r2.atomic(cas) != observed {
                        self.st.writes[i].lock = LockState::Failed;
                        return Err(TxnError::Aborted(AbortReason::WriteLockHeld));
                    }
                    self.co.stats.steals += 1;
                    item = parse_item(&r2.take_bytes(rd), table, key)?;
                }
                AfterCas::Conflict => {
                    self.st.writes[i].lock = LockState::Failed;
                    return Err(TxnError::Aborted(AbortReason::WriteLockHeld));
                }
            }
            self.st.settle_deferred(i, item)?;
        }
        Ok(())
    }

    /// Judges the validation READs (Pandora §2.3 step 2) from the batch that carried them.
    fn judge_validation(
        &self,
        res: Option<&mut BatchResult>,
        validation: Vec<(usize, WrId)>,
    ) -> Result<(), TxnError> {
        if validation.is_empty() {
            return Ok(());
        }
        let Some(res) = res else {
            return Err(TxnError::Aborted(AbortReason::ValidationLostItsReads));
        };
        for (ri, id) in validation {
            let bytes = res.take_bytes(id);
            let valid =
                self.st
                    .validate_one(&self.co.cfg, ri, &bytes, &self.co.shared.failed.borrow());
            if !valid {
                return Err(TxnError::Aborted(AbortReason::ValidationFailed));
            }
        }
        Ok(())
    }

    /// The commit WRITEs to primaries and backups (the decision is taken with their post),
    /// then the ack, then the release.
    async fn install(&mut self) -> Result<(), TxnError> {
        let (list, installed) = self.st.commit_list(&self.env())?;
        // A commit that creates a record is its own phase for crash injection: undoing it
        // removes the record, which only an insert log allows (Pandora §5.1, C2).
        let phase = if installed.iter().any(|w| w.kind == WriteKind::Insert) {
            Phase::CommitWithInsert
        } else {
            Phase::Commit
        };
        self.decided = true;
        self.record_committed(installed, true);
        self.post(phase, list).await?;
        self.co
            .history
            .resolve(self.id, TxnOutcome::Committed, self.co.ctx.now());
        // FORD's `CheckCommitAll`: the release WRITEs are posted after every commit WRITE
        // completed (so no reader sees a new value that a crash could still roll back) and
        // are not waited for.
        self.release_held(true).await?;
        Ok(())
    }

    fn record_committed(&mut self, writes: Vec<WriteEvent>, pending: bool) {
        self.co.stats.committed += 1;
        let now = self.co.ctx.now();
        self.co.history.record(TxnRecord {
            id: self.id,
            begin: self.begin,
            end: now,
            outcome: if pending {
                TxnOutcome::Unknown
            } else {
                TxnOutcome::Committed
            },
            reads: std::mem::take(&mut self.st.events),
            writes,
        });
    }

    /// Releases every held lock with a WRITE of 0; `detached`: without waiting for the
    /// WRITEs ([`Verbs::post_detached`]; a later post of this coordinator to the same MN
    /// lands after them).
    async fn release_held(&mut self, detached: bool) -> Result<(), TxnError> {
        let list = self.st.release_list(self.store(), &self.co.cfg)?;
        if !list.is_empty() {
            if detached && !self.co.shared.mn.borrow().enabled() {
                self.co.ctx.mark_phase(Phase::Release);
                self.co.ctx.post_detached(list).await?;
            } else {
                self.post(Phase::Release, list).await?;
            }
        }
        self.st.mark_released();
        Ok(())
    }

    /// One execution round ([`crate::round`]): bucket READs for uncached addresses, then
    /// one doorbell per MN with a READ of every read-only item and a CAS + READ of every
    /// for-update item; then the decisions of Pandora §2.3 / §3.1.2 per item (abort on a
    /// live lock, ignore or steal a stray one).
    async fn round_impl(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        if self.kind == TxnKind::ReadOnly && reqs.iter().any(|r| r.access == Access::ForUpdate) {
            return Err(TxnError::ReadOnly);
        }
        let mut plan = RoundPlan::new(
            reqs,
            |r| self.st.local_answer(r),
            |t, k| self.co.shared.cache.borrow_mut().get(t, k),
        );
        self.locate_round(&mut plan).await?;
        let (mut res, wrs) = self.access_round(&plan).await?;
        let mut values = self.st.absorb_absent(&plan.fetches);
        let mut conflict: Option<TxnError> = None;
        if let Some(res) = res.as_mut() {
            self.settle_round_locks(&plan, &wrs, res, &mut values, &mut conflict)
                .await?;
            self.settle_round_reads(&plan, &wrs, res, &mut values, &mut conflict)?;
        }
        if let Some(e) = conflict {
            return Err(e);
        }
        Ok(plan
            .answers
            .into_iter()
            .map(|a| match a {
                Answer::Local(v) => v,
                Answer::Fetched(n) => values[n].clone(),
            })
            .collect())
    }

    /// A round's locate step: one bucket READ per uncached address, every MN at once; the
    /// addresses found are cached.
    async fn locate_round(&mut self, plan: &mut RoundPlan) -> Result<(), TxnError> {
        if let Some((list, ids)) = plan.locate_list(self.store()).map_err(TxnError::from)? {
            let res = self.post(Phase::Locate, list).await?;
            let found = plan
                .absorb_locate(self.store(), &ids, &res)
                .map_err(TxnError::from)?;
            let mut cache = self.co.shared.cache.borrow_mut();
            for (t, k, loc) in found {
                cache.put(t, k, loc);
            }
        }
        Ok(())
    }

    /// A round's access step: READ (read-only) / CAS + READ (for update), one doorbell per
    /// MN, after logging the locks (lock logging only). `None`: nothing to post.
    async fn access_round(
        &mut self,
        plan: &RoundPlan,
    ) -> Result<(Option<BatchResult>, Vec<ItemWrs>), TxnError> {
        let for_update: Vec<ItemLoc> = plan
            .fetches
            .iter()
            .filter(|f| f.access == Access::ForUpdate)
            .filter_map(|f| match f.located {
                Some(Located::Found(loc)) => Some(loc),
                _ => None,
            })
            .collect();
        self.log_locks(&for_update).await?;
        let me = logic::my_lock(self.co.id);
        let (list, wrs) = access_list(&plan.fetches, me, |f, loc| {
            Ok::<_, TxnError>((self.primary_addr(loc)?, self.item_len(f.table)? as u32))
        })?;
        let res = if list.is_empty() {
            None
        } else {
            Some(self.post(Phase::Execute, list).await?)
        };
        Ok((res, wrs))
    }

    /// Takes the round's lock CASes: every CAS that found the lock free acquired it, so
    /// those entries are recorded as held before anything is judged (an abort must release
    /// them); then each lock is settled (acquired, stolen, or a conflict noted).
    async fn settle_round_locks(
        &mut self,
        plan: &RoundPlan,
        wrs: &[ItemWrs],
        res: &mut BatchResult,
        values: &mut [Option<Vec<u8>>],
        conflict: &mut Option<TxnError>,
    ) -> Result<(), TxnError> {
        let mut locked = Vec::new();
        for w in wrs.iter().filter(|w| w.cas.is_some()) {
            let f = &plan.fetches[w.fetch];
            let Some(Located::Found(loc)) = f.located else {
                continue;
            };
            let old = res.atomic(w.cas.unwrap_or(w.read));
            let bytes = res.take_bytes(w.read);
            let idx = self
                .st
                .record_lock_attempt(f.table, f.key, loc, old, &bytes)?;
            locked.push((w.fetch, idx, loc, old, bytes));
        }
        if logs_before_lock_results(&self.co.cfg) && !locked.is_empty() {
            // The corner case of Pandora §5.1: the undo records go out before the
            // coordinator has looked at what its CASes returned.
            self.write_logs(true).await?;
        }
        for (n, idx, loc, old, bytes) in locked {
            let (table, key) = (plan.fetches[n].table, plan.fetches[n].key);
            match self.settle_lock(table, key, loc, idx, old, bytes).await {
                Ok(item) => {
                    self.st
                        .note_read(table, key, item.version.counter(), item.writer);
                    values[n] = self.st.current_value(&self.st.writes[idx]);
                }
                Err(e) => {
                    conflict.get_or_insert(e);
                }
            }
        }
        Ok(())
    }

    /// Takes the round's READs of read-only items ([`TxnState::absorb_read`]).
    fn settle_round_reads(
        &mut self,
        plan: &RoundPlan,
        wrs: &[ItemWrs],
        res: &BatchResult,
        values: &mut [Option<Vec<u8>>],
        conflict: &mut Option<TxnError>,
    ) -> Result<(), TxnError> {
        for w in wrs.iter().filter(|w| w.cas.is_none()) {
            let f = &plan.fetches[w.fetch];
            let Some(Located::Found(loc)) = f.located else {
                continue;
            };
            let seen = self.st.absorb_read(
                (f.table, f.key, loc),
                res.bytes(w.read),
                &self.co.shared.failed.borrow(),
                &self.co.cfg,
            )?;
            match seen {
                ReadSeen::Locked => {
                    conflict.get_or_insert(TxnError::Aborted(AbortReason::ReadLockedItem));
                }
                ReadSeen::Value { value, stray } => {
                    if stray {
                        self.co.stats.stray_reads += 1;
                    }
                    values[w.fetch] = value;
                }
            }
        }
        Ok(())
    }

    /// Finishes the acquisition of one lock whose CAS returned `old` (the item READ in the
    /// same doorbell returned `bytes`): acquired, stolen from a failed coordinator (PILL,
    /// Pandora §3.1.2; one more CAS + READ), or a conflict. Returns the item as locked.
    async fn settle_lock(
        &mut self,
        table: TableId,
        key: Key,
        loc: ItemLoc,
        idx: usize,
        mut old: u64,
        mut bytes: Vec<u8>,
    ) -> Result<ItemRead, TxnError> {
        let addr = self.primary_addr(&loc)?;
        let item_len = self.item_len(table)? as u32;
        let me = logic::my_lock(self.co.id);
        loop {
            // Borrow the 8 KiB failed-id set only for the decision (never across an await):
            // no copy per lock, and a notification that arrives meanwhile is seen at once.
            let next = logic::after_cas(old, &self.co.shared.failed.borrow(), &self.co.cfg);
            match next {
                AfterCas::Acquired => break,
                AfterCas::Steal { observed } => {
                    let mut list = PostList::new();
                    let cas = list.cas(addr, observed, me);
                    let rd = list.read(addr, item_len);
                    let mut res = self.post(Phase::Steal, list).await?;
                    match after_steal(observed, res.atomic(cas)) {
                        AfterSteal::Stolen => {
                            self.co.stats.steals += 1;
                            bytes = res.take_bytes(rd);
                            old = 0;
                        }
                        AfterSteal::ChangedHands => {
                            self.st.writes[idx].lock = LockState::Failed;
                            return Err(TxnError::Aborted(AbortReason::LockChangedHands));
                        }
                        AfterSteal::Again(got) => old = got,
                    }
                }
                AfterCas::Conflict => {
                    self.st.writes[idx].lock = LockState::Failed;
                    return Err(TxnError::Aborted(AbortReason::WriteLockHeld));
                }
            }
        }
        let item = parse_item(&bytes, table, key)?;
        self.st.hold(idx, &item);
        Ok(item)
    }

    /// A write (Pandora §2.3 step 1): restaged on an entry the write set holds; else a
    /// blind update deferred to commit, a delete or insert of a known record locked now,
    /// or an insert of an absent key that claims an index slot.
    async fn write_impl(
        &mut self,
        table: TableId,
        key: Key,
        value: &[u8],
        kind: WriteKind,
    ) -> Result<(), TxnError> {
        if self.kind == TxnKind::ReadOnly {
            return Err(TxnError::ReadOnly);
        }
        let expected = self.value_len(table)?;
        if kind != WriteKind::Delete && value.len() != expected {
            return Err(TxnError::ValueSize {
                expected,
                got: value.len(),
            });
        }
        if let Some(staged) = self.st.stage_on_entry(table, key, value, kind) {
            return staged;
        }
        match (kind, self.locate(table, key).await?) {
            (WriteKind::Update, Located::Found(loc)) => {
                // Blind write: FORD locks it at commit.
                self.st.push_deferred(table, key, loc, value);
                Ok(())
            }
            (WriteKind::Delete | WriteKind::Insert, Located::Found(loc)) => {
                let (item, _) = self
                    .lock_and_read(table, key, loc, SlotAccess::None)
                    .await?;
                self.st
                    .note_read(table, key, item.version.counter(), item.writer);
                self.st.stage_locked(table, key, kind, value, item.valid)
            }
            (WriteKind::Insert, Located::Absent { bucket, free }) => {
                self.insert_absent(table, key, value, bucket, free).await
            }
            (WriteKind::Update | WriteKind::Delete, Located::Absent { .. }) => {
                Err(TxnError::KeyState(key.0))
            }
        }
    }

    /// An insert of a key absent from the index: lock the record of the bucket's free slot
    /// `free` (with the slot READ, or CASed in a pooled table) and claim the slot.
    async fn insert_absent(
        &mut self,
        table: TableId,
        key: Key,
        value: &[u8],
        bucket: BucketLoc,
        free: Option<usize>,
    ) -> Result<(), TxnError> {
        let Some(slot) = free else {
            // Full, or a slot half claimed by a concurrent insert of a hashed pooled
            // table (`TableLayout::insert_slot`), possibly of this very key.
            return Err(TxnError::Aborted(AbortReason::NoFreeIndexSlot));
        };
        // The slot's fixed record, or for a pooled table the next record of this
        // coordinator's insert share (no verb: the share is its own).
        let loc = self
            .co
            .inserts
            .next(self.store(), self.co.id, bucket, slot)
            .map_err(TxnError::from)?;
        let pooled = self
            .store()
            .table(table)
            .map_err(TxnError::from)?
            .is_pooled();
        let access = if pooled {
            // Another insert into this slot would lock a record of its own, so the
            // record lock cannot arbitrate: the lock batch CASes the slot instead of
            // READing it (same verbs, one READ becomes a CAS). Once that CAS is
            // posted the slot may name the record, so the record counts as taken.
            self.co.inserts.claimed(&self.co.store, bucket);
            SlotAccess::Claim(logic::pack_location(bucket.partition, loc.offset).to_raw())
        } else {
            SlotAccess::Read
        };
        let (item, seen) = self.lock_and_read(table, key, loc, access).await?;
        if slot_verdict(seen.as_ref(), key, item.valid)? {
            self.write_slot(bucket, slot, key, loc.offset).await?;
        }
        self.co.shared.cache.borrow_mut().put(table, key, loc);
        self.st
            .note_read(table, key, item.version.counter(), item.writer);
        self.st
            .stage_locked(table, key, WriteKind::Insert, value, item.valid)
    }
}

impl<V: Verbs + Clock, H: HistorySink> Transaction for FordTxn<'_, V, H> {
    async fn read_round(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        self.round_impl(reqs).await
    }

    async fn write(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.write_impl(table, key, value, WriteKind::Update).await
    }

    async fn insert(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.write_impl(table, key, value, WriteKind::Insert).await
    }

    async fn delete(&mut self, table: TableId, key: Key) -> Result<(), TxnError> {
        self.write_impl(table, key, &[], WriteKind::Delete).await
    }

    async fn commit(mut self) -> Result<(), TxnError> {
        match self.commit_inner().await {
            Ok(()) => Ok(()),
            // Stopped by an MN failure after the decision: decide as log recovery would.
            Err(_) if self.decided && self.mn_failed => self.decide_after_mn_failure().await,
            Err(e) => Err(self.fail(e).await),
        }
    }

    async fn abort(mut self) {
        if self.mn_failed {
            self.co.stats.mn_aborted += 1;
        }
        let _ = self.abort_inner().await;
        self.record_aborted();
    }
}

//! The client side (Dandelion §3) and the commit-phase skeleton (§4.2) behind dmem's
//! rounds API.
//!
//! A [`DnlTxn`] is the paper's transaction context: its transaction cache holds one entry per
//! key (what the execution phase read and the write buffered for it; a Put on a key already
//! read is fused onto its entry, as a GetPut); the rounds API's [`Transaction::read_round`]
//! is the asynchronous Gets of one round followed by `PollAll`, and many transaction
//! contexts per thread are the coordinators (coroutines) a harness runs on that thread. The
//! reorder buffer is not needed: a round's values come back in request order.
//!
//! Execution issues Gets only (§4.2.1): to the own server if it holds a replica of the key
//! (primary, or a backup with local reads on, §4.3) — batched into its hashtable by the
//! worker — else as an RPC to the primary. Commit runs the skeleton of Fig. 3 as specified
//! by a [`CommitSpec`] (Table 4): Locking (no-wait), Read Validation, Replication with
//! undo logs (lowering the readable flag at backups), Unlocking with the decision; the
//! readable flag is raised by a `RAISE` message that rides in a later packet. A read-only
//! transaction runs Dnl-RO, or commits at once as a GetOne when it read one key that was
//! unlocked and readable (§4.2.1).

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;

use dmem_layout::kv_meta::KvMeta;
use dmem_txn::{
    AbortReason, Coordinator, CoordinatorId, HistorySink, Key, ReadEvent, ReadReq, RoundValues,
    TableId, Transaction, TxnError, TxnId, TxnKind, TxnOutcome, TxnRecord, Version, WriteEvent,
    WriteKind,
};
use dmem_verbs::{Clock, Verbs};

use crate::commit::{self, At, CommitPlan, Entry, Locked, Out};
use crate::config::CommitSpec;
use crate::net::Flow;
use crate::wire::{Request, Response, Seen, WriteOp};
use crate::worker::{Interrupted, Step, Worker};

/// Counters of one coordinator.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TxnStats {
    /// Committed.
    pub committed: u64,
    /// Aborted by the protocol.
    pub aborted: u64,
    /// Read-only transactions committed as GetOne (no commit phase).
    pub get_ones: u64,
}

/// A Dandelion coordinator: transaction contexts of one coroutine on one server thread.
pub struct DnlCoordinator<V, H> {
    worker: Rc<Worker<V>>,
    id: CoordinatorId,
    seq: u64,
    history: H,
    stats: TxnStats,
    /// Network round trips awaited ([`Coordinator::round_trips`]).
    round_trips: Cell<u64>,
}

impl<V, H> core::fmt::Debug for DnlCoordinator<V, H> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DnlCoordinator")
            .field("id", &self.id)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl<V: Verbs + Clock, H: HistorySink> DnlCoordinator<V, H> {
    /// Coordinator `id` on `worker`'s thread, recording into `history`.
    #[must_use]
    pub fn new(worker: Rc<Worker<V>>, id: u16, history: H) -> Self {
        worker
            .cluster()
            .coordinator_server
            .borrow_mut()
            .insert(u32::from(id), worker.server());
        Self {
            worker,
            id: CoordinatorId(u32::from(id)),
            seq: 0,
            history,
            stats: TxnStats::default(),
            round_trips: Cell::new(0),
        }
    }

    /// Its counters.
    #[must_use]
    pub fn stats(&self) -> TxnStats {
        self.stats
    }
}

impl<V: Verbs + Clock, H: HistorySink> Coordinator for DnlCoordinator<V, H> {
    type Txn<'a>
        = DnlTxn<'a, V, H>
    where
        Self: 'a;

    fn round_trips(&self) -> Option<u64> {
        Some(self.round_trips.get())
    }

    async fn begin(&mut self, kind: TxnKind) -> Result<DnlTxn<'_, V, H>, TxnError> {
        self.seq += 1;
        let id = TxnId {
            coordinator: self.id,
            seq: self.seq,
        };
        let begin = self.worker.ctx().now();
        Ok(DnlTxn {
            coord: self,
            id,
            kind,
            begin,
            entries: Vec::new(),
            index: HashMap::new(),
            reads: Vec::new(),
        })
    }
}

/// A transaction context (see the module docs).
pub struct DnlTxn<'c, V, H> {
    coord: &'c mut DnlCoordinator<V, H>,
    id: TxnId,
    kind: TxnKind,
    begin: u64,
    entries: Vec<Entry>,
    index: HashMap<(u32, u64), usize>,
    reads: Vec<ReadEvent>,
}

impl<V, H> core::fmt::Debug for DnlTxn<'_, V, H> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DnlTxn")
            .field("id", &self.id)
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

impl<V: Verbs + Clock, H: HistorySink> DnlTxn<'_, V, H> {
    fn worker(&self) -> &Rc<Worker<V>> {
        &self.coord.worker
    }

    /// Sends every request of a step and waits for all responses, in order.
    async fn step(&self, flow: Flow, outs: Vec<Out>) -> Result<Vec<Response>, Interrupted> {
        if outs.is_empty() {
            return Ok(Vec::new());
        }
        // A step that reaches another server is one network round trip (its requests
        // leave together in the packets of one iteration, and it waits for every reply);
        // a step served entirely by this server is none.
        let me = self.worker().server();
        if outs.iter().any(|(to, _)| *to != me) {
            let n = &self.coord.round_trips;
            n.set(n.get() + 1);
        }
        let step = Step::new(outs.len());
        // Every request of a step belongs to the epoch the step began in: none is sent
        // once recovery moved on (it would act for a transaction recovery decided).
        let epoch = self.worker().cluster().epoch.get();
        for (i, (to, req)) in outs.into_iter().enumerate() {
            self.worker()
                .issue(to, flow, req, Some((Rc::clone(&step), i)), epoch)
                .await;
        }
        step.wait().await
    }

    /// Sends requests whose responses nobody waits for (they are still answered, and
    /// retransmitted until they are).
    async fn send_detached(&self, flow: Flow, outs: Vec<Out>) {
        let epoch = self.worker().cluster().epoch.get();
        for (to, req) in outs {
            self.worker().issue(to, flow, req, None, epoch).await;
        }
    }

    fn entry_mut(&mut self, table: u32, key: u64) -> &mut Entry {
        let next = self.entries.len();
        let i = *self.index.entry((table, key)).or_insert(next);
        if i == next {
            self.entries.push(Entry {
                table,
                key,
                seen: None,
                get_one_ok: false,
                value: None,
                write: None,
            });
        }
        &mut self.entries[i]
    }

    /// Whether the key is present as far as this transaction knows (`None`: unknown).
    fn known_present(&self, table: u32, key: u64) -> Option<bool> {
        let e = &self.entries[*self.index.get(&(table, key))?];
        match &e.write {
            Some(w) => Some(w.kind != WriteKind::Delete),
            None => e.seen.map(|s| s.present),
        }
    }

    fn buffer_write(
        &mut self,
        table: TableId,
        key: Key,
        kind: WriteKind,
        value: &[u8],
    ) -> Result<(), TxnError> {
        if self.kind == TxnKind::ReadOnly {
            return Err(TxnError::ReadOnly);
        }
        let known = self.known_present(table.0, key.0);
        let ok = match kind {
            WriteKind::Insert => known != Some(true),
            WriteKind::Update | WriteKind::Delete => known != Some(false),
        };
        if !ok {
            return Err(TxnError::KeyState(key.0));
        }
        let e = self.entry_mut(table.0, key.0);
        // An insert followed by an update stays an insert of the new value.
        let kind = match (&e.write, kind) {
            (Some(w), WriteKind::Update) if w.kind == WriteKind::Insert => WriteKind::Insert,
            (_, k) => k,
        };
        e.write = Some(WriteOp {
            kind,
            value: if kind == WriteKind::Delete {
                Vec::new()
            } else {
                value.to_vec()
            },
        });
        Ok(())
    }

    fn record(&self, outcome: TxnOutcome, writes: Vec<WriteEvent>) {
        self.coord.history.record(TxnRecord {
            id: self.id,
            begin: self.begin,
            end: self.worker().ctx().now(),
            outcome,
            reads: self.reads.clone(),
            writes,
        });
    }

    /// Ends in abort: unlocks what Locking took (waiting for the acks if `wait`), records.
    async fn abort_with(
        self,
        locked: Vec<At>,
        wait: bool,
        why: AbortReason,
    ) -> Result<(), TxnError> {
        let unlocks = commit::abort_unlocks(self.id, &self.entries, &locked);
        if wait {
            // Interrupted: recovery aborts it (its coordinator did not decide commit).
            let _ = self.step(Flow::COMMIT, unlocks).await;
        } else {
            self.send_detached(Flow::COMMIT, unlocks).await;
        }
        self.record(TxnOutcome::Aborted, Vec::new());
        self.coord.stats.aborted += 1;
        Err(TxnError::Aborted(why))
    }

    /// Read Validation of `reads` (entry indices) at their primaries.
    async fn validate(&self, reads: &[usize]) -> bool {
        let outs = commit::validation_requests(&**self.worker().cluster(), &self.entries, reads);
        self.step(Flow::COMMIT, outs)
            .await
            .is_ok_and(|rs| commit::validated(&rs))
    }

    async fn commit_read_only(self) -> Result<(), TxnError> {
        let config = self.worker().cluster().config;
        let get_one = config.get_one && self.entries.len() == 1 && self.entries[0].get_one_ok;
        if !get_one {
            let reads: Vec<usize> = (0..self.entries.len()).collect();
            if !self.validate(&reads).await {
                return self
                    .abort_with(Vec::new(), false, AbortReason::ReadValidationFailed)
                    .await;
            }
        } else {
            self.coord.stats.get_ones += 1;
        }
        self.record(TxnOutcome::Committed, Vec::new());
        self.coord.stats.committed += 1;
        Ok(())
    }

    /// The commit skeleton (Fig. 3) specialised by `spec`: the decisions are
    /// [`CommitPlan`]'s, this sends them and stops where a step says to.
    async fn commit_with(self, spec: CommitSpec) -> Result<(), TxnError> {
        let cluster = Rc::clone(self.worker().cluster());
        let plan = CommitPlan::new(self.id, spec, &self.entries);
        // Recovery between Locking and the decision releases the locks of an undecided
        // transaction: one that resumes in a later epoch must abort.
        let epoch = cluster.epoch.get();
        // 1. Locking (no-wait: a refused lock aborts).
        let targets = plan.lock_targets(&*cluster);
        // Interrupted by recovery: not decided, so recovery aborts it.
        let replies = match spec.lock {
            Some(_) => {
                (self.step(Flow::COMMIT, plan.lock_requests(&targets)).await).unwrap_or_default()
            }
            None => Vec::new(),
        };
        let locked = match spec.lock {
            Some(_) => plan.on_lock_replies(&*cluster, &targets, &replies),
            None => Locked {
                all: true,
                ..Locked::default()
            },
        };
        let waits = spec.abort_waits_for_unlock;
        if !locked.all {
            return self
                .abort_with(locked.at, waits, AbortReason::LockRefused)
                .await;
        }
        // 2. Read Validation of the reads Locking did not cover.
        if plan.validates() && !self.validate(plan.reads_to_validate()).await {
            let why = AbortReason::ReadValidationFailed;
            return self.abort_with(locked.at, waits, why).await;
        }
        if cluster.epoch.get() != epoch {
            // Recovery already released this transaction's locks.
            let why = AbortReason::InterruptedByRecovery;
            return self.abort_with(Vec::new(), false, why).await;
        }
        // Decided: commit. The versions installed, recorded before any write lands.
        let versions = plan.versions(&locked.base);
        self.record(TxnOutcome::Unknown, plan.write_events(&versions));
        let decision = plan.decision(&versions);
        cluster.decided.borrow_mut().insert(self.id, decision);
        // From here on the transaction commits: if recovery interrupts a step, it rolls the
        // transaction forward (its coordinator decided commit), so the client is told commit.
        let _interrupted = self
            .replicate_and_unlock(&plan, &locked.at, &versions)
            .await;
        self.committed();
        Ok(())
    }

    /// Steps 3 and 4 of a decided commit: Replication with undo logs, Unlocking with the
    /// decision, and the `RAISE`s. `Err` when recovery interrupted a step it waited for
    /// (recovery rolls the transaction forward).
    async fn replicate_and_unlock(
        &self,
        plan: &CommitPlan<'_>,
        locked: &[At],
        versions: &HashMap<usize, u32>,
    ) -> Result<(), Interrupted> {
        let spec = plan.spec();
        let skip_readable = self.worker().cluster().config.bugs.skip_readable;
        let r = plan.replication(&**self.worker().cluster(), versions, skip_readable);
        if spec.replicate.is_some() {
            self.step(Flow::COMMIT, r.outs).await?;
        }
        let unlocks = plan.commit_unlocks(locked, &r.replicated, versions);
        if spec.commit_waits_for_unlock {
            self.step(Flow::COMMIT, unlocks).await?;
        } else {
            self.send_detached(Flow::COMMIT, unlocks).await;
        }
        // The readable flags come back up with a message that rides in a later packet.
        self.send_detached(Flow::COMMIT, plan.raises(&r.lowered, versions))
            .await;
        Ok(())
    }

    fn committed(self) {
        self.coord
            .history
            .resolve(self.id, TxnOutcome::Committed, self.worker().ctx().now());
        self.coord.stats.committed += 1;
    }
}

impl<V: Verbs + Clock, H: HistorySink> Transaction for DnlTxn<'_, V, H> {
    async fn read_round(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        let me = self.worker().server();
        let config = self.worker().cluster().config;
        let cluster = Rc::clone(self.worker().cluster());
        // Keys not in the transaction cache yet: one Get each, all issued before any wait.
        let mut fetch: Vec<(u32, u64)> = Vec::new();
        for r in reqs {
            let k = (r.table.0, r.key.0);
            let cached = self.index.get(&k).is_some_and(|&i| {
                self.entries[i].seen.is_some() || self.entries[i].write.is_some()
            });
            if !cached && !fetch.contains(&k) {
                fetch.push(k);
            }
        }
        let outs: Vec<Out> = fetch
            .iter()
            .map(|&(table, key)| {
                let primary = cluster.primary(table, key);
                let local = primary == me
                    || (config.local_reads && cluster.replicas(table, key).contains(&me));
                let to = if local { me } else { primary };
                (to, Request::Get { table, key })
            })
            .collect();
        let replies = self
            .step(Flow::EXECUTION, outs)
            .await
            .map_err(|Interrupted| TxnError::Aborted(AbortReason::InterruptedByRecovery))?;
        for (&(table, key), r) in fetch.iter().zip(replies) {
            let Response::Get {
                meta,
                writer,
                value,
            } = r
            else {
                return Err(TxnError::Aborted(AbortReason::MalformedGetResponse));
            };
            let meta = KvMeta::from_raw(meta);
            let present = !meta.is_deleted();
            let read = ReadEvent::new(TableId(table), Key(key), Version(u64::from(meta.version())));
            self.reads.push(match writer {
                Some(w) => read.written_by(w),
                None => read,
            });
            let e = self.entry_mut(table, key);
            e.seen = Some(Seen {
                version: meta.version(),
                present,
            });
            e.get_one_ok = meta.get_one_allowed();
            e.value = present.then_some(value);
        }
        Ok(reqs
            .iter()
            .map(|r| {
                let e = &self.entries[self.index[&(r.table.0, r.key.0)]];
                match &e.write {
                    Some(w) if w.kind == WriteKind::Delete => None,
                    Some(w) => Some(w.value.clone()),
                    None => e.value.clone(),
                }
            })
            .collect())
    }

    async fn write(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.buffer_write(table, key, WriteKind::Update, value)
    }

    async fn insert(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.buffer_write(table, key, WriteKind::Insert, value)
    }

    async fn delete(&mut self, table: TableId, key: Key) -> Result<(), TxnError> {
        self.buffer_write(table, key, WriteKind::Delete, &[])
    }

    async fn commit(self) -> Result<(), TxnError> {
        if self.entries.iter().all(|e| e.write.is_none()) {
            return self.commit_read_only().await;
        }
        let spec = self.worker().cluster().config.commit;
        // Recovery asks this server which commits are in flight (§4.4, `Cluster::in_commit`).
        let cluster = Rc::clone(self.worker().cluster());
        let (server, id, epoch) = (self.worker().server(), self.id, cluster.epoch.get());
        cluster.begin_commit(server, id);
        let result = self.commit_with(spec).await;
        cluster.end_commit(server, id, epoch);
        result
    }

    async fn abort(self) {
        // Execution takes no locks: nothing to release.
        self.record(TxnOutcome::Aborted, Vec::new());
        self.coord.stats.aborted += 1;
    }
}

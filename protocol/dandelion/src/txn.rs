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

use crate::config::{CommitSpec, Replicas, Visit};
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

/// One entry of the transaction cache.
#[derive(Debug, Clone)]
struct Entry {
    table: u32,
    key: u64,
    /// What execution read (`None`: written blind).
    seen: Option<Seen>,
    /// The key was unlocked and readable when read (GetOne may return it).
    get_one_ok: bool,
    /// The value read (`None`: absent).
    value: Option<Vec<u8>>,
    /// The write buffered for commit.
    write: Option<WriteOp>,
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

/// One request of a commit step: the server it goes to and the request.
type Out = (u16, Request);

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

    fn replicas_of(&self, e: &Entry, which: Replicas) -> Vec<u16> {
        let all = self.worker().cluster().replicas(e.table, e.key);
        let split = all.len().min(1);
        match which {
            Replicas::Primary => all[..split].to_vec(),
            Replicas::Backups => all[split..].to_vec(),
            Replicas::All => all,
        }
    }

    fn primary(&self, e: &Entry) -> u16 {
        self.worker().cluster().primary(e.table, e.key)
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
        locked: Vec<(usize, u16)>,
        wait: bool,
        why: AbortReason,
    ) -> Result<(), TxnError> {
        let unlocks: Vec<Out> = locked
            .iter()
            .map(|&(i, to)| {
                let e = &self.entries[i];
                (
                    to,
                    Request::Unlock {
                        txn: self.id,
                        table: e.table,
                        key: e.key,
                        commit: false,
                        apply: None,
                    },
                )
            })
            .collect();
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
        let outs: Vec<Out> = reads
            .iter()
            .filter_map(|&i| {
                let e = &self.entries[i];
                let seen = e.seen?;
                Some((
                    self.primary(e),
                    Request::Validate {
                        table: e.table,
                        key: e.key,
                        read: seen,
                    },
                ))
            })
            .collect();
        self.step(Flow::COMMIT, outs)
            .await
            .is_ok_and(|rs| rs.iter().all(|r| matches!(r, Response::Ack { ok: true })))
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

    /// The commit skeleton (Fig. 3) specialised by `spec`.
    async fn commit_with(self, spec: CommitSpec) -> Result<(), TxnError> {
        let config = self.worker().cluster().config;
        let writes: Vec<usize> = (0..self.entries.len())
            .filter(|&i| self.entries[i].write.is_some())
            .collect();
        let read_only: Vec<usize> = (0..self.entries.len())
            .filter(|&i| self.entries[i].write.is_none() && self.entries[i].seen.is_some())
            .collect();

        // Recovery between Locking and the decision releases the locks of an undecided
        // transaction: one that resumes in a later epoch must abort.
        let epoch = self.worker().cluster().epoch.get();
        // 1. Locking (no-wait: a refused lock aborts).
        let mut locked: Vec<(usize, u16)> = Vec::new();
        let mut base: HashMap<usize, u32> = HashMap::new();
        if let Some(Visit { reads, replicas }) = spec.lock {
            let mut targets = Vec::new();
            let keys: Vec<usize> = writes
                .iter()
                .chain(if reads { read_only.iter() } else { [].iter() })
                .copied()
                .collect();
            let lock_set = u16::try_from(keys.len()).unwrap_or(u16::MAX);
            for &i in &keys {
                for to in self.replicas_of(&self.entries[i], replicas) {
                    targets.push((i, to));
                }
            }
            let outs = targets
                .iter()
                .map(|&(i, to)| {
                    let e = &self.entries[i];
                    (
                        to,
                        Request::Lock {
                            txn: self.id,
                            table: e.table,
                            key: e.key,
                            read: e.seen,
                            write: e.write.clone(),
                            lock_set,
                        },
                    )
                })
                .collect();
            // Interrupted by recovery: not decided, so recovery aborts it.
            let replies = self.step(Flow::COMMIT, outs).await.unwrap_or_default();
            let mut all = replies.len() == targets.len();
            for (&(i, to), r) in targets.iter().zip(&replies) {
                match r {
                    Response::Lock {
                        granted: true,
                        meta,
                    } => {
                        locked.push((i, to));
                        if to == self.primary(&self.entries[i]) {
                            base.insert(i, KvMeta::from_raw(*meta).version());
                        }
                    }
                    _ => all = false,
                }
            }
            if !all {
                return self
                    .abort_with(
                        locked,
                        spec.abort_waits_for_unlock,
                        AbortReason::LockRefused,
                    )
                    .await;
            }
        }

        // 2. Read Validation of the reads Locking did not cover.
        let lock_reads = spec.lock.is_some_and(|v| v.reads);
        if spec.validate && !lock_reads && !self.validate(&read_only).await {
            return self
                .abort_with(
                    locked,
                    spec.abort_waits_for_unlock,
                    AbortReason::ReadValidationFailed,
                )
                .await;
        }

        if self.worker().cluster().epoch.get() != epoch {
            // Recovery already released this transaction's locks.
            return self
                .abort_with(Vec::new(), false, AbortReason::InterruptedByRecovery)
                .await;
        }

        // Decided: commit. The versions installed, recorded before any write lands.
        let mut versions: HashMap<usize, u32> = HashMap::new();
        let mut events = Vec::new();
        for &i in &writes {
            let e = &self.entries[i];
            let from = e
                .seen
                .map(|s| s.version)
                .or_else(|| base.get(&i).copied())
                .unwrap_or(0);
            let v = KvMeta::INSERTED
                .with_version(from)
                .map_or(0, |m| m.bumped().version());
            versions.insert(i, v);
            let w = e.write.as_ref().expect("a write");
            events.push(WriteEvent {
                table: TableId(e.table),
                key: Key(e.key),
                version: Version(u64::from(v)),
                kind: w.kind,
            });
        }
        self.record(TxnOutcome::Unknown, events);
        let decision = writes
            .iter()
            .map(|&i| {
                let e = &self.entries[i];
                (
                    e.table,
                    e.key,
                    versions[&i],
                    e.write.clone().expect("a write"),
                )
            })
            .collect();
        self.worker()
            .cluster()
            .decided
            .borrow_mut()
            .insert(self.id, decision);
        // From here on the transaction commits: if recovery interrupts a step, it rolls the
        // transaction forward (its coordinator decided commit), so the client is told commit.

        // 3. Replication with undo logs; backups lower the readable flag.
        let mut replicated: Vec<(usize, u16)> = Vec::new();
        let mut lowered: Vec<(usize, u16)> = Vec::new();
        if let Some(Visit { replicas, .. }) = spec.replicate {
            let mut outs = Vec::new();
            for &i in &writes {
                let e = &self.entries[i];
                let primary = self.primary(e);
                for to in self.replicas_of(e, replicas) {
                    let lower = to != primary && !config.bugs.skip_readable;
                    replicated.push((i, to));
                    if lower {
                        lowered.push((i, to));
                    }
                    outs.push((
                        to,
                        Request::Replicate {
                            txn: self.id,
                            table: e.table,
                            key: e.key,
                            version: versions[&i],
                            lower_readable: lower,
                            write: e.write.clone().expect("a write"),
                        },
                    ));
                }
            }
            if self.step(Flow::COMMIT, outs).await.is_err() {
                self.committed();
                return Ok(());
            }
        }

        // 4. Unlocking with the decision; replicas that were not replicated to apply here.
        let unlocks: Vec<Out> = locked
            .iter()
            .map(|&(i, to)| {
                let e = &self.entries[i];
                let apply = match (&e.write, replicated.contains(&(i, to))) {
                    (Some(w), false) => Some((versions[&i], w.clone())),
                    _ => None,
                };
                (
                    to,
                    Request::Unlock {
                        txn: self.id,
                        table: e.table,
                        key: e.key,
                        commit: true,
                        apply,
                    },
                )
            })
            .collect();
        if spec.commit_waits_for_unlock {
            if self.step(Flow::COMMIT, unlocks).await.is_err() {
                self.committed();
                return Ok(());
            }
        } else {
            self.send_detached(Flow::COMMIT, unlocks).await;
        }
        // The readable flags come back up with a message that rides in a later packet.
        let raises: Vec<Out> = lowered
            .iter()
            .map(|&(i, to)| {
                let e = &self.entries[i];
                (
                    to,
                    Request::Raise {
                        txn: self.id,
                        table: e.table,
                        key: e.key,
                        version: versions[&i],
                    },
                )
            })
            .collect();
        self.send_detached(Flow::COMMIT, raises).await;
        self.committed();
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

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

use std::cell::RefCell;
use std::rc::Rc;

use dmem_layout::log::{DataLogEntry, LogOp, LogRegionHeader, LogWriter};
use dmem_layout::pill::FailedCoordinatorSet;
use dmem_layout::record::{
    DataItem, DataItemHeader, DataVersion, ItemFlags, RemoteAddr as PackedAddr,
};
use dmem_txn::{
    Coordinator, CoordinatorId, HistorySink, Key, ReadEvent, TableId, Transaction, TxnError, TxnId,
    TxnKind, TxnOutcome, TxnRecord, Version, WriteEvent, WriteKind,
};
use dmem_verbs::{BatchResult, Clock, Nanos, NodeId, PostList, Verbs, VerbsError, WrId};

use crate::config::{FordBug, Protocol, ProtocolConfig};
use crate::logic::{self, AfterCas, Decision, LoggedTxn, LoggedWrite};
use crate::mnfail::{MnState, encode_suspect};
use crate::recovery::{CoordinatorRecovery, RecoveryError, apply_recovery};
use crate::store::{
    AddressCache, BUCKET_LEN, BucketLoc, ItemLoc, Store, StoreError, encode_item, index_slot_bytes,
    parse_bucket, slot_offset,
};

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

/// Per-CN state shared by its coordinators: the failed-id set (updated by the stray-lock
/// notification, Pandora §3.2.2 step 4), the address cache and the MN-failure state
/// (§3.2.5, see [`crate::mnfail`]).
#[derive(Debug, Clone)]
pub struct CnShared {
    /// Failed coordinator ids.
    pub failed: Rc<RefCell<FailedCoordinatorSet>>,
    /// Address cache.
    pub cache: Rc<RefCell<AddressCache>>,
    /// View epoch, pause and running transactions, for MN failures.
    pub mn: Rc<RefCell<MnState>>,
}

impl CnShared {
    /// Fresh state: no failed coordinator, empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self {
            failed: Rc::new(RefCell::new(FailedCoordinatorSet::EMPTY)),
            cache: Rc::new(RefCell::new(AddressCache::new())),
            mn: Rc::new(RefCell::new(MnState::default())),
        }
    }
}

impl Default for CnShared {
    fn default() -> Self {
        Self::new()
    }
}

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
            reads: Vec::new(),
            writes: Vec::new(),
            events: Vec::new(),
            logged: Vec::new(),
            lock_log: Vec::new(),
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
            let _ = self.ctx.send(fd, &encode_suspect(mn)).await;
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

#[derive(Debug, Clone)]
enum ReadTarget {
    Item { loc: ItemLoc, version: u64 },
    Absent { bucket: BucketLoc },
}

#[derive(Debug, Clone)]
struct ReadEntry {
    table: TableId,
    key: Key,
    target: ReadTarget,
    value: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LockState {
    /// Blind write: the lock is taken at commit.
    Deferred,
    Held,
    /// The CAS failed: never held (complicit abort releases it anyway).
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Intent {
    /// Locked by read_for_update, not written (yet).
    LockOnly,
    Write(WriteKind),
}

#[derive(Debug, Clone)]
struct OldImage {
    version: DataVersion,
    valid: bool,
    value: Vec<u8>,
}

#[derive(Debug, Clone)]
struct WriteEntry {
    table: TableId,
    key: Key,
    loc: ItemLoc,
    lock: LockState,
    intent: Intent,
    old: Option<OldImage>,
    new_value: Vec<u8>,
}

enum Located {
    Found(ItemLoc),
    Absent {
        bucket: BucketLoc,
        free: Option<usize>,
    },
}

/// A running FORD/Pandora transaction. Always finish it with `commit` or `abort`: dropping
/// it releases nothing.
#[derive(Debug)]
pub struct FordTxn<'a, V, H> {
    co: &'a mut FordCoordinator<V, H>,
    id: TxnId,
    kind: TxnKind,
    begin: Nanos,
    reads: Vec<ReadEntry>,
    writes: Vec<WriteEntry>,
    events: Vec<ReadEvent>,
    /// MN indices holding a valid log of this transaction.
    logged: Vec<u16>,
    /// Addresses in this transaction's lock log (traditional lock logging only).
    lock_log: Vec<PackedAddr>,
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

/// Why a transaction stopped for an MN failure (retryable).
const MN_VIEW_CHANGED: &str = "memory-node view changed";

fn aborted(why: &'static str) -> TxnError {
    TxnError::Aborted(why)
}

fn store_err(e: StoreError) -> TxnError {
    match e {
        StoreError::UnknownTable(t) => TxnError::UnknownTable(t),
        StoreError::ValueSize { expected, got, .. } => TxnError::ValueSize { expected, got },
        StoreError::BucketFull { .. } => aborted("index bucket full"),
        _ => aborted("store unavailable"),
    }
}

struct ItemRead {
    lock: u64,
    version: DataVersion,
    valid: bool,
    value: Vec<u8>,
}

fn parse_item(bytes: &[u8], table: TableId, key: Key) -> Result<ItemRead, TxnError> {
    let item = DataItem::new_checked(bytes).map_err(|_| aborted("malformed item"))?;
    let h = item.header();
    let fresh = h.key() == 0 && h.table_id() == 0 && !h.flags().is_valid();
    if !fresh && (h.key() != key.0 || h.table_id() != table.0) {
        return Err(aborted("index points at another record"));
    }
    Ok(ItemRead {
        lock: h.lock_word(),
        version: h.version(),
        valid: h.flags().is_valid() && !h.version().is_invisible(),
        value: item.value().to_vec(),
    })
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
    /// and the transaction stops once the CN's view has dropped it.
    async fn post(&mut self, list: PostList) -> Result<BatchResult, TxnError> {
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
                return Err(aborted(MN_VIEW_CHANGED));
            }
            if !paused {
                break;
            }
            self.co.ctx.sleep(poll).await;
        }
        match self.co.ctx.post(list).await {
            Ok(res) => {
                if self.view_changed() {
                    self.mn_failed = true;
                    return Err(aborted(MN_VIEW_CHANGED));
                }
                Ok(res)
            }
            Err(VerbsError::ConnectionLost { node }) => match self.mn_failure_handled(node) {
                Some(mn) => {
                    self.co.await_mn_failure(mn).await;
                    self.mn_failed = true;
                    Err(aborted("memory node failed"))
                }
                None => Err(VerbsError::ConnectionLost { node }.into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// The transaction's writes with their undo images, as its log holds them.
    fn local_log(&self) -> LoggedTxn {
        let writes = self
            .writes
            .iter()
            .filter_map(|w| {
                let Intent::Write(kind) = w.intent else {
                    return None;
                };
                let old = w.old.as_ref()?;
                Some(LoggedWrite {
                    op: match kind {
                        WriteKind::Insert => LogOp::Insert,
                        WriteKind::Delete => LogOp::Delete,
                        WriteKind::Update => LogOp::Update,
                    },
                    table: w.table.0,
                    key: w.key.0,
                    partition: w.loc.bucket.partition,
                    offset: w.loc.offset,
                    old_version: old.version.to_raw(),
                    old_value: old.value.clone(),
                })
            })
            .collect();
        LoggedTxn {
            coordinator: self.co.id,
            txn: self.id.seq,
            writes,
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
        let txn = self.local_log();
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
                Err(RecoveryError::Store(e)) => return Err(store_err(e)),
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
                Err(aborted("rolled back after a memory-node failure"))
            }
        }
    }

    fn value_len(&self, table: TableId) -> Result<usize, TxnError> {
        Ok(self.store().table(table).map_err(store_err)?.spec.value_len)
    }

    fn item_len(&self, table: TableId) -> Result<usize, TxnError> {
        Ok(self.store().table(table).map_err(store_err)?.item_len)
    }

    fn primary_addr(&self, loc: &ItemLoc) -> Result<dmem_verbs::RemoteAddr, TxnError> {
        let p = self
            .store()
            .primary(loc.bucket.partition)
            .map_err(store_err)?;
        Ok(self.store().addr(p, loc.offset))
    }

    async fn locate(&mut self, table: TableId, key: Key) -> Result<Located, TxnError> {
        if let Some(loc) = self.co.shared.cache.borrow_mut().get(table, key) {
            return Ok(Located::Found(loc));
        }
        let bucket = self.store().bucket_of(table, key).map_err(store_err)?;
        let p = self.store().primary(bucket.partition).map_err(store_err)?;
        let mut list = PostList::new();
        let id = list.read(self.store().addr(p, bucket.offset), BUCKET_LEN as u32);
        let bytes = self.post(list).await?.take_bytes(id);
        let (used, free) = parse_bucket(&bytes);
        if let Some(&(slot, _)) = used.iter().find(|(_, k)| *k == key.0) {
            let loc = self.store().item_at(bucket, slot).map_err(store_err)?;
            self.co.shared.cache.borrow_mut().put(table, key, loc);
            Ok(Located::Found(loc))
        } else {
            Ok(Located::Absent { bucket, free })
        }
    }

    fn write_entry(&self, table: TableId, key: Key) -> Option<usize> {
        self.writes
            .iter()
            .position(|w| w.table == table && w.key == key)
    }

    fn current_value(&self, w: &WriteEntry) -> Option<Vec<u8>> {
        match w.intent {
            Intent::Write(WriteKind::Delete) => None,
            Intent::Write(_) => Some(w.new_value.clone()),
            Intent::LockOnly => w.old.as_ref().filter(|o| o.valid).map(|o| o.value.clone()),
        }
    }

    fn note_read(&mut self, table: TableId, key: Key, version: u64) {
        self.events
            .push(ReadEvent::new(table, key, Version(version)));
    }

    /// Posts CAS + READ to the primary and steals a stray lock (PILL). Returns the old image
    /// if the lock is now held; records the entry either way.
    async fn lock_and_read(
        &mut self,
        table: TableId,
        key: Key,
        loc: ItemLoc,
        extra_index_slot: bool,
    ) -> Result<(ItemRead, Option<Vec<u8>>), TxnError> {
        let addr = self.primary_addr(&loc)?;
        let item_len = self.item_len(table)? as u32;
        let me = logic::my_lock(self.co.id);
        self.log_locks(&[loc]).await?;
        let mut list = PostList::new();
        let cas = list.cas(addr, 0, me);
        let rd = list.read(addr, item_len);
        let slot_rd = extra_index_slot.then(|| {
            let bucket_addr = addr.add(0);
            let slot_addr = dmem_verbs::RemoteAddr {
                offset: loc.bucket.offset + slot_offset(loc.slot),
                ..bucket_addr
            };
            list.read(slot_addr, 16)
        });
        let mut res = self.post(list).await?;
        let mut old = res.atomic(cas);
        let mut bytes = res.take_bytes(rd);
        let slot_bytes = slot_rd.map(|id| res.take_bytes(id));
        let item = parse_item(&bytes, table, key)?;
        let idx = self.push_lock_entry(table, key, loc, &item);
        if self.co.cfg.bug(FordBug::LogWithoutLock) {
            // The corner case of Pandora §5.1: the undo record goes out before the
            // coordinator has looked at what its CAS returned.
            self.write_logs(true).await?;
        }
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
                    let mut res = self.post(list).await?;
                    let got = res.atomic(cas);
                    if got == observed {
                        self.co.stats.steals += 1;
                        bytes = res.take_bytes(rd);
                        old = 0;
                    } else {
                        old = got;
                        if got == 0 {
                            // Released meanwhile: an ordinary acquire must win it.
                            self.writes[idx].lock = LockState::Failed;
                            return Err(aborted("lock changed hands"));
                        }
                    }
                }
                AfterCas::Conflict => {
                    self.writes[idx].lock = LockState::Failed;
                    return Err(aborted("write lock held"));
                }
            }
        }
        let item = parse_item(&bytes, table, key)?;
        let w = &mut self.writes[idx];
        w.lock = LockState::Held;
        w.old = Some(OldImage {
            version: item.version,
            valid: item.valid,
            value: item.value.clone(),
        });
        Ok((item, slot_bytes))
    }

    fn push_lock_entry(
        &mut self,
        table: TableId,
        key: Key,
        loc: ItemLoc,
        item: &ItemRead,
    ) -> usize {
        let old = Some(OldImage {
            version: item.version,
            valid: item.valid,
            value: item.value.clone(),
        });
        if let Some(i) = self.write_entry(table, key) {
            self.writes[i].old = old;
            return i;
        }
        self.writes.push(WriteEntry {
            table,
            key,
            loc,
            lock: LockState::Failed,
            intent: Intent::LockOnly,
            old,
            new_value: Vec::new(),
        });
        self.writes.len() - 1
    }

    /// Builds the log images: `(mn, bytes)` per log copy. `early` logs every entry with an
    /// old image (the log-without-lock corner case); otherwise only written entries.
    fn log_images(&self, early: bool) -> Result<Vec<(u16, Vec<u8>)>, TxnError> {
        let skip_inserts = self.co.cfg.bug(FordBug::MissingInsertLog);
        let logged: Vec<&WriteEntry> = self
            .writes
            .iter()
            .filter(|w| w.old.is_some())
            .filter(|w| match w.intent {
                Intent::Write(WriteKind::Insert) => !skip_inserts,
                Intent::Write(_) => true,
                Intent::LockOnly => early,
            })
            .collect();
        let store = self.store();
        // With lock logging the lock log owns the region's tail.
        let undo_bytes = if self.co.cfg.lock_logging {
            logic::lock_log_offset(store.log_region_bytes())
                .ok_or_else(|| aborted("log region too small for a lock log"))?
        } else {
            store.log_region_bytes()
        };
        let build = |entries: &[&WriteEntry]| -> Result<Vec<u8>, TxnError> {
            let mut buf = vec![0u8; undo_bytes];
            let mut writer = LogWriter::new(&mut buf, self.co.id, self.co.epoch, self.id.seq)
                .map_err(|_| aborted("log region too small"))?;
            for w in entries {
                let old = w
                    .old
                    .as_ref()
                    .map_or((DataVersion::from_raw(0), &[][..]), |o| {
                        (o.version, &o.value[..])
                    });
                let op = match w.intent {
                    Intent::Write(WriteKind::Insert) => LogOp::Insert,
                    Intent::Write(WriteKind::Delete) => LogOp::Delete,
                    _ => LogOp::Update,
                };
                let entry = DataLogEntry {
                    op,
                    table_id: w.table.0,
                    key: w.key.0,
                    addr: logic::pack_location(w.loc.bucket.partition, w.loc.offset),
                    version: old.0.to_raw(),
                };
                writer
                    .append_undo(&entry, old.1)
                    .map_err(|_| aborted("log region full"))?;
            }
            let len = writer.finish().len();
            buf.truncate(len);
            Ok(buf)
        };
        match self.co.cfg.protocol {
            Protocol::Pandora => {
                let image = build(&logged)?;
                Ok(store
                    .pandora_log_mns(self.co.id)
                    .into_iter()
                    .map(|mn| (mn, image.clone()))
                    .collect())
            }
            Protocol::Ford => {
                let mut out = Vec::new();
                for mn in 0..store.config().mns {
                    let here: Vec<&WriteEntry> = logged
                        .iter()
                        .copied()
                        .filter(|w| store.live_replicas(w.loc.bucket.partition).contains(&mn))
                        .collect();
                    if !here.is_empty() {
                        out.push((mn, build(&here)?));
                    }
                }
                Ok(out)
            }
        }
    }

    fn add_log_writes(&mut self, list: &mut PostList, early: bool) -> Result<(), TxnError> {
        let base = self.store().log_offset(self.co.id).map_err(store_err)?;
        for (mn, image) in self.log_images(early)? {
            list.write_owned(self.store().addr(mn, base), image);
            if !self.logged.contains(&mn) {
                self.logged.push(mn);
            }
        }
        Ok(())
    }

    async fn write_logs(&mut self, early: bool) -> Result<(), TxnError> {
        let mut list = PostList::new();
        self.add_log_writes(&mut list, early)?;
        if !list.is_empty() {
            self.post(list).await?;
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
        if self.lock_log.len() + locs.len() > logic::LOCK_LOG_SLOTS {
            return Err(aborted("lock log full"));
        }
        let at = logic::lock_log_offset(self.store().log_region_bytes())
            .ok_or_else(|| aborted("log region too small for a lock log"))?;
        self.lock_log.extend(
            locs.iter()
                .map(|l| logic::pack_location(l.bucket.partition, l.offset)),
        );
        let image = logic::encode_lock_log(self.co.id, &self.lock_log);
        let base = self.store().log_offset(self.co.id).map_err(store_err)?;
        let mut list = PostList::new();
        for mn in self.store().pandora_log_mns(self.co.id) {
            list.write(self.store().addr(mn, base + at as u64), &image);
        }
        if !list.is_empty() {
            self.post(list).await?;
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
        let mut list = PostList::new();
        if !self.co.cfg.bug(FordBug::LostDecision) {
            let base = self.store().log_offset(self.co.id).unwrap_or(0);
            let view = self.store().view().borrow().clone();
            for &mn in self.logged.iter().filter(|&&mn| view.is_alive(mn)) {
                list.write(
                    self.store()
                        .addr(mn, base + LogRegionHeader::STATE_OFFSET as u64),
                    &[0],
                );
            }
        }
        if !list.is_empty() {
            self.co.ctx.post(list).await?;
        }
        let complicit = self.co.cfg.bug(FordBug::ComplicitAbort);
        let view_changed = self.view_changed() || self.mn_failed;
        let me = logic::my_lock(self.co.id);
        let mut list = PostList::new();
        for w in &self.writes {
            let release = match w.lock {
                LockState::Held => true,
                // Complicit abort: FORD releases its whole write-set, held or not.
                LockState::Failed | LockState::Deferred => complicit,
            };
            if !release {
                continue;
            }
            let Ok(addr) = self.primary_addr(&w.loc) else {
                continue;
            };
            if view_changed {
                list.cas(addr, me, 0);
            } else {
                list.write(addr, &0u64.to_le_bytes());
            }
        }
        if !list.is_empty() {
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
            reads: std::mem::take(&mut self.events),
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

    /// Locks deferred (blind-write) entries; under relaxed-locks, validation READs go in
    /// the same batch.
    async fn commit_inner(&mut self) -> Result<(), TxnError> {
        let relaxed = self.co.cfg.bug(FordBug::RelaxedLocks);
        let lost_decision = self.co.cfg.bug(FordBug::LostDecision);
        let me = logic::my_lock(self.co.id);

        // -- lock deferred write-set entries (and, relaxed, validate at the same time) --
        let deferred: Vec<usize> = (0..self.writes.len())
            .filter(|&i| self.writes[i].lock == LockState::Deferred)
            .collect();
        let deferred_locs: Vec<ItemLoc> = deferred.iter().map(|&i| self.writes[i].loc).collect();
        self.log_locks(&deferred_locs).await?;
        let mut list = PostList::new();
        let mut validation = Vec::new();
        if relaxed {
            // Relaxed locks: validation READs go out first, ahead of (and overlapping) the
            // lock CASes of the same batch.
            validation = self.add_validation_reads(&mut list)?;
        }
        let mut lock_ids: Vec<(usize, WrId, WrId)> = Vec::new();
        for &i in &deferred {
            let w = &self.writes[i];
            let addr = self.primary_addr(&w.loc)?;
            let len = self.item_len(w.table)? as u32;
            let c = list.cas(addr, 0, me);
            let r = list.read(addr, len);
            lock_ids.push((i, c, r));
        }
        if self.co.cfg.bug(FordBug::LogWithoutLock) && !deferred.is_empty() {
            // Log the blind writes with the values read in execution, in the same doorbell
            // as their lock CAS (Pandora §5.1 "Logging without locking").
            for &i in &deferred {
                let (table, key) = (self.writes[i].table, self.writes[i].key);
                let seen = self.reads.iter().find_map(|r| match &r.target {
                    ReadTarget::Item { version, .. } if r.table == table && r.key == key => {
                        Some(OldImage {
                            version: DataVersion::from_raw(*version),
                            valid: r.value.is_some(),
                            value: r.value.clone().unwrap_or_default(),
                        })
                    }
                    _ => None,
                });
                if seen.is_some() {
                    self.writes[i].old = seen;
                }
            }
            self.add_log_writes(&mut list, true)?;
        }
        if relaxed && lost_decision {
            self.add_log_writes(&mut list, false)?;
        }
        let mut res = if list.is_empty() {
            None
        } else {
            Some(self.post(list).await?)
        };
        if let Some(res) = res.as_mut() {
            // Every CAS of this batch that found the lock free acquired it: mark it held
            // before judging any entry, so that an early return below (a conflict on
            // another entry of the batch) still releases it in the abort path.
            for &(i, c, _) in &lock_ids {
                if res.atomic(c) == 0 {
                    self.writes[i].lock = LockState::Held;
                }
            }
            for &(i, c, r) in &lock_ids {
                let old = res.atomic(c);
                let bytes = res.take_bytes(r);
                let (table, key, loc) =
                    (self.writes[i].table, self.writes[i].key, self.writes[i].loc);
                let mut item = parse_item(&bytes, table, key)?;
                let next = logic::after_cas(old, &self.co.shared.failed.borrow(), &self.co.cfg);
                match next {
                    AfterCas::Acquired => {}
                    AfterCas::Steal { observed } => {
                        let addr = self.primary_addr(&loc)?;
                        let mut l = PostList::new();
                        let cas = l.cas(addr, observed, me);
                        let rd = l.read(addr, self.item_len(table)? as u32);
                        let mut r2 = self.post(l).await?;
                        if r2.atomic(cas) != observed {
                            self.writes[i].lock = LockState::Failed;
                            return Err(aborted("write lock held"));
                        }
                        self.co.stats.steals += 1;
                        item = parse_item(&r2.take_bytes(rd), table, key)?;
                    }
                    AfterCas::Conflict => {
                        self.writes[i].lock = LockState::Failed;
                        return Err(aborted("write lock held"));
                    }
                }
                let w = &mut self.writes[i];
                w.lock = LockState::Held;
                if !item.valid && w.intent == Intent::Write(WriteKind::Update) {
                    return Err(TxnError::KeyState(key.0));
                }
                w.old = Some(OldImage {
                    version: item.version,
                    valid: item.valid,
                    value: item.value,
                });
                self.events
                    .push(ReadEvent::new(table, key, Version(item.version.counter())));
            }
        }

        // -- validation, strictly after locking (fixed), logs alongside (lost decision) --
        if !relaxed {
            let mut list = PostList::new();
            validation = self.add_validation_reads(&mut list)?;
            if lost_decision {
                self.add_log_writes(&mut list, false)?;
            }
            if !list.is_empty() {
                res = Some(self.post(list).await?);
            }
        }
        if !validation.is_empty() {
            let Some(res) = res.as_mut() else {
                return Err(aborted("validation lost its reads"));
            };
            for (ri, id) in validation {
                let bytes = res.take_bytes(id);
                let valid = self.validate_one(ri, &bytes, &self.co.shared.failed.borrow());
                if !valid {
                    return Err(aborted("validation failed"));
                }
            }
        }

        let has_writes = self
            .writes
            .iter()
            .any(|w| matches!(w.intent, Intent::Write(_)));
        if !has_writes {
            // Read-only (or lock-only): release locks, done.
            self.release_held().await?;
            self.record_committed(Vec::new(), false);
            return Ok(());
        }

        // -- logging phase (Pandora §3.1.4): only after validation succeeded --
        if !lost_decision {
            self.write_logs(false).await?;
        }

        // -- commit: primaries and backups, then ack, then unlock --
        let mut installed = Vec::new();
        let mut list = PostList::new();
        for w in &self.writes {
            let Intent::Write(kind) = w.intent else {
                continue;
            };
            let Some(old) = &w.old else {
                return Err(aborted("write without an old image"));
            };
            let version = logic::next_version(old.version);
            let (flags, value) = match kind {
                WriteKind::Update => (ItemFlags::LOADED, &w.new_value),
                WriteKind::Insert => (ItemFlags::LOADED.with_user_insert(true), &w.new_value),
                WriteKind::Delete => (ItemFlags::EMPTY, &old.value),
            };
            let item_len = self.item_len(w.table)?;
            let image = encode_item(w.key.0, w.table.0, version, flags, value, item_len);
            for mn in self.store().live_replicas(w.loc.bucket.partition) {
                let addr = self.store().addr(mn, w.loc.offset + 8);
                list.write(addr, &image[DataItemHeader::VERSION_OFFSET..]);
            }
            installed.push(WriteEvent {
                table: w.table,
                key: w.key,
                version: Version(version.counter()),
                kind,
            });
        }
        self.decided = true;
        self.record_committed(installed, true);
        self.post(list).await?;
        self.co
            .history
            .resolve(self.id, TxnOutcome::Committed, self.co.ctx.now());
        self.release_held().await?;
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
            reads: std::mem::take(&mut self.events),
            writes,
        });
    }

    async fn release_held(&mut self) -> Result<(), TxnError> {
        let mut list = PostList::new();
        for w in &self.writes {
            if w.lock == LockState::Held {
                list.write(self.primary_addr(&w.loc)?, &0u64.to_le_bytes());
            }
        }
        if !list.is_empty() {
            self.post(list).await?;
        }
        for w in &mut self.writes {
            if w.lock == LockState::Held {
                w.lock = LockState::Failed;
                w.intent = Intent::LockOnly;
            }
        }
        Ok(())
    }

    /// Adds one validation READ per read-set entry not covered by a held lock.
    fn add_validation_reads(&self, list: &mut PostList) -> Result<Vec<(usize, WrId)>, TxnError> {
        let mut ids = Vec::new();
        for (i, r) in self.reads.iter().enumerate() {
            if self
                .write_entry(r.table, r.key)
                .is_some_and(|w| self.writes[w].lock == LockState::Held)
            {
                if let ReadTarget::Item { .. } = r.target {
                    // Held lock: only the version must be unchanged; checked below too.
                } else {
                    continue;
                }
            }
            match &r.target {
                ReadTarget::Item { loc, .. } => {
                    let addr = self.primary_addr(loc)?;
                    ids.push((i, list.read(addr, DataItemHeader::VALIDATION_LEN as u32)));
                }
                ReadTarget::Absent { bucket } => {
                    let p = self.store().primary(bucket.partition).map_err(store_err)?;
                    let addr = self.store().addr(p, bucket.offset);
                    ids.push((i, list.read(addr, BUCKET_LEN as u32)));
                }
            }
        }
        Ok(ids)
    }

    fn validate_one(&self, ri: usize, bytes: &[u8], failed: &FailedCoordinatorSet) -> bool {
        let r = &self.reads[ri];
        match &r.target {
            ReadTarget::Item { version, .. } => {
                if bytes.len() < 16 {
                    return false;
                }
                let lock = u64::from_le_bytes(bytes[0..8].try_into().unwrap_or([0xFF; 8]));
                let ver = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or([0xFF; 8]));
                let mine = self
                    .write_entry(r.table, r.key)
                    .is_some_and(|w| self.writes[w].lock == LockState::Held);
                if mine {
                    return ver == *version;
                }
                logic::validate_item(*version, lock, ver, failed, &self.co.cfg)
            }
            ReadTarget::Absent { .. } => {
                let (used, _) = parse_bucket(bytes);
                !used.iter().any(|(_, k)| *k == r.key.0)
            }
        }
    }

    async fn read_impl(&mut self, table: TableId, key: Key) -> Result<Option<Vec<u8>>, TxnError> {
        if let Some(i) = self.write_entry(table, key) {
            let w = self.writes[i].clone();
            match w.lock {
                LockState::Held => return Ok(self.current_value(&w)),
                LockState::Deferred => return Ok(Some(w.new_value)),
                LockState::Failed => {}
            }
        }
        if let Some(r) = self.reads.iter().find(|r| r.table == table && r.key == key) {
            return Ok(r.value.clone());
        }
        match self.locate(table, key).await? {
            Located::Absent { bucket, .. } => {
                self.reads.push(ReadEntry {
                    table,
                    key,
                    target: ReadTarget::Absent { bucket },
                    value: None,
                });
                self.note_read(table, key, 0);
                Ok(None)
            }
            Located::Found(loc) => {
                let addr = self.primary_addr(&loc)?;
                let len = self.item_len(table)? as u32;
                let mut list = PostList::new();
                let id = list.read(addr, len);
                let bytes = self.post(list).await?.take_bytes(id);
                let item = parse_item(&bytes, table, key)?;
                let proceed = logic::read_may_proceed(
                    item.lock,
                    &self.co.shared.failed.borrow(),
                    &self.co.cfg,
                );
                if !proceed {
                    return Err(aborted("read a locked item"));
                }
                if item.lock != 0 {
                    self.co.stats.stray_reads += 1;
                }
                let value = item.valid.then_some(item.value);
                self.reads.push(ReadEntry {
                    table,
                    key,
                    target: ReadTarget::Item {
                        loc,
                        version: item.version.to_raw(),
                    },
                    value: value.clone(),
                });
                self.note_read(table, key, item.version.counter());
                Ok(value)
            }
        }
    }

    async fn rfu_impl(&mut self, table: TableId, key: Key) -> Result<Option<Vec<u8>>, TxnError> {
        if self.kind == TxnKind::ReadOnly {
            return Err(TxnError::ReadOnly);
        }
        if let Some(i) = self.write_entry(table, key)
            && self.writes[i].lock == LockState::Held
        {
            let w = self.writes[i].clone();
            return Ok(self.current_value(&w));
        }
        match self.locate(table, key).await? {
            Located::Absent { .. } => self.read_impl(table, key).await,
            Located::Found(loc) => {
                let (item, _) = self.lock_and_read(table, key, loc, false).await?;
                self.note_read(table, key, item.version.counter());
                Ok(item.valid.then_some(item.value))
            }
        }
    }

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
        if let Some(i) = self.write_entry(table, key)
            && self.writes[i].lock != LockState::Failed
        {
            let w = &mut self.writes[i];
            let present = match (&w.old, w.intent) {
                (_, Intent::Write(WriteKind::Insert | WriteKind::Update)) => true,
                (_, Intent::Write(WriteKind::Delete)) => false,
                (Some(o), Intent::LockOnly) => o.valid,
                (None, Intent::LockOnly) => true,
            };
            let new_kind = match (kind, present) {
                (WriteKind::Update, true) => match w.intent {
                    Intent::Write(WriteKind::Insert) => WriteKind::Insert,
                    _ => WriteKind::Update,
                },
                (WriteKind::Insert, false) => match w.intent {
                    Intent::Write(WriteKind::Delete) => WriteKind::Update,
                    _ => WriteKind::Insert,
                },
                (WriteKind::Delete, true) => WriteKind::Delete,
                _ => return Err(TxnError::KeyState(key.0)),
            };
            w.intent = Intent::Write(new_kind);
            if kind != WriteKind::Delete {
                w.new_value = value.to_vec();
            }
            return Ok(());
        }
        match (kind, self.locate(table, key).await?) {
            (WriteKind::Update, Located::Found(loc)) => {
                // Blind write: FORD locks it at commit.
                self.writes.push(WriteEntry {
                    table,
                    key,
                    loc,
                    lock: LockState::Deferred,
                    intent: Intent::Write(WriteKind::Update),
                    old: None,
                    new_value: value.to_vec(),
                });
                Ok(())
            }
            (WriteKind::Delete, Located::Found(loc)) => {
                let (item, _) = self.lock_and_read(table, key, loc, false).await?;
                self.note_read(table, key, item.version.counter());
                if !item.valid {
                    return Err(TxnError::KeyState(key.0));
                }
                let i = self.write_entry(table, key).unwrap_or(0);
                self.writes[i].intent = Intent::Write(WriteKind::Delete);
                Ok(())
            }
            (WriteKind::Insert, Located::Found(loc)) => {
                let (item, _) = self.lock_and_read(table, key, loc, false).await?;
                self.note_read(table, key, item.version.counter());
                if item.valid {
                    return Err(TxnError::KeyState(key.0));
                }
                let i = self.write_entry(table, key).unwrap_or(0);
                self.writes[i].intent = Intent::Write(WriteKind::Insert);
                self.writes[i].new_value = value.to_vec();
                Ok(())
            }
            (WriteKind::Insert, Located::Absent { bucket, free }) => {
                let Some(slot) = free else {
                    return Err(aborted("index bucket full"));
                };
                let loc = self.store().item_at(bucket, slot).map_err(store_err)?;
                let (item, slot_bytes) = self.lock_and_read(table, key, loc, true).await?;
                let slot_bytes = slot_bytes.unwrap_or_default();
                let slot_key = slot_bytes
                    .get(0..8)
                    .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
                let slot_used = slot_bytes
                    .get(8..16)
                    .is_some_and(|b| b.iter().any(|&x| x != 0));
                if slot_used && slot_key != key.0 {
                    return Err(aborted("index slot taken by a concurrent insert"));
                }
                if item.valid {
                    return Err(TxnError::KeyState(key.0));
                }
                if !slot_used {
                    // Claim the slot on every replica; the item stays invalid (absent) until
                    // commit, so readers that find the slot see the key as absent.
                    let packed = logic::pack_location(bucket.partition, loc.offset);
                    let bytes = index_slot_bytes(key.0, packed);
                    let mut list = PostList::new();
                    for mn in self.store().live_replicas(bucket.partition) {
                        let a = self.store().addr(mn, bucket.offset + slot_offset(slot));
                        list.write(a, &bytes);
                    }
                    self.post(list).await?;
                }
                self.co.shared.cache.borrow_mut().put(table, key, loc);
                self.note_read(table, key, item.version.counter());
                let i = self.write_entry(table, key).unwrap_or(0);
                self.writes[i].intent = Intent::Write(WriteKind::Insert);
                self.writes[i].new_value = value.to_vec();
                Ok(())
            }
            (WriteKind::Update | WriteKind::Delete, Located::Absent { .. }) => {
                Err(TxnError::KeyState(key.0))
            }
        }
    }
}

impl<V: Verbs + Clock, H: HistorySink> Transaction for FordTxn<'_, V, H> {
    async fn read(&mut self, table: TableId, key: Key) -> Result<Option<Vec<u8>>, TxnError> {
        self.read_impl(table, key).await
    }

    async fn read_for_update(
        &mut self,
        table: TableId,
        key: Key,
    ) -> Result<Option<Vec<u8>>, TxnError> {
        self.rfu_impl(table, key).await
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

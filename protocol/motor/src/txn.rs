//! Motor coordinators and transactions: the async shell around [`crate::logic`].
//!
//! 1. **Begin**: a start timestamp `S` from the [`TimestampService`].
//! 2. **Rounds** (one per [`Transaction::read_round`]): a bucket READ per record whose
//!    address is not cached; then, in one post list (one doorbell per MN, every MN at
//!    once), for each for-update record a CAS of its header lock chained with a READ of its
//!    CVT, for each read-only record a READ of its CVT; then a READ of the chosen version's
//!    image. A for-update record with a version at or after `S` aborts (SR and SI); a
//!    read-only record found locked is read again (its writer may hold a commit timestamp
//!    below `S`). A for-update key absent from the index claims a free slot of its bucket
//!    (lock its block, check the index slot, write it to every replica). In a pooled table
//!    (`dmem-store`, "Sparse tables") the block is the next of the coordinator's insert
//!    share and the slot's address word is CASed (empty -> the block) instead of READ, since
//!    two inserts of one key would each lock a block of their own.
//! 3. **Commit** (read-write): a commit timestamp `C` (the service's commit-wait included);
//!    under SR one READ of the CVT of every read-only record (abort if locked or changed at
//!    or after `S`); then one post list per MN: to the primary and every backup the new
//!    image, the new cell (or floor + whole CVT when cells are evicted or collected), and to
//!    the primary the unlock WRITE last. **Abort**: unlock WRITEs.
//!
//! Read-only transactions read at `S` and commit without any verb. Every lock taken and,
//! at commit, every install is noted in the coordinator's [`OpLogs`] entry (CN memory that
//! survives a crash, Motor's UPS-backed DRAM) for [`crate::recovery`].

use std::cell::RefCell;
use std::rc::Rc;

use dmem_store::{AddressCache, BucketLoc, InsertPool, ItemLoc, Store, parse_bucket, slot_offset};
use dmem_txn::{
    AbortReason, Access, Coordinator, CoordinatorId, HistorySink, Key, ReadReq, RoundPlan,
    RoundValues, TableId, Transaction, TxnError, TxnId, TxnKind, TxnOutcome, Version, WriteEvent,
    WriteKind,
};
use dmem_verbs::{BatchResult, Clock, Nanos, Phase, PostList, RemoteAddr, Verbs, WrId};

use crate::exec::{self, ExecSets, Lookup, WriteEntry};
use crate::logic::{self, AbsentKey, CvtRead, Isolation, MetaOutcome, SlotSeen};
use crate::mvcc::{
    self, BlockShape, CELL_LEN, FLOOR_OFFSET, LOCK_OFFSET, Meta, Shapes, pack_writer,
};
use crate::oplog::{Install, LockedRecord, OpLogs};
use crate::ts::TimestampService;

/// Motor's switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MotorConfig {
    /// SR or SI.
    pub isolation: Isolation,
    /// **Unsafe, for the LOTUS §2.2 motivation experiment only**: for-update records are
    /// READ without the lock CAS (and never unlocked). Lost updates follow; the checker is
    /// expected to fail.
    pub unsafe_no_cas: bool,
    /// Planted bug for the litmus suite: a for-update record with a version newer than the
    /// start timestamp does not abort.
    pub skip_newer_abort: bool,
    /// Planted bug for the litmus suite (and Motor's public code as it is): recovery only
    /// releases a crashed coordinator's locks and leaves a commit interrupted between its
    /// post lists unfinished.
    pub recovery_releases_only: bool,
    /// Clock uncertainty of the timestamp service, ns.
    pub epsilon: Nanos,
    /// Versions committed longer ago than this are collected when a writer sees them
    /// (LOTUS §7.1: 500 ms).
    pub gc_threshold: Nanos,
    /// Times a read-only record found locked (or torn) is read again before aborting.
    pub max_rereads: u32,
    /// Pause between two such reads, ns.
    pub reread_pause: Nanos,
    /// The version layout a deployment lays Motor's store out with: Motor's own
    /// ([`VersionLayout::Deltas`](mvcc::VersionLayout::Deltas), the default) or LOTUS's full records (the "+Full Record
    /// Store" step of LOTUS §8.3). Coordinators follow the block shapes they are given.
    pub layout: mvcc::VersionLayout,
}

impl MotorConfig {
    /// Motor under serializability.
    #[must_use]
    pub const fn sr() -> Self {
        Self {
            isolation: Isolation::Serializable,
            unsafe_no_cas: false,
            skip_newer_abort: false,
            recovery_releases_only: false,
            epsilon: 1_000,
            gc_threshold: 500_000_000,
            max_rereads: 32,
            reread_pause: 500,
            layout: mvcc::VersionLayout::Deltas,
        }
    }

    /// Motor under snapshot isolation.
    #[must_use]
    pub const fn si() -> Self {
        Self {
            isolation: Isolation::Snapshot,
            ..Self::sr()
        }
    }
}

/// Counters of one coordinator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MotorStats {
    /// Committed transactions.
    pub committed: u64,
    /// Aborted transactions.
    pub aborted: u64,
    /// Reads of a CVT repeated because the record was locked or torn.
    pub rereads: u64,
}

/// The first transaction sequence number of incarnation `incarnation` of a coordinator id,
/// less one ([`MotorCoordinator::in_incarnation`]): `incarnation` × 2³². A restarted CN's
/// coordinators keep their ids (their op-log entries were recovered and cleared), so their
/// transaction ids ([`TxnId`]: id and sequence number) must continue past every earlier
/// incarnation's: the packed writer of a version ([`pack_writer`]) keeps 40 bits of
/// sequence number, so 255 incarnations of 2³² − 1 transactions each fit; later
/// incarnations saturate at the last one.
#[must_use]
pub const fn incarnation_seq_base(incarnation: u32) -> u64 {
    let i = if incarnation > 255 { 255 } else { incarnation };
    (i as u64) << 32
}

/// A Motor coordinator on one CN context.
#[derive(Debug)]
pub struct MotorCoordinator<V, H, T> {
    ctx: V,
    store: Rc<Store>,
    shapes: Rc<Shapes>,
    cfg: MotorConfig,
    id: u16,
    seq: u64,
    cache: Rc<RefCell<AddressCache>>,
    history: H,
    ts: T,
    stats: MotorStats,
    oplog: Rc<OpLogs>,
    /// Cursors into this coordinator's insert shares of pooled tables.
    inserts: InsertPool,
}

impl<V: Verbs + Clock, H: HistorySink, T: TimestampService> MotorCoordinator<V, H, T> {
    /// A coordinator with the unique id `id`, sharing its CN's address `cache`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: V,
        store: Rc<Store>,
        shapes: Rc<Shapes>,
        cfg: MotorConfig,
        id: u16,
        cache: Rc<RefCell<AddressCache>>,
        history: H,
        ts: T,
    ) -> Self {
        Self {
            ctx,
            store,
            shapes,
            cfg,
            id,
            seq: 0,
            cache,
            history,
            ts,
            stats: MotorStats::default(),
            oplog: Rc::new(OpLogs::new()),
            inserts: InsertPool::new(),
        }
    }

    /// Keeps the op log in `logs` (shared with recovery, surviving the CN's crash) instead
    /// of a private one.
    #[must_use]
    pub fn with_op_log(mut self, logs: Rc<OpLogs>) -> Self {
        self.oplog = logs;
        self
    }

    /// The coordinator of incarnation `incarnation` of its id (0: the run's first; a CN
    /// restart makes the next): its transactions are numbered from
    /// [`incarnation_seq_base`]` + 1`, past every earlier incarnation's.
    #[must_use]
    pub fn in_incarnation(mut self, incarnation: u32) -> Self {
        self.seq = incarnation_seq_base(incarnation);
        self
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> MotorStats {
        self.stats
    }

    /// The timestamp service.
    #[must_use]
    pub fn timestamps(&self) -> &T {
        &self.ts
    }
}

impl<V: Verbs + Clock, H: HistorySink, T: TimestampService> Coordinator
    for MotorCoordinator<V, H, T>
{
    type Txn<'a>
        = MotorTxn<'a, V, H, T>
    where
        Self: 'a;

    async fn begin(&mut self, kind: TxnKind) -> Result<Self::Txn<'_>, TxnError> {
        self.seq += 1;
        let id = TxnId {
            coordinator: CoordinatorId(u32::from(self.id)),
            seq: self.seq,
        };
        let begin = self.ctx.now();
        self.oplog.begin(self.id, self.seq);
        let start = self.ts.start_ts().await;
        Ok(MotorTxn {
            co: self,
            id,
            kind,
            begin,
            start,
            sets: Sets::default(),
            recorded_unknown: false,
        })
    }
}

/// Where a read-only record was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Block(ItemLoc),
    Absent(BucketLoc),
}

/// Motor's read and write sets: a read-only record keeps where it was found (for the SR
/// validation), a for-update record whether this transaction holds its block's lock word.
type Sets = ExecSets<Target, bool>;

/// A running Motor transaction. Finish it with `commit` or `abort`.
#[derive(Debug)]
pub struct MotorTxn<'a, V, H, T> {
    co: &'a mut MotorCoordinator<V, H, T>,
    id: TxnId,
    kind: TxnKind,
    begin: Nanos,
    start: u64,
    sets: Sets,
    /// Recorded in the history as `Unknown` before its commit was logged: recovery settles
    /// it from then on, so a failed commit records nothing more (a CN cut off while alive,
    /// after a false suspicion, would otherwise record it twice).
    recorded_unknown: bool,
}

/// A pass's work requests for one fetch: its index, block, shape, lock CAS (for update)
/// and CVT READ.
type CvtWrs = (usize, ItemLoc, BlockShape, Option<WrId>, WrId);

/// How an insert's lock batch looks at the index slot.
#[derive(Debug, Clone, Copy)]
enum SlotWr {
    /// CAS of its address word.
    Cas(WrId),
    /// READ of its 16 bytes.
    Read(WrId),
}

/// One record a round fetches.
#[derive(Debug, Clone)]
struct Fetch {
    table: TableId,
    key: Key,
    access: Access,
    loc: Option<ItemLoc>,
    done: Option<Option<Vec<u8>>>,
}

impl<V: Verbs + Clock, H: HistorySink, T: TimestampService> MotorTxn<'_, V, H, T> {
    /// The transaction's id.
    #[must_use]
    pub fn id(&self) -> TxnId {
        self.id
    }

    /// Its start timestamp.
    #[must_use]
    pub fn start_ts(&self) -> u64 {
        self.start
    }

    fn store(&self) -> &Store {
        &self.co.store
    }

    fn shape(&self, table: TableId) -> Result<BlockShape, TxnError> {
        self.co.shapes.get(table).map_err(TxnError::from)
    }

    fn primary(&self, loc: &ItemLoc, offset: u64) -> Result<RemoteAddr, TxnError> {
        exec::primary_addr(self.store(), loc, offset)
    }

    fn my_lock(&self) -> u64 {
        crate::recovery::lock_value(self.co.id)
    }

    /// Notes in the op log that the lock of `loc`'s record is held or about to be taken.
    fn log_locked(&self, table: TableId, loc: ItemLoc) {
        self.co.oplog.locked(
            self.co.id,
            LockedRecord {
                table,
                partition: loc.bucket.partition,
                block: loc.offset,
            },
        );
    }

    /// One round (step 2 of the module doc): locate the uncached records, then pass over the
    /// pending ones (CAS + READ of the CVT for update, READ of it otherwise, then the READ
    /// of the version chosen) until every record is answered; a read-only record found
    /// locked is read again, a bounded number of times.
    async fn round_impl(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        if self.kind == TxnKind::ReadOnly && reqs.iter().any(|r| r.access == Access::ForUpdate) {
            return Err(TxnError::ReadOnly);
        }
        // -- plan: local answers, distinct fetches --
        let plan = RoundPlan::new(reqs, |r| self.sets.local(r));
        let mut fetches: Vec<Fetch> = plan
            .fetches
            .iter()
            .map(|r| Fetch {
                table: r.table,
                key: r.key,
                access: r.access,
                loc: self.co.cache.borrow_mut().get(r.table, r.key),
                done: None,
            })
            .collect();
        self.locate_fetches(&mut fetches).await?;
        let mut rereads = 0;
        loop {
            let pending: Vec<usize> = (0..fetches.len())
                .filter(|&n| fetches[n].done.is_none())
                .collect();
            if pending.is_empty() {
                break;
            }
            self.cvt_pass(&mut fetches, &pending).await?;
            if fetches.iter().any(|f| f.done.is_none()) {
                rereads += 1;
                self.co.stats.rereads += 1;
                logic::may_reread(rereads, self.co.cfg.max_rereads).map_err(TxnError::Aborted)?;
                self.co.ctx.sleep(self.co.cfg.reread_pause).await;
            }
        }
        Ok(plan.values(|n| fetches[n].done.clone().flatten()))
    }

    /// A round's locate step: one bucket READ per uncached record, every MN at once. A key
    /// absent from the index is claimed or read as absent ([`logic::absent_key`]).
    async fn locate_fetches(&mut self, fetches: &mut [Fetch]) -> Result<(), TxnError> {
        let uncached: Vec<_> = fetches
            .iter()
            .enumerate()
            .filter(|(_, f)| f.loc.is_none())
            .map(|(n, f)| (n, f.table, f.key))
            .collect();
        let found = exec::locate(&self.co.ctx, &self.co.store, &self.co.cache, &uncached).await?;
        let mut absent = Vec::new();
        for (n, bucket, lookup) in found {
            match lookup {
                Lookup::Found(loc) => fetches[n].loc = Some(loc),
                Lookup::Absent { free, used } => absent.push((n, bucket, free, used)),
            }
        }
        for (n, bucket, free, used) in absent {
            let (table, key) = (fetches[n].table, fetches[n].key);
            let for_update = fetches[n].access == Access::ForUpdate;
            let action =
                logic::absent_key(for_update, for_update && self.can_insert(bucket), || {
                    Ok(self
                        .store()
                        .table(table)
                        .map_err(TxnError::from)?
                        .slot_being_claimed(&used))
                })?;
            fetches[n].done = Some(match action {
                AbsentKey::HalfClaimed => {
                    return Err(TxnError::Aborted(AbortReason::IndexSlotHalfClaimed));
                }
                AbsentKey::Claim => self.claim(table, key, bucket, free).await?,
                AbsentKey::ReadAbsent => {
                    self.sets
                        .read_absent(table, key, Some(Target::Absent(bucket)));
                    None
                }
            });
        }
        Ok(())
    }

    /// One pass over the pending fetches: their CVTs in one post list, judged
    /// ([`logic::after_cvt_read`], [`logic::after_meta`]), then the versions chosen.
    async fn cvt_pass(&mut self, fetches: &mut [Fetch], pending: &[usize]) -> Result<(), TxnError> {
        let (list, wrs) = self.cvt_list(fetches, pending)?;
        self.co.ctx.mark_phase(Phase::Execute);
        let res = self.co.ctx.post(list).await?;
        let images = self.judge_cvts(fetches, &wrs, &res)?;
        if !images.is_empty() {
            let read = exec::read_versions(&self.co.ctx, &self.co.store, images).await?;
            for (n, loc, version, payload) in read {
                let f = &fetches[n];
                let (table, key, access) = (f.table, f.key, f.access);
                let for_update = access == Access::ForUpdate;
                let locked = !self.co.cfg.unsafe_no_cas;
                let Some(p) =
                    logic::after_image(payload, for_update, locked).map_err(TxnError::Aborted)?
                else {
                    continue;
                };
                self.sets.read_version(
                    table,
                    key,
                    access,
                    Target::Block(loc),
                    version,
                    p.writer,
                    p.value.as_deref(),
                );
                fetches[n].done = Some(p.value);
            }
        }
        Ok(())
    }

    /// The post list of a pass: per pending fetch (with its block known) a lock CAS
    /// chained with the CVT READ for update (unless unsafe), a CVT READ otherwise.
    fn cvt_list(
        &self,
        fetches: &[Fetch],
        pending: &[usize],
    ) -> Result<(PostList, Vec<CvtWrs>), TxnError> {
        let me = self.my_lock();
        let mut list = PostList::new();
        let mut wrs = Vec::new();
        for &n in pending {
            let f = &fetches[n];
            let Some(loc) = f.loc else { continue };
            let shape = self.shape(f.table)?;
            let addr = self.primary(&loc, 0)?;
            let cas = (f.access == Access::ForUpdate && !self.co.cfg.unsafe_no_cas)
                .then(|| list.cas(addr, 0, me));
            if cas.is_some() {
                // Logged before the CAS is posted: a crash may land it unseen.
                self.log_locked(f.table, loc);
            }
            let rd = list.read(addr, shape.meta_len() as u32);
            wrs.push((n, loc, shape, cas, rd));
        }
        Ok((list, wrs))
    }

    /// Judges a pass's CVT READs: records read for update join the write set (held, or
    /// tracked without the CAS) before anything aborts, so that the abort releases them;
    /// a record with no version at `S` is answered absent; the versions to READ are
    /// returned. The first conflict aborts once every record is judged.
    fn judge_cvts(
        &mut self,
        fetches: &mut [Fetch],
        wrs: &[CvtWrs],
        res: &BatchResult,
    ) -> Result<Vec<exec::VersionPick>, TxnError> {
        let mut conflict = None;
        let mut images = Vec::new();
        for &(n, loc, shape, cas, rd) in wrs {
            let (table, key) = (fetches[n].table, fetches[n].key);
            let for_update = fetches[n].access == Access::ForUpdate;
            let meta = match logic::after_cvt_read(cas.map(|c| res.atomic(c)), res.bytes(rd), shape)
            {
                CvtRead::Locked => {
                    conflict.get_or_insert(TxnError::Aborted(AbortReason::RecordLocked));
                    continue;
                }
                CvtRead::Unreadable => {
                    if cas.is_some() {
                        // Held though unreadable: keep it so that the abort releases it.
                        let empty = Meta::empty(shape.cells);
                        self.sets
                            .writes
                            .push(WriteEntry::new(table, key, loc, empty, true));
                    }
                    conflict.get_or_insert(TxnError::Aborted(AbortReason::UnreadableVersionTable));
                    continue;
                }
                CvtRead::Meta(meta) => meta,
            };
            if for_update {
                // Held from here on (or, without the CAS, tracked): abort releases it.
                self.sets.writes.push(WriteEntry::new(
                    table,
                    key,
                    loc,
                    meta.clone(),
                    cas.is_some(),
                ));
            }
            match logic::after_meta(&meta, self.start, for_update, self.co.cfg.skip_newer_abort) {
                MetaOutcome::Image(i) => images.push((n, loc, shape, meta, i)),
                MetaOutcome::Absent => {
                    let at = (!for_update).then_some(Target::Block(loc));
                    self.sets.read_absent(table, key, at);
                    fetches[n].done = Some(None);
                }
                MetaOutcome::Retry => {}
                MetaOutcome::Abort(why) => {
                    conflict.get_or_insert(TxnError::Aborted(why));
                }
            }
        }
        conflict.map_or(Ok(images), Err)
    }

    /// Whether an insert into `bucket` could take a block: always in the slot-fixed layout;
    /// in a pooled table only with room left in this coordinator's insert share. A table
    /// that does not grow has no share, so a for-update access to a key absent from it is
    /// read as absent (validated at commit like any read) instead of claiming a block that
    /// an update or delete of the absent key could never use.
    fn can_insert(&self, bucket: BucketLoc) -> bool {
        self.co
            .inserts
            .next(self.store(), self.co.id, bucket, 0)
            .is_ok()
    }

    /// A for-update access to a key absent from the index: lock the block of the bucket's
    /// first free slot (CAS) reading its CVT and the index slot, then write the slot to
    /// every replica. The record then exists with no version (absent) and is locked.
    async fn claim(
        &mut self,
        table: TableId,
        key: Key,
        bucket: BucketLoc,
        free: Option<usize>,
    ) -> Result<Option<Vec<u8>>, TxnError> {
        let Some(slot) = free else {
            return Err(TxnError::Aborted(AbortReason::IndexBucketFull));
        };
        // The slot's fixed block, or for a pooled table the next block of this
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
        let shape = self.shape(table)?;
        let (res, cas, rd, slot_wr) = self
            .claim_batch(table, loc, (bucket, slot), shape, pooled)
            .await?;
        if let Some(cas) = cas
            && res.atomic(cas) != 0
        {
            return Err(TxnError::Aborted(AbortReason::IndexSlotBeingClaimed));
        }
        let parsed = Meta::parse(res.bytes(rd), shape);
        self.sets.writes.push(WriteEntry::new(
            table,
            key,
            loc,
            parsed.clone().unwrap_or_else(|| Meta::empty(shape.cells)),
            cas.is_some(),
        ));
        // Pushed before giving up, so that the abort releases the lock.
        let meta = parsed.ok_or(TxnError::Aborted(AbortReason::UnreadableVersionTable))?;
        let seen = match slot_wr {
            Some(SlotWr::Cas(id)) => SlotSeen::Cas(res.atomic(id)),
            Some(SlotWr::Read(id)) => SlotSeen::Read(res.bytes(id)),
            None => SlotSeen::Unseen,
        };
        if !logic::slot_used(seen, key.0).map_err(TxnError::Aborted)? {
            let mut list = PostList::new();
            logic::claim_slot(self.store(), &mut list, bucket, slot, loc.offset, key.0)?;
            self.co.ctx.post(list).await?;
        }
        self.co.cache.borrow_mut().put(table, key, loc);
        self.read_claimed(table, key, loc, shape, meta).await
    }

    /// The lock batch of an insert's block at `loc` (for `slot` of `bucket`): the lock CAS (unless unsafe) and the
    /// CVT READ, then the index slot CASed or READ ([`logic::claims_slot_by_cas`]).
    async fn claim_batch(
        &mut self,
        table: TableId,
        loc: ItemLoc,
        (bucket, slot): (BucketLoc, usize),
        shape: BlockShape,
        pooled: bool,
    ) -> Result<(BatchResult, Option<WrId>, WrId, Option<SlotWr>), TxnError> {
        let addr = self.primary(&loc, 0)?;
        let p = self
            .store()
            .primary(bucket.partition)
            .map_err(TxnError::from)?;
        let slot_addr = self.store().addr(p, bucket.offset + slot_offset(slot));
        let mut list = PostList::new();
        let cas = (!self.co.cfg.unsafe_no_cas).then(|| list.cas(addr, 0, self.my_lock()));
        if cas.is_some() {
            // Logged before the CAS is posted: a crash may land it unseen.
            self.log_locked(table, loc);
        }
        let rd = list.read(addr, shape.meta_len() as u32);
        // Slot-fixed: two inserts of one key lock the same block, so the block's lock CAS
        // arbitrates and the slot is only READ. Pooled: each insert locks a block of its
        // own, so the slot's address word is CASed (empty -> our block) instead of READ
        // (same verbs, one READ becomes a CAS); once posted, the block counts as taken.
        let slot_wr = if logic::claims_slot_by_cas(pooled, self.co.cfg.unsafe_no_cas) {
            let packed = dmem_layout::record::RemoteAddr::new(bucket.partition, loc.offset)
                .map_err(|_| TxnError::Aborted(AbortReason::OffsetBeyondPackedAddresses))?;
            self.co.inserts.claimed(&self.co.store, bucket);
            SlotWr::Cas(list.cas(slot_addr.add(8), 0, packed.to_raw()))
        } else {
            SlotWr::Read(list.read(slot_addr, 16))
        };
        let res = self.co.ctx.post(list).await?;
        Ok((res, cas, rd, Some(slot_wr)))
    }

    /// The claimed record's version at `S` ([`logic::after_meta`] on its CVT as locked):
    /// absent, or (the key was inserted meanwhile by another transaction) its version READ.
    async fn read_claimed(
        &mut self,
        table: TableId,
        key: Key,
        loc: ItemLoc,
        shape: BlockShape,
        meta: Meta,
    ) -> Result<Option<Vec<u8>>, TxnError> {
        match logic::after_meta(&meta, self.start, true, self.co.cfg.skip_newer_abort) {
            MetaOutcome::Absent => {
                self.sets.note(table, key, 0, 0);
                Ok(None)
            }
            MetaOutcome::Abort(why) => Err(TxnError::Aborted(why)),
            MetaOutcome::Image(i) => {
                let read = exec::read_versions(
                    &self.co.ctx,
                    &self.co.store,
                    vec![(0, loc, shape, meta, i)],
                )
                .await?;
                let Some((_, _, version, Some(payload))) = read.into_iter().next() else {
                    return Err(TxnError::Aborted(AbortReason::TornImageUnderLock));
                };
                self.sets.read_version(
                    table,
                    key,
                    Access::ForUpdate,
                    Target::Block(loc),
                    version,
                    payload.writer,
                    payload.value.as_deref(),
                );
                Ok(payload.value)
            }
            MetaOutcome::Retry => Err(TxnError::Aborted(AbortReason::TornVersionTableUnderLock)),
        }
    }

    async fn stage(
        &mut self,
        table: TableId,
        key: Key,
        value: &[u8],
        kind: WriteKind,
    ) -> Result<(), TxnError> {
        logic::check_write(self.kind, kind, value, || Ok(self.shape(table)?.value_len))?;
        if self.sets.write_entry(table, key).is_none() {
            self.round_impl(&[ReadReq::for_update(table, key)]).await?;
        }
        self.sets.stage(table, key, value, kind)
    }

    /// Unlock WRITEs of every held lock (one post list).
    async fn release(&mut self) -> Result<(), TxnError> {
        let mut list = PostList::new();
        for w in self.sets.writes.iter().filter(|w| w.lock) {
            list.write(self.primary(&w.loc, LOCK_OFFSET)?, &0u64.to_le_bytes());
        }
        for w in &mut self.sets.writes {
            w.lock = false;
        }
        if !list.is_empty() {
            self.co.ctx.mark_phase(Phase::Release);
            self.co.ctx.post(list).await?;
        }
        self.co.oplog.finished(self.co.id);
        Ok(())
    }

    fn record(&mut self, outcome: TxnOutcome, writes: Vec<WriteEvent>) {
        let end = self.co.ctx.now();
        let record = self
            .sets
            .take_record(self.id, self.begin, end, outcome, writes);
        self.co.history.record(record);
        match outcome {
            TxnOutcome::Committed => self.co.stats.committed += 1,
            _ => self.co.stats.aborted += 1,
        }
    }

    /// SR validation of the read-only records: one READ each (CVT, or the bucket of a key
    /// read as absent from the index).
    async fn validate(&mut self) -> Result<bool, TxnError> {
        let mut list = PostList::new();
        let mut checks = Vec::new();
        for r in &self.sets.reads {
            if self.sets.write_entry(r.table, r.key).is_some() {
                continue; // locked by us: the lock validates it
            }
            match r.at {
                Target::Block(loc) => {
                    let shape = self.shape(r.table)?;
                    let wr = list.read(self.primary(&loc, 0)?, shape.meta_len() as u32);
                    checks.push((r.key, Some(shape), wr));
                }
                Target::Absent(bucket) => {
                    let p = self
                        .store()
                        .primary(bucket.partition)
                        .map_err(TxnError::from)?;
                    let wr = list.read(self.store().addr(p, bucket.offset), bucket.read_len());
                    checks.push((r.key, None, wr));
                }
            }
        }
        if list.is_empty() {
            return Ok(true);
        }
        let res: BatchResult = self.co.ctx.post(list).await?;
        Ok(checks.iter().all(|&(key, shape, wr)| match shape {
            Some(shape) => Meta::parse(res.bytes(wr), shape)
                .is_some_and(|m| logic::still_valid(&m, self.start)),
            None => !parse_bucket(res.bytes(wr))
                .0
                .iter()
                .any(|(_, k)| *k == key.0),
        }))
    }

    /// The commit (step 3 of the module doc): a commit timestamp `C`, SR validation, then one post list
    /// with every install and the unlocks last. A transaction without a write installs
    /// nothing (every read was at the snapshot `S`).
    async fn commit_impl(&mut self) -> Result<(), TxnError> {
        if self.sets.writes.iter().all(|w| w.op.is_none()) {
            // Nothing to install: every read was at the snapshot S.
            self.release().await?;
            self.record(TxnOutcome::Committed, Vec::new());
            return Ok(());
        }
        let c = self.co.ts.commit_ts().await;
        self.co.ctx.mark_phase(Phase::Validate);
        if self.co.cfg.isolation == Isolation::Serializable && !self.validate().await? {
            return Err(TxnError::Aborted(AbortReason::ReadOnlyRecordChanged));
        }
        let horizon = self.co.ts.horizon(self.co.cfg.gc_threshold);
        let (mut list, installs, events) = self.install_list(c, horizon)?;
        self.add_unlocks(&mut list)?;
        let id = self.id;
        // Recorded (as `Unknown`) before the decision is logged, and logged before the first
        // install WRITE is posted (no await in between): a CN process killed between any two
        // of these steps leaves no install that recovery finishes without a history record.
        let end = self.co.ctx.now();
        let record = self
            .sets
            .take_record(id, self.begin, end, TxnOutcome::Unknown, events);
        self.co.history.record(record);
        self.recorded_unknown = true;
        self.co.oplog.committing(self.co.id, installs);
        self.co.ctx.mark_phase(Phase::Commit);
        self.co.ctx.post(list).await?;
        // Resolved before the op log is cleared, never after: recovery settles an `Unknown`
        // transaction whose coordinator's op log is idle as aborted, so a CN killed between
        // the two would leave installed versions that no transaction of the history wrote.
        self.co
            .history
            .resolve(id, TxnOutcome::Committed, self.co.ctx.now());
        self.co.oplog.finished(self.co.id);
        for w in &mut self.sets.writes {
            w.lock = false;
        }
        self.co.stats.committed += 1;
        Ok(())
    }

    /// The commit's install WRITEs of version `c` (cells committed before `horizon`
    /// collected: [`logic::plan_commit`]) for every record with a staged op, with what the
    /// op log keeps of them for recovery and what the history records.
    fn install_list(
        &self,
        c: u64,
        horizon: u64,
    ) -> Result<(PostList, Vec<Install>, Vec<WriteEvent>), TxnError> {
        let writer = pack_writer(self.id);
        let mut events = Vec::new();
        let mut installs = Vec::new();
        let mut list = PostList::new();
        for w in &self.sets.writes {
            if w.op.is_none() {
                continue;
            }
            let shape = self.shape(w.table)?;
            let Some(new) = w.new_version(shape, c, horizon, writer) else {
                continue;
            };
            let cell_at = shape.cell_offset(new.plan.cell);
            let cell_bytes = &new.meta_tail[cell_at - FLOOR_OFFSET as usize..][..CELL_LEN];
            installs.push(Install {
                record: LockedRecord {
                    table: w.table,
                    partition: w.loc.bucket.partition,
                    block: w.loc.offset,
                },
                version: c,
                images: new.images.clone(),
                cell: (cell_at as u64, cell_bytes.to_vec()),
                whole: new
                    .plan
                    .whole
                    .then(|| (FLOOR_OFFSET, new.meta_tail.clone())),
            });
            exec::install_writes(self.store(), w.loc, shape, &new, |addr, bytes| {
                list.write(addr, bytes);
            });
            events.push(WriteEvent {
                table: w.table,
                key: w.key,
                version: Version(c),
                kind: new.kind,
            });
        }
        Ok((list, installs, events))
    }

    /// The unlocks, last in the commit's post list: on the same queue pair as the writes,
    /// so they land after them ([`logic::unlock_mns`] says which replicas).
    fn add_unlocks(&self, list: &mut PostList) -> Result<(), TxnError> {
        for w in self.sets.writes.iter().filter(|w| w.lock) {
            let shape = self.shape(w.table)?;
            let deltas = shape.layout == mvcc::VersionLayout::Deltas;
            let part = w.loc.bucket.partition;
            let p = self.store().primary(part).map_err(TxnError::from)?;
            let live = self.store().live_replicas(part);
            for mn in logic::unlock_mns(deltas, w.op.is_some(), p, &live) {
                list.write(
                    self.store().addr(mn, w.loc.offset + LOCK_OFFSET),
                    &0u64.to_le_bytes(),
                );
            }
        }
        Ok(())
    }
}

impl<V: Verbs + Clock, H: HistorySink, T: TimestampService> Transaction for MotorTxn<'_, V, H, T> {
    async fn read_round(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        if self.kind == TxnKind::ReadOnly && reqs.iter().any(|r| r.access == Access::ForUpdate) {
            return Err(TxnError::ReadOnly);
        }
        self.round_impl(reqs).await
    }

    async fn write(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.stage(table, key, value, WriteKind::Update).await
    }

    async fn insert(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.stage(table, key, value, WriteKind::Insert).await
    }

    async fn delete(&mut self, table: TableId, key: Key) -> Result<(), TxnError> {
        self.stage(table, key, &[], WriteKind::Delete).await
    }

    async fn commit(mut self) -> Result<(), TxnError> {
        match self.commit_impl().await {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = self.release().await;
                if !self.recorded_unknown
                    && (!matches!(e, TxnError::Verbs(_)) || self.sets.events.is_empty())
                {
                    self.record(TxnOutcome::Aborted, Vec::new());
                }
                Err(e)
            }
        }
    }

    async fn abort(mut self) {
        let _ = self.release().await;
        self.record(TxnOutcome::Aborted, Vec::new());
    }
}

/// The committed value of a record read from `read(offset, len)` of its primary's memory
/// (out of band, after a run): the newest committed version.
pub fn read_final(
    store: &Store,
    shapes: &Shapes,
    table: TableId,
    key: Key,
    mut read: impl FnMut(dmem_verbs::NodeId, u64, usize) -> Vec<u8>,
) -> Option<Vec<u8>> {
    let bucket = store.bucket_of(table, key).ok()?;
    let p = store.primary(bucket.partition).ok()?;
    let node = store.mn_node(p);
    let bucket_bytes = read(node, bucket.offset, bucket.read_len() as usize);
    let (used, _) = parse_bucket(&bucket_bytes);
    let slot = used.iter().find(|(_, k)| *k == key.0)?.0;
    let loc = store.item_in_bucket(bucket, slot, &bucket_bytes).ok()?;
    let shape = shapes.get(table).ok()?;
    let meta = Meta::parse(&read(node, loc.offset, shape.meta_len()), shape)?;
    let (i, _) = meta
        .cells
        .iter()
        .enumerate()
        .filter(|(_, c)| c.is_committed())
        .max_by_key(|(_, c)| c.commit_version())?;
    let parts: Vec<Vec<u8>> = mvcc::version_reads(shape, &meta, loc.offset, i)
        .into_iter()
        .map(|(at, len)| read(node, at, len))
        .collect();
    let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    mvcc::decode_version(shape, &meta, i, &parts)?.value
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Incarnations number their transactions in disjoint ranges that survive the packed
    /// writer's 40 bits of sequence number; beyond 255 they saturate.
    #[test]
    fn incarnations_number_transactions_apart() {
        assert_eq!(incarnation_seq_base(0), 0);
        assert_eq!(incarnation_seq_base(1), 1 << 32);
        assert!(incarnation_seq_base(2) > incarnation_seq_base(1) + u64::from(u32::MAX) - 1);
        assert_eq!(incarnation_seq_base(300), incarnation_seq_base(255));
        for i in [1, 2, 255] {
            let id = TxnId {
                coordinator: CoordinatorId(7),
                seq: incarnation_seq_base(i) + 1,
            };
            assert_eq!(mvcc::unpack_writer(pack_writer(id)), Some(id));
        }
    }
}

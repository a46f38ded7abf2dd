//! LOTUS coordinators and transactions: the lock-first protocol (LOTUS §5.1, §5.2) on
//! Motor's CVT store ([`dmem_motor::mvcc`]) and timestamp service ([`dmem_motor::ts`]).
//!
//! 1. **Begin**: a start timestamp `T_start`.
//! 2. **Execution** (one per [`Transaction::read_round`]):
//!    1. *Lock* (read-write transactions): a write lock for every for-update record, under
//!       SR a read lock for every read-only record (SI takes none, §5.2); all of the round's
//!       requests at once: the local ones on this CN's table, the others in one message per
//!       owning CN; any refusal aborts the transaction. An insert also locks its index
//!       bucket once the key's lock is held, reads the bucket under it and claims a free
//!       slot of it (in a pooled table, naming the next block of the coordinator's insert
//!       share: the bucket's lock orders the inserts into it, so no CAS is needed). A
//!       [`Transaction::insert`] of a key not read before does this before any READ; a
//!       for-update read that finds its key absent locks the bucket and reads it again.
//!    2. *Read CVT*: the record's meta (one READ; a bucket READ first if the address is not
//!       cached).
//!    3. *Read data*: the largest version below `T_start`; a committed version at or after
//!       `T_start` of a locked record aborts (the data changed since `T_start`). Locked
//!       records need no validation at commit: the locks keep them unchanged.
//!
//!    Records read without a lock (read-only transactions, SI) wait out a version that is
//!    being committed (`INVISIBLE`: its commit timestamp may fall below `T_start`) and a
//!    torn cell or image (cacheline versions, §7.1) by reading again.
//! 3. **Commit** (with writes): (1) new image and CVT cell with version `INVISIBLE` to the
//!    primary and the backups, and the commit log (new addresses) to the coordinator's log
//!    region, in one post list; (2) `T_commit`; (3) the commit version into every new cell
//!    (visible); (4) unlock: local locks at once, remote ones by one asynchronous message per
//!    CN. Without writes: unlock only. Read-only transactions commit without anything.
//!
//! Versions in the history are commit timestamps; each read names its installer.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use dmem_locks::LockMode;
use dmem_locks::lotus::{Acquired, Holder};
use dmem_motor::Isolation;
use dmem_motor::exec::{self, ExecSets, Lookup, VersionPick, WriteEntry};
use dmem_motor::logic::{self, MetaOutcome};
use dmem_motor::mvcc::{BlockShape, Meta, Shapes, pack_writer};
use dmem_motor::ts::TimestampService;
use dmem_store::{AddressCache, BucketLoc, InsertPool, ItemLoc, Store, parse_bucket};
use dmem_txn::{
    AbortReason, Access, Coordinator, CoordinatorId, HistorySink, Key, ReadReq, RoundPlan,
    RoundValues, TableId, Transaction, TxnError, TxnId, TxnKind, TxnOutcome, WriteEvent, WriteKind,
};
use dmem_verbs::sync::lock_ignoring_poison;
use dmem_verbs::{BatchResult, Clock, Nanos, Phase, PostList, RemoteAddr, Verbs, WrId, recv_until};

use crate::locking::{CnLocks, LockCluster, LockFor};
use crate::plan::{
    self, AttemptEnd, Fetch, HeldLock, LocalStep, LockAttempt, LockWant, ReplyStep, SlotChoice,
};
use crate::recovery::CommitLog;
use crate::shard::{Sharding, bucket_lock_key, record_lock_key};
use crate::wire::{Reply, Request, RequestKind};

/// LOTUS's switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LotusConfig {
    /// SR or SI (§5.2).
    pub isolation: Isolation,
    /// Clock uncertainty of the timestamp service, ns.
    pub epsilon: Nanos,
    /// Versions older than this are collected when a writer sees them (§7.1: 500 ms).
    pub gc_threshold: Nanos,
    /// Reads of a record being committed (or torn) repeated before aborting.
    pub max_rereads: u32,
    /// Pause between two such reads, ns.
    pub reread_pause: Nanos,
    /// How long a coordinator waits for lock replies before it aborts, ns.
    pub rpc_timeout: Nanos,
    /// Retries of a lock request refused because the shard moved.
    pub max_reroutes: u32,
    /// Whether the version table cache is used (§4.4; off for the §8.3 ablation).
    pub vt_cache: bool,
    /// LOTUS §8.4 Fig. 17's idealised CN-counted RDMA lock instead of lock disaggregation:
    /// every lock is decided at once on its owner's table (no message, no queue, no
    /// notification: an upper bound), and each CN counts its holders per lock; an FAA to
    /// the record's lock word at its MN marks the CN's first holder (0 → 1) and its last
    /// release (1 → 0), the global ownership transfer.
    pub rdma_lock: bool,
}

impl LotusConfig {
    /// LOTUS under serializability.
    #[must_use]
    pub const fn sr() -> Self {
        Self {
            isolation: Isolation::Serializable,
            epsilon: 1_000,
            gc_threshold: 500_000_000,
            max_rereads: 32,
            reread_pause: 500,
            rpc_timeout: 1_000_000,
            max_reroutes: 3,
            vt_cache: true,
            rdma_lock: false,
        }
    }

    /// LOTUS under snapshot isolation.
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
pub struct LotusStats {
    /// Committed transactions.
    pub committed: u64,
    /// Aborted transactions.
    pub aborted: u64,
    /// Locks taken on this CN's table directly.
    pub local_locks: u64,
    /// Locks requested from other CNs.
    pub remote_locks: u64,
    /// Lock request messages sent (lock and unlock).
    pub lock_messages: u64,
    /// Lock requests refused.
    pub refusals: u64,
    /// Reads repeated because a version was being committed or torn.
    pub rereads: u64,
    /// CVT READs saved by the version table cache.
    pub vt_hits: u64,
    /// FAAs of the idealised RDMA lock ([`LotusConfig::rdma_lock`]).
    pub rdma_faas: u64,
}

/// The first transaction sequence number of incarnation `incarnation` of a CN's
/// coordinators, less one ([`LotusCoordinator::in_incarnation`]): `incarnation` × 2³². The
/// packed writer id keeps 40 bits of sequence number, so 255 incarnations of 2³² − 1
/// transactions each fit; later incarnations saturate at the last one.
#[must_use]
pub const fn incarnation_seq_base(incarnation: u32) -> u64 {
    let i = if incarnation > 255 { 255 } else { incarnation };
    (i as u64) << 32
}

/// A LOTUS coordinator on one CN context.
#[derive(Debug)]
pub struct LotusCoordinator<V, H, T> {
    ctx: V,
    cn: u16,
    thread: u16,
    cluster: Rc<LockCluster>,
    /// This CN's locks (its table, VT cache, latency metric).
    local: Arc<CnLocks>,
    store: Rc<Store>,
    shapes: Rc<Shapes>,
    cfg: LotusConfig,
    id: u16,
    seq: u64,
    req: u64,
    cache: Rc<RefCell<AddressCache>>,
    history: H,
    ts: T,
    stats: LotusStats,
    /// Cursors into this coordinator's insert shares of pooled tables.
    inserts: InsertPool,
}

impl<V: Verbs + Clock, H: HistorySink, T: TimestampService> LotusCoordinator<V, H, T> {
    /// Coordinator `id` on thread `thread` of CN `cn`, sharing its CN's address `cache`.
    ///
    /// # Panics
    /// If `cluster` holds no table for `cn` ([`LockCluster::table`]): a coordinator runs
    /// on a CN whose locks are at hand.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: V,
        cn: u16,
        thread: u16,
        cluster: Rc<LockCluster>,
        store: Rc<Store>,
        shapes: Rc<Shapes>,
        cfg: LotusConfig,
        id: u16,
        cache: Rc<RefCell<AddressCache>>,
        history: H,
        ts: T,
    ) -> Self {
        let local =
            Arc::clone(cluster.table(cn).unwrap_or_else(|| {
                panic!("a LOTUS coordinator on CN {cn}, whose table is elsewhere")
            }));
        Self {
            ctx,
            cn,
            thread,
            cluster,
            local,
            store,
            shapes,
            cfg,
            id,
            seq: 0,
            req: 0,
            cache,
            history,
            ts,
            stats: LotusStats::default(),
            inserts: InsertPool::new(),
        }
    }

    /// The same coordinator (same id, same log region) in incarnation `incarnation` of its
    /// CN (LOTUS §6: a restarted CN runs coordinators again): its transaction sequence
    /// numbers start at `incarnation` × 2³², so that no transaction id of this incarnation
    /// equals one of an earlier incarnation's (their images' writers, lock states and
    /// history entries stay distinct), and its commit logs are newer than theirs (recovery
    /// takes the log with the highest sequence number). Incarnation 0 is the first.
    #[must_use]
    pub fn in_incarnation(mut self, incarnation: u32) -> Self {
        self.seq = incarnation_seq_base(incarnation);
        self
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> LotusStats {
        self.stats
    }
}

impl<V: Verbs + Clock, H: HistorySink, T: TimestampService> Coordinator
    for LotusCoordinator<V, H, T>
{
    type Txn<'a>
        = LotusTxn<'a, V, H, T>
    where
        Self: 'a;

    async fn begin(&mut self, kind: TxnKind) -> Result<Self::Txn<'_>, TxnError> {
        self.seq += 1;
        let id = TxnId {
            coordinator: CoordinatorId(u32::from(self.id)),
            seq: self.seq,
        };
        let begin = self.ctx.now();
        let start = self.ts.start_ts().await;
        Ok(LotusTxn {
            co: self,
            id,
            kind,
            begin,
            start,
            held: Vec::new(),
            sets: Sets::default(),
        })
    }
}

/// LOTUS's read and write sets: its locks are on the CNs ([`HeldLock`]), so the records
/// keep nothing of their own.
type Sets = ExecSets<(), ()>;

/// A running LOTUS transaction. Finish it with `commit` or `abort`.
#[derive(Debug)]
pub struct LotusTxn<'a, V, H, T> {
    co: &'a mut LotusCoordinator<V, H, T>,
    id: TxnId,
    kind: TxnKind,
    begin: Nanos,
    start: u64,
    held: Vec<HeldLock>,
    sets: Sets,
}

/// A meta READ of one pending fetch: its index, block, shape and READ (none: the CVT is
/// cached, §4.4).
type MetaRead = (usize, ItemLoc, BlockShape, Option<WrId>);

/// The lock an insert takes on its index bucket (§4.1: the bucket's address is the lock
/// key; its shard by hash, as no critical field names it).
fn bucket_lock(bucket: BucketLoc) -> LockWant {
    let key = bucket_lock_key(bucket.partition, bucket.offset);
    LockWant {
        key,
        shard: Sharding::bucket_shard(key),
        mode: LockMode::Exclusive,
        what: LockFor::IndexBucket,
    }
}

/// Counts a transaction as committing with locks of `owners` while it lives.
struct Committing {
    cluster: Rc<LockCluster>,
    owners: Vec<u16>,
    txn: u64,
}

impl Committing {
    fn enter(cluster: Rc<LockCluster>, owners: Vec<u16>, txn: u64) -> Self {
        for &o in &owners {
            if let Some(n) = cluster.committing.borrow_mut().get_mut(usize::from(o)) {
                *n += 1;
            }
        }
        cluster.committing_txns.borrow_mut().insert(txn);
        Self {
            cluster,
            owners,
            txn,
        }
    }
}

impl Drop for Committing {
    fn drop(&mut self) {
        self.cluster.committing_txns.borrow_mut().remove(&self.txn);
        for &o in &self.owners {
            if let Some(n) = self.cluster.committing.borrow_mut().get_mut(usize::from(o)) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

impl<V: Verbs + Clock, H: HistorySink, T: TimestampService> LotusTxn<'_, V, H, T> {
    /// The transaction's id.
    #[must_use]
    pub fn id(&self) -> TxnId {
        self.id
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

    fn holder(&self) -> Holder {
        Holder {
            txn: pack_writer(self.id),
            cn: self.co.cn,
        }
    }

    fn sharding(&self) -> &Sharding {
        &self.co.cluster.sharding
    }

    /// Whether the version table cache is in use (§4.4; the idealised RDMA lock has none).
    fn vt_cache_on(&self) -> bool {
        self.co.cfg.vt_cache && !self.co.cfg.rdma_lock
    }

    /// Notes this attempt's latency for the CN's load monitor (§4.3).
    fn note_latency(&self) {
        let ns = self.co.ctx.now().saturating_sub(self.begin);
        self.co.local.note_latency(ns);
    }

    /// Takes every lock of `wanted`: local ones on this CN's table, the others in one
    /// message per owning CN, all sent before any reply is awaited (§4.1). Any refusal (or
    /// a CN that does not answer in time) aborts; locks whose shard moved are asked again
    /// under the new map (§4.3). A refusal is counted under what its lock is for.
    async fn lock_all(&mut self, wanted: &[LockWant]) -> Result<(), TxnError> {
        let mut todo = plan::locks_to_take(wanted, &self.held);
        let holder = self.holder();
        if self.co.cfg.rdma_lock {
            return self.lock_idealised(&todo, holder);
        }
        for _ in 0..=self.co.cfg.max_reroutes {
            if todo.is_empty() {
                return Ok(());
            }
            // Group by owner under the current map.
            let mut attempt = LockAttempt::new(todo, &self.co.cluster.map.borrow());
            if attempt.owners().any(|o| self.co.cluster.is_failed(o)) {
                // §6: new transactions asking a failed CN for locks abort at once.
                return Err(TxnError::Aborted(AbortReason::LockOwnerFailed));
            }
            // Remote requests first, so the local work overlaps their round trip.
            self.send_lock_requests(&mut attempt, holder).await?;
            self.lock_here(&mut attempt, holder);
            self.await_lock_replies(&mut attempt).await;
            todo = match attempt.finish() {
                AttemptEnd::TimedOut(asked) => {
                    // No answer in time: the locks may be held there; the unlocks sent on
                    // abort are idempotent, so send them for everything asked.
                    self.held.extend(asked);
                    return Err(TxnError::Aborted(AbortReason::LockRequestTimedOut));
                }
                AttemptEnd::Refused => return Err(TxnError::Aborted(AbortReason::LockRefused)),
                AttemptEnd::Reroute(again) => again,
            };
        }
        Err(TxnError::Aborted(AbortReason::ShardMapKeptChanging))
    }

    /// Sends `attempt`'s lock requests to the other CNs, one message per CN (§4.1).
    async fn send_lock_requests(
        &mut self,
        attempt: &mut LockAttempt,
        holder: Holder,
    ) -> Result<(), TxnError> {
        for (owner, entries) in attempt.remote(self.co.cn) {
            let server = self
                .co
                .cluster
                .server(owner, self.co.thread)
                .ok_or(TxnError::Aborted(AbortReason::NoLockServer))?;
            self.co.req += 1;
            let req = Request {
                kind: RequestKind::Lock,
                cn: self.co.cn,
                req: self.co.req,
                txn: holder.txn,
                entries: entries.clone(),
            };
            self.co.stats.lock_messages += 1;
            self.co.stats.remote_locks += entries.len() as u64;
            self.co.ctx.send(server, &req.emit()).await?;
            attempt.sent(self.co.req, owner, entries);
        }
        Ok(())
    }

    /// Takes `attempt`'s locks on this CN's table (a CPU charge each), until one is refused.
    fn lock_here(&mut self, attempt: &mut LockAttempt, holder: Holder) {
        let cluster = Rc::clone(&self.co.cluster);
        let local = Arc::clone(&self.co.local);
        for e in attempt.local(self.co.cn) {
            self.co.ctx.cpu(cluster.lock_cpu_ns);
            self.co.stats.local_locks += 1;
            if !cluster.map.borrow().serves(self.co.cn, e.shard) {
                attempt.not_served_here(&e);
                continue;
            }
            let got = local.acquire(e.key, e.shard, e.mode, holder);
            if got == Acquired::Granted {
                local.note_grant(cluster.core);
            }
            match attempt.acquired_here(&e, self.co.cn, got) {
                LocalStep::Held(h) => self.held.push(h),
                LocalStep::Refused(what) => {
                    self.co.stats.refusals += 1;
                    local.note_refused_for(what);
                    break;
                }
            }
        }
    }

    /// Feeds `attempt` the replies to its requests until all came or the RPC timeout passed.
    async fn await_lock_replies(&mut self, attempt: &mut LockAttempt) {
        let deadline = self.co.ctx.now() + self.co.cfg.rpc_timeout;
        while attempt.waiting() {
            // A receive error ends the wait like the deadline.
            let Some(msg) = recv_until(&self.co.ctx, deadline).await.ok().flatten() else {
                break;
            };
            let Ok(reply) = Reply::parse(&msg.payload) else {
                continue;
            };
            match attempt.on_reply(reply.req, reply.status) {
                ReplyStep::Granted(got) => self.held.extend(got),
                ReplyStep::Refused(what) => {
                    self.co.stats.refusals += 1;
                    self.co.local.note_refused_for(what);
                }
                ReplyStep::Stale | ReplyStep::NotOwner => {}
            }
        }
    }

    /// Fig. 17's idealised RDMA lock: decided on the owner's table at once, counted per CN
    /// (the FAA of a 0 → 1 transition is posted with the record's CVT READ).
    fn lock_idealised(&mut self, todo: &[LockWant], holder: Holder) -> Result<(), TxnError> {
        let cluster = Rc::clone(&self.co.cluster);
        for &LockWant {
            key,
            shard,
            mode,
            what,
        } in todo
        {
            let (owner, serves, generation) = {
                let map = cluster.map.borrow();
                let owner = map.owner(shard);
                (owner, map.serves(owner, shard), map.generation(shard))
            };
            self.co.ctx.cpu(cluster.lock_cpu_ns);
            if !serves {
                return Err(TxnError::Aborted(AbortReason::LockShardBeingHandedOver));
            }
            // The idealised lock reads every CN's table directly: the simulator's only
            // (`dmem-protocols` refuses `rdma-lock` on real fabrics).
            let Some(table) = cluster.table(owner) else {
                return Err(TxnError::Aborted(AbortReason::OwnerLockTableNotAtHand));
            };
            match table.acquire(key, shard, mode, holder) {
                Acquired::Granted | Acquired::AlreadyHeld => {
                    self.held.push(HeldLock {
                        key,
                        shard,
                        owner,
                        mode,
                        word: None,
                        generation,
                    });
                }
                Acquired::Refused(_) => {
                    self.co.stats.refusals += 1;
                    self.co.local.note_refused_for(what);
                    return Err(TxnError::Aborted(AbortReason::LockRefused));
                }
            }
        }
        Ok(())
    }

    /// Whether this CN's count of holders of `key` goes 0 → 1 with this holder (an FAA is
    /// due, idealised RDMA lock).
    fn count_up(&self, key: u64) -> bool {
        let mut counts = lock_ignoring_poison(&self.co.local.counts);
        let n = counts.entry(key).or_insert(0);
        *n += 1;
        *n == 1
    }

    /// Releases every lock held: local ones on the table, remote ones by one message per CN
    /// without waiting (§5.1 step 4).
    async fn unlock_all(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let holder = self.holder();
        if self.co.cfg.rdma_lock {
            self.unlock_idealised(holder).await;
            return;
        }
        let cluster = Rc::clone(&self.co.cluster);
        let (here, groups) = plan::unlock_plan(std::mem::take(&mut self.held), self.co.cn);
        for h in here {
            self.co.ctx.cpu(cluster.lock_cpu_ns);
            self.co.local.table.release(h.key, holder);
        }
        for (owner, entries) in groups {
            let Some(server) = cluster.server(owner, self.co.thread) else {
                continue;
            };
            self.co.req += 1;
            let req = Request {
                kind: RequestKind::Unlock,
                cn: self.co.cn,
                req: self.co.req,
                txn: holder.txn,
                entries,
            };
            self.co.stats.lock_messages += 1;
            let _ = self.co.ctx.send(server, &req.emit()).await;
        }
    }

    /// The idealised RDMA lock's release: on the owner's table at once, and an FAA (−1) to
    /// the lock word when this CN's last holder of it goes (1 → 0).
    async fn unlock_idealised(&mut self, holder: Holder) {
        let cluster = Rc::clone(&self.co.cluster);
        let mut faas = PostList::new();
        for h in std::mem::take(&mut self.held) {
            self.co.ctx.cpu(cluster.lock_cpu_ns);
            if let Some(owner) = cluster.table(h.owner) {
                owner.table.release(h.key, holder);
            }
            let Some(word) = h.word else { continue };
            let last = {
                let mut counts = lock_ignoring_poison(&self.co.local.counts);
                let n = counts.entry(h.key).or_insert(1);
                *n = n.saturating_sub(1);
                *n == 0
            };
            if last {
                faas.faa(word, u64::MAX); // −1
                self.co.stats.rdma_faas += 1;
            }
        }
        if !faas.is_empty() {
            let _ = self.co.ctx.post_detached(faas).await;
        }
    }

    /// One execution round (§5.1 phase 1): lock, read CVTs, read data. With `insert`, the
    /// round's for-update keys are about to be inserted: each one not in the address cache
    /// has its index bucket locked as soon as the key's lock is held (§4.1), before any
    /// READ, so that the bucket READ that looks for the key is already the one a free slot
    /// is claimed from (the key's lock is local to a routed transaction as a rule: one
    /// lock message and one READ).
    async fn round_impl(
        &mut self,
        reqs: &[ReadReq],
        insert: bool,
    ) -> Result<RoundValues, TxnError> {
        if self.kind == TxnKind::ReadOnly && reqs.iter().any(|r| r.access == Access::ForUpdate) {
            return Err(TxnError::ReadOnly);
        }
        // -- plan: local answers, distinct fetches --
        let round = RoundPlan::new(reqs, |r| self.sets.local(r));
        let mut fetches: Vec<Fetch> = round
            .fetches
            .iter()
            .map(|r| Fetch {
                table: r.table,
                key: r.key,
                access: r.access,
                locked: false,
                local: false,
                loc: self.co.cache.borrow_mut().get(r.table, r.key),
                done: None,
            })
            .collect();
        // -- 1. lock: every lock of the round at once --
        let isolation = self.co.cfg.isolation;
        let wanted = plan::round_locks(&mut fetches, self.kind, isolation, self.sharding());
        let claims = if insert {
            self.insert_claims(&fetches)?
        } else {
            Vec::new()
        };
        self.lock_all(&wanted).await?;
        let mut cached = self.cached_cvts(&mut fetches);
        // -- 2a. locate: one bucket READ per uncached record (an insert's under its lock) --
        if !claims.is_empty() {
            self.claim_slots(&mut fetches, &claims).await?;
        }
        self.locate(&mut fetches).await?;
        // -- 2b/3. CVTs, then the images --
        self.read_records(&mut fetches, &mut cached).await?;
        Ok(round.values(|n| fetches[n].done.clone().flatten()))
    }

    /// Inserts (§4.1): the index buckets to lock once the keys' locks are held. Not in the
    /// same step: two inserters of one key asking for both at once can each get one and be
    /// refused the other, again on every retry (LOTUS never waits; two CNs inserting one
    /// key livelocked so in the simulator). Only where a slot could be claimed: a pooled
    /// table with no room in this coordinator's insert share reads the key as absent under
    /// its lock ([`Self::locate`]).
    fn insert_claims(&self, fetches: &[Fetch]) -> Result<Vec<(usize, BucketLoc)>, TxnError> {
        let mut claims = Vec::new();
        for (n, f) in fetches.iter().enumerate() {
            if f.access != Access::ForUpdate || f.loc.is_some() {
                continue;
            }
            let bucket = self
                .co
                .store
                .bucket_of(f.table, f.key)
                .map_err(TxnError::from)?;
            if self.may_claim(bucket) {
                claims.push((n, bucket));
            }
        }
        Ok(claims)
    }

    /// Whether this coordinator's insert share has a block for a slot of `bucket`.
    fn may_claim(&self, bucket: BucketLoc) -> bool {
        self.co
            .inserts
            .next(&self.co.store, self.co.id, bucket, 0)
            .is_ok()
    }

    /// Notes which locked fetches are locked on this CN's table and takes their CVTs from
    /// the version table cache where it has them (§4.4).
    fn cached_cvts(&mut self, fetches: &mut [Fetch]) -> Vec<Option<Meta>> {
        let mut cached: Vec<Option<Meta>> = vec![None; fetches.len()];
        for (n, f) in fetches.iter_mut().enumerate() {
            if !f.locked {
                continue;
            }
            let key = record_lock_key(f.table, f.key);
            f.local = plan::held_on(&self.held, key, self.co.cn);
            if f.local
                && self.vt_cache_on()
                && let Some((loc, meta)) = self.co.local.vt.get(key)
            {
                f.loc = Some(loc);
                cached[n] = Some(meta);
                self.co.stats.vt_hits += 1;
            }
        }
        cached
    }

    /// Locates the records not in the address cache (one bucket READ each); a for-update
    /// key found absent claims a slot (§4.1).
    async fn locate(&mut self, fetches: &mut [Fetch]) -> Result<(), TxnError> {
        let uncached: Vec<_> = fetches
            .iter()
            .enumerate()
            .filter(|(_, f)| f.loc.is_none() && f.done.is_none())
            .map(|(n, f)| (n, f.table, f.key))
            .collect();
        let found = exec::locate(&self.co.ctx, &self.co.store, &self.co.cache, &uncached).await?;
        let mut inserts = Vec::new();
        for (n, bucket, lookup) in found {
            let f = &mut fetches[n];
            match lookup {
                Lookup::Found(loc) => f.loc = Some(loc),
                // In a pooled table with no room in this coordinator's insert share (a
                // table that does not grow has none) the key is read as absent under its
                // write lock instead: no block to claim, and an update or delete of it
                // fails as on any absent key.
                Lookup::Absent { .. }
                    if f.access == Access::ForUpdate && self.may_claim(bucket) =>
                {
                    inserts.push((n, bucket));
                }
                Lookup::Absent { .. } => {
                    let (table, key) = (f.table, f.key);
                    f.done = Some(None);
                    self.sets.read_absent(table, key, Some(()));
                }
            }
        }
        if !inserts.is_empty() {
            self.claim_slots(fetches, &inserts).await?;
        }
        Ok(())
    }

    /// Reads the CVTs, then the images, of the fetches not done, again while a read without
    /// a lock finds a version being committed or torn (§5.1 steps 2–3, §7.1).
    async fn read_records(
        &mut self,
        fetches: &mut [Fetch],
        cached: &mut [Option<Meta>],
    ) -> Result<(), TxnError> {
        let mut rereads = 0;
        loop {
            let pending: Vec<usize> = (0..fetches.len())
                .filter(|&n| fetches[n].done.is_none())
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            let (list, reads) = self.meta_reads(fetches, cached, &pending)?;
            let res = if list.is_empty() {
                None
            } else {
                Some(self.co.ctx.post(list).await?)
            };
            let images = self.after_metas(fetches, cached, &reads, res.as_ref())?;
            if !images.is_empty() {
                self.read_images(fetches, images).await?;
            }
            if fetches.iter().any(|f| f.done.is_none()) {
                // Writes of a for-update record were noted once; a retry only happens for
                // unlocked reads, which have no write entry.
                rereads += 1;
                self.co.stats.rereads += 1;
                plan::reread(rereads, self.co.cfg.max_rereads).map_err(TxnError::Aborted)?;
                self.co.ctx.sleep(self.co.cfg.reread_pause).await;
            }
        }
    }

    /// The meta READs of the `pending` fetches (those whose CVT is not cached), with the
    /// idealised RDMA lock's FAAs.
    fn meta_reads(
        &mut self,
        fetches: &[Fetch],
        cached: &[Option<Meta>],
        pending: &[usize],
    ) -> Result<(PostList, Vec<MetaRead>), TxnError> {
        let mut list = PostList::new();
        let mut reads = Vec::new();
        for &n in pending {
            let f = &fetches[n];
            let Some(loc) = f.loc else { continue };
            let shape = self.shape(f.table)?;
            if self.co.cfg.rdma_lock && f.locked {
                self.count_lock_word(&mut list, record_lock_key(f.table, f.key), &loc)?;
            }
            let rd = if cached[n].is_some() {
                None
            } else {
                Some(list.read(self.primary(&loc, 0)?, shape.meta_len() as u32))
            };
            reads.push((n, loc, shape, rd));
        }
        Ok((list, reads))
    }

    /// The idealised RDMA lock (Fig. 17): notes `key`'s lock word at `loc`, and FAAs it
    /// (+1) when this CN's first holder of it came.
    fn count_lock_word(
        &mut self,
        list: &mut PostList,
        key: u64,
        loc: &ItemLoc,
    ) -> Result<(), TxnError> {
        let word = self.primary(loc, 0)?;
        if let Some(i) = self
            .held
            .iter()
            .position(|h| h.key == key && h.word.is_none())
        {
            self.held[i].word = Some(word);
            if self.count_up(key) {
                list.faa(word, 1);
                self.co.stats.rdma_faas += 1;
            }
        }
        Ok(())
    }

    /// Decides after the CVTs `reads` fetched (or the cached ones): the images to read, the
    /// records absent; notes the write entries and keeps local CVTs cached (§4.4).
    fn after_metas(
        &mut self,
        fetches: &mut [Fetch],
        cached: &mut [Option<Meta>],
        reads: &[MetaRead],
        res: Option<&BatchResult>,
    ) -> Result<Vec<VersionPick>, TxnError> {
        let mut images = Vec::new();
        for &(n, loc, shape, rd) in reads {
            let f = &fetches[n];
            let (table, key, locked, for_update) =
                (f.table, f.key, f.locked, f.access == Access::ForUpdate);
            let meta = match (rd, res) {
                (Some(rd), Some(res)) => Meta::parse(res.bytes(rd), shape),
                _ => cached[n].take(),
            };
            let Some(mut meta) = meta else {
                return Err(TxnError::Aborted(AbortReason::UnreadableVersionTable));
            };
            // LOTUS keeps no lock in the block (only the idealised RDMA lock counts there).
            meta.lock = 0;
            if f.local && self.vt_cache_on() && rd.is_some() && meta.is_consistent() {
                self.co.local.vt.put(
                    record_lock_key(table, key),
                    self.sharding().shard_of(table, key),
                    loc,
                    meta.clone(),
                );
            }
            if for_update {
                self.sets
                    .writes
                    .push(WriteEntry::new(table, key, loc, meta.clone(), ()));
            }
            match plan::after_meta(&meta, self.start, locked) {
                MetaOutcome::Image(i) => images.push((n, loc, shape, meta, i)),
                MetaOutcome::Absent => {
                    self.sets
                        .read_absent(table, key, (!for_update).then_some(()));
                    fetches[n].done = Some(None);
                }
                MetaOutcome::Retry => {}
                MetaOutcome::Abort(why) => return Err(TxnError::Aborted(why)),
            }
        }
        Ok(images)
    }

    /// Full records (§4.4): one image READ per version picked; a torn image under a lock
    /// aborts, an unlocked one is read again.
    async fn read_images(
        &mut self,
        fetches: &mut [Fetch],
        images: Vec<VersionPick>,
    ) -> Result<(), TxnError> {
        let read = exec::read_versions(&self.co.ctx, &self.co.store, images).await?;
        for (n, _, version, payload) in read {
            let (table, key, locked) = (fetches[n].table, fetches[n].key, fetches[n].locked);
            let access = fetches[n].access;
            match payload {
                Some(p) => {
                    self.sets.read_version(
                        table,
                        key,
                        access,
                        (),
                        version,
                        p.writer,
                        p.value.as_deref(),
                    );
                    fetches[n].done = Some(p.value);
                }
                None if locked => {
                    return Err(TxnError::Aborted(AbortReason::TornImageUnderLock));
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Inserts (§4.1): lock the index buckets of `inserts`' keys (whose locks are held),
    /// read the buckets under those locks, and claim a free slot for each key absent (its
    /// slot written to every replica). A key present (inserted meanwhile, or never absent)
    /// is located there and read as any other. A round with an insert intent comes here
    /// before any READ; one that found a for-update key absent (a read before the insert,
    /// as TATP's InsertCallForwarding does) reads its bucket a second time here.
    async fn claim_slots(
        &mut self,
        fetches: &mut [Fetch],
        inserts: &[(usize, BucketLoc)],
    ) -> Result<(), TxnError> {
        let wanted: Vec<_> = inserts.iter().map(|&(_, b)| bucket_lock(b)).collect();
        self.lock_all(&wanted).await?;
        let mut list = PostList::new();
        let mut wrs = Vec::new();
        for &(n, bucket) in inserts {
            let p = self
                .store()
                .primary(bucket.partition)
                .map_err(TxnError::from)?;
            wrs.push((
                n,
                bucket,
                list.read(self.store().addr(p, bucket.offset), bucket.read_len()),
            ));
        }
        let res = self.co.ctx.post(list).await?;
        let mut slots = PostList::new();
        // Slots claimed in this round, per bucket (two inserts into one bucket).
        let mut taken: Vec<(u64, usize)> = Vec::new();
        for (n, bucket, wr) in wrs {
            self.claim_in(
                &mut fetches[n],
                bucket,
                res.bytes(wr),
                &mut taken,
                &mut slots,
            )?;
        }
        if !slots.is_empty() {
            // Unsignaled: the slot WRITEs land before this transaction's commit WRITEs to
            // the same replicas (in-order queue pairs); until then the key reads as absent,
            // which it is.
            self.co.ctx.post_detached(slots).await?;
        }
        Ok(())
    }

    /// Locates `f` in `bucket` (read as `bytes`), or claims a free slot of it for `f`'s key
    /// (its slot WRITEs into `slots`, the slot noted in `taken`).
    fn claim_in(
        &mut self,
        f: &mut Fetch,
        bucket: BucketLoc,
        bytes: &[u8],
        taken: &mut Vec<(u64, usize)>,
        slots: &mut PostList,
    ) -> Result<(), TxnError> {
        let (used, _) = parse_bucket(bytes);
        let (loc, fresh) =
            match plan::choose_slot(&used, f.key.0, bucket.offset, bucket.slot_count(), taken) {
                SlotChoice::Present(slot) => (
                    self.co
                        .store
                        .item_in_bucket(bucket, slot, bytes)
                        .map_err(TxnError::from)?,
                    false,
                ),
                SlotChoice::Full => return Err(TxnError::Aborted(AbortReason::IndexBucketFull)),
                SlotChoice::Free(slot) => {
                    taken.push((bucket.offset, slot));
                    // The slot's fixed block, or for a pooled table the next block of this
                    // coordinator's insert share (no verb: the share is its own). The bucket's
                    // lock orders inserts into the slot, so no CAS is needed.
                    let loc = self
                        .co
                        .inserts
                        .next(&self.co.store, self.co.id, bucket, slot)
                        .map_err(TxnError::from)?;
                    self.co.inserts.claimed(&self.co.store, bucket);
                    logic::claim_slot(&self.co.store, slots, bucket, slot, loc.offset, f.key.0)?;
                    (loc, true)
                }
            };
        self.co.cache.borrow_mut().put(f.table, f.key, loc);
        f.loc = Some(loc);
        if fresh {
            // A slot never used before: its block holds no version (slots are never freed),
            // so the key is absent and its meta need not be read. Whatever a crashed
            // inserter left there is overwritten whole at commit (the meta's key is not
            // ours).
            let shape = self.shape(f.table)?;
            let (table, key) = (f.table, f.key);
            f.done = Some(None);
            self.sets.writes.push(WriteEntry::new(
                table,
                key,
                loc,
                Meta::empty(shape.cells),
                (),
            ));
            self.sets.note(table, key, 0, 0);
        }
        Ok(())
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
            self.round_impl(
                &[ReadReq::for_update(table, key)],
                kind == WriteKind::Insert,
            )
            .await?;
        }
        self.sets.stage(table, key, value, kind)
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

    async fn commit_impl(&mut self) -> Result<(), TxnError> {
        if self.sets.writes.iter().all(|w| w.op.is_none()) {
            // Nothing to install: the locks kept every read unchanged since T_start.
            self.unlock_all().await;
            self.record(TxnOutcome::Committed, Vec::new());
            return Ok(());
        }
        // §6: a transaction holding a failed CN's lock aborts unless already committing;
        // from here on it is committing, and recovery waits for it before the failed CN's
        // shards are served again. §4.3: a hand-over that aborted a shard's holders took
        // their locks away.
        let owners = plan::lock_owners(&self.held);
        let cluster = &self.co.cluster;
        plan::may_commit(
            &owners,
            |o| cluster.is_failed(o),
            || plan::locks_valid(&self.held, &cluster.map.borrow()),
        )
        .map_err(TxnError::Aborted)?;
        let txn = self.holder().txn;
        let _committing = Committing::enter(Rc::clone(&self.co.cluster), owners, txn);
        // (1) Write data & log: images and INVISIBLE cells to every replica, the log (first
        // on every MN's queue pair, so an INVISIBLE cell never lands without it).
        let horizon = self.co.ts.horizon(self.co.cfg.gc_threshold);
        let writer = pack_writer(self.id);
        let mut w = plan::plan_writes(
            self.store(),
            &self.co.shapes,
            &self.sets.writes,
            horizon,
            writer,
        )?;
        let log = CommitLog {
            writer,
            entries: std::mem::take(&mut w.logged),
        }
        .emit();
        let list = plan::log_and_data(self.store(), self.co.id, &log, w.data)
            .map_err(TxnError::Aborted)?;
        self.co.ctx.mark_phase(Phase::WriteInvisible);
        self.co.ctx.post(list).await?;
        // (2) Commit timestamp (with the service's commit-wait).
        let c = self.co.ts.commit_ts().await;
        let events = plan::write_events(&w.installed, c);
        let id = self.id;
        let end = self.co.ctx.now();
        let record = self
            .sets
            .take_record(id, self.begin, end, TxnOutcome::Unknown, events);
        self.co.history.record(record);
        // (3) Write visible: the commit version into every new cell.
        let list = plan::make_visible(self.store(), &w.installed, c);
        self.co.ctx.mark_phase(Phase::WriteVisible);
        self.co.ctx.post(list).await?;
        self.co
            .history
            .resolve(id, TxnOutcome::Committed, self.co.ctx.now());
        self.co.stats.committed += 1;
        if self.vt_cache_on() {
            // §4.4: a local writer keeps the cached CVTs of its locally locked records.
            let keep = plan::cvts_to_cache(
                &w.installed,
                w.plans,
                &self.held,
                self.co.cn,
                self.sharding(),
                c,
            );
            for (lock, shard, loc, meta) in keep {
                self.co.local.vt.put(lock, shard, loc, meta);
            }
        }
        // (4) Unlock.
        self.unlock_all().await;
        Ok(())
    }
}

impl<V: Verbs + Clock, H: HistorySink, T: TimestampService> Transaction for LotusTxn<'_, V, H, T> {
    async fn read_round(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        self.round_impl(reqs, false).await
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
        let result = self.commit_impl().await;
        self.note_latency();
        match result {
            Ok(()) => Ok(()),
            Err(e) => {
                // Before the INVISIBLE cells landed nothing is visible; a failure after the
                // history record leaves the outcome to recovery.
                let recorded =
                    self.sets.events.is_empty() && self.sets.writes.iter().any(|w| w.op.is_some());
                self.unlock_all().await;
                if !matches!(e, TxnError::Verbs(_)) || !recorded {
                    self.record(TxnOutcome::Aborted, Vec::new());
                }
                Err(e)
            }
        }
    }

    async fn abort(mut self) {
        self.note_latency();
        self.unlock_all().await;
        self.record(TxnOutcome::Aborted, Vec::new());
    }
}

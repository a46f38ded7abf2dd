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

use dmem_layout::cvt::{CvtCell, INVISIBLE};
use dmem_locks::LockMode;
use dmem_locks::lotus::{Acquired, Holder};
use dmem_motor::Isolation;
use dmem_motor::exec::{self, ExecSets, Lookup, WriteEntry};
use dmem_motor::logic::{self, MetaOutcome};
use dmem_motor::mvcc::{BlockShape, Meta, Shapes, pack_writer};
use dmem_motor::ts::TimestampService;
use dmem_store::{AddressCache, BucketLoc, InsertPool, ItemLoc, Store, parse_bucket};
use dmem_txn::{
    AbortReason, Access, Coordinator, CoordinatorId, HistorySink, Key, ReadReq, RoundPlan,
    RoundValues, TableId, Transaction, TxnError, TxnId, TxnKind, TxnOutcome, Version, WriteEvent,
    WriteKind,
};
use dmem_verbs::sync::lock_ignoring_poison;
use dmem_verbs::{Clock, Nanos, Phase, PostList, RemoteAddr, Verbs, recv_until};

use crate::locking::{CnLocks, LockCluster, LockFor, stronger};
use crate::recovery::{LogEntry, encode_log};
use crate::shard::{Sharding, bucket_lock_key, record_lock_key};
use crate::wire::{LockEntry, Reply, Request, RequestKind, Status};

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

/// A lock the transaction holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeldLock {
    key: u64,
    shard: u16,
    owner: u16,
    mode: LockMode,
    /// The record's lock word, once an idealised RDMA lock FAA'd it (0 → 1).
    word: Option<RemoteAddr>,
    /// The shard's generation when the lock was asked for: a hand-over that aborts the
    /// shard's holders bumps it (§4.3), and the lock is no longer valid.
    generation: u32,
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

/// One record a round fetches.
#[derive(Debug, Clone)]
struct Fetch {
    table: TableId,
    key: Key,
    access: Access,
    /// Whether this transaction holds a lock on it (read or write).
    locked: bool,
    /// Whether that lock is on this CN's table (its CVT may be cached, §4.4).
    local: bool,
    loc: Option<ItemLoc>,
    done: Option<Option<Vec<u8>>>,
}

/// The lock an insert takes on its index bucket (§4.1: the bucket's address is the lock
/// key; its shard by hash, as no critical field names it).
fn bucket_lock(bucket: BucketLoc) -> (u64, u16, LockMode, LockFor) {
    let key = bucket_lock_key(bucket.partition, bucket.offset);
    (
        key,
        Sharding::bucket_shard(key),
        LockMode::Exclusive,
        LockFor::IndexBucket,
    )
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

/// The generation recorded for `key` when its lock request was grouped.
fn generation_of(gens: &[(u64, u32)], key: u64) -> u32 {
    gens.iter().find(|g| g.0 == key).map_or(0, |g| g.1)
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

    /// The lock a record needs in this transaction, if any (§5.1 step 1, §5.2).
    fn lock_mode(&self, access: Access) -> Option<LockMode> {
        match (self.kind, access, self.co.cfg.isolation) {
            (TxnKind::ReadOnly, _, _) => None,
            (_, Access::ForUpdate, _) => Some(LockMode::Exclusive),
            (_, Access::Read, Isolation::Serializable) => Some(LockMode::Shared),
            (_, Access::Read, Isolation::Snapshot) => None,
        }
    }

    /// Whether every lock held is still valid: no hand-over aborted its shard's holders
    /// since it was asked for (§4.3).
    fn locks_valid(&self) -> bool {
        let map = self.co.cluster.map.borrow();
        self.held
            .iter()
            .all(|h| map.generation(h.shard) == h.generation)
    }

    /// Notes this attempt's latency for the CN's load monitor (§4.3).
    fn note_latency(&self) {
        let ns = self.co.ctx.now().saturating_sub(self.begin);
        self.co.local.note_latency(ns);
    }

    fn holds(&self, key: u64, mode: LockMode) -> bool {
        self.held
            .iter()
            .any(|h| h.key == key && (h.mode == LockMode::Exclusive || mode == LockMode::Shared))
    }

    /// Takes every lock of `wanted` (lock key, shard, mode): local ones on this CN's table,
    /// the others in one message per owning CN, all sent before any reply is awaited.
    /// Any refusal (or a CN that does not answer in time) aborts.
    /// Each wanted lock names what it is for ([`LockFor`]), which a refusal is counted
    /// under.
    async fn lock_all(&mut self, wanted: &[(u64, u16, LockMode, LockFor)]) -> Result<(), TxnError> {
        let mut todo: Vec<(u64, u16, LockMode, LockFor)> = Vec::new();
        for &(key, shard, mode, what) in wanted {
            if self.holds(key, mode) {
                continue;
            }
            match todo.iter_mut().find(|t| t.0 == key) {
                Some(t) => t.2 = stronger(t.2, mode),
                None => todo.push((key, shard, mode, what)),
            }
        }
        let holder = self.holder();
        let cluster = Rc::clone(&self.co.cluster);
        if self.co.cfg.rdma_lock {
            return self.lock_idealised(&todo, holder);
        }
        for _ in 0..=self.co.cfg.max_reroutes {
            if todo.is_empty() {
                return Ok(());
            }
            // Group by owner under the current map.
            let mut groups: Vec<(u16, Vec<LockEntry>)> = Vec::new();
            let mut gens: Vec<(u64, u32)> = Vec::new();
            let what_of = |key: u64| {
                todo.iter()
                    .find(|t| t.0 == key)
                    .map_or(LockFor::Mixed, |t| t.3)
            };
            {
                let map = cluster.map.borrow();
                for &(key, shard, mode, _) in &todo {
                    let owner = map.owner(shard);
                    gens.push((key, map.generation(shard)));
                    let e = LockEntry { key, shard, mode };
                    match groups.iter_mut().find(|g| g.0 == owner) {
                        Some(g) => g.1.push(e),
                        None => groups.push((owner, vec![e])),
                    }
                }
            }
            // Remote requests first, so the local work overlaps their round trip.
            if groups.iter().any(|(owner, _)| cluster.is_failed(*owner)) {
                // §6: new transactions asking a failed CN for locks abort at once.
                return Err(TxnError::Aborted(AbortReason::LockOwnerFailed));
            }
            let mut pending: Vec<(u64, u16, Vec<LockEntry>)> = Vec::new();
            for (owner, entries) in &groups {
                if *owner == self.co.cn {
                    continue;
                }
                let server = cluster
                    .server(*owner, self.co.thread)
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
                self.co.ctx.send(server, &req.encode()).await?;
                pending.push((self.co.req, *owner, entries.clone()));
            }
            let mut failed = false;
            let mut rerouted: Vec<(u64, u16, LockMode, LockFor)> = Vec::new();
            if let Some((_, entries)) = groups.iter().find(|g| g.0 == self.co.cn) {
                let local = Arc::clone(&self.co.local);
                for e in entries {
                    self.co.ctx.cpu(cluster.lock_cpu_ns);
                    self.co.stats.local_locks += 1;
                    if !cluster.map.borrow().serves(self.co.cn, e.shard) {
                        rerouted.push((e.key, e.shard, e.mode, what_of(e.key)));
                        continue;
                    }
                    let got = local.acquire(e.key, e.shard, e.mode, holder);
                    if got == Acquired::Granted {
                        local.note_grant(cluster.core);
                    }
                    match got {
                        Acquired::Granted | Acquired::AlreadyHeld => self.held.push(HeldLock {
                            key: e.key,
                            shard: e.shard,
                            owner: self.co.cn,
                            mode: e.mode,
                            word: None,
                            generation: generation_of(&gens, e.key),
                        }),
                        Acquired::Refused(_) => {
                            self.co.stats.refusals += 1;
                            local.note_refused_for(what_of(e.key));
                            failed = true;
                            break;
                        }
                    }
                }
            }
            // Replies.
            let deadline = self.co.ctx.now() + self.co.cfg.rpc_timeout;
            while !pending.is_empty() {
                // A receive error ends the wait like the deadline.
                let Some(msg) = recv_until(&self.co.ctx, deadline).await.ok().flatten() else {
                    break;
                };
                let Ok(reply) = Reply::parse(&msg.payload) else {
                    continue;
                };
                let Some(i) = pending.iter().position(|p| p.0 == reply.req) else {
                    continue; // a late reply of an earlier request
                };
                let (_, owner, entries) = pending.swap_remove(i);
                match reply.status {
                    Status::Granted => {
                        for e in entries {
                            self.held.push(HeldLock {
                                key: e.key,
                                shard: e.shard,
                                owner,
                                mode: e.mode,
                                word: None,
                                generation: generation_of(&gens, e.key),
                            });
                        }
                    }
                    Status::Refused => {
                        self.co.stats.refusals += 1;
                        // The reply does not say which lock was refused: one kind of lock
                        // is counted under it, several as mixed.
                        let mut kinds = entries.iter().map(|e| what_of(e.key));
                        let first = kinds.next().unwrap_or(LockFor::Mixed);
                        let what = if kinds.all(|k| k == first) {
                            first
                        } else {
                            LockFor::Mixed
                        };
                        self.co.local.note_refused_for(what);
                        failed = true;
                    }
                    Status::NotOwner => {
                        rerouted.extend(
                            entries
                                .iter()
                                .map(|e| (e.key, e.shard, e.mode, what_of(e.key))),
                        );
                    }
                }
            }
            if !pending.is_empty() {
                // No answer in time: the locks may be held there; the unlocks sent on abort
                // are idempotent, so send them for everything asked.
                for (_, owner, entries) in pending {
                    for e in entries {
                        self.held.push(HeldLock {
                            key: e.key,
                            shard: e.shard,
                            owner,
                            mode: e.mode,
                            word: None,
                            generation: generation_of(&gens, e.key),
                        });
                    }
                }
                return Err(TxnError::Aborted(AbortReason::LockRequestTimedOut));
            }
            if failed {
                return Err(TxnError::Aborted(AbortReason::LockRefused));
            }
            todo = rerouted;
        }
        Err(TxnError::Aborted(AbortReason::ShardMapKeptChanging))
    }

    /// Fig. 17's idealised RDMA lock: decided on the owner's table at once, counted per CN
    /// (the FAA of a 0 → 1 transition is posted with the record's CVT READ).
    fn lock_idealised(
        &mut self,
        todo: &[(u64, u16, LockMode, LockFor)],
        holder: Holder,
    ) -> Result<(), TxnError> {
        let cluster = Rc::clone(&self.co.cluster);
        for &(key, shard, mode, what) in todo {
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
        let cluster = Rc::clone(&self.co.cluster);
        if self.co.cfg.rdma_lock {
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
            return;
        }
        let mut groups: Vec<(u16, Vec<LockEntry>)> = Vec::new();
        for h in std::mem::take(&mut self.held) {
            if h.owner == self.co.cn {
                self.co.ctx.cpu(cluster.lock_cpu_ns);
                self.co.local.table.release(h.key, holder);
                continue;
            }
            let e = LockEntry {
                key: h.key,
                shard: h.shard,
                mode: h.mode,
            };
            match groups.iter_mut().find(|g| g.0 == h.owner) {
                Some(g) => g.1.push(e),
                None => groups.push((h.owner, vec![e])),
            }
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
            let _ = self.co.ctx.send(server, &req.encode()).await;
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
        let plan = RoundPlan::new(reqs, |r| self.sets.local(r));
        let mut fetches: Vec<Fetch> = plan
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
        let mut wanted = Vec::new();
        for f in &mut fetches {
            if let Some(mode) = self.lock_mode(f.access) {
                wanted.push((
                    record_lock_key(f.table, f.key),
                    self.co.cluster.sharding.shard_of(f.table, f.key),
                    mode,
                    LockFor::Table(f.table.0),
                ));
                f.locked = true;
            }
        }
        // Inserts (§4.1): the index buckets to lock once the keys' locks are held. Not in
        // the same step: two inserters of one key asking for both at once can each get one
        // and be refused the other, again on every retry (LOTUS never waits; two CNs
        // inserting one key livelocked so in the simulator). Only where a slot could be
        // claimed: a pooled table with no room in this coordinator's insert share reads the
        // key as absent under its lock, as below.
        let mut claims: Vec<(usize, BucketLoc)> = Vec::new();
        if insert {
            for (n, f) in fetches.iter().enumerate() {
                if f.access != Access::ForUpdate || f.loc.is_some() {
                    continue;
                }
                let bucket = self
                    .co
                    .store
                    .bucket_of(f.table, f.key)
                    .map_err(TxnError::from)?;
                if self
                    .co
                    .inserts
                    .next(&self.co.store, self.co.id, bucket, 0)
                    .is_ok()
                {
                    claims.push((n, bucket));
                }
            }
        }
        self.lock_all(&wanted).await?;
        let mut cached: Vec<Option<Meta>> = vec![None; fetches.len()];
        for (n, f) in fetches.iter_mut().enumerate() {
            if !f.locked {
                continue;
            }
            let key = record_lock_key(f.table, f.key);
            f.local = self
                .held
                .iter()
                .any(|h| h.key == key && h.owner == self.co.cn);
            if f.local && self.co.cfg.vt_cache && !self.co.cfg.rdma_lock {
                let vt = &self.co.local.vt;
                if let Some((loc, meta)) = vt.get(key) {
                    f.loc = Some(loc);
                    cached[n] = Some(meta);
                    self.co.stats.vt_hits += 1;
                }
            }
        }

        // -- 2a. locate: one bucket READ per uncached record (an insert's under its lock) --
        if !claims.is_empty() {
            self.claim_slots(&mut fetches, &claims).await?;
        }
        let uncached: Vec<_> = fetches
            .iter()
            .enumerate()
            .filter(|(_, f)| f.loc.is_none() && f.done.is_none())
            .map(|(n, f)| (n, f.table, f.key))
            .collect();
        let found = exec::locate(&self.co.ctx, &self.co.store, &self.co.cache, &uncached).await?;
        {
            let mut inserts = Vec::new();
            for (n, bucket, lookup) in found {
                let f = &mut fetches[n];
                match lookup {
                    Lookup::Found(loc) => f.loc = Some(loc),
                    // In a pooled table with no room in this coordinator's insert share
                    // (a table that does not grow has none) the key is read as absent
                    // under its write lock instead: no block to claim, and an update or
                    // delete of it fails as on any absent key.
                    Lookup::Absent { .. }
                        if f.access == Access::ForUpdate
                            && self
                                .co
                                .inserts
                                .next(&self.co.store, self.co.id, bucket, 0)
                                .is_ok() =>
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
                self.claim_slots(&mut fetches, &inserts).await?;
            }
        }

        // -- 2b/3. CVTs, then the images --
        let mut rereads = 0;
        loop {
            let pending: Vec<usize> = (0..fetches.len())
                .filter(|&n| fetches[n].done.is_none())
                .collect();
            if pending.is_empty() {
                break;
            }
            let mut list = PostList::new();
            let mut wrs = Vec::new();
            for &n in &pending {
                let f = &fetches[n];
                let Some(loc) = f.loc else { continue };
                let shape = self.shape(f.table)?;
                if self.co.cfg.rdma_lock && f.locked {
                    let key = record_lock_key(f.table, f.key);
                    let word = self.primary(&loc, 0)?;
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
                }
                let rd = if cached[n].is_some() {
                    None
                } else {
                    Some(list.read(self.primary(&loc, 0)?, shape.meta_len() as u32))
                };
                wrs.push((n, loc, shape, rd));
            }
            let res = if list.is_empty() {
                None
            } else {
                Some(self.co.ctx.post(list).await?)
            };
            let mut images = Vec::new();
            for &(n, loc, shape, rd) in &wrs {
                let f = &fetches[n];
                let (table, key, locked, for_update) =
                    (f.table, f.key, f.locked, f.access == Access::ForUpdate);
                let meta = match (rd, &res) {
                    (Some(rd), Some(res)) => Meta::parse(res.bytes(rd), shape),
                    _ => cached[n].take(),
                };
                let Some(mut meta) = meta else {
                    return Err(TxnError::Aborted(AbortReason::UnreadableVersionTable));
                };
                // LOTUS keeps no lock in the block (only the idealised RDMA lock counts there).
                meta.lock = 0;
                if f.local
                    && self.co.cfg.vt_cache
                    && !self.co.cfg.rdma_lock
                    && rd.is_some()
                    && meta.is_consistent()
                {
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
                let committing = meta
                    .cells
                    .iter()
                    .any(|c| c.is_valid() && c.commit_version() == INVISIBLE);
                let outcome = if committing && !locked {
                    MetaOutcome::Retry
                } else {
                    // Under our lock no writer is between its INVISIBLE and visible WRITEs
                    // (recovery decides a failed one's before its locks go), so a locked
                    // read picks among committed versions as §5.1 says.
                    // Locked records abort on a newer version (§5.1 step 3); unlocked ones
                    // read the snapshot.
                    logic::after_meta(&meta, self.start, locked, false)
                };
                match outcome {
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
            if !images.is_empty() {
                // Full records (§4.4): one image READ per version.
                let read = exec::read_versions(&self.co.ctx, &self.co.store, images).await?;
                for (n, _, version, payload) in read {
                    let (table, key, locked) =
                        (fetches[n].table, fetches[n].key, fetches[n].locked);
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
            }
            if fetches.iter().any(|f| f.done.is_none()) {
                // Writes of a for-update record were noted once; a retry only happens for
                // unlocked reads, which have no write entry.
                rereads += 1;
                self.co.stats.rereads += 1;
                if rereads > self.co.cfg.max_rereads {
                    return Err(TxnError::Aborted(
                        AbortReason::VersionStayedUncommittedOrTorn,
                    ));
                }
                self.co.ctx.sleep(self.co.cfg.reread_pause).await;
            }
        }
        Ok(plan.values(|n| fetches[n].done.clone().flatten()))
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
            let (used, _) = parse_bucket(res.bytes(wr));
            let f = &mut fetches[n];
            let (loc, fresh) = match used.iter().find(|(_, k)| *k == f.key.0) {
                Some(&(slot, _)) => (
                    self.co
                        .store
                        .item_in_bucket(bucket, slot, res.bytes(wr))
                        .map_err(TxnError::from)?,
                    false,
                ),
                None => {
                    let free = (0..bucket.slot_count()).find(|s| {
                        !used.iter().any(|(u, _)| u == s) && !taken.contains(&(bucket.offset, *s))
                    });
                    let Some(slot) = free else {
                        return Err(TxnError::Aborted(AbortReason::IndexBucketFull));
                    };
                    taken.push((bucket.offset, slot));
                    // The slot's fixed block, or for a pooled table the next block of this
                    // coordinator's insert share (no verb: the share is its own). The
                    // bucket's lock orders inserts into the slot, so no CAS is needed.
                    let loc = self
                        .co
                        .inserts
                        .next(&self.co.store, self.co.id, bucket, slot)
                        .map_err(TxnError::from)?;
                    self.co.inserts.claimed(&self.co.store, bucket);
                    logic::claim_slot(
                        &self.co.store,
                        &mut slots,
                        bucket,
                        slot,
                        loc.offset,
                        f.key.0,
                    )?;
                    (loc, true)
                }
            };
            self.co.cache.borrow_mut().put(f.table, f.key, loc);
            f.loc = Some(loc);
            if fresh {
                // A slot never used before: its block holds no version (slots are never
                // freed), so the key is absent and its meta need not be read. Whatever a
                // crashed inserter left there is overwritten whole at commit (the meta's key
                // is not ours).
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
        }
        if !slots.is_empty() {
            // Unsignaled: the slot WRITEs land before this transaction's commit WRITEs to
            // the same replicas (in-order queue pairs); until then the key reads as absent,
            // which it is.
            self.co.ctx.post_detached(slots).await?;
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
        // shards are served again.
        let owners: Vec<u16> = {
            let mut o: Vec<u16> = self.held.iter().map(|h| h.owner).collect();
            o.sort_unstable();
            o.dedup();
            o
        };
        if owners.iter().any(|&o| self.co.cluster.is_failed(o)) {
            return Err(TxnError::Aborted(AbortReason::LockOwnerFailedBeforeCommit));
        }
        // §4.3: a hand-over that aborted a shard's holders took their locks away.
        if !self.locks_valid() {
            return Err(TxnError::Aborted(AbortReason::LockShardWasHandedOver));
        }
        let txn = self.holder().txn;
        let _committing = Committing::enter(Rc::clone(&self.co.cluster), owners, txn);
        // (1) Write data & log: images and INVISIBLE cells to every replica, the log.
        let horizon = self.co.ts.horizon(self.co.cfg.gc_threshold);
        let writer = pack_writer(self.id);
        let mut data: Vec<(RemoteAddr, Vec<u8>)> = Vec::new();
        let mut installed = Vec::new();
        let mut logged = Vec::new();
        let mut plans = Vec::new();
        for w in &self.sets.writes {
            if w.op.is_none() {
                continue;
            }
            let shape = self.shape(w.table)?;
            // Full records (§4.4): the image, then the cell with version INVISIBLE.
            let Some(new) = w.new_version(shape, INVISIBLE, horizon, writer) else {
                continue;
            };
            exec::install_writes(self.store(), w.loc, shape, &new, |addr, bytes| {
                data.push((addr, bytes.to_vec()));
            });
            let (plan, kind) = (new.plan, new.kind);
            logged.push(LogEntry {
                table: w.table,
                partition: w.loc.bucket.partition,
                cell: plan.cell as u16,
                offset: w.loc.offset,
            });
            installed.push((w.table, w.key, w.loc, shape, plan.cell, kind));
            plans.push(plan);
        }
        // The log goes first on every MN's queue pair, so an INVISIBLE cell never lands
        // without it (see `crate::recovery`).
        let log = encode_log(writer, &logged);
        let mut list = PostList::new();
        let at = self
            .store()
            .log_offset(self.co.id)
            .map_err(|_| TxnError::Aborted(AbortReason::NoLogRegion))?;
        if log.len() > self.store().log_region_bytes() {
            return Err(TxnError::Aborted(AbortReason::CommitLogLargerThanLogRegion));
        }
        for mn in 0..self.store().config().mns {
            if self.store().live_replicas(mn).contains(&mn) {
                list.write(self.store().addr(mn, at), &log);
            }
        }
        for (addr, bytes) in data {
            list.write_owned(addr, bytes);
        }
        self.co.ctx.mark_phase(Phase::WriteInvisible);
        self.co.ctx.post(list).await?;
        // (2) Commit timestamp (with the service's commit-wait).
        let c = self.co.ts.commit_ts().await;
        let events: Vec<WriteEvent> = installed
            .iter()
            .map(|&(table, key, _, _, _, kind)| WriteEvent {
                table,
                key,
                version: Version(c),
                kind,
            })
            .collect();
        let id = self.id;
        let end = self.co.ctx.now();
        let record = self
            .sets
            .take_record(id, self.begin, end, TxnOutcome::Unknown, events);
        self.co.history.record(record);
        // (3) Write visible: the commit version into every new cell.
        let mut list = PostList::new();
        for &(_, _, loc, shape, cell, _) in &installed {
            let o = shape.cell_offset(cell) + CvtCell::VERSION_OFFSET;
            for mn in self.store().live_replicas(loc.bucket.partition) {
                list.write(
                    self.store().addr(mn, loc.offset + o as u64),
                    &c.to_le_bytes(),
                );
            }
        }
        self.co.ctx.mark_phase(Phase::WriteVisible);
        self.co.ctx.post(list).await?;
        self.co
            .history
            .resolve(id, TxnOutcome::Committed, self.co.ctx.now());
        self.co.stats.committed += 1;
        if self.co.cfg.vt_cache && !self.co.cfg.rdma_lock {
            // §4.4: a local writer keeps the cached CVTs of its locally locked records.
            let vt = &self.co.local.vt;
            for (&(table, key, loc, _, cell, _), plan) in installed.iter().zip(plans) {
                let lock = record_lock_key(table, key);
                if !self
                    .held
                    .iter()
                    .any(|h| h.key == lock && h.owner == self.co.cn)
                {
                    continue;
                }
                let mut cells = plan.cells;
                cells[cell] = cells[cell].with_commit_version(c);
                vt.put(
                    lock,
                    self.co.cluster.sharding.shard_of(table, key),
                    loc,
                    Meta {
                        lock: 0,
                        floor: plan.floor,
                        key: key.0,
                        cells,
                    },
                );
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

//! The CN side of lock disaggregation (LOTUS §4.1): each CN's lock table and the lock
//! service that serves other CNs' requests over two-sided messages.
//!
//! * [`CnLocks`]: one CN's [`LotusLockTable`], VT cache and statistics. `Sync`: a CN
//!   process on several cores holds **one** `Arc<CnLocks>` that every core's coordinators
//!   and lock servers use (§4.1: the table is shared by the CN's cores, locked with CPU
//!   CAS); its bookkeeping is atomics and per-shard mutexes, never held across an `.await`.
//! * [`LockCluster`]: what every coordinator knows about the others: each CN's table
//!   (a coordinator touches only its own CN's directly), the shard map (the routing layer's
//!   cached copy is the same map in the simulator), and the endpoints of the lock servers:
//!   server `t` of CN `c` runs on thread `t` of CN `c`, and the coordinators of thread `t`
//!   send to it (LOTUS §4.1: the i-th coordinator of one CN talks to the i-th of another).
//! * [`serve`]: a lock server's loop: receive a request, check that every shard is owned,
//!   take (or release) every lock on the table, charge the CN core the lock work, reply.
//!   A lock request is all or nothing: a refusal releases what the same message got.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dmem_locks::LockMode;
pub use dmem_locks::lotus::Refusal;
use dmem_locks::lotus::{Acquired, Holder, LotusLockTable};
use dmem_verbs::sync::lock_ignoring_poison;
use dmem_verbs::{Clock, Endpoint, Nanos, Verbs};

use crate::restart::Restart;
use crate::shard::{SHARDS, ShardMap, Sharding};
use crate::vtcache::VtCache;
use crate::wire::{Reply, Request, RequestKind, Status};

/// The most cores of one CN whose lock grants are counted apart (a core numbered higher
/// counts as the last).
pub const MAX_CORES: usize = 64;

/// A lock server's counters: messages served, lock requests granted, refused.
#[derive(Debug, Default)]
pub struct Served {
    messages: AtomicU64,
    granted: AtomicU64,
    refused: AtomicU64,
}

impl Served {
    /// `(messages, granted, refused)` so far.
    #[must_use]
    pub fn get(&self) -> (u64, u64, u64) {
        (
            self.messages.load(Ordering::Relaxed),
            self.granted.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }

    fn note(&self, granted: bool, refused: bool) {
        self.messages.fetch_add(1, Ordering::Relaxed);
        self.granted
            .fetch_add(u64::from(granted), Ordering::Relaxed);
        self.refused
            .fetch_add(u64::from(refused), Ordering::Relaxed);
    }
}

/// The sum of `counters` but the one of `core` (a core numbered past [`MAX_CORES`]
/// counts as the last).
fn off_core(counters: &[AtomicU64], core: u16) -> u64 {
    let all: u64 = counters.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    all - counters[usize::from(core).min(MAX_CORES - 1)].load(Ordering::Relaxed)
}

/// What a refused lock was for, as the coordinator that asked counts it
/// ([`CnLocks::note_refused_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockFor {
    /// A record of this table (ids at or above [`REFUSAL_TABLES`] count as the last).
    Table(u32),
    /// An index bucket an insert claims a slot in (§4.1).
    IndexBucket,
    /// A remote request whose locks were for several of the above: the owner's reply does
    /// not say which one it refused.
    Mixed,
}

/// Tables whose refusals are counted apart ([`LockFor::Table`]).
pub const REFUSAL_TABLES: usize = 16;

/// The prefix of the counters of refusals met for locks on a table's records
/// (`lotus_refused_table_<id>`, [`LockFor::Table`]; [`CnLocks::refusal_counter`]).
pub const REFUSED_TABLE: &str = "lotus_refused_table_";

/// The refusal counters [`CnLocks::refusal_counter`] gives besides the per-table ones.
pub const REFUSAL_COUNTERS: [&str; 5] = [
    "lotus_refused_conflict",
    "lotus_refused_bucket_full",
    "lotus_refused_readers",
    "lotus_refused_index_bucket",
    "lotus_refused_mixed_remote",
];

/// The refusal reasons [`CnLocks`] counts, in its counters' order.
pub const REFUSAL_REASONS: [Refusal; 4] = [
    Refusal::Conflict,
    Refusal::BucketFull,
    Refusal::TooManyReaders,
    Refusal::Fenced,
];

/// One CN's locks: what its cores share (module docs).
#[derive(Debug)]
pub struct CnLocks {
    /// The CN's index (0..cns).
    pub cn: u16,
    /// Its lock table.
    pub table: LotusLockTable,
    /// Requests served, locks granted and refused (statistics).
    pub served: Served,
    /// The CN's version table cache (§4.4), one for all its cores.
    pub vt: VtCache,
    /// Per lock key, this CN's holders (the idealised RDMA lock of §8.4 Fig. 17).
    pub counts: Mutex<HashMap<u64, u32>>,
    /// Latency of the transactions this CN's coordinators finished since the load monitor
    /// last looked: (sum ns, count) (§4.3's metric).
    pub latency: Mutex<(u64, u64)>,
    /// Lock requests per shard on this table since the load monitor last looked (§4.3:
    /// the hottest shard is chosen "based on recent request rates"), indexed by shard.
    pub shard_hits: Box<[AtomicU64]>,
    /// Per shard, the lock keys granted on this table that may still be held (pruned when
    /// looked at): what a hand-over drains. One mutex per shard, so that cores locking
    /// different shards do not meet.
    shard_keys: Box<[Mutex<HashSet<u64>>]>,
    /// Lock requests granted on this table, by the core of the CN that took them (its
    /// coordinators' local locks, its lock servers' grants): [`MAX_CORES`] counters.
    grants_by_core: Box<[AtomicU64]>,
    /// Lock-server messages served, by the core of the CN whose server took them:
    /// [`MAX_CORES`] counters.
    served_by_core: Box<[AtomicU64]>,
    /// Requests refused on this table, by [`REFUSAL_REASONS`] (Alg. 1 line 10).
    refused_by_reason: [AtomicU64; 4],
    /// Refusals this CN's coordinators met, by what the lock was for: one per table
    /// ([`REFUSAL_TABLES`]), then index buckets, then mixed remote requests.
    refused_for: Box<[AtomicU64]>,
}

impl CnLocks {
    /// A CN with a table of `table_bytes` bytes of slots.
    #[must_use]
    pub fn new(cn: u16, table_bytes: usize) -> Self {
        Self {
            cn,
            table: LotusLockTable::with_bytes(table_bytes, 64),
            served: Served::default(),
            vt: VtCache::new(64 * 1024, 16),
            counts: Mutex::new(HashMap::new()),
            latency: Mutex::new((0, 0)),
            shard_hits: (0..SHARDS).map(|_| AtomicU64::new(0)).collect(),
            shard_keys: (0..SHARDS).map(|_| Mutex::new(HashSet::new())).collect(),
            grants_by_core: (0..MAX_CORES).map(|_| AtomicU64::new(0)).collect(),
            served_by_core: (0..MAX_CORES).map(|_| AtomicU64::new(0)).collect(),
            refused_by_reason: Default::default(),
            refused_for: (0..REFUSAL_TABLES + 2).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Requests refused on this table for `reason` so far.
    #[must_use]
    pub fn refused(&self, reason: Refusal) -> u64 {
        REFUSAL_REASONS
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.refused_by_reason[i].load(Ordering::Relaxed))
    }

    fn refused_index(what: LockFor) -> usize {
        match what {
            LockFor::Table(t) => (t as usize).min(REFUSAL_TABLES - 1),
            LockFor::IndexBucket => REFUSAL_TABLES,
            LockFor::Mixed => REFUSAL_TABLES + 1,
        }
    }

    /// Counts a refusal one of this CN's coordinators met for a lock on `what`.
    pub fn note_refused_for(&self, what: LockFor) {
        self.refused_for[Self::refused_index(what)].fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals this CN's coordinators met for locks on `what` so far.
    #[must_use]
    pub fn refused_for(&self, what: LockFor) -> u64 {
        self.refused_for[Self::refused_index(what)].load(Ordering::Relaxed)
    }

    /// A refusal counter of this CN by name (`dmem bench` and the CN processes report
    /// these): requests refused on its table by Alg. 1's reason (`lotus_refused_conflict`,
    /// `lotus_refused_bucket_full`, `lotus_refused_readers`: always `Some`), and refusals
    /// its coordinators met by what the lock was for (`lotus_refused_index_bucket`,
    /// `lotus_refused_mixed_remote`, `lotus_refused_table_<id>`: `Some` only where some);
    /// `None` for any other name.
    #[must_use]
    pub fn refusal_counter(&self, name: &str) -> Option<u64> {
        let for_what = |what| Some(self.refused_for(what)).filter(|&n| n > 0);
        match name {
            "lotus_refused_conflict" => Some(self.refused(Refusal::Conflict)),
            "lotus_refused_bucket_full" => Some(self.refused(Refusal::BucketFull)),
            "lotus_refused_readers" => Some(self.refused(Refusal::TooManyReaders)),
            "lotus_refused_index_bucket" => for_what(LockFor::IndexBucket),
            "lotus_refused_mixed_remote" => for_what(LockFor::Mixed),
            _ => {
                let table = name.strip_prefix(REFUSED_TABLE)?.parse().ok()?;
                for_what(LockFor::Table(table))
            }
        }
    }

    /// Every refusal counter of this CN that [`refusal_counter`](Self::refusal_counter)
    /// gives, by name.
    #[must_use]
    pub fn refusal_counters(&self) -> Vec<(String, u64)> {
        let tables = (0..REFUSAL_TABLES).map(|t| format!("{REFUSED_TABLE}{t}"));
        REFUSAL_COUNTERS
            .iter()
            .map(|&n| n.to_owned())
            .chain(tables)
            .filter_map(|name| Some((name.clone(), self.refusal_counter(&name)?)))
            .collect()
    }

    /// Alg. 1 on this CN's table for a record of `shard`, remembering the key under its
    /// shard and counting the request for the load monitor.
    pub fn acquire(&self, key: u64, shard: u16, mode: LockMode, holder: Holder) -> Acquired {
        let index = usize::from(shard) % SHARDS;
        self.shard_hits[index].fetch_add(1, Ordering::Relaxed);
        let got = self.table.acquire(key, mode, holder);
        match got {
            Acquired::Granted | Acquired::AlreadyHeld => {
                lock_ignoring_poison(&self.shard_keys[index]).insert(key);
            }
            Acquired::Refused(why) => {
                if let Some(i) = REFUSAL_REASONS.iter().position(|r| *r == why) {
                    self.refused_by_reason[i].fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        got
    }

    /// Counts a grant on this table taken on `core` of the CN.
    pub fn note_grant(&self, core: u16) {
        self.grants_by_core[usize::from(core).min(MAX_CORES - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// Grants taken on `core` of the CN ([`note_grant`](Self::note_grant)).
    #[must_use]
    pub fn grants_on_core(&self, core: u16) -> u64 {
        self.grants_by_core[usize::from(core).min(MAX_CORES - 1)].load(Ordering::Relaxed)
    }

    /// Grants taken on every core of the CN but `core`.
    #[must_use]
    pub fn grants_off_core(&self, core: u16) -> u64 {
        off_core(&self.grants_by_core, core)
    }

    /// Lock-server messages served on every core of the CN but `core` (a CN process runs
    /// the `i`-th server on the core of its `i`-th coordinator).
    #[must_use]
    pub fn served_off_core(&self, core: u16) -> u64 {
        off_core(&self.served_by_core, core)
    }

    /// The locks of `shard` held on this table: (lock key, holder) pairs. Keys no longer
    /// held are forgotten.
    #[must_use]
    pub fn holders_in(&self, shard: u16) -> Vec<(u64, Holder)> {
        let mut set = lock_ignoring_poison(&self.shard_keys[usize::from(shard) % SHARDS]);
        let mut out = Vec::new();
        set.retain(|&k| {
            let h = self.table.holders(k);
            out.extend(h.iter().map(|&(holder, _)| (k, holder)));
            !h.is_empty()
        });
        out.sort_unstable();
        out
    }

    /// Empties the table as a restarted CN finds it (§6: the lock table is ephemeral and not
    /// rebuilt): every holder's locks released, the VT cache and the per-shard bookkeeping
    /// dropped. Returns the locks the old incarnation's table still held.
    pub fn reset(&self, cns: u16) -> usize {
        let held = (0..cns).map(|c| self.table.release_cn(c)).sum();
        self.vt.clear();
        lock_ignoring_poison(&self.counts).clear();
        self.clear_shard_hits();
        for keys in &self.shard_keys {
            lock_ignoring_poison(keys).clear();
        }
        held
    }

    /// Forgets the lock requests counted per shard (the load monitor looked at them).
    pub fn clear_shard_hits(&self) {
        for hits in &self.shard_hits {
            hits.store(0, Ordering::Relaxed);
        }
    }

    /// Notes a finished transaction's latency (§4.3's metric).
    pub fn note_latency(&self, ns: u64) {
        let mut l = lock_ignoring_poison(&self.latency);
        *l = (l.0.saturating_add(ns), l.1 + 1);
    }

    /// The latency noted since the last call: (sum ns, count), then zero.
    pub fn take_latency(&self) -> (u64, u64) {
        std::mem::take(&mut *lock_ignoring_poison(&self.latency))
    }
}

/// The lock service of the whole cluster as every coordinator sees it.
#[derive(Debug)]
pub struct LockCluster {
    /// Per CN, indexed by CN in the simulator; a CN process's holds its own table only
    /// ([`LockCluster::table`] finds a CN's), shared with its other cores' clusters.
    pub cns: Vec<Arc<CnLocks>>,
    /// The core of its CN this view of the cluster is used on (0 in the simulator, whose
    /// CN is one thread; a CN process on several cores makes one view per core, sharing
    /// its table): which [`CnLocks::note_grant`] counter its grants go to.
    pub core: u16,
    /// Lock server endpoints, `[cn][thread]` (a restarted CN's servers are new).
    pub servers: RefCell<Vec<Vec<Endpoint>>>,
    /// The shard-to-CN map.
    pub map: Rc<RefCell<ShardMap>>,
    /// Key to shard.
    pub sharding: Sharding,
    /// CPU a CN core spends on one lock or unlock (hash, bucket scan, CAS, lock state).
    pub lock_cpu_ns: Nanos,
    /// CNs the membership service declared failed (LOTUS §6): no lock is asked of them, and
    /// a transaction holding one of their locks aborts unless it is already committing.
    pub failed: RefCell<Vec<u16>>,
    /// Per CN, transactions in their commit phase that hold locks of that CN: recovery waits
    /// for them before the CN's shards are served again.
    pub committing: RefCell<Vec<u32>>,
    /// Transactions (packed ids) in their commit phase: a hand-over waits for their locks
    /// instead of taking them away (§4.3).
    pub committing_txns: RefCell<HashSet<u64>>,
    /// Hand-overs done (§4.3), in order.
    pub handovers: RefCell<Vec<HandoverEvent>>,
    /// Per CN, its failure and restart (§6): a CN serves lock requests only in
    /// [`Phase::Serving`](crate::restart::Phase::Serving).
    pub restarts: RefCell<Vec<Restart>>,
    /// Per failed CN, locks of it the survivors released on recovery's notice (§6).
    pub released: RefCell<Vec<u64>>,
    /// Whether a CN this cluster's own table fences counts as failed
    /// ([`is_failed`](Self::is_failed)): in a CN process, where the failure notice reaches
    /// only the lock server and the fence in the table every core shares is the process's
    /// view of the failure (§6 across processes).
    pub fence_is_failure: bool,
}

impl LockCluster {
    /// A cluster of `cns` (their locks and servers) over `map`.
    #[must_use]
    pub fn new(
        cns: Vec<Arc<CnLocks>>,
        servers: Vec<Vec<Endpoint>>,
        map: Rc<RefCell<ShardMap>>,
        sharding: Sharding,
        lock_cpu_ns: Nanos,
    ) -> Self {
        let n = cns.len();
        Self {
            cns,
            core: 0,
            servers: RefCell::new(servers),
            map,
            sharding,
            lock_cpu_ns,
            failed: RefCell::new(Vec::new()),
            committing: RefCell::new(vec![0; n]),
            committing_txns: RefCell::new(HashSet::new()),
            handovers: RefCell::new(Vec::new()),
            restarts: RefCell::new(vec![Restart::new(false); n]),
            released: RefCell::new(vec![0; n]),
            fence_is_failure: false,
        }
    }

    /// The lock service as one CN process of a real cluster sees it (§4.1 across
    /// processes): only its own CN's table `own` (the other `cns - 1` tables live in the
    /// other processes and are reached only through their lock servers, `servers`), the
    /// static shard map of `cns` CNs (no resharding across processes), nobody failed. A CN
    /// process on several cores makes one per core, each with the same `own` and its
    /// `core`.
    #[must_use]
    pub fn of_process(
        own: Arc<CnLocks>,
        core: u16,
        cns: u16,
        servers: Vec<Vec<Endpoint>>,
        sharding: Sharding,
        lock_cpu_ns: Nanos,
    ) -> Self {
        let mut cluster = Self::new(
            vec![own],
            servers,
            Rc::new(RefCell::new(ShardMap::new(cns))),
            sharding,
            lock_cpu_ns,
        );
        let n = usize::from(cns);
        cluster.committing = RefCell::new(vec![0; n]);
        cluster.restarts = RefCell::new(vec![Restart::new(false); n]);
        cluster.released = RefCell::new(vec![0; n]);
        cluster.core = core;
        cluster.fence_is_failure = true;
        cluster
    }

    /// CN `cn`'s table, if this cluster holds it: every CN's in the simulator, only its
    /// own in a CN process ([`of_process`](Self::of_process)).
    #[must_use]
    pub fn table(&self, cn: u16) -> Option<&Arc<CnLocks>> {
        match self.cns.get(usize::from(cn)) {
            Some(c) if c.cn == cn => Some(c),
            _ => self.cns.iter().find(|c| c.cn == cn),
        }
    }

    /// Whether CN `cn` serves lock requests now (§6: not between its failure and the
    /// broadcast of its restarted incarnation).
    #[must_use]
    pub fn serves(&self, cn: u16) -> bool {
        self.restarts
            .borrow()
            .get(usize::from(cn))
            .is_none_or(Restart::serves)
    }

    /// Whether CN `cn` was declared failed: on the failed list, or, in a CN process
    /// ([`fence_is_failure`](Self::fence_is_failure)), fenced by this CN's own table (its
    /// lock server got the failure notice).
    #[must_use]
    pub fn is_failed(&self, cn: u16) -> bool {
        self.failed.borrow().contains(&cn)
            || (self.fence_is_failure && self.cns.iter().any(|c| c.table.is_fenced(cn)))
    }

    /// The server endpoint a coordinator on thread `thread` uses to reach CN `cn`.
    #[must_use]
    pub fn server(&self, cn: u16, thread: u16) -> Option<Endpoint> {
        let servers = self.servers.borrow();
        let row = servers.get(usize::from(cn))?;
        row.get(usize::from(thread) % row.len().max(1)).copied()
    }
}

/// Applies a lock request to `locks` (the decisions of a server, without messaging):
/// all or nothing. Returns the status and how many lock operations it performed.
#[must_use]
pub fn apply(locks: &CnLocks, map: &ShardMap, req: &Request) -> (Status, u64) {
    apply_on(locks, map, req, 0)
}

/// [`apply`] by a server on `core` of its CN (its grants counted there).
#[must_use]
pub fn apply_on(locks: &CnLocks, map: &ShardMap, req: &Request, core: u16) -> (Status, u64) {
    let holder = Holder {
        txn: req.txn,
        cn: req.cn,
    };
    match req.kind {
        RequestKind::Unlock => {
            for e in &req.entries {
                locks.table.release(e.key, holder);
            }
            (Status::Granted, req.entries.len() as u64)
        }
        // Hand-overs change the map, recovery's notices the cluster's state: `serve`
        // applies them ([`receive_handover`], `membership`).
        RequestKind::Handover | RequestKind::Release | RequestKind::Rejoin => (Status::Refused, 0),
        RequestKind::Lock => {
            if req.entries.iter().any(|e| !map.serves(locks.cn, e.shard)) {
                return (Status::NotOwner, 0);
            }
            let mut granted = Vec::new();
            let mut ops = 0;
            for e in &req.entries {
                ops += 1;
                match locks.acquire(e.key, e.shard, e.mode, holder) {
                    Acquired::Granted => {
                        locks.note_grant(core);
                        if e.mode == LockMode::Exclusive {
                            // Alg. 1 line 15: a remote writer will change the CVT.
                            locks.vt.invalidate(e.key);
                        }
                        granted.push(e.key);
                    }
                    Acquired::AlreadyHeld => {}
                    Acquired::Refused(_) => {
                        for k in granted {
                            ops += 1;
                            locks.table.release(k, holder);
                        }
                        return (Status::Refused, ops);
                    }
                }
            }
            (Status::Granted, ops)
        }
    }
}

/// A lock server on `ctx` (a context on thread `t` of the CN `locks` belongs to, on core
/// `cluster.core` of it): serves requests until its context fails (the CN crashed).
pub async fn serve<V: Verbs + Clock>(ctx: V, cluster: Rc<LockCluster>, locks: Arc<CnLocks>) {
    loop {
        let Ok(msg) = ctx.recv().await else {
            return;
        };
        let Ok(req) = Request::parse(&msg.payload) else {
            continue;
        };
        if matches!(req.kind, RequestKind::Release | RequestKind::Rejoin) {
            // §6 control messages (`membership`): one lock-table operation per lock
            // released, at least one for the fence.
            let ops = if req.kind == RequestKind::Release {
                locks.table.fence(req.cn);
                let n = locks.table.release_cn(req.cn);
                if let Some(r) = cluster.released.borrow_mut().get_mut(usize::from(req.cn)) {
                    *r += n as u64;
                }
                n as u64
            } else {
                locks.table.unfence(req.cn);
                0
            };
            ctx.cpu(ops.max(1) * cluster.lock_cpu_ns);
            let reply = Reply {
                req: req.req,
                status: Status::Granted,
            };
            let _ = ctx.send(msg.from, &reply.emit()).await;
            continue;
        }
        if req.kind == RequestKind::Handover {
            receive_handover(&cluster, &locks, &req, ctx.now());
            let reply = Reply {
                req: req.req,
                status: Status::Granted,
            };
            let _ = ctx.send(msg.from, &reply.emit()).await;
            continue;
        }
        let (status, ops) = if req.kind == RequestKind::Lock && !cluster.serves(locks.cn) {
            // §6: a restarted CN refuses until it has broadcast that its old transactions
            // are finished.
            (Status::Refused, 0)
        } else {
            apply_on(&locks, &cluster.map.borrow(), &req, cluster.core)
        };
        ctx.cpu(ops * cluster.lock_cpu_ns);
        locks.served_by_core[usize::from(cluster.core).min(MAX_CORES - 1)]
            .fetch_add(1, Ordering::Relaxed);
        locks.served.note(
            status == Status::Granted && req.kind == RequestKind::Lock,
            status == Status::Refused,
        );
        if req.kind == RequestKind::Lock {
            let reply = Reply {
                req: req.req,
                status,
            };
            let _ = ctx.send(msg.from, &reply.emit()).await;
        }
    }
}

/// A mode that covers both `a` and `b`.
#[must_use]
pub fn stronger(a: LockMode, b: LockMode) -> LockMode {
    if a == LockMode::Exclusive || b == LockMode::Exclusive {
        LockMode::Exclusive
    } else {
        LockMode::Shared
    }
}

/// One hand-over as the receiver saw it complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandoverEvent {
    /// The shard.
    pub shard: u16,
    /// The sender.
    pub from: u16,
    /// The receiver.
    pub to: u16,
    /// When the sender stopped serving the shard.
    pub stopped_at: Nanos,
    /// When the receiver started serving it.
    pub served_at: Nanos,
    /// Lock-state entries the sender took from their holders after the drain timeout.
    pub aborted_holders: u64,
    /// Locks of the shard still held on the sender's table when the receiver began to
    /// serve it: each is a lock two CNs may grant at once. Zero unless the drain is
    /// skipped (the planted bug).
    pub holders_left: u64,
}

impl HandoverEvent {
    /// The service interruption: nobody served the shard for this long.
    #[must_use]
    pub fn interruption(&self) -> Nanos {
        self.served_at.saturating_sub(self.stopped_at)
    }
}

/// The receiver's side (§4.3): clear its cache entries of the shards, serve them, record
/// the hand-over. Idempotent (a repeated message changes nothing more).
pub fn receive_handover(cluster: &LockCluster, locks: &CnLocks, req: &Request, now: Nanos) {
    for e in &req.entries {
        let mut map = cluster.map.borrow_mut();
        if map.serves(locks.cn, e.shard) {
            continue;
        }
        locks.vt.clear_shard(e.shard);
        map.finish_move(e.shard, locks.cn);
        let holders_left = cluster
            .cns
            .get(usize::from(req.cn))
            .map_or(0, |from| from.holders_in(e.shard).len() as u64);
        cluster.handovers.borrow_mut().push(HandoverEvent {
            shard: e.shard,
            from: req.cn,
            to: locks.cn,
            stopped_at: req.txn,
            served_at: now,
            aborted_holders: 0,
            holders_left,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::LockEntry;

    fn req(kind: RequestKind, txn: u64, cn: u16, keys: &[(u64, u16, LockMode)]) -> Request {
        Request {
            kind,
            cn,
            req: txn,
            txn,
            entries: keys
                .iter()
                .map(|&(key, shard, mode)| LockEntry { key, shard, mode })
                .collect(),
        }
    }

    #[test]
    fn refusals_are_counted_by_reason_and_by_what_they_were_for() {
        let map = ShardMap::new(3);
        // One bucket: a ninth key finds it full.
        let cn1 = CnLocks::new(1, LotusLockTable::BUCKET_BYTES);
        let (x, s) = (LockMode::Exclusive, LockMode::Shared);
        for k in 0..8 {
            assert_eq!(
                apply(&cn1, &map, &req(RequestKind::Lock, 1, 0, &[(k, 1, x)])).0,
                Status::Granted
            );
        }
        let conflict = req(RequestKind::Lock, 2, 0, &[(3, 1, s)]);
        assert_eq!(apply(&cn1, &map, &conflict).0, Status::Refused);
        let full = req(RequestKind::Lock, 3, 0, &[(100, 1, x)]);
        assert_eq!(apply(&cn1, &map, &full).0, Status::Refused);
        assert_eq!(cn1.refused(Refusal::Conflict), 1);
        assert_eq!(cn1.refused(Refusal::BucketFull), 1);
        assert_eq!(cn1.refused(Refusal::TooManyReaders), 0);
        // A reader count at its ceiling refuses the next reader.
        let cn2 = CnLocks::new(2, 1 << 16);
        let mut readers = 0;
        while apply(
            &cn2,
            &map,
            &req(RequestKind::Lock, 10 + readers, 0, &[(7, 2, s)]),
        )
        .0 == Status::Granted
        {
            readers += 1;
        }
        assert_eq!(readers, 127);
        assert_eq!(cn2.refused(Refusal::TooManyReaders), 1);
        assert_eq!(cn2.refused(Refusal::Conflict), 0);
        // What the coordinators note: tables apart (the last counts every higher id),
        // index buckets and mixed remote requests.
        cn1.note_refused_for(LockFor::Table(0));
        cn1.note_refused_for(LockFor::Table(0));
        cn1.note_refused_for(LockFor::Table(40));
        cn1.note_refused_for(LockFor::IndexBucket);
        assert_eq!(cn1.refused_for(LockFor::Table(0)), 2);
        assert_eq!(cn1.refused_for(LockFor::Table(1)), 0);
        assert_eq!(
            cn1.refused_for(LockFor::Table(REFUSAL_TABLES as u32 - 1)),
            1
        );
        assert_eq!(cn1.refused_for(LockFor::IndexBucket), 1);
        assert_eq!(cn1.refused_for(LockFor::Mixed), 0);
        // The same by counter name: reasons always, the rest only where some.
        assert_eq!(
            cn1.refusal_counters(),
            [
                ("lotus_refused_conflict".to_owned(), 1),
                ("lotus_refused_bucket_full".to_owned(), 1),
                ("lotus_refused_readers".to_owned(), 0),
                ("lotus_refused_index_bucket".to_owned(), 1),
                ("lotus_refused_table_0".to_owned(), 2),
                ("lotus_refused_table_15".to_owned(), 1),
            ]
        );
        assert_eq!(cn1.refusal_counter("lotus_refused_table_1"), None);
        assert_eq!(cn1.refusal_counter("lotus_refused_table_x"), None);
        assert_eq!(cn1.refusal_counter("lock_requests_refused"), None);
    }

    #[test]
    fn requests_are_all_or_nothing_and_owned() {
        let map = ShardMap::new(3);
        let cn1 = CnLocks::new(1, 4096);
        let x = LockMode::Exclusive;
        // Shards 1 and 4 belong to CN 1; shard 2 does not.
        let a = req(RequestKind::Lock, 1, 0, &[(10, 1, x), (11, 4, x)]);
        assert_eq!(apply(&cn1, &map, &a).0, Status::Granted);
        assert_eq!(apply(&cn1, &map, &a).0, Status::Granted, "idempotent");
        assert_eq!(
            apply(&cn1, &map, &req(RequestKind::Lock, 2, 2, &[(12, 2, x)])).0,
            Status::NotOwner
        );
        // Txn 2 gets 12 but not 11: nothing of it is held afterwards.
        let b = req(RequestKind::Lock, 2, 2, &[(12, 1, x), (11, 4, x)]);
        assert_eq!(apply(&cn1, &map, &b).0, Status::Refused);
        assert!(cn1.table.holders(12).is_empty());
        let unlock = req(RequestKind::Unlock, 1, 0, &[(10, 1, x), (11, 4, x)]);
        assert_eq!(apply(&cn1, &map, &unlock), (Status::Granted, 2));
        assert!(cn1.table.slots_free());
        assert_eq!(apply(&cn1, &map, &b).0, Status::Granted);
    }

    /// A CN process's cores share one `CnLocks`: two threads (cores 0 and 1) lock and
    /// unlock the same keys on it; each key is held by one of them at a time, the grants
    /// are counted per core, the slots end free, and a remote write-lock grant served on
    /// core 0 drops the VT-cache entry core 1 cached.
    #[test]
    fn the_cores_of_a_cn_share_one_table_and_cache() {
        fn shared<T: Send + Sync>(_: &T) {}
        let locks = Arc::new(CnLocks::new(0, 4096));
        shared(&locks);
        let x = LockMode::Exclusive;
        let inside: Arc<[std::sync::atomic::AtomicU32]> = (0..8)
            .map(|_| std::sync::atomic::AtomicU32::new(0))
            .collect();
        let cores: Vec<_> = (0..2u16)
            .map(|core| {
                let (locks, inside) = (Arc::clone(&locks), Arc::clone(&inside));
                std::thread::spawn(move || {
                    let mut granted = 0;
                    for round in 0..2_000u64 {
                        let key = round % 8;
                        let holder = Holder {
                            txn: round << 1 | u64::from(core),
                            cn: 0,
                        };
                        if locks.acquire(key, 1, x, holder) == Acquired::Granted {
                            locks.note_grant(core);
                            granted += 1;
                            let k = usize::try_from(key).unwrap();
                            assert_eq!(inside[k].fetch_add(1, Ordering::SeqCst), 0);
                            inside[k].fetch_sub(1, Ordering::SeqCst);
                            assert!(locks.table.release(key, holder));
                        }
                    }
                    granted
                })
            })
            .collect();
        let granted: Vec<u64> = cores.into_iter().map(|c| c.join().unwrap()).collect();
        assert_eq!(locks.grants_on_core(0), granted[0]);
        assert_eq!(locks.grants_off_core(0), granted[1]);
        assert!(granted.iter().all(|&g| g > 0), "{granted:?}");
        assert!(locks.table.slots_free() && locks.table.held() == 0);
        // Core 1 caches a CVT; CN 1's write-lock request, served on core 0, invalidates it.
        let loc = dmem_store::ItemLoc {
            bucket: dmem_store::BucketLoc {
                table: dmem_txn::TableId(0),
                partition: 0,
                bucket: 0,
                offset: 0,
                slots: dmem_store::BUCKET_SLOTS as u8,
            },
            slot: 0,
            offset: 0,
        };
        let (l1, map) = (Arc::clone(&locks), ShardMap::new(1));
        std::thread::spawn(move || l1.vt.put(42, 1, loc, dmem_motor::mvcc::Meta::empty(2)))
            .join()
            .unwrap();
        assert!(locks.vt.get(42).is_some());
        let remote = req(RequestKind::Lock, 9, 1, &[(42, 1, x)]);
        let l0 = Arc::clone(&locks);
        let status = std::thread::spawn(move || apply_on(&l0, &map, &remote, 0).0)
            .join()
            .unwrap();
        assert_eq!(status, Status::Granted);
        assert!(locks.vt.get(42).is_none());
    }

    #[test]
    fn a_restarted_table_is_empty_and_refuses_until_the_broadcast() {
        use crate::restart::Event;
        let map = ShardMap::new(3);
        let cn1 = Arc::new(CnLocks::new(1, 4096));
        let x = LockMode::Exclusive;
        // Locks of CN 0 and CN 2 on CN 1's table, a cached CVT.
        assert_eq!(
            apply(&cn1, &map, &req(RequestKind::Lock, 1, 0, &[(10, 1, x)])).0,
            Status::Granted
        );
        assert_eq!(
            apply(&cn1, &map, &req(RequestKind::Lock, 2, 2, &[(11, 4, x)])).0,
            Status::Granted
        );
        assert_eq!(cn1.reset(3), 2, "the old incarnation's locks are dropped");
        assert!(cn1.table.slots_free());
        assert!(cn1.vt.is_empty());
        let cluster = LockCluster::new(
            vec![
                Arc::new(CnLocks::new(0, 4096)),
                Arc::clone(&cn1),
                Arc::new(CnLocks::new(2, 4096)),
            ],
            vec![Vec::new(); 3],
            Rc::new(RefCell::new(map)),
            Sharding::new(Vec::new()),
            0,
        );
        assert!(cluster.serves(1));
        cluster.restarts.borrow_mut()[1].step(Event::Failed);
        cluster.restarts.borrow_mut()[1].step(Event::Restarted);
        assert!(!cluster.serves(1), "up, old transactions unfinished");
        cluster.restarts.borrow_mut()[1].step(Event::Recovered);
        assert!(cluster.serves(1), "broadcast: serving");
        assert!(cluster.serves(0) && cluster.serves(2));
    }

    /// §6 across processes: the failure notice (`Release`) fences the failed CN in the
    /// table every core of the process shares and releases the locks its lock states name
    /// it as holder of; every core's view then counts the CN as failed (its lock requests
    /// and commits abort), while the simulator's cluster keeps its failed list only.
    #[test]
    fn a_fence_in_a_process_table_is_the_failure_for_every_core() {
        let map = ShardMap::new(3);
        let own = Arc::new(CnLocks::new(0, 4096));
        let x = LockMode::Exclusive;
        for (txn, holder, key) in [(1, 1, 10), (2, 1, 11), (3, 2, 12)] {
            assert_eq!(
                apply(
                    &own,
                    &map,
                    &req(RequestKind::Lock, txn, holder, &[(key, 0, x)])
                )
                .0,
                Status::Granted
            );
        }
        let view = |core| {
            LockCluster::of_process(
                Arc::clone(&own),
                core,
                3,
                vec![Vec::new(); 3],
                Sharding::new(Vec::new()),
                0,
            )
        };
        let (core0, core1) = (view(0), view(1));
        assert!(!core0.is_failed(1) && !core1.is_failed(1));
        // What the lock server does on the notice.
        own.table.fence(1);
        assert_eq!(own.table.release_cn(1), 2, "CN 1's two locks, not CN 2's");
        assert!(
            core0.is_failed(1) && core1.is_failed(1),
            "every core sees it"
        );
        assert!(!core0.is_failed(2) && !core1.is_failed(0));
        assert_eq!(
            apply(&own, &map, &req(RequestKind::Lock, 4, 1, &[(13, 0, x)])).0,
            Status::Refused,
            "the fenced CN gets no lock"
        );
        assert_eq!(
            apply(&own, &map, &req(RequestKind::Lock, 5, 2, &[(10, 0, x)])).0,
            Status::Granted,
            "a released lock is free for a survivor"
        );
        assert_eq!(
            apply(&own, &map, &req(RequestKind::Lock, 6, 2, &[(12, 0, x)])).0,
            Status::Refused,
            "CN 2's lock (transaction 3) survives the release"
        );
        // The simulator's cluster: the failed list decides, not a fence.
        let sim = LockCluster::new(
            vec![Arc::clone(&own)],
            vec![Vec::new(); 3],
            Rc::new(RefCell::new(ShardMap::new(3))),
            Sharding::new(Vec::new()),
            0,
        );
        assert!(!sim.is_failed(1));
    }
}

//! The state every server thread of a Dandelion cluster shares (§2, §4.3, §4.4): the
//! stores, the endpoints, key placement, the epoch, and recovery's halts and decisions.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::future::{Future, poll_fn};
use std::task::{Poll, Waker};

use dmem_layout::mix::splitmix64_finalize;
use dmem_txn::TxnId;
use dmem_verbs::Endpoint;

use crate::config::DnlConfig;
use crate::store::ServerStore;

/// Where keys live: a primary by hash and the next R − 1 servers as backups (§2, §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Servers.
    pub servers: u16,
    /// Replicas per key (capped at `servers`).
    pub replication: u16,
}

impl Placement {
    /// `replication` replicas on `servers` servers.
    #[must_use]
    pub fn new(servers: u16, replication: u16) -> Self {
        Self {
            servers: servers.max(1),
            replication: replication.clamp(1, servers.max(1)),
        }
    }

    /// The primary of `(table, key)`.
    #[must_use]
    pub fn primary(&self, table: u32, key: u64) -> u16 {
        let h =
            splitmix64_finalize(key ^ (u64::from(table) << 56) ^ u64::from(table).rotate_left(17));
        (h % u64::from(self.servers)) as u16
    }

    /// Primary first, then the backups.
    pub fn replicas(&self, table: u32, key: u64) -> impl Iterator<Item = u16> + use<> {
        let (p, n) = (self.primary(table, key), self.servers);
        (0..self.replication).map(move |i| (p + i) % n)
    }

    /// Whether `server` holds a replica of `(table, key)`.
    #[must_use]
    pub fn holds(&self, server: u16, table: u32, key: u64) -> bool {
        let offset = (server + self.servers - self.primary(table, key)) % self.servers;
        offset < self.replication
    }
}

pub use crate::wire::DecidedWrite;

/// The state every server thread shares: the stores, endpoints, placement, configuration,
/// epoch.
#[derive(Debug)]
pub struct Cluster {
    /// Per server, its store.
    pub stores: Vec<RefCell<ServerStore>>,
    /// Per server, per thread, the worker's endpoint.
    pub endpoints: Vec<Vec<Endpoint>>,
    /// Key placement.
    pub placement: Placement,
    /// Protocol configuration.
    pub config: DnlConfig,
    /// The epoch (§4.4): packets of another epoch are ignored.
    pub epoch: Cell<u64>,
    /// Servers recovery declared crashed: no longer replicas of anything.
    pub crashed: RefCell<Vec<bool>>,
    /// The server of every coordinator.
    pub coordinator_server: RefCell<HashMap<u32, u16>>,
    /// Transactions whose coordinator decided to commit, with their writes (table, key,
    /// version, write): the coordinators' memory. Recovery asks a survivor's coordinators
    /// for their decisions (§4.4) and that survivor answers from this map, for its own
    /// coordinators only (`recovery::survivor_state`, `recovery::answer`); the leader reads
    /// it only as history instrumentation (`recover`), never for a decision. Kept for the whole run (a decision may be needed
    /// as long as a message of it can be lost).
    pub decided: RefCell<HashMap<TxnId, Vec<DecidedWrite>>>,
    /// Per server, the transactions its coordinators are committing, with the epoch their
    /// commit phase began in: what a `GATHER` reports of them (§4.4). One leaves when it
    /// finishes in that epoch; one a recovery interrupted stays until that recovery's
    /// `RESUME` reaches its server (recovery decided it, and the gather may come after
    /// the coordinator gave up).
    pub in_commit: Vec<RefCell<BTreeMap<TxnId, u64>>>,
    /// Per server, halted by recovery (§4.4 "all operation is halted"): its transactions
    /// send nothing but recovery's messages until a `RESUME` reaches it.
    pub(crate) halted: RefCell<Vec<bool>>,
    /// Transactions waiting for their server to resume.
    pub(crate) resume_waiters: RefCell<Vec<Waker>>,
    /// Retransmissions so far, and who waits for the next one (a failure detector that
    /// has nothing else to watch).
    pub(crate) retransmissions: Cell<u64>,
    pub(crate) retransmission_waiters: RefCell<Vec<Waker>>,
}

impl Cluster {
    /// `endpoints[server][thread]` under `config`.
    #[must_use]
    pub fn new(endpoints: Vec<Vec<Endpoint>>, config: DnlConfig) -> Self {
        let servers = endpoints.len() as u16;
        Self {
            stores: (0..servers)
                .map(|_| RefCell::new(ServerStore::new()))
                .collect(),
            endpoints,
            placement: Placement::new(servers, config.replication),
            config,
            epoch: Cell::new(0),
            crashed: RefCell::new(vec![false; usize::from(servers)]),
            coordinator_server: RefCell::new(HashMap::new()),
            decided: RefCell::new(HashMap::new()),
            in_commit: (0..servers)
                .map(|_| RefCell::new(BTreeMap::new()))
                .collect(),
            halted: RefCell::new(vec![false; usize::from(servers)]),
            resume_waiters: RefCell::new(Vec::new()),
            retransmissions: Cell::new(0),
            retransmission_waiters: RefCell::new(Vec::new()),
        }
    }

    /// Resolves at the next retransmission of any server thread: a request went
    /// unanswered past its timeout, which is what a crashed server looks like. A failure
    /// detector waits on it instead of polling once nothing else is going on, so an idle
    /// cluster stays idle (no timer) and a late crash is still noticed.
    pub fn next_retransmission(&self) -> impl Future<Output = ()> + '_ {
        let seen = self.retransmissions.get();
        poll_fn(move |cx| {
            if self.retransmissions.get() != seen {
                Poll::Ready(())
            } else {
                self.retransmission_waiters
                    .borrow_mut()
                    .push(cx.waker().clone());
                Poll::Pending
            }
        })
    }

    pub(crate) fn retransmitted(&self) {
        self.retransmissions.set(self.retransmissions.get() + 1);
        for w in self.retransmission_waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Whether recovery halted `server` and it has not resumed yet.
    #[must_use]
    pub fn is_halted(&self, server: u16) -> bool {
        self.halted
            .borrow()
            .get(usize::from(server))
            .copied()
            .unwrap_or(false)
    }

    /// Halts (`true`) or resumes `server`; resuming wakes its waiting transactions.
    pub fn set_halted(&self, server: u16, halted: bool) {
        if let Some(h) = self.halted.borrow_mut().get_mut(usize::from(server)) {
            *h = halted;
        }
        if !halted {
            for w in self.resume_waiters.borrow_mut().drain(..) {
                w.wake();
            }
        }
    }

    /// Resolves once `server` is not halted.
    pub fn resumed(&self, server: u16) -> impl Future<Output = ()> + '_ {
        poll_fn(move |cx| {
            if self.is_halted(server) {
                self.resume_waiters.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
    }

    /// A coordinator of `server` begins committing `txn` in the current epoch.
    pub fn begin_commit(&self, server: u16, txn: TxnId) {
        if let Some(m) = self.in_commit.get(usize::from(server)) {
            m.borrow_mut().insert(txn, self.epoch.get());
        }
    }

    /// `txn`, whose commit began in `epoch`, finished: forgotten unless a recovery
    /// interrupted it (then its `RESUME` forgets it).
    pub fn end_commit(&self, server: u16, txn: TxnId, epoch: u64) {
        if self.epoch.get() == epoch
            && let Some(m) = self.in_commit.get(usize::from(server))
        {
            m.borrow_mut().remove(&txn);
        }
    }

    /// Whether recovery declared `server` crashed.
    #[must_use]
    pub fn is_crashed(&self, server: u16) -> bool {
        self.crashed
            .borrow()
            .get(usize::from(server))
            .copied()
            .unwrap_or(true)
    }

    /// The live replicas of `(table, key)`, the acting primary first (the first live one:
    /// with no re-replication, §4.4, a backup takes over from a crashed primary).
    #[must_use]
    pub fn replicas(&self, table: u32, key: u64) -> Vec<u16> {
        self.placement
            .replicas(table, key)
            .filter(|s| !self.is_crashed(*s))
            .collect()
    }

    /// The acting primary of `(table, key)` (its first live replica).
    #[must_use]
    pub fn primary(&self, table: u32, key: u64) -> u16 {
        self.placement
            .replicas(table, key)
            .find(|s| !self.is_crashed(*s))
            .unwrap_or_else(|| self.placement.primary(table, key))
    }

    /// Loads a record at every replica (out of band).
    pub fn load(&self, table: u32, key: u64, value: &[u8]) {
        for r in self.placement.replicas(table, key) {
            self.stores[usize::from(r)]
                .borrow_mut()
                .load(table, key, value);
        }
    }

    /// The committed value of `(table, key)` at its acting primary (`None`: absent).
    #[must_use]
    pub fn read_final(&self, table: u32, key: u64) -> Option<Vec<u8>> {
        let p = self.primary(table, key);
        let store = self.stores[usize::from(p)].borrow();
        let r = store.get(table, key)?;
        (!r.meta.is_deleted()).then(|| r.value.clone())
    }
}

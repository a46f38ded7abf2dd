//! Shared test harness: a simulated cluster with a bank table, transfer and audit
//! transactions, an invariant check over MN memory and a small serializability check.
#![allow(dead_code, unreachable_pub)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use dmem_ford::store::ItemLoc;
use dmem_ford::{
    CnShared, CoordinatorStats, FordCoordinator, LinkTerminator, Loader, ProtocolConfig, Store,
    StoreConfig, TableSpec,
};
use dmem_layout::pill::{CoordinatorId as PillId, FailedCoordinatorSet, PillLockWord};
use dmem_layout::record::{DataItem, DataItemHeader};
use dmem_sim::{ClusterConfig, Sim, SimContext};
use dmem_txn::{History, Key, TableId, Transaction, TxnError, TxnKind};
use dmem_verbs::{Clock, NodeId, VerbsError};

pub const ACCOUNTS: TableId = TableId(1);
pub const INITIAL: u64 = 100;

pub struct Bank {
    pub sim: Rc<Sim>,
    pub store: Rc<Store>,
    pub history: Rc<RefCell<History>>,
    pub accounts: u64,
    pub locs: HashMap<u64, ItemLoc>,
}

impl Bank {
    /// 3 MNs, `cns` CNs with `threads` threads, `accounts` accounts of 100.
    pub fn new(seed: u64, cns: u16, threads: u16, accounts: u64) -> Self {
        Self::with_config(seed, cns, threads, accounts, 1 << 20, |cfg| cfg)
    }

    /// [`new`](Self::new) with `mn_bytes` per MN and `more` applied to the store layout.
    pub fn with_config(
        seed: u64,
        cns: u16,
        threads: u16,
        accounts: u64,
        mn_bytes: u64,
        more: impl FnOnce(StoreConfig) -> StoreConfig,
    ) -> Self {
        let sim = Sim::new(
            ClusterConfig::new("cx5")
                .unwrap()
                .mns(3)
                .cns(cns)
                .threads_per_cn(threads)
                .mn_memory_bytes(mn_bytes)
                .seed(seed),
        )
        .unwrap();
        let regions = (0..3).map(|i| sim.region(sim.mn(i))).collect();
        let cfg = more(
            StoreConfig::new(3)
                .table(TableSpec::sized_for(ACCOUNTS, 8, accounts * 2, 3))
                .table(TableSpec::sized_for(TableId(2), 8, 64, 3))
                .coordinators(32)
                .log_region_bytes(2048),
        );
        let store = Rc::new(Store::new(cfg, regions).unwrap());
        let mut loader = Loader::new(&store);
        let mut locs = HashMap::new();
        for k in 0..accounts {
            let loc = loader
                .load(ACCOUNTS, Key(k), &INITIAL.to_le_bytes(), |n, off, b| {
                    sim.write_memory(n, off, b)
                })
                .unwrap();
            locs.insert(k, loc);
        }
        Self {
            sim: Rc::new(sim),
            store,
            history: Rc::new(RefCell::new(History::new())),
            accounts,
            locs,
        }
    }

    pub fn coordinator(
        &self,
        cn: u16,
        thread: u16,
        id: u16,
        cfg: ProtocolConfig,
        shared: &CnShared,
    ) -> FordCoordinator<SimContext, Rc<RefCell<History>>> {
        let ctx = self.sim.context(self.sim.cn(cn), thread).unwrap();
        FordCoordinator::new(
            ctx,
            Rc::clone(&self.store),
            cfg,
            id,
            shared.clone(),
            Rc::clone(&self.history),
        )
        .unwrap()
    }

    /// Balance of `key` on MN index `mn`, with its lock word and version.
    pub fn item(&self, key: u64, mn: u16) -> (u64, u64, u64, bool) {
        let loc = self.locs[&key];
        let len = DataItemHeader::item_len(8);
        let bytes = self
            .sim
            .read_memory(self.store.mn_node(mn), loc.offset, len);
        let item = DataItem::new_checked(&bytes[..]).unwrap();
        let bal = u64::from_le_bytes(item.value().try_into().unwrap());
        (
            bal,
            item.lock_word(),
            item.version().to_raw(),
            item.header().flags().is_valid(),
        )
    }

    /// Checks: every replica equals its primary; balances sum to the initial total; every
    /// lock is free or held by one of `failed` (a stray lock not stolen yet).
    pub fn check_invariant(&self, failed: &[u16]) {
        self.check_invariant_on(&self.store, failed);
    }

    /// [`check_invariant`](Self::check_invariant) under `store`'s view of the MNs: only
    /// live replicas are compared and summed, and locks are read at the current primary
    /// (the first live replica).
    pub fn check_invariant_on(&self, store: &Store, failed: &[u16]) {
        let mut set = FailedCoordinatorSet::EMPTY;
        for &f in failed {
            set.insert(PillId(f));
        }
        let mut total = 0;
        for k in 0..self.accounts {
            let loc = self.locs[&k];
            let replicas = store.live_replicas(loc.bucket.partition);
            assert!(!replicas.is_empty(), "account {k} lost every replica");
            let (bal, lock, ver, valid) = self.item(k, replicas[0]);
            assert!(valid, "account {k} vanished");
            for &b in &replicas[1..] {
                let (b_bal, _, b_ver, _) = self.item(k, b);
                assert_eq!(
                    (b_bal, b_ver),
                    (bal, ver),
                    "backup {b} of account {k} diverged"
                );
            }
            let holder = PillLockWord::from_raw(lock).holder(&set).unwrap();
            assert!(
                !matches!(holder, dmem_layout::pill::LockHolder::Live(_)),
                "account {k} still locked by {holder:?}"
            );
            total += bal;
        }
        assert_eq!(
            total,
            INITIAL * self.accounts,
            "money was created or destroyed"
        );
    }
}

/// xorshift64*.
pub fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

fn bal(v: Option<Vec<u8>>) -> Result<u64, TxnError> {
    let v = v.ok_or(TxnError::KeyState(0))?;
    Ok(u64::from_le_bytes(v.try_into().map_err(|_| {
        TxnError::Aborted(dmem_txn::AbortReason::MalformedItem)
    })?))
}

/// One transfer attempt: moves `amount` from `a` to `b` (locks both with read_for_update).
pub async fn transfer<C: dmem_txn::Coordinator>(
    co: &mut C,
    a: u64,
    b: u64,
    amount: u64,
) -> Result<(), TxnError> {
    let mut t = co.begin(TxnKind::ReadWrite).await?;
    let r: Result<(), TxnError> = async {
        let x = bal(t.read_for_update(ACCOUNTS, Key(a)).await?)?;
        let y = bal(t.read_for_update(ACCOUNTS, Key(b)).await?)?;
        let amount = amount.min(x);
        t.write(ACCOUNTS, Key(a), &(x - amount).to_le_bytes())
            .await?;
        t.write(ACCOUNTS, Key(b), &(y + amount).to_le_bytes())
            .await?;
        Ok(())
    }
    .await;
    match r {
        Ok(()) => t.commit().await,
        Err(e) => {
            t.abort().await;
            Err(e)
        }
    }
}

/// One audit attempt: the sum of every balance, read-only.
pub async fn audit<C: dmem_txn::Coordinator>(co: &mut C, accounts: u64) -> Result<u64, TxnError> {
    let mut t = co.begin(TxnKind::ReadOnly).await?;
    let mut sum = 0;
    for k in 0..accounts {
        match t.read(ACCOUNTS, Key(k)).await.and_then(bal) {
            Ok(v) => sum += v,
            Err(e) => {
                t.abort().await;
                return Err(e);
            }
        }
    }
    t.commit().await.map(|()| sum)
}

/// Runs `txns` random transfers (and an audit every 4th) to completion, retrying aborts
/// with a short backoff. Audits that commit must see the conserved total.
pub async fn worker(
    co: FordCoordinator<SimContext, Rc<RefCell<History>>>,
    accounts: u64,
    txns: usize,
    done: Rc<RefCell<usize>>,
) {
    worker_with_stats(co, accounts, txns, done, Rc::default()).await;
}

/// [`worker`] that also appends its coordinator's counters to `stats` when it finishes.
pub async fn worker_with_stats(
    mut co: FordCoordinator<SimContext, Rc<RefCell<History>>>,
    accounts: u64,
    txns: usize,
    done: Rc<RefCell<usize>>,
    stats: Rc<RefCell<Vec<CoordinatorStats>>>,
) {
    let mut rng = co.context().seed() | 1;
    for i in 0..txns {
        loop {
            let r = next(&mut rng);
            let res = if i % 4 == 3 {
                audit(&mut co, accounts).await.map(|sum| {
                    assert_eq!(
                        sum,
                        INITIAL * accounts,
                        "an audit saw a non-serializable state"
                    );
                })
            } else {
                let a = r % accounts;
                let b = (a + 1 + (r >> 20) % (accounts - 1)) % accounts;
                transfer(&mut co, a, b, (r >> 40) % 20).await
            };
            match res {
                Ok(()) => break,
                Err(e) if e.is_retryable() => {
                    let now = co.context().now();
                    co.context().sleep_until(now + 500 + (r >> 50) % 2000).await;
                }
                Err(TxnError::Verbs(VerbsError::LocalCrash)) => return,
                Err(e) => panic!("transfer failed: {e}"),
            }
        }
    }
    *done.borrow_mut() += 1;
    stats.borrow_mut().push(co.stats());
}

/// The history checks out under the one checker every protocol uses (strict
/// serializability; unknown transactions judged by what was later observed).
pub fn check_serializable(history: &History) {
    let report = dmem_txn::check(history);
    assert!(
        report.is_ok(),
        "dmem_txn::checker (strict serializability): {:#?}",
        &report.anomalies[..report.anomalies.len().min(3)]
    );
}

/// FORD's link terminator over the deployment layer's revocation in the simulator.
pub struct SimTerminator(pub Rc<Sim>);

impl LinkTerminator for SimTerminator {
    async fn terminate(&self, mn: NodeId, cn: NodeId) -> Result<(), VerbsError> {
        dmem_deploy::SimLinkTerminator(Rc::clone(&self.0)).terminate(mn, cn);
        Ok(())
    }
}

//! Round trips per transaction: FORD and Pandora wait for as many post lists as FORD's own
//! code does (`dtx.cc`, `dtx_exe_commit.cc`): a transfer of two for-update records takes 3
//! (one execution round, the log, the commit WRITEs; the lock release is not waited for), a
//! read-only transaction of one record takes 1 (no validation), of two records 2.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;

use dmem_ford::{CnShared, FordCoordinator, Loader, ProtocolConfig, Store, StoreConfig, TableSpec};
use dmem_sim::{ClusterConfig, Sim, SimContext};
use dmem_txn::{Coordinator, History, Key, ReadReq, TableId, Transaction, TxnKind, check};
use dmem_verbs::{BatchResult, Clock, Endpoint, Message, Nanos, PostList, Verbs, VerbsError};

const ACCOUNTS: TableId = TableId(1);

/// A context that counts the post lists it waited for.
#[derive(Clone)]
struct Counted {
    ctx: SimContext,
    waited: Rc<Cell<u64>>,
}

impl Verbs for Counted {
    fn local_endpoint(&self) -> Endpoint {
        self.ctx.local_endpoint()
    }
    fn post(&self, list: PostList) -> impl Future<Output = Result<BatchResult, VerbsError>> {
        self.waited.set(self.waited.get() + 1);
        self.ctx.post(list)
    }
    fn post_detached(&self, list: PostList) -> impl Future<Output = Result<(), VerbsError>> {
        self.ctx.post_detached(list)
    }
    fn send(&self, to: Endpoint, payload: &[u8]) -> impl Future<Output = Result<(), VerbsError>> {
        self.ctx.send(to, payload)
    }
    fn recv(&self) -> impl Future<Output = Result<Message, VerbsError>> {
        self.ctx.recv()
    }
    fn try_recv(&self) -> Result<Option<Message>, VerbsError> {
        self.ctx.try_recv()
    }
}

impl Clock for Counted {
    fn now(&self) -> Nanos {
        self.ctx.now()
    }
    fn sleep_until(&self, deadline: Nanos) -> impl Future<Output = ()> {
        self.ctx.sleep_until(deadline)
    }
    fn cpu(&self, ns: Nanos) {
        self.ctx.cpu(ns);
    }
}

struct Setup {
    sim: Sim,
    co: FordCoordinator<Counted, Rc<RefCell<History>>>,
    waited: Rc<Cell<u64>>,
    history: Rc<RefCell<History>>,
}

/// 3 MNs, one coordinator, accounts 0..8 of 100; `warm`: the CN's address cache holds every
/// account (as after the deployment's warm-up from the loader).
fn setup(cfg: ProtocolConfig, warm: bool) -> Setup {
    let sim = Sim::new(
        ClusterConfig::new("cx5")
            .unwrap()
            .mns(3)
            .cns(1)
            .threads_per_cn(1)
            .mn_memory_bytes(1 << 20)
            .seed(1),
    )
    .unwrap();
    let regions = (0..3).map(|i| sim.region(sim.mn(i))).collect();
    let store = Rc::new(
        Store::new(
            StoreConfig::new(3)
                .table(TableSpec::sized_for(ACCOUNTS, 8, 64, 3))
                .coordinators(4),
            regions,
        )
        .unwrap(),
    );
    let shared = CnShared::new();
    let mut loader = Loader::new(&store);
    for k in 0..8 {
        let loc = loader
            .load(ACCOUNTS, Key(k), &100u64.to_le_bytes(), |n, o, b| {
                sim.write_memory(n, o, b);
            })
            .unwrap();
        if warm {
            shared.cache.borrow_mut().put(ACCOUNTS, Key(k), loc);
        }
    }
    let waited = Rc::new(Cell::new(0));
    let history = Rc::new(RefCell::new(History::new()));
    let ctx = Counted {
        ctx: sim.context(sim.cn(0), 0).unwrap(),
        waited: Rc::clone(&waited),
    };
    let co = FordCoordinator::new(ctx, store, cfg, 0, shared, Rc::clone(&history)).unwrap();
    Setup {
        sim,
        co,
        waited,
        history,
    }
}

fn bal(v: &Option<Vec<u8>>) -> u64 {
    u64::from_le_bytes(v.clone().unwrap().try_into().unwrap())
}

/// Runs `body` as one transaction and returns the post lists it waited for.
fn waited_by<F>(s: Setup, body: F) -> (u64, Setup)
where
    F: for<'a> AsyncFnOnce(&'a mut FordCoordinator<Counted, Rc<RefCell<History>>>) + 'static,
{
    let Setup {
        sim,
        co,
        waited,
        history,
    } = s;
    let ctx = co.context().ctx.clone();
    let w = Rc::clone(&waited);
    let co = Rc::new(RefCell::new(Some(co)));
    let c2 = Rc::clone(&co);
    sim.spawn(&ctx, async move {
        let mut co = c2.borrow_mut().take().unwrap();
        let before = w.get();
        body(&mut co).await;
        w.set(w.get() - before);
        *c2.borrow_mut() = Some(co);
    });
    sim.run_until_idle();
    let co = co.borrow_mut().take().unwrap();
    let n = waited.get();
    waited.set(0);
    (
        n,
        Setup {
            sim,
            co,
            waited,
            history,
        },
    )
}

async fn transfer(co: &mut FordCoordinator<Counted, Rc<RefCell<History>>>) {
    let mut t = co.begin(TxnKind::ReadWrite).await.unwrap();
    let v = t
        .read_round(&[
            ReadReq::for_update(ACCOUNTS, Key(1)),
            ReadReq::for_update(ACCOUNTS, Key(2)),
        ])
        .await
        .unwrap();
    let (a, b) = (bal(&v[0]), bal(&v[1]));
    t.write(ACCOUNTS, Key(1), &(a - 5).to_le_bytes())
        .await
        .unwrap();
    t.write(ACCOUNTS, Key(2), &(b + 5).to_le_bytes())
        .await
        .unwrap();
    t.commit().await.unwrap();
}

#[test]
fn a_transfer_takes_three_round_trips_warm_and_four_cold() {
    for cfg in [ProtocolConfig::ford_fixed(), ProtocolConfig::pandora()] {
        let (n, s) = waited_by(setup(cfg, true), async |co| transfer(co).await);
        assert_eq!(n, 3, "{cfg:?}: execution round + log + commit");
        // The detached release landed: a second transfer of the same accounts locks them.
        let (n, s) = waited_by(s, async |co| transfer(co).await);
        assert_eq!(n, 3);
        let (n, s) = waited_by(s, async |co| {
            let mut t = co.begin(TxnKind::ReadOnly).await.unwrap();
            let v = t
                .read_round(&[
                    ReadReq::read(ACCOUNTS, Key(1)),
                    ReadReq::read(ACCOUNTS, Key(2)),
                ])
                .await
                .unwrap();
            assert_eq!((bal(&v[0]), bal(&v[1])), (90, 110));
            t.commit().await.unwrap();
        });
        assert_eq!(n, 2, "two read-only records: one round + validation");
        assert!(check(&s.history.borrow()).is_ok());

        let (n, _) = waited_by(setup(cfg, false), async |co| transfer(co).await);
        assert_eq!(n, 4, "a cold address cache adds one bucket READ round");
    }
}

#[test]
fn a_read_only_transaction_of_one_record_takes_one_round_trip() {
    let (n, s) = waited_by(setup(ProtocolConfig::pandora(), true), async |co| {
        let mut t = co.begin(TxnKind::ReadOnly).await.unwrap();
        assert_eq!(bal(&t.read(ACCOUNTS, Key(3)).await.unwrap()), 100);
        t.commit().await.unwrap();
    });
    assert_eq!(n, 1);
    // A key absent from the index is one bucket READ, also without validation.
    let (n, _) = waited_by(s, async |co| {
        let mut t = co.begin(TxnKind::ReadOnly).await.unwrap();
        assert_eq!(t.read(ACCOUNTS, Key(99)).await.unwrap(), None);
        t.commit().await.unwrap();
    });
    assert_eq!(n, 1);
}

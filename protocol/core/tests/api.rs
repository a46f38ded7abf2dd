//! The rounds API's sequential default and the dynamic (boxed) form of the traits.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use dmem_txn::{
    Access, BoxCoordinator, Coordinator, Key, ReadReq, TableId, Transaction, TxnError, TxnKind,
};

const T: TableId = TableId(0);

/// A map with buffered writes; counts the single-record reads a round turned into.
#[derive(Default)]
struct Map {
    rows: BTreeMap<u64, Vec<u8>>,
    reads: Vec<(u64, Access)>,
}

struct MapTxn<'a> {
    map: &'a mut Map,
    kind: TxnKind,
    pending: Vec<(u64, Option<Vec<u8>>)>,
}

impl Transaction for MapTxn<'_> {
    async fn read(&mut self, _: TableId, key: Key) -> Result<Option<Vec<u8>>, TxnError> {
        self.map.reads.push((key.0, Access::Read));
        Ok(self.map.rows.get(&key.0).cloned())
    }
    async fn read_for_update(&mut self, _: TableId, key: Key) -> Result<Option<Vec<u8>>, TxnError> {
        if self.kind == TxnKind::ReadOnly {
            return Err(TxnError::ReadOnly);
        }
        self.map.reads.push((key.0, Access::ForUpdate));
        Ok(self.map.rows.get(&key.0).cloned())
    }
    async fn write(&mut self, _: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.pending.push((key.0, Some(value.to_vec())));
        Ok(())
    }
    async fn insert(&mut self, t: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.write(t, key, value).await
    }
    async fn delete(&mut self, _: TableId, key: Key) -> Result<(), TxnError> {
        self.pending.push((key.0, None));
        Ok(())
    }
    async fn commit(self) -> Result<(), TxnError> {
        for (k, v) in self.pending {
            match v {
                Some(v) => self.map.rows.insert(k, v),
                None => self.map.rows.remove(&k),
            };
        }
        Ok(())
    }
    async fn abort(self) {}
}

impl Coordinator for Map {
    type Txn<'a> = MapTxn<'a>;
    async fn begin(&mut self, kind: TxnKind) -> Result<MapTxn<'_>, TxnError> {
        Ok(MapTxn {
            map: self,
            kind,
            pending: Vec::new(),
        })
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("pended"),
    }
}

/// A workload step written once against the generic traits.
async fn transfer<C: Coordinator>(co: &mut C) -> Result<(u8, u8), TxnError> {
    let mut t = co.begin(TxnKind::ReadWrite).await?;
    let v = t
        .read_round(&[
            ReadReq::for_update(T, Key(1)),
            ReadReq::read(T, Key(2)),
            ReadReq::read(T, Key(9)),
        ])
        .await?;
    assert_eq!(v.len(), 3);
    assert_eq!(v[2], None, "an absent key reads as None in its place");
    let (a, b) = (v[0].as_ref().unwrap()[0], v[1].as_ref().unwrap()[0]);
    t.write(T, Key(1), &[a - 1]).await?;
    t.commit().await?;
    Ok((a, b))
}

#[test]
fn sequential_default_keeps_request_order_and_access() {
    let mut m = Map::default();
    m.rows.insert(1, vec![10]);
    m.rows.insert(2, vec![20]);
    assert_eq!(block_on(transfer(&mut m)).unwrap(), (10, 20));
    assert_eq!(
        m.reads,
        vec![(1, Access::ForUpdate), (2, Access::Read), (9, Access::Read)]
    );
    assert_eq!(m.rows[&1], vec![9]);
}

#[test]
fn a_boxed_coordinator_runs_the_same_code() {
    let mut m = Map::default();
    m.rows.insert(1, vec![10]);
    m.rows.insert(2, vec![20]);
    let mut boxed: BoxCoordinator = Box::new(m);
    assert_eq!(block_on(transfer(&mut boxed)).unwrap(), (10, 20));
    assert_eq!(block_on(transfer(&mut boxed)).unwrap(), (9, 20));
    // A read-only transaction refuses a for-update access through the box, too.
    let mut t = block_on(boxed.begin(TxnKind::ReadOnly)).unwrap();
    assert_eq!(
        block_on(t.read_round(&[ReadReq::for_update(T, Key(1))])),
        Err(TxnError::ReadOnly)
    );
    block_on(t.abort());
}

/// A round plan answers what the transaction holds, fetches each other record once (for
/// update if any request was), and puts the values back in request order.
#[test]
fn round_plan_answers_locally_and_fetches_each_record_once() {
    use dmem_txn::{Access, Key, ReadReq, RoundPlan, TableId};
    let t = TableId(1);
    let reqs = [
        ReadReq::read(t, Key(1)),
        ReadReq::read(t, Key(2)),
        ReadReq::for_update(t, Key(1)),
        ReadReq::read(t, Key(3)),
    ];
    // Key 2 is held already (value [2]).
    let plan = RoundPlan::new(&reqs, |r| (r.key == Key(2)).then(|| Some(vec![2])));
    assert_eq!(
        plan.fetches,
        [
            ReadReq {
                table: t,
                key: Key(1),
                access: Access::ForUpdate
            },
            ReadReq::read(t, Key(3)),
        ]
    );
    let fetched = [Some(vec![1]), None];
    assert_eq!(
        plan.values(|n| fetched[n].clone()),
        [Some(vec![1]), Some(vec![2]), Some(vec![1]), None]
    );
}

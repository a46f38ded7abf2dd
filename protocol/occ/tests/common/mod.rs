//! Shared test harness: a bank on OOCC over the simulated cluster.
#![allow(dead_code, unreachable_pub)]

use std::cell::RefCell;
use std::rc::Rc;

use dmem_deploy::{ClusterShape, DeploySpec, Deployed, TableDemand, deploy_loaded};
use dmem_occ::OoccProtocol;
use dmem_sim::NicProfile;
use dmem_txn::{
    Coordinator, History, Key, ReadReq, TableId, Transaction, TxnError, TxnKind, check,
};

pub const T: TableId = TableId(1);

pub fn shape(cns: u16, threads: u16, seed: u64) -> ClusterShape {
    ClusterShape {
        mns: 2,
        cns,
        threads,
        seed,
        profile: NicProfile::named("cx6").unwrap(),
        min_mn_bytes: 1 << 20,
    }
}

/// `records` records of `value_len` bytes in table `T`, each `init(key)`.
pub fn deploy(
    protocol: &OoccProtocol,
    shape: &ClusterShape,
    records: u64,
    value_len: usize,
    init: impl Fn(u64) -> Vec<u8>,
) -> (Deployed, Rc<RefCell<History>>) {
    let spec = DeploySpec::new(
        vec![TableDemand {
            id: T,
            value_len,
            expected_records: records,
            grows: false,
        }],
        64,
    );
    let history = Rc::new(RefCell::new(History::new()));
    let d = deploy_loaded(protocol, shape, &spec, &history, || {
        (0..records).map(|k| (T, Key(k), init(k)))
    })
    .unwrap();
    (d, history)
}

pub fn bal(v: Option<Vec<u8>>) -> u64 {
    u64::from_le_bytes(v.expect("account present")[..8].try_into().unwrap())
}

pub fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

pub async fn transfer<C: Coordinator>(
    co: &mut C,
    a: u64,
    b: u64,
    amount: u64,
) -> Result<(), TxnError> {
    let mut t = co.begin(TxnKind::ReadWrite).await?;
    let v = t
        .read_round(&[
            ReadReq::for_update(T, Key(a)),
            ReadReq::for_update(T, Key(b)),
        ])
        .await?;
    let (x, y) = (bal(v[0].clone()), bal(v[1].clone()));
    if x < amount {
        t.abort().await;
        return Ok(());
    }
    t.write(T, Key(a), &(x - amount).to_le_bytes()).await?;
    t.write(T, Key(b), &(y + amount).to_le_bytes()).await?;
    t.commit().await
}

pub async fn audit<C: Coordinator>(
    co: &mut C,
    clock: &impl dmem_verbs::Clock,
    think_ns: u64,
    first: u64,
    accounts: u64,
) -> Result<u64, TxnError> {
    let mut t = co.begin(TxnKind::ReadOnly).await?;
    // Two rounds, so that the snapshot spans time and the implicit lease has work to do.
    let half = accounts / 2;
    let mut sum = 0;
    for range in [first..first + half, first + half..first + accounts] {
        let reqs: Vec<_> = range.clone().map(|k| ReadReq::read(T, Key(k))).collect();
        sum += t.read_round(&reqs).await?.into_iter().map(bal).sum::<u64>();
        if range.start == first {
            // Application work between the rounds, well inside the lease.
            clock.sleep(think_ns).await;
        }
    }
    t.commit().await?;
    Ok(sum)
}

pub fn verdict(history: &History) -> Result<(), String> {
    let r = check(history);
    if r.is_ok() {
        Ok(())
    } else {
        Err(format!("{:?}", r.anomalies.first()))
    }
}

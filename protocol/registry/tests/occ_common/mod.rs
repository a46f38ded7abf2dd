//! Shared test harness: a bank on OOCC over the simulated cluster.
#![allow(dead_code, unreachable_pub)]

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use dmem_deploy::{ClusterShape, DeploySpec, Deployed, TableDemand, deploy_loaded};
use dmem_protocols::OoccProtocol;
use dmem_sim::NicProfile;
use dmem_txn::{
    Coordinator, History, Key, ReadReq, TableId, Transaction, TxnError, TxnKind, check,
};
use dmem_verbs::Clock;

pub const T: TableId = TableId(1);

pub fn shape(cns: u16, threads: u16, seed: u64) -> ClusterShape {
    ClusterShape {
        mns: 2,
        cns,
        threads,
        seed,
        profile: NicProfile::named("cx6").unwrap(),
        min_mn_bytes: 1 << 20,
        message_faults: dmem_sim::MessageFaults::default(),
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

/// Transfers inside groups of four accounts and audits of one group (its sum is constant),
/// two CNs × two threads × four coordinators, 3 ms of virtual time.
pub fn bank(protocol: &OoccProtocol, seed: u64) -> (Rc<RefCell<dmem_txn::History>>, u64, u64) {
    const ACCOUNTS: u64 = 32;
    const GROUP: u64 = 4;
    let shape = shape(2, 2, seed);
    let (mut d, history) = deploy(protocol, &shape, ACCOUNTS, 8, |_| {
        100u64.to_le_bytes().to_vec()
    });
    let audits_ok = Rc::new(Cell::new(0u64));
    let commits = Rc::new(Cell::new(0u64));
    let mut id = 0;
    for cn in 0..2 {
        for th in 0..2 {
            for _ in 0..4 {
                let ctx = d.sim.context(d.sim.cn(cn), th).unwrap();
                let mut co = d.deployment.coordinator(ctx.clone().into(), id).unwrap();
                let (audits_ok, commits) = (Rc::clone(&audits_ok), Rc::clone(&commits));
                let mut rng = seed * 1000 + u64::from(id) + 1;
                let clock = ctx.clone();
                d.sim.spawn(&ctx, async move {
                    while clock.now() < 3_000_000 {
                        let group = next(&mut rng) % (ACCOUNTS / GROUP) * GROUP;
                        if !next(&mut rng).is_multiple_of(4) {
                            if let Ok(sum) = audit(&mut co, &clock, 30_000, group, GROUP).await {
                                assert_eq!(sum, GROUP * 100, "an audit saw money appear or vanish");
                                audits_ok.set(audits_ok.get() + 1);
                            }
                        } else {
                            let a = group + next(&mut rng) % GROUP;
                            let b = group + (a - group + 1 + next(&mut rng) % (GROUP - 1)) % GROUP;
                            if transfer(&mut co, a, b, 1 + next(&mut rng) % 5)
                                .await
                                .is_ok()
                            {
                                commits.set(commits.get() + 1);
                            }
                        }
                    }
                });
                id += 1;
            }
        }
    }
    d.sim.run_until_idle();
    let total: u64 = (0..ACCOUNTS)
        .map(|k| bal(d.deployment.read_final(T, Key(k))))
        .sum();
    assert_eq!(total, ACCOUNTS * 100);
    (history, audits_ok.get(), commits.get())
}

/// Every read of a written version names its installer, read from the record's writer word
/// (not reported by the writer's protocol), and that installer's record lists this write;
/// returns how many reads were attributed so (loaded versions have no installer).
pub fn attributed_reads(history: &History) -> usize {
    use std::collections::HashSet;
    let writes: HashSet<_> = history
        .txns
        .iter()
        .flat_map(|t| {
            t.writes
                .iter()
                .map(move |w| (t.id, w.table, w.key, w.version))
        })
        .collect();
    let mut attributed = 0;
    for t in &history.txns {
        for r in &t.reads {
            match r.writer {
                None => assert_eq!(
                    r.version,
                    dmem_txn::Version::INITIAL,
                    "{:?} read {r:?}: a written version without its installer",
                    t.id
                ),
                Some(w) => {
                    assert!(
                        writes.contains(&(w, r.table, r.key, r.version)),
                        "{:?} read {r:?}: its installer recorded no such write",
                        t.id
                    );
                    attributed += 1;
                }
            }
        }
    }
    attributed
}

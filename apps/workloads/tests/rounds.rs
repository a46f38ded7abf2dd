//! Rounds per transaction type: every generated transaction runs on the reference store
//! through a counting [`Transaction`] wrapper that records each `read_round` (and each single
//! `read` / `read_for_update`, a round of one), and the rounds are compared with what the
//! README's tables say. In a batching protocol (FORD, Motor) a round is one round trip, so
//! these are the execution-phase round trips of each type.

use std::collections::{BTreeMap, BTreeSet};

use dmem_txn::{Access, Key, ReadReq, RoundValues, TableId, Transaction, TxnError};
use dmem_workloads::kv::{self, KvConfig, KvTxn, KvWorkload, YcsbMix};
use dmem_workloads::reference::block_on;
use dmem_workloads::smallbank::{CHECKING, SAVINGS, SmallBank, SmallBankConfig, SmallBankTxn};
use dmem_workloads::tatp::{
    ACCESS_INFO, CALL_FORWARDING, SPECIAL_FACILITY, SUBSCRIBER, Tatp, TatpConfig, TatpTxn,
};
use dmem_workloads::tpcc::{
    CUSTOMER, CUSTOMER_LAST_ORDER, CUSTOMER_NAME_INDEX, CustomerSelector, DISTRICT, ITEM,
    NEW_ORDER, NEW_ORDER_HEAD, ORDER, ORDER_LINE, STOCK, Tpcc, TpccConfig, TpccTxn, WAREHOUSE,
};
use dmem_workloads::{Outcome, ReferenceStore, Scale, TxnGenerator, TxnInfo, Workload};

/// Forwards everything to `inner` and records the requests of every round.
struct Counting<T> {
    inner: T,
    rounds: Vec<Vec<ReadReq>>,
}

impl<T: Transaction> Transaction for Counting<T> {
    async fn read_round(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        self.rounds.push(reqs.to_vec());
        self.inner.read_round(reqs).await
    }

    async fn read(&mut self, table: TableId, key: Key) -> Result<Option<Vec<u8>>, TxnError> {
        self.rounds.push(vec![ReadReq::read(table, key)]);
        self.inner.read(table, key).await
    }

    async fn read_for_update(
        &mut self,
        table: TableId,
        key: Key,
    ) -> Result<Option<Vec<u8>>, TxnError> {
        self.rounds.push(vec![ReadReq::for_update(table, key)]);
        self.inner.read_for_update(table, key).await
    }

    async fn write(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.inner.write(table, key, value).await
    }

    async fn insert(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.inner.insert(table, key, value).await
    }

    async fn delete(&mut self, table: TableId, key: Key) -> Result<(), TxnError> {
        self.inner.delete(table, key).await
    }

    async fn commit(self) -> Result<(), TxnError> {
        self.inner.commit().await
    }

    async fn abort(self) {
        self.inner.abort().await;
    }
}

const R: Access = Access::Read;
const U: Access = Access::ForUpdate;

/// A run of `n` consecutive requests of one round to `table` with `access`.
type Run = (TableId, Access, usize);

/// The rounds of one transaction, each as its runs of requests.
type Shape = Vec<Vec<Run>>;

fn shape(rounds: &[Vec<ReadReq>]) -> Shape {
    rounds
        .iter()
        .map(|round| {
            let mut runs: Vec<Run> = Vec::new();
            for r in round {
                match runs.last_mut() {
                    Some((t, a, n)) if *t == r.table && *a == r.access => *n += 1,
                    _ => runs.push((r.table, r.access, 1)),
                }
            }
            runs
        })
        .collect()
}

/// Runs `count` generated transactions serially on the reference store, each through
/// [`Counting`], committing or rolling back as `run` says.
fn run_counted<W: Workload>(w: &W, seed: u64, count: usize) -> Vec<(W::Txn, Outcome, Shape)> {
    let mut store = ReferenceStore::loaded(w).expect("load");
    let mut g = w.generator(0, seed);
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let txn = g.next_txn();
        let mut tx = Counting {
            inner: store.begin(txn.kind()),
            rounds: Vec::new(),
        };
        let outcome = block_on(w.run(&txn, &mut tx)).expect("the reference store never fails");
        let rounds = std::mem::take(&mut tx.rounds);
        match outcome {
            Outcome::Rollback(_) => block_on(tx.abort()),
            _ => block_on(tx.commit()).expect("commit"),
        }
        out.push((txn, outcome, shape(&rounds)));
    }
    out
}

/// Every type was drawn, and the round counts seen per type are exactly `expected`.
fn assert_round_counts<W: Workload>(
    w: &W,
    runs: &[(W::Txn, Outcome, Shape)],
    expected: &[(&str, &[usize])],
) {
    let mut seen: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    for (txn, _, s) in runs {
        seen.entry(w.txn_types()[txn.type_index()].name)
            .or_default()
            .insert(s.len());
    }
    let expected: BTreeMap<&str, BTreeSet<usize>> = expected
        .iter()
        .map(|&(name, counts)| (name, counts.iter().copied().collect()))
        .collect();
    assert_eq!(seen, expected, "{}: rounds per type", w.name());
}

#[test]
fn kvs_and_ycsb_read_every_key_in_one_round() {
    let table = kv::TABLE;
    for (w, ops) in [
        (KvWorkload::new(KvConfig::kvs(Scale::Tiny)), 1),
        (
            KvWorkload::new(KvConfig {
                ops_per_txn: 4,
                ..KvConfig::ycsb(Scale::Tiny, YcsbMix::A)
            }),
            4,
        ),
    ] {
        let runs = run_counted(&w, 7, 2000);
        for (txn, _, s) in &runs {
            let access = match txn {
                KvTxn::Read { .. } => R,
                KvTxn::Update { .. } => U,
                KvTxn::Micro { .. } => unreachable!("no micro workload here"),
            };
            assert_eq!(s, &vec![vec![(table, access, ops)]], "{txn:?}");
        }
        let names: Vec<&str> = w.txn_types().iter().map(|t| t.name).collect();
        assert_round_counts(&w, &runs, &[(names[0], &[1]), (names[1], &[1])]);
    }
}

/// OOCC §III-C's unknown read sets: two keys read, then two keys derived from their values
/// (for update in an update transaction) in a second round.
#[test]
fn unknown_read_sets_take_a_second_round_that_depends_on_the_first() {
    let table = kv::TABLE;
    let w = KvWorkload::new(KvConfig::ycsb(Scale::Tiny, YcsbMix::UnknownReadSet));
    let runs = run_counted(&w, 3, 3000);
    let mut updates = 0;
    for (txn, outcome, s) in &runs {
        let expected: Shape = match txn {
            KvTxn::Read { .. } => vec![vec![(table, R, 2)], vec![(table, R, 2)]],
            KvTxn::Update { .. } => vec![vec![(table, R, 2)], vec![(table, U, 2)]],
            KvTxn::Micro { .. } => unreachable!("no micro workload here"),
        };
        assert_eq!(s, &expected, "{txn:?}");
        if let Outcome::Commit { delta } = outcome {
            updates += delta;
        }
    }
    assert!(updates > 0, "some update transactions ran");
    let names: Vec<&str> = w.txn_types().iter().map(|t| t.name).collect();
    assert_round_counts(&w, &runs, &[(names[0], &[2]), (names[1], &[2])]);
}

#[test]
fn smallbank_issues_one_round_per_transaction() {
    let w = SmallBank::new(SmallBankConfig::preset(Scale::Tiny));
    let runs = run_counted(&w, 5, 3000);
    for (txn, _, s) in &runs {
        let expected: Shape = match txn {
            // Savings and checking of the emptied account, checking of the receiving one.
            SmallBankTxn::Amalgamate { .. } => vec![vec![(SAVINGS, U, 1), (CHECKING, U, 2)]],
            SmallBankTxn::Balance { .. } => vec![vec![(SAVINGS, R, 1), (CHECKING, R, 1)]],
            SmallBankTxn::DepositChecking { .. } => vec![vec![(CHECKING, U, 1)]],
            SmallBankTxn::SendPayment { .. } => vec![vec![(CHECKING, U, 2)]],
            SmallBankTxn::TransactSavings { .. } => vec![vec![(SAVINGS, U, 1)]],
            SmallBankTxn::WriteCheck { .. } => vec![vec![(SAVINGS, R, 1), (CHECKING, U, 1)]],
        };
        assert_eq!(s, &expected, "{txn:?}");
    }
    assert_round_counts(
        &w,
        &runs,
        &[
            ("Amalgamate", &[1]),
            ("Balance", &[1]),
            ("DepositChecking", &[1]),
            ("SendPayment", &[1]),
            ("TransactSavings", &[1]),
            ("WriteCheck", &[1]),
        ],
    );
}

#[test]
fn tatp_rounds_follow_the_dependencies() {
    let w = Tatp::new(TatpConfig::preset(Scale::Tiny));
    let runs = run_counted(&w, 9, 5000);
    for (txn, outcome, s) in &runs {
        let expected: Shape = match *txn {
            TatpTxn::GetSubscriberData { .. } => vec![vec![(SUBSCRIBER, R, 1)]],
            // The call forwardings are read only when the facility is active.
            TatpTxn::GetNewDestination { start_time, .. } => {
                let mut s = vec![vec![(SPECIAL_FACILITY, R, 1)]];
                if *outcome != Outcome::CommitMissed("no active special facility") {
                    let candidates = usize::from(start_time / 8) + 1;
                    s.push(vec![(CALL_FORWARDING, R, candidates)]);
                }
                s
            }
            TatpTxn::GetAccessData { .. } => vec![vec![(ACCESS_INFO, R, 1)]],
            TatpTxn::UpdateSubscriberData { .. } => {
                vec![vec![(SUBSCRIBER, U, 1), (SPECIAL_FACILITY, U, 1)]]
            }
            TatpTxn::UpdateLocation { .. } => vec![vec![(SUBSCRIBER, U, 1)]],
            // The call forwarding to insert is locked only when its facility exists.
            TatpTxn::InsertCallForwarding { .. } => {
                let mut s = vec![vec![(SPECIAL_FACILITY, R, 1)]];
                if *outcome != Outcome::Rollback("no special facility") {
                    s.push(vec![(CALL_FORWARDING, U, 1)]);
                }
                s
            }
            TatpTxn::DeleteCallForwarding { .. } => vec![vec![(CALL_FORWARDING, U, 1)]],
        };
        assert_eq!(s, &expected, "{txn:?} {outcome:?}");
    }
    assert_round_counts(
        &w,
        &runs,
        &[
            ("GetSubscriberData", &[1]),
            ("GetNewDestination", &[1, 2]),
            ("GetAccessData", &[1]),
            ("UpdateSubscriberData", &[1]),
            ("UpdateLocation", &[1]),
            ("InsertCallForwarding", &[1, 2]),
            ("DeleteCallForwarding", &[1]),
        ],
    );
}

#[test]
fn tpcc_rounds_follow_the_dependencies() {
    let config = TpccConfig::tiny();
    let districts = config.districts as usize;
    let w = Tpcc::new(config);
    let runs = run_counted(&w, 13, 3000);
    for (txn, outcome, s) in &runs {
        let ctx = format!("{txn:?} {outcome:?} {s:?}");
        match txn {
            TpccTxn::NewOrder(p) => {
                let n = p.items.len();
                let mut expected: Shape = vec![
                    vec![
                        (WAREHOUSE, R, 1),
                        (DISTRICT, U, 1),
                        (CUSTOMER, R, 1),
                        (CUSTOMER_LAST_ORDER, U, 1),
                    ],
                    vec![(ITEM, R, n)],
                ];
                // Stocks are locked only when every item id is used.
                if !matches!(outcome, Outcome::Rollback(_)) {
                    expected.push(vec![(STOCK, U, n)]);
                }
                assert_eq!(s, &expected, "{ctx}");
            }
            TpccTxn::Payment(p) => {
                let expected: Shape = match p.customer {
                    CustomerSelector::Id(_) => {
                        vec![vec![(WAREHOUSE, U, 1), (DISTRICT, U, 1), (CUSTOMER, U, 1)]]
                    }
                    CustomerSelector::LastName(_) => vec![
                        vec![
                            (WAREHOUSE, U, 1),
                            (DISTRICT, U, 1),
                            (CUSTOMER_NAME_INDEX, R, 1),
                        ],
                        vec![(CUSTOMER, U, 1)],
                    ],
                };
                assert_eq!(s, &expected, "{ctx}");
            }
            TpccTxn::OrderStatus(p) => {
                let mut expected: Shape = Vec::new();
                if let CustomerSelector::LastName(_) = p.customer {
                    expected.push(vec![(CUSTOMER_NAME_INDEX, R, 1)]);
                }
                expected.push(vec![(CUSTOMER, R, 1), (CUSTOMER_LAST_ORDER, R, 1)]);
                expected.push(vec![(ORDER, R, 1)]);
                let (lines, before) = s.split_last().expect("rounds");
                assert_eq!(before, &expected[..], "{ctx}");
                assert!(
                    matches!(lines[..], [(ORDER_LINE, R, k)] if (5..=15).contains(&k)),
                    "{ctx}"
                );
            }
            TpccTxn::Delivery(_) => {
                assert_eq!(s.len(), 4, "{ctx}");
                assert_eq!(s[0], vec![(NEW_ORDER_HEAD, U, districts)], "{ctx}");
                assert_eq!(s[1], vec![(NEW_ORDER, U, districts)], "{ctx}");
                let [(ORDER, U, delivered)] = s[2][..] else {
                    panic!("{ctx}");
                };
                assert!((1..=districts).contains(&delivered), "{ctx}");
                // Per delivered district: its order lines, then its customer.
                assert_eq!(s[3].len(), 2 * delivered, "{ctx}");
                for pair in s[3].chunks(2) {
                    assert!(
                        matches!(pair, [(ORDER_LINE, U, 5..=15), (CUSTOMER, U, 1)]),
                        "{ctx}"
                    );
                }
            }
            TpccTxn::StockLevel(_) => {
                assert_eq!(s.len(), 4, "{ctx}");
                assert_eq!(s[0], vec![(DISTRICT, R, 1)], "{ctx}");
                assert_eq!(s[1], vec![(ORDER, R, 20)], "{ctx}");
                let [(ORDER_LINE, R, lines)] = s[2][..] else {
                    panic!("{ctx}");
                };
                let [(STOCK, R, stocks)] = s[3][..] else {
                    panic!("{ctx}");
                };
                assert!((100..=300).contains(&lines) && stocks <= lines, "{ctx}");
            }
        }
    }
    assert_round_counts(
        &w,
        &runs,
        &[
            ("NewOrder", &[2, 3]),
            ("Payment", &[1, 2]),
            ("OrderStatus", &[3, 4]),
            ("Delivery", &[4]),
            ("StockLevel", &[4]),
        ],
    );
}

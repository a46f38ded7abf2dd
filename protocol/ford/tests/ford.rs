//! FORD (fixed) on the simulated cluster: concurrent transfers stay serializable, and undo
//! logs roll back a coordinator that crashed mid-commit.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::{ACCOUNTS, Bank, check_serializable, transfer, worker};
use dmem_ford::recovery::{recover_coordinator, scan_stray_locks};
use dmem_ford::{CnShared, Protocol, ProtocolConfig};
use dmem_layout::pill::{CoordinatorId as PillId, FailedCoordinatorSet};
use dmem_txn::{Key, Transaction, TxnKind, TxnOutcome};

fn run_concurrent(seed: u64, cfg: ProtocolConfig) {
    let bank = Bank::new(seed, 2, 2, 12);
    let done = Rc::new(RefCell::new(0));
    let mut id = 0;
    for cn in 0..2 {
        let shared = CnShared::new();
        for thread in 0..2 {
            for _ in 0..2 {
                let co = bank.coordinator(cn, thread, id, cfg, &shared);
                id += 1;
                let ctx = co.context().clone();
                bank.sim
                    .spawn(&ctx, worker(co, bank.accounts, 12, Rc::clone(&done)));
            }
        }
    }
    bank.sim.run_until_idle();
    assert_eq!(*done.borrow(), 8, "seed {seed}: every worker finished");
    bank.check_invariant(&[]);
    let h = bank.history.borrow();
    assert!(h.committed() >= 8 * 12, "seed {seed}");
    assert!(
        h.txns.iter().all(|t| t.outcome != TxnOutcome::Unknown),
        "nothing crashed, so every decided transaction was resolved"
    );
    assert!(
        h.txns.iter().any(|t| t.outcome == TxnOutcome::Aborted),
        "seed {seed}: 12 hot accounts must produce conflicts"
    );
    check_serializable(&h);
}

#[test]
fn ford_fixed_concurrent_transfers_are_serializable() {
    for seed in 0..6 {
        run_concurrent(seed, ProtocolConfig::ford_fixed());
    }
}

#[test]
fn pandora_concurrent_transfers_are_serializable() {
    for seed in 10..14 {
        run_concurrent(seed, ProtocolConfig::pandora());
    }
}

/// Crashes a FORD coordinator at every work request of one transfer and recovers it from
/// its undo logs: afterwards the money is conserved, replicas agree and no lock is held.
fn crash_sweep(cfg: ProtocolConfig) -> (usize, usize) {
    let (mut forward, mut back) = (0, 0);
    for k in 0..24 {
        let bank = Bank::new(k, 2, 1, 6);
        let shared = CnShared::new();
        let mut victim = bank.coordinator(1, 0, 5, cfg, &shared);
        bank.sim.crash_at_work_request(bank.sim.cn(1), k);
        let ctx = victim.context().clone();
        bank.sim.spawn(&ctx, async move {
            let _ = transfer(&mut victim, 1, 4, 30).await;
        });
        bank.sim.run_until_idle();
        let crashed = bank.sim.is_crashed(bank.sim.cn(1));
        // Recovery coordinator on CN 0, after active-link termination.
        for mn in 0..3 {
            bank.sim.revoke(bank.sim.mn(mn), bank.sim.cn(1));
        }
        let rc = bank.sim.context(bank.sim.cn(0), 0).unwrap();
        let store = Rc::clone(&bank.store);
        let out = Rc::new(RefCell::new(None));
        let o = Rc::clone(&out);
        let c = rc.clone();
        bank.sim.spawn(&rc, async move {
            let r = recover_coordinator(&c, &store, cfg.protocol, 5)
                .await
                .unwrap();
            let mut failed = FailedCoordinatorSet::EMPTY;
            failed.insert(PillId(5));
            let scanned = if cfg.protocol == Protocol::Ford {
                scan_stray_locks(&c, &store, &failed).await.unwrap()
            } else {
                0
            };
            // Idempotent: a second run finds the truncated log and changes nothing.
            let again = recover_coordinator(&c, &store, cfg.protocol, 5)
                .await
                .unwrap();
            assert_eq!((again.txn, again.restored), (None, 0));
            *o.borrow_mut() = Some((r, scanned));
        });
        bank.sim.run_until_idle();
        let (r, _) = out.borrow_mut().take().unwrap();
        match r.decision {
            Some(dmem_ford::logic::Decision::RollForward) => forward += 1,
            Some(dmem_ford::logic::Decision::RollBack) => back += 1,
            None => {}
        }
        // Pandora leaves not-logged stray locks for PILL to steal; FORD's scan freed them.
        let stray: &[u16] = if cfg.protocol == Protocol::Pandora {
            &[5]
        } else {
            &[]
        };
        bank.check_invariant(stray);
        let (a, _, _, _) = bank.item(1, bank.locs[&1].bucket.partition);
        let (b, _, _, _) = bank.item(4, bank.locs[&4].bucket.partition);
        assert!(
            (a, b) == (100, 100) || (a, b) == (70, 130),
            "k={k} crashed={crashed}: all or nothing, got {a}/{b}"
        );
        if !crashed {
            assert_eq!((a, b), (70, 130));
        }
    }
    (forward, back)
}

#[test]
fn ford_undo_logs_roll_back_or_forward_after_a_crash_at_any_work_request() {
    let (forward, back) = crash_sweep(ProtocolConfig::ford_fixed());
    assert!(
        back > 0,
        "some crash lands between logging and the last commit WRITE"
    );
    assert!(forward > 0, "some crash lands after every commit WRITE");
}

#[test]
fn pandora_logs_roll_back_or_forward_after_a_crash_at_any_work_request() {
    let (forward, back) = crash_sweep(ProtocolConfig::pandora());
    assert!(back > 0 && forward > 0, "{forward} forward, {back} back");
}

#[test]
fn inserts_and_deletes_commit_and_read_back() {
    let bank = Bank::new(3, 1, 1, 4);
    let shared = CnShared::new();
    let mut co = bank.coordinator(0, 0, 0, ProtocolConfig::pandora(), &shared);
    let ctx = co.context().clone();
    let ok = Rc::new(RefCell::new(false));
    let o = Rc::clone(&ok);
    bank.sim.spawn(&ctx, async move {
        let t2 = dmem_txn::TableId(2);
        let mut t = co.begin_txn(TxnKind::ReadWrite);
        assert_eq!(t.read(t2, Key(9)).await.unwrap(), None);
        t.insert(t2, Key(9), &7u64.to_le_bytes()).await.unwrap();
        assert_eq!(
            t.read(t2, Key(9)).await.unwrap(),
            Some(7u64.to_le_bytes().to_vec())
        );
        t.commit().await.unwrap();
        let mut t = co.begin_txn(TxnKind::ReadWrite);
        assert!(matches!(
            t.insert(t2, Key(9), &1u64.to_le_bytes()).await,
            Err(dmem_txn::TxnError::KeyState(9))
        ));
        t.abort().await;
        let mut t = co.begin_txn(TxnKind::ReadWrite);
        t.delete(t2, Key(9)).await.unwrap();
        t.commit().await.unwrap();
        let mut t = co.begin_txn(TxnKind::ReadOnly);
        assert_eq!(t.read(t2, Key(9)).await.unwrap(), None);
        assert!(matches!(
            t.write(ACCOUNTS, Key(0), &[0; 8]).await,
            Err(dmem_txn::TxnError::ReadOnly)
        ));
        t.commit().await.unwrap();
        // Re-insert over the tombstone reuses the slot with a newer version.
        let mut t = co.begin_txn(TxnKind::ReadWrite);
        t.insert(t2, Key(9), &8u64.to_le_bytes()).await.unwrap();
        t.commit().await.unwrap();
        *o.borrow_mut() = true;
    });
    bank.sim.run_until_idle();
    assert!(*ok.borrow());
    let h = bank.history.borrow();
    let versions: Vec<u64> = h
        .txns
        .iter()
        .filter(|t| t.outcome == TxnOutcome::Committed)
        .flat_map(|t| t.writes.iter().map(|w| w.version.0))
        .collect();
    assert_eq!(versions, vec![1, 2, 3], "insert, delete, re-insert");
    check_serializable(&h);
}

/// A sparse table pooled apart from its slots (`dmem-store`): two coordinators on two CNs
/// insert the same absent key at the same time into the same free slot, each with a record
/// of its own insert share. The slot CAS lets exactly one name its record; the other aborts,
/// retries, and finds the key present. Every replica's slot then names the winner's record,
/// which holds the winner's value; a delete and a re-insert by the loser reuse that record.
#[test]
fn concurrent_inserts_into_a_pooled_table_leave_one_record_per_key() {
    use dmem_ford::store::{TableDemand, parse_bucket};
    use dmem_ford::{StoreConfig, TableSpec};
    use dmem_layout::record::{DataItem, DataItemHeader};
    use dmem_txn::TableId;

    const SPARSE: TableId = TableId(3);
    let demand = TableDemand {
        id: SPARSE,
        value_len: 8,
        expected_records: 8,
        grows: true,
    };
    let bank = Bank::with_config(11, 2, 1, 4, 4 << 20, |cfg: StoreConfig| {
        cfg.table(TableSpec::sized_for(SPARSE, 8, 8, 3))
            .with_direct_index(SPARSE, 4096)
            .with_record_pool(&demand)
    });
    assert!(bank.store.table(SPARSE).unwrap().is_pooled());
    let key = Key(100);
    let outcomes = Rc::new(RefCell::new(Vec::new()));
    let mut stats = Vec::new();
    for cn in 0..2_u16 {
        let shared = CnShared::new();
        let mut co = bank.coordinator(cn, 0, cn, ProtocolConfig::pandora(), &shared);
        let ctx = co.context().clone();
        let out = Rc::clone(&outcomes);
        let st = Rc::new(RefCell::new(None));
        stats.push(Rc::clone(&st));
        bank.sim.spawn(&ctx, async move {
            let value = (u64::from(cn) + 1).to_le_bytes();
            let outcome = insert_until_settled(&mut co, SPARSE, key, &value).await;
            out.borrow_mut().push((cn, outcome));
            *st.borrow_mut() = Some(co.stats());
        });
    }
    bank.sim.run_until_idle();
    let outcomes = outcomes.borrow().clone();
    let winner = outcomes
        .iter()
        .find(|(_, o)| *o == "inserted")
        .map(|&(cn, _)| cn);
    let inserted = outcomes.iter().filter(|(_, o)| *o == "inserted").count();
    assert_eq!((inserted, outcomes.len()), (1, 2), "{outcomes:?}");
    let aborted: u64 = stats
        .iter()
        .map(|s| s.borrow().map_or(0, |s| s.aborted))
        .sum();
    assert!(aborted >= 1, "the two inserts did not race");
    let winner = winner.unwrap();
    let bucket = bank.store.bucket_of(SPARSE, key).unwrap();
    let item_len = DataItemHeader::item_len(8);
    let mut record = None;
    for mn in bank.store.replicas(bucket.partition) {
        let node = bank.store.mn_node(mn);
        let bytes = bank
            .sim
            .read_memory(node, bucket.offset, bucket.read_len() as usize);
        let (used, _) = parse_bucket(&bytes);
        let slots: Vec<_> = used.iter().filter(|(_, k)| *k == key.0).collect();
        assert_eq!(slots.len(), 1, "MN {mn}: {used:?}");
        let loc = bank
            .store
            .item_in_bucket(bucket, slots[0].0, &bytes)
            .unwrap();
        assert_eq!(*record.get_or_insert(loc.offset), loc.offset, "MN {mn}");
        let item_bytes = bank.sim.read_memory(node, loc.offset, item_len);
        let item = DataItem::new_checked(&item_bytes[..]).unwrap();
        assert!(item.is_readable(), "MN {mn}");
        assert_eq!(item.value(), &(u64::from(winner) + 1).to_le_bytes()[..]);
    }
    // The loser deletes and re-inserts: the slot keeps naming the same record.
    let shared = CnShared::new();
    let loser = 1 - winner;
    let mut co = bank.coordinator(loser, 0, 2, ProtocolConfig::pandora(), &shared);
    let ctx = co.context().clone();
    bank.sim.spawn(&ctx, async move {
        let mut t = co.begin_txn(TxnKind::ReadWrite);
        t.delete(SPARSE, key).await.unwrap();
        t.commit().await.unwrap();
        let mut t = co.begin_txn(TxnKind::ReadWrite);
        t.insert(SPARSE, key, &9u64.to_le_bytes()).await.unwrap();
        t.commit().await.unwrap();
    });
    bank.sim.run_until_idle();
    let node = bank
        .store
        .mn_node(bank.store.primary(bucket.partition).unwrap());
    let item_bytes = bank.sim.read_memory(node, record.unwrap(), item_len);
    let item = DataItem::new_checked(&item_bytes[..]).unwrap();
    assert_eq!(item.value(), &9u64.to_le_bytes()[..]);
    check_serializable(&bank.history.borrow());
}

/// A hashed table with pooled records (`StoreConfig::with_hashed_pools`, TPC-C's layout):
/// four coordinators on two CNs insert four *different* keys of one bucket at the same
/// time. Each takes the bucket's first free slot and a record of its own share, so they
/// race on the slot's address CAS: losers abort and retry into the next free slot. Every
/// key ends in a slot of its own on every replica, naming a distinct record that holds its
/// value, and the history is serializable; a second round of inserts of the same keys finds
/// them all present.
#[test]
fn concurrent_inserts_into_a_hashed_pooled_table_take_distinct_slots() {
    use dmem_ford::store::parse_bucket;
    use dmem_layout::record::{DataItem, DataItemHeader};
    use dmem_txn::TableId;

    const HASHED: TableId = TableId(3);
    let bank = hashed_pooled_bank(12, HASHED);
    let layout = *bank.store.table(HASHED).unwrap();
    assert!(layout.is_pooled() && layout.spec.direct_keys.is_none());
    // Four keys that hash to one bucket.
    let first = bank.store.bucket_of(HASHED, Key(1_000)).unwrap();
    let keys: Vec<Key> = (1_000..)
        .map(Key)
        .filter(|&k| bank.store.bucket_of(HASHED, k).unwrap() == first)
        .take(4)
        .collect();
    assert!(keys.len() < first.slot_count());
    let outcomes = Rc::new(RefCell::new(Vec::new()));
    let mut stats = Vec::new();
    for (i, &key) in keys.iter().enumerate() {
        let (cn, thread) = ((i % 2) as u16, (i / 2) as u16);
        let shared = CnShared::new();
        let mut co = bank.coordinator(cn, thread, i as u16, ProtocolConfig::pandora(), &shared);
        let ctx = co.context().clone();
        let out = Rc::clone(&outcomes);
        let st = Rc::new(RefCell::new(None));
        stats.push(Rc::clone(&st));
        bank.sim.spawn(&ctx, async move {
            let value = (key.0 * 3).to_le_bytes();
            for round in 0..2 {
                let outcome = insert_until_settled(&mut co, HASHED, key, &value).await;
                out.borrow_mut().push((round, key, outcome));
            }
            *st.borrow_mut() = Some(co.stats());
        });
    }
    bank.sim.run_until_idle();
    let outcomes = outcomes.borrow().clone();
    let count = |round, outcome| {
        outcomes
            .iter()
            .filter(|&&(r, _, o)| r == round && o == outcome)
            .count()
    };
    assert_eq!(
        (count(0, "inserted"), count(1, "exists")),
        (4, 4),
        "{outcomes:?}"
    );
    let aborted: u64 = stats
        .iter()
        .map(|s| s.borrow().map_or(0, |s| s.aborted))
        .sum();
    assert!(aborted >= 1, "the inserts did not race for a slot");
    let item_len = DataItemHeader::item_len(8);
    for mn in bank.store.replicas(first.partition) {
        let node = bank.store.mn_node(mn);
        let bytes = bank
            .sim
            .read_memory(node, first.offset, first.read_len() as usize);
        let (used, _) = parse_bucket(&bytes);
        let mut records = Vec::new();
        for key in &keys {
            let slots: Vec<_> = used.iter().filter(|(_, k)| *k == key.0).collect();
            assert_eq!(slots.len(), 1, "MN {mn}, key {}: {used:?}", key.0);
            let loc = bank
                .store
                .item_in_bucket(first, slots[0].0, &bytes)
                .unwrap();
            let item_bytes = bank.sim.read_memory(node, loc.offset, item_len);
            let item = DataItem::new_checked(&item_bytes[..]).unwrap();
            assert!(item.is_readable(), "MN {mn}");
            assert_eq!(item.value(), &(key.0 * 3).to_le_bytes()[..]);
            records.push(loc.offset);
        }
        records.sort_unstable();
        records.dedup();
        assert_eq!(
            records.len(),
            keys.len(),
            "MN {mn}: two keys share a record"
        );
    }
    check_serializable(&bank.history.borrow());
}

/// Two coordinators on two CNs insert the *same* absent key of a hashed pooled table, the
/// second starting 0–12 µs after the first. An insert takes the bucket's first free slot by
/// a CAS of its address word and WRITEs the key one round trip later; a second insert whose
/// bucket READ falls between the two sees a slot with an address and no key. It must not
/// take the next free slot (both would commit, the key indexed twice): it aborts and its
/// retry finds the key. At every offset one insert commits, the other finds the key, and
/// the key has one slot on every replica.
#[test]
fn concurrent_inserts_of_one_key_into_a_hashed_pooled_table_index_it_once() {
    use dmem_ford::store::parse_bucket;
    use dmem_txn::TableId;
    use dmem_verbs::Clock;

    const HASHED: TableId = TableId(3);
    for offset_us in 0..=12_u64 {
        let bank = hashed_pooled_bank(12, HASHED);
        let key = Key(1_000 + offset_us);
        let bucket = bank.store.bucket_of(HASHED, key).unwrap();
        let outcomes = Rc::new(RefCell::new(Vec::new()));
        for cn in 0..2_u16 {
            let shared = CnShared::new();
            let mut co = bank.coordinator(cn, 0, cn, ProtocolConfig::pandora(), &shared);
            let ctx = co.context().clone();
            let out = Rc::clone(&outcomes);
            let delay = if cn == 1 { offset_us * 1_000 } else { 0 };
            bank.sim.spawn(&ctx.clone(), async move {
                if delay > 0 {
                    ctx.sleep(delay).await;
                }
                let value = u64::from(cn + 1).to_le_bytes();
                let outcome = insert_until_settled(&mut co, HASHED, key, &value).await;
                out.borrow_mut().push(outcome);
            });
        }
        bank.sim.run_until_idle();
        let mut outcomes = outcomes.borrow().clone();
        outcomes.sort_unstable();
        assert_eq!(outcomes, ["exists", "inserted"], "offset {offset_us} µs");
        for mn in bank.store.replicas(bucket.partition) {
            let node = bank.store.mn_node(mn);
            let bytes = bank
                .sim
                .read_memory(node, bucket.offset, bucket.read_len() as usize);
            let (used, _) = parse_bucket(&bytes);
            let slots = used.iter().filter(|(_, k)| *k == key.0).count();
            assert_eq!(slots, 1, "offset {offset_us} µs, MN {mn}: {used:?}");
        }
        check_serializable(&bank.history.borrow());
    }
}

/// Inserts `key` with `value` until the insert commits (`"inserted"`) or finds the key
/// present (`"exists"`), aborting and retrying on any other error.
async fn insert_until_settled(
    co: &mut dmem_ford::FordCoordinator<dmem_sim::SimContext, Rc<RefCell<dmem_txn::History>>>,
    table: dmem_txn::TableId,
    key: Key,
    value: &[u8],
) -> &'static str {
    loop {
        let mut t = co.begin_txn(TxnKind::ReadWrite);
        match t.insert(table, key, value).await {
            Ok(()) => match t.commit().await {
                Ok(_) => return "inserted",
                Err(_) => continue,
            },
            Err(dmem_txn::TxnError::KeyState(_)) => {
                t.abort().await;
                return "exists";
            }
            Err(_) => t.abort().await,
        }
    }
}

/// A bank with a hashed table `table` whose records are pooled (TPC-C's layout).
fn hashed_pooled_bank(seed: u64, table: dmem_txn::TableId) -> Bank {
    use dmem_ford::store::TableDemand;
    use dmem_ford::{StoreConfig, TableSpec};
    let demand = TableDemand {
        id: table,
        value_len: 8,
        expected_records: 64,
        grows: true,
    };
    Bank::with_config(seed, 2, 2, 4, 4 << 20, |cfg: StoreConfig| {
        cfg.table(TableSpec::sized_for(table, 8, 20_000, 3))
            .with_hashed_pools(&[demand], 2)
    })
}

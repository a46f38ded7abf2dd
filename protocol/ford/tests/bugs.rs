//! Each of FORD's six bugs (Pandora Table 1, §5.1) behind its switch: the scenario of the
//! paper produces the wrong outcome with the switch on and the right one with it off.
//!
//! Two coordinators are interleaved step by step inside one simulated task, so every
//! scenario is deterministic.

mod common;

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;

use common::{ACCOUNTS, Bank};
use dmem_ford::recovery::recover_coordinator;
use dmem_ford::{BugSet, CnShared, FordBug, ProtocolConfig};
use dmem_layout::log::LogRegion;
use dmem_sim::SimContext;
use dmem_txn::{Key, TableId, Transaction, TxnKind};

fn cfg(bug: Option<FordBug>) -> ProtocolConfig {
    match bug {
        Some(b) => ProtocolConfig::ford_with(BugSet::NONE.with(b)),
        None => ProtocolConfig::ford_fixed(),
    }
}

type Co = dmem_ford::FordCoordinator<SimContext, Rc<RefCell<dmem_txn::History>>>;

/// Runs `scenario` with coordinators 1 and 2 on CN 0 and returns its result.
fn run<R: 'static, F: Future<Output = R> + 'static>(
    bank: &Bank,
    c: ProtocolConfig,
    scenario: impl FnOnce(Co, Co) -> F,
) -> R {
    let shared = CnShared::new();
    let a = bank.coordinator(0, 0, 1, c, &shared);
    let b = bank.coordinator(0, 0, 2, c, &shared);
    let ctx = a.context().clone();
    let out = Rc::new(RefCell::new(None));
    let o = Rc::clone(&out);
    let fut = scenario(a, b);
    bank.sim.spawn(&ctx, async move {
        *o.borrow_mut() = Some(fut.await);
    });
    bank.sim.run_until_idle();
    out.borrow_mut().take().expect("scenario finished")
}

fn bal(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

/// Whether coordinator `id` has a valid log on any MN.
fn has_valid_log(bank: &Bank, id: u16) -> bool {
    let off = bank.store.log_offset(id).unwrap();
    (0..3).any(|mn| {
        let bytes =
            bank.sim
                .read_memory(bank.store.mn_node(mn), off, bank.store.log_region_bytes());
        LogRegion::new_checked(&bytes[..]).is_ok_and(|l| l.is_valid())
    })
}

/// Keys named in coordinator `id`'s valid logs.
fn logged_keys(bank: &Bank, id: u16) -> Vec<(u32, u64)> {
    let off = bank.store.log_offset(id).unwrap();
    let mut keys = Vec::new();
    for mn in 0..3 {
        let bytes =
            bank.sim
                .read_memory(bank.store.mn_node(mn), off, bank.store.log_region_bytes());
        if let Some(t) = dmem_ford::logic::parse_log_copy(&bytes, id) {
            for w in t.writes {
                if !keys.contains(&(w.table, w.key)) {
                    keys.push((w.table, w.key));
                }
            }
        }
    }
    keys
}

fn primary(bank: &Bank, key: u64) -> u16 {
    bank.locs[&key].bucket.partition
}

#[test]
fn complicit_abort_releases_a_lock_it_never_held() {
    for bug in [None, Some(FordBug::ComplicitAbort)] {
        let bank = Bank::new(1, 1, 1, 4);
        run(&bank, cfg(bug), |mut a, mut b| async move {
            let mut ta = a.begin_txn(TxnKind::ReadWrite);
            ta.read_for_update(ACCOUNTS, Key(0)).await.unwrap();
            let mut tb = b.begin_txn(TxnKind::ReadWrite);
            assert!(tb.read_for_update(ACCOUNTS, Key(0)).await.is_err());
            tb.abort().await;
            std::mem::forget(ta); // A still holds X
        });
        let (_, lock, _, _) = bank.item(0, primary(&bank, 0));
        if bug.is_some() {
            assert_eq!(lock, 0, "B released A's lock");
        } else {
            assert_eq!(lock, dmem_ford::logic::my_lock(1), "A still holds X");
        }
    }
}

#[test]
fn covert_locks_let_validation_pass_over_a_locked_read() {
    // Litmus 2: A reads X and writes Y; B locks X (to write it) before A validates.
    for bug in [None, Some(FordBug::CovertLocks)] {
        let bank = Bank::new(2, 1, 1, 4);
        let committed = run(&bank, cfg(bug), |mut a, mut b| async move {
            let mut ta = a.begin_txn(TxnKind::ReadWrite);
            ta.read(ACCOUNTS, Key(0)).await.unwrap();
            ta.read_for_update(ACCOUNTS, Key(1)).await.unwrap();
            ta.write(ACCOUNTS, Key(1), &bal(1)).await.unwrap();
            let mut tb = b.begin_txn(TxnKind::ReadWrite);
            tb.read(ACCOUNTS, Key(1)).await.unwrap_err(); // Y is locked by A
            tb.abort().await;
            let mut tb = b.begin_txn(TxnKind::ReadWrite);
            tb.read_for_update(ACCOUNTS, Key(0)).await.unwrap();
            let r = ta.commit().await.is_ok();
            tb.abort().await;
            r
        });
        assert_eq!(committed, bug.is_some(), "bug {bug:?}");
    }
}

#[test]
fn relaxed_locks_validate_before_every_lock_is_held() {
    // Litmus 2 with blind writes: A reads X, writes Y; B reads Y, writes X; both commit at
    // once. Validated after locking, at most one commits; relaxed, both can.
    let mut both_with_bug = 0;
    for seed in 0..8 {
        for bug in [None, Some(FordBug::RelaxedLocks)] {
            // On two CNs, so neither NIC serialises the two batches.
            let bank = Bank::new(seed, 2, 1, 4);
            let shared = CnShared::new();
            let c = cfg(bug);
            let results = Rc::new(RefCell::new(Vec::new()));
            for (id, cn, read, write) in [(1u16, 0u16, 0u64, 1u64), (2, 1, 1, 0)] {
                let mut co = bank.coordinator(cn, 0, id, c, &shared);
                let ctx = co.context().clone();
                let r = Rc::clone(&results);
                let ctx2 = ctx.clone();
                bank.sim.spawn(&ctx, async move {
                    let mut t = co.begin_txn(TxnKind::ReadWrite);
                    t.read(ACCOUNTS, Key(read)).await.unwrap();
                    t.write(ACCOUNTS, Key(write), &bal(1)).await.unwrap();
                    // Both commit phases start at the same instant.
                    dmem_verbs::Clock::sleep_until(&ctx2, 200_000).await;
                    let ok = t.commit().await.is_ok();
                    r.borrow_mut().push(ok);
                });
            }
            bank.sim.run_until_idle();
            let both = results.borrow().iter().all(|&ok| ok);
            if bug.is_some() {
                both_with_bug += usize::from(both);
            } else {
                assert!(!both, "seed {seed}: fixed FORD committed a write skew");
            }
        }
    }
    assert!(
        both_with_bug > 0,
        "relaxed locks never produced the write skew"
    );
}

#[test]
fn missing_insert_log_leaves_a_half_inserted_record_after_roll_back() {
    // A inserts K and updates X; it crashes after K is written everywhere but before X is:
    // recovery rolls back, and only a logged insert can be undone.
    for bug in [None, Some(FordBug::MissingInsertLog)] {
        let mut saw_orphan = false;
        for k in 0..30 {
            let bank = Bank::new(k, 2, 1, 4);
            let shared = CnShared::new();
            let mut a = bank.coordinator(1, 0, 3, cfg(bug), &shared);
            bank.sim.crash_at_work_request(bank.sim.cn(1), k);
            let ctx = a.context().clone();
            bank.sim.spawn(&ctx, async move {
                let mut t = a.begin_txn(TxnKind::ReadWrite);
                t.insert(TableId(2), Key(77), &bal(5)).await.unwrap();
                t.read_for_update(ACCOUNTS, Key(0)).await.unwrap();
                t.write(ACCOUNTS, Key(0), &bal(55)).await.unwrap();
                let _ = t.commit().await;
            });
            bank.sim.run_until_idle();
            for mn in 0..3 {
                bank.sim.revoke(bank.sim.mn(mn), bank.sim.cn(1));
            }
            let rc = bank.sim.context(bank.sim.cn(0), 0).unwrap();
            let store = Rc::clone(&bank.store);
            let c = rc.clone();
            bank.sim.spawn(&rc, async move {
                recover_coordinator(&c, &store, dmem_ford::Protocol::Ford, 3)
                    .await
                    .unwrap();
            });
            bank.sim.run_until_idle();
            // Read K and X out of band.
            let x_updated = bank.item(0, primary(&bank, 0)).0 == 55;
            let b = bank.store.bucket_of(TableId(2), Key(77)).unwrap();
            let loc = bank.store.item_at(b, 0).unwrap();
            let k_bytes = bank.sim.read_memory(
                bank.store.mn_node(b.partition),
                loc.offset,
                dmem_layout::record::DataItemHeader::item_len(8),
            );
            let item = dmem_layout::record::DataItem::new_checked(&k_bytes[..]).unwrap();
            let k_visible = item.key() == 77 && item.header().flags().is_valid();
            if k_visible != x_updated {
                saw_orphan = true;
            }
        }
        assert_eq!(saw_orphan, bug.is_some(), "bug {bug:?}");
    }
}

#[test]
fn lost_decision_lets_recovery_undo_someone_elses_commit() {
    // Litmus 3: A writes Y and Z, logs, then fails validation (X changed) and aborts. C
    // then commits Y. A's CN fails: with A's log still valid, recovery sees Y updated and
    // Z not, rolls back, and erases C's committed write of Y.
    for bug in [None, Some(FordBug::LostDecision)] {
        let bank = Bank::new(4, 2, 1, 6);
        run(&bank, cfg(bug), |mut a, mut c| async move {
            let mut ta = a.begin_txn(TxnKind::ReadWrite);
            ta.read(ACCOUNTS, Key(0)).await.unwrap();
            ta.read_for_update(ACCOUNTS, Key(1)).await.unwrap();
            ta.read_for_update(ACCOUNTS, Key(2)).await.unwrap();
            ta.write(ACCOUNTS, Key(1), &bal(90)).await.unwrap();
            ta.write(ACCOUNTS, Key(2), &bal(110)).await.unwrap();
            let mut tc = c.begin_txn(TxnKind::ReadWrite);
            tc.read_for_update(ACCOUNTS, Key(0)).await.unwrap();
            tc.write(ACCOUNTS, Key(0), &bal(100)).await.unwrap();
            tc.commit().await.unwrap();
            assert!(ta.commit().await.is_err(), "X changed: A aborts");
            let mut tc = c.begin_txn(TxnKind::ReadWrite);
            tc.read_for_update(ACCOUNTS, Key(1)).await.unwrap();
            tc.write(ACCOUNTS, Key(1), &bal(123)).await.unwrap();
            tc.commit().await.unwrap();
        });
        assert_eq!(has_valid_log(&bank, 1), bug.is_some());
        let rc = bank.sim.context(bank.sim.cn(1), 0).unwrap();
        let store = Rc::clone(&bank.store);
        let c = rc.clone();
        bank.sim.spawn(&rc, async move {
            recover_coordinator(&c, &store, dmem_ford::Protocol::Ford, 1)
                .await
                .unwrap();
        });
        bank.sim.run_until_idle();
        let y = bank.item(1, primary(&bank, 1)).0;
        if bug.is_some() {
            assert_eq!(y, 100, "recovery rolled back C's committed write");
        } else {
            assert_eq!(y, 123, "C's committed write survives");
        }
    }
}

#[test]
fn log_without_lock_logs_an_object_it_never_locked() {
    // A locks Z, then fails to lock X (B holds it) but has logged X already. B commits X.
    // A's CN fails before its abort: recovery sees X updated, Z not, rolls back X.
    for bug in [None, Some(FordBug::LogWithoutLock)] {
        let bank = Bank::new(5, 2, 1, 6);
        run(&bank, cfg(bug), |mut a, mut b| async move {
            let mut tb = b.begin_txn(TxnKind::ReadWrite);
            tb.read_for_update(ACCOUNTS, Key(3)).await.unwrap();
            let mut ta = a.begin_txn(TxnKind::ReadWrite);
            ta.read_for_update(ACCOUNTS, Key(2)).await.unwrap();
            assert!(ta.read_for_update(ACCOUNTS, Key(3)).await.is_err());
            tb.write(ACCOUNTS, Key(3), &bal(140)).await.unwrap();
            tb.commit().await.unwrap();
            std::mem::forget(ta); // A's CN dies before it can abort
        });
        let keys = logged_keys(&bank, 1);
        assert_eq!(keys.contains(&(ACCOUNTS.0, 3)), bug.is_some(), "{keys:?}");
        let rc = bank.sim.context(bank.sim.cn(1), 0).unwrap();
        let store = Rc::clone(&bank.store);
        let c = rc.clone();
        bank.sim.spawn(&rc, async move {
            recover_coordinator(&c, &store, dmem_ford::Protocol::Ford, 1)
                .await
                .unwrap();
        });
        bank.sim.run_until_idle();
        let x = bank.item(3, primary(&bank, 3)).0;
        assert_eq!(x, if bug.is_some() { 100 } else { 140 }, "bug {bug:?}");
    }
}

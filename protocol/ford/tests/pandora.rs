//! Pandora end to end: a CN crashes mid-commit, the failure detector suspects it, its links
//! are terminated, its logs are recovered and truncated, survivors are notified and steal
//! its stray locks; and PILL stealing on its own.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::{ACCOUNTS, Bank, SimTerminator, check_serializable, worker};
use dmem_ford::recovery::{heartbeat_loop, membership_listener};
use dmem_ford::{CnShared, Member, Protocol, ProtocolConfig, RecoveryManager};
use dmem_layout::pill::CoordinatorId as PillId;
use dmem_txn::{Key, Transaction, TxnKind};
use dmem_verbs::Verbs;

const DEADLINE: u64 = 30_000_000;

fn crash_and_recover(seed: u64, crash_at: u64) -> (usize, u64) {
    // CN 0 and CN 1 run transactions; CN 2 runs the failure detector and recovery.
    let bank = Bank::new(seed, 3, 2, 10);
    let cfg = ProtocolConfig::pandora();
    let done = Rc::new(RefCell::new(0));
    let fd_ctx = bank.sim.context(bank.sim.cn(2), 0).unwrap();
    let mut members = Vec::new();
    let mut id = 0;
    let mut shared_of = Vec::new();
    for cn in 0..2 {
        let shared = CnShared::new();
        let listener = bank.sim.context(bank.sim.cn(cn), 0).unwrap();
        let mut ids = Vec::new();
        for thread in 0..2 {
            for _ in 0..2 {
                let co = bank.coordinator(cn, thread, id, cfg, &shared);
                ids.push(id);
                id += 1;
                let ctx = co.context().clone();
                bank.sim
                    .spawn(&ctx, worker(co, bank.accounts, 25, Rc::clone(&done)));
            }
        }
        members.push(Member {
            cn: bank.sim.cn(cn),
            coordinators: ids,
            listener: listener.local_endpoint(),
        });
        let hb = bank.sim.context(bank.sim.cn(cn), 1).unwrap();
        let fd = fd_ctx.local_endpoint();
        let h = hb.clone();
        bank.sim.spawn(&hb, async move {
            let _ = heartbeat_loop(&h, fd, 10_000, DEADLINE).await;
        });
        let failed = Rc::clone(&shared.failed);
        let l = listener.clone();
        bank.sim.spawn(&listener, async move {
            let _ = membership_listener(&l, failed, 5_000, DEADLINE).await;
        });
        shared_of.push(shared);
    }
    let mut manager = RecoveryManager::new(
        fd_ctx.clone(),
        Rc::clone(&bank.store),
        Protocol::Pandora,
        SimTerminator(Rc::clone(&bank.sim)),
        members,
        50_000,
    );
    let events = manager.events();
    bank.sim.spawn(&fd_ctx, async move {
        manager.run(DEADLINE, 5_000).await.unwrap();
    });
    bank.sim.crash_at_work_request(bank.sim.cn(1), crash_at);
    bank.sim.run_until(DEADLINE + 1_000_000);

    assert!(bank.sim.is_crashed(bank.sim.cn(1)));
    let events = events.borrow();
    assert_eq!(events.len(), 1, "seed {seed}: exactly CN 1 was suspected");
    let ev = &events[0];
    assert_eq!(ev.cn, bank.sim.cn(1));
    assert_eq!(ev.coordinators.len(), 4);
    assert!(ev.detected_at <= ev.terminated_at && ev.terminated_at <= ev.notified_at);
    // The survivors learnt the failed ids and finished all their transactions.
    for c in 4..8 {
        assert!(shared_of[0].failed.borrow().contains(PillId(c)));
    }
    assert_eq!(
        *done.borrow(),
        4,
        "seed {seed}: CN 0's coordinators all finished"
    );
    bank.check_invariant(&[4, 5, 6, 7]);
    check_serializable(&bank.history.borrow());
    let logged = ev.coordinators.iter().filter(|c| c.txn.is_some()).count();
    (logged, ev.notified_at - ev.detected_at)
}

#[test]
fn pandora_recovers_a_crashed_cn_while_the_other_keeps_running() {
    let mut logged = 0;
    for (seed, k) in [(1, 120), (2, 157), (3, 201), (4, 263), (5, 311), (6, 90)] {
        let (l, latency) = crash_and_recover(seed, k);
        logged += l;
        assert!(latency < 1_000_000, "recovery took {latency} ns");
    }
    assert!(logged > 0, "some crash left a logged stray transaction");
}

#[test]
fn pill_steals_stray_locks_and_reads_ignore_them() {
    let bank = Bank::new(9, 1, 1, 4);
    // Coordinator 7 "failed" holding account 2's lock.
    let loc = bank.locs[&2];
    let word = dmem_ford::logic::my_lock(7);
    for run in [ProtocolConfig::ford_fixed(), ProtocolConfig::pandora()] {
        bank.sim.write_memory(
            bank.store.mn_node(loc.bucket.partition),
            loc.offset,
            &word.to_le_bytes(),
        );
        let shared = CnShared::new();
        shared.failed.borrow_mut().insert(PillId(7));
        let mut co = bank.coordinator(0, 0, 1, run, &shared);
        let ctx = co.context().clone();
        let out = Rc::new(RefCell::new(None));
        let o = Rc::clone(&out);
        bank.sim.spawn(&ctx, async move {
            let mut t = co.begin_txn(TxnKind::ReadOnly);
            let read = t.read(ACCOUNTS, Key(2)).await;
            if read.is_ok() {
                t.commit().await.unwrap();
            } else {
                t.abort().await;
            }
            let mut t = co.begin_txn(TxnKind::ReadWrite);
            let r = t.read_for_update(ACCOUNTS, Key(2)).await;
            let wrote = match r {
                Ok(_) => {
                    t.write(ACCOUNTS, Key(2), &100u64.to_le_bytes())
                        .await
                        .unwrap();
                    t.commit().await.is_ok()
                }
                Err(_) => {
                    t.abort().await;
                    false
                }
            };
            *o.borrow_mut() = Some((read.is_ok(), wrote, co.stats()));
        });
        bank.sim.run_until_idle();
        let (read_ok, wrote, stats) = out.borrow_mut().take().unwrap();
        let (_, lock, version, _) = bank.item(2, loc.bucket.partition);
        if run.protocol == Protocol::Pandora {
            assert!(
                read_ok && wrote,
                "PILL ignores the stray lock and steals it"
            );
            assert_eq!((stats.steals, stats.stray_reads), (1, 1));
            assert_eq!(lock, 0, "the thief released it at commit");
            assert_eq!(version, 1);
        } else {
            assert!(
                !read_ok && !wrote,
                "FORD cannot tell a stray lock from a live one"
            );
            assert_eq!(lock, word, "FORD leaves the stray lock for the scan");
            assert_eq!(stats.steals, 0);
        }
    }
}

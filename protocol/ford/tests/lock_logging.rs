//! Traditional lock logging ("log before lock", Pandora §6.1, §6.2.1): concurrent transfers
//! stay serializable and conserve money, and after a crash at any work request log
//! recovery releases every lock of the failed coordinator from its lock log, with no scan
//! and no stealing.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::{Bank, check_serializable, transfer, worker};
use dmem_ford::logic::Decision;
use dmem_ford::recovery::recover_coordinator;
use dmem_ford::{CnShared, ProtocolConfig};
use dmem_txn::TxnOutcome;

#[test]
fn lock_logging_concurrent_transfers_are_serializable() {
    let cfg = ProtocolConfig::pandora_lock_logging();
    assert!(!cfg.pill(), "lock logging replaces PILL");
    for seed in 20..24 {
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
        assert!(h.txns.iter().any(|t| t.outcome == TxnOutcome::Aborted));
        check_serializable(&h);
    }
}

#[test]
fn lock_log_releases_every_stray_lock_after_a_crash_at_any_work_request() {
    let cfg = ProtocolConfig::pandora_lock_logging();
    let (mut forward, mut back, mut released) = (0, 0, 0);
    for k in 0..30 {
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
            let again = recover_coordinator(&c, &store, cfg.protocol, 5)
                .await
                .unwrap();
            assert_eq!((again.txn, again.restored, again.unlocked), (None, 0, 0));
            *o.borrow_mut() = Some(r);
        });
        bank.sim.run_until_idle();
        let r = out.borrow_mut().take().unwrap();
        match r.decision {
            Some(Decision::RollForward) => forward += 1,
            Some(Decision::RollBack) => back += 1,
            None => released += usize::from(r.unlocked > 0),
        }
        // No failed id is tolerated: every lock of coordinator 5 is free again.
        bank.check_invariant(&[]);
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
    assert!(forward > 0 && back > 0, "{forward} forward, {back} back");
    assert!(
        released > 0,
        "some crash left only logged locks (no undo log) for the lock log to release"
    );
}

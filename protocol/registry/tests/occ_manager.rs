//! The lease manager (§VII-A) raises a lease too small for the read-only transactions,
//! and the run stays strictly serializable across its two-phase adjustments.

mod occ_common;

use std::cell::Cell;
use std::rc::Rc;

use dmem_occ::OoccConfig;
use dmem_occ::manager::Policy;
use dmem_protocols::OoccProtocol;
use dmem_verbs::Clock;
use occ_common::*;

#[test]
fn manager_raises_a_too_small_lease() {
    const ACCOUNTS: u64 = 64;
    let cfg = OoccConfig {
        lease_ns: 2_000,
        ..OoccConfig::default()
    };
    let p = OoccProtocol::new("oocc:lease=2+manager", cfg).with_manager(Policy {
        period_ns: 100_000,
        ..Policy::default()
    });
    let shape = shape(2, 2, 11);
    let (mut d, history) = deploy(&p, &shape, ACCOUNTS, 8, |_| 100u64.to_le_bytes().to_vec());
    let late = Rc::new(Cell::new((0u64, 0u64)));
    let mut id = 0;
    for cn in 0..2 {
        for th in 0..2 {
            for _ in 0..4 {
                let ctx = d.sim.context(d.sim.cn(cn), th).unwrap();
                let mut co = d.deployment.coordinator(ctx.clone().into(), id).unwrap();
                let mut rng = u64::from(id) + 99;
                let clock = ctx.clone();
                let _ = &late;
                d.sim.spawn(&ctx, async move {
                    while clock.now() < 3_000_000 {
                        let group = next(&mut rng) % (ACCOUNTS / 4) * 4;
                        if !next(&mut rng).is_multiple_of(10) {
                            if let Ok(sum) = audit(&mut co, &clock, 1_000, group, 4).await {
                                assert_eq!(sum, 400);
                            }
                        } else {
                            let a = group + next(&mut rng) % 4;
                            let b = group + (a - group + 1) % 4;
                            let _ = transfer(&mut co, a, b, 1).await;
                        }
                    }
                });
                id += 1;
            }
        }
    }
    d.sim.run_until(1_000_000);
    let (ro0, exp0) = (
        d.deployment.counter("ro_committed").unwrap(),
        d.deployment.counter("ro_lease_expired").unwrap(),
    );
    d.sim.run_until_idle();
    let (ro1, exp1) = (
        d.deployment.counter("ro_committed").unwrap(),
        d.deployment.counter("ro_lease_expired").unwrap(),
    );
    let lease = d.deployment.counter("lease_ns").unwrap();
    let adjustments = d.deployment.counter("lease_adjustments").unwrap();
    let took = d.deployment.counter("lease_adjust_ns").unwrap();
    eprintln!(
        "lease 2 µs -> {} µs in {adjustments} adjustments (last took {:.1} µs); \
         lease expired for {:.1}% of RO txns in the first ms, {:.1}% after",
        lease / 1_000,
        took as f64 / 1e3,
        exp0 as f64 * 100.0 / ro0.max(1) as f64,
        (exp1 - exp0) as f64 * 100.0 / (ro1 - ro0).max(1) as f64
    );
    assert!(lease > 2_000 && adjustments > 0);
    assert!(
        (exp1 - exp0) * 5 <= ro1 - ro0,
        "at least 80 % skip validation once raised"
    );
    verdict(&history.borrow()).unwrap();
}

//! The shared runner on a registered protocol: SmallBank passes the checker and the
//! invariants, and every committed transaction type reports its round trips.

use dmem_deploy::ClusterShape;
use dmem_harness::{BenchConfig, run_bench};
use dmem_sim::NicProfile;
use dmem_workloads::{AnyWorkload, Scale};

#[test]
fn smallbank_on_pandora_checks_out_and_counts_round_trips() {
    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    let cfg = BenchConfig {
        shape: ClusterShape {
            mns: 3,
            cns: 2,
            threads: 2,
            seed: 1,
            profile: NicProfile::named("cx5").unwrap(),
            min_mn_bytes: 1 << 20,
        },
        coroutines: 2,
        duration: 500_000,
        seed: 1,
        check: true,
        warm_cache: false,
    };
    let protocol = dmem_protocols::registry().get("pandora").unwrap();
    let mut ticks = 0;
    let r = run_bench(&*protocol, &workload, &cfg, |_| ticks += 1).unwrap();
    assert!(ticks >= 100);
    assert_eq!(r.checker, "ok");
    assert_eq!(r.invariants, "ok");
    assert!(r.committed > 50, "{r:?}");
    let all = r.rtts_per_txn["all"];
    // A read-write transaction needs at least an execution round and a commit round.
    assert!(all >= 2.0, "{r:?}");
    assert!(r.rtts_per_txn.len() > 2, "{r:?}");
    for (name, rtts) in &r.rtts_per_txn {
        assert!(*rtts >= 1.0, "{name}: {rtts}");
    }
}

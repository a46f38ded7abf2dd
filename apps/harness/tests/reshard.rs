//! LOTUS pass-by-range resharding (§4.3) through the bench harness.

use dmem_deploy::ClusterShape;
use dmem_harness::{BenchConfig, run_bench};
use dmem_sim::NicProfile;
use dmem_workloads::{AnyWorkload, Scale};

fn cfg(cns: u16, duration: u64) -> BenchConfig {
    BenchConfig {
        shape: ClusterShape {
            mns: 3,
            cns,
            threads: 2,
            seed: 1,
            profile: NicProfile::named("cx3").unwrap(),
            min_mn_bytes: 1 << 20,
        },
        coroutines: 4,
        duration,
        seed: 1,
        check: true,
        warm_cache: false,
    }
}

#[test]
fn explore() {
    let registry = dmem_protocols::registry();
    for w in ["tpcc", "smallbank", "tatp", "kvs"] {
        let workload = AnyWorkload::new(w, Scale::Tiny).unwrap();
        for p in ["lotus:reshard=50", "lotus:reshard=50+overload=100", "lotus:reshard=50+overload=100+reshard-no-drain"] {
            let protocol = registry.get(p).unwrap();
            let r = run_bench(&*protocol, &workload, &cfg(4, 1_000_000), |_| {}).unwrap();
            eprintln!("{w} {p}: mtps {:.3} checker {} inv {} counters {:?}", r.mtps, r.checker, r.invariants, r.counters);
        }
    }
}

//! TPC-C's largest transactions fit FORD's and Pandora's log regions (issue #12): with the
//! region sized from the workload's write sets, a run at 64 attempts has no "log region
//! full" abort. With the old fixed 4 KiB region, a 15-line New-Order's undo log (15 STOCK
//! images of 312 bytes alone take 5,160) aborted on every try.

use dmem_deploy::ClusterShape;
use dmem_harness::{BenchConfig, BenchResult, run_bench};
use dmem_sim::NicProfile;
use dmem_workloads::tpcc::{STANDARD_MIX, Tpcc, TpccConfig};
use dmem_workloads::{AnyWorkload, Scale};

fn run(protocol: &str) -> BenchResult {
    // The standard mix: New-Order and Delivery, the two largest write sets.
    let workload = AnyWorkload::Tpcc(Tpcc::new(TpccConfig {
        weights: STANDARD_MIX,
        ..TpccConfig::preset(Scale::Tiny)
    }));
    let cfg = BenchConfig {
        shape: ClusterShape {
            mns: 2,
            cns: 2,
            threads: 2,
            seed: 1,
            profile: NicProfile::named("cx6").unwrap(),
            min_mn_bytes: 1 << 20,
            message_faults: dmem_sim::MessageFaults::default(),
        },
        coroutines: 4,
        duration: 2_000_000,
        seed: 1,
        check: true,
        warm_cache: true,
        check_segment: None,
        max_attempts: 64,
        backoff: dmem_harness::Backoff::None,
    };
    let protocol = dmem_protocols::registry().get(protocol).unwrap();
    run_bench(&*protocol, &workload, &cfg, |_| {}).unwrap()
}

#[test]
fn tpcc_on_ford_and_pandora_never_fills_the_log_region() {
    for protocol in ["ford", "pandora-lock-logging"] {
        let r = run(protocol);
        assert_eq!(r.checker, "ok", "{protocol}: {r:?}");
        assert_eq!(r.invariants, "ok", "{protocol}: {r:?}");
        assert!(r.committed > 20, "{protocol}: {r:?}");
        let log_aborts: Vec<_> = r
            .errors
            .keys()
            .filter(|k| k.contains("log region"))
            .collect();
        assert!(log_aborts.is_empty(), "{protocol}: {:?}", r.errors);
    }
}

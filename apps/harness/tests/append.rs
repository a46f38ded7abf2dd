//! The list-append workload judged from observed values alone: a fixed protocol passes, a
//! planted bug is caught by the append checker, and snapshot isolation is judged as such.

use dmem_deploy::ClusterShape;
use dmem_harness::{BenchConfig, BenchResult, run_bench};
use dmem_sim::NicProfile;
use dmem_workloads::{AnyWorkload, Scale};

fn run(protocol: &str, duration: u64, check_segment: Option<u64>) -> BenchResult {
    let workload = AnyWorkload::new("append", Scale::Tiny).unwrap();
    let cfg = BenchConfig {
        shape: ClusterShape {
            mns: 3,
            cns: 2,
            threads: 2,
            seed: 1,
            profile: NicProfile::named("cx5").unwrap(),
            min_mn_bytes: 1 << 20,
            message_faults: dmem_sim::MessageFaults::default(),
        },
        coroutines: 8,
        duration,
        seed: 1,
        check: true,
        warm_cache: false,
        check_segment,
        max_attempts: dmem_harness::MAX_ATTEMPTS,
        backoff: dmem_harness::Backoff::None,
    };
    let protocol = dmem_protocols::registry().get(protocol).unwrap();
    run_bench(&*protocol, &workload, &cfg, |_| {}).unwrap()
}

#[test]
fn fixed_protocols_pass_the_append_checker() {
    for p in ["ford", "motor-si"] {
        let r = run(p, 1_000_000, None);
        assert_eq!(r.append_checker.as_deref(), Some("ok"), "{p}: {r:?}");
        assert_eq!(
            (r.checker.as_str(), r.invariants.as_str()),
            ("ok", "ok"),
            "{p}"
        );
        assert!(r.committed > 100, "{p}: {r:?}");
    }
}

#[test]
fn a_cut_closes_the_side_log() {
    let r = run("ford", 1_000_000, Some(300_000));
    assert_eq!(r.append_checker.as_deref(), Some("ok"), "{r:?}");
}

#[test]
fn complicit_abort_is_caught_from_values_alone() {
    let r = run("ford:complicit-abort", 1_000_000, None);
    let verdict = r.append_checker.expect("append is checked");
    assert_ne!(verdict, "ok");
    assert!(
        ["incompatible order", "lost append", "G1a", "cycle"]
            .iter()
            .any(|k| verdict.contains(k)),
        "{verdict}"
    );
}

#[test]
fn other_workloads_have_no_append_verdict() {
    let workload = AnyWorkload::new("kvs", Scale::Tiny).unwrap();
    assert!(workload.append_log().is_none());
}

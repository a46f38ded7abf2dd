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

fn lotus_cfg() -> BenchConfig {
    BenchConfig {
        shape: ClusterShape {
            mns: 3,
            cns: 3,
            threads: 2,
            seed: 1,
            profile: NicProfile::named("cx3").unwrap(),
            min_mn_bytes: 1 << 20,
        },
        coroutines: 2,
        duration: 400_000,
        seed: 1,
        check: true,
        warm_cache: false,
    }
}

/// LOTUS through its router (LOTUS §4.3): every workload passes the checker and the
/// invariants, no MN atomic is used, and routing read-write transactions to the owner of
/// their first record's shard sends fewer lock messages than running them where they were
/// generated.
#[test]
fn lotus_routed_checks_out_with_fewer_messages_than_unrouted() {
    let registry = dmem_protocols::registry();
    for w in ["smallbank", "tatp", "tpcc", "kvs"] {
        let workload = AnyWorkload::new(w, Scale::Tiny).unwrap();
        let mut msgs = Vec::new();
        for p in ["lotus", "lotus:no-routing", "lotus-si"] {
            let protocol = registry.get(p).unwrap();
            let r = run_bench(&*protocol, &workload, &lotus_cfg(), |_| {}).unwrap();
            assert_eq!(r.checker, "ok", "{w} {p}: {r:?}");
            assert_eq!(r.invariants, "ok", "{w} {p}: {r:?}");
            assert!(
                r.committed > if w == "tpcc" { 2 } else { 20 },
                "{w} {p}: {r:?}"
            );
            assert_eq!(
                r.mn_per_txn[2] + r.mn_per_txn[3],
                0.0,
                "{w} {p}: no MN atomics"
            );
            assert!(r.cn_cpu_busy > 0.0);
            msgs.push(r.msgs_per_txn);
        }
        // Fig. 17's idealised RDMA lock: correct too, and the only variant with MN atomics.
        let rdma = registry.get("lotus:rdma-lock").unwrap();
        let r = run_bench(&*rdma, &workload, &lotus_cfg(), |_| {}).unwrap();
        assert_eq!(
            (r.checker.as_str(), r.invariants.as_str()),
            ("ok", "ok"),
            "{w}: {r:?}"
        );
        assert!(r.mn_per_txn[3] > 0.0, "{w}: {r:?}");
        if w != "kvs" {
            // KVS has no critical field: its records are sharded by hash either way.
            assert!(
                msgs[0] < msgs[1],
                "{w}: routed {} vs unrouted {}",
                msgs[0],
                msgs[1]
            );
        }
    }
}

/// Motor's own store (a full value plus attribute deltas) against LOTUS's full records
/// (LOTUS §4.4, the "+Full Record Store" step of §8.3): both pass the checker and the
/// invariants on every workload, and Motor's layout posts more WRITEs per transaction (the
/// delta, and the unlock in every replica's doorbell as Motor's code does).
#[test]
fn motor_deltas_and_full_records_check_out_and_deltas_write_more() {
    let registry = dmem_protocols::registry();
    for w in ["smallbank", "tatp", "tpcc", "kvs"] {
        let workload = AnyWorkload::new(w, Scale::Tiny).unwrap();
        let mut writes = Vec::new();
        for p in ["motor", "motor:full-records", "motor-si"] {
            let protocol = registry.get(p).unwrap();
            let r = run_bench(&*protocol, &workload, &lotus_cfg(), |_| {}).unwrap();
            assert_eq!(r.checker, "ok", "{w} {p}: {r:?}");
            assert_eq!(r.invariants, "ok", "{w} {p}: {r:?}");
            assert!(
                r.committed > if w == "tpcc" { 2 } else { 20 },
                "{w} {p}: {r:?}"
            );
            writes.push(r.mn_per_txn[1]);
        }
        assert!(
            writes[0] > writes[1],
            "{w}: deltas {} vs full records {} WRITEs per txn",
            writes[0],
            writes[1]
        );
    }
}

/// A two-sided protocol counts its own round trips (`Coordinator::round_trips`): Dandelion
/// posts no one-sided list, yet every read-write transaction waits for at least its
/// execution and commit replies from other servers, and FaSST (no local reads) for more.
#[test]
fn two_sided_protocols_report_their_round_trips() {
    let registry = dmem_protocols::registry();
    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    let mut all = Vec::new();
    for p in ["dnl-4", "fasst"] {
        let protocol = registry.get(p).unwrap();
        let r = run_bench(&*protocol, &workload, &lotus_cfg(), |_| {}).unwrap();
        assert_eq!(
            (r.checker.as_str(), r.invariants.as_str()),
            ("ok", "ok"),
            "{p}"
        );
        assert_eq!(r.mn_per_txn, [0.0; 4], "{p}: no one-sided verb");
        let rtts = r.rtts_per_txn["all"];
        assert!(
            (1.0..10.0).contains(&rtts),
            "{p}: {rtts} round trips per txn"
        );
        all.push(rtts);
    }
    assert!(all[0] < all[1], "dnl-4 {} vs fasst {}", all[0], all[1]);
}

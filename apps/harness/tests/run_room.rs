//! A run's insert room follows its length (`run_spec`), and a run sized that way fits its
//! inserts; `max_attempts` 1 drops aborted transactions, and failed attempts are counted
//! by reason.

use dmem_deploy::ClusterShape;
use dmem_harness::{BenchConfig, run_bench, run_spec};
use dmem_sim::NicProfile;
use dmem_workloads::tpcc::{HISTORY, NEW_ORDER, OOCC_MIX, ORDER, ORDER_LINE, Tpcc, TpccConfig};
use dmem_workloads::{AnyWorkload, Scale, Workload};

fn tpcc() -> AnyWorkload {
    AnyWorkload::Tpcc(Tpcc::new(TpccConfig {
        weights: OOCC_MIX,
        ..TpccConfig::preset(Scale::Tiny)
    }))
}

fn cfg(duration: u64, max_attempts: u32) -> BenchConfig {
    BenchConfig {
        shape: ClusterShape {
            mns: 2,
            cns: 2,
            threads: 2,
            seed: 1,
            profile: NicProfile::named("cx6").unwrap(),
            min_mn_bytes: 1 << 20,
            message_faults: dmem_sim::MessageFaults::default(),
        },
        coroutines: 2,
        duration,
        seed: 1,
        check: true,
        warm_cache: true,
        check_segment: None,
        max_attempts,
        backoff: dmem_harness::Backoff::None,
    }
}

#[test]
fn the_insert_room_is_the_attempt_bound_times_the_mix_insert_rate() {
    let workload = tpcc();
    let short = cfg(1_000_000, 64);
    let spec = run_spec(&workload, &short).unwrap();
    // 8 coordinators, each starting at most one attempt per 2 × 700 ns round trip over the
    // 1.1 ms run, then finishing its last transaction in at most 64 tries.
    let bound = 8 * (1_100_000u64.div_ceil(1_400) + 64);
    assert_eq!(short.attempts_bound().unwrap(), bound);
    let room = |table| {
        spec.insert_room
            .iter()
            .find(|(t, _)| *t == table)
            .map(|(_, n)| *n)
    };
    // New-Order (45 of Table IV's 97) inserts one NEW_ORDER, one ORDER and up to 15
    // ORDER_LINE rows, Payment (40 of 97) one HISTORY row; nothing else grows.
    let ceil = |rate: f64| (bound as f64 * rate).ceil() as u64;
    assert_eq!(room(NEW_ORDER), Some(ceil(45.0 / 97.0)));
    assert_eq!(room(ORDER), Some(ceil(45.0 / 97.0)));
    assert_eq!(room(ORDER_LINE), Some(ceil(45.0 / 97.0 * 15.0)));
    assert_eq!(room(HISTORY), Some(ceil(40.0 / 97.0)));
    assert_eq!(spec.insert_room.len(), 4, "{:?}", spec.insert_room);
    // Ten times the run, about ten times the room.
    let long = run_spec(&workload, &cfg(10_000_000, 64)).unwrap();
    let long_lines = long
        .insert_room
        .iter()
        .find(|(t, _)| *t == ORDER_LINE)
        .unwrap()
        .1;
    assert!(long_lines > 9 * room(ORDER_LINE).unwrap(), "{long_lines}");
    // A workload that gives no rate keeps the default room.
    let smallbank = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    assert!(run_spec(&smallbank, &short).unwrap().insert_room.is_empty());
    assert!(
        workload
            .tables()
            .iter()
            .all(|t| t.grows == (workload.inserts_per_txn(t.id).unwrap() > 0.0))
    );
}

#[test]
fn tpcc_on_oocc_fits_a_store_sized_by_the_run_and_counts_aborts_by_reason() {
    let workload = tpcc();
    let registry = dmem_protocols::registry();
    for (protocol, attempts) in [("dslr", 64), ("dslr", 1), ("oocc:lease=10", 1)] {
        let p = registry.get(protocol).unwrap();
        let r = run_bench(&*p, &workload, &cfg(1_000_000, attempts), |_| {}).unwrap();
        assert_eq!(r.checker, "ok", "{protocol}");
        assert_eq!(r.invariants, "ok", "{protocol}");
        assert!(r.committed > 0, "{protocol}: {r:?}");
        if protocol == "dslr" {
            // New-Orders committed: their inserts found room.
            assert!(r.committed_per_type["NewOrder"] > 0, "{r:?}");
        }
        assert!(
            !r.errors.keys().any(|e| e.contains("out of room")),
            "{protocol}: {:?}",
            r.errors
        );
        let aborted: u64 = r.errors.values().sum();
        if attempts == 1 {
            // Every aborted transaction is dropped: one failure per abort.
            assert_eq!(r.failed, aborted, "{protocol}: {:?}", r.errors);
        } else {
            assert!(aborted >= r.failed, "{protocol}: {:?}", r.errors);
        }
    }
}

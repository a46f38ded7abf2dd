//! The shared runner on a registered protocol: SmallBank passes the checker and the
//! invariants, and every committed transaction type reports its round trips.

use dmem_deploy::ClusterShape;
use dmem_harness::{BenchConfig, run_bench};
use dmem_sim::NicProfile;
use dmem_workloads::{AnyWorkload, Scale, Workload};

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
            message_faults: dmem_sim::MessageFaults::default(),
        },
        coroutines: 2,
        duration: 500_000,
        seed: 1,
        check: true,
        warm_cache: false,
        check_segment: None,
        max_attempts: dmem_harness::MAX_ATTEMPTS,
        backoff: dmem_harness::Backoff::None,
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

/// Check segments cut the history at quiescent points: every transaction of the run is
/// still checked (clean), the run goes on after each cut (same committed count order), and
/// LOTUS's routed clients pass the gate too.
#[test]
fn check_segments_check_the_whole_run_and_the_run_goes_on() {
    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    for p in ["pandora", "lotus"] {
        let protocol = dmem_protocols::registry().get(p).unwrap();
        let whole = run_bench(&*protocol, &workload, &lotus_cfg(), |_| {}).unwrap();
        let cfg = BenchConfig {
            check_segment: Some(70_000),
            max_attempts: dmem_harness::MAX_ATTEMPTS,
            backoff: dmem_harness::Backoff::None,
            ..lotus_cfg()
        };
        let segmented = run_bench(&*protocol, &workload, &cfg, |_| {}).unwrap();
        assert_eq!(segmented.checker, "ok", "{p}: {segmented:?}");
        assert_eq!(segmented.invariants, "ok", "{p}: {segmented:?}");
        // Six cuts in a 440 µs run: every transaction is still checked, about as many as
        // the run without cuts records.
        assert!(
            segmented.checked_txns * 4 > whole.checked_txns * 3,
            "{p}: {} of {}",
            segmented.checked_txns,
            whole.checked_txns
        );
        // Each pause at a cut lasts about the longest transaction in flight (60 µs at p99
        // here).
        assert!(
            segmented.committed * 2 > whole.committed,
            "{p}: {segmented:?} {whole:?}"
        );
        let unchecked = BenchConfig {
            check: false,
            ..lotus_cfg()
        };
        let r = run_bench(&*protocol, &workload, &unchecked, |_| {}).unwrap();
        assert_eq!((r.checker.as_str(), r.checked_txns), ("skipped", 0));
        assert_eq!(
            r.committed, whole.committed,
            "{p}: recording changes no timing"
        );
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
            message_faults: dmem_sim::MessageFaults::default(),
        },
        coroutines: 2,
        duration: 400_000,
        seed: 1,
        check: true,
        warm_cache: false,
        check_segment: None,
        max_attempts: dmem_harness::MAX_ATTEMPTS,
        backoff: dmem_harness::Backoff::None,
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
            // TPC-C tiny (two warehouses, 98–99 % of attempts refused) commits a handful in
            // 0.4 ms, and which handful moves with the store's layout (2 for `lotus` since
            // the insert shares are sized by the run, 3 or more before).
            assert!(
                r.committed >= if w == "tpcc" { 2 } else { 21 },
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

/// TPC-C's hashed tables keep Motor's and LOTUS's blocks in pools apart from the index
/// slots (`dmem-store`, "Hashed tables pooled"; pooled even at tiny scale): every loaded
/// record reads back through its slot's address, and Motor (both layouts) and LOTUS run
/// TPC-C with the checker and the invariants clean, committing New-Orders (inserts into
/// the pooled ORDER, NEW_ORDER and ORDER_LINE) with a cold and a warm address cache.
#[test]
fn tpcc_runs_on_pooled_hashed_mvcc_tables() {
    use std::cell::RefCell;
    use std::rc::Rc;

    let workload = AnyWorkload::new("tpcc", Scale::Tiny).unwrap();
    let spec = dmem_harness::deploy_spec(&workload, 18);
    assert!(spec.key_spaces.is_empty(), "TPC-C's tables are hashed");
    let pooled = dmem_store::StoreConfig::for_tables(
        3,
        &spec.tables,
        spec.coordinators,
        spec.log_region_bytes,
        spec.index_slack,
    )
    .coordinators(spec.coordinators)
    .with_pools(&spec.tables, &[], spec.index_slack, true);
    for t in &pooled.tables {
        assert!(t.pool.is_some(), "table {} not pooled", t.id.0);
    }
    let registry = dmem_protocols::registry();
    for p in ["motor", "motor:full-records", "lotus"] {
        let protocol = registry.get(p).unwrap();
        let history = Rc::new(RefCell::new(dmem_txn::History::new()));
        let deployed =
            dmem_deploy::deploy_loaded(&*protocol, &lotus_cfg().shape, &spec, &history, || {
                workload.loader()
            })
            .unwrap();
        for (table, key, value) in workload.loader() {
            assert_eq!(
                deployed.deployment.read_final(table, key),
                Some(value),
                "{p} table {}",
                table.0
            );
        }
        // Two warehouses: most writers conflict, so run long enough for New-Orders.
        let cfg = BenchConfig {
            duration: 3_000_000,
            ..lotus_cfg()
        };
        runs_clean_with_cold_and_warm_caches(&*protocol, &workload, &cfg, "NewOrder");
    }
}

/// `protocol` runs `workload` with a cold and a warm address cache: checker and invariants
/// ok, `inserting` (a transaction type that inserts) committed. The results, cold first.
fn runs_clean_with_cold_and_warm_caches(
    protocol: &dyn dmem_deploy::Protocol,
    workload: &AnyWorkload,
    cfg: &BenchConfig,
    inserting: &str,
) -> Vec<dmem_harness::BenchResult> {
    let p = protocol.name();
    [false, true]
        .into_iter()
        .map(|warm_cache| {
            let cfg = BenchConfig {
                warm_cache,
                ..cfg.clone()
            };
            let r = run_bench(protocol, workload, &cfg, |_| {}).unwrap();
            assert_eq!(
                (r.checker.as_str(), r.invariants.as_str()),
                ("ok", "ok"),
                "{p} warm {warm_cache}: {r:?}"
            );
            assert!(
                r.rtts_per_txn.contains_key(inserting),
                "{p} warm {warm_cache}: no {inserting} committed: {r:?}"
            );
            r
        })
        .collect()
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

/// Dense tables are direct-mapped (`dmem-store`): FORD's and Motor's stores are sized by the
/// records, not by a hashing slack, and load in one pass (no slack doubling). Hashed, the
/// same tables are pooled (records apart from an index of wide buckets 15–20 % full), still
/// 1.25× the bytes at least (Motor 1.37×; 1.5× with the 7-slot index wide buckets
/// replaced).
#[test]
fn dense_tables_are_direct_mapped_and_load_in_one_pass() {
    use std::cell::RefCell;
    use std::rc::Rc;

    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    let spec = dmem_harness::deploy_spec(&workload, 8);
    assert_eq!(spec.key_spaces.len(), 2, "{spec:?}");
    let mut hashed = spec.clone();
    hashed.key_spaces.clear();
    let registry = dmem_protocols::registry();
    for p in ["ford", "motor"] {
        let protocol = registry.get(p).unwrap();
        let direct_bytes = protocol.mn_bytes_per_mn(&spec, 3).unwrap();
        let hashed_bytes = protocol.mn_bytes_per_mn(&hashed, 3).unwrap();
        assert!(
            5 * direct_bytes < 4 * hashed_bytes,
            "{p}: {direct_bytes} vs {hashed_bytes}"
        );
        let shape = lotus_cfg().shape;
        let history = Rc::new(RefCell::new(dmem_txn::History::new()));
        let deployed =
            dmem_deploy::deploy_loaded(&*protocol, &shape, &spec, &history, || workload.loader())
                .unwrap();
        assert_eq!(deployed.spec.index_slack, spec.index_slack, "{p}");
        for (table, key, value) in workload.loader() {
            assert_eq!(
                deployed.deployment.read_final(table, key),
                Some(value),
                "{p}"
            );
        }
    }
}

/// Sparse tables keep their records in a pool apart from the index slots (`dmem-store`):
/// FORD's TATP store is smaller than with every record in its direct-mapped slot, every
/// loaded record reads back through its slot's address, and FORD and Pandora pass the
/// checker and the invariants with run-time inserts into the pooled CALL_FORWARDING.
#[test]
fn sparse_tables_are_pooled_and_ford_inserts_into_them() {
    use std::cell::RefCell;
    use std::rc::Rc;

    let workload = AnyWorkload::new("tatp", Scale::Tiny).unwrap();
    let spec = dmem_harness::deploy_spec(&workload, 18);
    let direct = dmem_store::StoreConfig::for_tables(
        3,
        &spec.tables,
        spec.coordinators,
        spec.log_region_bytes,
        spec.index_slack,
    )
    .with_direct_indexes(&spec.key_spaces);
    let pooled = direct
        .clone()
        .with_sparse_indexes(&spec.tables, &spec.key_spaces);
    let is_pooled: Vec<bool> = pooled.tables.iter().map(|t| t.pool.is_some()).collect();
    // SUBSCRIBER fills its key space; the other three tables do not.
    assert_eq!(is_pooled, [false, true, true, true], "{pooled:?}");
    let registry = dmem_protocols::registry();
    let ford = registry.get("ford").unwrap();
    let ford_bytes = ford.mn_bytes_per_mn(&spec, 3).unwrap();
    assert_eq!(ford_bytes, pooled.bytes_per_mn().unwrap());
    // At this size the pools' fixed margins (64 records per partition, 4096 inserts)
    // weigh; at LOTUS's size the regions are 32 % smaller, 5.57 → 3.76 GB per MN (`dmem-store`'s README).
    assert!(
        ford_bytes < direct.bytes_per_mn().unwrap(),
        "{ford_bytes} vs {direct:?}"
    );
    let history = Rc::new(RefCell::new(dmem_txn::History::new()));
    let deployed = dmem_deploy::deploy_loaded(&*ford, &lotus_cfg().shape, &spec, &history, || {
        workload.loader()
    })
    .unwrap();
    for (table, key, value) in workload.loader() {
        assert_eq!(deployed.deployment.read_final(table, key), Some(value));
    }
    // Motor's and LOTUS's multi-version blocks are pooled the same way.
    for p in ["motor", "lotus"] {
        let protocol = registry.get(p).unwrap();
        let mut in_slots = spec.clone();
        in_slots.key_spaces.clear();
        let bytes = protocol.mn_bytes_per_mn(&spec, 3).unwrap();
        let deployed =
            dmem_deploy::deploy_loaded(&*protocol, &lotus_cfg().shape, &spec, &history, || {
                workload.loader()
            })
            .unwrap();
        for (table, key, value) in workload.loader() {
            assert_eq!(
                deployed.deployment.read_final(table, key),
                Some(value),
                "{p}"
            );
        }
        assert!(bytes > 0, "{p}");
    }
    for p in ["ford", "pandora", "motor", "lotus"] {
        let protocol = registry.get(p).unwrap();
        let runs = runs_clean_with_cold_and_warm_caches(
            &*protocol,
            &workload,
            &lotus_cfg(),
            "InsertCallForwarding",
        );
        for r in runs {
            // An update of an absent SPECIAL_FACILITY row (a pooled table that does not
            // grow, so no insert share) rolls back; it once aborted until the retries ran
            // out under Motor and LOTUS.
            assert_eq!(r.failed, 0, "{p}: {r:?}");
        }
    }
}

/// Two Motor (and two LOTUS) coordinators on two CNs insert the same absent CALL_FORWARDING
/// key of TATP at the same time. The table is pooled, so each insert takes a block of its
/// own coordinator's share: Motor's slot CAS (LOTUS: the index bucket's CN lock) lets
/// exactly one name its block; the other aborts, retries and finds the key present. With
/// the slot only READ and then written (the slot-fixed path, where the block's lock CAS
/// arbitrates) nothing would stop both inserts from committing, each with a block of its
/// own, the second's slot WRITE hiding the first's.
#[test]
fn concurrent_inserts_into_a_pooled_mvcc_table_leave_one_record_per_key() {
    race_two_inserts("tatp", dmem_txn::TableId(3), &["motor", "lotus"], &[0]);
}

/// The same race on a *hashed* pooled table (TPC-C's HISTORY, whose records are pooled
/// even at tiny scale): an insert takes the bucket's first free slot, so the second insert
/// starts 0–12 µs after the first, which puts its bucket READ before, on, or after the
/// first's slot CAS and before or after its slot WRITE. Read between the two, the slot
/// names a block but no key yet; Motor's insert then aborts ("index slot half claimed")
/// instead of indexing the key a second time in the next free slot.
#[test]
fn concurrent_inserts_into_a_hashed_pooled_mvcc_table_leave_one_record_per_key() {
    let offsets: Vec<u64> = (0..=12).map(|us| us * 1_000).collect();
    race_two_inserts("tpcc", dmem_txn::TableId(3), &["motor", "lotus"], &offsets);
}

/// Two coordinators on two CNs insert one absent key of `table` (pooled under `protocols`),
/// the second starting `offset` ns after the first, for each offset: exactly one insert
/// commits, the other finds the key, the final value is the winner's, the history checks.
fn race_two_inserts(workload: &str, table: dmem_txn::TableId, protocols: &[&str], offsets: &[u64]) {
    race_inserts(workload, table, protocols, offsets, false);
}

/// Two inserts of *different* absent keys of TPC-C's HISTORY that hash to one wide index
/// bucket (`dmem-store`, "Wide buckets"), the second starting 0–12 µs after the first: both
/// commit, each key readable with its own value. The bucket is the unit an insert claims
/// into: Motor's slot CAS sends the loser of the bucket's first free slot to the next one,
/// and LOTUS's insert lock on the bucket orders the two slot WRITEs (were they not
/// ordered, both would WRITE the first free slot and one key would be lost).
#[test]
fn concurrent_inserts_of_two_keys_into_one_wide_bucket_both_land() {
    let offsets: Vec<u64> = (0..=12).step_by(2).map(|us| us * 1_000).collect();
    race_inserts(
        "tpcc",
        dmem_txn::TableId(3),
        &["motor", "lotus"],
        &offsets,
        true,
    );
}

/// The keys `workload` loads into `table`, and the length of its values.
fn loaded_keys(
    workload: &AnyWorkload,
    table: dmem_txn::TableId,
) -> (std::collections::HashSet<u64>, usize) {
    let keys = workload
        .loader()
        .filter(|(t, _, _)| *t == table)
        .map(|(_, k, _)| k.0)
        .collect();
    let value_len = workload
        .loader()
        .find(|(t, _, _)| *t == table)
        .map(|(_, _, v)| v.len())
        .unwrap();
    (keys, value_len)
}

/// [`race_two_inserts`], or with `two_keys` each coordinator inserting a key of its own,
/// the two keys in one index bucket (both must commit).
fn race_inserts(
    workload: &str,
    table: dmem_txn::TableId,
    protocols: &[&str],
    offsets: &[u64],
    two_keys: bool,
) {
    use std::cell::RefCell;
    use std::rc::Rc;

    use dmem_txn::{Coordinator, Key, Transaction, TxnError, TxnKind};
    use dmem_verbs::Clock;

    let workload = AnyWorkload::new(workload, Scale::Tiny).unwrap();
    let spec = dmem_harness::deploy_spec(&workload, 18);
    let (loaded, value_len) = loaded_keys(&workload, table);
    let registry = dmem_protocols::registry();
    // The store's layout as the protocols lay it out (hashed tables pooled), to pick keys
    // of one bucket.
    let cfg = dmem_store::StoreConfig::for_tables(
        3,
        &spec.tables,
        spec.coordinators,
        spec.log_region_bytes,
        spec.index_slack,
    )
    .coordinators(spec.coordinators)
    .with_pools(&spec.tables, &spec.key_spaces, spec.index_slack, true);
    let bytes = cfg.bytes_per_mn().unwrap();
    let regions = (0..3)
        .map(|i| dmem_verbs::MemoryRegion {
            node: dmem_verbs::NodeId(i),
            rkey: dmem_verbs::RKey(1),
            len: bytes,
        })
        .collect();
    let store = dmem_store::Store::new(cfg, regions).unwrap();
    let mut fresh = (1..).filter(|k| !loaded.contains(k));
    for &offset in offsets {
        let key = Key(fresh.next().unwrap());
        let keys = if two_keys {
            let bucket = store.bucket_of(table, key).unwrap();
            let other = fresh
                .by_ref()
                .map(Key)
                .find(|&k| store.bucket_of(table, k).unwrap() == bucket)
                .unwrap();
            [key, other]
        } else {
            [key, key]
        };
        for &p in protocols {
            let protocol = registry.get(p).unwrap();
            let history = Rc::new(RefCell::new(dmem_txn::History::new()));
            let mut deployed =
                dmem_deploy::deploy_loaded(&*protocol, &lotus_cfg().shape, &spec, &history, || {
                    workload.loader()
                })
                .unwrap();
            let outcomes = Rc::new(RefCell::new(Vec::new()));
            let attempts = Rc::new(RefCell::new(0_u32));
            for cn in 0..2_u16 {
                let ctx = deployed.sim.context(deployed.sim.cn(cn), 0).unwrap();
                let mut co = deployed
                    .deployment
                    .coordinator(ctx.clone().into(), cn)
                    .unwrap();
                let (out, tries) = (Rc::clone(&outcomes), Rc::clone(&attempts));
                let delay = if cn == 1 { offset } else { 0 };
                let key = keys[usize::from(cn)];
                let clock = ctx.clone();
                deployed.sim.spawn(&ctx, async move {
                    if delay > 0 {
                        clock.sleep(delay).await;
                    }
                    let value = vec![u8::try_from(cn).unwrap() + 1; value_len];
                    let outcome = loop {
                        *tries.borrow_mut() += 1;
                        assert!(*tries.borrow() < 200, "no insert got through");
                        let Ok(mut t) = co.begin(TxnKind::ReadWrite).await else {
                            continue;
                        };
                        match t.insert(table, key, &value).await {
                            Ok(()) => match t.commit().await {
                                Ok(()) => break ("inserted", value),
                                Err(_) => continue,
                            },
                            Err(TxnError::KeyState(_)) => {
                                t.abort().await;
                                break ("exists", value);
                            }
                            Err(_) => t.abort().await,
                        }
                    };
                    out.borrow_mut().push((outcome.0, outcome.1, key));
                });
            }
            // LOTUS's lock servers and metrics run forever: 20 ms of virtual time is plenty.
            deployed.sim.run_for(20_000_000);
            let outcomes = outcomes.borrow().clone();
            let inserted: Vec<_> = outcomes
                .iter()
                .filter(|(o, _, _)| *o == "inserted")
                .collect();
            let expected = if two_keys { 2 } else { 1 };
            assert_eq!(
                (inserted.len(), outcomes.len()),
                (expected, 2),
                "{p} offset {offset}: {outcomes:?}"
            );
            if offset == 0 && !two_keys {
                assert!(*attempts.borrow() > 2, "{p}: the two inserts did not race");
            }
            for (_, value, key) in &inserted {
                assert_eq!(
                    deployed.deployment.read_final(table, *key).as_ref(),
                    Some(value),
                    "{p} offset {offset}"
                );
            }
            assert_eq!(
                dmem_harness::verdict(&history.borrow()),
                "ok",
                "{p} offset {offset}"
            );
        }
    }
}

/// LOTUS §4.1/§5.1: an insert of a key the transaction has not read locks the key and then
/// its index bucket before any READ, so one bucket READ both finds the key absent and
/// claims its slot (one post list). A for-update read that finds its key absent (TATP's
/// InsertCallForwarding reads before it inserts) cannot know it will insert: it READs the
/// bucket, locks it, and READs it again under the lock (two). Both inserts commit and read
/// back.
#[test]
fn a_lotus_insert_locks_its_index_bucket_before_reading_it() {
    use std::cell::RefCell;
    use std::rc::Rc;

    use dmem_txn::{Coordinator, Key, Transaction, TxnKind};

    let workload = AnyWorkload::new("tpcc", Scale::Tiny).unwrap();
    let spec = dmem_harness::deploy_spec(&workload, 18);
    let history_table = dmem_txn::TableId(3);
    let (loaded, value_len) = loaded_keys(&workload, history_table);
    let mut fresh = (1..).filter(|k| !loaded.contains(k)).map(Key);
    let (direct, after_read) = (fresh.next().unwrap(), fresh.next().unwrap());
    let protocol = dmem_protocols::registry().get("lotus").unwrap();
    let history = Rc::new(RefCell::new(dmem_txn::History::new()));
    let mut deployed =
        dmem_deploy::deploy_loaded(&*protocol, &lotus_cfg().shape, &spec, &history, || {
            workload.loader()
        })
        .unwrap();
    let ctx = deployed.sim.context(deployed.sim.cn(0), 0).unwrap();
    let mut co = deployed
        .deployment
        .coordinator(ctx.clone().into(), 0)
        .unwrap();
    let posts = Rc::new(RefCell::new(Vec::new()));
    let seen = Rc::clone(&posts);
    let counter = ctx.clone();
    let value = vec![7_u8; value_len];
    deployed.sim.spawn(&ctx, async move {
        let mut t = co.begin(TxnKind::ReadWrite).await.unwrap();
        let before = counter.posts();
        t.insert(history_table, direct, &value).await.unwrap();
        seen.borrow_mut().push(counter.posts() - before);
        t.commit().await.unwrap();

        let mut t = co.begin(TxnKind::ReadWrite).await.unwrap();
        let before = counter.posts();
        let absent = t.read_for_update(history_table, after_read).await.unwrap();
        assert_eq!(absent, None);
        t.insert(history_table, after_read, &value).await.unwrap();
        seen.borrow_mut().push(counter.posts() - before);
        t.commit().await.unwrap();
    });
    deployed.sim.run_for(5_000_000);
    assert_eq!(
        *posts.borrow(),
        [1, 2],
        "post lists of an insert without and with a read before it"
    );
    for key in [direct, after_read] {
        assert_eq!(
            deployed.deployment.read_final(history_table, key),
            Some(vec![7_u8; value_len])
        );
    }
    assert_eq!(dmem_harness::verdict(&history.borrow()), "ok");
}

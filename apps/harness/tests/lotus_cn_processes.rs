//! LOTUS as a CN process deploys it (`dmem cn`), two CNs in one test process: each CN has a
//! deployment of its own, laid out on the MNs of a shm or tcp [`LocalCluster`] (the first
//! loads the records, the second only addresses them, as a CN process does), learns which
//! CN it is from a [`ProcessPlan`] (`ProcessDeployment::join_as_cn`) and serves its own lock table
//! from the lock servers `ProcessDeployment::process_tasks` gives it, on the endpoints the plan
//! names. Remote locks travel as messages between the two deployments, which share no
//! lock state. SmallBank on both: the checker and the invariants are clean, and each CN's
//! servers granted the other's requests.

use std::cell::RefCell;
use std::rc::Rc;

use dmem_deploy::process::{CnContexts, ProcessPlan, ServiceContext, ports};
use dmem_deploy::{DeployError, Deployment, MnMemory, Recorder};
use dmem_harness::fabric::{ClientTally, Fabric, LocalCluster};
use dmem_harness::{deploy_spec, verdict};
use dmem_txn::History;
use dmem_workloads::{AnyWorkload, Scale, Workload};

const MNS: u16 = 2;
const CNS: u16 = 2;
/// Coordinators per CN (and lock servers per CN: one per slot, LOTUS §4.1).
const PER_CN: u16 = 3;
const TXNS_PER_COORDINATOR: usize = 60;
/// The plan a cluster file gives every process (`ProcessPlan::on_ports`, as `dmem cn`
/// builds it): CN `c`'s coordinators are `c * PER_CN ..`, one lock server per slot.
fn plan(cluster: &LocalCluster) -> ProcessPlan {
    ProcessPlan::on_ports(
        (0..CNS).map(|c| (cluster.cn(c), (c * PER_CN..(c + 1) * PER_CN).collect())),
        PER_CN,
        10_000_000,
        1_000_000_000,
        1_000_000_000,
        std::env::temp_dir(),
    )
}

/// What two CN deployments ran: the checker's verdict, invariant violations, transactions
/// committed, and per CN its lock servers' messages handled and its counters.
struct TwoCns {
    verdict: String,
    violations: Vec<String>,
    committed: u64,
    served: Vec<u64>,
    counters: Vec<std::collections::BTreeMap<String, u64>>,
}

fn smallbank_in_two_cn_deployments(fabric: Fabric) -> TwoCns {
    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    let protocol = dmem_protocols::registry().get("lotus").unwrap();
    // One id more than the workers: the final check's, as `dmem cluster` does.
    let mut spec = deploy_spec(&workload, CNS * PER_CN + 1);
    spec.index_slack *= 2;
    let bytes = protocol.mn_bytes_per_mn(&spec, MNS).unwrap();
    let cluster = LocalCluster::new(fabric, MNS, CNS, bytes, 5).unwrap();
    let plan = plan(&cluster);
    let history = Rc::new(RefCell::new(History::new()));
    // CN 0 maps the MNs and loads (as an MN process would); CN 1 addresses them only.
    let mut deployments: Vec<Box<dyn Deployment>> = Vec::new();
    for c in 0..CNS {
        let memory = if c == 0 {
            cluster.memory()
        } else {
            MnMemory::remote(cluster.memory().regions())
        };
        let mut d = protocol
            .deploy_on(memory, &spec, Recorder::new(Rc::clone(&history)))
            .unwrap();
        for (table, key, value) in workload.loader() {
            d.load(table, key, &value).unwrap();
        }
        deployments.push(d);
    }
    // Before it knows which CN it is, a deployment makes no coordinator.
    let early = deployments[1].coordinator(cluster.context(1, 50).unwrap(), 3);
    assert!(
        matches!(&early, Err(DeployError::Protocol { reason, .. }) if reason.contains("join_as_cn")),
        "{:?}",
        early.err()
    );
    let workload = Rc::new(workload);
    let tally = Rc::new(ClientTally::default());
    for (c, d) in (0..CNS).zip(deployments.iter_mut()) {
        let node = cluster.cn(c);
        d.processes().unwrap().join_as_cn(node, &plan).unwrap();
        for (slot, &id) in plan.members[usize::from(c)].coordinators.iter().enumerate() {
            let ctx = cluster
                .context(c, ports::FIRST_COORDINATOR + slot as u16)
                .unwrap();
            let co = d.coordinator(ctx.clone(), id).unwrap();
            let client = tally.client(
                Rc::clone(&workload),
                co,
                id,
                11 ^ u64::from(id),
                TXNS_PER_COORDINATOR,
                dmem_harness::MAX_ATTEMPTS,
            );
            cluster.spawn(&ctx, client);
        }
        let services = plan.members[usize::from(c)]
            .services
            .iter()
            .enumerate()
            .map(|(slot, e)| ServiceContext {
                slot,
                ctx: cluster.context(c, e.port.0).unwrap(),
            })
            .collect();
        let ctxs = CnContexts {
            heartbeat: cluster.context(c, ports::HEARTBEAT.0).unwrap(),
            listener: cluster.context(c, ports::LISTENER.0).unwrap(),
            services,
        };
        let anchor = ctxs.heartbeat.clone();
        for task in d
            .processes()
            .unwrap()
            .process_tasks(node, ctxs, &plan)
            .unwrap()
        {
            cluster.spawn(&anchor, task);
        }
    }
    // The lock servers and heartbeats run for ever: run until the workers are done.
    let ctx0 = cluster.context(0, 60).unwrap();
    let done = Rc::clone(&tally);
    cluster.block_on(&ctx0, async move {
        while done.running.get() > 0 {
            dmem_verbs::Clock::sleep(&dmem_runtime::RealClock, 1_000_000).await;
        }
    });
    eprintln!(
        "lotus on {fabric}: aborts {:?}, given up {:?}",
        tally.aborts.borrow(),
        tally.given_up.borrow()
    );
    let loader = &*deployments[0];
    let violations = workload
        .check(|t, k| loader.read_final(t, k), tally.delta.get())
        .iter()
        .map(ToString::to_string)
        .collect();
    let served = deployments
        .iter()
        .map(|d| d.counter("lock_messages_served").unwrap())
        .collect();
    let counters = deployments
        .iter()
        .map(|d| d.counters().into_iter().collect())
        .collect();
    TwoCns {
        verdict: verdict(&history.borrow()),
        violations,
        committed: tally.committed.get(),
        served,
        counters,
    }
}

fn lotus_cns_serve_each_other(fabric: Fabric) {
    let TwoCns {
        verdict,
        violations,
        committed,
        served,
        counters,
    } = smallbank_in_two_cn_deployments(fabric);
    assert_eq!(verdict, "ok", "{fabric}");
    assert!(violations.is_empty(), "{fabric}: {violations:?}");
    let all = u64::from(CNS * PER_CN) * TXNS_PER_COORDINATOR as u64;
    assert!(
        committed > all / 2,
        "{fabric}: {committed} of {all} committed"
    );
    assert!(
        served.iter().all(|&n| n > 0),
        "{fabric}: every CN's lock servers answer the other's requests: {served:?}"
    );
    eprintln!("lotus on {fabric}: {committed} of {all} committed, lock messages served {served:?}");
    // Each CN process reports its refusals (`CnLocks::refusal_counters`): every lock
    // refused on a table (by Alg. 1's reason; no CN is fenced here) is one refusal some
    // coordinator met (by what the lock was for), locally or in a remote reply.
    let sum = |names: &dyn Fn(&str) -> bool| -> u64 {
        counters
            .iter()
            .flat_map(|c| c.iter().filter(|(n, _)| names(n)).map(|(_, v)| *v))
            .sum()
    };
    for c in &counters {
        assert!(c.contains_key("lotus_refused_conflict"), "{fabric}: {c:?}");
    }
    let by_reason = sum(&|n| {
        matches!(
            n,
            "lotus_refused_conflict" | "lotus_refused_bucket_full" | "lotus_refused_readers"
        )
    });
    let by_lock = sum(&|n| {
        n.starts_with("lotus_refused_table_")
            || matches!(
                n,
                "lotus_refused_index_bucket" | "lotus_refused_mixed_remote"
            )
    });
    assert_eq!(by_reason, by_lock, "{fabric}: {counters:?}");
    eprintln!("lotus on {fabric}: {by_reason} lock requests refused");
}

#[test]
fn lotus_cn_deployments_serve_their_lock_tables_over_tcp() {
    lotus_cns_serve_each_other(Fabric::Tcp);
}

#[test]
fn lotus_cn_deployments_serve_their_lock_tables_over_shm() {
    lotus_cns_serve_each_other(Fabric::Shm);
}

#[test]
fn lotus_variants_that_need_the_simulator_say_why() {
    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    let spec = deploy_spec(&workload, 2);
    let cluster = LocalCluster::new(Fabric::Shm, 1, 1, 1 << 16, 1).unwrap();
    let history = Recorder::new(Rc::new(RefCell::new(History::new())));
    for (name, why) in [
        ("lotus:rdma-lock", "reads every CN's lock table"),
        ("lotus:reshard", "shard map is static"),
        ("lotus:restart=0", "does not restart a killed CN"),
    ] {
        let protocol = dmem_protocols::registry().get(name).unwrap();
        let err = protocol
            .deploy_on(cluster.memory(), &spec, history.clone())
            .err()
            .unwrap();
        assert!(
            matches!(&err, DeployError::SimOnly { reason, .. } if reason.contains(why)),
            "{name}: {err}"
        );
    }
}

//! The same lock and protocol code on every fabric: DecLock keeps mutual exclusion (no lost
//! counter update), and FORD, Pandora, Motor and OOCC run SmallBank through the one deployment
//! path of `dmem-deploy` (`Protocol::deploy_on` + `Deployment::coordinator` on
//! `AnyContext`s) with a clean history checker and SmallBank's invariants over the final
//! state, on the simulator, on shared memory and on tcp over loopback.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use dmem_deploy::{Deployment, Recorder};
use dmem_harness::fabric::{ClientTally, Fabric, LocalCluster};
use dmem_harness::{deploy_spec, verdict};
use dmem_locks::declock::{self, DecLockClient, DecLockConfig};
use dmem_locks::{Directory, LockMode, NoFailures, RwLockClient};
use dmem_txn::History;
use dmem_verbs::{Clock, NodeId, Verbs, VerbsExt};
use dmem_workloads::{AnyWorkload, Scale, Workload};

/// Queue capacity of the CQL locks (at least the clients of one lock).
const CAP: usize = 8;
const LOCK_STRIDE: u64 = 256;

/// DecLock on `fabric`: 2 CNs × 2 clients take 2 locks exclusively 40 times each and
/// increment the lock's counter (READ, a pause, WRITE) inside; returns the counters' sum.
fn declock_counter_sum(fabric: Fabric) -> (u64, u64) {
    const LOCKS: u64 = 2;
    const OPS: u64 = 40;
    let cluster = LocalCluster::with_threads(fabric, 1, 2, 2, 1 << 16, 3).unwrap();
    let memory = cluster.memory();
    let region = memory.regions()[0];
    let initial = declock::layout::<CAP>().initial;
    for i in 0..LOCKS {
        memory.write(NodeId(0), i * LOCK_STRIDE, &initial).unwrap();
    }
    let counter = move |i: u64| region.at(LOCKS * LOCK_STRIDE + i * 64).unwrap();
    let lock = move |i: u64| region.at(i * LOCK_STRIDE).unwrap();
    let contexts: Vec<_> = (0..4u16)
        .map(|id| cluster.context(id / 2, id % 2).unwrap())
        .collect();
    let directory = Directory::new(contexts.iter().map(Verbs::local_endpoint).collect());
    let busy = Rc::new(Cell::new(contexts.len()));
    for (id, ctx) in contexts.into_iter().enumerate() {
        let mut client = DecLockClient::<_, CAP>::new(
            ctx.clone(),
            id as u32,
            directory.clone(),
            Rc::new(NoFailures),
            DecLockConfig::default(),
            id as u64 + 1,
        )
        .unwrap();
        let busy = Rc::clone(&busy);
        cluster.spawn(&ctx, async move {
            let mut rng = id as u64 * 0x9e37_79b9 + 1;
            for _ in 0..OPS {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let i = rng % LOCKS;
                let held = client.acquire(lock(i), LockMode::Exclusive).await.unwrap();
                let ctx = client.context();
                let v =
                    u64::from_le_bytes(ctx.read(counter(i), 8).await.unwrap().try_into().unwrap());
                ctx.sleep(2_000).await;
                ctx.write(counter(i), &(v + 1).to_le_bytes()).await.unwrap();
                client.release(held).await.unwrap();
            }
            busy.set(busy.get() - 1);
            // Answer DecLock's control messages until every client is done.
            while busy.get() > 0 {
                let now = client.context().now();
                client.idle_until(now + 200_000).await.unwrap();
            }
        });
    }
    cluster.run();
    let sum = (0..LOCKS)
        .map(|i| {
            let bytes = memory
                .read(NodeId(0), LOCKS * LOCK_STRIDE + i * 64, 8)
                .unwrap();
            u64::from_le_bytes(bytes.try_into().unwrap())
        })
        .sum();
    (sum, 4 * OPS)
}

#[test]
fn declock_keeps_mutual_exclusion_on_every_fabric() {
    for fabric in Fabric::ALL {
        let (sum, acquisitions) = declock_counter_sum(fabric);
        assert_eq!(sum, acquisitions, "{fabric}: lost counter updates");
    }
}

const MNS: u16 = 2;
const COORDINATORS: u16 = 6;
const TXNS_PER_COORDINATOR: usize = 60;

/// SmallBank on `protocol` over `fabric` through `dmem-deploy`: 5 coordinators on 2 CNs,
/// each its own context (its own connections on tcp). Returns (checker verdict, invariant
/// violations, committed).
fn smallbank(fabric: Fabric, protocol: &str) -> (String, Vec<String>, u64) {
    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    let protocol = dmem_protocols::registry().get(protocol).unwrap();
    let mut spec = deploy_spec(&workload, COORDINATORS);
    // Room enough in the index for tiny SmallBank without `deploy_loaded`'s retries.
    spec.index_slack *= 2;
    let bytes = protocol.mn_bytes_per_mn(&spec, MNS).unwrap();
    let cluster = LocalCluster::with_threads(fabric, MNS, 2, 2, bytes, 5).unwrap();
    let history = Rc::new(RefCell::new(History::new()));
    let mut deployment = protocol
        .deploy_on(cluster.memory(), &spec, Recorder::new(Rc::clone(&history)))
        .unwrap();
    for (table, key, value) in workload.loader() {
        deployment.load(table, key, &value).unwrap();
    }
    let workload = Rc::new(workload);
    let tally = Rc::new(ClientTally::default());
    for id in 0..COORDINATORS - 1 {
        let ctx = cluster.context(id % 2, id / 2).unwrap();
        let co = deployment.coordinator(ctx.clone(), id).unwrap();
        let client = tally.client(
            Rc::clone(&workload),
            co,
            id,
            7 ^ u64::from(id),
            TXNS_PER_COORDINATOR,
            dmem_harness::MAX_ATTEMPTS,
        );
        cluster.spawn(&ctx, client);
    }
    cluster.run();
    let d: &dyn Deployment = &*deployment;
    let violations = workload
        .check(|t, k| d.read_final(t, k), tally.delta.get())
        .iter()
        .map(ToString::to_string)
        .collect();
    let verdict = verdict(&history.borrow());
    (verdict, violations, tally.committed.get())
}

fn smallbank_everywhere(protocol: &str) {
    for fabric in Fabric::ALL {
        let (verdict, violations, committed) = smallbank(fabric, protocol);
        assert_eq!(verdict, "ok", "{protocol} on {fabric}");
        assert!(
            violations.is_empty(),
            "{protocol} on {fabric}: {violations:?}"
        );
        let all = u64::from(COORDINATORS - 1) * TXNS_PER_COORDINATOR as u64;
        assert!(
            committed > all * 3 / 4,
            "{protocol} on {fabric}: {committed} of {all} committed"
        );
        eprintln!("{protocol} on {fabric}: {committed} of {all} committed");
    }
}

#[test]
fn ford_runs_smallbank_on_every_fabric() {
    smallbank_everywhere("ford");
}

#[test]
fn pandora_runs_smallbank_on_every_fabric() {
    smallbank_everywhere("pandora");
}

#[test]
fn motor_runs_smallbank_on_every_fabric() {
    smallbank_everywhere("motor");
}

#[test]
fn oocc_runs_smallbank_on_every_fabric() {
    smallbank_everywhere("oocc");
}

/// One-sided protocols through an RDMA NIC: the MNs' regions registered and served in this
/// process, each coordinator's context a queue pair to every MN (soft-RoCE in CI:
/// `ci/rxe-vm.sh`; every one-sided protocol runs there as processes under `dmem bench
/// --fabric rdma`). Needs a device, so it is ignored in a plain `cargo test`.
#[cfg(feature = "rdma")]
#[test]
#[ignore = "needs an RDMA device: run inside ci/rxe-vm.sh"]
fn one_sided_protocols_run_smallbank_on_rdma() {
    for protocol in ["pandora", "motor", "oocc"] {
        let (verdict, violations, committed) = smallbank(Fabric::Rdma, protocol);
        assert_eq!(verdict, "ok", "{protocol} on rdma");
        assert!(violations.is_empty(), "{protocol} on rdma: {violations:?}");
        // Emulated RDMA is ~100x slower than a NIC, so lease- and lock-based protocols
        // give up more transactions after their retries than on the other fabrics.
        let all = u64::from(COORDINATORS - 1) * TXNS_PER_COORDINATOR as u64;
        assert!(
            committed > all / 2,
            "{protocol} on rdma: {committed} of {all} committed"
        );
        eprintln!("{protocol} on rdma: {committed} of {all} committed");
    }
}

#[test]
fn simulator_only_protocols_say_so_on_real_fabrics() {
    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    let spec = deploy_spec(&workload, 2);
    let cluster = LocalCluster::new(Fabric::Shm, 1, 1, 1 << 16, 1).unwrap();
    let history = Recorder::new(Rc::new(RefCell::new(History::new())));
    // LOTUS itself deploys in CN processes (`tests/lotus_cn_processes.rs`); its idealised
    // RDMA lock reads every CN's table directly. Dandelion has no MN memory to be laid out
    // on: its servers deploy on their own contexts (`deploy_servers`, `tests/symmetric.rs`).
    for name in ["dnl-4", "lotus:rdma-lock"] {
        let protocol = dmem_protocols::registry().get(name).unwrap();
        let err = protocol
            .deploy_on(cluster.memory(), &spec, history.clone())
            .err()
            .unwrap();
        assert!(
            matches!(err, dmem_deploy::DeployError::SimOnly { .. }),
            "{name}: {err}"
        );
    }
}

/// The MNs' side of link termination across processes
/// (`LocalCluster::answer_link_terminations`, as `dmem mn` answers): a CN's
/// `MessageLinkTerminator` cuts another CN off every MN, after which nothing that CN posts
/// lands, while the terminating CN keeps its access; the simulator, which terminates links
/// directly, has no MN control endpoints and says so.
#[test]
fn mns_answer_link_terminations_on_real_fabrics() {
    use dmem_deploy::process::MessageLinkTerminator;

    for fabric in [Fabric::Shm, Fabric::Tcp] {
        let cluster = Rc::new(LocalCluster::new(fabric, 2, 2, 1 << 16, 1).unwrap());
        let (survivor, victim) = (
            cluster.context(0, 1).unwrap(),
            cluster.context(1, 1).unwrap(),
        );
        let regions = cluster.memory().regions();
        let at = move |mn: usize| regions[mn].at(64).unwrap();
        let until = dmem_runtime::monotonic_now() + 5_000_000_000;
        cluster.spawn(&survivor, cluster.answer_link_terminations(until).unwrap());
        let terminator =
            MessageLinkTerminator::new(cluster.context(0, 2).unwrap(), 1_000_000, 2_000_000_000);
        let (mns, victim_node) = ([cluster.mn(0), cluster.mn(1)], cluster.cn(1));
        let anchor = survivor.clone();
        let outcome = cluster.block_on(&anchor, async move {
            victim.write(at(0), &[1; 8]).await.unwrap();
            for mn in mns {
                terminator.terminate(mn, victim_node).await.unwrap();
            }
            let cut = [
                victim.write(at(0), &[2; 8]).await.is_err(),
                victim.write(at(1), &[2; 8]).await.is_err(),
            ];
            let kept = survivor.write(at(1), &[3; 8]).await.is_ok();
            (cut, kept)
        });
        assert_eq!(outcome, ([true, true], true), "{fabric}");
        assert_eq!(
            cluster.memory().read(NodeId(0), 64, 1),
            Some(vec![1]),
            "{fabric}: the cut CN's write after termination landed"
        );
    }
    let sim = Rc::new(LocalCluster::new(Fabric::Sim, 1, 1, 1 << 16, 1).unwrap());
    let err = sim.answer_link_terminations(1).err().unwrap();
    assert!(err.to_string().contains("directly"), "{err}");
}

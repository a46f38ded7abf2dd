//! A custom CN/MN binary from the dmem crates: memory nodes and compute-node contexts on a
//! local fabric, a registered protocol deployed on the MNs, SmallBank's coordinators on the
//! CNs, then the history checker and SmallBank's invariants over the result.
//!
//! `cargo run -p dmem-example-custom-cluster -- [sim|shm|tcp] [protocol]` (default: `shm
//! pandora`). Exits non-zero if the history is not strictly serializable, an invariant is
//! broken, or too few transactions committed.

use std::cell::RefCell;
use std::rc::Rc;

use anyhow::bail;
use dmem_deploy::{Deployment, Recorder};
use dmem_harness::fabric::{ClientTally, Fabric, LocalCluster};
use dmem_harness::{MAX_ATTEMPTS, deploy_spec, verdict};
use dmem_txn::History;
use dmem_workloads::{AnyWorkload, Scale, Workload};

/// Memory nodes.
const MNS: u16 = 2;
/// Compute nodes; coordinators are spread over them.
const CNS: u16 = 2;
/// Coordinators (each its own context: its own connections on tcp).
const COORDINATORS: u16 = 4;
/// Transactions each coordinator runs.
const TXNS_PER_COORDINATOR: usize = 50;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let fabric: Fabric = args
        .next()
        .as_deref()
        .unwrap_or("shm")
        .parse()
        .map_err(anyhow::Error::msg)?;
    let protocol_name = args.next().unwrap_or_else(|| "pandora".to_owned());

    // The workload and the protocol, by name, from the registries the CLI uses too.
    let workload = AnyWorkload::new("smallbank", Scale::Tiny)?;
    let protocol = dmem_protocols::registry().get(&protocol_name)?;

    // MN memory sized by the protocol for this workload, and the CN side of the cluster.
    let mut spec = deploy_spec(&workload, COORDINATORS);
    spec.index_slack *= 2; // room in the hash index for every tiny-SmallBank record
    let bytes_per_mn = protocol.mn_bytes_per_mn(&spec, MNS)?;
    let cluster =
        LocalCluster::with_threads(fabric, MNS, CNS, COORDINATORS / CNS, bytes_per_mn, 1)?;

    // Deploy: lay the protocol's structures out in MN memory, record every transaction's
    // reads and writes for the checker, and load the initial records.
    let history = Rc::new(RefCell::new(History::new()));
    let mut deployment =
        protocol.deploy_on(cluster.memory(), &spec, Recorder::new(Rc::clone(&history)))?;
    for (table, key, value) in workload.loader() {
        deployment.load(table, key, &value)?;
    }

    // One coordinator per CN thread, each running a closed loop of SmallBank transactions.
    let workload = Rc::new(workload);
    let tally = Rc::new(ClientTally::default());
    for id in 0..COORDINATORS {
        let ctx = cluster.context(id % CNS, id / CNS)?;
        let coordinator = deployment.coordinator(ctx.clone(), id)?;
        let seed = 42 ^ u64::from(id);
        let client = tally.client(
            Rc::clone(&workload),
            coordinator,
            id,
            seed,
            TXNS_PER_COORDINATOR,
            MAX_ATTEMPTS,
        );
        cluster.spawn(&ctx, client);
    }
    cluster.run();

    // Judge the run: strict serializability of the history, then SmallBank's invariants
    // (money conserved by the committed transactions) over the final MN state.
    let verdict = verdict(&history.borrow());
    let deployment: &dyn Deployment = &*deployment;
    let violations = workload.check(|t, k| deployment.read_final(t, k), tally.delta.get());
    let committed = tally.committed.get();
    let all = u64::from(COORDINATORS) * TXNS_PER_COORDINATOR as u64;
    println!(
        "{protocol_name} on {fabric}: {committed} of {all} committed (SmallBank rolls some back), \
         checker: {verdict}, \
         {} invariant violations, given up: {:?}",
        violations.len(),
        tally.given_up.borrow()
    );
    if verdict != "ok" {
        bail!("the history checker found an anomaly: {verdict}");
    }
    if let Some(first) = violations.first() {
        bail!(
            "{} SmallBank invariant violations, first: {first}",
            violations.len()
        );
    }
    if committed * 2 < all {
        bail!("only {committed} of {all} transactions committed");
    }
    Ok(())
}

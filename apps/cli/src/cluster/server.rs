//! `dmem server`: a server process of a symmetric protocol (Dandelion, FaSST; `role =
//! "server"` nodes, no MNs). It runs the transaction CN process ([`run_txn_cn`]) on a
//! deployment of its own server (`Protocol::deploy_server`), which loads the records it
//! holds and runs its message loop among its process tasks.

use anyhow::{Context as _, ensure};

use super::cn::run_txn_cn;
use super::config::{Cluster, NodeArgs};
use super::setup::TxnSetup;

/// `dmem server`: a server of a symmetric protocol, which runs the CN process's wiring
/// ([`run_txn_cn`]) with a deployment of its own server (`Protocol::deploy_server`).
pub(crate) fn run_server(args: &NodeArgs) -> anyhow::Result<()> {
    let cluster = Cluster::load(&args.cluster)?;
    ensure!(
        cluster.symmetric(),
        "node `{}`: `dmem server` runs a server of a symmetric protocol (role = \"server\"); this cluster's nodes are MNs and CNs (`dmem mn`, `dmem cn`)",
        args.node
    );
    let me = cluster.cn(&args.node)?.clone();
    let setup =
        TxnSetup::of(&cluster)?.context("a symmetric protocol runs a transaction workload")?;
    run_txn_cn(&cluster, &me, &setup)
}

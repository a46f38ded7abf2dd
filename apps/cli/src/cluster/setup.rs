//! The deployment of a transaction workload ([`TxnSetup`]), which every process of a
//! cluster derives alike from the cluster file: the workload's tables, one coordinator id
//! per client of every CN plus one for the final check, and the MNs' regions, given to the
//! protocol's `Protocol::deploy_on` (`dmem-deploy`), the same path the simulator's runs take.

use std::rc::Rc;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use dmem_deploy::{DeploySpec, Deployment, MnMemory, Placement, Protocol, Recorder};
use dmem_verbs::{MemoryRegion, NodeId, RKey};
use dmem_workloads::{AnyWorkload, Workload};

use super::config::{Cluster, Kind};

/// The deployment of a cluster, as every process derives it.
#[derive(Clone)]
pub(crate) struct TxnSetup {
    pub(crate) workload: AnyWorkload,
    pub(crate) protocol: Arc<dyn Protocol>,
    pub(crate) spec: DeploySpec,
    /// Every MN's region (none for a symmetric protocol).
    pub(crate) regions: Vec<MemoryRegion>,
    /// Where the dry run's loader placed the records (`Deployment::placement`), for
    /// deployments that take it instead of loading again (`Protocol::deploy_placed`).
    pub(crate) placement: Option<Placement>,
}

impl TxnSetup {
    /// The deployment of `cluster`'s transaction workload; `None` for the `faa` workload.
    pub(crate) fn of(cluster: &Cluster) -> anyhow::Result<Option<Self>> {
        match cluster.kind() {
            Kind::Faa => Ok(None),
            Kind::Txn {
                workload,
                scale,
                protocol,
            } => Self::new(cluster, workload, *scale, protocol)
                .map(Some)
                .with_context(|| format!("cluster file {}", cluster.path().display())),
        }
    }

    fn new(
        cluster: &Cluster,
        workload: &str,
        scale: dmem_workloads::Scale,
        protocol: &str,
    ) -> anyhow::Result<Self> {
        let workload = AnyWorkload::new(workload, scale)?;
        let protocol = dmem_protocols::registry().get(protocol)?;
        let spec = dmem_harness::deploy_spec(&workload, cluster.coordinators() + 1);
        if protocol.symmetric() {
            // Servers hold their records in their own memory: no regions to size, and
            // each server process loads its share (`Protocol::deploy_server`).
            return Ok(Self {
                workload,
                protocol,
                spec,
                regions: Vec::new(),
                placement: None,
            });
        }
        // A full index bucket doubles the slack (`dmem_deploy::load_growing_slack`, as the
        // simulator's runs); here a dry run of the protocol's loader (a deployment on the
        // regions alone, which writes nothing) finds it, so every process derives the same.
        let (regions, dry, spec) = dmem_deploy::load_growing_slack(
            &spec,
            |spec| {
                let len = protocol.mn_bytes_per_mn(spec, cluster.mn_count())?;
                let regions: Vec<MemoryRegion> = (0..cluster.mn_count())
                    .map(|i| MemoryRegion {
                        node: NodeId(i),
                        rkey: mn_rkey(NodeId(i)),
                        len,
                    })
                    .collect();
                let dry = protocol.deploy_on(
                    MnMemory::remote(regions.clone()),
                    spec,
                    Recorder::new(Rc::default()),
                )?;
                Ok((regions, dry))
            },
            || workload.loader(),
        )?;
        Ok(Self {
            workload,
            protocol,
            spec,
            regions,
            placement: dry.placement(),
        })
    }

    /// The protocol deployed on `memory`, recording into `history`.
    pub(crate) fn deploy(
        &self,
        memory: MnMemory,
        history: Recorder,
    ) -> anyhow::Result<Box<dyn Deployment>> {
        Ok(self.protocol.deploy_on(memory, &self.spec, history)?)
    }

    /// Whether CN failures are recovered across processes
    /// (`ProcessDeployment::recovers_across_processes`).
    pub(crate) fn recovers(&self) -> anyhow::Result<bool> {
        if self.protocol.symmetric() {
            // Its recovery runs on the simulator only (refused with a reason by `dmem
            // cluster --kill`).
            return Ok(false);
        }
        let mut remote = self.remote()?;
        Ok(
            dmem_deploy::require_processes(&mut *remote, &self.protocol.name())?
                .recovers_across_processes(),
        )
    }

    /// Whether a CN may run its coordinators on `threads` cores: one always, more when the
    /// protocol lets a CN split them (`ProcessDeployment::splits_across_cores`); else one line why.
    pub(crate) fn check_threads(&self, threads: u32) -> anyhow::Result<()> {
        if threads > 1 && self.protocol.symmetric() {
            bail!(
                "threads = {threads}: a server of protocol `{}` runs on one core; use threads = 1",
                self.protocol.name()
            );
        }
        if threads <= 1 {
            return Ok(());
        }
        let mut remote = self.remote()?;
        let side = dmem_deploy::require_processes(&mut *remote, &self.protocol.name())?;
        if let Err(why) = side.splits_across_cores() {
            bail!(
                "threads = {threads}: protocol `{}` cannot split a CN's coordinators across cores: {why}; use threads = 1",
                self.protocol.name()
            );
        }
        Ok(())
    }

    /// How many MNs hold each record (`Deployment::replicas`).
    pub(crate) fn replicas(&self) -> anyhow::Result<u16> {
        if self.protocol.symmetric() {
            // No MNs: nothing an MN failure could lose.
            return Ok(1);
        }
        Ok(self.remote()?.replicas())
    }

    /// The protocol deployed on the regions alone, recording nowhere.
    fn remote(&self) -> anyhow::Result<Box<dyn Deployment>> {
        self.deploy(
            MnMemory::remote(self.regions.clone()),
            Recorder::new(Rc::default()),
        )
    }

    /// Bytes of each MN's region.
    pub(crate) fn bytes_per_mn(&self) -> u64 {
        self.regions.first().map_or(0, |r| r.len)
    }
}

/// The rkey of MN `node`'s region.
pub(crate) fn mn_rkey(node: NodeId) -> RKey {
    RKey(0xd3e3_0000 | u32::from(node.0))
}

//! The simulated cluster a deployment runs on, the size–load–retry loop and link
//! termination.

use std::cell::RefCell;
use std::rc::Rc;

use dmem_sim::{ClusterConfig, MessageFaults, NicProfile, Sim};
use dmem_txn::{History, Key, TableId};
use dmem_verbs::NodeId;

use crate::{DeployError, DeploySpec, Deployment, Protocol};

/// The simulated cluster a run needs.
#[derive(Debug, Clone)]
pub struct ClusterShape {
    /// Memory nodes.
    pub mns: u16,
    /// Compute nodes (all of them, including one that runs only recovery).
    pub cns: u16,
    /// Threads (cores) per CN.
    pub threads: u16,
    /// Seed of the cluster.
    pub seed: u64,
    /// NIC profile.
    pub profile: NicProfile,
    /// MN memory is at least this large, whatever the protocol needs.
    pub min_mn_bytes: u64,
    /// How the network mistreats two-sided messages (lock RPCs, Dandelion's RPCs,
    /// heartbeats): lost, duplicated, delayed. One-sided verbs are never lost (RC queue
    /// pairs retransmit in the NIC). Default: none.
    pub message_faults: MessageFaults,
}

impl Default for ClusterShape {
    /// 3 MNs, 2 CNs × 4 threads, seed 1, the cx5 profile, at least 1 MiB per MN, no message
    /// faults (`dmem bench`'s defaults): set what differs, `ClusterShape { cns: 9,
    /// ..ClusterShape::default() }`.
    fn default() -> Self {
        Self {
            mns: 3,
            cns: 2,
            threads: 4,
            seed: 1,
            profile: NicProfile::cx5(),
            min_mn_bytes: 1 << 20,
            message_faults: MessageFaults::default(),
        }
    }
}

impl ClusterShape {
    /// The shape of a symmetric deployment (see [`Protocol::symmetric`]): `servers` CNs that
    /// are the servers, and the one MN the simulator requires, left idle at its minimum size.
    #[must_use]
    pub fn symmetric(mut self, servers: u16) -> Self {
        self.cns = servers;
        self.mns = 1;
        self
    }

    /// Builds the cluster with `mn_bytes` (at least [`min_mn_bytes`](Self::min_mn_bytes))
    /// of memory per MN.
    ///
    /// # Errors
    /// [`DeployError::Sim`] for an invalid shape.
    pub fn build(&self, mn_bytes: u64) -> Result<Rc<Sim>, DeployError> {
        Ok(Rc::new(Sim::new(
            ClusterConfig::with_profile(self.profile.clone())
                .mns(self.mns)
                .cns(self.cns)
                .threads_per_cn(self.threads)
                .mn_memory_bytes(mn_bytes.max(self.min_mn_bytes))
                .seed(self.seed)
                .message_faults(self.message_faults),
        )?))
    }
}

/// A protocol deployed and loaded on its cluster.
pub struct Deployed {
    /// The cluster.
    pub sim: Rc<Sim>,
    /// The deployment.
    pub deployment: Box<dyn Deployment>,
    /// The spec it was laid out with (its `index_slack` may have grown).
    pub spec: DeploySpec,
}

impl core::fmt::Debug for Deployed {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Deployed")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

/// Largest index slack [`load_growing_slack`] tries before it gives up on a full bucket.
const MAX_SLACK: u64 = 32;

/// Sizes the MNs for `spec`, builds the cluster, deploys `protocol` and loads `records()`;
/// when a bucket of a hashed index fills, doubles the index slack and starts over (up to
/// 32×, [`load_growing_slack`]). Tables of [`DeploySpec::key_spaces`] are direct-mapped:
/// they never fill and do not grow with the slack, so a workload whose tables are all dense
/// loads in one pass.
///
/// `records` is called once per attempt, so it must give the same records each time.
///
/// # Errors
/// [`DeployError`] if the cluster cannot be built or a record does not load.
pub fn deploy_loaded<I>(
    protocol: &dyn Protocol,
    shape: &ClusterShape,
    spec: &DeploySpec,
    history: &Rc<RefCell<History>>,
    records: impl FnMut() -> I,
) -> Result<Deployed, DeployError>
where
    I: IntoIterator<Item = (TableId, Key, Vec<u8>)>,
{
    let (sim, deployment, spec) = load_growing_slack(
        spec,
        |spec| {
            let sim = shape.build(protocol.mn_bytes_per_mn(spec, shape.mns)?)?;
            let deployment = protocol.deploy(&sim, spec, Rc::clone(history))?;
            Ok((sim, deployment))
        },
        records,
    )?;
    Ok(Deployed {
        sim,
        deployment,
        spec,
    })
}

/// Loads `records()` into the deployment `deploy` makes for a spec; when a bucket of a
/// hashed index fills, doubles the spec's index slack and starts over with a new
/// deployment (up to 32×). Returns what `deploy` made alongside the deployment (the
/// simulator, or the regions of a process cluster's dry run), the loaded deployment and
/// the spec that fit: the one slack search that the simulator's runs and a process
/// cluster's start-up (every process derives the same slack) share.
///
/// `records` is called once per attempt, so it must give the same records each time.
///
/// # Errors
/// What `deploy` returns, or the load's [`DeployError`] (a full bucket at the largest
/// slack included).
pub fn load_growing_slack<T, I>(
    spec: &DeploySpec,
    mut deploy: impl FnMut(&DeploySpec) -> Result<(T, Box<dyn Deployment>), DeployError>,
    mut records: impl FnMut() -> I,
) -> Result<(T, Box<dyn Deployment>, DeploySpec), DeployError>
where
    I: IntoIterator<Item = (TableId, Key, Vec<u8>)>,
{
    let mut spec = spec.clone();
    loop {
        let (made, mut deployment) = deploy(&spec)?;
        let mut full = false;
        for (table, key, value) in records() {
            match deployment.load(table, key, &value) {
                Ok(()) => {}
                Err(e) if e.is_index_full() && spec.index_slack < MAX_SLACK => {
                    full = true;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if !full {
            return Ok((made, deployment, spec));
        }
        spec.index_slack = (spec.index_slack * 2).max(1);
    }
}

/// Active-link termination in the simulator (Pandora §3.2.2 step 2): the MN revokes the
/// CN's access at once, at no virtual-time cost (the paper sends an RPC to the MN's
/// management core). Protocols wrap it in their own terminator trait.
#[derive(Clone)]
pub struct SimLinkTerminator(pub Rc<Sim>);

impl SimLinkTerminator {
    /// Revokes `cn`'s access at `mn`; no later access from `cn` lands there.
    pub fn terminate(&self, mn: NodeId, cn: NodeId) {
        self.0.revoke(mn, cn);
    }
}

impl core::fmt::Debug for SimLinkTerminator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("SimLinkTerminator")
    }
}

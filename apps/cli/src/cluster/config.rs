//! The cluster file (see [`Cluster`]): its TOML schema as written ([`ClusterFile`]) and the
//! validated cluster every process of a run derives from it alike. Node ids follow the
//! simulator's convention: MNs first, in file order, then CNs.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use clap::Args as ClapArgs;
use dmem_runtime::ExecutorChoice;
use dmem_verbs::{Nanos, NodeId};
use serde::Deserialize;

use dmem_cli::common;

/// Bytes between two CN words at an MN (a cache line each, so FAAs do not share one).
const WORD_STRIDE: u64 = 64;

/// The cluster file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClusterFile {
    /// `tcp`, `shm` (one host: MN memory is a memfd mapping the CNs map, messages go
    /// over Unix sockets in `socket_dir`) or `rdma` (one-sided verbs through an RDMA NIC,
    /// the control plane over TCP as on tcp).
    fabric: String,
    /// rdma: the device to use (default: the first one libibverbs lists).
    rdma_device: Option<String>,
    /// rdma: the GID table entry to address peers from (default: the port's first
    /// non-zero GID; RoCE v2 over IPv4 on ConnectX is usually 3).
    rdma_gid_index: Option<u8>,
    /// shm: the directory of the MNs' memory sockets and every node's message socket
    /// (default: a directory of the host's temporary directory named after the file).
    socket_dir: Option<PathBuf>,
    /// CN heartbeat period, ms.
    #[serde(default = "default_heartbeat_ms")]
    heartbeat_ms: u64,
    /// Silence after which an MN revokes a CN, ms.
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
    /// How long an MN waits for every CN's first heartbeat, and a CN for every MN, ms.
    #[serde(default = "default_join_timeout_ms")]
    join_timeout_ms: u64,
    workload: WorkloadFile,
    #[serde(rename = "node")]
    nodes: Vec<NodeFile>,
}

fn default_heartbeat_ms() -> u64 {
    10
}
fn default_timeout_ms() -> u64 {
    250
}
fn default_join_timeout_ms() -> u64 {
    10_000
}
fn default_one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadFile {
    /// `faa` (verbs level) or a transaction workload (`smallbank`, `kvs`, `ycsb`, `tatp`,
    /// `tpcc`).
    kind: String,
    /// Transaction workloads: a registered protocol that runs on real fabrics (`ford`,
    /// `pandora`, `occ`, `motor`, ...).
    protocol: Option<String>,
    /// Transaction workloads: `tiny` (default), `small`, `ford`, `motor`, `lotus`.
    scale: Option<String>,
    duration_ms: u64,
    #[serde(default = "default_one")]
    threads: u32,
    #[serde(default = "default_one")]
    clients: u32,
    #[serde(default = "default_one")]
    batch: u32,
    /// The executor of each CN thread (`faa`: client thread; transaction workloads: core
    /// running its share of the coordinators): `auto` (default: glommio, pinned, where this
    /// build has it and it starts; else the polling executor), `polling` or `glommio`.
    executor: Option<String>,
    /// Transaction workloads: tries per transaction before a CN gives it up (at least 1;
    /// default `dmem_harness::MAX_ATTEMPTS`), as `dmem bench --attempts`.
    attempts: Option<u32>,
    /// Transaction workloads: the wait before each retry, `none` (default) or
    /// `exp:BASE_US:CAP_US`, as `dmem bench --backoff`.
    backoff: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    name: String,
    role: String,
    /// MN: where CNs reach its memory.
    data: Option<String>,
    /// tcp: where the node receives control messages (heartbeats, done).
    control: Option<String>,
    /// MN: registered memory, MiB.
    memory_mib: Option<u64>,
    /// Network namespace `dmem cluster` starts the node in (`ip netns exec`).
    netns: Option<String>,
}

/// The fabric of a validated cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fabric {
    /// Memory served over TCP by each MN, messages over TCP between `control` addresses.
    Tcp,
    /// One host: each MN hands its memfd to the CNs over `<dir>/mn-<id>.sock`
    /// (`dmem_shm::MnLink::connect`), messages travel the shm fabric's Unix sockets
    /// `<dir>/node-<id>.sock` (`ShmFabric::serve_messages`).
    Shm {
        /// The sockets' directory.
        dir: PathBuf,
    },
    /// Each MN's memory registered with an RDMA NIC; CN contexts connect a queue pair to
    /// it through its `data` address (the descriptor exchange), and post one-sided verbs
    /// through the NIC. Messages travel TCP between `control` addresses, as on tcp.
    Rdma {
        /// The device (`None`: the first one).
        device: Option<String>,
        /// The GID table entry (`None`: the port's first non-zero GID).
        gid_index: Option<u8>,
    },
}

impl Fabric {
    /// Whether nodes have `data`/`control` addresses (tcp, and rdma's control plane).
    pub(crate) fn addressed(&self) -> bool {
        matches!(self, Fabric::Tcp | Fabric::Rdma { .. })
    }
}

/// A memory node of a validated cluster.
#[derive(Debug, Clone)]
pub(crate) struct MnNode {
    pub(crate) name: String,
    pub(crate) node: NodeId,
    /// tcp only (validated: present exactly on tcp).
    data: Option<SocketAddr>,
    control: Option<SocketAddr>,
    memory: u64,
    netns: Option<String>,
}

/// A compute node of a validated cluster.
#[derive(Debug, Clone)]
pub(crate) struct CnNode {
    pub(crate) name: String,
    pub(crate) node: NodeId,
    /// tcp only (validated: present exactly on tcp).
    control: Option<SocketAddr>,
    netns: Option<String>,
}

/// The message that a tcp address is missing: only reachable if a shm cluster reaches tcp code.
fn tcp_only(name: &str, what: &str) -> anyhow::Error {
    anyhow::anyhow!("node `{name}` has no tcp {what} address (the cluster's fabric is shm)")
}

impl MnNode {
    /// The tcp address CNs reach this MN's memory on.
    pub(crate) fn data(&self) -> anyhow::Result<SocketAddr> {
        self.data.ok_or_else(|| tcp_only(&self.name, "data"))
    }

    /// The tcp address this MN receives messages on.
    pub(crate) fn control(&self) -> anyhow::Result<SocketAddr> {
        self.control.ok_or_else(|| tcp_only(&self.name, "control"))
    }

    /// Bytes of memory this MN registers (`faa`; a transaction workload's store sizes its own).
    pub(crate) fn memory(&self) -> u64 {
        self.memory
    }

    /// The network namespace `dmem cluster` starts this MN in.
    pub(crate) fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }
}

impl CnNode {
    /// The network namespace `dmem cluster` starts this CN in.
    pub(crate) fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    /// The tcp address this CN receives messages on.
    pub(crate) fn control(&self) -> anyhow::Result<SocketAddr> {
        self.control.ok_or_else(|| tcp_only(&self.name, "control"))
    }
}

/// What the CNs run.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// Verbs-level FAA counters.
    Faa,
    /// A transaction workload on a protocol.
    Txn {
        workload: String,
        scale: dmem_workloads::Scale,
        protocol: String,
    },
}

/// A validated cluster file.
#[derive(Debug, Clone)]
pub(crate) struct Cluster {
    fabric: Fabric,
    kind: Kind,
    path: PathBuf,
    heartbeat: Nanos,
    timeout: Nanos,
    join_timeout: Duration,
    duration: Duration,
    threads: u32,
    clients: u32,
    batch: u32,
    executor: ExecutorChoice,
    /// Tries per transaction (transaction workloads).
    attempts: u32,
    /// The wait before each retry (transaction workloads).
    backoff: dmem_harness::Backoff,
    mns: Vec<MnNode>,
    /// The CNs; for a symmetric protocol, the servers (`role = "server"`: each runs
    /// coordinators like a CN and holds its share of the records; there are no MNs).
    cns: Vec<CnNode>,
    /// Whether the nodes are the servers of a symmetric protocol (Dandelion, FaSST).
    servers: bool,
}

/// Most work requests one CN's post list may carry (the tcp fabric's per-frame limit).
const MAX_WRS: u64 = dmem_tcp::wire::MAX_WRS as u64;

impl Cluster {
    /// Reads and checks a cluster file; every problem is one line naming the file and node.
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read cluster file {}", path.display()))?;
        let file: ClusterFile = toml::from_str(&text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            anyhow::anyhow!(
                "cluster file {}{}: {}",
                path.display(),
                line.map_or(String::new(), |l| format!(", line {l}")),
                e.message().trim_end()
            )
        })?;
        Self::validate(path, file).with_context(|| format!("cluster file {}", path.display()))
    }

    /// Checks the file in the order a reader meets its parts: the fabric, the timing, the
    /// workload, then the nodes.
    fn validate(path: &Path, file: ClusterFile) -> anyhow::Result<Self> {
        let fabric = Self::fabric_of(path, &file)?;
        let is_tcp = fabric.addressed();
        ensure!(
            file.heartbeat_ms >= 1 && file.timeout_ms > file.heartbeat_ms,
            "timeout_ms ({}) must exceed heartbeat_ms ({}), which must be at least 1",
            file.timeout_ms,
            file.heartbeat_ms
        );
        let w = &file.workload;
        let checked = CheckedWorkload::of(w, fabric == Fabric::Tcp)?;
        let (mns, cns) = NodeRoles::sort(&file.nodes, is_tcp, &checked, w)?;
        let mn_count = mns.len();
        ensure!(
            mn_count + cns.len() < usize::from(u16::MAX),
            "too many nodes"
        );
        let per_list = mn_count as u64 * u64::from(w.batch) * 2;
        ensure!(
            w.batch >= 1 && per_list <= MAX_WRS,
            "workload batch {} x {mn_count} MNs x 2 FAAs = {per_list} work requests per post list; the tcp fabric takes 1..={MAX_WRS}",
            w.batch
        );
        let (mns, cns) = Self::number_nodes(mns, cns)?;
        let executor = w
            .executor
            .as_deref()
            .map_or(Ok(ExecutorChoice::Auto), ExecutorChoice::from_name)
            .map_err(|e| anyhow::anyhow!("workload {e}"))?;
        let coordinators = cns.len() as u64 * u64::from(w.clients);
        ensure!(
            coordinators < u64::from(u16::MAX),
            "{coordinators} coordinators (CNs x clients) exceed the 16-bit coordinator ids"
        );
        Ok(Self {
            fabric,
            kind: checked.kind,
            path: path.to_path_buf(),
            heartbeat: file.heartbeat_ms * 1_000_000,
            timeout: file.timeout_ms * 1_000_000,
            join_timeout: Duration::from_millis(file.join_timeout_ms),
            duration: Duration::from_millis(w.duration_ms),
            threads: w.threads,
            clients: w.clients,
            batch: w.batch,
            executor,
            attempts: checked.attempts,
            backoff: checked.backoff,
            mns,
            cns,
            servers: checked.symmetric,
        })
    }

    /// The file's `fabric` (and, on shm, its socket directory).
    fn fabric_of(path: &Path, file: &ClusterFile) -> anyhow::Result<Fabric> {
        ensure!(
            (file.rdma_device.is_none() && file.rdma_gid_index.is_none()) || file.fabric == "rdma",
            "rdma_device and rdma_gid_index are for fabric = \"rdma\""
        );
        Ok(match file.fabric.as_str() {
            "tcp" => {
                ensure!(
                    file.socket_dir.is_none(),
                    "socket_dir is for fabric = \"shm\" (tcp nodes have `data` and `control` addresses)"
                );
                Fabric::Tcp
            }
            "shm" => Fabric::Shm {
                dir: file
                    .socket_dir
                    .clone()
                    .unwrap_or_else(|| Self::host_dir(path, "dmem-shm")),
            },
            "rdma" => {
                ensure!(
                    cfg!(feature = "rdma"),
                    "fabric = \"rdma\" needs a dmem built with RDMA support: cargo build --release -p dmem-cli --features rdma"
                );
                ensure!(
                    file.socket_dir.is_none(),
                    "socket_dir is for fabric = \"shm\" (rdma nodes have `data` and `control` addresses)"
                );
                Fabric::Rdma {
                    device: file.rdma_device.clone(),
                    gid_index: file.rdma_gid_index,
                }
            }
            other => bail!("fabric `{other}` is not `tcp`, `shm` or `rdma`"),
        })
    }

    /// Node ids in the simulator's order (MNs first, then CNs), once the MNs' memory holds
    /// the `faa` counters and fits this host.
    fn number_nodes(
        mns: Vec<SortedMn<'_>>,
        cns: Vec<SortedCn<'_>>,
    ) -> anyhow::Result<(Vec<MnNode>, Vec<CnNode>)> {
        let mn_count = mns.len();
        let need = WORD_STRIDE * (1 + cns.len() as u64);
        let mns: Vec<MnNode> = mns
            .into_iter()
            .enumerate()
            .map(|(i, (n, data, control, memory))| {
                ensure!(
                    memory >= need,
                    "node `{}`: memory_mib holds fewer than the {need} bytes of counters",
                    n.name
                );
                Ok(MnNode {
                    name: n.name.clone(),
                    node: NodeId(i as u16),
                    data,
                    control,
                    memory,
                    netns: n.netns.clone(),
                })
            })
            .collect::<anyhow::Result<_>>()?;
        common::ensure_memory(
            Some(mns.iter().map(|m| m.memory).sum()),
            "the MNs' memory_mib",
            "memory_mib",
        )?;
        let cns: Vec<CnNode> = cns
            .into_iter()
            .enumerate()
            .map(|(i, (n, control))| CnNode {
                name: n.name.clone(),
                node: NodeId((mn_count + i) as u16),
                control,
                netns: n.netns.clone(),
            })
            .collect();
        Ok((mns, cns))
    }

    /// Whether the nodes are the servers of a symmetric protocol (`role = "server"`).
    pub(crate) fn symmetric(&self) -> bool {
        self.servers
    }

    /// The role of the nodes that run coordinators: `cn`, or `server` for a symmetric
    /// protocol (also the `dmem` command that starts one).
    pub(crate) fn cn_role(&self) -> &'static str {
        if self.servers { "server" } else { "cn" }
    }

    pub(crate) fn mns(&self) -> &[MnNode] {
        &self.mns
    }

    pub(crate) fn cns(&self) -> &[CnNode] {
        &self.cns
    }

    /// What the CNs run.
    pub(crate) fn kind(&self) -> &Kind {
        &self.kind
    }

    /// FAA pairs per MN in every post list of the `faa` workload.
    pub(crate) fn batch(&self) -> u32 {
        self.batch
    }

    /// The protocol of a transaction workload.
    pub(crate) fn protocol(&self) -> Option<&str> {
        match &self.kind {
            Kind::Txn { protocol, .. } => Some(protocol),
            Kind::Faa => None,
        }
    }

    pub(crate) fn mn_count(&self) -> u16 {
        self.mns.len() as u16
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Where the CN processes of this cluster keep state that must outlive one of them
    /// (`dmem_deploy::process::DurableSlots`: Motor's op logs): a directory of the host's
    /// temporary directory named after the cluster file, which every process on this host
    /// (network namespaces included) derives alike. CNs on different machines would need it
    /// on storage they share.
    pub(crate) fn state_dir(&self) -> PathBuf {
        Self::host_dir(&self.path, "dmem-cn-state")
    }

    /// `<temp dir>/<prefix>-<hash of the cluster file's path>`: the same in every process of
    /// this host.
    fn host_dir(path: &Path, prefix: &str) -> PathBuf {
        use std::hash::{Hash as _, Hasher as _};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .hash(&mut h);
        std::env::temp_dir().join(format!("{prefix}-{:016x}", h.finish()))
    }

    /// The cluster's fabric.
    pub(crate) fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// `tcp`, `shm` or `rdma`.
    pub(crate) fn fabric_name(&self) -> &'static str {
        match self.fabric {
            Fabric::Tcp => "tcp",
            Fabric::Shm { .. } => "shm",
            Fabric::Rdma { .. } => "rdma",
        }
    }

    pub(crate) fn duration(&self) -> Duration {
        self.duration
    }

    pub(crate) fn join_timeout(&self) -> Duration {
        self.join_timeout
    }

    pub(crate) fn heartbeat(&self) -> Nanos {
        self.heartbeat
    }

    pub(crate) fn timeout(&self) -> Nanos {
        self.timeout
    }

    pub(crate) fn clients(&self) -> u32 {
        self.clients
    }

    /// Threads (cores, one executor each) of every CN.
    pub(crate) fn threads(&self) -> u32 {
        self.threads
    }

    /// Tries per transaction before a CN gives it up (transaction workloads).
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The wait before each retry of a transaction (transaction workloads).
    pub(crate) fn backoff(&self) -> dmem_harness::Backoff {
        self.backoff
    }

    /// The executor every CN thread asked for.
    pub(crate) fn executor(&self) -> dmem_runtime::ExecutorChoice {
        self.executor
    }

    /// Coordinators of the workers: every client of every CN.
    pub(crate) fn coordinators(&self) -> u16 {
        (self.cns.len() as u32 * self.clients) as u16
    }

    /// The coordinator ids of CN `node`: its clients, numbered CN by CN.
    pub(crate) fn coordinator_ids(&self, node: NodeId) -> Vec<u16> {
        let index = self.cn_index(node).unwrap_or(0) as u32;
        (0..self.clients)
            .map(|c| (index * self.clients + c) as u16)
            .collect()
    }

    /// The CNs not `heard`, as `name (control address)`, comma-separated (for a join that
    /// timed out).
    pub(crate) fn cns_not_heard(&self, heard: impl Fn(NodeId) -> bool) -> String {
        self.cns
            .iter()
            .filter(|c| !heard(c.node))
            .map(|c| match c.control {
                Some(control) => format!("{} ({control})", c.name),
                None => c.name.clone(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The name of CN `node` (or `node N`).
    pub(crate) fn cn_name(&self, node: NodeId) -> String {
        self.cn_index(node)
            .map_or(format!("node {}", node.0), |i| self.cns[i].name.clone())
    }

    /// The name of MN `node` (or `MN N`).
    pub(crate) fn mn_name(&self, node: NodeId) -> String {
        self.mns()
            .iter()
            .find(|m| m.node == node)
            .map_or_else(|| format!("MN {}", node.0), |m| m.name.clone())
    }

    /// The MN named `name`, or one line listing the MNs.
    pub(crate) fn mn(&self, name: &str) -> anyhow::Result<&MnNode> {
        self.mns.iter().find(|m| m.name == name).with_context(|| {
            format!(
                "no MN named `{name}` in {} (MNs: {})",
                self.path.display(),
                self.mns
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }

    /// The CN (or server) named `name`, or one line listing them.
    pub(crate) fn cn(&self, name: &str) -> anyhow::Result<&CnNode> {
        self.cns.iter().find(|c| c.name == name).with_context(|| {
            format!(
                "no {} named `{name}` in {} ({}s: {})",
                if self.servers { "server" } else { "CN" },
                self.path.display(),
                if self.servers { "server" } else { "CN" },
                self.cns
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }

    /// The position of CN `node` among the CNs.
    pub(crate) fn cn_index(&self, node: NodeId) -> Option<usize> {
        self.cns.iter().position(|c| c.node == node)
    }

    /// Offset of CN `index`'s word at every MN (word 0 is the shared one).
    pub(crate) fn cn_word(index: usize) -> u64 {
        WORD_STRIDE * (1 + index as u64)
    }
}

/// The `[workload]` table, checked.
struct CheckedWorkload {
    kind: Kind,
    /// Whether the protocol is symmetric (its nodes are servers).
    symmetric: bool,
    /// Servers a symmetric protocol needs (its replicas of every record).
    servers_needed: u16,
    attempts: u32,
    backoff: dmem_harness::Backoff,
}

impl CheckedWorkload {
    fn of(w: &WorkloadFile, is_tcp: bool) -> anyhow::Result<Self> {
        let (mut symmetric, mut servers_needed) = (false, 1);
        let kind = if w.kind == "faa" {
            ensure!(
                w.protocol.is_none()
                    && w.scale.is_none()
                    && w.attempts.is_none()
                    && w.backoff.is_none(),
                "workload kind `faa` takes no `protocol`, `scale`, `attempts` or `backoff` (those are for transaction workloads)"
            );
            ensure!(
                is_tcp,
                "workload kind `faa` runs on the tcp fabric only; on shm use a transaction workload (e.g. kind = \"smallbank\")"
            );
            Kind::Faa
        } else {
            ensure!(
                dmem_workloads::WORKLOAD_NAMES.contains(&w.kind.as_str()),
                "workload kind `{}` is not `faa` or one of {}",
                w.kind,
                dmem_workloads::WORKLOAD_NAMES.join(", ")
            );
            let protocol = w.protocol.clone().with_context(|| {
                format!(
                    "workload `{}` needs `protocol = \"pandora\"` (or another registered protocol)",
                    w.kind
                )
            })?;
            // Known to the registry; whether it deploys on real fabrics is checked when
            // the deployment is derived (Dandelion says it needs the simulator).
            let registered = dmem_protocols::registry().get(&protocol)?;
            symmetric = registered.symmetric();
            servers_needed = registered.servers_needed();
            let scale_name = w.scale.as_deref().unwrap_or("tiny");
            let scale = dmem_workloads::Scale::from_name(scale_name).with_context(|| {
                format!("scale `{scale_name}` is not tiny, small, ford, motor or lotus")
            })?;
            ensure!(
                w.threads <= w.clients,
                "a transaction workload runs each CN's coordinators (clients) on `threads` cores: threads ({}) must not exceed clients ({})",
                w.threads,
                w.clients
            );
            Kind::Txn {
                workload: w.kind.clone(),
                scale,
                protocol,
            }
        };
        let attempts = w.attempts.unwrap_or(dmem_harness::MAX_ATTEMPTS);
        ensure!(
            attempts >= 1,
            "workload attempts must be at least 1 (tries per transaction; 1: never retried)"
        );
        let backoff: dmem_harness::Backoff = match &w.backoff {
            None => dmem_harness::Backoff::None,
            Some(b) => b.parse().map_err(|e| anyhow::anyhow!("workload {e}"))?,
        };
        ensure!(
            (1..=3_600_000).contains(&w.duration_ms),
            "workload duration_ms {} is outside 1..=3600000",
            w.duration_ms
        );
        ensure!(
            (1..=64).contains(&w.threads)
                && (1..=u32::from(dmem_deploy::process::ports::MAX_CLIENTS)).contains(&w.clients),
            "workload threads must be 1..=64 and clients 1..={} (got {} and {})",
            dmem_deploy::process::ports::MAX_CLIENTS,
            w.threads,
            w.clients
        );
        Ok(Self {
            kind,
            symmetric,
            servers_needed,
            attempts,
            backoff,
        })
    }
}

/// An MN as written, checked: its entry, `data` and `control` addresses (tcp) and bytes.
type SortedMn<'f> = (&'f NodeFile, Option<SocketAddr>, Option<SocketAddr>, u64);
/// A CN (or server) as written, checked: its entry and `control` address (tcp).
type SortedCn<'f> = (&'f NodeFile, Option<SocketAddr>);

/// The `[[node]]` entries sorted by role, each checked: unique names and addresses, the
/// keys its role and fabric take.
struct NodeRoles<'f> {
    is_tcp: bool,
    names: HashSet<String>,
    /// Every address claimed so far, with what claimed it.
    addrs: HashMap<SocketAddr, String>,
    mns: Vec<SortedMn<'f>>,
    cns: Vec<SortedCn<'f>>,
}

impl<'f> NodeRoles<'f> {
    fn sort(
        nodes: &'f [NodeFile],
        is_tcp: bool,
        checked: &CheckedWorkload,
        w: &WorkloadFile,
    ) -> anyhow::Result<(Vec<SortedMn<'f>>, Vec<SortedCn<'f>>)> {
        let mut roles = NodeRoles {
            is_tcp,
            names: HashSet::new(),
            addrs: HashMap::new(),
            mns: Vec::new(),
            cns: Vec::new(),
        };
        for n in nodes {
            roles.add(n, checked, w)?;
        }
        let NodeRoles { mns, cns, .. } = roles;
        if checked.symmetric {
            let protocol = w.protocol.as_deref().unwrap_or_default();
            let servers_needed = checked.servers_needed;
            ensure!(
                mns.is_empty(),
                "node `{}`: protocol `{protocol}` is symmetric (its servers hold the records): it has no MNs, only nodes with role = \"server\"",
                mns[0].0.name
            );
            ensure!(
                cns.len() >= usize::from(servers_needed),
                "protocol `{protocol}` keeps {servers_needed} replicas of every record on distinct servers: it needs at least {servers_needed} nodes with role = \"server\" (the file has {})",
                cns.len()
            );
            ensure!(
                w.threads == 1,
                "workload threads = {}: a server of protocol `{protocol}` runs its message loop and its coordinators on one core; use threads = 1",
                w.threads
            );
        } else {
            ensure!(!mns.is_empty(), "no node has role = \"mn\"");
            ensure!(!cns.is_empty(), "no node has role = \"cn\"");
        }
        Ok((mns, cns))
    }

    /// `value` of `node`'s `key`, as an address no other node or key of the file uses.
    fn claim(&mut self, node: &str, key: &str, value: &str) -> anyhow::Result<SocketAddr> {
        let addr: SocketAddr = value.parse().map_err(|_| {
            anyhow::anyhow!("node `{node}`: {key} = \"{value}\" is not an IP:port address")
        })?;
        let what = format!("node `{node}` {key}");
        if let Some(other) = self.addrs.insert(addr, what.clone()) {
            bail!("{what} and {other} both use {addr}");
        }
        Ok(addr)
    }

    /// Checks a `[[node]]` entry and files it under its role.
    fn add(
        &mut self,
        n: &'f NodeFile,
        checked: &CheckedWorkload,
        w: &WorkloadFile,
    ) -> anyhow::Result<()> {
        ensure!(
            !n.name.is_empty() && self.names.insert(n.name.clone()),
            "node name `{}` is empty or used twice",
            n.name
        );
        let control = if self.is_tcp {
            let control = n.control.as_deref().with_context(|| {
                format!(
                    "node `{}`: a tcp node needs `control`, the address it receives messages on",
                    n.name
                )
            })?;
            Some(self.claim(&n.name, "control", control)?)
        } else {
            ensure!(
                n.control.is_none() && n.data.is_none(),
                "node `{}`: `data` and `control` are tcp addresses; on shm the nodes meet through Unix sockets in socket_dir",
                n.name
            );
            None
        };
        match n.role.as_str() {
            "mn" => self.add_mn(n, control, &checked.kind)?,
            "cn" => {
                ensure!(
                    n.data.is_none() && n.memory_mib.is_none(),
                    "node `{}`: `data` and `memory_mib` are for MNs; a CN has only `control` (tcp)",
                    n.name
                );
                ensure!(
                    !checked.symmetric,
                    "node `{}`: protocol `{}` is symmetric (every node a server holding its share of the records): its nodes have role = \"server\", not \"cn\"",
                    n.name,
                    w.protocol.as_deref().unwrap_or_default()
                );
                self.cns.push((n, control));
            }
            "server" => {
                ensure!(
                    checked.symmetric,
                    "node `{}`: role = \"server\" is for symmetric protocols (dnl-4, dnl-2, dnl-1, fasst, dnl:P); {} runs on mn and cn nodes",
                    n.name,
                    w.protocol
                        .as_deref()
                        .map_or("workload kind `faa`".to_owned(), |p| format!(
                            "protocol `{p}`"
                        ))
                );
                ensure!(
                    n.data.is_none() && n.memory_mib.is_none(),
                    "node `{}`: `data` and `memory_mib` are for MNs; a server holds its records in its own memory and has only `control` (tcp)",
                    n.name
                );
                self.cns.push((n, control));
            }
            other => bail!(
                "node `{}`: role `{other}` is not `mn` or `cn` (or `server`, for a symmetric protocol)",
                n.name
            ),
        }
        Ok(())
    }

    /// An MN entry: its `data` address (tcp) and its memory (`faa`; a transaction
    /// workload's store decides the size of its own).
    fn add_mn(
        &mut self,
        n: &'f NodeFile,
        control: Option<SocketAddr>,
        kind: &Kind,
    ) -> anyhow::Result<()> {
        let data = if self.is_tcp {
            let data = n.data.as_deref().with_context(|| {
                format!(
                    "node `{}`: an MN needs `data`, the address CNs reach its memory on",
                    n.name
                )
            })?;
            Some(self.claim(&n.name, "data", data)?)
        } else {
            None
        };
        // A transaction workload's store decides the size.
        let mib = match (kind, n.memory_mib) {
            (Kind::Txn { .. }, None) => 1,
            (_, mib) => {
                mib.with_context(|| format!("node `{}`: an MN needs `memory_mib`", n.name))?
            }
        };
        ensure!(
            (1..=1 << 20).contains(&mib),
            "node `{}`: memory_mib {mib} is outside 1..=1048576",
            n.name
        );
        self.mns.push((n, data, control, mib << 20));
        Ok(())
    }
}

/// Arguments of `dmem mn` and `dmem cn`.
#[derive(Debug, ClapArgs)]
pub(crate) struct NodeArgs {
    /// The cluster file.
    #[arg(long, value_name = "FILE")]
    pub(crate) cluster: PathBuf,
    /// This node's name in it.
    #[arg(long)]
    pub(crate) node: String,
}

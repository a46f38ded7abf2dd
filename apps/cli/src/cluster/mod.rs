//! Real deployments on the tcp fabric, or on the shm fabric within one host: `dmem mn`,
//! `dmem cn` and `dmem cluster`. (On shm only transaction workloads run; see
//! `txn.rs`'s `Net` for how the two fabrics differ there.)
//!
//! A cluster is one TOML file (see [`ClusterFile`]): its nodes with their roles and
//! addresses, the heartbeat period and timeout, and the workload. Node ids follow the
//! simulator's convention: MNs first, in file order, then CNs.
//!
//! - `dmem mn --cluster FILE --node NAME` registers the MN's memory (a memfd region), serves
//!   it on the node's `data` address from the tcp fabric's io_uring loop, and runs the
//!   failure detector on its `control` address: it waits for every CN's first heartbeat,
//!   then revokes a CN that stays silent longer than `timeout_ms` (its connections are shut
//!   down and refused: Pandora §3.2.2's active-link termination), and exits once every CN
//!   finished or was revoked, printing a JSON report of its memory.
//! - `dmem cn --cluster FILE --node NAME` connects every client context to every MN,
//!   heartbeats to every MN's control endpoint (`dmem_deploy::process::alive_task`),
//!   runs the workload, tells each MN it is done, and prints a JSON report.
//! - `dmem server --cluster FILE --node NAME`: a server of a symmetric protocol (Dandelion,
//!   FaSST; `role = "server"` nodes, no MNs), which runs the transaction CN process of
//!   `txn.rs` on a deployment of its own server.
//! - `dmem cluster --cluster FILE` starts every node as a separate process on this host
//!   (inside the node's network namespace when it names one), optionally kills one CN with
//!   SIGKILL mid-run, collects the reports and checks them.
//!
//! This module runs the verbs-level workload (`faa`): every post list carries, for every
//! MN, `batch` pairs of FAAs — one on the CN's own word, one on the MN's shared word. A
//! frame executes whole or not at all, so at every MN the shared word equals the sum of the
//! CN words even when a CN dies mid-run, and a CN that finished has exactly `posts × batch`
//! in its word. Transaction workloads on FORD/Pandora (`kind = "smallbank"` etc.) are in
//! `txn.rs`, where the first CN, not the MNs, detects and recovers failed CNs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use clap::Args as ClapArgs;
use dmem_deploy::AnyContext;
use dmem_deploy::process::alive_task;
use dmem_runtime::{Executor, ExecutorChoice, monotonic_now, run_per_core};
use dmem_shm::ShmMemoryNode;
use dmem_tcp::{TcpContext, TcpError, TcpFabric, TcpMemoryServer};
use dmem_txn::detector::HeartbeatDetector;
use dmem_verbs::{Endpoint, Nanos, NodeId, Port, PostList, RKey, RemoteAddr, Verbs, VerbsError};
use serde::{Deserialize, Serialize};

use dmem_cli::common::{self, CheckFailed};

mod control;
mod txn;

use control::{Control, is_ready_line, print_ready};

/// Bytes between two CN words at an MN (a cache line each, so FAAs do not share one).
const WORD_STRIDE: u64 = 64;

/// The cluster file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClusterFile {
    /// `tcp`, or `shm` (one host: MN memory is a memfd mapping the CNs map, messages go
    /// over Unix sockets in `socket_dir`).
    fabric: String,
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
}

impl CnNode {
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

    fn validate(path: &Path, file: ClusterFile) -> anyhow::Result<Self> {
        let fabric = match file.fabric.as_str() {
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
            other => bail!("fabric `{other}` is not `tcp` or `shm`"),
        };
        let is_tcp = fabric == Fabric::Tcp;
        ensure!(
            file.heartbeat_ms >= 1 && file.timeout_ms > file.heartbeat_ms,
            "timeout_ms ({}) must exceed heartbeat_ms ({}), which must be at least 1",
            file.timeout_ms,
            file.heartbeat_ms
        );
        let w = &file.workload;
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
        let (mut mns, mut cns) = (Vec::new(), Vec::new());
        let mut names = HashSet::new();
        let mut addrs = HashMap::new();
        let mut claim = |addr: SocketAddr, what: String| -> anyhow::Result<()> {
            if let Some(other) = addrs.insert(addr, what.clone()) {
                bail!("{what} and {other} both use {addr}");
            }
            Ok(())
        };
        let parse = |node: &str, key: &str, value: &str| -> anyhow::Result<SocketAddr> {
            value.parse().map_err(|_| {
                anyhow::anyhow!("node `{node}`: {key} = \"{value}\" is not an IP:port address")
            })
        };
        for n in &file.nodes {
            ensure!(
                !n.name.is_empty() && names.insert(n.name.clone()),
                "node name `{}` is empty or used twice",
                n.name
            );
            let control = if is_tcp {
                let control = n.control.as_deref().with_context(|| {
                    format!(
                        "node `{}`: a tcp node needs `control`, the address it receives messages on",
                        n.name
                    )
                })?;
                let control = parse(&n.name, "control", control)?;
                claim(control, format!("node `{}` control", n.name))?;
                Some(control)
            } else {
                ensure!(
                    n.control.is_none() && n.data.is_none(),
                    "node `{}`: `data` and `control` are tcp addresses; on shm the nodes meet through Unix sockets in socket_dir",
                    n.name
                );
                None
            };
            match n.role.as_str() {
                "mn" => {
                    let data = if is_tcp {
                        let data = n.data.as_deref().with_context(|| {
                            format!(
                                "node `{}`: an MN needs `data`, the address CNs reach its memory on",
                                n.name
                            )
                        })?;
                        let data = parse(&n.name, "data", data)?;
                        claim(data, format!("node `{}` data", n.name))?;
                        Some(data)
                    } else {
                        None
                    };
                    // A transaction workload's store decides the size.
                    let mib = match (&kind, n.memory_mib) {
                        (Kind::Txn { .. }, None) => 1,
                        (_, mib) => mib.with_context(|| {
                            format!("node `{}`: an MN needs `memory_mib`", n.name)
                        })?,
                    };
                    ensure!(
                        (1..=1 << 20).contains(&mib),
                        "node `{}`: memory_mib {mib} is outside 1..=1048576",
                        n.name
                    );
                    mns.push((n, data, control, mib << 20));
                }
                "cn" => {
                    ensure!(
                        n.data.is_none() && n.memory_mib.is_none(),
                        "node `{}`: `data` and `memory_mib` are for MNs; a CN has only `control` (tcp)",
                        n.name
                    );
                    ensure!(
                        !symmetric,
                        "node `{}`: protocol `{}` is symmetric (every node a server holding its share of the records): its nodes have role = \"server\", not \"cn\"",
                        n.name,
                        w.protocol.as_deref().unwrap_or_default()
                    );
                    cns.push((n, control));
                }
                "server" => {
                    ensure!(
                        symmetric,
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
                    cns.push((n, control));
                }
                other => bail!(
                    "node `{}`: role `{other}` is not `mn` or `cn` (or `server`, for a symmetric protocol)",
                    n.name
                ),
            }
        }
        if symmetric {
            let protocol = w.protocol.as_deref().unwrap_or_default();
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
            kind,
            path: path.to_path_buf(),
            heartbeat: file.heartbeat_ms * 1_000_000,
            timeout: file.timeout_ms * 1_000_000,
            join_timeout: Duration::from_millis(file.join_timeout_ms),
            duration: Duration::from_millis(w.duration_ms),
            threads: w.threads,
            clients: w.clients,
            batch: w.batch,
            executor,
            attempts,
            backoff,
            mns,
            cns,
            servers: symmetric,
        })
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

    /// `tcp` or `shm`.
    pub(crate) fn fabric_name(&self) -> &'static str {
        match self.fabric {
            Fabric::Tcp => "tcp",
            Fabric::Shm { .. } => "shm",
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

    fn txn_setup(&self) -> anyhow::Result<Option<txn::TxnSetup>> {
        match &self.kind {
            Kind::Faa => Ok(None),
            Kind::Txn {
                workload,
                scale,
                protocol,
            } => txn::TxnSetup::new(self, workload, *scale, protocol)
                .map(Some)
                .with_context(|| format!("cluster file {}", self.path.display())),
        }
    }

    fn mn(&self, name: &str) -> anyhow::Result<&MnNode> {
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

    fn cn(&self, name: &str) -> anyhow::Result<&CnNode> {
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

    fn cn_index(&self, node: NodeId) -> Option<usize> {
        self.cns.iter().position(|c| c.node == node)
    }

    /// Offset of CN `index`'s word at every MN (word 0 is the shared one).
    fn cn_word(index: usize) -> u64 {
        WORD_STRIDE * (1 + index as u64)
    }
}

/// Arguments of `dmem mn` and `dmem cn`.
#[derive(Debug, ClapArgs)]
pub(crate) struct NodeArgs {
    /// The cluster file.
    #[arg(long, value_name = "FILE")]
    cluster: PathBuf,
    /// This node's name in it.
    #[arg(long)]
    node: String,
}

/// Arguments of `dmem cluster`.
#[derive(Debug, ClapArgs)]
pub(crate) struct ClusterArgs {
    /// Without an action: run the cluster in the foreground and report. `up`: start that run
    /// in the background (its own process group, output to a log file); `status`: whether
    /// it still runs, and its log's last lines; `down`: stop it and every node it started.
    #[arg(value_enum)]
    action: Option<Action>,
    /// The cluster file.
    #[arg(long, value_name = "FILE")]
    cluster: PathBuf,
    /// Kill this CN with SIGKILL during the run; or this MN, for FORD and Pandora with
    /// replication (Pandora §3.2.5). At most one CN and one MN (`--kill cn1,mn1`: both at
    /// once, in that order).
    #[arg(long, value_name = "NODE", value_delimiter = ',')]
    kill: Vec<String>,
    /// When to kill it, ms after the CNs started.
    #[arg(long, default_value_t = 500)]
    kill_after_ms: u64,
    /// Print the JSON reports instead of a table.
    #[arg(long)]
    json: bool,
}

/// What an MN reports at the end (one JSON line on stdout).
#[derive(Debug, Serialize, Deserialize)]
struct MnReport {
    role: String,
    name: String,
    node: u16,
    /// The shared word.
    shared: u64,
    /// Each CN's word, by CN name.
    words: BTreeMap<String, u64>,
    /// CNs that said they were done, with their post counts.
    done: BTreeMap<String, u64>,
    /// CNs whose access was revoked, with the ms from the start of detection.
    revoked: BTreeMap<String, u64>,
}

/// What a CN reports at the end (one JSON line on stdout).
#[derive(Debug, Serialize, Deserialize)]
struct CnReport {
    role: String,
    name: String,
    node: u16,
    /// Post lists completed.
    posts: u64,
    batch: u32,
    /// Post lists per second.
    posts_per_s: f64,
    /// The executor each client thread ran on (`glommio`, pinned, or `polling`).
    executor: String,
    /// Why not glommio, when the polling executor ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    executor_why: Option<String>,
    /// Errors that stopped clients.
    errors: Vec<String>,
}

fn control_endpoint(node: NodeId) -> Endpoint {
    Endpoint {
        node,
        port: Port(0),
    }
}

/// `dmem mn`.
pub(crate) fn run_mn(args: &NodeArgs) -> anyhow::Result<()> {
    let cluster = Cluster::load(&args.cluster)?;
    ensure!(
        !cluster.symmetric(),
        "node `{}`: this cluster's nodes are servers of a symmetric protocol (role = \"server\"), with no MNs: start them with `dmem server`",
        args.node
    );
    let me = cluster.mn(&args.node)?.clone();
    if let Some(setup) = cluster.txn_setup()? {
        return txn::run_mn(&cluster, &me, &setup);
    }
    let (data, control) = (me.data()?, me.control()?);
    let memory =
        ShmMemoryNode::create(me.node, RKey(0xd3e3_0000 | u32::from(me.node.0)), me.memory)
            .with_context(|| format!("{}: cannot create {} bytes of memory", me.name, me.memory))?;
    let server = TcpMemoryServer::serve(memory, data)
        .with_context(|| format!("{}: cannot serve memory on {}", me.name, data))?;
    let fabric = TcpFabric::new(me.node);
    let _listener = fabric.listen(control).with_context(|| {
        format!(
            "{}: cannot listen for control messages on {}",
            me.name, control
        )
    })?;
    let ctx = fabric.context(Port(0))?;
    // The parent (`dmem cluster`) waits for this line before starting CNs.
    print_ready(&me.name);
    eprintln!(
        "dmem mn {}: node {} serves {} on {} (control {})",
        me.name,
        me.node.0,
        common::human_bytes(me.memory),
        data,
        control
    );
    let name_of = |node: NodeId| {
        cluster
            .cn_index(node)
            .map_or(format!("node {}", node.0), |i| cluster.cns[i].name.clone())
    };
    let mut done: BTreeMap<String, u64> = BTreeMap::new();
    // Takes every control message that arrived: "done" reports, and heartbeats (any other
    // message from a CN counts as one, as at every detector of dmem) to `heard` and the
    // detector.
    let drain = |detector: &mut Option<&mut HeartbeatDetector>,
                 heard: &mut HashSet<NodeId>,
                 done: &mut BTreeMap<String, u64>|
     -> anyhow::Result<()> {
        while let Some(msg) = ctx.try_recv()? {
            let from = msg.from.node;
            if cluster.cn_index(from).is_none() {
                continue;
            }
            if let Ok(Control::CnDone { tally: posts }) = Control::parse(&msg.payload) {
                done.insert(name_of(from), posts);
            } else {
                heard.insert(from);
                if let Some(d) = detector.as_mut() {
                    d.heartbeat(from, monotonic_now());
                }
            }
        }
        Ok(())
    };
    // Join: every CN's first heartbeat.
    let mut heard = HashSet::new();
    let start = Instant::now();
    while heard.len() < cluster.cns.len() {
        drain(&mut None, &mut heard, &mut done)?;
        if start.elapsed() > cluster.join_timeout {
            bail!(
                "{}: no heartbeat from {} within {} ms: is `dmem cn` running there, and can it reach {} and {}?",
                me.name,
                cluster.cns_not_heard(|n| heard.contains(&n)),
                cluster.join_timeout.as_millis(),
                data,
                control
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Detection (Pandora §3.2.2 step 1) and link termination (step 2) at this MN.
    let detect_start = monotonic_now();
    let mut detector = HeartbeatDetector::watching(
        cluster.timeout,
        cluster.cns.iter().map(|c| c.node),
        detect_start,
    );
    let mut revoked: BTreeMap<String, u64> = BTreeMap::new();
    let poll = Duration::from_nanos((cluster.heartbeat / 2).max(100_000));
    loop {
        drain(&mut Some(&mut detector), &mut heard, &mut done)?;
        let now = monotonic_now();
        for suspect in detector.suspects(now) {
            let name = name_of(suspect);
            if done.contains_key(&name) {
                continue;
            }
            let shut = server
                .revoke(suspect)
                .with_context(|| format!("{}: revoking {name}", me.name))?;
            eprintln!(
                "dmem mn {}: {name} silent for more than {} ms: access revoked, {shut} connections shut down",
                me.name,
                cluster.timeout / 1_000_000
            );
            revoked.insert(name, (now - detect_start) / 1_000_000);
        }
        if cluster
            .cns
            .iter()
            .all(|c| done.contains_key(&c.name) || revoked.contains_key(&c.name))
        {
            break;
        }
        std::thread::sleep(poll);
    }
    // Read the counters through a local link (out of band).
    let mut local = dmem_shm::ShmFabric::new().context(control_endpoint(me.node))?;
    local.add_link(server.memory().link(me.node)?)?;
    let region = server.region();
    let read_word = |offset: u64| -> anyhow::Result<u64> {
        let mut list = PostList::new();
        let id = list.read(region.at(offset).context("counter outside the region")?, 8);
        let done = local.post_now(list)?;
        Ok(u64::from_ne_bytes(
            done.bytes(id).try_into().context("8 bytes")?,
        ))
    };
    let report = MnReport {
        role: "mn".into(),
        name: me.name.clone(),
        node: me.node.0,
        shared: read_word(0)?,
        words: cluster
            .cns
            .iter()
            .enumerate()
            .map(|(i, c)| Ok((c.name.clone(), read_word(Cluster::cn_word(i))?)))
            .collect::<anyhow::Result<_>>()?,
        done,
        revoked,
    };
    println!("{}", serde_json::to_string(&report)?);
    server.stop().context("the serving loop failed")?;
    Ok(())
}

/// Connects `ctx` to `mn`, retrying while the MN is not up yet, until `deadline`.
pub(crate) fn connect_retrying(
    ctx: &mut TcpContext,
    mn: &MnNode,
    deadline: Instant,
) -> anyhow::Result<()> {
    loop {
        let data = mn.data()?;
        match ctx.connect(data) {
            Ok(_) => return Ok(()),
            Err(TcpError::Io { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot connect to MN `{}` at {data}", mn.name));
            }
        }
    }
}

/// A client's targets at one MN: its CN's word and the shared word.
type Targets = (RemoteAddr, RemoteAddr);

/// One closed-loop client of the `faa` workload; returns its completed posts, or the error
/// that stopped it with the posts before it.
async fn faa_client<V: Verbs>(
    ctx: V,
    targets: Vec<(RemoteAddr, RemoteAddr)>,
    batch: u32,
    end: Instant,
) -> (u64, Option<VerbsError>) {
    let mut posts = 0;
    while Instant::now() < end {
        let mut list = PostList::with_capacity(targets.len() * batch as usize * 2);
        for &(own, shared) in &targets {
            for _ in 0..batch {
                list.faa(own, 1);
                list.faa(shared, 1);
            }
        }
        if let Err(e) = ctx.post(list).await {
            return (posts, Some(e));
        }
        posts += 1;
    }
    (posts, None)
}

/// `dmem server`: a server of a symmetric protocol, which runs the CN process's wiring
/// (`txn::run_cn`) with a deployment of its own server (`Protocol::deploy_server`).
pub(crate) fn run_server(args: &NodeArgs) -> anyhow::Result<()> {
    let cluster = Cluster::load(&args.cluster)?;
    ensure!(
        cluster.symmetric(),
        "node `{}`: `dmem server` runs a server of a symmetric protocol (role = \"server\"); this cluster's nodes are MNs and CNs (`dmem mn`, `dmem cn`)",
        args.node
    );
    let me = cluster.cn(&args.node)?.clone();
    let setup = cluster
        .txn_setup()?
        .context("a symmetric protocol runs a transaction workload")?;
    txn::run_cn(&cluster, &me, &setup)
}

/// `dmem cn`.
pub(crate) fn run_cn(args: &NodeArgs) -> anyhow::Result<()> {
    let cluster = Cluster::load(&args.cluster)?;
    ensure!(
        !cluster.symmetric(),
        "node `{}`: this cluster's nodes are servers of a symmetric protocol (role = \"server\"): start them with `dmem server`",
        args.node
    );
    let me = cluster.cn(&args.node)?.clone();
    if let Some(setup) = cluster.txn_setup()? {
        return txn::run_cn(&cluster, &me, &setup);
    }
    let my_index = cluster.cn_index(me.node).context("a CN of the cluster")?;
    let (executor_kind, executor_why) = cluster
        .executor
        .resolve()
        .map_err(|e| anyhow::anyhow!("{}: {e}", me.name))?;
    let control = me.control()?;
    let fabric = TcpFabric::new(me.node);
    let _listener = fabric
        .listen(control)
        .with_context(|| format!("{}: cannot listen for messages on {control}", me.name))?;
    for mn in &cluster.mns {
        fabric.add_peer(mn.node, mn.control()?);
    }
    for cn in cluster.cns.iter().filter(|c| c.node != me.node) {
        fabric.add_peer(cn.node, cn.control()?);
    }
    // Every client context connects to every MN (retrying while MNs start).
    let deadline = Instant::now() + cluster.join_timeout;
    let mut per_thread: Vec<Vec<(TcpContext, Vec<Targets>)>> =
        (0..cluster.threads).map(|_| Vec::new()).collect();
    for c in 0..cluster.clients {
        let mut ctx = fabric.context(Port(u16::try_from(c + 2).context("too many clients")?))?;
        let mut targets = Vec::new();
        for mn in &cluster.mns {
            connect_retrying(&mut ctx, mn, deadline)?;
            let region = ctx.region(mn.node).context("connected above")?;
            let own = region
                .at(Cluster::cn_word(my_index))
                .context("the MN's region is smaller than the cluster file says")?;
            targets.push((own, region.at(0).context("empty region")?));
        }
        per_thread[(c % cluster.threads) as usize].push((ctx, targets));
    }
    // Heartbeats to every MN until the workload is over and the MNs were told.
    let heartbeat_ctx = fabric.context(Port(0))?;
    let stop = Arc::new(Mutex::new(None::<dmem_runtime::StopHandle>));
    let heartbeat_stop = Arc::clone(&stop);
    let mn_nodes: Vec<NodeId> = cluster.mns.iter().map(|m| m.node).collect();
    let period = cluster.heartbeat;
    let heartbeats = std::thread::Builder::new()
        .name("dmem-cn-heartbeat".into())
        .spawn(move || {
            let executor = Executor::new();
            *heartbeat_stop
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(executor.stop_handle());
            // A send fails while the MN's control listener is not up yet, or once the MN
            // is gone (the workload reports that): `alive_task` tries again a period later.
            let ctx = AnyContext::from(heartbeat_ctx);
            for mn in mn_nodes {
                executor.spawn(alive_task(ctx.clone(), control_endpoint(mn), period));
            }
            executor.run();
        })
        .context("cannot start the heartbeat thread")?;
    // `dmem cluster` starts its kill timer once every CN is this far.
    print_ready(&me.name);
    let start = Instant::now();
    let end = start + cluster.duration;
    let batch = cluster.batch;
    // One executor per client thread: glommio pinned to a core (the thread-per-core
    // runtime), or the polling executor on a plain thread.
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let jobs: Vec<_> = per_thread
        .into_iter()
        .enumerate()
        .map(|(t, clients)| {
            let job = move |_clock| async move {
                let outcomes = Rc::new(std::cell::RefCell::new(Vec::new()));
                let tasks: Vec<_> = clients
                    .into_iter()
                    .map(|(ctx, targets)| {
                        let outcomes = Rc::clone(&outcomes);
                        async move {
                            let outcome = faa_client(ctx, targets, batch, end).await;
                            outcomes.borrow_mut().push(outcome);
                        }
                    })
                    .collect();
                futures_util::future::join_all(tasks).await;
                let outcomes = outcomes.borrow();
                (
                    outcomes.iter().map(|(p, _)| p).sum::<u64>(),
                    outcomes
                        .iter()
                        .filter_map(|(_, e)| e.as_ref().map(ToString::to_string))
                        .collect::<Vec<_>>(),
                )
            };
            (t % cpus, job)
        })
        .collect();
    let results: Vec<(u64, Vec<String>)> = run_per_core(executor_kind, jobs)
        .with_context(|| format!("{}: client threads", me.name))?;
    let elapsed = start.elapsed().as_secs_f64();
    let posts: u64 = results.iter().map(|(p, _)| p).sum();
    let errors: Vec<String> = results.into_iter().flat_map(|(_, e)| e).collect();
    // Tell every MN (before the heartbeats stop, so that it does not suspect this CN).
    let done_ctx = fabric.context(Port(1))?;
    let payload = Control::CnDone { tally: posts }.emit();
    let executor = Executor::new();
    for mn in &cluster.mns {
        if let Err(e) = executor.block_on(done_ctx.send(control_endpoint(mn.node), &payload)) {
            eprintln!(
                "dmem cn {}: cannot tell MN `{}` it is done: {e}",
                me.name, mn.name
            );
        }
    }
    if let Some(stop) = stop
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
    {
        stop.stop();
    }
    let _ = heartbeats.join();
    let report = CnReport {
        role: "cn".into(),
        name: me.name.clone(),
        node: me.node.0,
        posts,
        batch,
        posts_per_s: common::round(posts as f64 / elapsed.max(1e-9), 1),
        errors,
        executor: executor_kind.name().to_owned(),
        executor_why,
    };
    println!("{}", serde_json::to_string(&report)?);
    ensure!(
        report.errors.is_empty(),
        "{}: clients stopped on errors: {}",
        me.name,
        report.errors.join("; ")
    );
    Ok(())
}

/// A node process started by `dmem cluster`.
struct Started {
    name: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
    ready: Arc<AtomicBool>,
}

fn start_node(
    cluster: &Cluster,
    role: &str,
    name: &str,
    netns: Option<&str>,
) -> anyhow::Result<Started> {
    let exe = std::env::current_exe().context("cannot find the dmem executable")?;
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.arg(role)
        .arg("--cluster")
        .arg(&cluster.path)
        .arg("--node")
        .arg(name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start `dmem {role}` for node `{name}`"))?;
    let stdout = child.stdout.take().context("piped stdout")?;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let ready = Arc::new(AtomicBool::new(false));
    let (reader_lines, reader_ready) = (Arc::clone(&lines), Arc::clone(&ready));
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if is_ready_line(&line) {
                reader_ready.store(true, Ordering::SeqCst);
            }
            reader_lines
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(line);
        }
    });
    Ok(Started {
        name: name.to_owned(),
        child,
        lines,
        reader,
        ready,
    })
}

/// The node's exit status and its last stdout line that parses as `T`.
fn finish<T: for<'de> Deserialize<'de>>(node: Started) -> (String, bool, Option<T>) {
    let (name, ok, report, _) = finish_with_lines(node);
    (name, ok, report)
}

/// [`finish`], and every stdout line of the node.
fn finish_with_lines<T: for<'de> Deserialize<'de>>(
    mut node: Started,
) -> (String, bool, Option<T>, Vec<String>) {
    let ok = node.child.wait().is_ok_and(|s| s.success());
    let _ = node.reader.join();
    let lines = node
        .lines
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let report = lines
        .iter()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok());
    (node.name, ok, report, lines)
}

/// What `dmem cluster up|status|down` does with a background run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Action {
    /// Start the run in the background.
    Up,
    /// Report the background run.
    Status,
    /// Stop the background run and its nodes.
    Down,
}

/// Where a background run of `file` keeps its process group id, log and exit status: a
/// directory per cluster file (its canonical path, `/` → `_`) under the temp directory.
fn background_dir(file: &Path) -> anyhow::Result<PathBuf> {
    let canonical = file
        .canonicalize()
        .with_context(|| format!("cannot find cluster file {}", file.display()))?;
    let key: String = canonical
        .to_string_lossy()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    Ok(std::env::temp_dir().join("dmem-cluster").join(key))
}

/// Whether process `pid` exists and is not a zombie (`/proc/PID/stat`'s state).
fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X')
    })
}

/// `dmem cluster up|status|down`: a background run of `dmem cluster` for a quick try.
fn background(action: Action, args: &ClusterArgs) -> anyhow::Result<()> {
    let dir = background_dir(&args.cluster)?;
    let (pid_file, log, exit_file) = (dir.join("pgid"), dir.join("log"), dir.join("exit"));
    let running = || -> Option<i32> {
        let pid = std::fs::read_to_string(&pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (!exit_file.exists() && process_alive(pid)).then_some(pid)
    };
    match action {
        Action::Up => {
            // Validated now, so that a bad file is one line here, not in a log.
            Cluster::load(&args.cluster)?;
            if let Some(pid) = running() {
                bail!(
                    "a run of {} is already up (process group {pid}): `dmem cluster down --cluster {}` first",
                    args.cluster.display(),
                    args.cluster.display()
                );
            }
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let _ = std::fs::remove_file(&exit_file);
            let exe = std::env::current_exe().context("cannot find the dmem executable")?;
            let mut run = vec![
                exe.to_string_lossy().into_owned(),
                "cluster".into(),
                "--cluster".into(),
                args.cluster.to_string_lossy().into_owned(),
            ];
            if !args.kill.is_empty() {
                run.extend(["--kill".into(), args.kill.join(",")]);
                run.extend(["--kill-after-ms".into(), args.kill_after_ms.to_string()]);
            }
            if args.json {
                run.push("--json".into());
            }
            // A shell in a new process group runs the foreground command and writes its exit
            // status when it ends; `down` signals the whole group (the run and its nodes).
            let child = Command::new("sh")
                .arg("-c")
                .arg(r#""$@" > "$DMEM_LOG" 2>&1; echo $? > "$DMEM_EXIT""#)
                .arg("sh")
                .args(&run)
                .env("DMEM_LOG", &log)
                .env("DMEM_EXIT", &exit_file)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .context("cannot start the background run")?;
            std::fs::write(&pid_file, child.id().to_string())
                .with_context(|| format!("cannot write {}", pid_file.display()))?;
            println!(
                "dmem cluster: {} is up (process group {}); log {}; `dmem cluster status|down --cluster {}`",
                args.cluster.display(),
                child.id(),
                log.display(),
                args.cluster.display()
            );
            Ok(())
        }
        Action::Status => {
            let state = match (running(), std::fs::read_to_string(&exit_file)) {
                (Some(pid), _) => format!("running (process group {pid})"),
                (None, Ok(code)) => format!("finished, exit status {}", code.trim()),
                (None, Err(_)) if pid_file.exists() => "stopped (by `down` or a signal)".into(),
                (None, Err(_)) => {
                    println!("dmem cluster: {} is not up", args.cluster.display());
                    return Ok(());
                }
            };
            println!(
                "dmem cluster: {}: {state}; log {}",
                args.cluster.display(),
                log.display()
            );
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            for line in &lines[lines.len().saturating_sub(12)..] {
                println!("  {line}");
            }
            Ok(())
        }
        Action::Down => {
            let Some(pid) = running() else {
                println!("dmem cluster: {} is not running", args.cluster.display());
                return Ok(());
            };
            let group = rustix::process::Pid::from_raw(pid).context("a bad process group id")?;
            rustix::process::kill_process_group(group, rustix::process::Signal::KILL)
                .with_context(|| format!("cannot stop process group {pid}"))?;
            println!(
                "dmem cluster: {} is down (process group {pid} killed)",
                args.cluster.display()
            );
            Ok(())
        }
    }
}

/// `dmem cluster`.
pub(crate) fn run_cluster(args: &ClusterArgs) -> anyhow::Result<()> {
    if let Some(action) = args.action {
        return background(action, args);
    }
    let cluster = Cluster::load(&args.cluster)?;
    let (kill_mns, kill_cns): (Vec<&str>, Vec<&str>) = args
        .kill
        .iter()
        .map(String::as_str)
        .partition(|k| cluster.mns.iter().any(|m| m.name == *k));
    ensure!(
        kill_mns.len() <= 1 && kill_cns.len() <= 1,
        "--kill {}: at most one CN and one MN per run",
        args.kill.join(",")
    );
    let (kill_mn, kill_cn) = (kill_mns.first().copied(), kill_cns.first().copied());
    if let Some(kill) = kill_cn {
        cluster.cn(kill)?;
        ensure!(
            !cluster.symmetric(),
            "--kill {kill}: protocol `{}` recovers a crashed server on the simulator only (Dandelion §4.4: its detector reads the simulator's crash state; `dmem recover`); server processes are not recovered",
            cluster.protocol().unwrap_or_default()
        );
        if matches!(cluster.kind, Kind::Txn { .. }) {
            ensure!(
                cluster.cns[0].name != *kill,
                "--kill {kill}: the first CN runs the failure detector and recovery; kill another"
            );
        }
    }
    let setup = cluster.txn_setup()?;
    if let (Some(kill), Some(setup), Kind::Txn { protocol, .. }) =
        (args.kill.first(), &setup, &cluster.kind)
    {
        ensure!(
            setup.recovers()?,
            "--kill {kill}: protocol `{protocol}` has no recovery across processes yet (ford, pandora, motor, oocc, drtm, dslr and lotus do)"
        );
    }
    if let Some(setup) = &setup {
        setup.check_threads(cluster.threads)?;
    }
    // Every CN resolves the executor the same way: one line here rather than one per CN.
    cluster
        .executor
        .resolve()
        .map_err(|e| anyhow::anyhow!("{}: {e}", cluster.path.display()))?;
    if let (Some(kill), Fabric::Shm { .. }) = (kill_mn, &cluster.fabric) {
        bail!(
            "--kill {kill}: on shm an MN's memory outlives its process (every CN keeps its mapping), so killing it fails nothing; to kill an MN run the cluster on tcp (fabric = \"tcp\", a protocol with replicas: examples/clusters/smallbank-3mn-2cn.toml), or kill a CN"
        );
    }
    if let Some(kill) = kill_mn {
        let Some(setup) = &setup else {
            bail!("--kill {kill}: an MN can be killed in transaction runs only");
        };
        ensure!(
            setup.recovers()? && setup.replicas()? > 1,
            "--kill {kill}: an MN failure is survived by FORD and Pandora with replication only (this run keeps {} cop{} of each record)",
            setup.replicas()?,
            if setup.replicas()? == 1 { "y" } else { "ies" }
        );
    }
    let mut mns = Vec::new();
    let mut cns = Vec::new();
    // Stop every started child if anything below fails.
    let result = (|| -> anyhow::Result<()> {
        for mn in &cluster.mns {
            mns.push(start_node(&cluster, "mn", &mn.name, mn.netns.as_deref())?);
        }
        let deadline = Instant::now() + cluster.join_timeout;
        while !mns.iter().all(|m| m.ready.load(Ordering::SeqCst)) {
            for m in &mut mns {
                if matches!(m.child.try_wait(), Ok(Some(_))) {
                    bail!(
                        "MN `{}` exited before it was ready (its error is above)",
                        m.name
                    );
                }
            }
            ensure!(
                Instant::now() < deadline,
                "the MNs were not ready within the join timeout"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        for cn in &cluster.cns {
            cns.push(start_node(
                &cluster,
                cluster.cn_role(),
                &cn.name,
                cn.netns.as_deref(),
            )?);
        }
        if !args.kill.is_empty() {
            // The kill timer starts once every CN is connected and heartbeating.
            let deadline = Instant::now() + cluster.join_timeout;
            while !cns.iter().all(|c| c.ready.load(Ordering::SeqCst)) {
                for c in &mut cns {
                    // A CN that was ready may have finished already; the kill says so.
                    if !c.ready.load(Ordering::SeqCst) && matches!(c.child.try_wait(), Ok(Some(_)))
                    {
                        bail!(
                            "CN `{}` exited before it was ready (its error is above)",
                            c.name
                        );
                    }
                }
                ensure!(
                    Instant::now() < deadline,
                    "the CNs were not ready within the join timeout"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(args.kill_after_ms));
            for kill in &args.kill {
                let role = if kill_mn == Some(kill.as_str()) {
                    "MN"
                } else {
                    "CN"
                };
                let victim = cns
                    .iter_mut()
                    .chain(mns.iter_mut())
                    .find(|c| &c.name == kill)
                    .context("checked above")?;
                ensure!(
                    matches!(victim.child.try_wait(), Ok(None)),
                    "{role} `{kill}` finished before --kill-after-ms {} ms: raise the workload's duration_ms",
                    args.kill_after_ms
                );
                victim
                    .child
                    .kill()
                    .with_context(|| format!("cannot kill {role} `{kill}`"))?;
                eprintln!(
                    "dmem cluster: killed {role} `{kill}` with SIGKILL after {} ms",
                    args.kill_after_ms
                );
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        for node in mns.iter_mut().chain(cns.iter_mut()) {
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
        return Err(e);
    }
    if let (Some(_), Kind::Txn { protocol, .. }) = (&setup, &cluster.kind) {
        let mut histories = Vec::new();
        let cn_results: Vec<(String, bool, Option<txn::TxnCnReport>)> = cns
            .into_iter()
            .map(|node| {
                let (name, ok, report, lines) = finish_with_lines(node);
                histories.push(txn::history_from_lines(&lines));
                (name, ok, report)
            })
            .collect();
        // Every CN exited: the state they kept for one another's recovery is done with.
        let _ = std::fs::remove_dir_all(cluster.state_dir());
        let verdict = txn::collect(&cluster, kill_cn, kill_mn, &cn_results, histories);
        // The first CN tells the MNs to quit once its report is out; without that report
        // (it failed, e.g. refused the workload) the MNs would wait out their time limit.
        let first_cn_reported = cn_results
            .first()
            .is_some_and(|(_, ok, report)| *ok && report.is_some());
        if verdict.is_err() || !first_cn_reported {
            // The MNs wait for a quit that no CN got to send.
            let dead: Vec<NodeId> = cluster
                .mns
                .iter()
                .filter(|m| Some(m.name.as_str()) == kill_mn)
                .map(|m| m.node)
                .collect();
            if let Err(e) = txn::quit_mns_from_outside(&cluster, &dead) {
                eprintln!("dmem cluster: cannot tell the MNs to quit: {e}");
            }
        }
        let mn_results: Vec<(String, bool, Option<txn::TxnMnReport>)> =
            mns.into_iter().map(finish).collect();
        let mut verdict = verdict?;
        for (name, ok, report) in &mn_results {
            // The killed MN's report is missing by design.
            if (!ok || report.is_none()) && kill_mn != Some(name.as_str()) {
                verdict
                    .problems
                    .push(format!("MN `{name}` failed or printed no report"));
            }
        }
        if args.json {
            for r in cn_results.iter().filter_map(|(_, _, r)| r.as_ref()) {
                println!("{}", serde_json::to_string(r)?);
            }
            for r in mn_results.iter().filter_map(|(_, _, r)| r.as_ref()) {
                println!("{}", serde_json::to_string(r)?);
            }
        } else {
            txn::print_summary(&cluster, protocol, &cn_results, &verdict);
        }
        return if verdict.problems.is_empty() {
            Ok(())
        } else {
            Err(CheckFailed(format!(
                "cluster check failed: {}",
                verdict.problems.join("; ")
            ))
            .into())
        };
    }
    let cn_results: Vec<(String, bool, Option<CnReport>)> = cns.into_iter().map(finish).collect();
    let mn_results: Vec<(String, bool, Option<MnReport>)> = mns.into_iter().map(finish).collect();
    let problems = check(&cluster, kill_cn, &cn_results, &mn_results);
    if args.json {
        for (_, _, r) in &cn_results {
            if let Some(r) = r {
                println!("{}", serde_json::to_string(r)?);
            }
        }
        for (_, _, r) in &mn_results {
            if let Some(r) = r {
                println!("{}", serde_json::to_string(r)?);
            }
        }
    } else {
        print_summary(&cluster, &cn_results, &mn_results);
    }
    if problems.is_empty() {
        if !args.json {
            println!(
                "check: ok (every MN's shared word is the sum of the CN words; every finished CN's word is its posts x batch; the killed CN, if any, was revoked at every MN and no other CN was)"
            );
        }
        Ok(())
    } else {
        Err(CheckFailed(format!("cluster check failed: {}", problems.join("; "))).into())
    }
}

/// Every violated property, as readable lines.
fn check(
    cluster: &Cluster,
    killed: Option<&str>,
    cns: &[(String, bool, Option<CnReport>)],
    mns: &[(String, bool, Option<MnReport>)],
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, ok, report) in mns {
        let Some(r) = report.as_ref().filter(|_| *ok) else {
            problems.push(format!("MN `{name}` failed or printed no report"));
            continue;
        };
        let sum: u64 = r.words.values().sum();
        if sum != r.shared {
            problems.push(format!(
                "MN `{name}`: shared word {} != sum of CN words {sum}",
                r.shared
            ));
        }
        for cn in &cluster.cns {
            let is_killed = killed == Some(cn.name.as_str());
            match (is_killed, r.revoked.contains_key(&cn.name)) {
                (true, false) => problems.push(format!(
                    "MN `{name}` never revoked the killed CN `{}`",
                    cn.name
                )),
                (false, true) => problems.push(format!(
                    "MN `{name}` revoked the live CN `{}` (false suspicion)",
                    cn.name
                )),
                _ => {}
            }
        }
    }
    for (name, ok, report) in cns {
        if killed == Some(name.as_str()) {
            continue;
        }
        let Some(r) = report.as_ref().filter(|_| *ok) else {
            problems.push(format!("CN `{name}` failed or printed no report"));
            continue;
        };
        if r.posts == 0 {
            problems.push(format!("CN `{name}` completed no post"));
        }
        let expected = r.posts * u64::from(r.batch);
        for (mn, _, m) in mns {
            if let Some(m) = m
                && m.words.get(name) != Some(&expected)
            {
                problems.push(format!(
                    "MN `{mn}` holds {:?} in CN `{name}`'s word, expected {expected} ({} posts x batch {})",
                    m.words.get(name),
                    r.posts,
                    r.batch
                ));
            }
        }
    }
    problems
}

fn print_summary(
    cluster: &Cluster,
    cns: &[(String, bool, Option<CnReport>)],
    mns: &[(String, bool, Option<MnReport>)],
) {
    println!(
        "dmem cluster  {}  fabric tcp  {} MN  {} CN x {} threads x {} clients  batch {}  {} ms",
        cluster.path.display(),
        cluster.mns.len(),
        cluster.cns.len(),
        cluster.threads,
        cluster.clients,
        cluster.batch,
        cluster.duration.as_millis()
    );
    let mut t = common::table(&["node", "role", "exit", "posts", "posts/s", "note"]);
    for (name, ok, r) in cns {
        t.add_row(vec![
            name.clone(),
            "cn".into(),
            if *ok { "ok".into() } else { "failed".into() },
            r.as_ref().map_or("-".into(), |r| r.posts.to_string()),
            r.as_ref()
                .map_or("-".into(), |r| format!("{:.0}", r.posts_per_s)),
            r.as_ref()
                .map_or("no report (killed?)".into(), |r| r.errors.join("; ")),
        ]);
    }
    for (name, ok, r) in mns {
        let note = r.as_ref().map_or("no report".into(), |r| {
            let revoked: Vec<String> = r
                .revoked
                .iter()
                .map(|(cn, ms)| format!("{cn} at {ms} ms"))
                .collect();
            format!(
                "shared {} = sum of CN words; revoked: {}",
                r.shared,
                if revoked.is_empty() {
                    "none".into()
                } else {
                    revoked.join(", ")
                }
            )
        });
        t.add_row(vec![
            name.clone(),
            "mn".into(),
            if *ok { "ok".into() } else { "failed".into() },
            "-".into(),
            "-".into(),
            note,
        ]);
    }
    println!("{}", common::render(&t));
}

/// `dmem bench --fabric tcp|shm`: for each protocol, a local cluster of separate MN and CN
/// processes on this host (a generated cluster file in a temporary directory: loopback
/// addresses on tcp, Unix sockets on shm; on tcp, `--servers` server processes for a
/// symmetric protocol), run by [`run_cluster`]: histories collected and checked, invariants
/// checked, cluster stopped.
pub(crate) fn bench_cluster(args: &dmem_cli::bench_txn::Args) -> anyhow::Result<()> {
    // Refuses the simulator-only flags (message faults) with one line.
    args.message_faults(&dmem_protocols::registry())?;
    let shm = args.fabric() == dmem_cli::bench_txn::TxnFabric::Shm;
    let tcp = args.tcp_shape();
    let dir = std::env::temp_dir().join(format!(
        "dmem-bench-{}-{}",
        if shm { "shm" } else { "tcp" },
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut failed = Vec::new();
    for protocol in &tcp.protocols {
        let workload = format!(
            "\n[workload]\nkind = \"{}\"\nprotocol = \"{protocol}\"\nscale = \"{}\"\nduration_ms = {}\nthreads = 1\nclients = {}\nattempts = {}\nbackoff = \"{}\"\n",
            tcp.workload,
            tcp.scale,
            tcp.duration_ms,
            tcp.coordinators_per_cn,
            tcp.attempts,
            tcp.backoff
        );
        let text = match &tcp.cluster {
            // The file's nodes and settings, with this run's workload.
            Some(file) => {
                let text = std::fs::read_to_string(file)
                    .with_context(|| format!("cannot read cluster file {}", file.display()))?;
                let mut table: toml::Table = toml::from_str(&text).map_err(|e| {
                    anyhow::anyhow!(
                        "cluster file {}: {}",
                        file.display(),
                        e.message().trim_end()
                    )
                })?;
                let wanted = if shm { "shm" } else { "tcp" };
                let written = table.get("fabric").and_then(toml::Value::as_str);
                ensure!(
                    written == Some(wanted),
                    "cluster file {}: fabric = {:?}, but --fabric {wanted} was asked for",
                    file.display(),
                    written.unwrap_or("(missing)")
                );
                table.remove("workload");
                let workload: toml::Table = toml::from_str(&workload)?;
                table.extend(workload);
                toml::to_string(&table)?
            }
            None if shm => {
                let mut text = format!(
                    "fabric = \"shm\"\nsocket_dir = \"{}\"\njoin_timeout_ms = 60000\n{workload}",
                    dir.join("sockets").display()
                );
                for m in 0..usize::from(tcp.mns) {
                    text += &format!("\n[[node]]\nname = \"mn{m}\"\nrole = \"mn\"\n");
                }
                for c in 0..usize::from(tcp.cns) {
                    text += &format!("\n[[node]]\nname = \"cn{c}\"\nrole = \"cn\"\n");
                }
                text
            }
            None if dmem_protocols::registry()
                .get(protocol)
                .is_ok_and(|p| p.symmetric()) =>
            {
                // A symmetric protocol's servers: one free loopback port each.
                let listeners = (0..tcp.servers)
                    .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
                    .collect::<Result<Vec<_>, _>>()
                    .context("cannot find free loopback ports")?;
                let mut text = format!("fabric = \"tcp\"\njoin_timeout_ms = 60000\n{workload}");
                for (s, l) in listeners.iter().enumerate() {
                    text += &format!(
                        "\n[[node]]\nname = \"s{s}\"\nrole = \"server\"\ncontrol = \"127.0.0.1:{}\"\n",
                        l.local_addr()?.port()
                    );
                }
                text
            }
            None => {
                // Free loopback ports: two per MN, one per CN.
                let listeners = (0..2 * usize::from(tcp.mns) + usize::from(tcp.cns))
                    .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
                    .collect::<Result<Vec<_>, _>>()
                    .context("cannot find free loopback ports")?;
                let ports: Vec<u16> = listeners
                    .iter()
                    .map(|l| l.local_addr().map(|a| a.port()))
                    .collect::<Result<_, _>>()?;
                drop(listeners);
                // Each MN process creates and loads its store before it is ready: a
                // small-scale MVCC store (Motor, 3 × 0.5 GiB) takes longer than the default
                // 10 s join timeout on a busy host.
                let mut text = format!("fabric = \"tcp\"\njoin_timeout_ms = 60000\n{workload}");
                for m in 0..usize::from(tcp.mns) {
                    text += &format!(
                        "\n[[node]]\nname = \"mn{m}\"\nrole = \"mn\"\ndata = \"127.0.0.1:{}\"\ncontrol = \"127.0.0.1:{}\"\n",
                        ports[2 * m],
                        ports[2 * m + 1]
                    );
                }
                for c in 0..usize::from(tcp.cns) {
                    text += &format!(
                        "\n[[node]]\nname = \"cn{c}\"\nrole = \"cn\"\ncontrol = \"127.0.0.1:{}\"\n",
                        ports[2 * usize::from(tcp.mns) + c]
                    );
                }
                text
            }
        };
        let path = dir.join(format!("{protocol}.toml"));
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        let result = run_cluster(&ClusterArgs {
            action: None,
            cluster: path,
            kill: Vec::new(),
            kill_after_ms: 0,
            json: tcp.json,
        });
        match result {
            Ok(()) => {}
            Err(e) if e.downcast_ref::<CheckFailed>().is_some() => {
                failed.push(format!("{protocol}: {e}"))
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CheckFailed(failed.join("; ")).into())
    }
}

//! Transaction workloads (SmallBank, KVS, ...) on any protocol of the registry that runs on
//! real fabrics (FORD, Pandora, OCC, Motor, OOCC, DrTM, DSLR, LOTUS — each CN process
//! serving its own lock table) across MN and CN processes of a cluster file (see
//! `mod.rs` for the file and the verbs-level workload); and on the symmetric Dandelion
//! and FaSST across server processes (`dmem server`: the CN process below with no MNs, whose
//! deployment is its own server, `Protocol::deploy_server`, loading the records it holds
//! and running its message loop among its process tasks).
//!
//! - Every process derives the same deployment from the cluster file ([`TxnSetup`]): the
//!   workload's tables, one coordinator id per client of every CN plus one for the final
//!   check, and the MNs' regions, given to the protocol's `Protocol::deploy_on`
//!   (`dmem-deploy`), the same path the simulator's runs take.
//! - **MN**: creates a region of the store's size, deploys the protocol on it and loads its
//!   share of the records out of band, serves it, and answers link-termination requests
//!   (Pandora §3.2.2 step 2: the paper's RPC to the MN's management core) until
//!   `dmem cluster` tells it to quit.
//! - **CN**: one executor per core (`threads` of the file; glommio pinned to the core or
//!   the polling executor, as `executor` resolves: `dmem_runtime::run_per_core`), each
//!   core with a deployment of its own on the regions alone, after the loader ran without
//!   writing (so that placement decided while loading, such as OOCC's directory, agrees;
//!   run once per process, by `TxnSetup::new`, for a protocol whose deployments take that
//!   placement: `Deployment::placement`, `Protocol::deploy_placed`)
//!   and `Deployment::join_as_cn` told it which CN it is (the plan's members carry one
//!   service endpoint per client: LOTUS's lock servers, run by the deployment's
//!   `process_tasks`); one coordinator per client, on core `client mod threads`, each on
//!   its own context. More than one core needs `Deployment::splits_across_cores`. The
//!   first core also runs the CN's process tasks and everything below, the others the
//!   tasks `Deployment::core_tasks` returns (Pandora: each core's end of the CN listener);
//!   this file shares only atomic counters and the `CoreGroup` their deployments joined
//!   (`Deployment::join_core`) between the cores (LOTUS's deployments share their CN's lock
//!   table themselves). A CN whose clients are done keeps running those
//!   tasks, re-sending its report, until the first CN says the run is over.
//!   Recovery across processes is the deployment's (`dmem-deploy`'s
//!   `process` module): every CN runs the tasks `Deployment::process_tasks` returns
//!   (heartbeats to the first CN, which are also its join barrier; Pandora's CN listener),
//!   and the first CN drives the `ProcessRecovery` that `Deployment::process_recovery`
//!   returns (FORD/Pandora: Pandora's `RecoveryManager`, §3.2.2 and §3.2.5, with control
//!   messages re-sent; Motor: a heartbeat detector and its op logs, kept in files that
//!   outlive the CN process) until every other CN finished or was recovered. This file
//!   only makes the contexts, spawns the tasks and calls the detector's steps. Protocols
//!   without recovery across processes end the run with an error when a CN fails. Each CN
//!   streams its history as JSON.
//! - **`dmem cluster`** merges the histories, reads the final state with a coordinator of
//!   its own (knowing the recovered coordinators), runs the checker and (without a killed
//!   CN) the workload's invariants.
//!
//! Real-time edges of the checker compare `CLOCK_MONOTONIC` instants of different
//! processes: valid on one host (network namespaces included), not across machines.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use dmem_deploy::process::{
    CnContexts, CoreGroup, MessageLinkTerminator, ProcessPlan, ServiceContext, mn_control,
    parse_terminate, ports, services_of_core, terminated_reply,
};
use dmem_deploy::{
    AnyContext, Decision, DeploySpec, Deployment, MnMemory, Placement, Protocol, Recorder,
    RecoveredCoordinator, settle_history,
};
use dmem_runtime::{CoreClock, Executor, RealClock, run_per_core};
use dmem_shm::{MessageServer, MnLink, ShmFabric, ShmMemoryNode, ShmServer};
use dmem_tcp::{TcpFabric, TcpMemoryServer};
use dmem_txn::{
    Coordinator, History, HistorySink, Transaction, TxnId, TxnKind, TxnOutcome, TxnRecord,
};
use dmem_verbs::{Clock, Endpoint, MemoryRegion, NodeId, Port, RKey, Verbs};
use dmem_workloads::{AnyWorkload, Executed, Outcome, TxnGenerator, Workload};
use serde::{Deserialize, Serialize};

use super::control::{Control, print_ready};
use crate::cluster::{Cluster, CnNode, Fabric, MnNode};
use dmem_cli::common;

/// How long a peer may leave a control request unanswered (a link termination, an
/// MN-failure acknowledgement) before recovery reports it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The deployment of a cluster, as every process derives it.
#[derive(Clone)]
pub(crate) struct TxnSetup {
    pub(crate) workload: AnyWorkload,
    protocol: Arc<dyn Protocol>,
    spec: DeploySpec,
    regions: Vec<MemoryRegion>,
    /// Where the dry run's loader placed the records (`Deployment::placement`), for
    /// deployments that take it instead of loading again (`Protocol::deploy_placed`).
    placement: Option<Placement>,
}

impl TxnSetup {
    pub(crate) fn new(
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
    fn deploy(&self, memory: MnMemory, history: Recorder) -> anyhow::Result<Box<dyn Deployment>> {
        Ok(self.protocol.deploy_on(memory, &self.spec, history)?)
    }

    /// Whether CN failures are recovered across processes
    /// (`Deployment::recovers_across_processes`).
    pub(crate) fn recovers(&self) -> anyhow::Result<bool> {
        if self.protocol.symmetric() {
            // Its recovery runs on the simulator only (refused with a reason by `dmem
            // cluster --kill`).
            return Ok(false);
        }
        Ok(self.remote()?.recovers_across_processes())
    }

    /// Whether a CN may run its coordinators on `threads` cores: one always, more when the
    /// protocol lets a CN split them (`Deployment::splits_across_cores`); else one line why.
    pub(crate) fn check_threads(&self, threads: u32) -> anyhow::Result<()> {
        if threads > 1 && self.protocol.symmetric() {
            bail!(
                "threads = {threads}: a server of protocol `{}` runs on one core; use threads = 1",
                self.protocol.name()
            );
        }
        if threads > 1
            && let Err(why) = self.remote()?.splits_across_cores()
        {
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

fn endpoint(node: NodeId, port: Port) -> Endpoint {
    Endpoint { node, port }
}

/// The path MN `node` hands its memory out on, on the shm fabric.
pub(crate) fn shm_memory_socket(dir: &Path, node: NodeId) -> PathBuf {
    dir.join(format!("mn-{}.sock", node.0))
}

/// One process's side of the cluster's fabric: contexts for two-sided messages, and
/// contexts connected to the MNs' memory. On tcp both travel TCP (memory to each MN's
/// `data` address, messages between `control` addresses); on shm memory is the MNs' memfd
/// mappings and messages cross processes over the shm fabric's Unix sockets (a context that
/// both posts to the MNs and receives messages — the first CN's detector — must be one
/// context of one fabric).
enum Net {
    Tcp {
        fabric: TcpFabric,
        _listener: dmem_tcp::MessageListener,
    },
    Shm {
        fabric: ShmFabric,
        dir: PathBuf,
        _messages: MessageServer,
    },
}

impl Net {
    /// Starts receiving messages for `node` (whose tcp `control` address is `control`), and
    /// knows how to reach every other node of `cluster`.
    fn new(
        cluster: &Cluster,
        name: &str,
        node: NodeId,
        control: impl FnOnce() -> anyhow::Result<std::net::SocketAddr>,
    ) -> anyhow::Result<Self> {
        match cluster.fabric() {
            Fabric::Tcp => {
                let control = control()?;
                let fabric = TcpFabric::new(node);
                let listener = fabric.listen(control).with_context(|| {
                    format!("{name}: cannot listen for control messages on {control}")
                })?;
                for mn in cluster.mns().iter().filter(|m| m.node != node) {
                    fabric.add_peer(mn.node, mn.control()?);
                }
                for cn in cluster.cns().iter().filter(|c| c.node != node) {
                    fabric.add_peer(cn.node, cn.control()?);
                }
                Ok(Net::Tcp {
                    fabric,
                    _listener: listener,
                })
            }
            Fabric::Shm { dir } => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("{name}: cannot create {}", dir.display()))?;
                let fabric = ShmFabric::new();
                let socket = dmem_shm::message_socket(dir, node);
                // A socket left behind by an earlier run of this node (killed) is stale.
                let _ = std::fs::remove_file(&socket);
                let messages = fabric.serve_messages(dir, node).with_context(|| {
                    format!("{name}: cannot receive messages on {}", socket.display())
                })?;
                Ok(Net::Shm {
                    fabric,
                    dir: dir.clone(),
                    _messages: messages,
                })
            }
        }
    }

    /// A context on `port` of this process's node for messages only.
    fn context(&self, node: NodeId, port: Port) -> anyhow::Result<AnyContext> {
        Ok(match self {
            Net::Tcp { fabric, .. } => fabric.context(port)?.into(),
            Net::Shm { fabric, .. } => fabric.context(endpoint(node, port))?.into(),
        })
    }

    /// A context on `port` connected to every MN `alive` accepts (a failed MN is not
    /// waited for); a MN not serving yet is retried until `deadline`.
    fn connected_to(
        &self,
        node: NodeId,
        port: Port,
        cluster: &Cluster,
        deadline: Instant,
        alive: impl Fn(NodeId) -> bool,
    ) -> anyhow::Result<AnyContext> {
        Ok(match self {
            Net::Tcp { fabric, .. } => {
                let mut ctx = fabric.context(port)?;
                for mn in cluster.mns().iter().filter(|m| alive(m.node)) {
                    crate::cluster::connect_retrying(&mut ctx, mn, deadline)?;
                }
                ctx.into()
            }
            Net::Shm { fabric, dir, .. } => {
                let mut ctx = fabric.context(endpoint(node, port))?;
                for mn in cluster.mns().iter().filter(|m| alive(m.node)) {
                    let path = shm_memory_socket(dir, mn.node);
                    let link = loop {
                        match MnLink::connect(&path, node) {
                            Ok(link) => break link,
                            Err(dmem_shm::ShmError::Os { .. }) if Instant::now() < deadline => {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            Err(e) => {
                                return Err(e).with_context(|| {
                                    format!(
                                        "cannot map the memory of MN `{}` through {}",
                                        mn.name,
                                        path.display()
                                    )
                                });
                            }
                        }
                    };
                    ctx.add_link(link)?;
                }
                ctx.into()
            }
        })
    }

    /// [`connected_to`](Self::connected_to) every MN.
    fn connected(
        &self,
        node: NodeId,
        port: Port,
        cluster: &Cluster,
        deadline: Instant,
    ) -> anyhow::Result<AnyContext> {
        self.connected_to(node, port, cluster, deadline, |_| true)
    }
}

/// Whether `ctx` lost an MN that the view does not count as `failed` (revoked, or the MN
/// went away): nothing it posts there lands any more.
fn lost_live_mn(ctx: &AnyContext, failed: &[NodeId]) -> bool {
    match ctx {
        AnyContext::Tcp(c) => c
            .links()
            .any(|(region, _)| c.is_lost(region.node) && !failed.contains(&region.node)),
        AnyContext::Shm(c) => c
            .links()
            .any(|l| l.is_revoked() && !failed.contains(&l.region().node)),
        AnyContext::Sim(_) => false,
    }
}

/// What an MN reports in a transaction run.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TxnMnReport {
    role: String,
    name: String,
    /// CNs whose access was revoked.
    revoked: Vec<String>,
}

/// An MN's memory as served to the CNs.
enum Served {
    /// From the tcp fabric's serving loop.
    Tcp(TcpMemoryServer),
    /// As a memfd handed out on a Unix socket; kept here to revoke links.
    Shm(ShmMemoryNode, ShmServer),
}

impl Served {
    /// Revokes every access of `cn` (Pandora §3.2.2's link termination); says what was done.
    fn revoke(&self, cn: NodeId) -> anyhow::Result<String> {
        match self {
            Served::Tcp(server) => Ok(format!("{} connections shut down", server.revoke(cn)?)),
            Served::Shm(memory, _) => match memory.revoke(cn) {
                Ok(links) => Ok(format!("{links} mapping links revoked")),
                // The flag is set: nothing the CN posts from now on lands. Only a post
                // it was in the middle of when it died stays unfinished (its in-flight
                // counter stays raised), and a dead process lands nothing more.
                Err(dmem_shm::ShmError::RevokeTimeout { waited_ms, .. }) => Ok(format!(
                    "mapping links revoked; a post still in flight after {waited_ms} ms (a process killed mid-post)"
                )),
                Err(e) => Err(e.into()),
            },
        }
    }

    /// Stops serving.
    fn stop(self) -> anyhow::Result<()> {
        match self {
            Served::Tcp(server) => server.stop().context("the serving loop failed"),
            Served::Shm(_, server) => {
                drop(server);
                Ok(())
            }
        }
    }
}

/// `dmem mn` for a transaction workload.
pub(crate) fn run_mn(cluster: &Cluster, me: &MnNode, setup: &TxnSetup) -> anyhow::Result<()> {
    let memory = ShmMemoryNode::create(me.node, mn_rkey(me.node), setup.bytes_per_mn())
        .with_context(|| {
            format!(
                "{}: cannot create {} bytes of memory",
                me.name,
                setup.bytes_per_mn()
            )
        })?;
    // Load this MN's share of the records (every replica on it) out of band: the
    // protocol's own loader, whose writes to other MNs go nowhere here.
    {
        let mapped = MnMemory::mapped(setup.regions.clone(), &[&memory])?;
        let mut deployment = setup.deploy(mapped, Recorder::new(Rc::default()))?;
        for (table, key, value) in setup.workload.loader() {
            deployment
                .load(table, key, &value)
                .with_context(|| format!("{}: loading failed", me.name))?;
        }
    }
    let net = Net::new(cluster, &me.name, me.node, || me.control())?;
    let (server, serves_on) = match cluster.fabric() {
        Fabric::Tcp => {
            let data = me.data()?;
            let server = TcpMemoryServer::serve(memory, data)
                .with_context(|| format!("{}: cannot serve memory on {data}", me.name))?;
            (Served::Tcp(server), data.to_string())
        }
        Fabric::Shm { dir } => {
            let path = shm_memory_socket(dir, me.node);
            // A socket left behind by an earlier run of this MN (killed) is stale.
            let _ = std::fs::remove_file(&path);
            let server = memory.serve(&path).with_context(|| {
                format!("{}: cannot serve memory on {}", me.name, path.display())
            })?;
            (Served::Shm(memory, server), path.display().to_string())
        }
    };
    let ctx = net.context(me.node, mn_control(me.node).port)?;
    print_ready(&me.name);
    eprintln!(
        "dmem mn {}: node {} serves {} of {} on {serves_on} (fabric {})",
        me.name,
        me.node.0,
        common::human_bytes(setup.bytes_per_mn()),
        setup.workload.name(),
        ctx.fabric(),
    );
    let executor = Executor::new();
    let mut revoked = BTreeSet::new();
    // The run ends at a quit; a parent that died leaves an MN that gives up after a while.
    let give_up = Instant::now() + cluster.duration() + cluster.join_timeout() * 6;
    loop {
        while let Some(msg) = ctx.try_recv()? {
            if Control::parse(&msg.payload) == Ok(Control::Quit) {
                let report = TxnMnReport {
                    role: "mn".into(),
                    name: me.name.clone(),
                    revoked: revoked.into_iter().collect(),
                };
                println!("{}", serde_json::to_string(&report)?);
                server.stop()?;
                return Ok(());
            }
            if let Some(cn) = parse_terminate(&msg.payload) {
                let shut = server.revoke(cn)?;
                let name = cluster.cn_name(cn);
                eprintln!(
                    "dmem mn {}: link of {name} terminated on request of node {} ({shut})",
                    me.name, msg.from.node.0
                );
                revoked.insert(name);
                if let Err(e) = executor.block_on(ctx.send(msg.from, &terminated_reply(cn))) {
                    eprintln!("dmem mn {}: cannot confirm the termination: {e}", me.name);
                }
            }
        }
        ensure!(
            Instant::now() < give_up,
            "{}: no quit from `dmem cluster` in time; giving up",
            me.name
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One line of a CN's history stream on stdout.
#[derive(Debug, Serialize, Deserialize)]
enum HistoryLine {
    /// A transaction recorded (before its first commit write).
    Record(TxnRecord),
    /// Its outcome and end, later.
    Resolve(TxnId, TxnOutcome, dmem_verbs::Nanos),
}

#[derive(Debug, Serialize, Deserialize)]
struct HistoryLineWrap {
    history: HistoryLine,
}

/// A history sink that writes every record and resolution to stdout as one JSON line at
/// once, so that the history of a CN killed mid-run survives it up to its last record
/// (a transaction is recorded before its first commit write, as `Unknown`). Switched off
/// for the final state's read-only transactions, which are not part of the run.
#[derive(Debug, Clone, Default)]
struct StdoutHistory {
    off: Rc<Cell<bool>>,
}

impl StdoutHistory {
    fn emit(line: HistoryLine) {
        use std::io::Write as _;
        if let Ok(text) = serde_json::to_string(&HistoryLineWrap { history: line }) {
            let mut out = std::io::stdout().lock();
            // A closed stdout (the parent died) loses the history, not the run.
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
    }
}

impl HistorySink for StdoutHistory {
    fn record(&self, txn: TxnRecord) {
        if !self.off.get() {
            Self::emit(HistoryLine::Record(txn));
        }
    }

    fn resolve(&self, id: TxnId, outcome: TxnOutcome, end: dmem_verbs::Nanos) {
        if !self.off.get() {
            Self::emit(HistoryLine::Resolve(id, outcome, end));
        }
    }
}

/// Rebuilds a CN's history from its stdout lines (other lines are skipped).
pub(crate) fn history_from_lines(lines: &[String]) -> History {
    let mut history = History::new();
    for line in lines {
        match serde_json::from_str::<HistoryLineWrap>(line).map(|w| w.history) {
            Ok(HistoryLine::Record(txn)) => history.push(txn),
            Ok(HistoryLine::Resolve(id, outcome, end)) => {
                if let Some(t) = history.txns.iter_mut().rev().find(|t| t.id == id) {
                    t.outcome = outcome;
                    t.end = end;
                }
            }
            Err(_) => {}
        }
    }
    history
}

/// One CN failure recovered by the first CN.
#[derive(Debug, Serialize, Deserialize)]
struct Recovered {
    cn: String,
    /// Coordinator ids recovered.
    coordinators: Vec<u16>,
    /// Per coordinator: its in-flight transaction's fate (`roll-forward`, `roll-back`, `none`).
    decisions: Vec<String>,
    detected_ms: u64,
    /// Per coordinator: the sequence number of the transaction recovery decided.
    #[serde(default)]
    txns: Vec<Option<u64>>,
    /// When recovery finished (`CLOCK_MONOTONIC` ns), if the decisions settle the recovered
    /// coordinators' `Unknown` transactions in the merged history
    /// (`dmem_deploy::process::ProcessRecovery::settles_history`).
    #[serde(default)]
    settle_at: Option<u64>,
}

impl Recovered {
    /// Writes the decisions into the merged `history` (`dmem_deploy::settle_history`), if
    /// the protocol's recovery settles it.
    fn settle(&self, history: &RefCell<History>) {
        let Some(now) = self.settle_at else {
            return;
        };
        for (i, &coordinator) in self.coordinators.iter().enumerate() {
            let decision = match self.decisions.get(i).map(String::as_str) {
                Some("roll-forward") => Some(Decision::RollForward),
                Some("roll-back") => Some(Decision::RollBack),
                _ => None,
            };
            let r = RecoveredCoordinator {
                coordinator,
                txn: self.txns.get(i).copied().flatten(),
                decision,
                restored: 0,
                unlocked: 0,
            };
            settle_history(history, &r, now);
        }
    }
}

/// One MN failure handled by the first CN (Pandora §3.2.5).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct MnFailed {
    /// The failed MN.
    pub(crate) mn: String,
    /// When the detector confirmed it, ms after the first CN's run started.
    detected_ms: u64,
    /// When every live CN had acknowledged and was resumed; `None` if that never happened.
    resumed_ms: Option<u64>,
}

/// What a CN reports in a transaction run.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TxnCnReport {
    role: String,
    name: String,
    committed: u64,
    rolled_back: u64,
    /// Transactions given up (the sum of [`given_up`](Self::given_up)).
    failed: u64,
    delta: i64,
    /// Tries per transaction (the cluster file's `attempts`).
    #[serde(default)]
    attempts: u32,
    /// Failed attempts by reason (`dmem_harness::failure_reason`: the protocol's abort
    /// reason, else the error), the last try of a transaction given up included.
    #[serde(default)]
    aborts: BTreeMap<String, u64>,
    /// Transactions given up, by their last error.
    #[serde(default)]
    given_up: BTreeMap<String, u64>,
    /// First CN only: the CN failures it recovered.
    recovered: Vec<Recovered>,
    /// First CN only: the MN failures it handled.
    #[serde(default)]
    mn_failures: Vec<MnFailed>,
    /// First CN only: the workload's invariants over the final state, read after every CN
    /// finished or was recovered (`ok`, the violations, or why they were skipped).
    invariants: String,
    /// The executor each of its cores ran on (`glommio`, pinned, or `polling`).
    #[serde(default)]
    pub(crate) executor: String,
    /// Why not glommio, when the polling executor ran.
    #[serde(default)]
    executor_why: Option<String>,
    /// Its cores (executors), each running its share of the coordinators.
    #[serde(default)]
    threads: u32,
    /// Its first core's deployment's counters at the end (`Deployment::counters`; LOTUS:
    /// the CN's lock table, shared by its cores).
    #[serde(default)]
    counters: BTreeMap<String, u64>,
    /// Per core, the MNs its view counted as failed when its coordinators were done
    /// (`Deployment::failed_mns`; Pandora §3.2.5: an MN failure reaches every core's view).
    #[serde(default)]
    failed_mns_by_core: Vec<Vec<String>>,
    /// Cores whose deployment ran the workload's loader again after the process's dry run
    /// (0 where every core took the dry run's placement: `Protocol::deploy_placed`).
    #[serde(default)]
    core_loads: u64,
}

/// The recovery plan every process of `cluster` derives (`dmem-deploy`'s
/// [`ProcessPlan`]): every CN with its coordinators and listener, the first CN's detector.
/// A CN serves one service endpoint per client (LOTUS's lock servers); a server of a
/// symmetric protocol one, its message loop (`Protocol::deploy_server`).
fn process_plan(cluster: &Cluster) -> ProcessPlan {
    let services = if cluster.symmetric() {
        1
    } else {
        u16::try_from(cluster.clients()).expect("clients checked against ports::MAX_CLIENTS")
    };
    ProcessPlan::on_ports(
        cluster
            .cns()
            .iter()
            .map(|c| (c.node, cluster.coordinator_ids(c.node))),
        services,
        cluster.heartbeat(),
        cluster.timeout(),
        ANSWER_TIMEOUT.as_nanos() as u64,
        cluster.state_dir(),
    )
}

/// What the cores of one CN process share: the tallies over all its coordinators, how
/// many still run, and whether every core has made its coordinators.
#[derive(Debug, Default)]
struct CnShared {
    committed: AtomicU64,
    rolled_back: AtomicU64,
    failed: AtomicU64,
    /// Failed attempts by reason, over every core.
    aborts: Mutex<BTreeMap<String, u64>>,
    /// Transactions given up, by their last error.
    given_up: Mutex<BTreeMap<String, u64>>,
    /// The workload's conserved quantity the CN's commits added.
    delta: AtomicI64,
    /// Coordinators still running, on every core.
    running: AtomicUsize,
    /// Cores (other than the first) whose coordinators are made.
    built: AtomicUsize,
    /// Every CN has joined: the coordinators run from now on (a coordinator started earlier
    /// would ask a CN still starting for its services — LOTUS's locks — and fail).
    started: AtomicBool,
    /// A core could not make its coordinators, or the first core gave up: every core stops.
    stop: AtomicBool,
    /// Per core, the MNs its deployment's view counted as failed when its coordinators
    /// were done.
    failed_mns_by_core: Mutex<Vec<Vec<String>>>,
    /// Cores whose deployment ran the loader itself (no shared placement).
    core_loads: AtomicU64,
}

/// `mutex`'s tally; one poisoned by a panicking core is still counted.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Everything a CN's cores need, shared by their threads.
struct CnSetup {
    cluster: Cluster,
    me: CnNode,
    setup: TxnSetup,
    plan: ProcessPlan,
    net: Net,
    /// Per core, the CPU its executor is pinned to (glommio) and its clients: `(client
    /// index, coordinator id)` (the client index numbers its port).
    cores: Vec<(usize, Vec<(u16, u16)>)>,
    /// What the cores' deployments share (`Deployment::join_core`).
    group: CoreGroup,
    shared: CnShared,
}

impl CnSetup {
    /// This core's deployment (the protocol on the regions alone, streaming its records to
    /// stdout), after the loader ran without writing (so that placement decided while
    /// loading, such as OOCC's directory, agrees with the MNs) and
    /// `Deployment::join_as_cn` told it which CN it is (LOTUS: whose lock table it serves)
    /// and `Deployment::join_core` which core (Pandora: its listener's messages reach it).
    ///
    /// A protocol that takes a placement (`Protocol::deploy_placed`) gets the one the dry run
    /// of `TxnSetup::new` found, shared by every core, and the loader runs once per process.
    ///
    /// A server of a symmetric protocol deploys its own server instead
    /// (`Protocol::deploy_server`), its message loop on `services` (the plan's service
    /// endpoints of every server), and loads the records it holds.
    fn deployment(
        &self,
        core: usize,
        history: Recorder,
        services: &[ServiceContext],
    ) -> anyhow::Result<Box<dyn Deployment>> {
        let setup = &self.setup;
        if setup.protocol.symmetric() {
            let me = self
                .plan
                .index_of(self.me.node)
                .context("a server of the cluster")?;
            let servers = self
                .plan
                .members
                .iter()
                .map(|m| m.services.clone())
                .collect();
            let mut deployment = setup.protocol.deploy_server(
                me,
                servers,
                services.iter().map(|s| s.ctx.clone()).collect(),
                history,
            )?;
            for (table, key, value) in setup.workload.loader() {
                deployment.load(table, key, &value)?;
            }
            deployment.join_as_cn(self.me.node, &self.plan)?;
            return Ok(deployment);
        }
        let memory = MnMemory::remote(setup.regions.clone());
        let placed = setup.placement.as_ref().and_then(|placement| {
            setup
                .protocol
                .deploy_placed(memory.clone(), &setup.spec, history.clone(), placement)
        });
        let mut deployment = match placed {
            Some(deployment) => deployment?,
            None => {
                self.shared.core_loads.fetch_add(1, Ordering::Relaxed);
                let mut deployment = setup.deploy(memory, history)?;
                for (table, key, value) in setup.workload.loader() {
                    deployment.load(table, key, &value)?;
                }
                deployment
            }
        };
        deployment.join_as_cn(self.me.node, &self.plan)?;
        deployment.join_core(self.group.on_core(core))?;
        Ok(deployment)
    }

    /// Contexts for core `core`'s share of the services this CN offers (LOTUS's lock
    /// servers: the `i`-th on the core of the `i`-th coordinator,
    /// `dmem_deploy::process::service_core`).
    fn services(&self, core: usize) -> anyhow::Result<Vec<ServiceContext>> {
        let services = self
            .plan
            .member(self.me.node)
            .map(|m| m.services.clone())
            .unwrap_or_default();
        services_of_core(&services, core, self.cores.len())
            .into_iter()
            .map(|(slot, e)| {
                Ok(ServiceContext {
                    slot,
                    ctx: self.net.context(self.me.node, e.port)?,
                })
            })
            .collect()
    }

    /// Core `core`'s coordinators, each on a context of its own connected to every MN.
    fn coordinators(
        &self,
        core: usize,
        deployment: &mut dyn Deployment,
    ) -> anyhow::Result<Vec<(u16, dmem_txn::BoxCoordinator, AnyContext)>> {
        let deadline = Instant::now() + self.cluster.join_timeout();
        let mut coordinators = Vec::new();
        for &(client, id) in &self.cores[core].1 {
            let ctx = self.net.connected(
                self.me.node,
                Port(ports::FIRST_COORDINATOR + client),
                &self.cluster,
                deadline,
            )?;
            let co = deployment.coordinator(ctx.clone(), id)?;
            coordinators.push((id, co, ctx));
        }
        Ok(coordinators)
    }

    /// Runs `coordinators` for the workload's duration from now (or until every core is
    /// told to stop), counting into the CN's tallies.
    async fn run_coordinators(
        &self,
        core: usize,
        coordinators: Vec<(u16, dmem_txn::BoxCoordinator, AnyContext)>,
        deployment: &RefCell<Box<dyn Deployment>>,
    ) {
        // Once every CN has joined (the first core says so), for the workload's duration.
        while !self.shared.started.load(Ordering::Relaxed) {
            if self.shared.stop.load(Ordering::Relaxed) {
                self.shared
                    .running
                    .fetch_sub(coordinators.len(), Ordering::Relaxed);
                return;
            }
            RealClock.sleep(1_000_000).await;
        }
        let end = dmem_runtime::monotonic_now() + self.cluster.duration().as_nanos() as u64;
        let workload = &self.setup.workload;
        let shared = &self.shared;
        let attempts = self.cluster.attempts();
        let clients = coordinators.into_iter().map(|(id, co, ctx)| async move {
            // A core is one cooperative executor: the holder of what an attempt was
            // refused runs before the next try.
            let mut co = dmem_harness::YieldingBegin(co);
            let mut generator = workload.generator(u32::from(id), 0x5eed ^ u64::from(id));
            let mut pause = dmem_harness::BackoffPause::new(
                self.cluster.backoff(),
                RealClock,
                0x5eed,
                id,
                std::rc::Rc::default(),
            );
            while RealClock.now() < end && !shared.stop.load(Ordering::Relaxed) {
                let txn = generator.next_txn();
                let (executed, reasons) = dmem_harness::execute_with_reasons(
                    workload, &mut co, &txn, attempts, &mut pause,
                )
                .await;
                if !reasons.is_empty() {
                    let mut aborts = lock(&shared.aborts);
                    for reason in reasons {
                        *aborts.entry(reason).or_default() += 1;
                    }
                }
                match executed {
                    Executed::Committed { outcome, .. } => {
                        shared.committed.fetch_add(1, Ordering::Relaxed);
                        if let Outcome::Commit { delta } = outcome {
                            shared.delta.fetch_add(delta, Ordering::Relaxed);
                        }
                    }
                    Executed::RolledBack { .. } => {
                        shared.rolled_back.fetch_add(1, Ordering::Relaxed);
                    }
                    Executed::Failed { error, .. } => {
                        shared.failed.fetch_add(1, Ordering::Relaxed);
                        *lock(&shared.given_up).entry(error.to_string()).or_default() += 1;
                        // Revoked (or an MN gone that the view does not count as failed):
                        // nothing this coordinator posts lands any more. An MN the view
                        // dropped (Pandora §3.2.5) is no longer posted to.
                        let failed = deployment.borrow().failed_mns();
                        if lost_live_mn(&ctx, &failed) {
                            break;
                        }
                    }
                }
                // On shm every post completes on its first poll, so a transaction never
                // waits: without this the core's other futures (heartbeats, the detector,
                // the other coordinators) would not run until the workload ends.
                dmem_runtime::yield_now().await;
            }
            shared.running.fetch_sub(1, Ordering::Relaxed);
        });
        futures_util::future::join_all(clients).await;
        let failed = deployment.borrow().failed_mns();
        lock(&shared.failed_mns_by_core)[core] =
            failed.iter().map(|&mn| self.cluster.mn_name(mn)).collect();
    }

    /// A core after the first: its own deployment and coordinators.
    async fn worker_core(&self, core: usize) -> anyhow::Result<()> {
        // The service contexts first (as on the first core): a request that arrives while
        // this core loads is queued, not dropped.
        let made = self.services(core).and_then(|services| {
            let mut d = self.deployment(
                core,
                Recorder::streaming(Rc::new(StdoutHistory::default())),
                &[],
            )?;
            let coordinators = self.coordinators(core, &mut *d)?;
            let tasks = d.core_tasks(self.me.node, &self.plan, services)?;
            Ok((d, coordinators, tasks))
        });
        let (deployment, coordinators, tasks) = match made {
            Ok(made) => made,
            Err(e) => {
                self.shared.stop.store(true, Ordering::Relaxed);
                return Err(e.context(format!("{}: core {core}", self.me.name)));
            }
        };
        self.shared.built.fetch_add(1, Ordering::Relaxed);
        let deployment = RefCell::new(deployment);
        // The core's tasks (Pandora: its end of the CN listener; often none) stop with its
        // coordinators, and never end the core by themselves.
        let tasks = async {
            futures_util::future::join_all(tasks).await;
            std::future::pending::<()>().await;
        };
        let work = self.run_coordinators(core, coordinators, &deployment);
        futures_util::future::select(std::pin::pin!(work), std::pin::pin!(tasks)).await;
        Ok(())
    }
}

/// What the first core of a CN reports besides the tallies.
#[derive(Default)]
struct FirstCore {
    recovered: Vec<Recovered>,
    mn_failures: Vec<MnFailed>,
    invariants: String,
    counters: BTreeMap<String, u64>,
}

/// `dmem cn` for a transaction workload: one executor per core (`threads` of the cluster
/// file, each on the executor `executor` picks: glommio pinned to the core, or the polling
/// executor), each core's coordinators made by a deployment of its own
/// (`Deployment::splits_across_cores`); the first core also runs the CN's process tasks,
/// the detector's side (first CN) and the final check.
pub(crate) fn run_cn(cluster: &Cluster, me: &CnNode, setup: &TxnSetup) -> anyhow::Result<()> {
    let (kind, executor_why) = cluster
        .executor()
        .resolve()
        .map_err(|e| anyhow::anyhow!("{}: {e}", me.name))?;
    let threads = cluster.threads() as usize;
    setup
        .check_threads(cluster.threads())
        .with_context(|| me.name.clone())?;
    let net = Net::new(cluster, &me.name, me.node, || me.control())?;
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let mut cores: Vec<(usize, Vec<(u16, u16)>)> =
        (0..threads).map(|t| (t % cpus, Vec::new())).collect();
    for (client, id) in cluster.coordinator_ids(me.node).into_iter().enumerate() {
        let client = u16::try_from(client).context("clients checked against ports")?;
        cores[usize::from(client) % threads].1.push((client, id));
    }
    let cn = Arc::new(CnSetup {
        cluster: cluster.clone(),
        me: me.clone(),
        setup: setup.clone(),
        plan: process_plan(cluster),
        net,
        shared: CnShared {
            running: AtomicUsize::new(cores.iter().map(|c| c.1.len()).sum()),
            failed_mns_by_core: Mutex::new(vec![Vec::new(); threads]),
            ..CnShared::default()
        },
        group: CoreGroup::new(threads),
        cores,
    });
    let jobs = cn
        .cores
        .iter()
        .enumerate()
        .map(|(core, &(cpu, _))| {
            let cn = Arc::clone(&cn);
            let job = move |clock: CoreClock| async move {
                if core == 0 {
                    let r = first_core(&cn, clock).await;
                    if r.is_err() {
                        cn.shared.stop.store(true, Ordering::Relaxed);
                    }
                    r.map(Some)
                } else {
                    cn.worker_core(core).await.map(|()| None)
                }
            };
            (cpu, job)
        })
        .collect();
    let results = run_per_core(kind, jobs).with_context(|| format!("{}: cores", me.name))?;
    let mut first = None;
    for r in results {
        if let Some(f) = r? {
            first = Some(f);
        }
    }
    let first = first.unwrap_or_default();
    let shared = &cn.shared;
    let report = TxnCnReport {
        role: cluster.cn_role().into(),
        name: me.name.clone(),
        committed: shared.committed.load(Ordering::Relaxed),
        rolled_back: shared.rolled_back.load(Ordering::Relaxed),
        failed: shared.failed.load(Ordering::Relaxed),
        delta: shared.delta.load(Ordering::Relaxed),
        attempts: cluster.attempts(),
        aborts: lock(&shared.aborts).clone(),
        given_up: lock(&shared.given_up).clone(),
        recovered: first.recovered,
        mn_failures: first.mn_failures,
        invariants: first.invariants,
        executor: kind.name().to_owned(),
        executor_why,
        threads: cluster.threads(),
        counters: first.counters,
        failed_mns_by_core: lock(&shared.failed_mns_by_core).clone(),
        core_loads: shared.core_loads.load(Ordering::Relaxed),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// The first core of a CN: its share of the coordinators, the CN's process tasks
/// (heartbeats, Pandora's listener, LOTUS's lock servers) and, on the first CN, the
/// detector's side and the final check; on the others, the "done" report.
async fn first_core(cn: &CnSetup, clock: CoreClock) -> anyhow::Result<FirstCore> {
    let (cluster, me, plan, net) = (&cn.cluster, &cn.me, &cn.plan, &cn.net);
    let detector_cn = plan.detector.node;
    let is_detector = me.node == detector_cn;
    let deadline = Instant::now() + cluster.join_timeout();
    // The detector's receive queue exists before anything else of this CN, so that no
    // heartbeat of a quicker CN is dropped while this one connects.
    let detector_ctx = if is_detector {
        Some(net.connected(me.node, ports::DETECTOR, cluster, deadline)?)
    } else {
        None
    };
    // So does the queue of "done" reports (and, on the other CNs, of the detector's "run
    // over"): a quick CN may finish before a slow first CN has joined.
    let done_ctx = net.context(me.node, ports::DONE)?;
    // Likewise the service contexts of this core (LOTUS's lock servers): a quicker CN's
    // first lock requests are queued, not dropped, while this one loads.
    let services = cn.services(0)?;
    // The coordinators stream every record to stdout (and keep none here).
    let stdout_history = StdoutHistory::default();
    let streaming_off = Rc::clone(&stdout_history.off);
    let mut deployment =
        cn.deployment(0, Recorder::streaming(Rc::new(stdout_history)), &services)?;
    let coordinators = cn.coordinators(0, &mut *deployment)?;
    // The protocol's CN side (heartbeats to the detector, which are also its join barrier;
    // for protocols with recovery across processes their listener) runs until this
    // process ends.
    let tasks = deployment.process_tasks(
        me.node,
        CnContexts {
            heartbeat: net.context(me.node, ports::HEARTBEAT)?,
            listener: net.context(me.node, ports::LISTENER)?,
            services,
        },
        plan,
    )?;
    let deployment = RefCell::new(deployment);
    let body = async {
        // `dmem cluster` starts its kill timer once every CN is this far (every core made
        // its coordinators; the first CN: once it heard every CN's first heartbeat).
        while cn.shared.built.load(Ordering::Relaxed) + 1 < cn.cores.len() {
            ensure!(
                !cn.shared.stop.load(Ordering::Relaxed),
                "{}: a core could not make its coordinators",
                me.name
            );
            clock.sleep(1_000_000).await;
        }
        if let Some(detector_ctx) = detector_ctx {
            join(cluster, me, clock, &detector_ctx).await?;
            for other in plan.members.iter().map(|m| m.cn).filter(|&n| n != me.node) {
                done_ctx
                    .send(endpoint(other, ports::DONE), &Control::Go.emit())
                    .await
                    .with_context(|| {
                        format!(
                            "{}: cannot tell {} to start",
                            me.name,
                            cluster.cn_name(other)
                        )
                    })?;
            }
            cn.shared.started.store(true, Ordering::Relaxed);
            print_ready(&me.name);
            detector(
                cn,
                clock,
                &deployment,
                &streaming_off,
                detector_ctx,
                &done_ctx,
            )
            .await
        } else {
            wait_for_go(cn, clock, &done_ctx).await?;
            print_ready(&me.name);
            report_done(cn, clock, &done_ctx).await?;
            Ok(FirstCore::default())
        }
    };
    let body = async {
        let r = body.await;
        if r.is_err() {
            // The coordinators may still wait for the start (or run): stop them.
            cn.shared.stop.store(true, Ordering::Relaxed);
        }
        r
    };
    let work = futures_util::future::join(cn.run_coordinators(0, coordinators, &deployment), body);
    // The process tasks never end by themselves: they stop with the work. They start once
    // every core made its coordinators and its service contexts: the first heartbeat is
    // this CN's join, after which other CNs may send to any core's services, and a message
    // to a port no context receives on yet is dropped.
    let tasks = async {
        while cn.shared.built.load(Ordering::Relaxed) + 1 < cn.cores.len()
            && !cn.shared.stop.load(Ordering::Relaxed)
        {
            clock.sleep(1_000_000).await;
        }
        futures_util::future::join_all(tasks).await
    };
    let mut first =
        match futures_util::future::select(std::pin::pin!(work), std::pin::pin!(tasks)).await {
            futures_util::future::Either::Left((((), first), _)) => first?,
            futures_util::future::Either::Right(_) => bail!("{}: the process tasks ended", me.name),
        };
    first.counters = deployment.borrow().counters().into_iter().collect();
    Ok(first)
}

/// A CN other than the first: waits until the first CN says every CN joined, then lets its
/// coordinators start.
async fn wait_for_go(cn: &CnSetup, clock: CoreClock, done_ctx: &AnyContext) -> anyhow::Result<()> {
    let (cluster, me) = (&cn.cluster, &cn.me);
    // The first CN waits up to a join timeout for the last CN's first heartbeat.
    let give_up = clock.now() + (cluster.join_timeout() * 2).as_nanos() as u64;
    loop {
        while let Some(msg) = done_ctx.try_recv()? {
            if Control::parse(&msg.payload) == Ok(Control::Go) {
                cn.shared.started.store(true, Ordering::Relaxed);
                return Ok(());
            }
        }
        ensure!(
            clock.now() < give_up,
            "{}: the first CN `{}` did not say every CN joined within {} ms",
            me.name,
            cluster.cns()[0].name,
            (cluster.join_timeout() * 2).as_millis()
        );
        clock.sleep(1_000_000).await;
    }
}

/// A CN other than the first, once its coordinators are done: report to the detector, then
/// serve the other CNs (the protocol's tasks keep running) until the detector says every CN
/// finished, or for at most a join timeout; the report is re-sent every heartbeat meanwhile
/// (the detector counts it once).
async fn report_done(cn: &CnSetup, clock: CoreClock, done_ctx: &AnyContext) -> anyhow::Result<()> {
    let (cluster, me, plan) = (&cn.cluster, &cn.me, &cn.plan);
    let detector = endpoint(plan.detector.node, ports::DONE);
    while cn.shared.running.load(Ordering::Relaxed) > 0 {
        clock.sleep(plan.heartbeat).await;
    }
    let done = Control::cn_done_delta(cn.shared.delta.load(Ordering::Relaxed)).emit();
    if let Err(e) = done_ctx.send(detector, &done).await {
        eprintln!(
            "dmem cn {}: cannot tell the detector it is done: {e}",
            me.name
        );
    }
    let linger_end = clock.now() + cluster.join_timeout().as_nanos() as u64;
    while clock.now() < linger_end {
        while let Some(msg) = done_ctx.try_recv()? {
            if Control::parse(&msg.payload) == Ok(Control::RunOver) {
                return Ok(());
            }
        }
        clock.sleep(plan.heartbeat).await;
        let _ = done_ctx.send(detector, &done).await;
    }
    eprintln!(
        "dmem cn {}: no word from the detector within {} ms that the run is over; exiting",
        me.name,
        cluster.join_timeout().as_millis()
    );
    Ok(())
}

/// The first CN's detector side, once every CN joined: collect the other CNs' "done"
/// reports, recover the CNs that fail (protocols with recovery across processes), tell the
/// others the run is over, read the final state and check the workload's invariants, and
/// tell the MNs to quit.
async fn detector(
    cn: &CnSetup,
    clock: CoreClock,
    deployment: &RefCell<Box<dyn Deployment>>,
    streaming_off: &Cell<bool>,
    detector_ctx: AnyContext,
    done_ctx: &AnyContext,
) -> anyhow::Result<FirstCore> {
    let (cluster, me, plan, net, setup) = (&cn.cluster, &cn.me, &cn.plan, &cn.net, &cn.setup);
    // A protocol with recovery across processes takes over the detector's context;
    // for others the heartbeats are only drained.
    let mut recovery = deployment.borrow_mut().process_recovery(
        detector_ctx.clone(),
        MessageLinkTerminator::new(
            net.context(me.node, ports::TERMINATOR)?,
            plan.heartbeat,
            plan.answer_timeout,
        ),
        plan,
    )?;
    // Without recovery a CN that never reports ends the run, after this long.
    let give_up = clock.now() + (cluster.duration() + cluster.join_timeout() * 2).as_nanos() as u64;
    let start = dmem_runtime::monotonic_now();
    let mut deltas: HashMap<NodeId, i64> = HashMap::new();
    let mut finished: BTreeSet<NodeId> = BTreeSet::new();
    let mut recovered: BTreeSet<NodeId> = BTreeSet::new();
    loop {
        while let Some(msg) = done_ctx.try_recv()? {
            if let Ok(Control::CnDone { tally }) = Control::parse(&msg.payload) {
                finished.insert(msg.from.node);
                deltas.insert(msg.from.node, tally.cast_signed());
            }
        }
        match &mut recovery {
            Some(recovery) => {
                let mut admit = |failed| {
                    if finished.contains(&failed) {
                        return false;
                    }
                    eprintln!(
                        "dmem cn {}: {} missed its heartbeats for {} ms: recovering it",
                        me.name,
                        cluster.cn_name(failed),
                        cluster.timeout() / 1_000_000
                    );
                    recovered.insert(failed);
                    true
                };
                recovery.step(&mut admit).await?;
            }
            None => while detector_ctx.try_recv()?.is_some() {},
        }
        let pending: Vec<String> = plan
            .members
            .iter()
            .map(|m| m.cn)
            .filter(|n| *n != me.node && !finished.contains(n) && !recovered.contains(n))
            .map(|n| cluster.cn_name(n))
            .collect();
        if cn.shared.running.load(Ordering::Relaxed) == 0 && pending.is_empty() {
            break;
        }
        ensure!(
            recovery.is_some() || clock.now() < give_up,
            "{}: {} did not finish, and protocol `{}` has no recovery across processes",
            me.name,
            pending.join(", "),
            setup.protocol.name()
        );
        clock.sleep(plan.heartbeat / 2).await;
    }
    let (events, mn_events) = recovery
        .as_ref()
        .map_or_else(Default::default, |r| (r.events(), r.mn_failures()));
    let settles = recovery.as_ref().is_some_and(|r| r.settles_history());
    // The final state, read by one more coordinator that knows who failed (it reads
    // past the locks they left) and which MNs failed (it connects to the live ones and
    // reads their primaries), then the live MNs are told the run is over.
    streaming_off.set(true);
    let dead = deployment.borrow().failed_mns();
    let final_ctx = net.connected_to(
        me.node,
        ports::FINAL_READER,
        cluster,
        Instant::now() + cluster.join_timeout(),
        |node| !dead.contains(&node),
    )?;
    let last = deployment
        .borrow_mut()
        .final_coordinator(final_ctx, cluster.coordinators())?;
    let invariants = if events.is_empty() {
        let delta = cn.shared.delta.load(Ordering::Relaxed) + deltas.values().sum::<i64>();
        check_invariants(&setup.workload, last, delta, clock).await
    } else {
        // A recovered CN's committed changes are not known here.
        "skipped (a CN was recovered)".to_owned()
    };
    // Every other CN may exit now, its records read (a server of a symmetric protocol
    // holds some): the finished ones serve nobody any more, and one recovered while alive
    // (a false suspicion) is told too; a dead one cannot be.
    for other in plan.members.iter().map(|m| m.cn).filter(|&n| n != me.node) {
        let told = done_ctx
            .send(endpoint(other, ports::DONE), &Control::RunOver.emit())
            .await;
        if let (Err(e), true) = (told, finished.contains(&other)) {
            eprintln!(
                "dmem cn {}: cannot tell {} the run is over: {e}",
                me.name,
                cluster.cn_name(other)
            );
        }
    }
    quit_mns(cluster, &net.context(me.node, ports::QUIT_SENDER)?, &dead).await;
    let since_start = |t: dmem_verbs::Nanos| t.saturating_sub(start) / 1_000_000;
    let mn_failures = mn_events
        .iter()
        .map(|e| MnFailed {
            mn: cluster.mn_name(e.mn),
            detected_ms: since_start(e.detected_at),
            resumed_ms: e.resumed_at.map(since_start),
        })
        .collect();
    let recovered = events
        .iter()
        .map(|e| Recovered {
            cn: cluster.cn_name(e.cn),
            coordinators: e.coordinators.iter().map(|c| c.coordinator).collect(),
            decisions: e
                .coordinators
                .iter()
                .map(|c| match c.decision {
                    Some(Decision::RollForward) => "roll-forward".into(),
                    Some(Decision::RollBack) => "roll-back".into(),
                    None => "none".into(),
                })
                .collect(),
            detected_ms: since_start(e.detected_at),
            txns: e.coordinators.iter().map(|c| c.txn).collect(),
            settle_at: settles.then_some(e.finished_at),
        })
        .collect();
    Ok(FirstCore {
        recovered,
        mn_failures,
        invariants,
        counters: BTreeMap::new(),
    })
}

/// The detector's join barrier: suspicion starts once every CN has sent its first
/// heartbeat (a CN still connecting its coordinators is not a failed one).
async fn join(
    cluster: &Cluster,
    me: &CnNode,
    clock: CoreClock,
    detector_ctx: &AnyContext,
) -> anyhow::Result<()> {
    let mut heard = BTreeSet::new();
    let join_end = clock.now() + cluster.join_timeout().as_nanos() as u64;
    while heard.len() < cluster.cns().len() {
        while let Some(msg) = detector_ctx.try_recv()? {
            heard.insert(msg.from.node);
        }
        if clock.now() > join_end {
            bail!(
                "{}: no heartbeat from {} within {} ms",
                me.name,
                cluster.cns_not_heard(|n| heard.contains(&n)),
                cluster.join_timeout().as_millis()
            );
        }
        clock.sleep(1_000_000).await;
    }
    Ok(())
}

/// The workload's invariants over the final state read by `last` (`delta`: the conserved
/// quantity every CN's commits added): `ok`, the violations, or why they could not be read.
///
/// The workload's check asks for records one by one and may ask for more depending on what
/// it read (TPC-C looks up the orders it inserted), through a synchronous callback; the
/// reads are transactions that must run on this core's executor beside its other futures
/// (LOTUS's lock servers). So the check runs over the records read so far, the records it
/// asked for and did not have are read (each by a read-only transaction, retried like the
/// workload's), and it runs again until it asks for nothing new; its last verdict stands.
async fn check_invariants(
    workload: &AnyWorkload,
    mut last: dmem_txn::BoxCoordinator,
    delta: i64,
    clock: CoreClock,
) -> String {
    // Retried after a randomized exponential wait (100 µs up to 20 ms, up to about 1 s over the
    // attempts): a read that aborts does so because something is slow — a DrTM read lease
    // (400 µs) runs out when the process or the MN's is descheduled between the lease's
    // CAS and the commit — and retrying at once met the same stall 64 times (CI, 2 CN
    // processes × 2 cores beside other tests).
    let mut pause = dmem_harness::BackoffPause::new(
        dmem_harness::Backoff::Exponential {
            base_ns: 100_000,
            cap_ns: 20_000_000,
        },
        clock,
        0,
        0,
        std::rc::Rc::default(),
    );
    let mut read: HashMap<(dmem_txn::TableId, dmem_txn::Key), Option<Vec<u8>>> = HashMap::new();
    loop {
        let missing = RefCell::new(Vec::new());
        let violations = workload.check(
            |table, key| match read.get(&(table, key)) {
                Some(value) => value.clone(),
                None => {
                    missing.borrow_mut().push((table, key));
                    None
                }
            },
            delta,
        );
        let missing = missing.into_inner();
        if missing.is_empty() {
            return dmem_harness::invariants_verdict(&violations);
        }
        for (table, key) in missing {
            let mut attempt = 0;
            let value = loop {
                if attempt > 0 {
                    dmem_workloads::Pause::before_retry(&mut pause, attempt).await;
                }
                let r = async {
                    let mut tx = last.begin(TxnKind::ReadOnly).await?;
                    let value = tx.read(table, key).await?;
                    tx.commit().await?;
                    Ok::<_, dmem_txn::TxnError>(value)
                }
                .await;
                attempt += 1;
                match r {
                    Err(e) if e.is_retryable() && attempt < dmem_harness::MAX_ATTEMPTS => {}
                    r => break r,
                }
            };
            match value {
                Ok(value) => {
                    read.insert((table, key), value);
                }
                Err(e) => return format!("could not read the final state: {e}"),
            }
        }
    }
}

/// The outcome of a transaction run, as `dmem cluster` checked it.
pub(crate) struct TxnVerdict {
    pub(crate) checker: String,
    pub(crate) invariants: String,
    pub(crate) problems: Vec<String>,
}

/// `dmem cluster`'s part of a transaction run, once the CNs have exited: merge the
/// histories (the killed CN's streamed records included), check them, and check the
/// workload's invariants over the final state the first CN read.
pub(crate) fn collect(
    cluster: &Cluster,
    killed: Option<&str>,
    killed_mn: Option<&str>,
    cns: &[(String, bool, Option<TxnCnReport>)],
    histories: Vec<History>,
) -> anyhow::Result<TxnVerdict> {
    let mut problems = Vec::new();
    let mut history = History::new();
    for h in histories {
        history.txns.extend(h.txns);
    }
    // Recovery's decisions for the failed CNs' in-flight transactions, as the simulator's
    // recovery of the same protocol writes them.
    let history = RefCell::new(history);
    for r in cns.iter().filter_map(|(_, _, r)| r.as_ref()) {
        r.recovered.iter().for_each(|rec| rec.settle(&history));
    }
    let history = history.into_inner();
    for (name, ok, report) in cns {
        if killed == Some(name.as_str()) {
            continue;
        }
        let Some(r) = report.as_ref().filter(|_| *ok) else {
            problems.push(format!("CN `{name}` failed or printed no report"));
            continue;
        };
        if r.committed == 0 {
            problems.push(format!("CN `{name}` committed nothing"));
        }
        for rec in &r.recovered {
            if killed != Some(rec.cn.as_str()) {
                problems.push(format!(
                    "the live CN `{}` was recovered (false suspicion)",
                    rec.cn
                ));
            }
        }
    }
    if let Some(k) = killed {
        let recovered = cns
            .iter()
            .filter_map(|(_, _, r)| r.as_ref())
            .any(|r| r.recovered.iter().any(|rec| rec.cn == k));
        if !recovered {
            problems.push(format!("the killed CN `{k}` was not recovered"));
        }
    }
    let first = &cluster.cns()[0].name;
    let first_report = cns
        .iter()
        .find(|(name, _, _)| name == first)
        .and_then(|(_, _, r)| r.as_ref());
    let handled: Vec<&MnFailed> =
        first_report.map_or(Vec::new(), |r| r.mn_failures.iter().collect());
    for failure in &handled {
        if killed_mn != Some(failure.mn.as_str()) {
            problems.push(format!(
                "the live MN `{}` was counted as failed",
                failure.mn
            ));
        } else if failure.resumed_ms.is_none() {
            problems.push(format!(
                "the CNs were never resumed after MN `{}` failed",
                failure.mn
            ));
        }
    }
    if let Some(k) = killed_mn
        && !handled.iter().any(|f| f.mn == k)
    {
        problems.push(format!("the killed MN `{k}` was not detected"));
    }
    let invariants = cns
        .iter()
        .find(|(name, _, _)| name == first)
        .and_then(|(_, _, r)| r.as_ref())
        .map_or_else(
            || format!("unknown (the first CN `{first}` printed no report)"),
            |r| r.invariants.clone(),
        );
    if invariants != "ok" && !invariants.starts_with("skipped") {
        problems.push(format!("invariants: {invariants}"));
    }
    // Judged at the isolation the protocol promises (`motor-si`, `lotus-si`: snapshot
    // isolation, where write skew is allowed), as the simulator's runs are.
    let isolation = cluster
        .protocol()
        .and_then(|name| dmem_protocols::registry().get(name).ok())
        .map_or(dmem_txn::Isolation::Serializable, |p| p.isolation());
    let checker = dmem_harness::verdict_under(&history, isolation);
    if checker != "ok" {
        problems.push(format!("history checker: {checker}"));
    }
    Ok(TxnVerdict {
        checker: format!("{checker} ({} transactions)", history.txns.len()),
        invariants,
        problems,
    })
}

/// Tells every MN of the cluster but the `dead` ones that the run is over, from `ctx`.
async fn quit_mns(cluster: &Cluster, ctx: &AnyContext, dead: &[NodeId]) {
    for mn in cluster.mns().iter().filter(|m| !dead.contains(&m.node)) {
        if let Err(e) = ctx.send(mn_control(mn.node), &Control::Quit.emit()).await {
            eprintln!("dmem cluster: cannot tell MN `{}` to quit: {e}", mn.name);
        }
    }
}

/// `dmem cluster`'s own [`quit_mns`] (as node `u16::MAX - 1`), for a run whose first CN
/// did not get to it.
pub(crate) fn quit_mns_from_outside(cluster: &Cluster, dead: &[NodeId]) -> anyhow::Result<()> {
    let me = NodeId(u16::MAX - 1);
    let ctx: AnyContext = match cluster.fabric() {
        Fabric::Tcp => {
            let fabric = TcpFabric::new(me);
            for mn in cluster.mns() {
                fabric.add_peer(mn.node, mn.control()?);
            }
            fabric.context(ports::QUIT_SENDER)?.into()
        }
        Fabric::Shm { dir } => {
            let fabric = ShmFabric::new();
            fabric.set_message_dir(dir);
            fabric.context(endpoint(me, ports::QUIT_SENDER))?.into()
        }
    };
    Executor::new().block_on(quit_mns(cluster, &ctx, dead));
    Ok(())
}

/// Prints the CN table of a transaction run.
pub(crate) fn print_summary(
    cluster: &Cluster,
    protocol: &str,
    cns: &[(String, bool, Option<TxnCnReport>)],
    verdict: &TxnVerdict,
) {
    let nodes = if cluster.symmetric() {
        format!("{} servers", cluster.cns().len())
    } else {
        format!("{} MN  {} CN", cluster.mn_count(), cluster.cns().len())
    };
    println!(
        "dmem cluster  {}  fabric {}  protocol {protocol}  {nodes} x {} coordinators  {} ms  {} attempts",
        cluster.path().display(),
        cluster.fabric_name(),
        cluster.clients(),
        cluster.duration().as_millis(),
        cluster.attempts()
    );
    let mut t = common::table(&[
        "node",
        "exit",
        "committed",
        "rolled back",
        "given up",
        "aborts",
        "executor",
        "recovered",
    ]);
    for (name, ok, r) in cns {
        let recovered = r.as_ref().map_or(String::new(), |r| {
            r.recovered
                .iter()
                .map(|rec| {
                    format!(
                        "{} at {} ms: {}",
                        rec.cn,
                        rec.detected_ms,
                        rec.decisions.join(",")
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        });
        t.add_row(vec![
            name.clone(),
            if *ok {
                "ok".into()
            } else {
                "killed/failed".into()
            },
            r.as_ref().map_or("-".into(), |r| r.committed.to_string()),
            r.as_ref().map_or("-".into(), |r| r.rolled_back.to_string()),
            r.as_ref().map_or("-".into(), |r| r.failed.to_string()),
            r.as_ref()
                .map_or("-".into(), |r| r.aborts.values().sum::<u64>().to_string()),
            r.as_ref()
                .map_or("-".into(), |r| format!("{} x {}", r.threads, r.executor)),
            recovered,
        ]);
    }
    println!("{}", common::render(&t));
    // Over every CN that reported.
    let mut aborts = BTreeMap::new();
    let mut given_up = BTreeMap::new();
    for r in cns.iter().filter_map(|(_, _, r)| r.as_ref()) {
        for (reason, n) in &r.aborts {
            *aborts.entry(reason.clone()).or_insert(0) += n;
        }
        for (error, n) in &r.given_up {
            *given_up.entry(error.clone()).or_insert(0) += n;
        }
    }
    if !aborts.is_empty() {
        println!("aborts by reason: {}", common::by_count(&aborts));
    }
    if !given_up.is_empty() {
        println!("given up by error: {}", common::by_count(&given_up));
    }
    // LOTUS: each CN's refusals (on its table by reason, met by its coordinators by what
    // the lock was for), summed over the CNs.
    let mut refused = BTreeMap::new();
    for r in cns.iter().filter_map(|(_, _, r)| r.as_ref()) {
        for (name, n) in r
            .counters
            .iter()
            .filter(|(k, _)| k.starts_with("lotus_refused_"))
        {
            *refused.entry(name.clone()).or_insert(0) += n;
        }
    }
    if refused.values().any(|&n| n > 0) {
        println!("lock refusals: {}", common::by_count(&refused));
    }
    for r in cns.iter().filter_map(|(_, _, r)| r.as_ref()) {
        for f in &r.mn_failures {
            println!(
                "MN failure: {} detected by {} at {} ms, CNs resumed {}",
                f.mn,
                r.name,
                f.detected_ms,
                f.resumed_ms
                    .map_or_else(|| "never".to_owned(), |t| format!("at {t} ms"))
            );
        }
    }
    println!(
        "checker: {}  invariants: {}",
        verdict.checker, verdict.invariants
    );
}

//! `dmem mn`: a memory-node process. For the `faa` workload it serves the counters on its
//! `data` address from the tcp fabric's io_uring loop and runs the failure detector on its
//! `control` address: it waits for every CN's first heartbeat, then revokes a CN that stays
//! silent longer than `timeout_ms` (its connections are shut down and refused: Pandora
//! §3.2.2's active-link termination), and exits once every CN finished or was revoked,
//! printing a JSON report of its memory. For a transaction workload it loads its share of
//! the store, serves it (tcp or shm), and answers link-termination requests (Pandora §3.2.2
//! step 2: the paper's RPC to the MN's management core) until told to quit.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use dmem_deploy::process::{Termination, mn_control};
use dmem_deploy::{MnMemory, Recorder};
use dmem_runtime::{Executor, monotonic_now};
use dmem_shm::{ShmFabric, ShmMemoryNode, ShmServer};
use dmem_tcp::{TcpContext, TcpFabric, TcpMemoryServer};
use dmem_txn::detector::HeartbeatDetector;
use dmem_verbs::{NodeId, Port, PostList, Verbs};
use dmem_workloads::Workload;

use dmem_cli::common;

use super::config::{Cluster, Fabric, MnNode, NodeArgs};
use super::control::{Control, print_ready};
use super::net::{Net, shm_memory_socket};
use super::report::{MnReport, TxnMnReport};
use super::setup::{TxnSetup, mn_rkey};

/// `dmem mn`.
pub(crate) fn run_mn(args: &NodeArgs) -> anyhow::Result<()> {
    let cluster = Cluster::load(&args.cluster)?;
    ensure!(
        !cluster.symmetric(),
        "node `{}`: this cluster's nodes are servers of a symmetric protocol (role = \"server\"), with no MNs: start them with `dmem server`",
        args.node
    );
    let me = cluster.mn(&args.node)?.clone();
    match TxnSetup::of(&cluster)? {
        Some(setup) => run_txn_mn(&cluster, &me, &setup),
        None => run_faa_mn(&cluster, &me),
    }
}

/// `dmem mn` for the `faa` workload: serves the counters, revokes the CNs that fall
/// silent, and reports the counters once every CN finished or was revoked.
fn run_faa_mn(cluster: &Cluster, me: &MnNode) -> anyhow::Result<()> {
    let (data, control) = (me.data()?, me.control()?);
    let memory = ShmMemoryNode::create(me.node, mn_rkey(me.node), me.memory())
        .with_context(|| format!("{}: cannot create {} bytes of memory", me.name, me.memory()))?;
    let server = TcpMemoryServer::serve(memory, data)
        .with_context(|| format!("{}: cannot serve memory on {}", me.name, data))?;
    let fabric = TcpFabric::new(me.node);
    let _listener = fabric.listen(control).with_context(|| {
        format!(
            "{}: cannot listen for control messages on {}",
            me.name, control
        )
    })?;
    let mut inbox = FaaInbox {
        cluster,
        ctx: fabric.context(Port(0))?,
        heard: HashSet::new(),
        done: BTreeMap::new(),
    };
    // The parent (`dmem cluster`) waits for this line before starting CNs.
    print_ready(&me.name);
    eprintln!(
        "dmem mn {}: node {} serves {} on {} (control {})",
        me.name,
        me.node.0,
        common::human_bytes(me.memory()),
        data,
        control
    );
    inbox.join(me, data, control)?;
    let revoked = inbox.revoke_the_silent(me, &server)?;
    let report = faa_report(cluster, me, &server, inbox.done, revoked)?;
    println!("{}", serde_json::to_string(&report)?);
    server.stop().context("the serving loop failed")?;
    Ok(())
}

/// The control messages a `faa` MN received: who it heard from, who said it was done.
struct FaaInbox<'c> {
    cluster: &'c Cluster,
    ctx: TcpContext,
    /// CNs that sent at least one message (a heartbeat).
    heard: HashSet<NodeId>,
    /// CNs that said they were done, with their post counts.
    done: BTreeMap<String, u64>,
}

impl FaaInbox<'_> {
    /// Takes every control message that arrived: "done" reports, and heartbeats (any other
    /// message from a CN counts as one, as at every detector of dmem) to `heard` and the
    /// detector.
    fn drain(&mut self, mut detector: Option<&mut HeartbeatDetector>) -> anyhow::Result<()> {
        while let Some(msg) = self.ctx.try_recv()? {
            let from = msg.from.node;
            if self.cluster.cn_index(from).is_none() {
                continue;
            }
            if let Ok(Control::CnDone { tally: posts }) = Control::parse(&msg.payload) {
                self.done.insert(self.cluster.cn_name(from), posts);
            } else {
                self.heard.insert(from);
                if let Some(d) = detector.as_mut() {
                    d.heartbeat(from, monotonic_now());
                }
            }
        }
        Ok(())
    }

    /// Waits for every CN's first heartbeat (a CN still starting is not a failed one).
    fn join(&mut self, me: &MnNode, data: SocketAddr, control: SocketAddr) -> anyhow::Result<()> {
        let cluster = self.cluster;
        let start = Instant::now();
        while self.heard.len() < cluster.cns().len() {
            self.drain(None)?;
            if start.elapsed() > cluster.join_timeout() {
                bail!(
                    "{}: no heartbeat from {} within {} ms: is `dmem cn` running there, and can it reach {} and {}?",
                    me.name,
                    cluster.cns_not_heard(|n| self.heard.contains(&n)),
                    cluster.join_timeout().as_millis(),
                    data,
                    control
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Detection (Pandora §3.2.2 step 1) and link termination (step 2) at this MN, until
    /// every CN finished or was revoked; returns the revoked CNs with the ms from the start
    /// of detection.
    fn revoke_the_silent(
        &mut self,
        me: &MnNode,
        server: &TcpMemoryServer,
    ) -> anyhow::Result<BTreeMap<String, u64>> {
        let cluster = self.cluster;
        let detect_start = monotonic_now();
        let mut detector = HeartbeatDetector::watching(
            cluster.timeout(),
            cluster.cns().iter().map(|c| c.node),
            detect_start,
        );
        let mut revoked: BTreeMap<String, u64> = BTreeMap::new();
        let poll = Duration::from_nanos((cluster.heartbeat() / 2).max(100_000));
        loop {
            self.drain(Some(&mut detector))?;
            let now = monotonic_now();
            for suspect in detector.suspects(now) {
                let name = cluster.cn_name(suspect);
                if self.done.contains_key(&name) {
                    continue;
                }
                let shut = server
                    .revoke(suspect)
                    .with_context(|| format!("{}: revoking {name}", me.name))?;
                eprintln!(
                    "dmem mn {}: {name} silent for more than {} ms: access revoked, {shut} connections shut down",
                    me.name,
                    cluster.timeout() / 1_000_000
                );
                revoked.insert(name, (now - detect_start) / 1_000_000);
            }
            if cluster
                .cns()
                .iter()
                .all(|c| self.done.contains_key(&c.name) || revoked.contains_key(&c.name))
            {
                return Ok(revoked);
            }
            std::thread::sleep(poll);
        }
    }
}

/// The `faa` MN's report: its counters, read through a local link (out of band).
fn faa_report(
    cluster: &Cluster,
    me: &MnNode,
    server: &TcpMemoryServer,
    done: BTreeMap<String, u64>,
    revoked: BTreeMap<String, u64>,
) -> anyhow::Result<MnReport> {
    let mut local = ShmFabric::new().context(mn_control(me.node))?;
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
    Ok(MnReport {
        role: "mn".into(),
        name: me.name.clone(),
        node: me.node.0,
        shared: read_word(0)?,
        words: cluster
            .cns()
            .iter()
            .enumerate()
            .map(|(i, c)| Ok((c.name.clone(), read_word(Cluster::cn_word(i))?)))
            .collect::<anyhow::Result<_>>()?,
        done,
        revoked,
    })
}

/// `dmem mn` for a transaction workload: loads its share of the records, serves them, and
/// answers link-termination requests until `dmem cluster` (or the first CN) says quit.
fn run_txn_mn(cluster: &Cluster, me: &MnNode, setup: &TxnSetup) -> anyhow::Result<()> {
    let memory = ShmMemoryNode::create(me.node, mn_rkey(me.node), setup.bytes_per_mn())
        .with_context(|| {
            format!(
                "{}: cannot create {} bytes of memory",
                me.name,
                setup.bytes_per_mn()
            )
        })?;
    load_share(me, setup, &memory)?;
    let net = Net::new(cluster, &me.name, me.node, || me.control())?;
    let (server, serves_on) = Served::start(cluster, me, memory)?;
    let ctx = net.context(me.node, mn_control(me.node).port)?;
    print_ready(&me.name);
    eprintln!(
        "dmem mn {}: node {} serves {} of {} on {serves_on} (fabric {})",
        me.name,
        me.node.0,
        common::human_bytes(setup.bytes_per_mn()),
        setup.workload.name(),
        cluster.fabric_name(),
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
            if let Ok(Termination::Request(cn)) = Termination::parse(&msg.payload) {
                let shut = server.revoke(cn)?;
                let name = cluster.cn_name(cn);
                eprintln!(
                    "dmem mn {}: link of {name} terminated on request of node {} ({shut})",
                    me.name, msg.from.node.0
                );
                revoked.insert(name);
                if let Err(e) = executor.block_on(ctx.send(msg.from, &Termination::Done(cn).emit()))
                {
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

/// Loads this MN's share of the records (every replica on it) into `memory` out of band:
/// the protocol's own loader, whose writes to other MNs go nowhere here.
fn load_share(me: &MnNode, setup: &TxnSetup, memory: &ShmMemoryNode) -> anyhow::Result<()> {
    let mapped = MnMemory::mapped(setup.regions.clone(), &[memory])?;
    let mut deployment = setup.deploy(mapped, Recorder::new(Rc::default()))?;
    for (table, key, value) in setup.workload.loader() {
        deployment
            .load(table, key, &value)
            .with_context(|| format!("{}: loading failed", me.name))?;
    }
    Ok(())
}

/// An MN's memory as served to the CNs.
enum Served {
    /// From the tcp fabric's serving loop.
    Tcp(TcpMemoryServer),
    /// As a memfd handed out on a Unix socket; kept here to revoke links.
    Shm(ShmMemoryNode, ShmServer),
    /// The memfd registered with an RDMA NIC, its queue pairs handed out at the `data`
    /// address (fields drop in order: queue pairs, then the registration).
    #[cfg(feature = "rdma")]
    Rdma(
        dmem_rdma::server::RdmaMemoryServer,
        dmem_shm::RdmaRegistration,
    ),
}

impl Served {
    /// Serves `memory` on the cluster's fabric: on tcp from the serving loop at the MN's
    /// `data` address, on shm as a memfd handed out on its socket; says where.
    fn start(
        cluster: &Cluster,
        me: &MnNode,
        memory: ShmMemoryNode,
    ) -> anyhow::Result<(Self, String)> {
        Ok(match cluster.fabric() {
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
            #[cfg(feature = "rdma")]
            Fabric::Rdma { device, gid_index } => {
                let data = me.data()?;
                let device = std::sync::Arc::new(
                    dmem_rdma::device::RdmaDevice::open_with_gid(device.as_deref(), *gid_index)
                        .with_context(|| format!("{}: the rdma fabric", me.name))?,
                );
                let registration = memory
                    .register_rdma(&device)
                    .with_context(|| format!("{}: cannot register its memory", me.name))?;
                let name = device.name().to_owned();
                let server = dmem_rdma::server::RdmaMemoryServer::serve(
                    device,
                    me.node,
                    registration.descriptor(),
                    data,
                )
                .with_context(|| format!("{}: cannot serve memory on {data}", me.name))?;
                (
                    Served::Rdma(server, registration),
                    format!("{name} (queue pairs at {data})"),
                )
            }
            #[cfg(not(feature = "rdma"))]
            Fabric::Rdma { .. } => {
                unreachable!("refused by Cluster::load without the rdma feature")
            }
        })
    }

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
            #[cfg(feature = "rdma")]
            Served::Rdma(server, _) => Ok(format!(
                "{} queue pairs moved to the error state",
                server.revoke(cn)?
            )),
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
            #[cfg(feature = "rdma")]
            Served::Rdma(server, registration) => {
                drop(server);
                drop(registration);
                Ok(())
            }
        }
    }
}

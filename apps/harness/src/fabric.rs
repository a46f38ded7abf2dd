//! A local cluster on any fabric, in one process: the same lock and protocol code driven on
//! the simulator, on shared memory and on tcp over loopback.
//!
//! [`LocalCluster`] makes the MNs of a fabric (simulated; sealed memfd mappings; tcp memory
//! servers on loopback, each serving a mapping), CN contexts as [`AnyContext`]s, and one
//! executor (the simulator's virtual time, or the real-time polling executor), so that a
//! test writes its scenario once and runs it on every fabric:
//!
//! ```no_run
//! # use dmem_harness::fabric::{Fabric, LocalCluster};
//! for fabric in Fabric::ALL {
//!     let cluster = LocalCluster::new(fabric, 2, 2, 1 << 20, 1).unwrap();
//!     let ctx = cluster.context(0, 1).unwrap();
//!     cluster.spawn(&ctx, async move { /* lock or protocol code on `ctx` */ });
//!     cluster.run();
//! }
//! ```
//!
//! Node ids are the simulator's on every fabric: MN `i` is node `i`, CN `c` is node
//! `mns + c`. Deployments are laid out on [`LocalCluster::memory`] through
//! [`dmem_deploy::Protocol::deploy_on`], which maps every MN here, so loads and
//! `read_final` reach them out of band.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::rc::Rc;
use std::str::FromStr;

use dmem_deploy::{AnyContext, DeployError, MnMemory};
use dmem_runtime::Executor;
use dmem_shm::{ShmFabric, ShmMemoryNode};
use dmem_sim::{ClusterConfig, NicProfile, Sim};
use dmem_tcp::{MessageListener, TcpFabric, TcpMemoryServer};
use dmem_verbs::{Clock as _, Endpoint, NodeId, Port, RKey, Verbs as _};

/// A fabric a [`LocalCluster`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fabric {
    /// The deterministic simulator (virtual time).
    Sim,
    /// Shared memory: sealed memfd mappings, real loads, stores and atomics.
    Shm,
    /// tcp over loopback: memory servers on io_uring, one frame per post list.
    Tcp,
    /// An RDMA NIC of this host (feature `rdma`): each MN's shared mapping registered with
    /// the first device and served over loopback TCP, CN contexts with a queue pair to each
    /// MN through the NIC.
    #[cfg(feature = "rdma")]
    Rdma,
}

impl Fabric {
    /// Every fabric that needs no device, simulator first.
    pub const ALL: [Fabric; 3] = [Fabric::Sim, Fabric::Shm, Fabric::Tcp];

    /// Its name on the command line.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Fabric::Sim => "sim",
            Fabric::Shm => "shm",
            Fabric::Tcp => "tcp",
            #[cfg(feature = "rdma")]
            Fabric::Rdma => "rdma",
        }
    }
}

impl fmt::Display for Fabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fabric {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        #[cfg(feature = "rdma")]
        if s == "rdma" {
            return Ok(Fabric::Rdma);
        }
        Self::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown fabric `{s}` (known: sim, shm, tcp)"))
    }
}

/// The MNs of a real fabric.
enum RealMns {
    Shm(Vec<ShmMemoryNode>),
    Tcp(Vec<TcpMemoryServer>),
    #[cfg(feature = "rdma")]
    Rdma(RdmaMns),
}

/// MNs on an RDMA NIC: each MN's shared mapping (loaded and read out of band as on shm)
/// registered with the device and served to CN contexts over loopback TCP. Fields drop in
/// order: the servers' queue pairs, then the registrations, then the mappings.
#[cfg(feature = "rdma")]
struct RdmaMns {
    servers: Vec<dmem_rdma::server::RdmaMemoryServer>,
    _registrations: Vec<dmem_shm::RdmaRegistration>,
    device: std::sync::Arc<dmem_rdma::device::RdmaDevice>,
}

#[cfg(feature = "rdma")]
impl RdmaMns {
    fn serve(nodes: &[ShmMemoryNode]) -> Result<Self, DeployError> {
        let device =
            std::sync::Arc::new(dmem_rdma::device::RdmaDevice::open(None).map_err(fabric_error)?);
        let mut registrations = Vec::new();
        let mut servers = Vec::new();
        for mn in nodes {
            let registered = mn.register_rdma(&device).map_err(fabric_error)?;
            servers.push(
                dmem_rdma::server::RdmaMemoryServer::serve(
                    std::sync::Arc::clone(&device),
                    mn.region().node,
                    registered.descriptor(),
                    "127.0.0.1:0".parse().unwrap(),
                )
                .map_err(fabric_error)?,
            );
            registrations.push(registered);
        }
        Ok(Self {
            servers,
            _registrations: registrations,
            device,
        })
    }

    /// A CN context with a queue pair to every MN, addressing each region by the rkey the
    /// deployment laid it out with.
    fn context(
        &self,
        endpoint: Endpoint,
        regions: &[dmem_verbs::MemoryRegion],
    ) -> Result<AnyContext, DeployError> {
        let ctx = self
            .device
            .context(endpoint, dmem_rdma::ChainLimits::default())
            .map_err(fabric_error)?;
        for (server, region) in self.servers.iter().zip(regions) {
            dmem_rdma::server::connect_memory(&ctx, region.node, server.local_addr())
                .map_err(fabric_error)?;
            ctx.alias_region(region.node, region.rkey);
        }
        Ok(ctx.into())
    }
}

/// MNs and CNs of one fabric in this process, and the executor that runs their tasks.
pub struct LocalCluster {
    fabric: Fabric,
    mns: u16,
    cns: u16,
    sim: Option<Rc<Sim>>,
    real: Option<RealMns>,
    shm: ShmFabric,
    /// One tcp fabric per CN, each listening on loopback for the others' messages.
    tcp: Vec<TcpFabric>,
    _listeners: Vec<MessageListener>,
    /// One tcp fabric per MN for its control messages (link termination), listening on
    /// loopback; every CN knows its address.
    mn_tcp: Vec<TcpFabric>,
    _mn_listeners: Vec<MessageListener>,
    executor: Executor,
    memory: MnMemory,
    /// The tcp and rdma contexts handed out, for the barrier at the end of
    /// [`run`](Self::run).
    barrier_contexts: RefCell<Vec<AnyContext>>,
}

impl fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalCluster")
            .field("fabric", &self.fabric)
            .field("mns", &self.mns)
            .field("cns", &self.cns)
            .finish_non_exhaustive()
    }
}

/// The rkey of MN `i`'s region on a real fabric.
fn rkey(i: u16) -> RKey {
    RKey(0xd3e3_1000 | u32::from(i))
}

fn fabric_error(e: impl ToString) -> DeployError {
    DeployError::Fabric(e.to_string())
}

impl LocalCluster {
    /// `mns` MNs of `bytes_per_mn` bytes and `cns` CNs with `threads` threads each (the
    /// simulator's contexts; real fabrics make a context per call) on `fabric`. The
    /// simulator uses the `cx5` profile and `seed`.
    ///
    /// # Errors
    /// [`DeployError`] if an MN or the simulator cannot be made.
    pub fn new(
        fabric: Fabric,
        mns: u16,
        cns: u16,
        bytes_per_mn: u64,
        seed: u64,
    ) -> Result<Self, DeployError> {
        Self::with_threads(fabric, mns, cns, 1, bytes_per_mn, seed)
    }

    /// As [`new`](Self::new), with `threads` simulated threads per CN.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_threads(
        fabric: Fabric,
        mns: u16,
        cns: u16,
        threads: u16,
        bytes_per_mn: u64,
        seed: u64,
    ) -> Result<Self, DeployError> {
        let (sim, real, memory) = match fabric {
            Fabric::Sim => {
                let sim = Rc::new(Sim::new(
                    ClusterConfig::with_profile(NicProfile::cx5())
                        .mns(mns)
                        .cns(cns)
                        .threads_per_cn(threads)
                        .mn_memory_bytes(bytes_per_mn)
                        .seed(seed),
                )?);
                let memory = MnMemory::sim(&sim);
                (Some(sim), None, memory)
            }
            #[cfg(feature = "rdma")]
            Fabric::Rdma => {
                let nodes = (0..mns)
                    .map(|i| ShmMemoryNode::create(NodeId(i), rkey(i), bytes_per_mn))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(fabric_error)?;
                let regions = nodes.iter().map(ShmMemoryNode::region).collect();
                let memory = MnMemory::mapped(regions, &nodes.iter().collect::<Vec<_>>())?;
                (None, Some(RealMns::Rdma(RdmaMns::serve(&nodes)?)), memory)
            }
            Fabric::Shm | Fabric::Tcp => {
                let nodes = (0..mns)
                    .map(|i| ShmMemoryNode::create(NodeId(i), rkey(i), bytes_per_mn))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(fabric_error)?;
                let regions = nodes.iter().map(ShmMemoryNode::region).collect();
                let memory = MnMemory::mapped(regions, &nodes.iter().collect::<Vec<_>>())?;
                let real = if fabric == Fabric::Shm {
                    RealMns::Shm(nodes)
                } else {
                    RealMns::Tcp(
                        nodes
                            .into_iter()
                            .map(|mn| TcpMemoryServer::serve(mn, "127.0.0.1:0".parse().unwrap()))
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(fabric_error)?,
                    )
                };
                (None, Some(real), memory)
            }
        };
        let (mut tcp, mut listeners) = (Vec::new(), Vec::new());
        let (mut mn_tcp, mut mn_listeners) = (Vec::new(), Vec::new());
        if fabric == Fabric::Tcp {
            let listening = |node| {
                let f = TcpFabric::new(node);
                let l = f
                    .listen("127.0.0.1:0".parse().unwrap())
                    .map_err(fabric_error)?;
                Ok::<_, DeployError>(((f, l.local_addr()), l))
            };
            for c in 0..cns {
                let (f, l) = listening(NodeId(mns + c))?;
                tcp.push(f);
                listeners.push(l);
            }
            for m in 0..mns {
                let (f, l) = listening(NodeId(m))?;
                mn_tcp.push(f);
                mn_listeners.push(l);
            }
            // CNs message each other and the MNs' control endpoints; MNs answer CNs.
            for (f, _) in &tcp {
                for (peer, addr) in tcp.iter().chain(&mn_tcp) {
                    f.add_peer(peer.node(), *addr);
                }
            }
            for (f, _) in &mn_tcp {
                for (peer, addr) in &tcp {
                    f.add_peer(peer.node(), *addr);
                }
            }
        }
        Ok(Self {
            fabric,
            mns,
            cns,
            sim,
            real,
            shm: ShmFabric::new(),
            tcp: tcp.into_iter().map(|(f, _)| f).collect(),
            _listeners: listeners,
            mn_tcp: mn_tcp.into_iter().map(|(f, _)| f).collect(),
            _mn_listeners: mn_listeners,
            executor: Executor::new(),
            memory,
            barrier_contexts: RefCell::new(Vec::new()),
        })
    }

    /// The fabric.
    #[must_use]
    pub fn fabric(&self) -> Fabric {
        self.fabric
    }

    /// The node id of CN `cn`.
    #[must_use]
    pub fn cn(&self, cn: u16) -> NodeId {
        NodeId(self.mns + cn)
    }

    /// The node id of MN `mn`.
    #[must_use]
    pub fn mn(&self, mn: u16) -> NodeId {
        NodeId(mn)
    }

    /// The MN memory to deploy a protocol on (every MN mapped in this process).
    #[must_use]
    pub fn memory(&self) -> MnMemory {
        self.memory.clone()
    }

    /// The memory servers' addresses, on [`Fabric::Tcp`] (MN 0 first).
    #[must_use]
    pub fn server_addrs(&self) -> Vec<std::net::SocketAddr> {
        match &self.real {
            Some(RealMns::Tcp(servers)) => {
                servers.iter().map(TcpMemoryServer::local_addr).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Where CN `cn` receives messages from other nodes, on [`Fabric::Tcp`].
    #[must_use]
    pub fn message_addr(&self, cn: u16) -> Option<std::net::SocketAddr> {
        self._listeners
            .get(usize::from(cn))
            .map(MessageListener::local_addr)
    }

    /// The simulator, on [`Fabric::Sim`].
    #[must_use]
    pub fn sim(&self) -> Option<&Rc<Sim>> {
        self.sim.as_ref()
    }

    /// A context of CN `cn` connected to every MN: on the simulator its thread
    /// `slot % threads`; on a real fabric a new context receiving on port `slot` (each slot
    /// once per CN).
    ///
    /// # Errors
    /// [`DeployError`] if the context cannot be made or connected.
    pub fn context(&self, cn: u16, slot: u16) -> Result<AnyContext, DeployError> {
        let node = self.cn(cn);
        let endpoint = Endpoint {
            node,
            port: Port(slot),
        };
        match (&self.sim, &self.real) {
            (Some(sim), _) => Ok(sim
                .context(node, slot % sim.threads_per_cn().max(1))?
                .into()),
            (None, Some(RealMns::Shm(nodes))) => {
                let mut ctx = self.shm.context(endpoint).map_err(fabric_error)?;
                for mn in nodes {
                    ctx.add_link(mn.link(node).map_err(fabric_error)?)
                        .map_err(fabric_error)?;
                }
                Ok(ctx.into())
            }
            (None, Some(RealMns::Tcp(servers))) => {
                let fabric = self
                    .tcp
                    .get(usize::from(cn))
                    .ok_or_else(|| fabric_error(format!("no CN {cn}")))?;
                let mut ctx = fabric.context(Port(slot)).map_err(fabric_error)?;
                for s in servers {
                    ctx.connect(s.local_addr()).map_err(fabric_error)?;
                }
                let ctx: AnyContext = ctx.into();
                self.barrier_contexts.borrow_mut().push(ctx.clone());
                Ok(ctx)
            }
            #[cfg(feature = "rdma")]
            (None, Some(RealMns::Rdma(mns))) => {
                let ctx = mns.context(endpoint, &self.memory.regions())?;
                self.barrier_contexts.borrow_mut().push(ctx.clone());
                Ok(ctx)
            }
            (None, None) => Err(fabric_error("a cluster without MNs")),
        }
    }

    /// Revokes CN `cn`'s access at MN `mn` (simulator: at once; shm: the mapping's
    /// revocation; tcp: the memory server drops and refuses its connections).
    ///
    /// # Errors
    /// [`DeployError::Fabric`] if the revocation fails.
    pub fn revoke(&self, mn: u16, cn: u16) -> Result<(), DeployError> {
        let (mn_node, cn_node) = (self.mn(mn), self.cn(cn));
        match (&self.sim, &self.real) {
            (Some(sim), _) => sim.revoke(mn_node, cn_node),
            (None, Some(RealMns::Shm(nodes))) => {
                nodes[usize::from(mn)]
                    .revoke(cn_node)
                    .map_err(fabric_error)?;
            }
            (None, Some(RealMns::Tcp(servers))) => {
                servers[usize::from(mn)]
                    .revoke(cn_node)
                    .map_err(fabric_error)?;
            }
            #[cfg(feature = "rdma")]
            (None, Some(RealMns::Rdma(mns))) => {
                mns.servers[usize::from(mn)]
                    .revoke(cn_node)
                    .map_err(fabric_error)?;
            }
            (None, None) => {}
        }
        Ok(())
    }

    /// An MN's side of link termination across processes, as `dmem mn` answers it: until
    /// `until` (`CLOCK_MONOTONIC` ns), every MN's control endpoint
    /// ([`dmem_deploy::process::mn_control`]) answers each request of a
    /// [`MessageLinkTerminator`](dmem_deploy::process::MessageLinkTerminator) (Pandora §3.2.2
    /// step 2) by [`revoke`](Self::revoke)ing the CN there and confirming. Run the future
    /// on the executor of the terminating CN's contexts. On real fabrics (the simulator's
    /// deployments terminate links directly).
    ///
    /// # Errors
    /// [`DeployError::Fabric`] on the simulator, or if a control context cannot be made.
    pub fn answer_link_terminations(
        self: &Rc<Self>,
        until: dmem_verbs::Nanos,
    ) -> Result<impl Future<Output = ()> + 'static, DeployError> {
        use dmem_deploy::process::{Termination, mn_control};
        let controls = (0..self.mns)
            .map(|mn| {
                let at = mn_control(self.mn(mn));
                match (&self.real, self.mn_tcp.get(usize::from(mn))) {
                    (Some(RealMns::Tcp(_)), Some(f)) => {
                        Ok(AnyContext::from(f.context(at.port).map_err(fabric_error)?))
                    }
                    (Some(RealMns::Shm(_)), _) => Ok(AnyContext::from(
                        self.shm.context(at).map_err(fabric_error)?,
                    )),
                    _ => Err(fabric_error(
                        "the simulator terminates links directly (no MN control endpoints)",
                    )),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cluster = Rc::clone(self);
        Ok(async move {
            let clock = dmem_runtime::RealClock;
            while clock.now() < until {
                for (mn, ctx) in (0..).zip(&controls) {
                    while let Ok(Some(msg)) = ctx.try_recv() {
                        let Ok(Termination::Request(cn)) = Termination::parse(&msg.payload) else {
                            continue;
                        };
                        // Confirmed only once revoked: the terminator asks again otherwise.
                        let revoked =
                            cn.0.checked_sub(cluster.mns)
                                .is_some_and(|c| cluster.revoke(mn, c).is_ok());
                        if revoked {
                            let _ = ctx.send(msg.from, &Termination::Done(cn).emit()).await;
                        }
                    }
                }
                clock.sleep(1_000_000).await;
            }
        })
    }

    /// Spawns `task` to run on `ctx`'s CN (the simulator's core of that context, or the
    /// real-time executor).
    pub fn spawn(&self, ctx: &AnyContext, task: impl Future<Output = ()> + 'static) {
        match (ctx, &self.sim) {
            (AnyContext::Sim(c), Some(sim)) => sim.spawn(c, task),
            _ => {
                self.executor.spawn(task);
            }
        }
    }

    /// Runs every spawned task to completion.
    pub fn run(&self) {
        match &self.sim {
            Some(sim) => {
                sim.run_until_idle();
            }
            None => {
                self.executor.run();
                self.tcp_barrier();
            }
        }
    }

    /// Waits until every post list a tcp or rdma context sent without waiting
    /// (`post_detached`: FORD's and Pandora's unlock WRITEs) was applied: one READ per
    /// context and MN behind them on the same connection (queue pair), which the MN serves
    /// in order. Without it, a final read
    /// of MN memory out of band could run ahead of the last unlocks. (The simulator applies
    /// everything before it goes idle; shm applies a post as it is made.)
    fn tcp_barrier(&self) {
        let contexts = self.barrier_contexts.borrow().clone();
        if contexts.is_empty() {
            return;
        }
        let regions = self.memory.regions();
        self.executor.block_on(async move {
            for ctx in &contexts {
                for r in &regions {
                    let at = dmem_verbs::RemoteAddr {
                        node: r.node,
                        rkey: r.rkey,
                        offset: 0,
                    };
                    // A revoked or lost connection has nothing left to apply.
                    let _ = dmem_verbs::VerbsExt::read(ctx, at, 8).await;
                }
            }
        });
    }

    /// Runs `future` to completion on a context's fabric (spawned on `ctx` on the
    /// simulator, with every other task) and returns its output.
    ///
    /// # Panics
    /// If the simulation goes idle before `future` finished (it waits on something that
    /// never happens).
    pub fn block_on<T: 'static>(
        &self,
        ctx: &AnyContext,
        future: impl Future<Output = T> + 'static,
    ) -> T {
        if self.sim.is_none() {
            return self.executor.block_on(future);
        }
        let out = Rc::new(RefCell::new(None));
        let o = Rc::clone(&out);
        self.spawn(ctx, async move {
            *o.borrow_mut() = Some(future.await);
        });
        self.run();
        out.borrow_mut()
            .take()
            .expect("the simulation went idle before the task finished")
    }
}

/// What the fixed-length clients of a real-time test ([`ClientTally::client`]) counted.
#[derive(Debug, Default)]
pub struct ClientTally {
    /// Transactions committed.
    pub committed: std::cell::Cell<u64>,
    /// The workload's conserved quantity the commits added (SmallBank: money), for its
    /// invariant check.
    pub delta: std::cell::Cell<i64>,
    /// Failed attempts by reason ([`crate::failure_reason`]), the last try of a
    /// transaction given up included.
    pub aborts: RefCell<std::collections::BTreeMap<String, u64>>,
    /// Transactions still aborting after every retry, by error: on a loaded host in real
    /// time an outcome, not a fault (the checker and the invariants still judge the run).
    pub given_up: RefCell<std::collections::BTreeMap<String, u64>>,
    /// Clients started and not finished.
    pub running: std::cell::Cell<usize>,
}

impl ClientTally {
    /// A client running `txns` transactions of `workload`'s generator (`id`, `seed`) on
    /// `co`, each tried up to `attempts` times by the benchmarks' retry loop
    /// ([`crate::execute_with_reasons`], retried at once; every attempt begins after the
    /// executor's other futures ran, [`crate::YieldingBegin`]), counted here; it counts as running from this
    /// call on, so a waiter that polls [`running`](Self::running) never sees a client not
    /// yet started as finished.
    ///
    /// # Panics
    /// The returned future panics on a transaction failing with an error that a retry
    /// cannot cure (a protocol fault).
    pub fn client(
        self: &Rc<Self>,
        workload: Rc<dmem_workloads::AnyWorkload>,
        co: dmem_txn::BoxCoordinator,
        id: u16,
        seed: u64,
        txns: usize,
        attempts: u32,
    ) -> impl Future<Output = ()> + 'static {
        use dmem_workloads::{Executed, Outcome, TxnGenerator as _, Workload as _};
        self.running.set(self.running.get() + 1);
        let tally = Rc::clone(self);
        async move {
            let mut co = crate::YieldingBegin(co);
            let mut generator = workload.generator(u32::from(id), seed);
            for _ in 0..txns {
                let txn = generator.next_txn();
                let (executed, reasons) = crate::execute_with_reasons(
                    &*workload,
                    &mut co,
                    &txn,
                    attempts,
                    &mut dmem_workloads::RetryAtOnce,
                )
                .await;
                for reason in reasons {
                    *tally.aborts.borrow_mut().entry(reason).or_default() += 1;
                }
                match executed {
                    Executed::Committed { outcome, .. } => {
                        tally.committed.set(tally.committed.get() + 1);
                        if let Outcome::Commit { delta } = outcome {
                            tally.delta.set(tally.delta.get() + delta);
                        }
                    }
                    Executed::RolledBack { .. } => {}
                    Executed::Failed { error, .. } if error.is_retryable() => {
                        *tally
                            .given_up
                            .borrow_mut()
                            .entry(error.to_string())
                            .or_insert(0) += 1;
                    }
                    Executed::Failed { error, .. } => panic!("a transaction failed: {error}"),
                }
            }
            tally.running.set(tally.running.get() - 1);
        }
    }
}

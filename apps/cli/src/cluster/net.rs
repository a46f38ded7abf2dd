//! One process's side of the cluster's fabric ([`Net`]): contexts for two-sided messages,
//! contexts connected to the MNs' memory (tcp or shm), and the MNs' quit.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use dmem_deploy::AnyContext;
use dmem_deploy::process::{mn_control, ports};
use dmem_runtime::Executor;
use dmem_shm::{MessageServer, MnLink, ShmFabric};
use dmem_tcp::{TcpContext, TcpError, TcpFabric};
use dmem_verbs::{Endpoint, NodeId, Port, Verbs};

use super::config::{Cluster, Fabric, MnNode};
use super::control::Control;

/// Port `port` of `node`.
pub(crate) fn endpoint(node: NodeId, port: Port) -> Endpoint {
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
pub(crate) enum Net {
    Tcp {
        fabric: TcpFabric,
        _listener: dmem_tcp::MessageListener,
    },
    /// tcp's control plane (messages between `control` addresses) with an RDMA device:
    /// contexts connected to the MNs post through the NIC.
    #[cfg(feature = "rdma")]
    Rdma {
        fabric: TcpFabric,
        _listener: dmem_tcp::MessageListener,
        device: dmem_rdma::device::RdmaDevice,
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
    pub(crate) fn new(
        cluster: &Cluster,
        name: &str,
        node: NodeId,
        control: impl FnOnce() -> anyhow::Result<SocketAddr>,
    ) -> anyhow::Result<Self> {
        match cluster.fabric() {
            Fabric::Tcp => {
                let (fabric, listener) = control_plane(cluster, name, node, control()?)?;
                Ok(Net::Tcp {
                    fabric,
                    _listener: listener,
                })
            }
            #[cfg(feature = "rdma")]
            Fabric::Rdma { device, gid_index } => {
                let (fabric, listener) = control_plane(cluster, name, node, control()?)?;
                let device =
                    dmem_rdma::device::RdmaDevice::open_with_gid(device.as_deref(), *gid_index)
                        .with_context(|| format!("{name}: the rdma fabric"))?;
                Ok(Net::Rdma {
                    fabric,
                    _listener: listener,
                    device,
                })
            }
            #[cfg(not(feature = "rdma"))]
            Fabric::Rdma { .. } => {
                unreachable!("refused by Cluster::load without the rdma feature")
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
    pub(crate) fn context(&self, node: NodeId, port: Port) -> anyhow::Result<AnyContext> {
        Ok(match self {
            Net::Tcp { fabric, .. } => fabric.context(port)?.into(),
            #[cfg(feature = "rdma")]
            Net::Rdma { fabric, .. } => fabric.context(port)?.into(),
            Net::Shm { fabric, .. } => fabric.context(endpoint(node, port))?.into(),
        })
    }

    /// A context on `port` connected to every MN `alive` accepts (a failed MN is not
    /// waited for); a MN not serving yet is retried until `deadline`.
    pub(crate) fn connected_to(
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
                    connect_retrying(&mut ctx, mn, deadline)?;
                }
                ctx.into()
            }
            #[cfg(feature = "rdma")]
            Net::Rdma { fabric, device, .. } => {
                let verbs =
                    device.context(endpoint(node, port), dmem_rdma::ChainLimits::default())?;
                for mn in cluster.mns().iter().filter(|m| alive(m.node)) {
                    connect_rdma_retrying(&verbs, mn, deadline)?;
                    verbs.alias_region(mn.node, super::setup::mn_rkey(mn.node));
                }
                dmem_deploy::RdmaCn::with_tcp_messages(verbs, fabric.context(port)?).into()
            }
            Net::Shm { fabric, dir, .. } => {
                let mut ctx = fabric.context(endpoint(node, port))?;
                for mn in cluster.mns().iter().filter(|m| alive(m.node)) {
                    let path = shm_memory_socket(dir, mn.node);
                    let link = retrying(
                        deadline,
                        |e| matches!(e, dmem_shm::ShmError::Os { .. }),
                        || MnLink::connect(&path, node),
                    )
                    .with_context(|| {
                        format!(
                            "cannot map the memory of MN `{}` through {}",
                            mn.name,
                            path.display()
                        )
                    })?;
                    ctx.add_link(link)?;
                }
                ctx.into()
            }
        })
    }

    /// [`connected_to`](Self::connected_to) every MN.
    pub(crate) fn connected(
        &self,
        node: NodeId,
        port: Port,
        cluster: &Cluster,
        deadline: Instant,
    ) -> anyhow::Result<AnyContext> {
        self.connected_to(node, port, cluster, deadline, |_| true)
    }
}

/// Listens for control messages on `control` and knows every other node's `control`
/// address (tcp, and rdma's control plane).
fn control_plane(
    cluster: &Cluster,
    name: &str,
    node: NodeId,
    control: SocketAddr,
) -> anyhow::Result<(TcpFabric, dmem_tcp::MessageListener)> {
    let fabric = TcpFabric::new(node);
    let listener = fabric
        .listen(control)
        .with_context(|| format!("{name}: cannot listen for control messages on {control}"))?;
    for mn in cluster.mns().iter().filter(|m| m.node != node) {
        fabric.add_peer(mn.node, mn.control()?);
    }
    for cn in cluster.cns().iter().filter(|c| c.node != node) {
        fabric.add_peer(cn.node, cn.control()?);
    }
    Ok((fabric, listener))
}

/// Calls `connect` until it succeeds, retrying every 20 ms while the MN is not up yet
/// (`not_up` says which errors mean that) and `deadline` has not passed.
fn retrying<T, E>(
    deadline: Instant,
    not_up: impl Fn(&E) -> bool,
    mut connect: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    loop {
        match connect() {
            Err(e) if not_up(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            done => return done,
        }
    }
}

/// Connects a queue pair of `ctx` to `mn`'s memory (the descriptor exchange at its `data`
/// address), retrying while the MN is not up yet, until `deadline`.
#[cfg(feature = "rdma")]
fn connect_rdma_retrying(
    ctx: &dmem_rdma::device::RdmaContext,
    mn: &MnNode,
    deadline: Instant,
) -> anyhow::Result<()> {
    let data = mn.data()?;
    retrying(
        deadline,
        |e| matches!(e, dmem_rdma::RdmaError::Exchange(_)),
        || dmem_rdma::server::connect_memory(ctx, mn.node, data).map(drop),
    )
    .with_context(|| format!("cannot connect a queue pair to MN `{}` at {data}", mn.name))
}

/// Connects `ctx` to `mn`, retrying while the MN is not up yet, until `deadline`.
pub(crate) fn connect_retrying(
    ctx: &mut TcpContext,
    mn: &MnNode,
    deadline: Instant,
) -> anyhow::Result<()> {
    let data = mn.data()?;
    retrying(
        deadline,
        |e| matches!(e, TcpError::Io { .. }),
        || ctx.connect(data).map(drop),
    )
    .with_context(|| format!("cannot connect to MN `{}` at {data}", mn.name))
}

/// Tells every MN of the cluster but the `dead` ones that the run is over, from `ctx`.
pub(crate) async fn quit_mns(cluster: &Cluster, ctx: &AnyContext, dead: &[NodeId]) {
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
        Fabric::Tcp | Fabric::Rdma { .. } => {
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

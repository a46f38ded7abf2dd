//! An MN process's side of the rdma fabric: its region handed to every CN context that
//! connects, over the control plane's TCP.
//!
//! One-sided verbs need no MN CPU, but each CN context needs a reliable-connected queue pair
//! to the MN, and the two ends learn each other's queue-pair number, packet sequence number
//! and GID (and the CN the region's address and rkey) from a descriptor exchange. The MN
//! listens on its `data` address; a CN context connects, sends its descriptor, and gets the
//! MN's ([`connect_memory`]). The server keeps one passive context per connection (one
//! queue pair each, to a distinct CN context) for as long as it lives.
//!
//! Revocation (Pandora §3.2.4: an MN stops serving a crashed CN) moves that CN's queue
//! pairs to the error state: its requests are no longer answered, and its own queue pairs
//! fail once their transport retries run out.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use dmem_verbs::{Endpoint, NodeId, Port};

use crate::RdmaError;
use crate::chain::ChainLimits;
use crate::descriptor::{RdmaDescriptor, RegionDescriptor};
use crate::device::{RdmaContext, RdmaDevice};

/// How long a connecting CN may take to send its descriptor.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the accept loop looks for connections and requests when idle.
const IDLE_POLL: Duration = Duration::from_millis(1);

/// A request to the serving thread (contexts are not `Send`, so they stay on it).
enum Request {
    /// Revoke every queue pair to this CN; answer how many there were.
    Revoke(NodeId, Sender<Result<usize, String>>),
}

/// An MN's region served to CN contexts on a TCP address; stops when dropped.
pub struct RdmaMemoryServer {
    addr: SocketAddr,
    requests: Sender<Request>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RdmaMemoryServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaMemoryServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl RdmaMemoryServer {
    /// Serves `region` (registered on `device`) as MN `node` to every CN context that
    /// connects to `addr` (port 0 picks a free one; see [`local_addr`](Self::local_addr)).
    ///
    /// # Errors
    /// [`RdmaError::Ibverbs`] naming `bind` when the address cannot be bound.
    pub fn serve(
        device: Arc<RdmaDevice>,
        node: NodeId,
        region: RegionDescriptor,
        addr: SocketAddr,
    ) -> Result<Self, RdmaError> {
        let bind_error = |e: std::io::Error| RdmaError::Ibverbs {
            call: "bind",
            detail: format!("{addr}: {e}"),
        };
        let listener = TcpListener::bind(addr).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let (requests, inbox) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name(format!("dmem-rdma-mn{}", node.0))
            .spawn({
                let stop = Arc::clone(&stop);
                move || serve_loop(&device, node, region, &listener, &inbox, &stop)
            })
            .map_err(|e| RdmaError::Ibverbs {
                call: "thread spawn",
                detail: e.to_string(),
            })?;
        Ok(Self {
            addr,
            requests,
            stop,
            thread: Some(thread),
        })
    }

    /// The address CN contexts connect to.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Revokes CN `cn`'s access: every queue pair to one of its contexts goes to the error
    /// state. Returns how many there were.
    ///
    /// # Errors
    /// [`RdmaError::Ibverbs`] when the device refuses a transition or the server stopped.
    pub fn revoke(&self, cn: NodeId) -> Result<usize, RdmaError> {
        let stopped = || RdmaError::Ibverbs {
            call: "revoke",
            detail: "the memory server stopped".to_owned(),
        };
        let (answer, reply) = mpsc::channel();
        self.requests
            .send(Request::Revoke(cn, answer))
            .map_err(|_| stopped())?;
        reply
            .recv()
            .map_err(|_| stopped())?
            .map_err(|detail| RdmaError::Ibverbs {
                call: "ibv_modify_qp",
                detail,
            })
    }
}

impl Drop for RdmaMemoryServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_loop(
    device: &RdmaDevice,
    node: NodeId,
    region: RegionDescriptor,
    listener: &TcpListener,
    inbox: &Receiver<Request>,
    stop: &AtomicBool,
) {
    // (peer CN, the passive context holding this MN's end of its queue pair)
    let mut served: Vec<(NodeId, RdmaContext)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let mut idle = true;
        match listener.accept() {
            Ok((stream, from)) => {
                idle = false;
                // A passive context only names itself in its descriptor; the port keeps
                // each one's starting packet sequence numbers apart.
                let port = Port(served.len() as u16);
                match accept(device, node, port, region, stream) {
                    Ok((peer, ctx)) => served.push((peer.node, ctx)),
                    // One CN's failed handshake must not stop the MN serving the others.
                    Err(e) => eprintln!("dmem-rdma: MN {}: connection from {from}: {e}", node.0),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => eprintln!("dmem-rdma: MN {}: accept: {e}", node.0),
        }
        while let Ok(Request::Revoke(cn, answer)) = inbox.try_recv() {
            idle = false;
            let mut revoked = 0;
            let mut result = Ok(());
            for (_, ctx) in served.iter().filter(|(peer, _)| *peer == cn) {
                match ctx.revoke(cn) {
                    Ok(true) => revoked += 1,
                    Ok(false) => {}
                    Err(e) => result = Err(e.to_string()),
                }
            }
            let _ = answer.send(result.map(|()| revoked));
        }
        if idle {
            std::thread::sleep(IDLE_POLL);
        }
    }
}

fn accept(
    device: &RdmaDevice,
    node: NodeId,
    port: Port,
    region: RegionDescriptor,
    mut stream: TcpStream,
) -> Result<(RdmaDescriptor, RdmaContext), RdmaError> {
    let io = |e: std::io::Error| RdmaError::Exchange(e.into());
    stream.set_nonblocking(false).map_err(io)?;
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io)?;
    let _ = stream.set_nodelay(true);
    let ctx = device.context(Endpoint { node, port }, ChainLimits::default())?;
    let peer = ctx.accept_over(&mut stream, Some(region))?;
    Ok((peer, ctx))
}

/// Connects `ctx` (a CN context) to MN `mn` served at `addr`: a queue pair to it, and its
/// region learnt, so `ctx` can post to it. Returns the MN's descriptor.
///
/// # Errors
/// [`RdmaError::Exchange`] when the MN cannot be reached or answers with garbage;
/// [`RdmaError::Ibverbs`] when the queue pair cannot be made or connected.
pub fn connect_memory(
    ctx: &RdmaContext,
    mn: NodeId,
    addr: SocketAddr,
) -> Result<RdmaDescriptor, RdmaError> {
    let io = |e: std::io::Error| RdmaError::Exchange(e.into());
    let mut stream = TcpStream::connect_timeout(&addr, HANDSHAKE_TIMEOUT).map_err(io)?;
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io)?;
    let _ = stream.set_nodelay(true);
    ctx.connect_over(&mut stream, mn, None)
}

//! CN side: the fabric of one CN process (its messages) and its execution contexts.

use std::collections::HashMap;
use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use dmem_shm::{MAX_MESSAGE, ShmContext, ShmFabric};
use dmem_verbs::sync::lock_ignoring_poison;
use dmem_verbs::{
    BatchResult, Endpoint, MemoryRegion, Message, NodeId, Port, PostList, Verbs, VerbsError,
    WrOutcome,
};

use crate::TcpError;
use crate::client::{self, MnConn, PartFailure, SendError};
use crate::wire::{self, FrameKind, WireError};

/// The tcp fabric of one CN process: its node id, the receive queues of its contexts, and
/// the addresses of peer CNs for two-sided messages. Cloning is cheap and shares it.
///
/// Messages between contexts of this process are queued directly (through a
/// [`ShmFabric`]'s receive queues); messages to another node travel as `Message` frames over
/// one TCP connection per destination node, made on first use, to the address given by
/// [`add_peer`](Self::add_peer); the destination receives them with
/// [`listen`](Self::listen).
#[derive(Debug, Clone)]
pub struct TcpFabric {
    inner: Arc<FabricInner>,
}

#[derive(Debug)]
struct FabricInner {
    node: NodeId,
    local: ShmFabric,
    peers: Mutex<HashMap<NodeId, SocketAddr>>,
    out: Mutex<HashMap<NodeId, Arc<Mutex<TcpStream>>>>,
}

impl TcpFabric {
    /// The fabric of CN `node`, with no peers yet.
    #[must_use]
    pub fn new(node: NodeId) -> Self {
        Self {
            inner: Arc::new(FabricInner {
                node,
                local: ShmFabric::new(),
                peers: Mutex::new(HashMap::new()),
                out: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// This CN's node id.
    #[must_use]
    pub fn node(&self) -> NodeId {
        self.inner.node
    }

    /// Where the messages of node `node` go (its [`listen`](Self::listen) address).
    pub fn add_peer(&self, node: NodeId, addr: SocketAddr) {
        lock_ignoring_poison(&self.inner.peers).insert(node, addr);
        lock_ignoring_poison(&self.inner.out).remove(&node);
    }

    /// A context that receives on port `port` of this node, connected to no MN yet.
    ///
    /// # Errors
    /// [`TcpError::Shm`] if another live context of this fabric receives there.
    pub fn context(&self, port: Port) -> Result<TcpContext, TcpError> {
        let local = self.inner.local.context(Endpoint {
            node: self.inner.node,
            port,
        })?;
        Ok(TcpContext {
            local,
            fabric: self.clone(),
            links: Vec::new(),
        })
    }

    /// Receives messages for this node's endpoints from other nodes on `bind` (port 0 picks
    /// a free port): a thread accepts connections, one thread per connection delivers its
    /// frames. Dropping the returned listener stops it.
    ///
    /// # Errors
    /// [`TcpError::Io`] if the address cannot be bound or a thread cannot start.
    pub fn listen(&self, bind: SocketAddr) -> Result<MessageListener, TcpError> {
        let listener = TcpListener::bind(bind).map_err(TcpError::io(format!("bind {bind}")))?;
        let addr = listener.local_addr().map_err(TcpError::io("local_addr"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Readers = Arc::default();
        let (fabric, thread_stop, thread_readers) =
            (self.clone(), Arc::clone(&stop), Arc::clone(&readers));
        let accept = std::thread::Builder::new()
            .name(format!("dmem-tcp-msg-{}", self.inner.node.0))
            .spawn(move || {
                for stream in listener.incoming() {
                    if thread_stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let Ok(handle) = stream.try_clone() else {
                        continue;
                    };
                    let fabric = fabric.clone();
                    if let Ok(reader) = std::thread::Builder::new()
                        .name("dmem-tcp-msg-rx".into())
                        .spawn(move || fabric.deliver_frames(stream))
                    {
                        lock_ignoring_poison(&thread_readers).push((handle, reader));
                    }
                }
            })
            .map_err(TcpError::io("spawn the message acceptor"))?;
        Ok(MessageListener {
            addr,
            stop,
            accept: Some(accept),
            readers,
        })
    }

    /// Reads `Message` frames until the peer closes or sends anything else.
    fn deliver_frames(&self, mut stream: TcpStream) {
        while let Ok((FrameKind::Message, body)) = client::read_frame(&mut stream) {
            let Ok((from, to, payload)) = wire::parse_message(&body) else {
                break;
            };
            if to.node == self.inner.node && payload.len() <= MAX_MESSAGE {
                // A message to a port nobody receives on is dropped, like a datagram to a
                // missing queue pair: loss is the protocol's business.
                self.inner.local.deliver(
                    to,
                    Message {
                        from,
                        payload: payload.to_vec(),
                    },
                );
            }
        }
        let _ = stream.shutdown(Shutdown::Both);
    }

    fn send_remote(&self, from: Endpoint, to: Endpoint, payload: &[u8]) -> Result<(), VerbsError> {
        let lost = VerbsError::ConnectionLost { node: to.node };
        let conn = {
            let mut out = lock_ignoring_poison(&self.inner.out);
            match out.get(&to.node) {
                Some(conn) => Arc::clone(conn),
                None => {
                    let addr = *lock_ignoring_poison(&self.inner.peers)
                        .get(&to.node)
                        .ok_or(lost.clone())?;
                    let stream = TcpStream::connect_timeout(&addr, client::CONNECT_TIMEOUT)
                        .map_err(|_| lost.clone())?;
                    let _ = stream.set_nodelay(true);
                    let conn = Arc::new(Mutex::new(stream));
                    out.insert(to.node, Arc::clone(&conn));
                    conn
                }
            }
        };
        let mut frame = Vec::with_capacity(wire::HEADER_LEN + 8 + payload.len());
        wire::put_message(&mut frame, from, to, payload).map_err(|_| {
            VerbsError::MessageTooLarge {
                len: payload.len(),
                max: MAX_MESSAGE,
            }
        })?;
        if lock_ignoring_poison(&conn).write_all(&frame).is_err() {
            // The peer went away; forget the connection so a restarted peer is reached again.
            let mut out = lock_ignoring_poison(&self.inner.out);
            if out.get(&to.node).is_some_and(|c| Arc::ptr_eq(c, &conn)) {
                out.remove(&to.node);
            }
            return Err(lost);
        }
        Ok(())
    }
}

type Readers = Arc<Mutex<Vec<(TcpStream, JoinHandle<()>)>>>;

/// Receives the messages of one node from other nodes (see [`TcpFabric::listen`]).
///
/// Dropping it closes the connections and joins its threads.
#[derive(Debug)]
pub struct MessageListener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    readers: Readers,
}

impl MessageListener {
    /// The address peers send to.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MessageListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => Ipv6Addr::LOCALHOST.into(),
            });
        }
        if TcpStream::connect(wake).is_ok()
            && let Some(accept) = self.accept.take()
        {
            let _ = accept.join();
        }
        let readers = std::mem::take(&mut *lock_ignoring_poison(&self.readers));
        for (stream, reader) in readers {
            let _ = stream.shutdown(Shutdown::Both);
            let _ = reader.join();
        }
    }
}

/// The verbs of one CN execution context on the tcp fabric: one TCP connection (its queue
/// pair) to each memory node it [`connect`](Self::connect)ed to, and a receive queue.
///
/// A post list is split by destination MN, keeping its order; each part travels as one
/// `Post` frame (one doorbell per destination), all parts are sent before any completion is
/// awaited, and the result merges them in list order. If work requests fail, the error
/// names the first failed one of the list; work requests before it on the same MN have
/// landed, the ones after it on that MN have not (the MN stops a frame at its first error).
#[derive(Debug)]
pub struct TcpContext {
    local: ShmContext,
    fabric: TcpFabric,
    links: Vec<MnConn>,
}

impl TcpContext {
    /// Connects this context to the memory node at `addr` (one TCP connection, its queue
    /// pair) and returns the region it serves.
    ///
    /// # Errors
    /// [`TcpError::Io`] if it does not answer within 5 s, [`TcpError::Refused`] if it refuses
    /// this CN (revoked access), [`TcpError::Handshake`] if it is not a dmem-tcp memory
    /// node, [`TcpError::DuplicateLink`] if this context already reaches that node.
    pub fn connect(&mut self, addr: SocketAddr) -> Result<MemoryRegion, TcpError> {
        let conn = MnConn::connect(addr, self.fabric.node())?;
        let region = conn.region;
        if self.links.iter().any(|l| l.region.node == region.node) {
            return Err(TcpError::DuplicateLink(region.node));
        }
        self.links.push(conn);
        Ok(region)
    }

    /// The region of memory node `node`, if this context is connected to it.
    #[must_use]
    pub fn region(&self, node: NodeId) -> Option<MemoryRegion> {
        self.links
            .iter()
            .find(|l| l.region.node == node)
            .map(|l| l.region)
    }

    /// The memory nodes this context is connected to: region and address.
    pub fn links(&self) -> impl Iterator<Item = (MemoryRegion, SocketAddr)> + '_ {
        self.links.iter().map(|l| (l.region, l.peer()))
    }

    /// Whether the connection to `node` is gone (closed by the MN, or the MN died).
    #[must_use]
    pub fn is_lost(&self, node: NodeId) -> bool {
        self.links
            .iter()
            .find(|l| l.region.node == node)
            .is_none_or(MnConn::is_lost)
    }

    /// The fabric this context belongs to.
    #[must_use]
    pub fn fabric(&self) -> &TcpFabric {
        &self.fabric
    }

    async fn post_list(
        &self,
        list: PostList,
        detached: bool,
    ) -> Result<Option<BatchResult>, VerbsError> {
        let wrs = list.finish()?;
        // Work-request indices per destination link, in list order.
        let mut parts: Vec<(usize, Vec<usize>)> = Vec::new();
        for (index, wr) in wrs.iter().enumerate() {
            let node = wr.op.addr().node;
            let Some(at) = self.links.iter().position(|l| l.region.node == node) else {
                return Err(VerbsError::ConnectionLost { node });
            };
            match parts.iter_mut().find(|(link, _)| *link == at) {
                Some((_, indices)) => indices.push(index),
                None => parts.push((at, vec![index])),
            }
        }
        let mut seqs = Vec::with_capacity(parts.len());
        for (at, indices) in &parts {
            let link = &self.links[*at];
            match link.send_post(indices.iter().map(|&i| &wrs[i].op), detached) {
                Ok(seq) => seqs.push(seq),
                Err(e) => {
                    // The parts already sent run on; nobody waits for them.
                    for ((at, _), &seq) in parts.iter().zip(&seqs) {
                        drop(self.links[*at].completion(seq));
                    }
                    return Err(match e {
                        SendError::Lost => VerbsError::ConnectionLost {
                            node: link.region.node,
                        },
                        SendError::Wire(WireError::TooLarge { len, max }) => {
                            VerbsError::MessageTooLarge { len, max }
                        }
                        SendError::Wire(WireError::TooManyWrs { count, max }) => {
                            VerbsError::MessageTooLarge { len: count, max }
                        }
                        SendError::Wire(_) => VerbsError::ConnectionLost {
                            node: link.region.node,
                        },
                    });
                }
            }
        }
        if detached {
            for ((at, _), &seq) in parts.iter().zip(&seqs) {
                drop(self.links[*at].completion(seq));
            }
            return Ok(None);
        }
        let mut outcomes: Vec<Option<WrOutcome>> = vec![None; wrs.len()];
        let mut first_error: Option<(usize, VerbsError)> = None;
        for ((at, indices), seq) in parts.iter().zip(seqs) {
            let link = &self.links[*at];
            let (index, error) = match link.completion(seq).await {
                Ok(done) => {
                    for (&i, outcome) in indices.iter().zip(done) {
                        outcomes[i] = Some(outcome);
                    }
                    continue;
                }
                Err(PartFailure::Wr(failed)) => {
                    let index = indices[failed.index];
                    let addr = wrs[index].op.addr();
                    let error = if failed.code == wire::ERR_MISALIGNED {
                        VerbsError::Misaligned { index, addr }
                    } else {
                        VerbsError::RemoteAccess { index, addr }
                    };
                    (index, error)
                }
                Err(PartFailure::Lost) => (
                    indices[0],
                    VerbsError::ConnectionLost {
                        node: link.region.node,
                    },
                ),
            };
            if first_error.as_ref().is_none_or(|(i, _)| index < *i) {
                first_error = Some((index, error));
            }
        }
        if let Some((_, error)) = first_error {
            return Err(error);
        }
        Ok(Some(BatchResult::new(
            outcomes
                .into_iter()
                .map(|o| o.expect("every work request belongs to one completed part"))
                .collect(),
        )))
    }
}

impl Verbs for TcpContext {
    fn local_endpoint(&self) -> Endpoint {
        self.local.local_endpoint()
    }

    async fn post(&self, list: PostList) -> Result<BatchResult, VerbsError> {
        Ok(self
            .post_list(list, false)
            .await?
            .expect("a waited post returns its result"))
    }

    async fn post_detached(&self, list: PostList) -> Result<(), VerbsError> {
        self.post_list(list, true).await.map(|_| ())
    }

    async fn send(&self, to: Endpoint, payload: &[u8]) -> Result<(), VerbsError> {
        if payload.len() > MAX_MESSAGE {
            return Err(VerbsError::MessageTooLarge {
                len: payload.len(),
                max: MAX_MESSAGE,
            });
        }
        if to.node == self.fabric.node() {
            self.local.send(to, payload).await
        } else {
            self.fabric.send_remote(self.local_endpoint(), to, payload)
        }
    }

    fn recv(&self) -> impl Future<Output = Result<Message, VerbsError>> {
        self.local.recv_future()
    }

    fn try_recv(&self) -> Result<Option<Message>, VerbsError> {
        self.local.try_recv()
    }
}

//! The memory node's serving loop: one thread, one io_uring, every CN connection.
//!
//! The MN's memory is a [`ShmMemoryNode`] (a sealed memfd mapping), and each CN's posts are
//! executed through a shared-memory context holding that CN's link, so READ/WRITE/CAS/FAA
//! are the very atomics of the shm fabric: WRITEs land word by word in increasing address
//! order, READs see "prefix new, suffix old", atomics are `SeqCst` on aligned words, a post
//! ends with a fence. One thread executes every frame of a connection in arrival order, so
//! a connection keeps the order of a reliable-connected queue pair.
//!
//! The loop keeps at most one RECV and one SEND in flight per connection. A RECV fills the
//! connection's receive buffer; every whole frame in it is executed and its completion
//! appended to the connection's pending output, which is sent as one SEND (completions of
//! frames that arrived together leave together). A frame that does not parse gets a
//! `Refused` frame and the connection is closed: a bad peer never panics the server.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use dmem_shm::{ShmContext, ShmFabric, ShmMemoryNode};
use dmem_verbs::sync::lock_ignoring_poison;
use dmem_verbs::{Endpoint, MemoryRegion, NodeId, Port, VerbsError};
use io_uring::{IoUring, opcode, squeue, types};
use slab::Slab;

use crate::TcpError;
use crate::wire::{self, FLAG_DETACHED, FrameKind, HEADER_LEN, RefuseReason};

/// Submission-queue entries of the ring (two per connection are ever in flight).
const RING_ENTRIES: u32 = 256;
/// Initial receive buffer of a connection; it grows to the largest frame received.
const RECV_BUF: usize = 64 << 10;
/// `user_data` of the accept.
const ACCEPT: u64 = u64::MAX;
const TAG_RECV: u64 = 1;
const TAG_SEND: u64 = 2;

/// State shared by the serving thread and the [`TcpMemoryServer`] handle.
#[derive(Debug)]
struct Shared {
    mn: ShmMemoryNode,
    /// CNs whose access was revoked: their hellos are refused from now on.
    revoked: Mutex<HashSet<NodeId>>,
    /// The open connections that said hello: their CN and a handle to shut them down.
    conns: Mutex<HashMap<usize, (NodeId, TcpStream)>>,
    stop: AtomicBool,
}

/// A memory node serving its region over TCP (the wire format and serving loop: the module
/// docs of `src/server.rs`).
///
/// Dropping it stops the serving thread and closes every connection.
#[derive(Debug)]
pub struct TcpMemoryServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl TcpMemoryServer {
    /// Serves `mn`'s region to CNs that connect to `bind` (port 0 picks a free port).
    ///
    /// # Errors
    /// [`TcpError::Io`] if the address cannot be bound; [`TcpError::Ring`] if io_uring is
    /// unavailable.
    pub fn serve(mn: ShmMemoryNode, bind: SocketAddr) -> Result<Self, TcpError> {
        let listener = TcpListener::bind(bind).map_err(TcpError::io(format!("bind {bind}")))?;
        let addr = listener.local_addr().map_err(TcpError::io("local_addr"))?;
        let ring = IoUring::new(RING_ENTRIES).map_err(TcpError::Ring)?;
        let shared = Arc::new(Shared {
            mn,
            revoked: Mutex::new(HashSet::new()),
            conns: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
        });
        let loop_shared = Arc::clone(&shared);
        let node = shared.mn.region().node;
        let thread = std::thread::Builder::new()
            .name(format!("dmem-tcp-mn{}", node.0))
            .spawn(move || Loop::new(ring, listener, loop_shared).run())
            .map_err(TcpError::io("spawn the serving thread"))?;
        Ok(Self {
            addr,
            shared,
            thread: Some(thread),
        })
    }

    /// The address CNs connect to.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The served region, as CNs address it.
    #[must_use]
    pub fn region(&self) -> MemoryRegion {
        self.shared.mn.region()
    }

    /// The memory itself (to load it out of band, or to read the final state).
    #[must_use]
    pub fn memory(&self) -> &ShmMemoryNode {
        &self.shared.mn
    }

    /// Revokes CN `cn`'s access (Pandora §3.2.2, active-link termination): its connections
    /// are shut down and every later hello of `cn` is refused. Returns how many connections
    /// were shut down.
    ///
    /// Once this returns `Ok`, no post of `cn` is executing and none will land: posts that
    /// were already received but not yet executed complete with a remote access error.
    ///
    /// # Errors
    /// [`TcpError::Shm`] if a post was still executing after the wait of
    /// [`ShmMemoryNode::revoke`] (the serving thread finishes any post in far less).
    pub fn revoke(&self, cn: NodeId) -> Result<usize, TcpError> {
        lock_ignoring_poison(&self.shared.revoked).insert(cn);
        self.shared.mn.revoke(cn)?;
        let conns = lock_ignoring_poison(&self.shared.conns);
        let mut shut = 0;
        for (owner, stream) in conns.values() {
            if *owner == cn {
                let _ = stream.shutdown(Shutdown::Both);
                shut += 1;
            }
        }
        Ok(shut)
    }

    /// Number of open connections that completed their hello.
    #[must_use]
    pub fn connections(&self) -> usize {
        lock_ignoring_poison(&self.shared.conns).len()
    }

    /// Stops serving and waits for the serving thread.
    ///
    /// # Errors
    /// [`TcpError::Io`] if the serving loop had failed.
    pub fn stop(mut self) -> Result<(), TcpError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), TcpError> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        self.shared.stop.store(true, Ordering::SeqCst);
        for (_, stream) in lock_ignoring_poison(&self.shared.conns).values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        // Wake the pending accept so the loop sees the flag.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect(wake);
        match thread.join() {
            Ok(result) => result.map_err(TcpError::io("the serving loop")),
            Err(_) => Err(TcpError::Io {
                call: "the serving loop".into(),
                source: std::io::Error::other("the serving thread panicked"),
            }),
        }
    }
}

impl Drop for TcpMemoryServer {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// One connection of the serving loop.
struct Conn {
    stream: TcpStream,
    /// The CN, once it said hello.
    cn: Option<NodeId>,
    /// Receive buffer; bytes `[..filled]` are valid. Never resized while a RECV is in
    /// flight (its pointer is in the kernel's hands then).
    rbuf: Vec<u8>,
    filled: usize,
    recv_busy: bool,
    /// The bytes being sent; never touched while a SEND is in flight.
    out: Vec<u8>,
    sent: usize,
    send_busy: bool,
    /// Completions waiting for the SEND in flight.
    next: Vec<u8>,
    /// Read no more; close once the pending output is sent.
    closing: bool,
}

struct Loop {
    ring: IoUring,
    listener: TcpListener,
    shared: Arc<Shared>,
    conns: Slab<Conn>,
    /// One shared-memory context per CN, holding that CN's link to the memory.
    contexts: HashMap<NodeId, ShmContext>,
    fabric: ShmFabric,
    accept_busy: bool,
}

impl Loop {
    fn new(ring: IoUring, listener: TcpListener, shared: Arc<Shared>) -> Self {
        Self {
            ring,
            listener,
            shared,
            conns: Slab::new(),
            contexts: HashMap::new(),
            fabric: ShmFabric::new(),
            accept_busy: false,
        }
    }

    fn run(mut self) -> std::io::Result<()> {
        self.arm_accept()?;
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            let done: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (user_data, result) in done {
                if user_data == ACCEPT {
                    self.accepted(result)?;
                } else {
                    let key = (user_data >> 2) as usize;
                    match user_data & 3 {
                        TAG_RECV => self.received(key, result)?,
                        _ => self.sent(key, result)?,
                    }
                    self.settle(key)?;
                }
            }
            if self.shared.stop.load(Ordering::SeqCst) {
                for conn in self.conns.iter_mut().map(|(_, c)| c) {
                    conn.closing = true;
                    let _ = conn.stream.shutdown(Shutdown::Both);
                }
                if self.conns.is_empty() && !self.accept_busy {
                    return Ok(());
                }
            }
        }
    }

    /// Pushes one submission, flushing the queue first if it is full.
    ///
    /// # Safety
    /// Every buffer `entry` points to must stay valid and unmoved until its completion.
    unsafe fn push(&mut self, entry: &squeue::Entry) -> std::io::Result<()> {
        loop {
            // SAFETY: the caller keeps the entry's buffers alive until its completion.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    fn arm_accept(&mut self) -> std::io::Result<()> {
        let entry = opcode::Accept::new(
            types::Fd(self.listener.as_raw_fd()),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
        .build()
        .user_data(ACCEPT);
        // SAFETY: no buffer: the peer address is not asked for.
        unsafe { self.push(&entry)? };
        self.accept_busy = true;
        Ok(())
    }

    fn accepted(&mut self, result: i32) -> std::io::Result<()> {
        self.accept_busy = false;
        if result >= 0 {
            // SAFETY: a successful accept returns a new descriptor that nothing else owns.
            let stream = unsafe { TcpStream::from_raw_fd(result) };
            if self.shared.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let _ = stream.set_nodelay(true);
            let key = self.conns.insert(Conn {
                stream,
                cn: None,
                rbuf: vec![0; RECV_BUF],
                filled: 0,
                recv_busy: false,
                out: Vec::new(),
                sent: 0,
                send_busy: false,
                next: Vec::new(),
                closing: false,
            });
            self.arm_recv(key)?;
        }
        if !self.shared.stop.load(Ordering::SeqCst) {
            self.arm_accept()?;
        }
        Ok(())
    }

    fn arm_recv(&mut self, key: usize) -> std::io::Result<()> {
        let conn = &mut self.conns[key];
        let spare = &mut conn.rbuf[conn.filled..];
        let entry = opcode::Recv::new(
            types::Fd(conn.stream.as_raw_fd()),
            spare.as_mut_ptr(),
            spare.len().min(u32::MAX as usize) as u32,
        )
        .build()
        .user_data((key as u64) << 2 | TAG_RECV);
        conn.recv_busy = true;
        // SAFETY: `rbuf` belongs to the connection, which is freed only when no operation
        // is in flight (`settle`), and it is never resized while `recv_busy` is set.
        unsafe { self.push(&entry) }
    }

    fn arm_send(&mut self, key: usize) -> std::io::Result<()> {
        let conn = &mut self.conns[key];
        let rest = &conn.out[conn.sent..];
        let entry = opcode::Send::new(
            types::Fd(conn.stream.as_raw_fd()),
            rest.as_ptr(),
            rest.len().min(u32::MAX as usize) as u32,
        )
        .build()
        .user_data((key as u64) << 2 | TAG_SEND);
        conn.send_busy = true;
        // SAFETY: `out` belongs to the connection, which is freed only when no operation is
        // in flight, and it is not modified while `send_busy` is set.
        unsafe { self.push(&entry) }
    }

    fn received(&mut self, key: usize, result: i32) -> std::io::Result<()> {
        let conn = &mut self.conns[key];
        conn.recv_busy = false;
        if result <= 0 {
            conn.closing = true;
            return Ok(());
        }
        conn.filled += result as usize;
        self.execute_frames(key);
        Ok(())
    }

    fn sent(&mut self, key: usize, result: i32) -> std::io::Result<()> {
        let conn = &mut self.conns[key];
        conn.send_busy = false;
        if result < 0 {
            conn.closing = true;
            conn.out.clear();
            conn.next.clear();
            return Ok(());
        }
        conn.sent += result as usize;
        if conn.sent < conn.out.len() {
            return self.arm_send(key);
        }
        conn.out.clear();
        conn.sent = 0;
        Ok(())
    }

    /// After a completion: send pending output, read on, or free a finished connection.
    fn settle(&mut self, key: usize) -> std::io::Result<()> {
        let conn = &mut self.conns[key];
        if !conn.send_busy && conn.out.is_empty() && !conn.next.is_empty() {
            std::mem::swap(&mut conn.out, &mut conn.next);
            conn.sent = 0;
            self.arm_send(key)?;
        }
        let conn = &mut self.conns[key];
        if !conn.closing && !conn.recv_busy {
            return self.arm_recv(key);
        }
        if conn.closing && !conn.recv_busy && !conn.send_busy && conn.next.is_empty() {
            lock_ignoring_poison(&self.shared.conns).remove(&key);
            let conn = self.conns.remove(key);
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        Ok(())
    }

    /// Executes every whole frame in the receive buffer, in order.
    fn execute_frames(&mut self, key: usize) {
        let mut start = 0;
        loop {
            let conn = &mut self.conns[key];
            let available = conn.filled - start;
            if available < HEADER_LEN || conn.closing {
                break;
            }
            let header_bytes: &[u8; HEADER_LEN] = conn.rbuf[start..start + HEADER_LEN]
                .try_into()
                .expect("slice of HEADER_LEN bytes");
            let (kind, header) = match wire::parse_header(header_bytes) {
                Ok(parsed) => parsed,
                Err(_) => {
                    refuse(conn, RefuseReason::Malformed);
                    break;
                }
            };
            let total = HEADER_LEN + header.body_len.get() as usize;
            if available < total {
                if conn.rbuf.len() < total {
                    // No RECV is in flight here; the frame's size was checked against
                    // MAX_BODY by `parse_header`.
                    conn.rbuf.resize(total, 0);
                }
                break;
            }
            let body = conn.rbuf[start + HEADER_LEN..start + total].to_vec();
            start += total;
            self.execute_frame(key, kind, &header, &body);
        }
        let conn = &mut self.conns[key];
        conn.rbuf.copy_within(start..conn.filled, 0);
        conn.filled -= start;
        if conn.filled == conn.rbuf.len() {
            // A full buffer holds a whole header at least; room for its body was made above.
            conn.rbuf.resize(conn.rbuf.len() * 2, 0);
        }
    }

    fn execute_frame(
        &mut self,
        key: usize,
        kind: FrameKind,
        header: &wire::FrameHeader,
        body: &[u8],
    ) {
        let node = self.shared.mn.region().node;
        match (kind, self.conns[key].cn) {
            (FrameKind::Hello, None) => self.hello(key, body),
            (FrameKind::Post, Some(cn)) => {
                let conn = &mut self.conns[key];
                let Ok(list) = wire::parse_post(node, header.count.get(), body) else {
                    refuse(conn, RefuseReason::Malformed);
                    return;
                };
                let ctx = self
                    .contexts
                    .get(&cn)
                    .expect("a context is made at every accepted hello");
                let result = ctx.post_now(list);
                let seq = header.seq.get();
                if header.flags & FLAG_DETACHED != 0 && result.is_ok() {
                    return;
                }
                match result {
                    Ok(result) => wire::put_completion(&mut conn.next, seq, &result),
                    Err(VerbsError::RemoteAccess { index, .. }) => wire::put_completion_error(
                        &mut conn.next,
                        seq,
                        header.count.get(),
                        wire::ERR_REMOTE_ACCESS,
                        index as u32,
                    ),
                    Err(VerbsError::Misaligned { index, .. }) => wire::put_completion_error(
                        &mut conn.next,
                        seq,
                        header.count.get(),
                        wire::ERR_MISALIGNED,
                        index as u32,
                    ),
                    // An empty list, or anything else a CN of this crate never sends.
                    Err(_) => refuse(conn, RefuseReason::Malformed),
                }
            }
            _ => refuse(&mut self.conns[key], RefuseReason::Malformed),
        }
    }

    fn hello(&mut self, key: usize, body: &[u8]) {
        let conn = &mut self.conns[key];
        let (cn, version) = match wire::parse_hello(body) {
            Ok(hello) => hello,
            Err(_) => return refuse(conn, RefuseReason::Malformed),
        };
        if version != wire::VERSION {
            return refuse(conn, RefuseReason::Version);
        }
        // The link is made under the revoked set's lock, so a concurrent `revoke` either
        // refuses this hello or finds the link and cuts it.
        let revoked = lock_ignoring_poison(&self.shared.revoked);
        if revoked.contains(&cn) {
            drop(revoked);
            return refuse(conn, RefuseReason::Revoked);
        }
        if !self.contexts.contains_key(&cn) {
            let made = self
                .fabric
                .context(Endpoint {
                    node: cn,
                    port: Port(0),
                })
                .map_err(TcpError::from)
                .and_then(|mut ctx| {
                    ctx.add_link(self.shared.mn.link(cn)?)?;
                    Ok(ctx)
                });
            match made {
                Ok(ctx) => {
                    self.contexts.insert(cn, ctx);
                }
                // Out of link slots: this CN cannot be served.
                Err(_) => {
                    drop(revoked);
                    return refuse(conn, RefuseReason::Revoked);
                }
            }
        }
        let Ok(handle) = conn.stream.try_clone() else {
            drop(revoked);
            return refuse(conn, RefuseReason::Malformed);
        };
        lock_ignoring_poison(&self.shared.conns).insert(key, (cn, handle));
        drop(revoked);
        conn.cn = Some(cn);
        wire::put_welcome(&mut conn.next, self.shared.mn.region());
    }
}

/// Queues a `Refused` frame and closes the connection once it is sent.
fn refuse(conn: &mut Conn, reason: RefuseReason) {
    wire::put_refused(&mut conn.next, reason);
    conn.closing = true;
}

//! Sharing a memory node with other processes over a Unix socket.
//!
//! Handshake (all integers little-endian):
//!
//! ```text
//! CN -> MN  hello  (16 B): magic u64 | version u32 | cn node u16 | 0 u16
//! MN -> CN  reply  (40 B): magic u64 | version u32 | status u32 | mn node u16 | 0 u16 |
//!                          rkey u32 | region len u64 | link slot u32 | hugetlb u32
//!           + the memfd in an SCM_RIGHTS control message when status is 0
//! ```
//!
//! The MN then closes the connection; the CN keeps its mapping. Status 1 means the node has
//! no free link slot, 2 that the hello was not understood.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use dmem_verbs::{MemoryRegion, NodeId, RKey};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::mapping::{LAYOUT_VERSION, MAGIC, Mapping};
use crate::{MnLink, ShmError, ShmMemoryNode};

const HELLO_LEN: usize = 16;
const REPLY_LEN: usize = 40;
const STATUS_OK: u32 = 0;
const STATUS_NO_SLOT: u32 = 1;
const STATUS_BAD_HELLO: u32 = 2;
/// How long either side waits for the other during a handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A memory node served on a Unix socket: a thread accepts CN processes and hands each the
/// memfd and a fresh link slot.
///
/// Dropping it stops the thread and removes the socket file; links already handed out keep
/// working (they map the memory themselves).
#[derive(Debug)]
pub struct ShmServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ShmServer {
    /// The socket path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ShmServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept call; it sees `stop` and returns. If the socket file was removed
        // behind our back nothing can wake it: leave the thread detached rather than hang.
        if UnixStream::connect(&self.path).is_ok()
            && let Some(thread) = self.thread.take()
        {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl ShmMemoryNode {
    /// Serves this node to CN processes on a Unix socket at `path` (which must not exist).
    ///
    /// # Errors
    /// [`ShmError::Os`] if the socket cannot be bound or the thread cannot start.
    pub fn serve(&self, path: impl AsRef<Path>) -> Result<ShmServer, ShmError> {
        let path = path.as_ref().to_path_buf();
        let listener = UnixListener::bind(&path).map_err(ShmError::os("bind"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let node = self.clone();
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("dmem-shm-serve-{}", self.region().node.0))
            .spawn(move || {
                for stream in listener.incoming() {
                    if thread_stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        // A CN that fails its handshake learns it from the closed socket.
                        let _ = node.handshake(stream);
                    }
                }
            })
            .map_err(ShmError::os("spawn"))?;
        Ok(ShmServer {
            path,
            stop,
            thread: Some(thread),
        })
    }

    fn handshake(&self, mut stream: UnixStream) -> Result<(), ShmError> {
        stream
            .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
            .map_err(ShmError::os("setsockopt"))?;
        let mut hello = [0u8; HELLO_LEN];
        stream
            .read_exact(&mut hello)
            .map_err(ShmError::os("read"))?;
        let region = self.region();
        let mut reply = Reply {
            status: STATUS_OK,
            region,
            slot: 0,
            hugetlb: self.huge_pages() == crate::HugePages::Hugetlb,
        };
        let good_hello = u64_at(&hello, 0) == MAGIC && u32_at(&hello, 8) == LAYOUT_VERSION as u32;
        if !good_hello {
            reply.status = STATUS_BAD_HELLO;
        } else {
            let cn = NodeId(u16::from_le_bytes([hello[12], hello[13]]));
            match self.alloc_slot(cn) {
                Ok(slot) => reply.slot = slot,
                Err(_) => reply.status = STATUS_NO_SLOT,
            }
        }
        let bytes = reply.encode();
        if reply.status != STATUS_OK {
            return stream.write_all(&bytes).map_err(ShmError::os("write"));
        }
        let fds = [self.mapping().fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(ShmError::Handshake("control buffer too small".into()));
        }
        let sent = rustix::net::sendmsg(
            &stream,
            &[IoSlice::new(&bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .map_err(ShmError::os("sendmsg"))?;
        // The descriptor travelled with the first byte; send any rest plainly.
        stream
            .write_all(&bytes[sent..])
            .map_err(ShmError::os("write"))
    }
}

struct Reply {
    status: u32,
    region: MemoryRegion,
    slot: u32,
    hugetlb: bool,
}

impl Reply {
    fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&(LAYOUT_VERSION as u32).to_le_bytes());
        b[12..16].copy_from_slice(&self.status.to_le_bytes());
        b[16..18].copy_from_slice(&self.region.node.0.to_le_bytes());
        b[20..24].copy_from_slice(&self.region.rkey.0.to_le_bytes());
        b[24..32].copy_from_slice(&self.region.len.to_le_bytes());
        b[32..36].copy_from_slice(&self.slot.to_le_bytes());
        b[36..40].copy_from_slice(&u32::from(self.hugetlb).to_le_bytes());
        b
    }

    fn decode(b: &[u8; REPLY_LEN]) -> Result<Self, ShmError> {
        if u64_at(b, 0) != MAGIC || u32_at(b, 8) != LAYOUT_VERSION as u32 {
            return Err(ShmError::Handshake(
                "the peer is not a dmem-shm memory node of this layout version".into(),
            ));
        }
        Ok(Self {
            status: u32_at(b, 12),
            region: MemoryRegion {
                node: NodeId(u16::from_le_bytes([b[16], b[17]])),
                rkey: RKey(u32_at(b, 20)),
                len: u64_at(b, 24),
            },
            slot: u32_at(b, 32),
            hugetlb: u32_at(b, 36) != 0,
        })
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

impl MnLink {
    /// Connects, as a context of CN `cn`, to a memory node served at `path` by another
    /// process (or this one): receives the memfd through `SCM_RIGHTS`, checks it and maps it.
    ///
    /// # Errors
    /// [`ShmError::Os`] if the socket or the mapping fails, [`ShmError::NoFreeSlot`] if the
    /// node has no slot left, [`ShmError::Handshake`] if the peer's answer is unusable.
    pub fn connect(path: impl AsRef<Path>, cn: NodeId) -> Result<Self, ShmError> {
        let mut stream = UnixStream::connect(path).map_err(ShmError::os("connect"))?;
        stream
            .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
            .map_err(ShmError::os("setsockopt"))?;
        let mut hello = [0u8; HELLO_LEN];
        hello[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        hello[8..12].copy_from_slice(&(LAYOUT_VERSION as u32).to_le_bytes());
        hello[12..14].copy_from_slice(&cn.0.to_le_bytes());
        stream.write_all(&hello).map_err(ShmError::os("write"))?;

        let mut reply = [0u8; REPLY_LEN];
        let mut got = 0;
        let mut fd: Option<OwnedFd> = None;
        while got < REPLY_LEN {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let msg = rustix::net::recvmsg(
                &stream,
                &mut [IoSliceMut::new(&mut reply[got..])],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(ShmError::os("recvmsg"))?;
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(fds) = message {
                    for received in fds {
                        fd.get_or_insert(received);
                    }
                }
            }
            if msg.bytes == 0 {
                return Err(ShmError::Handshake(format!(
                    "the memory node closed the connection after {got} of {REPLY_LEN} bytes"
                )));
            }
            got += msg.bytes;
        }
        let reply = Reply::decode(&reply)?;
        match reply.status {
            STATUS_OK => {}
            STATUS_NO_SLOT => {
                return Err(ShmError::NoFreeSlot {
                    node: reply.region.node,
                    max: crate::MAX_LINKS,
                });
            }
            other => {
                return Err(ShmError::Handshake(format!(
                    "the memory node refused the hello (status {other})"
                )));
            }
        }
        let fd = fd.ok_or_else(|| ShmError::Handshake("no memfd in the reply".into()))?;
        let mapping = Mapping::from_received_fd(fd, reply.hugetlb)?;
        if mapping.data_len() != reply.region.len {
            return Err(ShmError::Handshake(format!(
                "the reply describes {} bytes but the mapping holds {}",
                reply.region.len,
                mapping.data_len()
            )));
        }
        if reply.slot >= crate::MAX_LINKS {
            return Err(ShmError::Handshake(format!(
                "the reply names link slot {} of {}",
                reply.slot,
                crate::MAX_LINKS
            )));
        }
        Ok(Self::new(Arc::new(mapping), reply.region, reply.slot))
    }
}

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

use dmem_layout::bytes::{ByteReader, ByteSink, BytesError, SliceWriter};
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
        match Hello::parse(&hello) {
            Err(_) => reply.status = STATUS_BAD_HELLO,
            Ok(Hello { cn }) => match self.alloc_slot(cn) {
                Ok(slot) => reply.slot = slot,
                Err(_) => reply.status = STATUS_NO_SLOT,
            },
        }
        let bytes = reply.emit();
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

/// A CN's hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hello {
    cn: NodeId,
}

/// The MN's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reply {
    status: u32,
    region: MemoryRegion,
    slot: u32,
    hugetlb: bool,
}

/// The error of a handshake message whose bytes are short or long.
fn bad_length(what: &str, e: BytesError) -> ShmError {
    ShmError::Handshake(format!("the peer's {what}: {e}"))
}

/// Reads the magic and layout version every handshake message starts with.
fn parse_preamble(r: &mut ByteReader<'_>, what: &str) -> Result<(), ShmError> {
    let magic = r.u64().map_err(|e| bad_length(what, e))?;
    let version = r.u32().map_err(|e| bad_length(what, e))?;
    if magic != MAGIC || version != LAYOUT_VERSION as u32 {
        return Err(ShmError::Handshake(format!(
            "the peer is not a dmem-shm {} of this layout version",
            if what == "hello" { "CN" } else { "memory node" }
        )));
    }
    Ok(())
}

fn emit_preamble(w: &mut impl ByteSink) {
    w.put_u64(MAGIC);
    w.put_u32(LAYOUT_VERSION as u32);
}

impl Hello {
    fn emit(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        let mut w = SliceWriter::new(&mut b);
        emit_preamble(&mut w);
        w.put_u16(self.cn.0);
        w.put_zeros(2);
        debug_assert_eq!(w.finish(), Ok(HELLO_LEN));
        b
    }

    fn parse(b: &[u8]) -> Result<Self, ShmError> {
        let mut r = ByteReader::new(b);
        parse_preamble(&mut r, "hello")?;
        let cn = NodeId(r.u16().map_err(|e| bad_length("hello", e))?);
        // The two bytes of padding are not checked.
        r.array::<2>()
            .and_then(|_| r.finish())
            .map_err(|e| bad_length("hello", e))?;
        Ok(Self { cn })
    }
}

impl Reply {
    fn emit(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        let mut w = SliceWriter::new(&mut b);
        emit_preamble(&mut w);
        w.put_u32(self.status);
        w.put_u16(self.region.node.0);
        w.put_zeros(2);
        w.put_u32(self.region.rkey.0);
        w.put_u64(self.region.len);
        w.put_u32(self.slot);
        w.put_u32(u32::from(self.hugetlb));
        debug_assert_eq!(w.finish(), Ok(REPLY_LEN));
        b
    }

    fn parse(b: &[u8]) -> Result<Self, ShmError> {
        let mut r = ByteReader::new(b);
        parse_preamble(&mut r, "reply")?;
        let fields = |r: &mut ByteReader<'_>| -> Result<Self, BytesError> {
            let status = r.u32()?;
            let node = NodeId(r.u16()?);
            r.array::<2>()?; // padding, not checked
            let reply = Self {
                status,
                region: MemoryRegion {
                    node,
                    rkey: RKey(r.u32()?),
                    len: r.u64()?,
                },
                slot: r.u32()?,
                hugetlb: r.u32()? != 0,
            };
            Ok(reply)
        };
        let reply = fields(&mut r).map_err(|e| bad_length("reply", e))?;
        r.finish().map_err(|e| bad_length("reply", e))?;
        Ok(reply)
    }
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
        let hello = Hello { cn }.emit();
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
        let reply = Reply::parse(&reply)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u32, hugetlb: bool) -> Reply {
        Reply {
            status,
            region: MemoryRegion {
                node: NodeId(3),
                rkey: RKey(0x0102_0304),
                len: 1 << 30,
            },
            slot: 17,
            hugetlb,
        }
    }

    #[test]
    fn handshake_messages_round_trip_with_their_layout() {
        let hello = Hello { cn: NodeId(0x0a0b) };
        let b = hello.emit();
        assert_eq!(&b[..8], &MAGIC.to_le_bytes());
        assert_eq!(&b[8..12], &(LAYOUT_VERSION as u32).to_le_bytes());
        assert_eq!(&b[12..], &[0x0b, 0x0a, 0, 0]);
        assert_eq!(Hello::parse(&b).unwrap(), hello);
        for r in [reply(STATUS_OK, true), reply(STATUS_NO_SLOT, false)] {
            let b = r.emit();
            assert_eq!(&b[16..20], &[3, 0, 0, 0]);
            assert_eq!(&b[36..], &[u8::from(r.hugetlb), 0, 0, 0]);
            assert_eq!(Reply::parse(&b).unwrap(), r);
        }
    }

    #[test]
    fn short_long_and_foreign_messages_are_handshake_errors() {
        let hello = Hello { cn: NodeId(1) }.emit();
        let reply = reply(STATUS_OK, false).emit();
        for n in 0..HELLO_LEN {
            assert!(matches!(
                Hello::parse(&hello[..n]),
                Err(ShmError::Handshake(_))
            ));
        }
        for n in 0..REPLY_LEN {
            assert!(matches!(
                Reply::parse(&reply[..n]),
                Err(ShmError::Handshake(_))
            ));
        }
        let mut long = reply.to_vec();
        long.push(0);
        assert!(matches!(Reply::parse(&long), Err(ShmError::Handshake(_))));
        let mut foreign = hello;
        foreign[8] ^= 1;
        assert!(matches!(
            Hello::parse(&foreign),
            Err(ShmError::Handshake(_))
        ));
    }
}

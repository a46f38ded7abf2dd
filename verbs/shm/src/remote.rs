//! Two-sided messages between processes of one host, over Unix stream sockets.
//!
//! Every node that receives has one socket, `<dir>/node-<id>.sock`, served by
//! [`ShmFabric::serve_messages`]; a sender connects once per destination node and keeps the
//! connection. Each message is one frame (integers little-endian):
//!
//! ```text
//! to node u16 | to port u16 | from node u16 | from port u16 | payload len u32 | payload
//! ```
//!
//! A frame for a port that no context of the receiving process listens on is dropped, like a
//! datagram to a missing queue pair: loss is the protocol's business.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use dmem_layout::bytes::{ByteReader, ByteSink, BytesError};
use dmem_verbs::{Endpoint, Message, NodeId, Port, VerbsError};

use crate::{MAX_MESSAGE, ShmError, ShmFabric};
use dmem_verbs::sync::lock_ignoring_poison;

const HEADER: usize = 12;

/// The header of a frame: its endpoints and the payload length after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FrameHeader {
    to: Endpoint,
    from: Endpoint,
    len: u32,
}

impl FrameHeader {
    fn emit_into(&self, w: &mut impl ByteSink) {
        for half in [
            self.to.node.0,
            self.to.port.0,
            self.from.node.0,
            self.from.port.0,
        ] {
            w.put_u16(half);
        }
        w.put_u32(self.len);
    }

    fn parse(b: &[u8]) -> Result<Self, BytesError> {
        let mut r = ByteReader::new(b);
        let endpoint = |r: &mut ByteReader<'_>| -> Result<Endpoint, BytesError> {
            Ok(Endpoint {
                node: NodeId(r.u16()?),
                port: Port(r.u16()?),
            })
        };
        let header = Self {
            to: endpoint(&mut r)?,
            from: endpoint(&mut r)?,
            len: r.u32()?,
        };
        r.finish()?;
        Ok(header)
    }
}

/// The accepted connections (a handle to shut each down) and their reader threads.
type Readers = Arc<Mutex<Vec<(UnixStream, JoinHandle<()>)>>>;

/// Where other processes' message sockets are, and the connections made to them.
#[derive(Debug)]
pub(crate) struct Peers {
    dir: PathBuf,
    conns: HashMap<NodeId, Arc<Mutex<UnixStream>>>,
}

/// The socket of `node`'s messages in `dir`.
#[must_use]
pub fn message_socket(dir: &Path, node: NodeId) -> PathBuf {
    dir.join(format!("node-{}.sock", node.0))
}

/// Sends one message to an endpoint of another process. Blocks only while the kernel's
/// socket buffer is full (the receiver's reader thread drains it).
pub(crate) fn send(
    fabric: &ShmFabric,
    from: Endpoint,
    to: Endpoint,
    payload: &[u8],
) -> Result<(), VerbsError> {
    let lost = VerbsError::ConnectionLost { node: to.node };
    let conn = {
        let mut peers = lock_ignoring_poison(&fabric.inner.peers);
        let Some(peers) = peers.as_mut() else {
            return Err(lost);
        };
        match peers.conns.get(&to.node) {
            Some(conn) => Arc::clone(conn),
            None => {
                let stream = UnixStream::connect(message_socket(&peers.dir, to.node))
                    .map_err(|_| lost.clone())?;
                let conn = Arc::new(Mutex::new(stream));
                peers.conns.insert(to.node, Arc::clone(&conn));
                conn
            }
        }
    };
    let mut frame = Vec::with_capacity(HEADER + payload.len());
    FrameHeader {
        to,
        from,
        len: payload.len() as u32,
    }
    .emit_into(&mut frame);
    frame.put_bytes(payload);
    if lock_ignoring_poison(&conn).write_all(&frame).is_err() {
        // The peer went away; forget the connection so a restarted peer is reached again.
        if let Some(peers) = lock_ignoring_poison(&fabric.inner.peers).as_mut()
            && peers
                .conns
                .get(&to.node)
                .is_some_and(|c| Arc::ptr_eq(c, &conn))
        {
            peers.conns.remove(&to.node);
        }
        return Err(lost);
    }
    Ok(())
}

/// Receives the messages of one node from other processes: a thread accepts connections
/// and one thread per connection delivers its frames to this process's receive queues.
///
/// Dropping it closes the connections, joins the threads and removes the socket file.
#[derive(Debug)]
pub struct MessageServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    readers: Readers,
}

impl MessageServer {
    /// The socket path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for MessageServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept call (see `ShmServer`'s drop for why this may be skipped).
        if UnixStream::connect(&self.path).is_ok()
            && let Some(accept) = self.accept.take()
        {
            let _ = accept.join();
        }
        let readers = std::mem::take(&mut *lock_ignoring_poison(&self.readers));
        for (stream, reader) in readers {
            let _ = stream.shutdown(Shutdown::Both);
            let _ = reader.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl ShmFabric {
    /// Sends messages for endpoints outside this process through the sockets in `dir`
    /// (see [`serve_messages`](Self::serve_messages)), without receiving any.
    pub fn set_message_dir(&self, dir: impl AsRef<Path>) {
        let dir = dir.as_ref().to_path_buf();
        let mut peers = lock_ignoring_poison(&self.inner.peers);
        if peers.as_ref().is_none_or(|p| p.dir != dir) {
            *peers = Some(Peers {
                dir,
                conns: HashMap::new(),
            });
        }
    }

    /// Receives messages for the endpoints of `node` from other processes on
    /// `<dir>/node-<node>.sock` (which must not exist), and sends through `dir` too.
    ///
    /// # Errors
    /// [`ShmError::Os`] if the socket cannot be bound or the thread cannot start.
    pub fn serve_messages(
        &self,
        dir: impl AsRef<Path>,
        node: NodeId,
    ) -> Result<MessageServer, ShmError> {
        self.set_message_dir(&dir);
        let path = message_socket(dir.as_ref(), node);
        let listener = UnixListener::bind(&path).map_err(ShmError::os("bind"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let readers = Readers::default();
        let (fabric, thread_stop, thread_readers) =
            (self.clone(), Arc::clone(&stop), Arc::clone(&readers));
        let accept = std::thread::Builder::new()
            .name(format!("dmem-shm-msg-{}", node.0))
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
                        .name(format!("dmem-shm-msg-{}-rx", node.0))
                        .spawn(move || deliver_frames(&fabric, stream))
                    {
                        lock_ignoring_poison(&thread_readers).push((handle, reader));
                    }
                }
            })
            .map_err(ShmError::os("spawn"))?;
        Ok(MessageServer {
            path,
            stop,
            accept: Some(accept),
            readers,
        })
    }
}

/// Reads frames until the peer closes the connection or sends something malformed.
fn deliver_frames(fabric: &ShmFabric, mut stream: UnixStream) {
    let mut header = [0u8; HEADER];
    while stream.read_exact(&mut header).is_ok() {
        let Ok(FrameHeader { to, from, len }) = FrameHeader::parse(&header) else {
            return;
        };
        let len = len as usize;
        if len > MAX_MESSAGE {
            return;
        }
        let mut payload = vec![0u8; len];
        if stream.read_exact(&mut payload).is_err() {
            return;
        }
        if let Some(mailbox) = fabric.mailbox(to) {
            mailbox.deliver(Message { from, payload });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_headers_round_trip_and_short_ones_are_refused() {
        let h = FrameHeader {
            to: Endpoint {
                node: NodeId(1),
                port: Port(0x0203),
            },
            from: Endpoint {
                node: NodeId(4),
                port: Port(5),
            },
            len: 0x0607_0809,
        };
        let mut b = Vec::new();
        h.emit_into(&mut b);
        assert_eq!(b, [1, 0, 3, 2, 4, 0, 5, 0, 9, 8, 7, 6]);
        assert_eq!(FrameHeader::parse(&b), Ok(h));
        for n in 0..HEADER {
            assert!(matches!(
                FrameHeader::parse(&b[..n]),
                Err(BytesError::Truncated { .. })
            ));
        }
    }
}

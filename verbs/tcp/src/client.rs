//! A CN's connection to one memory node: the queue pair of the tcp fabric.
//!
//! Posting writes one `Post` frame under the connection's write lock (the doorbell); a
//! reader thread reads completions, matches each to its post by sequence number, and wakes
//! the task waiting for it. Wakers are thread-safe, so any executor drives the futures.

use std::collections::HashMap;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

use dmem_verbs::sync::lock_ignoring_poison;
use dmem_verbs::{MemoryRegion, NodeId, WrOutcome};

use crate::TcpError;
use crate::wire::{self, Failed, FrameKind, HEADER_LEN, Shape};

/// How long connecting and the hello may take before the MN counts as not answering.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How a post to one MN ended, short of success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartFailure {
    /// The MN refused a work request.
    Wr(Failed),
    /// The connection is gone.
    Lost,
}

type PartResult = Result<Vec<WrOutcome>, PartFailure>;

#[derive(Debug)]
struct Pending {
    shapes: Vec<Shape>,
    /// Nobody waits (a detached post): the completion is dropped.
    detached: bool,
    waker: Option<Waker>,
    done: Option<PartResult>,
}

#[derive(Debug, Default)]
struct State {
    pending: HashMap<u64, Pending>,
    lost: bool,
}

/// One CN context's connection to one memory node.
#[derive(Debug)]
pub(crate) struct MnConn {
    pub(crate) region: MemoryRegion,
    peer: SocketAddr,
    writer: Mutex<TcpStream>,
    state: Arc<Mutex<State>>,
    seq: AtomicU64,
    reader: Option<JoinHandle<()>>,
    /// Reused frame buffer (the context is used by one thread; the lock is uncontended).
    frame: Mutex<Vec<u8>>,
}

impl MnConn {
    /// Connects to the MN at `peer` as CN `cn` and hand-shakes.
    pub(crate) fn connect(peer: SocketAddr, cn: NodeId) -> Result<Self, TcpError> {
        let mut stream = TcpStream::connect_timeout(&peer, CONNECT_TIMEOUT)
            .map_err(TcpError::io(format!("connect to {peer}")))?;
        stream
            .set_nodelay(true)
            .map_err(TcpError::io("set TCP_NODELAY"))?;
        stream
            .set_read_timeout(Some(CONNECT_TIMEOUT))
            .map_err(TcpError::io("set a read timeout"))?;
        let mut hello = Vec::new();
        wire::put_hello(&mut hello, cn);
        stream
            .write_all(&hello)
            .map_err(TcpError::io(format!("send hello to {peer}")))?;
        let (kind, body) = read_frame(&mut stream).map_err(|e| match e {
            ReadError::Io(source) => TcpError::Io {
                call: format!("await the welcome of {peer}"),
                source,
            },
            ReadError::Wire(source) => TcpError::Handshake {
                peer: peer.to_string(),
                source,
            },
        })?;
        let handshake = |source| TcpError::Handshake {
            peer: peer.to_string(),
            source,
        };
        let region = match kind {
            FrameKind::Welcome => wire::parse_welcome(&body).map_err(handshake)?,
            FrameKind::Refused => {
                return Err(TcpError::Refused {
                    node: peer.to_string(),
                    reason: wire::parse_refused(&body).map_err(handshake)?,
                });
            }
            other => return Err(handshake(wire::WireError::Unexpected(other))),
        };
        stream
            .set_read_timeout(None)
            .map_err(TcpError::io("clear the read timeout"))?;
        let reader_stream = stream
            .try_clone()
            .map_err(TcpError::io("clone the socket"))?;
        let state = Arc::new(Mutex::new(State::default()));
        let reader_state = Arc::clone(&state);
        let reader = std::thread::Builder::new()
            .name(format!("dmem-tcp-cq-{}", region.node.0))
            .spawn(move || read_completions(reader_stream, &reader_state))
            .map_err(TcpError::io("spawn the completion reader"))?;
        Ok(Self {
            region,
            peer,
            writer: Mutex::new(stream),
            state,
            seq: AtomicU64::new(0),
            reader: Some(reader),
            frame: Mutex::new(Vec::new()),
        })
    }

    /// The MN's address.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Whether the connection is gone.
    pub(crate) fn is_lost(&self) -> bool {
        lock_ignoring_poison(&self.state).lost
    }

    /// Sends `ops` as one `Post` frame; returns its sequence number.
    pub(crate) fn send_post<'a>(
        &self,
        ops: impl ExactSizeIterator<Item = &'a dmem_verbs::Op> + Clone,
        detached: bool,
    ) -> Result<u64, SendError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut frame = lock_ignoring_poison(&self.frame);
        frame.clear();
        let shapes = wire::put_post(&mut frame, seq, detached, ops).map_err(SendError::Wire)?;
        {
            // Registered before sending: the completion may arrive before `write_all` returns.
            let mut state = lock_ignoring_poison(&self.state);
            if state.lost {
                return Err(SendError::Lost);
            }
            state.pending.insert(
                seq,
                Pending {
                    shapes,
                    detached,
                    waker: None,
                    done: None,
                },
            );
        }
        if lock_ignoring_poison(&self.writer)
            .write_all(&frame)
            .is_err()
        {
            lock_ignoring_poison(&self.state).pending.remove(&seq);
            return Err(SendError::Lost);
        }
        Ok(seq)
    }

    /// The completion of post `seq`.
    pub(crate) fn completion(&self, seq: u64) -> WaitCompletion<'_> {
        WaitCompletion { conn: self, seq }
    }
}

impl Drop for MnConn {
    fn drop(&mut self) {
        let _ = lock_ignoring_poison(&self.writer).shutdown(Shutdown::Both);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// Why a post could not be sent.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The list does not fit in one frame.
    Wire(wire::WireError),
    /// The connection is gone.
    Lost,
}

/// Resolves with the completion of one post.
pub(crate) struct WaitCompletion<'a> {
    conn: &'a MnConn,
    seq: u64,
}

impl Future for WaitCompletion<'_> {
    type Output = PartResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<PartResult> {
        let mut state = lock_ignoring_poison(&self.conn.state);
        let Some(pending) = state.pending.get_mut(&self.seq) else {
            return Poll::Ready(Err(PartFailure::Lost));
        };
        if pending.done.is_some() {
            let pending = state.pending.remove(&self.seq).expect("looked up above");
            return Poll::Ready(pending.done.expect("checked above"));
        }
        match &mut pending.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for WaitCompletion<'_> {
    fn drop(&mut self) {
        // A caller that stops waiting turns the post into a detached one.
        let mut state = lock_ignoring_poison(&self.conn.state);
        if let Some(pending) = state.pending.get_mut(&self.seq) {
            if pending.done.is_some() {
                state.pending.remove(&self.seq);
            } else {
                pending.detached = true;
                pending.waker = None;
            }
        }
    }
}

pub(crate) enum ReadError {
    Io(std::io::Error),
    Wire(wire::WireError),
}

/// Reads one whole frame (header checked, body of at most `MAX_BODY` bytes).
pub(crate) fn read_frame(stream: &mut impl Read) -> Result<(FrameKind, Vec<u8>), ReadError> {
    let (kind, header, body) = read_frame_full(stream)?;
    let _ = header;
    Ok((kind, body))
}

/// Reads one whole frame and returns its header too.
pub(crate) fn read_frame_full(
    stream: &mut impl Read,
) -> Result<(FrameKind, wire::FrameHeader, Vec<u8>), ReadError> {
    let mut header = [0u8; HEADER_LEN];
    stream.read_exact(&mut header).map_err(ReadError::Io)?;
    let (kind, parsed) = wire::parse_header(&header).map_err(ReadError::Wire)?;
    let mut body = vec![0u8; parsed.body_len.get() as usize];
    stream.read_exact(&mut body).map_err(ReadError::Io)?;
    Ok((kind, parsed, body))
}

/// The reader thread: completes posts until the connection ends or misbehaves, then fails
/// every post still waiting.
fn read_completions(mut stream: TcpStream, state: &Mutex<State>) {
    while let Ok((kind, header, body)) = read_frame_full(&mut stream) {
        if kind != FrameKind::Completion {
            // A `Refused` (access revoked) or anything else ends the connection.
            break;
        }
        let mut guard = lock_ignoring_poison(state);
        let seq = header.seq.get();
        let Some(pending) = guard.pending.get_mut(&seq) else {
            break;
        };
        let Ok(parsed) =
            wire::parse_completion(header.flags, header.count.get(), &body, &pending.shapes)
        else {
            break;
        };
        if pending.detached {
            guard.pending.remove(&seq);
            continue;
        }
        pending.done = Some(parsed.map_err(PartFailure::Wr));
        let waker = pending.waker.take();
        drop(guard);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
    let wakers: Vec<Waker> = {
        let mut guard = lock_ignoring_poison(state);
        guard.lost = true;
        guard.pending.retain(|_, p| !p.detached);
        guard
            .pending
            .values_mut()
            .filter(|p| p.done.is_none())
            .filter_map(|p| {
                p.done = Some(Err(PartFailure::Lost));
                p.waker.take()
            })
            .collect()
    };
    for waker in wakers {
        waker.wake();
    }
}

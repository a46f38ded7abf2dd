//! The wire format of the tcp fabric.
//!
//! Every frame is a 24-byte [`FrameHeader`] and a body of `body_len` bytes. All integers are
//! little-endian and every layout is `#[repr(C)]` of byte-aligned zerocopy integers, so a
//! header or record is read in place from any offset of a receive buffer (a body is walked
//! with `dmem_layout::bytes::ByteReader`, the workspace's one checked reader) and never
//! transmuted from unchecked bytes: parsing checks the magic, the kind, the body length
//! against [`MAX_BODY`] (before anything is allocated), the work-request count against
//! [`MAX_WRS`], every op code and every length, and refuses trailing bytes.
//!
//! | kind | direction | body |
//! |---|---|---|
//! | `Hello` | CN → MN, first frame | [`HelloBody`]: CN node id, protocol version |
//! | `Welcome` | MN → CN | [`RegionDesc`]: MN node id, rkey, region length |
//! | `Refused` | MN → CN, then the MN closes | [`RefusedBody`]: why |
//! | `Post` | CN → MN | `count` × ([`WrHeader`] + a WRITE's data) — one post list to one MN |
//! | `Completion` | MN → CN | per work request in order: a READ's bytes, an atomic's old value (8 bytes), nothing for a WRITE; or, with flag [`FLAG_ERROR`], one [`ErrorBody`] |
//! | `Message` | CN → CN | [`MessageHeader`] + payload |
//!
//! A `Post` with [`FLAG_DETACHED`] gets no `Completion` (an unsignaled list whose outcome
//! the CN does not need, `Verbs::post_detached`); it still executes in order with the
//! connection's other posts.

use dmem_layout::bytes::{ByteReader, BytesError};
use dmem_verbs::{
    BatchResult, Endpoint, MemoryRegion, NodeId, Op, Port, PostList, RKey, RemoteAddr,
};
use dmem_verbs::{ReadBytes, WrOutcome};
use static_assertions::const_assert_eq;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `dmtp` in ASCII: the first four bytes of every frame.
pub const MAGIC: u32 = u32::from_le_bytes(*b"dmtp");
/// Version of this wire format, exchanged in `Hello`.
pub const VERSION: u16 = 1;
/// Largest frame body in bytes (a post list's requests and WRITE data, or its READ bytes).
pub const MAX_BODY: usize = 16 << 20;
/// Most work requests in one `Post` frame.
pub const MAX_WRS: usize = 4096;
/// Bytes of a frame header.
pub const HEADER_LEN: usize = size_of::<FrameHeader>();

/// `Post` flag: send no completion.
pub const FLAG_DETACHED: u8 = 1;
/// `Completion` flag: the body is an [`ErrorBody`].
pub const FLAG_ERROR: u8 = 1;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// CN → MN: who I am.
    Hello = 1,
    /// MN → CN: the region you may address.
    Welcome = 2,
    /// MN → CN: refused; the connection closes.
    Refused = 3,
    /// CN → MN: one post list.
    Post = 4,
    /// MN → CN: the outcomes of one post list.
    Completion = 5,
    /// CN → CN: a two-sided message.
    Message = 6,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Hello,
            2 => Self::Welcome,
            3 => Self::Refused,
            4 => Self::Post,
            5 => Self::Completion,
            6 => Self::Message,
            _ => return None,
        })
    }
}

/// The header of every frame.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct FrameHeader {
    /// [`MAGIC`].
    pub magic: U32,
    /// A [`FrameKind`].
    pub kind: u8,
    /// [`FLAG_DETACHED`] or [`FLAG_ERROR`], by kind.
    pub flags: u8,
    /// Work requests in a `Post` or `Completion`; 0 otherwise.
    pub count: U16,
    /// Bytes of body after the header.
    pub body_len: U32,
    /// Reserved, 0.
    pub reserved: U32,
    /// Sequence number of a post list, echoed by its completion.
    pub seq: U64,
}
const_assert_eq!(size_of::<FrameHeader>(), 24);

/// `Hello` body.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct HelloBody {
    /// The CN's node id.
    pub cn: U16,
    /// [`VERSION`].
    pub version: U16,
    /// Reserved, 0.
    pub reserved: U32,
}
const_assert_eq!(size_of::<HelloBody>(), 8);

/// `Welcome` body: the memory region the CN may address.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct RegionDesc {
    /// The MN's node id.
    pub node: U16,
    /// Reserved, 0.
    pub reserved: U16,
    /// The region's rkey.
    pub rkey: U32,
    /// Its length in bytes.
    pub len: U64,
}
const_assert_eq!(size_of::<RegionDesc>(), 16);

/// Why an MN refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[repr(u8)]
pub enum RefuseReason {
    /// The CN's access was revoked (Pandora §3.2.2, active-link termination).
    #[error("this CN's access was revoked")]
    Revoked = 1,
    /// A frame did not parse, or came out of order.
    #[error("malformed or unexpected frame")]
    Malformed = 2,
    /// The CN speaks another wire version.
    #[error("unsupported wire version")]
    Version = 3,
}

/// `Refused` body.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct RefusedBody {
    /// A [`RefuseReason`].
    pub reason: u8,
    /// Reserved, 0.
    pub reserved: [u8; 7],
}
const_assert_eq!(size_of::<RefusedBody>(), 8);

/// One work request of a `Post`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct WrHeader {
    /// 1 READ, 2 WRITE, 3 CAS, 4 FAA.
    pub op: u8,
    /// Reserved, 0.
    pub reserved: [u8; 3],
    /// READ: bytes to read; WRITE: bytes of data that follow this header; atomics: 8.
    pub len: U32,
    /// The region's rkey.
    pub rkey: U32,
    /// Reserved, 0.
    pub reserved2: U32,
    /// Byte offset in the region.
    pub offset: U64,
    /// CAS: expected value; FAA: the addend.
    pub a: U64,
    /// CAS: the value swapped in.
    pub b: U64,
}
const_assert_eq!(size_of::<WrHeader>(), 40);

const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;
const OP_CAS: u8 = 3;
const OP_FAA: u8 = 4;

/// What went wrong at the MN, in a `Completion` with [`FLAG_ERROR`].
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct ErrorBody {
    /// 1: remote access error (bad rkey, out of bounds, revoked); 2: misaligned atomic.
    pub code: u8,
    /// Reserved, 0.
    pub reserved: [u8; 3],
    /// Index of the failed work request in the posted list.
    pub index: U32,
}
const_assert_eq!(size_of::<ErrorBody>(), 8);

/// [`ErrorBody::code`]: a remote access error.
pub const ERR_REMOTE_ACCESS: u8 = 1;
/// [`ErrorBody::code`]: a misaligned atomic.
pub const ERR_MISALIGNED: u8 = 2;

/// `Message` header: addresses of a two-sided message.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct MessageHeader {
    /// Destination node.
    pub to_node: U16,
    /// Destination port.
    pub to_port: U16,
    /// Sender node.
    pub from_node: U16,
    /// Sender port.
    pub from_port: U16,
}
const_assert_eq!(size_of::<MessageHeader>(), 8);

/// A frame or record that does not parse. Refused, never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The first four bytes are not [`MAGIC`].
    #[error("bad magic {found:#010x} (not a dmem-tcp peer?)")]
    BadMagic {
        /// What was there.
        found: u32,
    },
    /// An unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A frame kind that is not expected here.
    #[error("unexpected {0:?} frame")]
    Unexpected(FrameKind),
    /// A body longer than [`MAX_BODY`].
    #[error("frame body of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Declared or needed length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More work requests than [`MAX_WRS`].
    #[error("{count} work requests in one frame exceed the limit of {max}")]
    TooManyWrs {
        /// Declared count.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The body ends before what it declares.
    #[error("body truncated: {what} needs {need} more bytes, {have} left")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes left.
        have: usize,
    },
    /// Bytes after the last record.
    #[error("{0} trailing bytes after the last record")]
    Trailing(usize),
    /// An unknown op code.
    #[error("work request {index}: unknown op code {op}")]
    UnknownOp {
        /// Position in the list.
        index: usize,
        /// The code.
        op: u8,
    },
    /// An atomic whose length field is not 8.
    #[error("work request {index}: atomic of {len} bytes (must be 8)")]
    AtomicLen {
        /// Position in the list.
        index: usize,
        /// Its length field.
        len: u32,
    },
    /// A completion that does not answer the post list it names.
    #[error("completion does not match its post list: {0}")]
    Mismatch(&'static str),
    /// An unknown refusal or error code.
    #[error("unknown code {0}")]
    UnknownCode(u8),
}

/// Checks a header read off the wire: magic, kind, body length.
///
/// # Errors
/// [`WireError::BadMagic`], [`WireError::UnknownKind`], [`WireError::TooLarge`].
pub fn parse_header(bytes: &[u8; HEADER_LEN]) -> Result<(FrameKind, FrameHeader), WireError> {
    let header = FrameHeader::read_from_bytes(bytes).map_err(|_| WireError::Truncated {
        what: "header",
        need: HEADER_LEN,
        have: bytes.len(),
    })?;
    if header.magic.get() != MAGIC {
        return Err(WireError::BadMagic {
            found: header.magic.get(),
        });
    }
    let kind = FrameKind::from_u8(header.kind).ok_or(WireError::UnknownKind(header.kind))?;
    let len = header.body_len.get() as usize;
    if len > MAX_BODY {
        return Err(WireError::TooLarge { len, max: MAX_BODY });
    }
    Ok((kind, header))
}

/// The header of a frame with `body_len` bytes of body, appended to `out`.
fn put_header(
    out: &mut Vec<u8>,
    kind: FrameKind,
    flags: u8,
    count: u16,
    body_len: usize,
    seq: u64,
) {
    let header = FrameHeader {
        magic: MAGIC.into(),
        kind: kind as u8,
        flags,
        count: count.into(),
        body_len: U32::new(body_len as u32),
        reserved: 0.into(),
        seq: seq.into(),
    };
    out.extend_from_slice(header.as_bytes());
}

impl From<BytesError> for WireError {
    fn from(e: BytesError) -> Self {
        match e {
            BytesError::Trailing { extra, .. } => WireError::Trailing(extra),
            BytesError::Truncated { wanted, left, .. } | BytesError::Full { wanted, left, .. } => {
                WireError::Truncated {
                    what: "body",
                    need: wanted,
                    have: left,
                }
            }
        }
    }
}

/// `n` bytes of `what` at the reader's position.
fn take_bytes<'a>(
    r: &mut ByteReader<'a>,
    n: usize,
    what: &'static str,
) -> Result<&'a [u8], WireError> {
    r.bytes(n).map_err(|e| match WireError::from(e) {
        WireError::Truncated { need, have, .. } => WireError::Truncated { what, need, have },
        other => other,
    })
}

/// The `T` (a zerocopy record) at the reader's position.
fn take<'a, T: FromBytes + KnownLayout + Immutable + Unaligned>(
    r: &mut ByteReader<'a>,
    what: &'static str,
) -> Result<&'a T, WireError> {
    let bytes = take_bytes(r, size_of::<T>(), what)?;
    T::ref_from_bytes(bytes).map_err(|_| WireError::Truncated {
        what,
        need: size_of::<T>(),
        have: bytes.len(),
    })
}

/// Appends a `Hello` frame.
pub fn put_hello(out: &mut Vec<u8>, cn: NodeId) {
    let body = HelloBody {
        cn: cn.0.into(),
        version: VERSION.into(),
        reserved: 0.into(),
    };
    put_header(out, FrameKind::Hello, 0, 0, size_of::<HelloBody>(), 0);
    out.extend_from_slice(body.as_bytes());
}

/// Parses a `Hello` body: the CN's node id and wire version.
///
/// # Errors
/// A truncated body or trailing bytes.
pub fn parse_hello(body: &[u8]) -> Result<(NodeId, u16), WireError> {
    let mut r = ByteReader::new(body);
    let hello: &HelloBody = take(&mut r, "hello")?;
    r.finish()?;
    Ok((NodeId(hello.cn.get()), hello.version.get()))
}

/// Appends a `Welcome` frame describing `region`.
pub fn put_welcome(out: &mut Vec<u8>, region: MemoryRegion) {
    let body = RegionDesc {
        node: region.node.0.into(),
        reserved: 0.into(),
        rkey: region.rkey.0.into(),
        len: region.len.into(),
    };
    put_header(out, FrameKind::Welcome, 0, 0, size_of::<RegionDesc>(), 0);
    out.extend_from_slice(body.as_bytes());
}

/// Parses a `Welcome` body.
///
/// # Errors
/// A truncated body or trailing bytes.
pub fn parse_welcome(body: &[u8]) -> Result<MemoryRegion, WireError> {
    let mut r = ByteReader::new(body);
    let desc: &RegionDesc = take(&mut r, "welcome")?;
    r.finish()?;
    Ok(MemoryRegion {
        node: NodeId(desc.node.get()),
        rkey: RKey(desc.rkey.get()),
        len: desc.len.get(),
    })
}

/// Appends a `Refused` frame.
pub fn put_refused(out: &mut Vec<u8>, reason: RefuseReason) {
    let body = RefusedBody {
        reason: reason as u8,
        reserved: [0; 7],
    };
    put_header(out, FrameKind::Refused, 0, 0, size_of::<RefusedBody>(), 0);
    out.extend_from_slice(body.as_bytes());
}

/// Parses a `Refused` body.
///
/// # Errors
/// A truncated body, trailing bytes or an unknown reason.
pub fn parse_refused(body: &[u8]) -> Result<RefuseReason, WireError> {
    let mut r = ByteReader::new(body);
    let refused: &RefusedBody = take(&mut r, "refused")?;
    r.finish()?;
    Ok(match refused.reason {
        1 => RefuseReason::Revoked,
        2 => RefuseReason::Malformed,
        3 => RefuseReason::Version,
        other => return Err(WireError::UnknownCode(other)),
    })
}

/// What a completion holds for one work request, as its post list says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A READ of this many bytes.
    Bytes(u32),
    /// An atomic's old value.
    Atomic,
    /// A WRITE: nothing.
    Written,
}

impl Shape {
    fn of(op: &Op) -> Self {
        match op {
            Op::Read { len, .. } => Self::Bytes(*len),
            Op::Write { .. } => Self::Written,
            Op::Cas { .. } | Op::Faa { .. } => Self::Atomic,
        }
    }

    fn reply_len(self) -> usize {
        match self {
            Self::Bytes(n) => n as usize,
            Self::Atomic => 8,
            Self::Written => 0,
        }
    }
}

/// Appends a `Post` frame of `ops` (all to one MN) and returns the shape of its completion.
///
/// # Errors
/// [`WireError::TooManyWrs`], or [`WireError::TooLarge`] if the frame or its completion
/// would exceed [`MAX_BODY`]; nothing is appended then.
pub fn put_post<'a>(
    out: &mut Vec<u8>,
    seq: u64,
    detached: bool,
    ops: impl ExactSizeIterator<Item = &'a Op> + Clone,
) -> Result<Vec<Shape>, WireError> {
    let count = ops.len();
    if count > MAX_WRS {
        return Err(WireError::TooManyWrs {
            count,
            max: MAX_WRS,
        });
    }
    let shapes: Vec<Shape> = ops.clone().map(Shape::of).collect();
    let body_len: usize = ops
        .clone()
        .map(|op| match op {
            Op::Write { data, .. } => size_of::<WrHeader>().saturating_add(data.len()),
            _ => size_of::<WrHeader>(),
        })
        .fold(0usize, usize::saturating_add);
    let reply_len = shapes
        .iter()
        .map(|s| s.reply_len())
        .fold(0usize, usize::saturating_add);
    for len in [body_len, reply_len] {
        if len > MAX_BODY {
            return Err(WireError::TooLarge { len, max: MAX_BODY });
        }
    }
    out.reserve(HEADER_LEN + body_len);
    let flags = if detached { FLAG_DETACHED } else { 0 };
    put_header(out, FrameKind::Post, flags, count as u16, body_len, seq);
    for op in ops {
        let addr = op.addr();
        let (code, len, a, b) = match op {
            Op::Read { len, .. } => (OP_READ, *len, 0, 0),
            Op::Write { data, .. } => (OP_WRITE, data.len() as u32, 0, 0),
            Op::Cas { expect, swap, .. } => (OP_CAS, 8, *expect, *swap),
            Op::Faa { add, .. } => (OP_FAA, 8, *add, 0),
        };
        let wr = WrHeader {
            op: code,
            reserved: [0; 3],
            len: len.into(),
            rkey: addr.rkey.0.into(),
            reserved2: 0.into(),
            offset: addr.offset.into(),
            a: a.into(),
            b: b.into(),
        };
        out.extend_from_slice(wr.as_bytes());
        if let Op::Write { data, .. } = op {
            out.extend_from_slice(data);
        }
    }
    Ok(shapes)
}

/// Parses a `Post` body of `count` work requests addressed to MN `node` into a post list.
///
/// # Errors
/// [`WireError::TooManyWrs`], a truncated record, an unknown op, an atomic whose length is
/// not 8, a READ whose bytes would exceed [`MAX_BODY`], or trailing bytes.
pub fn parse_post(node: NodeId, count: u16, body: &[u8]) -> Result<PostList, WireError> {
    let count = usize::from(count);
    if count > MAX_WRS {
        return Err(WireError::TooManyWrs {
            count,
            max: MAX_WRS,
        });
    }
    let mut r = ByteReader::new(body);
    let mut list = PostList::with_capacity(count);
    let mut reply_len = 0usize;
    for index in 0..count {
        let wr: &WrHeader = take(&mut r, "work request")?;
        let addr = RemoteAddr {
            node,
            rkey: RKey(wr.rkey.get()),
            offset: wr.offset.get(),
        };
        let len = wr.len.get();
        match wr.op {
            OP_READ => {
                reply_len = reply_len.saturating_add(len as usize);
                if reply_len > MAX_BODY {
                    return Err(WireError::TooLarge {
                        len: reply_len,
                        max: MAX_BODY,
                    });
                }
                list.read(addr, len);
            }
            OP_WRITE => {
                let data = take_bytes(&mut r, len as usize, "write data")?;
                list.write(addr, data);
            }
            OP_CAS | OP_FAA if len != 8 => return Err(WireError::AtomicLen { index, len }),
            OP_CAS => {
                list.cas(addr, wr.a.get(), wr.b.get());
            }
            OP_FAA => {
                list.faa(addr, wr.a.get());
            }
            op => return Err(WireError::UnknownOp { index, op }),
        }
    }
    r.finish()?;
    Ok(list)
}

/// Appends the `Completion` of post `seq` that succeeded with `result`.
pub fn put_completion(out: &mut Vec<u8>, seq: u64, result: &BatchResult) {
    let count = result.len();
    let body_len: usize = (0..count)
        .map(|i| match result.outcome(dmem_verbs::WrId(i)) {
            WrOutcome::Bytes(b) => b.len(),
            WrOutcome::Atomic(_) => 8,
            WrOutcome::Written => 0,
        })
        .sum();
    put_header(out, FrameKind::Completion, 0, count as u16, body_len, seq);
    for i in 0..count {
        match result.outcome(dmem_verbs::WrId(i)) {
            WrOutcome::Bytes(b) => out.extend_from_slice(b),
            WrOutcome::Atomic(v) => out.extend_from_slice(&v.to_le_bytes()),
            WrOutcome::Written => {}
        }
    }
}

/// Appends the `Completion` of post `seq` whose work request `index` failed with `code`.
pub fn put_completion_error(out: &mut Vec<u8>, seq: u64, count: u16, code: u8, index: u32) {
    let body = ErrorBody {
        code,
        reserved: [0; 3],
        index: index.into(),
    };
    put_header(
        out,
        FrameKind::Completion,
        FLAG_ERROR,
        count,
        size_of::<ErrorBody>(),
        seq,
    );
    out.extend_from_slice(body.as_bytes());
}

/// A work request the MN refused: its index in the posted list and the error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    /// Index of the failed work request.
    pub index: usize,
    /// [`ERR_REMOTE_ACCESS`] or [`ERR_MISALIGNED`].
    pub code: u8,
}

/// Parses a `Completion` against the shapes its post list expects.
///
/// # Errors
/// A count, length or error body that does not match the post list.
pub fn parse_completion(
    flags: u8,
    count: u16,
    body: &[u8],
    shapes: &[Shape],
) -> Result<Result<Vec<WrOutcome>, Failed>, WireError> {
    if usize::from(count) != shapes.len() {
        return Err(WireError::Mismatch("work-request count"));
    }
    let mut r = ByteReader::new(body);
    if flags & FLAG_ERROR != 0 {
        let error: &ErrorBody = take(&mut r, "error")?;
        r.finish()?;
        let index = error.index.get() as usize;
        if index >= shapes.len() {
            return Err(WireError::Mismatch("failed index out of the list"));
        }
        if !matches!(error.code, ERR_REMOTE_ACCESS | ERR_MISALIGNED) {
            return Err(WireError::UnknownCode(error.code));
        }
        return Ok(Err(Failed {
            index,
            code: error.code,
        }));
    }
    let mut outcomes = Vec::with_capacity(shapes.len());
    for shape in shapes {
        outcomes.push(match *shape {
            Shape::Bytes(n) => WrOutcome::Bytes(ReadBytes::from_slice(take_bytes(
                &mut r,
                n as usize,
                "read bytes",
            )?)),
            Shape::Atomic => {
                let v: &U64 = take(&mut r, "atomic value")?;
                WrOutcome::Atomic(v.get())
            }
            Shape::Written => WrOutcome::Written,
        });
    }
    r.finish()?;
    Ok(Ok(outcomes))
}

/// Appends a `Message` frame.
///
/// # Errors
/// [`WireError::TooLarge`] if the payload exceeds [`MAX_BODY`] with its header.
pub fn put_message(
    out: &mut Vec<u8>,
    from: Endpoint,
    to: Endpoint,
    payload: &[u8],
) -> Result<(), WireError> {
    let body_len = size_of::<MessageHeader>() + payload.len();
    if body_len > MAX_BODY {
        return Err(WireError::TooLarge {
            len: body_len,
            max: MAX_BODY,
        });
    }
    let header = MessageHeader {
        to_node: to.node.0.into(),
        to_port: to.port.0.into(),
        from_node: from.node.0.into(),
        from_port: from.port.0.into(),
    };
    put_header(out, FrameKind::Message, 0, 0, body_len, 0);
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// Parses a `Message` body: sender, destination, payload.
///
/// # Errors
/// A truncated header.
pub fn parse_message(body: &[u8]) -> Result<(Endpoint, Endpoint, &[u8]), WireError> {
    let mut r = ByteReader::new(body);
    let h: &MessageHeader = take(&mut r, "message header")?;
    let from = Endpoint {
        node: NodeId(h.from_node.get()),
        port: Port(h.from_port.get()),
    };
    let to = Endpoint {
        node: NodeId(h.to_node.get()),
        port: Port(h.to_port.get()),
    };
    Ok((from, to, r.rest()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck_macros::quickcheck;

    fn header_of(frame: &[u8]) -> (FrameKind, FrameHeader, &[u8]) {
        let (kind, header) = parse_header(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        let body = &frame[HEADER_LEN..];
        assert_eq!(body.len(), header.body_len.get() as usize);
        (kind, header, body)
    }

    fn ops_from(seed: Vec<(u8, u32, u64, u64, Vec<u8>)>) -> Vec<Op> {
        let addr = |offset: u64, rkey: u32| RemoteAddr {
            node: NodeId(3),
            rkey: RKey(rkey),
            offset,
        };
        seed.into_iter()
            .take(64)
            .map(|(k, rkey, offset, v, data)| match k % 4 {
                0 => Op::Read {
                    addr: addr(offset, rkey),
                    len: (v % 4096) as u32,
                },
                1 => Op::Write {
                    addr: addr(offset, rkey),
                    data,
                },
                2 => Op::Cas {
                    addr: addr(offset & !7, rkey),
                    expect: v,
                    swap: offset,
                },
                _ => Op::Faa {
                    addr: addr(offset & !7, rkey),
                    add: v,
                },
            })
            .collect()
    }

    #[quickcheck]
    fn post_round_trips(seed: Vec<(u8, u32, u64, u64, Vec<u8>)>, seq: u64) -> bool {
        let ops = ops_from(seed);
        let mut frame = Vec::new();
        let shapes = put_post(&mut frame, seq, false, ops.iter()).unwrap();
        let (kind, header, body) = header_of(&frame);
        let parsed = parse_post(NodeId(3), header.count.get(), body).unwrap();
        kind == FrameKind::Post
            && header.seq.get() == seq
            && shapes.len() == ops.len()
            && parsed
                .finish()
                .map(|w| w.into_iter().map(|w| w.op).collect::<Vec<_>>())
                .unwrap_or_default()
                == ops
    }

    #[quickcheck]
    fn completion_round_trips(seed: Vec<(u8, u32, u64, u64, Vec<u8>)>) -> bool {
        let ops = ops_from(seed);
        let outcomes: Vec<WrOutcome> = ops
            .iter()
            .map(|op| match op {
                Op::Read { len, .. } => WrOutcome::Bytes(vec![7; *len as usize].into()),
                Op::Write { .. } => WrOutcome::Written,
                Op::Cas { expect, .. } => WrOutcome::Atomic(*expect),
                Op::Faa { add, .. } => WrOutcome::Atomic(add ^ 1),
            })
            .collect();
        let shapes: Vec<Shape> = ops.iter().map(Shape::of).collect();
        let mut frame = Vec::new();
        put_completion(&mut frame, 9, &BatchResult::new(outcomes.clone()));
        let (_, header, body) = header_of(&frame);
        parse_completion(header.flags, header.count.get(), body, &shapes) == Ok(Ok(outcomes))
    }

    /// Arbitrary bytes never panic the parsers; they parse or give a typed error.
    #[quickcheck]
    fn garbage_never_panics(bytes: Vec<u8>, count: u16, flags: u8) -> bool {
        let mut header = [0u8; HEADER_LEN];
        let n = bytes.len().min(HEADER_LEN);
        header[..n].copy_from_slice(&bytes[..n]);
        let _ = parse_header(&header);
        let _ = parse_post(NodeId(0), count, &bytes);
        let _ = parse_completion(
            flags,
            count,
            &bytes,
            &[Shape::Bytes(3), Shape::Atomic, Shape::Written],
        );
        let _ = parse_hello(&bytes);
        let _ = parse_welcome(&bytes);
        let _ = parse_refused(&bytes);
        let _ = parse_message(&bytes);
        true
    }

    #[test]
    fn malformed_frames_get_typed_errors() {
        let mut h = FrameHeader {
            magic: MAGIC.into(),
            kind: FrameKind::Post as u8,
            flags: 0,
            count: 1.into(),
            body_len: U32::new(40),
            reserved: 0.into(),
            seq: 0.into(),
        };
        let bytes = |h: &FrameHeader| -> [u8; HEADER_LEN] { h.as_bytes().try_into().unwrap() };
        assert!(parse_header(&bytes(&h)).is_ok());
        h.body_len = U32::new((MAX_BODY + 1) as u32);
        assert_eq!(
            parse_header(&bytes(&h)).unwrap_err(),
            WireError::TooLarge {
                len: MAX_BODY + 1,
                max: MAX_BODY
            }
        );
        h.body_len = U32::new(0);
        h.kind = 99;
        assert_eq!(
            parse_header(&bytes(&h)).unwrap_err(),
            WireError::UnknownKind(99)
        );
        h.magic = 0x1234.into();
        assert!(matches!(
            parse_header(&bytes(&h)),
            Err(WireError::BadMagic { found: 0x1234 })
        ));

        // A WRITE that declares more data than the body holds.
        let wr = WrHeader {
            op: OP_WRITE,
            reserved: [0; 3],
            len: 100.into(),
            rkey: 1.into(),
            reserved2: 0.into(),
            offset: 0.into(),
            a: 0.into(),
            b: 0.into(),
        };
        let mut body = wr.as_bytes().to_vec();
        body.extend_from_slice(&[0; 10]);
        assert!(matches!(
            parse_post(NodeId(0), 1, &body),
            Err(WireError::Truncated {
                what: "write data",
                ..
            })
        ));
        // An unknown op, an atomic of the wrong length, too many work requests, trailing bytes.
        let mut bad = wr;
        bad.op = 9;
        assert_eq!(
            parse_post(NodeId(0), 1, bad.as_bytes()).unwrap_err(),
            WireError::UnknownOp { index: 0, op: 9 }
        );
        bad.op = OP_CAS;
        bad.len = 4.into();
        assert_eq!(
            parse_post(NodeId(0), 1, bad.as_bytes()).unwrap_err(),
            WireError::AtomicLen { index: 0, len: 4 }
        );
        assert!(matches!(
            parse_post(NodeId(0), u16::MAX, &[]),
            Err(WireError::TooManyWrs { .. })
        ));
        bad.op = OP_FAA;
        bad.len = 8.into();
        let mut trailing = bad.as_bytes().to_vec();
        trailing.push(0);
        assert_eq!(
            parse_post(NodeId(0), 1, &trailing).unwrap_err(),
            WireError::Trailing(1)
        );
        // READs whose bytes would not fit in one completion.
        let mut big = bad;
        big.op = OP_READ;
        big.len = U32::new(MAX_BODY as u32);
        let mut two = big.as_bytes().to_vec();
        two.extend_from_slice(big.as_bytes());
        assert!(matches!(
            parse_post(NodeId(0), 2, &two),
            Err(WireError::TooLarge { .. })
        ));
        // A completion whose count does not match its list.
        assert_eq!(
            parse_completion(0, 2, &[], &[Shape::Written]).unwrap_err(),
            WireError::Mismatch("work-request count")
        );
    }

    #[test]
    fn oversized_post_is_refused_before_encoding() {
        let addr = RemoteAddr {
            node: NodeId(0),
            rkey: RKey(1),
            offset: 0,
        };
        let ops = [Op::Read {
            addr,
            len: u32::MAX,
        }];
        let mut out = Vec::new();
        assert!(matches!(
            put_post(&mut out, 0, false, ops.iter()),
            Err(WireError::TooLarge { .. })
        ));
        assert!(out.is_empty());
        let many = vec![Op::Faa { addr, add: 1 }; MAX_WRS + 1];
        assert!(matches!(
            put_post(&mut out, 0, false, many.iter()),
            Err(WireError::TooManyWrs { .. })
        ));
        assert!(out.is_empty());
    }
}

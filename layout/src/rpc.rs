//! The batched RPC frame of Dandelion's networking layer (Dandelion §5).
//!
//! Dandelion batches many small messages of one *flow* into one network packet (§5.1
//! `TryInsert` / `RunIteration`, §5.3): each batch of requests gets a batch of responses,
//! messages carry an epoch id so that a node can ignore messages from before a recovery
//! (§4.4), and a response finds its request by the request slot it echoes. One frame:
//!
//! ```text
//! +--------------------+--------------------+-----------+--------------------+---------+
//! | RpcPacketHeader 16 | RpcMessageHeader 8 | payload 0 | RpcMessageHeader 8 | payload |...
//! +--------------------+--------------------+-----------+--------------------+---------+
//!                      <------------------------- body_len ------------------------------>
//! ```
//!
//! Payloads are packed back to back without padding: small messages dominate (8-byte keys,
//! 16-byte values in §5.3) and every byte counts against the 188-byte inline limit
//! (Dandelion §5.3, ConnectX-5); a frame of ten 8-byte Get requests is 16 + 10 × 16 = 176 bytes.
//!
//! * [`RpcFrameBuilder`] appends messages into a caller buffer and refuses (typed error,
//!   frame unchanged) any message that would exceed the packet size.
//! * [`RpcFrame`] checks a received frame and iterates its messages without copying.
//!
//! ```
//! use dmem_layout::rpc::{RpcFrame, RpcFrameBuilder, RpcPacketInfo};
//!
//! let mut buf = [0u8; 188];
//! let info = RpcPacketInfo { src_node: 1, flow: 0, response: false, epoch: 3 };
//! let mut builder = RpcFrameBuilder::new(&mut buf, info)?;
//! builder.push(1, 0, &42u64.to_le_bytes())?; // a Get for key 42, request slot 0
//! let bytes = builder.finish();
//!
//! let frame = RpcFrame::new_checked(bytes)?;
//! let get = frame.messages().next().expect("one message");
//! assert_eq!((get.msg_type(), get.req_slot(), get.payload()), (1, 0, &42u64.to_le_bytes()[..]));
//! # Ok::<(), dmem_layout::LayoutError>(())
//! ```
//!
//! # What is an error
//!
//! [`RpcFrame::new_checked`] refuses, and never panics on, any frame that is not exactly
//! what a builder emits:
//!
//! | condition | error |
//! |---|---|
//! | fewer than 16 bytes (truncated packet header) | `TooShort` |
//! | undefined bits in `flags` | `InvalidField { field: "flags" }` |
//! | fewer bytes than 16 + `body_len` (truncated frame) | `TooShort` |
//! | more bytes than 16 + `body_len` (trailing bytes after the frame) | `TooLong` |
//! | a message header cut by the end of the body | `TooShort` |
//! | a payload running past the end of the body | `TooShort` |
//! | the body ends after fewer than `msg_count` messages | `InvalidField { field: "msg_count" }` |
//! | bytes left in the body after `msg_count` messages | `InvalidField { field: "msg_count" }` |
//!
//! The epoch is not checked here (the layout does not know the current epoch); compare
//! [`RpcFrame::epoch`] with it. Once `new_checked` has accepted a frame, no accessor panics
//! and [`RpcFrame::messages`] yields exactly `msg_count` messages. On a frame made with
//! [`RpcFrame::new_unchecked`] iteration stops silently at the first malformed message.

use static_assertions::{assert_eq_align, assert_eq_size, const_assert_eq};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::LayoutError;
use crate::record::{header_of, header_of_mut, need};

crate::bits::one_bit_flag_byte! {
    /// Packet-level flags of an [`RpcPacketHeader`]: bit 0 says the packet carries responses
    /// (Dandelion dispatches them to `RespHandler`) rather than requests (`ReqHandler`), §5.1.
    /// The other bits are undefined and must be zero.
    pub struct RpcPacketFlags;
    field = "flags";
    flag = "response";
    /// A packet of requests.
    clear = REQUESTS;
    /// A packet of responses.
    set = RESPONSES;
    /// Whether the packet carries responses.
    get = is_response;
    /// The same flags with the response bit set or cleared.
    with = with_response;
}

/// The 16-byte header of a batched packet (Dandelion §5.1, §4.4).
///
/// ```text
/// 0 | src_node u16 | flow u8 | flags u8 | msg_count u16 | body_len u16 |
/// 8 | epoch u64                                                        |
/// ```
///
/// `flow` is the id the protocol registered the flow under (Dandelion uses one flow each
/// for execution, commit and recovery); `body_len` counts the bytes after this header, so
/// a frame is at most 16 + 65,535 bytes, far above an MTU.
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct RpcPacketHeader {
    src_node: U16,
    flow: u8,
    flags: RpcPacketFlags,
    msg_count: U16,
    body_len: U16,
    epoch: U64,
}

assert_eq_size!(RpcPacketHeader, [u8; 16]);
assert_eq_align!(RpcPacketHeader, u8);

impl RpcPacketHeader {
    /// Bytes of the header.
    pub const LEN: usize = core::mem::size_of::<Self>();

    /// The sending node.
    pub const fn src_node(&self) -> u16 {
        self.src_node.get()
    }

    /// The flow.
    pub const fn flow(&self) -> u8 {
        self.flow
    }

    /// The flags (may carry undefined bits if the frame was not checked).
    pub const fn flags(&self) -> RpcPacketFlags {
        self.flags
    }

    /// Number of messages.
    pub const fn msg_count(&self) -> u16 {
        self.msg_count.get()
    }

    /// Bytes after this header.
    pub const fn body_len(&self) -> usize {
        self.body_len.get() as usize
    }

    /// The sender's epoch.
    pub const fn epoch(&self) -> u64 {
        self.epoch.get()
    }

    /// Sets the sending node.
    pub fn set_src_node(&mut self, node: u16) {
        self.src_node.set(node);
    }

    /// Sets the flow.
    pub fn set_flow(&mut self, flow: u8) {
        self.flow = flow;
    }

    /// Sets the flags.
    pub fn set_flags(&mut self, flags: RpcPacketFlags) {
        self.flags = flags;
    }

    /// Sets the epoch.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch.set(epoch);
    }
}

/// The 8-byte header in front of each message of a frame (Dandelion §5.1, §5.3).
///
/// ```text
/// 0 | msg_type u16 | payload_len u16 | req_slot u32 |
/// ```
///
/// `msg_type` is interpreted by the flow's handlers; `req_slot` is the sender's slot for
/// the request, which the response echoes so that the requester finds its transaction
/// context without a lookup.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct RpcMessageHeader {
    msg_type: U16,
    payload_len: U16,
    req_slot: U32,
}

assert_eq_size!(RpcMessageHeader, [u8; 8]);
assert_eq_align!(RpcMessageHeader, u8);

impl RpcMessageHeader {
    /// Bytes of the header.
    pub const LEN: usize = core::mem::size_of::<Self>();

    /// The message type.
    pub const fn msg_type(&self) -> u16 {
        self.msg_type.get()
    }

    /// Bytes of payload after this header.
    pub const fn payload_len(&self) -> usize {
        self.payload_len.get() as usize
    }

    /// The request slot.
    pub const fn req_slot(&self) -> u32 {
        self.req_slot.get()
    }
}

/// Largest frame: header plus a body of `u16::MAX` bytes.
pub const MAX_FRAME_LEN: usize = RpcPacketHeader::LEN + u16::MAX as usize;

const_assert_eq!(MAX_FRAME_LEN, 65_551);

/// One message borrowed from a frame (nothing is copied).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RpcMessage<'a> {
    header: &'a RpcMessageHeader,
    payload: &'a [u8],
}

impl<'a> RpcMessage<'a> {
    /// The message header.
    pub const fn header(&self) -> &'a RpcMessageHeader {
        self.header
    }

    /// The message type.
    pub const fn msg_type(&self) -> u16 {
        self.header.msg_type()
    }

    /// The request slot.
    pub const fn req_slot(&self) -> u32 {
        self.header.req_slot()
    }

    /// The payload.
    pub const fn payload(&self) -> &'a [u8] {
        self.payload
    }
}

/// Why a message could not be split off the front of a body.
enum SplitError {
    /// The body is empty.
    End,
    /// The body has bytes, but fewer than the message needs (header or payload).
    Truncated { needed: usize },
}

/// Splits the message at the front of `rest` off.
fn split_message(rest: &[u8]) -> Result<(RpcMessage<'_>, &[u8]), SplitError> {
    if rest.is_empty() {
        return Err(SplitError::End);
    }
    let Ok((header, after)) = RpcMessageHeader::ref_from_prefix(rest) else {
        return Err(SplitError::Truncated {
            needed: RpcMessageHeader::LEN,
        });
    };
    let len = header.payload_len();
    match after.split_at_checked(len) {
        Some((payload, next)) => Ok((RpcMessage { header, payload }, next)),
        None => Err(SplitError::Truncated {
            needed: RpcMessageHeader::LEN + len,
        }),
    }
}

/// A view of a batched RPC frame over a byte buffer (the bytes one receive completion
/// reported). See the module docs for what [`RpcFrame::new_checked`] refuses.
///
/// Once `new_checked` has accepted a buffer, no accessor panics.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RpcFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RpcFrame<T> {
    /// Wraps bytes this node wrote itself. Accessors panic on a buffer shorter than the
    /// header; [`RpcFrame::body`] panics on one shorter than header + `body_len`.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps bytes from the network, checking header, length and every message.
    pub fn new_checked(buffer: T) -> Result<Self, LayoutError> {
        let frame = Self::new_unchecked(buffer);
        frame.check()?;
        Ok(frame)
    }

    /// The checks [`RpcFrame::new_checked`] runs (see the table in the module docs).
    pub fn check(&self) -> Result<(), LayoutError> {
        let buf = self.buffer.as_ref();
        need(RpcPacketHeader::LEN, buf.len())?;
        let header = self.header();
        RpcPacketFlags::from_raw(header.flags.to_raw())?;
        let end = RpcPacketHeader::LEN + header.body_len();
        need(end, buf.len())?;
        if buf.len() > end {
            return Err(LayoutError::TooLong {
                max: end,
                got: buf.len(),
            });
        }
        let mut rest = &buf[RpcPacketHeader::LEN..end];
        for _ in 0..header.msg_count() {
            match split_message(rest) {
                Ok((_, next)) => rest = next,
                Err(SplitError::End) => {
                    return Err(LayoutError::InvalidField { field: "msg_count" });
                }
                Err(SplitError::Truncated { needed }) => {
                    let at = end - rest.len();
                    return Err(LayoutError::TooShort {
                        needed: at + needed,
                        got: end,
                    });
                }
            }
        }
        if !rest.is_empty() {
            return Err(LayoutError::InvalidField { field: "msg_count" });
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The packet header.
    pub fn header(&self) -> &RpcPacketHeader {
        header_of(self.buffer.as_ref())
    }

    /// The sending node.
    pub fn src_node(&self) -> u16 {
        self.header().src_node()
    }

    /// The flow.
    pub fn flow(&self) -> u8 {
        self.header().flow()
    }

    /// Whether the packet carries responses.
    pub fn is_response(&self) -> bool {
        self.header().flags().is_response()
    }

    /// Number of messages.
    pub fn msg_count(&self) -> u16 {
        self.header().msg_count()
    }

    /// The sender's epoch.
    pub fn epoch(&self) -> u64 {
        self.header().epoch()
    }

    /// The body: all message headers and payloads.
    pub fn body(&self) -> &[u8] {
        let len = self.header().body_len();
        &self.buffer.as_ref()[RpcPacketHeader::LEN..RpcPacketHeader::LEN + len]
    }

    /// The messages, in the order they were appended.
    pub fn messages(&self) -> RpcMessages<'_> {
        let buf = self.buffer.as_ref();
        let header = self.header();
        let end = (RpcPacketHeader::LEN + header.body_len()).min(buf.len());
        RpcMessages {
            rest: &buf[RpcPacketHeader::LEN..end],
            remaining: header.msg_count(),
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RpcFrame<T> {
    /// The packet header, mutable (for example to restamp the epoch).
    pub fn header_mut(&mut self) -> &mut RpcPacketHeader {
        header_of_mut(self.buffer.as_mut())
    }
}

/// Iterator over the messages of an [`RpcFrame`]; borrows, never copies.
#[derive(Clone, Debug)]
pub struct RpcMessages<'a> {
    rest: &'a [u8],
    remaining: u16,
}

impl<'a> Iterator for RpcMessages<'a> {
    type Item = RpcMessage<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        match split_message(self.rest) {
            Ok((message, next)) => {
                self.rest = next;
                self.remaining -= 1;
                Some(message)
            }
            Err(_) => {
                self.remaining = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(usize::from(self.remaining)))
    }
}

/// The packet-level fields a [`RpcFrameBuilder`] stamps on a frame.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RpcPacketInfo {
    /// The sending node.
    pub src_node: u16,
    /// The flow.
    pub flow: u8,
    /// Whether the packet carries responses.
    pub response: bool,
    /// The sender's epoch.
    pub epoch: u64,
}

/// Appends messages into a caller buffer, keeping it a valid frame after every append.
///
/// The packet size is the smallest of the buffer length, the limit given to
/// [`RpcFrameBuilder::with_limit`] (an MTU, or the 188-byte inline threshold) and
/// [`MAX_FRAME_LEN`]. A message that would exceed it, a payload over 65,535 bytes or a
/// 65,536th message is refused with [`LayoutError::DoesNotFit`] and the frame is left
/// exactly as it was.
#[derive(Debug)]
pub struct RpcFrameBuilder<'a> {
    buf: &'a mut [u8],
    len: usize,
    count: u16,
    limit: usize,
}

impl<'a> RpcFrameBuilder<'a> {
    /// Starts an empty frame filling at most the whole buffer.
    pub fn new(buf: &'a mut [u8], info: RpcPacketInfo) -> Result<Self, LayoutError> {
        Self::with_limit(buf, info, MAX_FRAME_LEN)
    }

    /// Starts an empty frame of at most `max_packet` bytes; refuses a buffer or limit
    /// smaller than the packet header.
    pub fn with_limit(
        buf: &'a mut [u8],
        info: RpcPacketInfo,
        max_packet: usize,
    ) -> Result<Self, LayoutError> {
        let limit = buf.len().min(max_packet).min(MAX_FRAME_LEN);
        need(RpcPacketHeader::LEN, limit)?;
        *header_of_mut::<RpcPacketHeader>(buf) = RpcPacketHeader {
            src_node: U16::new(info.src_node),
            flow: info.flow,
            flags: RpcPacketFlags::REQUESTS.with_response(info.response),
            msg_count: U16::ZERO,
            body_len: U16::ZERO,
            epoch: U64::new(info.epoch),
        };
        Ok(Self {
            buf,
            len: RpcPacketHeader::LEN,
            count: 0,
            limit,
        })
    }

    /// Messages appended so far.
    pub const fn message_count(&self) -> u16 {
        self.count
    }

    /// Bytes of the frame so far, header included.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether no message has been appended.
    pub const fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The largest payload the next message may carry (0 if not even a header fits).
    pub const fn max_payload(&self) -> usize {
        let free = self.limit - self.len;
        let room = free.saturating_sub(RpcMessageHeader::LEN);
        if room > u16::MAX as usize {
            u16::MAX as usize
        } else {
            room
        }
    }

    /// The frame built so far (always a valid frame).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Checks that a message with `payload_len` bytes fits, and returns its stored length.
    fn fit(&self, payload_len: usize) -> Result<U16, LayoutError> {
        let stored = u16::try_from(payload_len).map_err(|_| LayoutError::DoesNotFit {
            field: "payload_len",
            value: payload_len as u64,
            max: u16::MAX.into(),
        })?;
        if self.count == u16::MAX {
            return Err(LayoutError::DoesNotFit {
                field: "msg_count",
                value: u64::from(u16::MAX) + 1,
                max: u16::MAX.into(),
            });
        }
        let needed = self.len + RpcMessageHeader::LEN + payload_len;
        if needed > self.limit {
            return Err(LayoutError::DoesNotFit {
                field: "rpc frame",
                value: needed as u64,
                max: self.limit as u64,
            });
        }
        Ok(U16::new(stored))
    }

    /// Appends a message with `payload` copied in.
    pub fn push(
        &mut self,
        msg_type: u16,
        req_slot: u32,
        payload: &[u8],
    ) -> Result<(), LayoutError> {
        let stored = self.fit(payload.len())?;
        self.append(msg_type, req_slot, stored)
            .copy_from_slice(payload);
        Ok(())
    }

    /// Appends a message of `payload_len` bytes and lets `fill` write the payload in place
    /// (Dandelion's `InsertHandler`, §5.1). `fill` receives a zeroed slice of exactly
    /// `payload_len` bytes. Nothing is written, and `fill` is not called, if it does not fit.
    pub fn push_with(
        &mut self,
        msg_type: u16,
        req_slot: u32,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), LayoutError> {
        let stored = self.fit(payload_len)?;
        let payload = self.append(msg_type, req_slot, stored);
        payload.fill(0);
        fill(payload);
        Ok(())
    }

    /// Writes a message header for a payload of `payload_len` bytes (checked by `fit`),
    /// updates the packet header and returns the payload bytes to fill.
    fn append(&mut self, msg_type: u16, req_slot: u32, payload_len: U16) -> &mut [u8] {
        let len = usize::from(payload_len.get());
        let header = RpcMessageHeader {
            msg_type: U16::new(msg_type),
            payload_len,
            req_slot: U32::new(req_slot),
        };
        let start = self.len;
        self.len += RpcMessageHeader::LEN + len;
        self.count += 1;
        let (frame, rest) = self.buf.split_at_mut(RpcPacketHeader::LEN);
        let frame_header = header_of_mut::<RpcPacketHeader>(frame);
        frame_header.msg_count = U16::new(self.count);
        // `fit` keeps len within MAX_FRAME_LEN, so the body fits in u16.
        frame_header.body_len = U16::new((self.len - RpcPacketHeader::LEN) as u16);
        let message = &mut rest[start - RpcPacketHeader::LEN..self.len - RpcPacketHeader::LEN];
        let (head, payload) = message.split_at_mut(RpcMessageHeader::LEN);
        head.copy_from_slice(header.as_bytes());
        payload
    }

    /// Ends the frame and returns its bytes, to be sent as one packet.
    pub fn finish(self) -> &'a [u8] {
        let Self { buf, len, .. } = self;
        &buf[..len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::TestResult;
    use quickcheck_macros::quickcheck;

    const INFO: RpcPacketInfo = RpcPacketInfo {
        src_node: 3,
        flow: 1,
        response: false,
        epoch: 42,
    };

    /// Dandelion §5.3's micro-benchmark: Gets for 8-byte keys answered with 16-byte values;
    /// a batch of requests yields a batch of responses with the same slots.
    #[test]
    fn get_batch_and_response_batch() {
        let mut req = [0u8; 188]; // the inline threshold
        let mut b = RpcFrameBuilder::new(&mut req, INFO).unwrap();
        let mut key = 0u64;
        while b.push(1, key as u32, &key.to_le_bytes()).is_ok() {
            key += 1;
        }
        assert_eq!(b.message_count(), 10, "16 + 10 * 16 = 176 <= 188 < 192");
        let req_len = b.finish().len();
        assert_eq!(req_len, 176);
        let frame = RpcFrame::new_checked(&req[..req_len]).unwrap();
        assert_eq!(
            (
                frame.src_node(),
                frame.flow(),
                frame.epoch(),
                frame.is_response()
            ),
            (3, 1, 42, false)
        );

        let mut resp = [0u8; 4096];
        let info = RpcPacketInfo {
            src_node: 0,
            response: true,
            ..INFO
        };
        let mut b = RpcFrameBuilder::new(&mut resp, info).unwrap();
        for m in frame.messages() {
            let k = u64::from_le_bytes(m.payload().try_into().unwrap());
            b.push_with(2, m.req_slot(), 16, |v| {
                v[..8].copy_from_slice(&(k * 10).to_le_bytes())
            })
            .unwrap();
        }
        let resp_len = b.finish().len();
        assert_eq!(resp_len, 16 + 10 * 24);
        let frame = RpcFrame::new_checked(&resp[..resp_len]).unwrap();
        assert!(frame.is_response());
        let slots: Vec<_> = frame
            .messages()
            .map(|m| (m.req_slot(), m.payload()[0]))
            .collect();
        assert_eq!(
            slots,
            (0..10).map(|s| (s, (s * 10) as u8)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn builder_refuses_and_leaves_frame_unchanged() {
        let mut buf = [0u8; 64];
        let mut b = RpcFrameBuilder::with_limit(&mut buf, INFO, 40).unwrap();
        b.push(1, 1, &[7; 8]).unwrap();
        assert_eq!(b.max_payload(), 0);
        b.push(1, 2, &[]).unwrap(); // exactly 40 bytes
        let before = b.as_bytes().to_vec();
        assert_eq!(
            b.push(1, 3, &[]),
            Err(LayoutError::DoesNotFit {
                field: "rpc frame",
                value: 48,
                max: 40
            })
        );
        let mut called = false;
        assert!(b.push_with(1, 2, 1, |_| called = true).is_err());
        assert!(!called);
        assert_eq!(b.as_bytes(), &before[..]);
        assert_eq!(RpcFrame::new_checked(b.as_bytes()).unwrap().msg_count(), 2);
        assert!(RpcFrameBuilder::with_limit(&mut [0u8; 64], INFO, 15).is_err());
        assert!(RpcFrameBuilder::new(&mut [0u8; 15], INFO).is_err());
        let mut big = vec![0u8; 70_000];
        let mut b = RpcFrameBuilder::new(&mut big, INFO).unwrap();
        assert!(matches!(
            b.push(0, 0, &[0; 65_536]),
            Err(LayoutError::DoesNotFit {
                field: "payload_len",
                ..
            })
        ));
        assert_eq!(b.max_payload(), MAX_FRAME_LEN - 16 - 8);
        b.push(0, 0, &vec![1; b.max_payload()]).unwrap();
        assert_eq!(b.len(), MAX_FRAME_LEN);
        assert!(b.push(0, 0, &[]).is_err());
        assert!(RpcFrame::new_checked(b.finish()).is_ok());
    }

    fn two_messages() -> Vec<u8> {
        let mut buf = [0u8; 64];
        let mut b = RpcFrameBuilder::new(&mut buf, INFO).unwrap();
        b.push(1, 10, b"abc").unwrap();
        b.push(2, 20, b"defgh").unwrap();
        b.finish().to_vec()
    }

    #[test]
    fn reader_errors_table() {
        let good = two_messages();
        assert_eq!(good.len(), 16 + 11 + 13);
        let err = |bytes: &[u8]| RpcFrame::new_checked(bytes).unwrap_err();
        assert_eq!(
            err(&good[..15]),
            LayoutError::TooShort {
                needed: 16,
                got: 15
            }
        );
        let mut m = good.clone();
        m[3] = 2;
        assert_eq!(err(&m), LayoutError::InvalidField { field: "flags" });
        assert_eq!(
            err(&good[..39]),
            LayoutError::TooShort {
                needed: 40,
                got: 39
            }
        );
        let mut m = good.clone();
        m.push(0);
        assert_eq!(err(&m), LayoutError::TooLong { max: 40, got: 41 });
        // body_len cut inside the second message header
        let mut m = good[..30].to_vec();
        m[6] = 14;
        assert_eq!(
            err(&m),
            LayoutError::TooShort {
                needed: 35,
                got: 30
            }
        );
        // payload length running past the end
        let mut m = good.clone();
        m[16 + 11 + 2] = 6;
        assert_eq!(
            err(&m),
            LayoutError::TooShort {
                needed: 41,
                got: 40
            }
        );
        let mut m = good.clone();
        m[4] = 3;
        assert_eq!(err(&m), LayoutError::InvalidField { field: "msg_count" });
        let mut m = good.clone();
        m[4] = 1;
        assert_eq!(err(&m), LayoutError::InvalidField { field: "msg_count" });
        // An empty frame is valid.
        let mut e = [0u8; 16];
        let empty = RpcFrameBuilder::new(&mut e, INFO).unwrap().finish();
        assert_eq!(RpcFrame::new_checked(empty).unwrap().messages().count(), 0);
    }

    #[test]
    fn unchecked_iteration_stops_at_garbage() {
        let mut m = two_messages();
        m[16 + 11 + 2] = 200;
        let frame = RpcFrame::new_unchecked(&m[..]);
        assert_eq!(frame.messages().count(), 1);
        let mut frame = RpcFrame::new_checked(two_messages()).unwrap();
        frame.header_mut().set_epoch(43);
        assert_eq!(
            RpcFrame::new_checked(frame.into_inner()).unwrap().epoch(),
            43
        );
    }

    #[quickcheck]
    fn qc_packet_header_round_trip(src: u16, flow: u8, response: bool, epoch: u64) -> bool {
        let mut buf = [0u8; 16];
        let info = RpcPacketInfo {
            src_node: src,
            flow,
            response,
            epoch,
        };
        let bytes = RpcFrameBuilder::new(&mut buf, info).unwrap().finish();
        let h = RpcPacketHeader::read_from_bytes(bytes).unwrap();
        (
            h.src_node(),
            h.flow(),
            h.flags().is_response(),
            h.epoch(),
            h.msg_count(),
            h.body_len(),
        ) == (src, flow, response, epoch, 0, 0)
    }

    #[quickcheck]
    fn qc_message_header_round_trip(msg_type: u16, slot: u32, len: u16) -> bool {
        let h = RpcMessageHeader {
            msg_type: U16::new(msg_type),
            payload_len: U16::new(len),
            req_slot: U32::new(slot),
        };
        let back = RpcMessageHeader::read_from_bytes(h.as_bytes()).unwrap();
        (back.msg_type(), back.req_slot(), back.payload_len()) == (msg_type, slot, usize::from(len))
    }

    #[quickcheck]
    fn qc_builder_then_reader_round_trip(msgs: Vec<(u16, u32, Vec<u8>)>, limit: u16) -> bool {
        let mut buf = vec![0u8; 4096];
        let mut b =
            RpcFrameBuilder::with_limit(&mut buf, INFO, 16 + usize::from(limit) % 4096).unwrap();
        let mut accepted = Vec::new();
        for (t, s, p) in &msgs {
            let before = b.as_bytes().to_vec();
            match b.push(*t, *s, p) {
                Ok(()) => accepted.push((*t, *s, p.clone())),
                Err(_) => {
                    if b.as_bytes() != &before[..] {
                        return false;
                    }
                }
            }
        }
        let bytes = b.finish().to_vec();
        let Ok(frame) = RpcFrame::new_checked(&bytes[..]) else {
            return false;
        };
        let got: Vec<_> = frame
            .messages()
            .map(|m| (m.msg_type(), m.req_slot(), m.payload().to_vec()))
            .collect();
        got == accepted && usize::from(frame.msg_count()) == accepted.len()
    }

    #[quickcheck]
    fn qc_any_bytes_valid_frame_or_error(bytes: Vec<u8>) -> TestResult {
        match RpcFrame::new_checked(&bytes[..]) {
            Ok(frame) => {
                // A valid frame iterates fully and re-encodes to the same bytes.
                let mut out = vec![0u8; bytes.len()];
                let info = RpcPacketInfo {
                    src_node: frame.src_node(),
                    flow: frame.flow(),
                    response: frame.is_response(),
                    epoch: frame.epoch(),
                };
                let mut b = RpcFrameBuilder::new(&mut out, info).unwrap();
                for m in frame.messages() {
                    b.push(m.msg_type(), m.req_slot(), m.payload()).unwrap();
                }
                TestResult::from_bool(b.finish() == &bytes[..])
            }
            Err(_) => TestResult::passed(),
        }
    }

    /// Random bytes are almost never valid frames; this property starts from valid frames
    /// and corrupts them, so the message walk itself is exercised.
    #[quickcheck]
    fn qc_corrupted_frames_parse_or_error(
        msgs: Vec<(u16, u32, Vec<u8>)>,
        flips: Vec<(u16, u8)>,
        cut: u16,
    ) -> bool {
        let mut buf = vec![0u8; 2048];
        let mut b = RpcFrameBuilder::new(&mut buf, INFO).unwrap();
        for (t, s, p) in &msgs {
            let _ = b.push(*t, *s, p);
        }
        let mut bytes = b.finish().to_vec();
        for (at, x) in flips {
            let at = usize::from(at) % bytes.len();
            bytes[at] ^= x;
        }
        bytes.truncate(usize::from(cut) % (bytes.len() + 1));
        match RpcFrame::new_checked(&bytes[..]) {
            Ok(frame) => frame.messages().count() == usize::from(frame.msg_count()),
            Err(_) => true,
        }
    }
}

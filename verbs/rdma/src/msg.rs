//! Two-sided messages on the wire: an RDMA SEND carries a 12-byte header (magic, sender
//! node and port, receiving port, payload length) and the payload; the receiver posts
//! fixed-size receive buffers and parses what lands with checked parsing.

use dmem_verbs::{Endpoint, NodeId, Port};
use static_assertions::const_assert_eq;
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Magic of a message frame.
pub const FRAME_MAGIC: u16 = 0xd3e5;
/// Bytes of a receive buffer: header plus the largest payload.
pub const RECV_BUFFER: usize = 4096;
/// Largest payload of one message.
pub const MAX_PAYLOAD: usize = RECV_BUFFER - HEADER_LEN;
/// Bytes of the header.
pub const HEADER_LEN: usize = core::mem::size_of::<FrameHeader>();

/// The header in front of every message payload.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct FrameHeader {
    /// [`FRAME_MAGIC`].
    pub magic: U16,
    /// Sender's node.
    pub from_node: U16,
    /// Sender's port.
    pub from_port: U16,
    /// Receiving port at the destination node.
    pub to_port: U16,
    /// Payload bytes that follow.
    pub len: U32,
}

const_assert_eq!(HEADER_LEN, 12);

/// Why a received frame was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than a header.
    #[error("frame of {0} bytes is shorter than its header")]
    Short(usize),
    /// Wrong magic.
    #[error("frame magic {0:#06x} is not a dmem message")]
    Magic(u16),
    /// The length field disagrees with the bytes received.
    #[error("frame says {said} payload bytes, {got} arrived")]
    Length {
        /// Length field.
        said: u32,
        /// Bytes after the header.
        got: usize,
    },
}

/// Builds the frame of `payload` from `from` to port `to_port`; `None` if the payload is
/// larger than [`MAX_PAYLOAD`].
#[must_use]
pub fn encode(from: Endpoint, to_port: Port, payload: &[u8]) -> Option<Vec<u8>> {
    if payload.len() > MAX_PAYLOAD {
        return None;
    }
    let header = FrameHeader {
        magic: U16::new(FRAME_MAGIC),
        from_node: U16::new(from.node.0),
        from_port: U16::new(from.port.0),
        to_port: U16::new(to_port.0),
        len: U32::new(payload.len() as u32),
    };
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(payload);
    Some(out)
}

/// Parses a received frame: (sender, receiving port, payload).
///
/// # Errors
/// [`FrameError`] for anything that is not a whole frame.
pub fn decode(bytes: &[u8]) -> Result<(Endpoint, Port, &[u8]), FrameError> {
    let (header, payload) =
        FrameHeader::ref_from_prefix(bytes).map_err(|_| FrameError::Short(bytes.len()))?;
    if header.magic.get() != FRAME_MAGIC {
        return Err(FrameError::Magic(header.magic.get()));
    }
    if header.len.get() as usize != payload.len() {
        return Err(FrameError::Length {
            said: header.len.get(),
            got: payload.len(),
        });
    }
    let from = Endpoint {
        node: NodeId(header.from_node.get()),
        port: Port(header.from_port.get()),
    };
    Ok((from, Port(header.to_port.get()), payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck_macros::quickcheck;

    #[quickcheck]
    fn round_trip(node: u16, port: u16, to: u16, payload: Vec<u8>) -> bool {
        let from = Endpoint {
            node: NodeId(node),
            port: Port(port),
        };
        let frame = encode(from, Port(to), &payload).unwrap();
        decode(&frame) == Ok((from, Port(to), &payload[..]))
    }

    #[quickcheck]
    fn garbage_is_refused_without_panic(bytes: Vec<u8>) -> bool {
        let _ = decode(&bytes);
        true
    }

    #[test]
    fn limits_and_errors() {
        let from = Endpoint {
            node: NodeId(1),
            port: Port(2),
        };
        assert!(encode(from, Port(0), &vec![0; MAX_PAYLOAD]).is_some());
        assert!(encode(from, Port(0), &vec![0; MAX_PAYLOAD + 1]).is_none());
        let frame = encode(from, Port(3), b"hello").unwrap();
        assert_eq!(decode(&frame[..5]), Err(FrameError::Short(5)));
        assert_eq!(
            decode(&frame[..14]),
            Err(FrameError::Length { said: 5, got: 2 })
        );
        let mut bad = frame.clone();
        bad[0] = 0;
        assert!(matches!(decode(&bad), Err(FrameError::Magic(_))));
    }
}

//! Two-sided messages on the wire: an RDMA SEND carries a 12-byte header (magic, sender
//! node and port, receiving port, payload length) and the payload; the receiver posts
//! fixed-size receive buffers and parses what lands with checked parsing.

use dmem_layout::bytes::{ByteReader, ByteSink};
use dmem_verbs::{Endpoint, NodeId, Port};

/// Magic of a message frame.
pub const FRAME_MAGIC: u16 = 0xd3e5;
/// Bytes of a receive buffer: header plus the largest payload.
pub const RECV_BUFFER: usize = 4096;
/// Largest payload of one message.
pub const MAX_PAYLOAD: usize = RECV_BUFFER - HEADER_LEN;
/// Bytes of the header: magic u16, sender's node u16 and port u16, receiving port u16,
/// payload length u32, all little-endian.
pub const HEADER_LEN: usize = 12;

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

/// One message: its sender, the port it is for at the destination node, its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The sender.
    pub from: Endpoint,
    /// Receiving port at the destination node.
    pub to_port: Port,
    /// The payload.
    pub payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// The frame's bytes; `None` if the payload is larger than [`MAX_PAYLOAD`].
    #[must_use]
    pub fn emit(&self) -> Option<Vec<u8>> {
        if self.payload.len() > MAX_PAYLOAD {
            return None;
        }
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        out.put_u16(FRAME_MAGIC);
        out.put_u16(self.from.node.0);
        out.put_u16(self.from.port.0);
        out.put_u16(self.to_port.0);
        out.put_u32(self.payload.len() as u32);
        out.put_bytes(self.payload);
        Some(out)
    }

    /// Parses a received frame.
    ///
    /// # Errors
    /// [`FrameError`] for anything that is not a whole frame.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, FrameError> {
        let mut r = ByteReader::new(bytes);
        let short = |_| FrameError::Short(bytes.len());
        let magic = r.u16().map_err(short)?;
        let from_node = r.u16().map_err(short)?;
        let from_port = r.u16().map_err(short)?;
        let to_port = r.u16().map_err(short)?;
        let len = r.u32().map_err(short)?;
        if magic != FRAME_MAGIC {
            return Err(FrameError::Magic(magic));
        }
        let payload = r.rest();
        if len as usize != payload.len() {
            return Err(FrameError::Length {
                said: len,
                got: payload.len(),
            });
        }
        Ok(Self {
            from: Endpoint {
                node: NodeId(from_node),
                port: Port(from_port),
            },
            to_port: Port(to_port),
            payload,
        })
    }
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
        let f = Frame {
            from,
            to_port: Port(to),
            payload: &payload,
        };
        let frame = f.emit().unwrap();
        frame.len() == HEADER_LEN + payload.len()
            && (0..HEADER_LEN).all(|n| Frame::parse(&frame[..n]) == Err(FrameError::Short(n)))
            && Frame::parse(&frame) == Ok(f)
    }

    #[quickcheck]
    fn garbage_is_refused_without_panic(bytes: Vec<u8>) -> bool {
        let _ = Frame::parse(&bytes);
        true
    }

    #[test]
    fn limits_and_errors() {
        let from = Endpoint {
            node: NodeId(1),
            port: Port(2),
        };
        let frame = |to: u16, payload: &[u8]| {
            Frame {
                from,
                to_port: Port(to),
                payload,
            }
            .emit()
        };
        assert!(frame(0, &vec![0; MAX_PAYLOAD]).is_some());
        assert!(frame(0, &vec![0; MAX_PAYLOAD + 1]).is_none());
        let frame = frame(3, b"hello").unwrap();
        assert_eq!(
            &frame[..HEADER_LEN],
            &[0xe5, 0xd3, 1, 0, 2, 0, 3, 0, 5, 0, 0, 0]
        );
        assert_eq!(Frame::parse(&frame[..5]), Err(FrameError::Short(5)));
        assert_eq!(
            Frame::parse(&frame[..14]),
            Err(FrameError::Length { said: 5, got: 2 })
        );
        let mut bad = frame.clone();
        bad[0] = 0;
        assert!(matches!(Frame::parse(&bad), Err(FrameError::Magic(_))));
    }
}

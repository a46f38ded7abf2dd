//! The connection descriptor two nodes exchange before their queue pairs can talk: who the
//! node is, the memory region it exposes (address, length, rkey), and its end of the queue
//! pair (QP number, starting PSN, LID, GID, MTU).
//!
//! On the wire it is 56 little-endian bytes, no padding:
//!
//! ```text
//!  0       4        6      8             16           24     28       32    36    38    39        40
//! | magic | version | node | region addr | region len | rkey | QP num | PSN | LID | MTU | reserved | GID (16) |
//! | DMRQ  | u16     | u16  | u64         | u64        | u32  | u32    | u32 | u16 | u8  | u8 = 0   |          |
//! ```
//!
//! [`RdmaDescriptor::parse`] checks every field before anything uses it, because the bytes
//! come from the network.

use std::io::{Read, Write};

use dmem_layout::bytes::{ByteReader, ByteSink, SliceWriter};
use dmem_verbs::{NodeId, RKey};

/// First four bytes of every descriptor.
pub const DESCRIPTOR_MAGIC: [u8; 4] = *b"DMRQ";
/// Layout version this build writes and accepts.
pub const DESCRIPTOR_VERSION: u16 = 1;
/// Bytes of a descriptor on the wire.
pub const DESCRIPTOR_LEN: usize = 56;

/// Largest value of a 24-bit field (QP numbers and packet sequence numbers).
pub const MAX_24_BIT: u32 = (1 << 24) - 1;

/// Path MTU of a queue pair, as libibverbs numbers it (`enum ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathMtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl PathMtu {
    /// The `ibv_mtu` value, or `None` outside 1..=5.
    #[must_use]
    pub const fn from_ibv(value: u8) -> Option<Self> {
        Some(match value {
            1 => Self::Mtu256,
            2 => Self::Mtu512,
            3 => Self::Mtu1024,
            4 => Self::Mtu2048,
            5 => Self::Mtu4096,
            _ => return None,
        })
    }

    /// Bytes per packet.
    #[must_use]
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// A region a node exposes to its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionDescriptor {
    /// Virtual address of its first byte at the owner (what RDMA work requests name).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: RKey,
}

/// One end of a reliable-connected queue pair, as its peer needs it to reach RTR and RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpEndpoint {
    /// QP number (24 bits).
    pub qp_num: u32,
    /// First packet sequence number this end sends (24 bits).
    pub psn: u32,
    /// LID of its port (InfiniBand), 0 on RoCE.
    pub lid: u16,
    /// GID of its port (RoCE, or InfiniBand with a GRH), all zero if none.
    pub gid: [u8; 16],
    /// Active MTU of its port.
    pub mtu: PathMtu,
}

impl QpEndpoint {
    /// Whether the peer must be addressed with a global route header (it has a GID).
    #[must_use]
    pub fn needs_grh(&self) -> bool {
        self.gid != [0; 16]
    }
}

/// What a node tells a peer before their queue pair connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdmaDescriptor {
    /// The sender.
    pub node: NodeId,
    /// The region it exposes, `None` for a CN that exposes nothing.
    pub region: Option<RegionDescriptor>,
    /// Its end of the queue pair.
    pub qp: QpEndpoint,
}

/// Why received descriptor bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    /// Not exactly [`DESCRIPTOR_LEN`] bytes.
    #[error("descriptor of {got} bytes, expected {DESCRIPTOR_LEN}")]
    Length {
        /// Bytes received.
        got: usize,
    },
    /// The first four bytes are not [`DESCRIPTOR_MAGIC`]: the peer is not a dmem node.
    #[error("not a dmem RDMA descriptor (magic {0:02x?})")]
    Magic([u8; 4]),
    /// A layout version this build does not read.
    #[error("descriptor layout version {got}, this build reads version {DESCRIPTOR_VERSION}")]
    Version {
        /// Version received.
        got: u16,
    },
    /// A 24-bit field holds a larger value.
    #[error("{field} {value:#x} does not fit in 24 bits")]
    Not24Bit {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u32,
    },
    /// The MTU is not an `ibv_mtu` value.
    #[error("path MTU code {0} is not one of 1..=5 (256..4096 bytes)")]
    Mtu(u8),
    /// The region's address plus length overflows, or a length without an address (or the
    /// other way round).
    #[error("region at {addr:#x} of {len} bytes is not a valid region")]
    Region {
        /// Address received.
        addr: u64,
        /// Length received.
        len: u64,
    },
    /// Neither a LID nor a GID: the peer cannot be addressed.
    #[error("descriptor of node {0} has neither a LID nor a GID")]
    NoAddress(u16),
    /// The reserved byte is not zero.
    #[error("reserved byte is {0}, expected 0")]
    Reserved(u8),
}

impl RdmaDescriptor {
    /// Encodes the descriptor.
    ///
    /// # Panics
    /// If a 24-bit field is larger than 24 bits (the caller built it wrongly; a QP number from
    /// libibverbs always fits).
    #[must_use]
    pub fn emit(&self) -> [u8; DESCRIPTOR_LEN] {
        assert!(self.qp.qp_num <= MAX_24_BIT && self.qp.psn <= MAX_24_BIT);
        let region = self.region.unwrap_or(RegionDescriptor {
            addr: 0,
            len: 0,
            rkey: RKey(0),
        });
        let mut out = [0u8; DESCRIPTOR_LEN];
        let mut w = SliceWriter::new(&mut out);
        w.put_bytes(&DESCRIPTOR_MAGIC);
        w.put_u16(DESCRIPTOR_VERSION);
        w.put_u16(self.node.0);
        w.put_u64(region.addr);
        w.put_u64(region.len);
        w.put_u32(region.rkey.0);
        w.put_u32(self.qp.qp_num);
        w.put_u32(self.qp.psn);
        w.put_u16(self.qp.lid);
        w.put_u8(self.qp.mtu as u8);
        w.put_u8(0); // reserved
        w.put_bytes(&self.qp.gid);
        debug_assert_eq!(w.finish(), Ok(DESCRIPTOR_LEN));
        out
    }

    /// Parses and checks descriptor bytes received from a peer.
    ///
    /// # Errors
    /// A [`DescriptorError`] naming the first field that is wrong.
    pub fn parse(bytes: &[u8]) -> Result<Self, DescriptorError> {
        if bytes.len() != DESCRIPTOR_LEN {
            return Err(DescriptorError::Length { got: bytes.len() });
        }
        let mut r = ByteReader::new(bytes);
        let short = |_| DescriptorError::Length { got: bytes.len() };
        let magic = r.array::<4>().map_err(short)?;
        let version = r.u16().map_err(short)?;
        let node = r.u16().map_err(short)?;
        let (addr, len) = (r.u64().map_err(short)?, r.u64().map_err(short)?);
        let rkey = r.u32().map_err(short)?;
        let qp_num = r.u32().map_err(short)?;
        let psn = r.u32().map_err(short)?;
        let lid = r.u16().map_err(short)?;
        let mtu = r.u8().map_err(short)?;
        let reserved = r.u8().map_err(short)?;
        let gid = r.array::<16>().map_err(short)?;
        r.finish().map_err(short)?;
        if magic != DESCRIPTOR_MAGIC {
            return Err(DescriptorError::Magic(magic));
        }
        if version != DESCRIPTOR_VERSION {
            return Err(DescriptorError::Version { got: version });
        }
        if reserved != 0 {
            return Err(DescriptorError::Reserved(reserved));
        }
        for (field, value) in [("QP number", qp_num), ("PSN", psn)] {
            if value > MAX_24_BIT {
                return Err(DescriptorError::Not24Bit { field, value });
            }
        }
        let mtu = PathMtu::from_ibv(mtu).ok_or(DescriptorError::Mtu(mtu))?;
        let region = match (addr, len) {
            (0, 0) if rkey == 0 => None,
            (a, l) if a != 0 && l != 0 && a.checked_add(l).is_some() => Some(RegionDescriptor {
                addr: a,
                len: l,
                rkey: RKey(rkey),
            }),
            _ => return Err(DescriptorError::Region { addr, len }),
        };
        if lid == 0 && gid == [0; 16] {
            return Err(DescriptorError::NoAddress(node));
        }
        Ok(Self {
            node: NodeId(node),
            region,
            qp: QpEndpoint {
                qp_num,
                psn,
                lid,
                gid,
                mtu,
            },
        })
    }
}

/// Why a descriptor exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The stream failed or closed before a whole descriptor arrived.
    #[error("descriptor exchange: {0}")]
    Io(#[from] std::io::Error),
    /// The peer's bytes are not a valid descriptor.
    #[error("descriptor exchange: {0}")]
    Bad(#[from] DescriptorError),
}

/// Sends `local` on `stream` and reads the peer's descriptor from it: the queue-pair part of
/// the control plane, over any byte stream (a TCP connection between hosts, a Unix socket in
/// tests). Both sides write first, so neither waits for the other.
///
/// # Errors
/// [`ExchangeError`] if the stream fails or the peer's bytes are refused.
pub fn exchange<S: Read + Write>(
    stream: &mut S,
    local: &RdmaDescriptor,
) -> Result<RdmaDescriptor, ExchangeError> {
    stream.write_all(&local.emit())?;
    stream.flush()?;
    let mut buf = [0u8; DESCRIPTOR_LEN];
    stream.read_exact(&mut buf)?;
    Ok(RdmaDescriptor::parse(&buf)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::{Arbitrary, Gen};
    use quickcheck_macros::quickcheck;

    impl Arbitrary for RdmaDescriptor {
        fn arbitrary(g: &mut Gen) -> Self {
            let region = bool::arbitrary(g).then(|| {
                let addr = (u64::arbitrary(g) >> 1).max(1);
                RegionDescriptor {
                    addr,
                    len: (u64::arbitrary(g) >> 2).max(1),
                    rkey: RKey(u32::arbitrary(g)),
                }
            });
            let mut gid = [0u8; 16];
            if bool::arbitrary(g) {
                for b in &mut gid {
                    *b = u8::arbitrary(g);
                }
            }
            let lid = if gid == [0; 16] {
                u16::arbitrary(g).max(1)
            } else {
                u16::arbitrary(g)
            };
            Self {
                node: NodeId(u16::arbitrary(g)),
                region,
                qp: QpEndpoint {
                    qp_num: u32::arbitrary(g) & MAX_24_BIT,
                    psn: u32::arbitrary(g) & MAX_24_BIT,
                    lid,
                    gid,
                    mtu: PathMtu::from_ibv(u8::arbitrary(g) % 5 + 1).unwrap(),
                },
            }
        }
    }

    #[quickcheck]
    fn round_trip(d: RdmaDescriptor) -> bool {
        let bytes = d.emit();
        (0..DESCRIPTOR_LEN)
            .all(|n| RdmaDescriptor::parse(&bytes[..n]) == Err(DescriptorError::Length { got: n }))
            && RdmaDescriptor::parse(&bytes) == Ok(d)
    }

    #[quickcheck]
    fn arbitrary_bytes_never_panic(bytes: Vec<u8>) -> bool {
        let _ = RdmaDescriptor::parse(&bytes);
        true
    }

    #[quickcheck]
    fn any_single_byte_flip_is_parsed_or_refused_without_panic(
        d: RdmaDescriptor,
        at: usize,
        x: u8,
    ) -> bool {
        let mut bytes = d.emit();
        bytes[at % DESCRIPTOR_LEN] ^= x;
        match RdmaDescriptor::parse(&bytes) {
            Ok(back) => back.emit() == bytes,
            Err(_) => true,
        }
    }

    fn sample() -> RdmaDescriptor {
        RdmaDescriptor {
            node: NodeId(3),
            region: Some(RegionDescriptor {
                addr: 0x7f00_0000_0000,
                len: 1 << 20,
                rkey: RKey(0x1234),
            }),
            qp: QpEndpoint {
                qp_num: 0x00ab_cdef,
                psn: 42,
                lid: 7,
                gid: [0; 16],
                mtu: PathMtu::Mtu4096,
            },
        }
    }

    #[test]
    fn layout_is_little_endian_at_fixed_offsets() {
        let bytes = sample().emit();
        assert_eq!(&bytes[0..4], b"DMRQ");
        assert_eq!(&bytes[4..6], &[1, 0], "version");
        assert_eq!(&bytes[6..8], &[3, 0], "node");
        assert_eq!(&bytes[16..24], &(1u64 << 20).to_le_bytes(), "region length");
        assert_eq!(&bytes[28..32], &[0xef, 0xcd, 0xab, 0], "QP number");
        assert_eq!(bytes[38], 5, "MTU code");
    }

    #[test]
    fn each_bad_field_is_named() {
        let good = sample().emit();
        let with = |at: usize, b: &[u8]| {
            let mut x = good;
            x[at..at + b.len()].copy_from_slice(b);
            RdmaDescriptor::parse(&x).unwrap_err()
        };
        assert_eq!(
            RdmaDescriptor::parse(&good[..55]),
            Err(DescriptorError::Length { got: 55 })
        );
        assert!(matches!(with(0, b"XXXX"), DescriptorError::Magic(_)));
        assert_eq!(with(4, &[2, 0]), DescriptorError::Version { got: 2 });
        assert_eq!(
            with(28, &[0, 0, 0, 1]),
            DescriptorError::Not24Bit {
                field: "QP number",
                value: 1 << 24
            }
        );
        assert_eq!(with(38, &[0]), DescriptorError::Mtu(0));
        assert_eq!(with(38, &[6]), DescriptorError::Mtu(6));
        assert_eq!(with(39, &[1]), DescriptorError::Reserved(1));
        assert!(matches!(
            with(8, &u64::MAX.to_le_bytes()),
            DescriptorError::Region { .. }
        ));
        assert!(matches!(with(16, &[0; 8]), DescriptorError::Region { .. }));
        assert_eq!(with(36, &[0, 0]), DescriptorError::NoAddress(3));
        let msg = with(38, &[9]).to_string();
        assert_eq!(msg, "path MTU code 9 is not one of 1..=5 (256..4096 bytes)");
    }

    #[test]
    fn exchange_over_a_socket_pair() {
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mine = sample();
        let mut theirs = sample();
        theirs.node = NodeId(9);
        theirs.region = None;
        let t = std::thread::spawn(move || exchange(&mut b, &theirs).unwrap());
        assert_eq!(exchange(&mut a, &mine).unwrap().node, NodeId(9));
        assert_eq!(t.join().unwrap(), mine);
    }

    #[test]
    fn exchange_with_a_peer_that_hangs_up_is_an_io_error() {
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        drop(b);
        let err = exchange(&mut a, &sample()).unwrap_err();
        assert!(matches!(err, ExchangeError::Io(_)), "{err}");
    }
}

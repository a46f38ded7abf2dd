//! The connection descriptor two nodes exchange before their queue pairs can talk: who the
//! node is, the memory region it exposes (address, length, rkey), and its end of the queue
//! pair (QP number, starting PSN, LID, GID, MTU).
//!
//! On the wire it is [`DescriptorWire`], a 56-byte `#[repr(C)]` little-endian layout read
//! with zerocopy; [`RdmaDescriptor::parse`] checks every field before anything uses it,
//! because the bytes come from the network.

use std::io::{Read, Write};

use dmem_verbs::{NodeId, RKey};
use static_assertions::const_assert_eq;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// First four bytes of every descriptor.
pub const DESCRIPTOR_MAGIC: [u8; 4] = *b"DMRQ";
/// Layout version this build writes and accepts.
pub const DESCRIPTOR_VERSION: u16 = 1;
/// Bytes of a descriptor on the wire.
pub const DESCRIPTOR_LEN: usize = core::mem::size_of::<DescriptorWire>();

/// Largest value of a 24-bit field (QP numbers and packet sequence numbers).
pub const MAX_24_BIT: u32 = (1 << 24) - 1;

/// The descriptor as it travels: every integer little-endian, no padding.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct DescriptorWire {
    /// [`DESCRIPTOR_MAGIC`].
    pub magic: [u8; 4],
    /// [`DESCRIPTOR_VERSION`].
    pub version: U16,
    /// The sender's node id.
    pub node: U16,
    /// Virtual address of the exposed region at the sender (0 when it exposes none).
    pub region_addr: U64,
    /// Length of the exposed region in bytes (0 when it exposes none).
    pub region_len: U64,
    /// The region's remote key.
    pub rkey: U32,
    /// The sender's QP number (24 bits).
    pub qp_num: U32,
    /// The first packet sequence number the sender will use (24 bits).
    pub psn: U32,
    /// The sender port's LID (InfiniBand; 0 on RoCE).
    pub lid: U16,
    /// The path MTU the sender's port runs, as `ibv_mtu` (1 = 256 B ... 5 = 4096 B).
    pub mtu: u8,
    /// Reserved, zero.
    pub reserved: u8,
    /// The sender port's GID (RoCE; all zero on InfiniBand without a GRH).
    pub gid: [u8; 16],
}

const_assert_eq!(core::mem::size_of::<DescriptorWire>(), 56);
const_assert_eq!(core::mem::align_of::<DescriptorWire>(), 1);

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
    pub fn encode(&self) -> [u8; DESCRIPTOR_LEN] {
        assert!(self.qp.qp_num <= MAX_24_BIT && self.qp.psn <= MAX_24_BIT);
        let region = self.region.unwrap_or(RegionDescriptor {
            addr: 0,
            len: 0,
            rkey: RKey(0),
        });
        let wire = DescriptorWire {
            magic: DESCRIPTOR_MAGIC,
            version: U16::new(DESCRIPTOR_VERSION),
            node: U16::new(self.node.0),
            region_addr: U64::new(region.addr),
            region_len: U64::new(region.len),
            rkey: U32::new(region.rkey.0),
            qp_num: U32::new(self.qp.qp_num),
            psn: U32::new(self.qp.psn),
            lid: U16::new(self.qp.lid),
            mtu: self.qp.mtu as u8,
            reserved: 0,
            gid: self.qp.gid,
        };
        let mut out = [0u8; DESCRIPTOR_LEN];
        out.copy_from_slice(wire.as_bytes());
        out
    }

    /// Parses and checks descriptor bytes received from a peer.
    ///
    /// # Errors
    /// A [`DescriptorError`] naming the first field that is wrong.
    pub fn parse(bytes: &[u8]) -> Result<Self, DescriptorError> {
        let wire = DescriptorWire::ref_from_bytes(bytes)
            .map_err(|_| DescriptorError::Length { got: bytes.len() })?;
        if wire.magic != DESCRIPTOR_MAGIC {
            return Err(DescriptorError::Magic(wire.magic));
        }
        if wire.version.get() != DESCRIPTOR_VERSION {
            return Err(DescriptorError::Version {
                got: wire.version.get(),
            });
        }
        if wire.reserved != 0 {
            return Err(DescriptorError::Reserved(wire.reserved));
        }
        for (field, value) in [("QP number", wire.qp_num.get()), ("PSN", wire.psn.get())] {
            if value > MAX_24_BIT {
                return Err(DescriptorError::Not24Bit { field, value });
            }
        }
        let mtu = PathMtu::from_ibv(wire.mtu).ok_or(DescriptorError::Mtu(wire.mtu))?;
        let (addr, len) = (wire.region_addr.get(), wire.region_len.get());
        let region = match (addr, len) {
            (0, 0) if wire.rkey.get() == 0 => None,
            (a, l) if a != 0 && l != 0 && a.checked_add(l).is_some() => Some(RegionDescriptor {
                addr: a,
                len: l,
                rkey: RKey(wire.rkey.get()),
            }),
            _ => return Err(DescriptorError::Region { addr, len }),
        };
        if wire.lid.get() == 0 && wire.gid == [0; 16] {
            return Err(DescriptorError::NoAddress(wire.node.get()));
        }
        Ok(Self {
            node: NodeId(wire.node.get()),
            region,
            qp: QpEndpoint {
                qp_num: wire.qp_num.get(),
                psn: wire.psn.get(),
                lid: wire.lid.get(),
                gid: wire.gid,
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
    stream.write_all(&local.encode())?;
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
        RdmaDescriptor::parse(&d.encode()) == Ok(d)
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
        let mut bytes = d.encode();
        bytes[at % DESCRIPTOR_LEN] ^= x;
        match RdmaDescriptor::parse(&bytes) {
            Ok(back) => back.encode() == bytes,
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
        let bytes = sample().encode();
        assert_eq!(&bytes[0..4], b"DMRQ");
        assert_eq!(&bytes[4..6], &[1, 0], "version");
        assert_eq!(&bytes[6..8], &[3, 0], "node");
        assert_eq!(&bytes[16..24], &(1u64 << 20).to_le_bytes(), "region length");
        assert_eq!(&bytes[28..32], &[0xef, 0xcd, 0xab, 0], "QP number");
        assert_eq!(bytes[38], 5, "MTU code");
    }

    #[test]
    fn each_bad_field_is_named() {
        let good = sample().encode();
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

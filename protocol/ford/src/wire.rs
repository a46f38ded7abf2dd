//! FORD/Pandora's wire formats: the control messages between the failure detector and the
//! CNs (Pandora §3.2.2 heartbeats and stray-lock notification, §3.2.5 MN-failure view
//! changes), and the lock log of the traditional "log before lock" scheme (§6.1).
//!
//! They live here rather than in `dmem-layout` because only this crate speaks them.
//!
//! # Control message
//!
//! A 24-byte little-endian header, followed for [`ControlMsg::FailedCoordinators`] by
//! `count` coordinator ids of 2 bytes each:
//!
//! ```text
//!  0      1          4         8                16               24
//! +------+----------+---------+----------------+----------------+---------------------+
//! | kind | reserved | count   | a              | b              | ids: u16 × count    |
//! | u8   | 3 bytes  | u32     | u64            | u64            | (FailedCoordinators)|
//! +------+----------+---------+----------------+----------------+---------------------+
//! ```
//!
//! `a` and `b` carry the epoch, the failed-MN mask or the suspected MN by kind. Parsing is
//! checked: a wrong length, an unknown kind, non-zero reserved bytes or a `count` that
//! disagrees with the payload length are errors, never panics.
//!
//! # Lock log
//!
//! At the tail of a coordinator's log region ([`lock_log_offset`]):
//!
//! ```text
//!  0        4             6         8
//! +--------+-------------+---------+------------------------------+
//! | "LKLG" | coordinator | count   | packed record addresses      |
//! |        | u16         | u16     | u64 × count                  |
//! +--------+-------------+---------+------------------------------+
//! ```

use core::mem::size_of;

use dmem_layout::pill::{CoordinatorId as PillId, FailedCoordinatorSet};
use dmem_layout::record::RemoteAddr as PackedAddr;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The fixed header of a control message.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct ControlHeader {
    kind: u8,
    reserved: [u8; 3],
    count: U32,
    a: U64,
    b: U64,
}

static_assertions::const_assert_eq!(size_of::<ControlHeader>(), ControlHeader::LEN);

impl ControlHeader {
    /// Bytes of the header.
    pub const LEN: usize = 24;
}

mod kind {
    pub(super) const HEARTBEAT: u8 = 1;
    pub(super) const FAILED_COORDINATORS: u8 = 2;
    pub(super) const MN_FAILED: u8 = 3;
    pub(super) const MN_SUSPECT: u8 = 4;
    pub(super) const MN_ACK: u8 = 5;
    pub(super) const MN_RESUME: u8 = 6;
}

/// Coordinator ids one stray-lock notification can carry (a CN's coordinators; the whole
/// 16-bit id space fits a 128 KiB message, far above any CN's count).
pub const MAX_NOTIFIED_IDS: usize = 4096;

/// A decoded control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlMsg {
    /// A worker CN is alive (§3.2.2 step 1, the failure detector's heartbeat).
    Heartbeat,
    /// Stray-lock notification (§3.2.2 step 4): these coordinators failed and their logs
    /// are recovered, so their locks may be ignored by readers and stolen by writers.
    FailedCoordinators(Vec<u16>),
    /// MN-failure view change (§3.2.5): the MNs in `mask` (bit i = MN index i) failed;
    /// view epoch `epoch`.
    MnFailed {
        /// The new view epoch.
        epoch: u64,
        /// Failed MNs.
        mask: u64,
    },
    /// A coordinator's report that MN `mn` stopped answering.
    MnSuspect {
        /// The MN index.
        mn: u16,
    },
    /// A CN's acknowledgement of view `epoch`: its older transactions are decided.
    MnAck {
        /// The acknowledged epoch.
        epoch: u64,
    },
    /// The detector's go-ahead after every live CN acknowledged `epoch`.
    MnResume {
        /// The resumed epoch.
        epoch: u64,
    },
}

/// A payload that is not a control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a FORD/Pandora control message ({0})")]
pub struct BadControlMsg(&'static str);

impl ControlMsg {
    /// Decodes a received payload.
    ///
    /// # Errors
    /// [`BadControlMsg`] for a short payload, an unknown kind, non-zero reserved bytes or a
    /// tail that does not match its count.
    pub fn parse(bytes: &[u8]) -> Result<Self, BadControlMsg> {
        let (h, tail) =
            ControlHeader::read_from_prefix(bytes).map_err(|_| BadControlMsg("short header"))?;
        if h.reserved != [0; 3] {
            return Err(BadControlMsg("reserved bytes set"));
        }
        let count = h.count.get() as usize;
        let expected_tail = if h.kind == kind::FAILED_COORDINATORS {
            if count > MAX_NOTIFIED_IDS {
                return Err(BadControlMsg("too many coordinator ids"));
            }
            count * 2
        } else {
            0
        };
        if tail.len() != expected_tail || (h.kind != kind::FAILED_COORDINATORS && count != 0) {
            return Err(BadControlMsg("length does not match the count"));
        }
        let (a, b) = (h.a.get(), h.b.get());
        Ok(match h.kind {
            kind::HEARTBEAT => Self::Heartbeat,
            kind::FAILED_COORDINATORS => Self::FailedCoordinators(
                <[U16]>::ref_from_bytes(tail)
                    .map_err(|_| BadControlMsg("id list"))?
                    .iter()
                    .map(|id| id.get())
                    .collect(),
            ),
            kind::MN_FAILED => Self::MnFailed { epoch: a, mask: b },
            kind::MN_SUSPECT => Self::MnSuspect {
                mn: u16::try_from(a).map_err(|_| BadControlMsg("MN index"))?,
            },
            kind::MN_ACK => Self::MnAck { epoch: a },
            kind::MN_RESUME => Self::MnResume { epoch: a },
            _ => return Err(BadControlMsg("unknown kind")),
        })
    }

    /// Encodes the message (ids beyond [`MAX_NOTIFIED_IDS`] are not sent; no CN has that
    /// many coordinators).
    #[must_use]
    pub fn emit(&self) -> Vec<u8> {
        let (kind, a, b, ids): (u8, u64, u64, &[u16]) = match self {
            Self::Heartbeat => (kind::HEARTBEAT, 0, 0, &[]),
            Self::FailedCoordinators(ids) => (
                kind::FAILED_COORDINATORS,
                0,
                0,
                &ids[..ids.len().min(MAX_NOTIFIED_IDS)],
            ),
            Self::MnFailed { epoch, mask } => (kind::MN_FAILED, *epoch, *mask, &[]),
            Self::MnSuspect { mn } => (kind::MN_SUSPECT, u64::from(*mn), 0, &[]),
            Self::MnAck { epoch } => (kind::MN_ACK, *epoch, 0, &[]),
            Self::MnResume { epoch } => (kind::MN_RESUME, *epoch, 0, &[]),
        };
        let header = ControlHeader {
            kind,
            reserved: [0; 3],
            count: U32::new(ids.len() as u32),
            a: U64::new(a),
            b: U64::new(b),
        };
        let mut out = Vec::with_capacity(ControlHeader::LEN + 2 * ids.len());
        out.extend_from_slice(header.as_bytes());
        for id in ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    /// Adds the ids of a [`ControlMsg::FailedCoordinators`] to `failed`; returns how many
    /// were new (other messages add none). Idempotent (Pandora §3.2.3).
    pub fn apply_failed_ids(&self, failed: &mut FailedCoordinatorSet) -> usize {
        match self {
            Self::FailedCoordinators(ids) => {
                ids.iter().filter(|&&id| failed.insert(PillId(id))).count()
            }
            _ => 0,
        }
    }
}

/// Bytes the lock log reserves at the tail of each log region.
pub const LOCK_LOG_BYTES: usize = 512;

/// Locks one transaction can log.
pub const LOCK_LOG_SLOTS: usize = LOCK_LOG_BYTES / 8 - 1;

const LOCK_LOG_MAGIC: [u8; 4] = *b"LKLG";

/// The lock log's header.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
struct LockLogHeader {
    magic: [u8; 4],
    coordinator: U16,
    count: U16,
}

static_assertions::const_assert_eq!(size_of::<LockLogHeader>(), 8);

/// Offset of the lock log inside a log region of `region_bytes`, if the region has room for
/// a log header before it.
#[must_use]
pub fn lock_log_offset(region_bytes: usize) -> Option<usize> {
    let header = dmem_layout::log::LogRegionHeader::LEN;
    (region_bytes >= LOCK_LOG_BYTES + header).then(|| region_bytes - LOCK_LOG_BYTES)
}

/// Bytes of a log region's undo log and lock log apart from its records: the region
/// header, and with `lock_logging` the lock log at the tail ([`LOCK_LOG_BYTES`]). With
/// [`undo_record_bytes`] per record written, the region a write set needs (for
/// `dmem_deploy::DeploySpec::log_region_for`).
#[must_use]
pub const fn log_fixed_bytes(lock_logging: bool) -> u64 {
    let header = dmem_layout::log::LogRegionHeader::LEN as u64;
    if lock_logging {
        header + LOCK_LOG_BYTES as u64
    } else {
        header
    }
}

/// Bytes one undo record of a `value_len`-byte value takes in a log region: its header and
/// old value, padded to 8 (`dmem_layout::log::UndoRecordHeader`).
#[must_use]
pub const fn undo_record_bytes(value_len: usize) -> u64 {
    ((dmem_layout::log::UndoRecordHeader::LEN + value_len + 7) & !7) as u64
}

/// The lock-log image of `coordinator` naming `addrs` (at most [`LOCK_LOG_SLOTS`]; more are
/// cut off).
#[must_use]
pub fn encode_lock_log(coordinator: u16, addrs: &[PackedAddr]) -> Vec<u8> {
    let n = addrs.len().min(LOCK_LOG_SLOTS);
    let header = LockLogHeader {
        magic: LOCK_LOG_MAGIC,
        coordinator: U16::new(coordinator),
        count: U16::new(n as u16),
    };
    let mut out = Vec::with_capacity(8 + 8 * n);
    out.extend_from_slice(header.as_bytes());
    for a in &addrs[..n] {
        out.extend_from_slice(&a.to_raw().to_le_bytes());
    }
    out
}

/// The addresses in a lock log of `coordinator` (`bytes` starts at the lock log); empty if
/// there is none, it is truncated or belongs to another coordinator.
#[must_use]
pub fn parse_lock_log(bytes: &[u8], coordinator: u16) -> Vec<PackedAddr> {
    let Ok((h, body)) = LockLogHeader::read_from_prefix(bytes) else {
        return Vec::new();
    };
    if h.magic != LOCK_LOG_MAGIC || h.coordinator.get() != coordinator {
        return Vec::new();
    }
    let n = usize::from(h.count.get()).min(LOCK_LOG_SLOTS);
    body.chunks_exact(8)
        .take(n)
        .filter_map(|c| c.try_into().ok().map(u64::from_le_bytes))
        .map(PackedAddr::from_raw)
        .filter(|a| !a.is_null())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck_macros::quickcheck;

    fn arbitrary_msg(kind: u8, a: u64, b: u64, ids: Vec<u16>) -> ControlMsg {
        match kind % 6 {
            0 => ControlMsg::Heartbeat,
            1 => ControlMsg::FailedCoordinators(ids.into_iter().take(MAX_NOTIFIED_IDS).collect()),
            2 => ControlMsg::MnFailed { epoch: a, mask: b },
            3 => ControlMsg::MnSuspect { mn: a as u16 },
            4 => ControlMsg::MnAck { epoch: a },
            _ => ControlMsg::MnResume { epoch: a },
        }
    }

    #[quickcheck]
    fn control_messages_round_trip(kind: u8, a: u64, b: u64, ids: Vec<u16>) -> bool {
        let m = arbitrary_msg(kind, a, b, ids);
        ControlMsg::parse(&m.emit()) == Ok(m)
    }

    #[quickcheck]
    fn any_bytes_parse_without_panic(bytes: Vec<u8>) -> bool {
        let _ = ControlMsg::parse(&bytes);
        true
    }

    #[test]
    fn malformed_messages_are_refused() {
        let ok = ControlMsg::FailedCoordinators(vec![7, 300]).emit();
        assert!(ControlMsg::parse(&ok[..ok.len() - 1]).is_err(), "cut tail");
        assert!(ControlMsg::parse(&ok[..10]).is_err(), "cut header");
        let mut bad = ok.clone();
        bad[1] = 1;
        assert!(ControlMsg::parse(&bad).is_err(), "reserved byte");
        let mut bad = ControlMsg::Heartbeat.emit();
        bad[0] = 99;
        assert!(ControlMsg::parse(&bad).is_err(), "unknown kind");
        let mut bad = ControlMsg::Heartbeat.emit();
        bad.push(0);
        assert!(ControlMsg::parse(&bad).is_err(), "stray tail");
    }

    #[test]
    fn notification_applies_idempotently() {
        let mut set = FailedCoordinatorSet::EMPTY;
        let m = ControlMsg::parse(&ControlMsg::FailedCoordinators(vec![7, 300]).emit()).unwrap();
        assert_eq!(m.apply_failed_ids(&mut set), 2);
        assert!(set.contains(PillId(7)) && set.contains(PillId(300)));
        assert_eq!(m.apply_failed_ids(&mut set), 0, "idempotent");
        assert_eq!(ControlMsg::Heartbeat.apply_failed_ids(&mut set), 0);
    }

    #[test]
    fn lock_log_round_trips_and_rejects_others() {
        let addrs = [
            PackedAddr::new(1, 64).unwrap(),
            PackedAddr::new(2, 128).unwrap(),
        ];
        let image = encode_lock_log(5, &addrs);
        assert_eq!(parse_lock_log(&image, 5), addrs.to_vec());
        assert!(
            parse_lock_log(&image, 6).is_empty(),
            "another coordinator's"
        );
        assert!(
            parse_lock_log(&image[..5], 5).is_empty(),
            "truncated header"
        );
        let mut bad = image.clone();
        bad[0] = b'X';
        assert!(parse_lock_log(&bad, 5).is_empty(), "no magic");
    }
}

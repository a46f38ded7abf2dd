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

use dmem_layout::bytes::{ByteReader, ByteSink};
use dmem_layout::pill::{CoordinatorId as PillId, FailedCoordinatorSet};
use dmem_layout::record::RemoteAddr as PackedAddr;

/// Bytes of a control message's fixed header.
pub const CONTROL_HEADER_LEN: usize = 24;

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
        let mut r = ByteReader::new(bytes);
        let short = |_| BadControlMsg("short header");
        let kind = r.u8().map_err(short)?;
        let reserved = r.array::<3>().map_err(short)?;
        let count = r.u32().map_err(short)? as usize;
        let a = r.u64().map_err(short)?;
        let b = r.u64().map_err(short)?;
        if reserved != [0; 3] {
            return Err(BadControlMsg("reserved bytes set"));
        }
        let expected_tail = if kind == kind::FAILED_COORDINATORS {
            if count > MAX_NOTIFIED_IDS {
                return Err(BadControlMsg("too many coordinator ids"));
            }
            count * 2
        } else {
            0
        };
        if r.remaining() != expected_tail || (kind != kind::FAILED_COORDINATORS && count != 0) {
            return Err(BadControlMsg("length does not match the count"));
        }
        let msg = match kind {
            kind::HEARTBEAT => Self::Heartbeat,
            kind::FAILED_COORDINATORS => Self::FailedCoordinators(
                (0..count)
                    .map(|_| r.u16())
                    .collect::<Result<_, _>>()
                    .map_err(|_| BadControlMsg("id list"))?,
            ),
            kind::MN_FAILED => Self::MnFailed { epoch: a, mask: b },
            kind::MN_SUSPECT => Self::MnSuspect {
                mn: u16::try_from(a).map_err(|_| BadControlMsg("MN index"))?,
            },
            kind::MN_ACK => Self::MnAck { epoch: a },
            kind::MN_RESUME => Self::MnResume { epoch: a },
            _ => return Err(BadControlMsg("unknown kind")),
        };
        r.finish()
            .map_err(|_| BadControlMsg("length does not match the count"))?;
        Ok(msg)
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
        let mut out = Vec::with_capacity(CONTROL_HEADER_LEN + 2 * ids.len());
        out.put_u8(kind);
        out.put_zeros(3);
        out.put_u32(ids.len() as u32);
        out.put_u64(a);
        out.put_u64(b);
        for &id in ids {
            out.put_u16(id);
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

/// Bytes of the lock log's header (magic, coordinator, count).
const LOCK_LOG_HEADER: usize = 8;

/// A coordinator's lock log: the locks its transaction holds or is acquiring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockLog {
    /// The coordinator whose log it is.
    pub coordinator: u16,
    /// The locked records' packed addresses (at most [`LOCK_LOG_SLOTS`]; more are cut off
    /// by [`LockLog::emit`]; null addresses are skipped by [`LockLog::parse`]).
    pub addrs: Vec<PackedAddr>,
}

/// Bytes that are not a lock log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a FORD lock log ({0})")]
pub struct BadLockLog(&'static str);

impl LockLog {
    /// The lock-log image.
    #[must_use]
    pub fn emit(&self) -> Vec<u8> {
        let n = self.addrs.len().min(LOCK_LOG_SLOTS);
        let mut out = Vec::with_capacity(LOCK_LOG_HEADER + 8 * n);
        out.put_bytes(&LOCK_LOG_MAGIC);
        out.put_u16(self.coordinator);
        out.put_u16(n as u16);
        for a in &self.addrs[..n] {
            out.put_u64(a.to_raw());
        }
        out
    }

    /// The lock log `bytes` starts with (the rest of the log region after it is ignored).
    /// Its non-null addresses, as many of its count as the bytes hold.
    ///
    /// # Errors
    /// [`BadLockLog`] for a truncated header or a missing magic (no lock log was written).
    pub fn parse(bytes: &[u8]) -> Result<Self, BadLockLog> {
        let mut r = ByteReader::new(bytes);
        let short = |_| BadLockLog("short header");
        let magic = r.array::<4>().map_err(short)?;
        let coordinator = r.u16().map_err(short)?;
        let count = r.u16().map_err(short)?;
        if magic != LOCK_LOG_MAGIC {
            return Err(BadLockLog("no magic"));
        }
        let n = usize::from(count).min(LOCK_LOG_SLOTS);
        let addrs = (0..n)
            .map_while(|_| r.u64().ok())
            .map(PackedAddr::from_raw)
            .filter(|a| !a.is_null())
            .collect();
        Ok(Self { coordinator, addrs })
    }

    /// The addresses in a lock log of `coordinator` (`bytes` starts at the lock log); empty
    /// if there is none, it is truncated or belongs to another coordinator.
    #[must_use]
    pub fn addrs_of(bytes: &[u8], coordinator: u16) -> Vec<PackedAddr> {
        Self::parse(bytes)
            .ok()
            .filter(|log| log.coordinator == coordinator)
            .map(|log| log.addrs)
            .unwrap_or_default()
    }
}

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
        let log = LockLog {
            coordinator: 5,
            addrs: addrs.to_vec(),
        };
        let image = log.emit();
        assert_eq!(LockLog::parse(&image), Ok(log));
        assert_eq!(LockLog::addrs_of(&image, 5), addrs.to_vec());
        assert!(
            LockLog::addrs_of(&image, 6).is_empty(),
            "another coordinator's"
        );
        assert_eq!(LockLog::parse(&image[..5]), Err(BadLockLog("short header")));
        assert!(
            LockLog::addrs_of(&image[..5], 5).is_empty(),
            "truncated header"
        );
        let mut bad = image.clone();
        bad[0] = b'X';
        assert_eq!(LockLog::parse(&bad), Err(BadLockLog("no magic")));
        assert!(LockLog::addrs_of(&bad, 5).is_empty(), "no magic");
        // The rest of the region after the log is ignored.
        let mut region = image.clone();
        region.resize(LOCK_LOG_BYTES, 0);
        assert_eq!(LockLog::addrs_of(&region, 5), addrs.to_vec());
    }

    #[test]
    fn control_messages_keep_their_layout() {
        let b = ControlMsg::FailedCoordinators(vec![7, 0x0102]).emit();
        assert_eq!(
            b,
            [
                2, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 2, 1
            ]
        );
        let b = ControlMsg::MnFailed { epoch: 3, mask: 5 }.emit();
        assert_eq!(b.len(), CONTROL_HEADER_LEN);
        assert_eq!((b[0], b[8], b[16]), (3, 3, 5));
        for n in 0..b.len() {
            assert!(ControlMsg::parse(&b[..n]).is_err(), "cut at {n}");
        }
    }
}

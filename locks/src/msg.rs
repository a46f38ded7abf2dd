//! Messages between lock clients: DecLock notifications and reset signals (§4.2, §4.4),
//! ShiftLock-style MCS hand-over messages (§2.3).
//!
//! Every message is one 32-byte little-endian frame, [`LockMsg`]:
//!
//! ```text
//!  0      1       2          4           8           12          16           24          32
//! +------+-------+----------+-----------+-----------+-----------+------------+-----------+
//! | kind | flags | reserved | client    | count     | ts        | lock id    | arg       |
//! | u8   | u8    | 2 bytes  | u32       | u32       | 4 bytes   | u64        | u64       |
//! +------+-------+----------+-----------+-----------+-----------+------------+-----------+
//! ```
//!
//! `ts` carries DecLock §5.3's earliest remote timestamp in a [`LockMsgRepr::CqlGrant`]
//! (low 16 bits; valid when flag bit 2 is set), zero otherwise.
//!
//! The layout lives here rather than in `dmem-layout` because only this crate's clients
//! speak it; it is a CN↔CN message, never MN state.

use core::mem::size_of;

use static_assertions::const_assert_eq;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::LockMode;
use dmem_layout::cql::CqlTimestamp;

/// The wire frame of a lock message.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct LockMsg {
    kind: u8,
    flags: u8,
    reserved: [u8; 2],
    client: U32,
    count: U32,
    ts: U32,
    lock: U64,
    arg: U64,
}

const_assert_eq!(size_of::<LockMsg>(), 32);

mod kind {
    pub(super) const CQL_GRANT: u8 = 1;
    pub(super) const RESET_SIGNAL: u8 = 2;
    pub(super) const RESET_ACK: u8 = 3;
    pub(super) const MCS_SUCCESSOR: u8 = 4;
    pub(super) const MCS_GRANT: u8 = 5;
}

const FLAG_EXCLUSIVE: u8 = 1;
const FLAG_GATE_CLOSED: u8 = 2;
const FLAG_REMOTE_TS: u8 = 4;

/// A decoded lock message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMsgRepr {
    /// DecLock: ownership of `lock` passes to the waiter at queue position `position`
    /// (§4.2 Fig. 7 lines 12 and 18). `reset_count` is the sender's reset counter for the
    /// lock; a receiver drops a notification whose count is below its own (§4.4).
    CqlGrant {
        /// Lock id ([`crate::lock_id`]).
        lock: u64,
        /// Queue position index of the notified waiter.
        position: u64,
        /// The mode the waiter asked for.
        mode: LockMode,
        /// Sender's reset counter of the lock.
        reset_count: u32,
        /// Hierarchical locking (§5.3 "Prefetched remote timestamp"): the earliest
        /// acquisition timestamp among the waiters still queued behind the notified one(s),
        /// `None` if there are none, so the notified CN need not fetch the queue.
        remote_ts: Option<CqlTimestamp>,
    },
    /// DecLock reset step 2: `lock` is being reset by client `resetter`; after the reset
    /// its reset counter is `reset_count` (§4.4).
    ResetSignal {
        /// Lock id.
        lock: u64,
        /// Client running the reset.
        resetter: u32,
        /// Reset counter after this reset.
        reset_count: u32,
    },
    /// Answer to a [`LockMsgRepr::ResetSignal`]: `client` neither holds nor waits for
    /// `lock` any more.
    ResetAck {
        /// Lock id.
        lock: u64,
        /// Answering client.
        client: u32,
        /// The reset counter it acknowledges.
        reset_count: u32,
    },
    /// ShiftLock: `client` queued behind the receiver on `lock` and waits for its grant.
    McsSuccessor {
        /// Lock id.
        lock: u64,
        /// The successor's client id.
        client: u32,
    },
    /// ShiftLock: the receiver now owns `lock` exclusively. `gate_closed`: readers are
    /// still shut out (direct writer-to-writer hand-over number `handovers`); otherwise
    /// the sender let waiting readers in and the receiver closes the gate itself.
    McsGrant {
        /// Lock id.
        lock: u64,
        /// Consecutive writer hand-overs so far.
        handovers: u64,
        /// Whether readers are still shut out.
        gate_closed: bool,
    },
}

/// A frame that is not a lock message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a lock message ({0})")]
pub struct BadMessage(&'static str);

impl LockMsgRepr {
    /// Decodes a received payload.
    ///
    /// # Errors
    /// [`BadMessage`] for a payload of the wrong size or an unknown kind.
    pub fn parse(bytes: &[u8]) -> Result<Self, BadMessage> {
        let m = LockMsg::read_from_bytes(bytes).map_err(|_| BadMessage("wrong length"))?;
        let lock = m.lock.get();
        let exclusive = m.flags & FLAG_EXCLUSIVE != 0;
        Ok(match m.kind {
            kind::CQL_GRANT => Self::CqlGrant {
                lock,
                position: m.arg.get(),
                mode: if exclusive {
                    LockMode::Exclusive
                } else {
                    LockMode::Shared
                },
                reset_count: m.count.get(),
                remote_ts: (m.flags & FLAG_REMOTE_TS != 0).then(|| CqlTimestamp(m.ts.get() as u16)),
            },
            kind::RESET_SIGNAL => Self::ResetSignal {
                lock,
                resetter: m.client.get(),
                reset_count: m.count.get(),
            },
            kind::RESET_ACK => Self::ResetAck {
                lock,
                client: m.client.get(),
                reset_count: m.count.get(),
            },
            kind::MCS_SUCCESSOR => Self::McsSuccessor {
                lock,
                client: m.client.get(),
            },
            kind::MCS_GRANT => Self::McsGrant {
                lock,
                handovers: m.arg.get(),
                gate_closed: m.flags & FLAG_GATE_CLOSED != 0,
            },
            _ => return Err(BadMessage("unknown kind")),
        })
    }

    /// Encodes the message as a frame.
    #[must_use]
    pub fn emit(&self) -> LockMsg {
        let mut m = LockMsg {
            kind: 0,
            flags: 0,
            reserved: [0; 2],
            client: U32::ZERO,
            count: U32::ZERO,
            ts: U32::ZERO,
            lock: U64::ZERO,
            arg: U64::ZERO,
        };
        match *self {
            Self::CqlGrant {
                lock,
                position,
                mode,
                reset_count,
                remote_ts,
            } => {
                m.kind = kind::CQL_GRANT;
                if let Some(ts) = remote_ts {
                    m.flags |= FLAG_REMOTE_TS;
                    m.ts = u32::from(ts.0).into();
                }
                m.lock = lock.into();
                m.arg = position.into();
                m.count = reset_count.into();
                if mode.is_exclusive() {
                    m.flags |= FLAG_EXCLUSIVE;
                }
            }
            Self::ResetSignal {
                lock,
                resetter,
                reset_count,
            } => {
                m.kind = kind::RESET_SIGNAL;
                m.lock = lock.into();
                m.client = resetter.into();
                m.count = reset_count.into();
            }
            Self::ResetAck {
                lock,
                client,
                reset_count,
            } => {
                m.kind = kind::RESET_ACK;
                m.lock = lock.into();
                m.client = client.into();
                m.count = reset_count.into();
            }
            Self::McsSuccessor { lock, client } => {
                m.kind = kind::MCS_SUCCESSOR;
                m.lock = lock.into();
                m.client = client.into();
            }
            Self::McsGrant {
                lock,
                handovers,
                gate_closed,
            } => {
                m.kind = kind::MCS_GRANT;
                m.lock = lock.into();
                m.arg = handovers.into();
                if gate_closed {
                    m.flags |= FLAG_GATE_CLOSED;
                }
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips_and_is_little_endian() {
        let all = [
            LockMsgRepr::CqlGrant {
                lock: 0x0001_0000_0000_1040,
                position: 77,
                mode: LockMode::Exclusive,
                reset_count: 3,
                remote_ts: Some(CqlTimestamp(0xfffe)),
            },
            LockMsgRepr::CqlGrant {
                lock: 9,
                position: u64::MAX,
                mode: LockMode::Shared,
                reset_count: 0,
                remote_ts: None,
            },
            LockMsgRepr::ResetSignal {
                lock: 5,
                resetter: 12,
                reset_count: 9,
            },
            LockMsgRepr::ResetAck {
                lock: 5,
                client: 13,
                reset_count: 9,
            },
            LockMsgRepr::McsSuccessor { lock: 7, client: 2 },
            LockMsgRepr::McsGrant {
                lock: 7,
                handovers: 4,
                gate_closed: true,
            },
            LockMsgRepr::McsGrant {
                lock: 7,
                handovers: 0,
                gate_closed: false,
            },
        ];
        for m in all {
            let frame = m.emit();
            assert_eq!(LockMsgRepr::parse(frame.as_bytes()), Ok(m));
        }
        let frame = LockMsgRepr::McsSuccessor {
            lock: 0x0102,
            client: 0x0304,
        }
        .emit();
        let bytes = frame.as_bytes();
        assert_eq!(bytes[0], 4);
        assert_eq!(&bytes[4..8], &[4, 3, 0, 0]);
        assert_eq!(&bytes[16..18], &[2, 1]);
    }

    #[test]
    fn junk_is_refused() {
        assert!(LockMsgRepr::parse(&[0u8; 31]).is_err());
        assert!(LockMsgRepr::parse(&[0u8; 32]).is_err());
        let mut frame = [0u8; 32];
        frame[0] = 200;
        assert!(LockMsgRepr::parse(&frame).is_err());
    }
}

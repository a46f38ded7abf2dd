//! The reliable-connected queue pair's state machine, RESET → INIT → RTR → RTS, as plain
//! data: which attributes each transition sets (the `ibv_modify_qp(3)` table for RC QPs),
//! with their values computed from the local configuration and the peer's
//! [`QpEndpoint`]. The device code hands each [`Transition`] to `ibv_modify_qp`; the tests
//! drive the machine without a device.

use crate::descriptor::{MAX_24_BIT, PathMtu, QpEndpoint};

/// States of a queue pair that dmem uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created, or reset: nothing is posted or received.
    Reset,
    /// Initialised: receive work requests may be posted.
    Init,
    /// Ready to receive: connected to the peer's QP.
    ReadyToReceive,
    /// Ready to send: work requests may be posted.
    ReadyToSend,
    /// An error completed a work request; every outstanding one is flushed. Only a reset
    /// leaves it.
    Error,
}

/// Attribute mask bits, numbered as `enum ibv_qp_attr_mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrMask(pub u32);

impl AttrMask {
    /// `IBV_QP_STATE`.
    pub const STATE: Self = Self(1 << 0);
    /// `IBV_QP_ACCESS_FLAGS`.
    pub const ACCESS_FLAGS: Self = Self(1 << 3);
    /// `IBV_QP_PKEY_INDEX`.
    pub const PKEY_INDEX: Self = Self(1 << 4);
    /// `IBV_QP_PORT`.
    pub const PORT: Self = Self(1 << 5);
    /// `IBV_QP_AV`.
    pub const AV: Self = Self(1 << 7);
    /// `IBV_QP_PATH_MTU`.
    pub const PATH_MTU: Self = Self(1 << 8);
    /// `IBV_QP_TIMEOUT`.
    pub const TIMEOUT: Self = Self(1 << 9);
    /// `IBV_QP_RETRY_CNT`.
    pub const RETRY_CNT: Self = Self(1 << 10);
    /// `IBV_QP_RNR_RETRY`.
    pub const RNR_RETRY: Self = Self(1 << 11);
    /// `IBV_QP_RQ_PSN`.
    pub const RQ_PSN: Self = Self(1 << 12);
    /// `IBV_QP_MAX_QP_RD_ATOMIC`.
    pub const MAX_QP_RD_ATOMIC: Self = Self(1 << 13);
    /// `IBV_QP_MIN_RNR_TIMER`.
    pub const MIN_RNR_TIMER: Self = Self(1 << 15);
    /// `IBV_QP_SQ_PSN`.
    pub const SQ_PSN: Self = Self(1 << 16);
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
    pub const MAX_DEST_RD_ATOMIC: Self = Self(1 << 17);
    /// `IBV_QP_DEST_QPN`.
    pub const DEST_QPN: Self = Self(1 << 20);

    /// Both masks' bits.
    #[must_use]
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// The mask an RC queue pair requires for the transition `from` → `to`
    /// (`ibv_modify_qp(3)`), `None` if dmem never takes that transition.
    #[must_use]
    pub const fn required(from: QpState, to: QpState) -> Option<Self> {
        use QpState::*;
        let bits = match (from, to) {
            (Reset, Init) => {
                Self::STATE.0 | Self::PKEY_INDEX.0 | Self::PORT.0 | Self::ACCESS_FLAGS.0
            }
            (Init, ReadyToReceive) => {
                Self::STATE.0
                    | Self::AV.0
                    | Self::PATH_MTU.0
                    | Self::DEST_QPN.0
                    | Self::RQ_PSN.0
                    | Self::MAX_DEST_RD_ATOMIC.0
                    | Self::MIN_RNR_TIMER.0
            }
            (ReadyToReceive, ReadyToSend) => {
                Self::STATE.0
                    | Self::SQ_PSN.0
                    | Self::TIMEOUT.0
                    | Self::RETRY_CNT.0
                    | Self::RNR_RETRY.0
                    | Self::MAX_QP_RD_ATOMIC.0
            }
            (_, Reset) | (_, Error) => Self::STATE.0,
            _ => return None,
        };
        Some(Self(bits))
    }
}

bitflags::bitflags! {
    /// Access rights (`enum ibv_access_flags`, bit for bit): what a memory region or a
    /// queue pair's responder allows.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct Access: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`.
        const LOCAL_WRITE = 1;
        /// `IBV_ACCESS_REMOTE_WRITE`.
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

/// Access rights the responder grants the peer: everything one-sided verbs need.
pub const REMOTE_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

/// How the peer is addressed on the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressVector {
    /// InfiniBand without a global route header: the destination LID.
    Lid {
        /// Destination LID.
        dest_lid: u16,
        /// Local port.
        port: u8,
    },
    /// RoCE (or IB across subnets): a global route header to the destination GID.
    Grh {
        /// Destination GID.
        dest_gid: [u8; 16],
        /// Index of the local GID used as the source.
        sgid_index: u8,
        /// Hop limit of the GRH.
        hop_limit: u8,
        /// Local port.
        port: u8,
    },
}

/// One attribute set by a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpAttr {
    /// The new state.
    State(QpState),
    /// Partition key index.
    PkeyIndex(u16),
    /// Local port number.
    Port(u8),
    /// Remote access rights (`IBV_ACCESS_*`).
    AccessFlags(Access),
    /// Path MTU.
    PathMtu(PathMtu),
    /// The peer's QP number.
    DestQpNum(u32),
    /// First PSN expected from the peer.
    RqPsn(u32),
    /// READs and atomics the peer may have outstanding at this responder.
    MaxDestRdAtomic(u8),
    /// RNR NAK timer code.
    MinRnrTimer(u8),
    /// Address of the peer.
    Av(AddressVector),
    /// First PSN this end sends.
    SqPsn(u32),
    /// Local ACK timeout code (4.096 µs × 2^timeout).
    Timeout(u8),
    /// Retries after a timeout.
    RetryCnt(u8),
    /// Retries after an RNR NAK (7 = forever).
    RnrRetry(u8),
    /// READs and atomics this end may have outstanding as requester.
    MaxRdAtomic(u8),
}

impl QpAttr {
    /// The mask bit of this attribute.
    #[must_use]
    pub const fn mask(&self) -> AttrMask {
        match self {
            Self::State(_) => AttrMask::STATE,
            Self::PkeyIndex(_) => AttrMask::PKEY_INDEX,
            Self::Port(_) => AttrMask::PORT,
            Self::AccessFlags(_) => AttrMask::ACCESS_FLAGS,
            Self::PathMtu(_) => AttrMask::PATH_MTU,
            Self::DestQpNum(_) => AttrMask::DEST_QPN,
            Self::RqPsn(_) => AttrMask::RQ_PSN,
            Self::MaxDestRdAtomic(_) => AttrMask::MAX_DEST_RD_ATOMIC,
            Self::MinRnrTimer(_) => AttrMask::MIN_RNR_TIMER,
            Self::Av(_) => AttrMask::AV,
            Self::SqPsn(_) => AttrMask::SQ_PSN,
            Self::Timeout(_) => AttrMask::TIMEOUT,
            Self::RetryCnt(_) => AttrMask::RETRY_CNT,
            Self::RnrRetry(_) => AttrMask::RNR_RETRY,
            Self::MaxRdAtomic(_) => AttrMask::MAX_QP_RD_ATOMIC,
        }
    }
}

/// One `ibv_modify_qp` call: from which state to which, with which attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// State before.
    pub from: QpState,
    /// State after.
    pub to: QpState,
    /// Attributes to set, the state first.
    pub attrs: Vec<QpAttr>,
}

impl Transition {
    /// The union of the attributes' mask bits.
    #[must_use]
    pub fn mask(&self) -> AttrMask {
        self.attrs
            .iter()
            .fold(AttrMask(0), |m, a| m.union(a.mask()))
    }
}

/// Local settings of dmem's RC queue pairs. Defaults follow FORD's and perftest's RC set-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// Local port (1-based).
    pub port: u8,
    /// Partition key index.
    pub pkey_index: u16,
    /// Local GID index used as source on RoCE.
    pub sgid_index: u8,
    /// Active MTU of the local port.
    pub local_mtu: PathMtu,
    /// Outstanding READs/atomics per QP, both directions (the device's `max_qp_rd_atom`
    /// caps it).
    pub max_rd_atomic: u8,
    /// Local ACK timeout code: 14 ≈ 67 ms.
    pub timeout: u8,
    /// Retries after a timeout (at most 7).
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code: 12 = 0.64 ms.
    pub min_rnr_timer: u8,
}

impl Default for QpConfig {
    fn default() -> Self {
        Self {
            port: 1,
            pkey_index: 0,
            sgid_index: 0,
            local_mtu: PathMtu::Mtu4096,
            max_rd_atomic: 16,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
        }
    }
}

/// Why a transition was refused before reaching the device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QpStateError {
    /// The transition does not start from the current state.
    #[error("queue pair is {current:?}; cannot go {from:?} -> {to:?}")]
    WrongState {
        /// Current state.
        current: QpState,
        /// Transition's start.
        from: QpState,
        /// Transition's end.
        to: QpState,
    },
    /// A configured value is out of its field's range.
    #[error("{field} = {value} is out of range (at most {max})")]
    OutOfRange {
        /// Which setting.
        field: &'static str,
        /// Its value.
        value: u32,
        /// Largest allowed.
        max: u32,
    },
}

/// The state machine of one RC queue pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpMachine {
    state: QpState,
    config: QpConfig,
}

impl QpMachine {
    /// A queue pair just created (RESET) with `config`.
    ///
    /// # Errors
    /// [`QpStateError::OutOfRange`] for a setting outside its IB field.
    pub fn new(config: QpConfig) -> Result<Self, QpStateError> {
        for (field, value, max) in [
            ("timeout", config.timeout, 31),
            ("retry_cnt", config.retry_cnt, 7),
            ("rnr_retry", config.rnr_retry, 7),
            ("min_rnr_timer", config.min_rnr_timer, 31),
        ] {
            if value > max {
                return Err(QpStateError::OutOfRange {
                    field,
                    value: u32::from(value),
                    max: u32::from(max),
                });
            }
        }
        if config.port == 0 {
            return Err(QpStateError::OutOfRange {
                field: "port (1-based)",
                value: 0,
                max: 255,
            });
        }
        Ok(Self {
            state: QpState::Reset,
            config,
        })
    }

    /// The current state.
    #[must_use]
    pub const fn state(&self) -> QpState {
        self.state
    }

    /// RESET → INIT: pkey, port and the remote access rights one-sided verbs need.
    ///
    /// # Errors
    /// [`QpStateError::WrongState`] unless the QP is in RESET.
    pub fn to_init(&self) -> Result<Transition, QpStateError> {
        self.check(QpState::Reset, QpState::Init)?;
        Ok(Transition {
            from: QpState::Reset,
            to: QpState::Init,
            attrs: vec![
                QpAttr::State(QpState::Init),
                QpAttr::PkeyIndex(self.config.pkey_index),
                QpAttr::Port(self.config.port),
                QpAttr::AccessFlags(REMOTE_ACCESS),
            ],
        })
    }

    /// INIT → RTR: connect to `peer` (its QP number and PSN), addressed by GID when it has
    /// one (RoCE) and by LID otherwise; the path MTU is the smaller of the two ports'.
    ///
    /// # Errors
    /// [`QpStateError::WrongState`] unless the QP is in INIT; [`QpStateError::OutOfRange`]
    /// for a peer QP number or PSN over 24 bits.
    pub fn to_rtr(&self, peer: &QpEndpoint) -> Result<Transition, QpStateError> {
        self.check(QpState::Init, QpState::ReadyToReceive)?;
        for (field, value) in [("peer QP number", peer.qp_num), ("peer PSN", peer.psn)] {
            if value > MAX_24_BIT {
                return Err(QpStateError::OutOfRange {
                    field,
                    value,
                    max: MAX_24_BIT,
                });
            }
        }
        let av = if peer.needs_grh() {
            AddressVector::Grh {
                dest_gid: peer.gid,
                sgid_index: self.config.sgid_index,
                hop_limit: 64,
                port: self.config.port,
            }
        } else {
            AddressVector::Lid {
                dest_lid: peer.lid,
                port: self.config.port,
            }
        };
        Ok(Transition {
            from: QpState::Init,
            to: QpState::ReadyToReceive,
            attrs: vec![
                QpAttr::State(QpState::ReadyToReceive),
                QpAttr::Av(av),
                QpAttr::PathMtu(self.config.local_mtu.min(peer.mtu)),
                QpAttr::DestQpNum(peer.qp_num),
                QpAttr::RqPsn(peer.psn),
                QpAttr::MaxDestRdAtomic(self.config.max_rd_atomic),
                QpAttr::MinRnrTimer(self.config.min_rnr_timer),
            ],
        })
    }

    /// RTR → RTS: start sending at `local_psn`, with the retry settings.
    ///
    /// # Errors
    /// [`QpStateError::WrongState`] unless the QP is in RTR; [`QpStateError::OutOfRange`]
    /// for a PSN over 24 bits.
    pub fn to_rts(&self, local_psn: u32) -> Result<Transition, QpStateError> {
        self.check(QpState::ReadyToReceive, QpState::ReadyToSend)?;
        if local_psn > MAX_24_BIT {
            return Err(QpStateError::OutOfRange {
                field: "local PSN",
                value: local_psn,
                max: MAX_24_BIT,
            });
        }
        Ok(Transition {
            from: QpState::ReadyToReceive,
            to: QpState::ReadyToSend,
            attrs: vec![
                QpAttr::State(QpState::ReadyToSend),
                QpAttr::SqPsn(local_psn),
                QpAttr::Timeout(self.config.timeout),
                QpAttr::RetryCnt(self.config.retry_cnt),
                QpAttr::RnrRetry(self.config.rnr_retry),
                QpAttr::MaxRdAtomic(self.config.max_rd_atomic),
            ],
        })
    }

    /// Any state → RESET (to reconnect after an error).
    #[must_use]
    pub fn to_reset(&self) -> Transition {
        Transition {
            from: self.state,
            to: QpState::Reset,
            attrs: vec![QpAttr::State(QpState::Reset)],
        }
    }

    /// Records that the device applied `t`.
    ///
    /// # Errors
    /// [`QpStateError::WrongState`] if `t` does not start from the current state.
    pub fn applied(&mut self, t: &Transition) -> Result<(), QpStateError> {
        self.check(t.from, t.to)?;
        self.state = t.to;
        Ok(())
    }

    /// Records that an error completion moved the QP to ERROR (the device did it).
    pub fn failed(&mut self) {
        self.state = QpState::Error;
    }

    /// The three transitions that connect a fresh QP to `peer`, each checked against the
    /// machine as it would be after the previous one.
    ///
    /// # Errors
    /// As [`to_init`](Self::to_init), [`to_rtr`](Self::to_rtr), [`to_rts`](Self::to_rts).
    pub fn connect_plan(
        &self,
        peer: &QpEndpoint,
        local_psn: u32,
    ) -> Result<[Transition; 3], QpStateError> {
        let mut m = self.clone();
        let init = m.to_init()?;
        m.applied(&init)?;
        let rtr = m.to_rtr(peer)?;
        m.applied(&rtr)?;
        let rts = m.to_rts(local_psn)?;
        Ok([init, rtr, rts])
    }

    fn check(&self, from: QpState, to: QpState) -> Result<(), QpStateError> {
        if self.state == from && AttrMask::required(from, to).is_some() {
            Ok(())
        } else {
            Err(QpStateError::WrongState {
                current: self.state,
                from,
                to,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(gid: [u8; 16]) -> QpEndpoint {
        QpEndpoint {
            qp_num: 0x42,
            psn: 0x1234,
            lid: 9,
            gid,
            mtu: PathMtu::Mtu1024,
        }
    }

    #[test]
    fn connects_reset_init_rtr_rts_with_exactly_the_required_attributes() {
        let mut m = QpMachine::new(QpConfig::default()).unwrap();
        assert_eq!(m.state(), QpState::Reset);
        let init = m.to_init().unwrap();
        assert_eq!(
            init.mask(),
            AttrMask::required(QpState::Reset, QpState::Init).unwrap()
        );
        assert!(init.attrs.contains(&QpAttr::AccessFlags(REMOTE_ACCESS)));
        m.applied(&init).unwrap();
        assert_eq!(m.state(), QpState::Init);

        let rtr = m.to_rtr(&peer([0; 16])).unwrap();
        assert_eq!(
            rtr.mask(),
            AttrMask::required(QpState::Init, QpState::ReadyToReceive).unwrap()
        );
        assert!(rtr.attrs.contains(&QpAttr::DestQpNum(0x42)));
        assert!(rtr.attrs.contains(&QpAttr::RqPsn(0x1234)));
        assert!(
            rtr.attrs.contains(&QpAttr::PathMtu(PathMtu::Mtu1024)),
            "min of 4096 and 1024"
        );
        assert!(rtr.attrs.contains(&QpAttr::Av(AddressVector::Lid {
            dest_lid: 9,
            port: 1
        })));
        m.applied(&rtr).unwrap();

        let rts = m.to_rts(77).unwrap();
        assert_eq!(
            rts.mask(),
            AttrMask::required(QpState::ReadyToReceive, QpState::ReadyToSend).unwrap()
        );
        assert!(rts.attrs.contains(&QpAttr::SqPsn(77)));
        m.applied(&rts).unwrap();
        assert_eq!(m.state(), QpState::ReadyToSend);
        // Each attribute appears once and the state comes first.
        for t in [&init, &rtr, &rts] {
            assert_eq!(t.attrs[0], QpAttr::State(t.to));
            let mut bits = 0;
            for a in &t.attrs {
                assert_eq!(bits & a.mask().0, 0, "{a:?} set twice");
                bits |= a.mask().0;
            }
        }
    }

    #[test]
    fn a_peer_with_a_gid_is_reached_through_a_grh() {
        let m = QpMachine::new(QpConfig {
            sgid_index: 3,
            ..QpConfig::default()
        })
        .unwrap();
        let gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let [_, rtr, _] = m.connect_plan(&peer(gid), 1).unwrap();
        assert!(rtr.attrs.contains(&QpAttr::Av(AddressVector::Grh {
            dest_gid: gid,
            sgid_index: 3,
            hop_limit: 64,
            port: 1
        })));
    }

    #[test]
    fn transitions_out_of_order_are_refused() {
        let mut m = QpMachine::new(QpConfig::default()).unwrap();
        assert!(matches!(
            m.to_rtr(&peer([0; 16])),
            Err(QpStateError::WrongState { .. })
        ));
        assert!(matches!(m.to_rts(0), Err(QpStateError::WrongState { .. })));
        let init = m.to_init().unwrap();
        m.applied(&init).unwrap();
        assert_eq!(
            m.applied(&init),
            Err(QpStateError::WrongState {
                current: QpState::Init,
                from: QpState::Reset,
                to: QpState::Init
            }),
            "applying INIT twice"
        );
        assert!(m.to_init().is_err());
        // An error completion: only a reset leaves ERROR, then the QP connects again.
        m.failed();
        assert!(m.to_rts(0).is_err() && m.to_init().is_err());
        let reset = m.to_reset();
        assert_eq!(reset.mask(), AttrMask::STATE);
        m.applied(&reset).unwrap();
        assert_eq!(m.state(), QpState::Reset);
        assert!(m.connect_plan(&peer([0; 16]), 5).is_ok());
    }

    #[test]
    fn out_of_range_settings_and_peers_are_refused() {
        assert!(matches!(
            QpMachine::new(QpConfig {
                retry_cnt: 8,
                ..QpConfig::default()
            }),
            Err(QpStateError::OutOfRange {
                field: "retry_cnt",
                ..
            })
        ));
        assert!(
            QpMachine::new(QpConfig {
                port: 0,
                ..QpConfig::default()
            })
            .is_err()
        );
        let m = QpMachine::new(QpConfig::default()).unwrap();
        let mut bad = peer([0; 16]);
        bad.qp_num = 1 << 24;
        assert!(matches!(
            m.connect_plan(&bad, 0),
            Err(QpStateError::OutOfRange {
                field: "peer QP number",
                ..
            })
        ));
        assert!(matches!(
            m.connect_plan(&peer([0; 16]), 1 << 24),
            Err(QpStateError::OutOfRange {
                field: "local PSN",
                ..
            })
        ));
    }

    #[test]
    fn required_masks_follow_the_ibv_modify_qp_table() {
        use QpState::*;
        // <infiniband/verbs.h>: IBV_ACCESS_LOCAL_WRITE=1, REMOTE_WRITE=2, REMOTE_READ=4,
        // REMOTE_ATOMIC=8; what the responder grants is all four.
        assert_eq!(REMOTE_ACCESS.bits(), 0b1111);
        assert_eq!(Access::REMOTE_ATOMIC.bits(), 8);
        // Bits from <infiniband/verbs.h>: STATE=1, ACCESS_FLAGS=8, PKEY_INDEX=16, PORT=32.
        assert_eq!(
            AttrMask::required(Reset, Init),
            Some(AttrMask(1 | 8 | 16 | 32))
        );
        // AV=1<<7, PATH_MTU=1<<8, RQ_PSN=1<<12, MIN_RNR_TIMER=1<<15, MAX_DEST_RD_ATOMIC=1<<17, DEST_QPN=1<<20.
        assert_eq!(
            AttrMask::required(Init, ReadyToReceive),
            Some(AttrMask(
                1 | 1 << 7 | 1 << 8 | 1 << 12 | 1 << 15 | 1 << 17 | 1 << 20
            ))
        );
        // TIMEOUT=1<<9, RETRY_CNT=1<<10, RNR_RETRY=1<<11, MAX_QP_RD_ATOMIC=1<<13, SQ_PSN=1<<16.
        assert_eq!(
            AttrMask::required(ReadyToReceive, ReadyToSend),
            Some(AttrMask(1 | 1 << 9 | 1 << 10 | 1 << 11 | 1 << 13 | 1 << 16))
        );
        assert_eq!(AttrMask::required(Reset, ReadyToSend), None);
        assert_eq!(AttrMask::required(Init, Init), None);
    }
}

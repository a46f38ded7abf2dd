//! Memory-node failures (Pandora §3.2.5), the compute-node side.
//!
//! The paper's three steps, as dmem runs them:
//!
//! 1. **Detection and notification.** The failure detector ([`RecoveryManager`] with
//!    [`watch_mns`](crate::RecoveryManager::watch_mns)) probes every MN with a small READ
//!    and also probes at once when a coordinator reports an MN whose op failed with
//!    `ConnectionLost`. A confirmed failure is added to the detector's [`MnView`] and sent to
//!    every live CN as the whole failed-MN bitmask with a new *view epoch*.
//! 2. **New primaries.** Each CN merges the bitmask into its own view ([`cn_listener`]); the
//!    primary of a partition is its first live replica ([`Store::primary`]), a pure function
//!    of the bitmask, so every CN picks the same one. (The paper uses consistent hashing for
//!    placement; dmem's static ring is what it degenerates to with a fixed MN set.)
//! 3. **Stop and decide.** A CN that learns of the failure pauses: new transactions wait.
//!    Each transaction that began under the old view is decided by its own coordinator,
//!    which knows its state, by the criterion of log recovery: one that had issued its
//!    commit WRITEs is rolled forward iff every *live* replica of every write is updated,
//!    else rolled back from its undo images (the same images its log holds); every other
//!    transaction aborts. When no old-view transaction is left the CN acknowledges; when
//!    every live CN has, the detector resumes them all.
//!
//! Deviation: the paper lets "compute servers resume" after their own decisions; dmem
//! resumes all CNs together, after every live CN acknowledged. A failed primary takes its
//! lock words with it (backups are never locked), so a CN resuming early could lock a
//! record on its new primary while another CN's old-view transaction is still writing it.
//! The barrier costs one round trip to the detector per MN failure.
//!
//! A CN that crashes meanwhile never acknowledges; the detector suspects it and runs CN
//! recovery (§3.2.2, on the live replicas) before resuming: "we execute both protocols
//! independently".
//!
//! [`RecoveryManager`]: crate::RecoveryManager
//! [`MnView`]: crate::store::MnView
//! [`Store::primary`]: crate::Store::primary

use std::collections::BTreeMap;
use std::rc::Rc;

use dmem_verbs::{Clock, Endpoint, Nanos, Verbs, VerbsError};

use crate::recovery::apply_notification;
use crate::store::Store;
use crate::txn::CnShared;

/// Message tags of the MN-failure control path.
pub(crate) const MN_FAILED: u8 = b'M';
pub(crate) const MN_SUSPECT: u8 = b'S';
pub(crate) const MN_ACK: u8 = b'A';
pub(crate) const MN_RESUME: u8 = b'R';

/// A CN's state for MN failures, shared by its coordinators and its [`cn_listener`].
#[derive(Debug, Clone, Default)]
pub struct MnState {
    /// Where coordinators report an MN that stopped answering. `None` means MN-failure
    /// handling is off: a `ConnectionLost` is then an ordinary error, as before.
    pub detector: Option<Endpoint>,
    /// How often waiting coordinators look again, ns.
    pub poll: Nanos,
    /// View changes this CN has applied.
    epoch: u64,
    /// Between learning of an MN failure and the detector's resume.
    paused: bool,
    /// Running transactions per the epoch they began in.
    active: BTreeMap<u64, usize>,
    /// The epoch this CN must still acknowledge.
    ack_due: Option<u64>,
    /// MNs already reported to the detector (bitmask).
    reported: u64,
}

impl MnState {
    /// Whether MN-failure handling is on.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.detector.is_some()
    }

    /// The view epoch.
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether new transactions are held back.
    #[must_use]
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// Running transactions that began before the current epoch.
    #[must_use]
    pub fn old_active(&self) -> usize {
        self.active.range(..self.epoch).map(|(_, n)| n).sum()
    }

    pub(crate) fn begin(&mut self) -> u64 {
        *self.active.entry(self.epoch).or_default() += 1;
        self.epoch
    }

    pub(crate) fn end(&mut self, epoch: u64) {
        if let Some(n) = self.active.get_mut(&epoch) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.active.remove(&epoch);
            }
        }
    }

    /// Marks `mn` reported; whether it was not before.
    pub(crate) fn report(&mut self, mn: u16) -> bool {
        let bit = if mn < 64 { 1u64 << mn } else { 0 };
        let first = self.reported & bit == 0;
        self.reported |= bit;
        first
    }

    /// Applies an MN-failure notification of `epoch` carrying `mask`: merges the view and
    /// pauses. Stale or repeated notifications change nothing.
    pub(crate) fn apply_failure(&mut self, store: &Store, epoch: u64, mask: u64) -> bool {
        if epoch <= self.epoch {
            return false;
        }
        store.view().borrow_mut().merge_failed(mask);
        self.epoch = epoch;
        self.paused = true;
        self.ack_due = Some(epoch);
        true
    }

    pub(crate) fn apply_resume(&mut self, epoch: u64) {
        if epoch >= self.epoch {
            self.paused = false;
        }
    }

    /// The epoch to acknowledge now: one is due and no older transaction is running.
    pub(crate) fn ack_ready(&mut self) -> Option<u64> {
        let e = self.ack_due?;
        if self.old_active() == 0 {
            self.ack_due = None;
            Some(e)
        } else {
            None
        }
    }
}

pub(crate) fn encode_failure(epoch: u64, mask: u64) -> Vec<u8> {
    let mut p = vec![MN_FAILED];
    p.extend_from_slice(&epoch.to_le_bytes());
    p.extend_from_slice(&mask.to_le_bytes());
    p
}

pub(crate) fn encode_epoch(tag: u8, epoch: u64) -> Vec<u8> {
    let mut p = vec![tag];
    p.extend_from_slice(&epoch.to_le_bytes());
    p
}

pub(crate) fn encode_suspect(mn: u16) -> Vec<u8> {
    let mut p = vec![MN_SUSPECT];
    p.extend_from_slice(&mn.to_le_bytes());
    p
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
}

pub(crate) fn decode_epoch(payload: &[u8]) -> Option<u64> {
    u64_at(payload, 1)
}

pub(crate) fn decode_suspect(payload: &[u8]) -> Option<u16> {
    payload.get(1..3).map(|b| u16::from_le_bytes([b[0], b[1]]))
}

/// Applies one control message for a CN (stray-lock notification, MN failure, resume);
/// returns whether it was an MN-failure notification that changed the view.
pub fn apply_cn_message(payload: &[u8], store: &Store, shared: &CnShared) -> bool {
    match payload.first() {
        Some(&MN_FAILED) => match (u64_at(payload, 1), u64_at(payload, 9)) {
            (Some(epoch), Some(mask)) => shared.mn.borrow_mut().apply_failure(store, epoch, mask),
            _ => false,
        },
        Some(&MN_RESUME) => {
            if let Some(e) = decode_epoch(payload) {
                shared.mn.borrow_mut().apply_resume(e);
            }
            false
        }
        _ => {
            apply_notification(payload, &mut shared.failed.borrow_mut());
            false
        }
    }
}

/// A CN's control listener with MN-failure handling: what
/// [`membership_listener`](crate::recovery::membership_listener) does (stray-lock
/// notifications), plus MN-failure notifications into `store`'s view (the CN's own
/// [`fork`](Store::fork_view)), the pause, the acknowledgement to `detector` once no
/// transaction of an older view runs, and the resume. Turns MN-failure handling on for
/// `shared`'s coordinators. Polls every `poll` until `until`.
///
/// The detector must run [`watch_mns`](crate::RecoveryManager::watch_mns), and with it every
/// member CN must run this listener: a coordinator that meets a dead MN waits for the
/// detector's notification, and the detector resumes the CNs only once every live member
/// acknowledged. Control messages are not re-sent: a lost acknowledgement or resume leaves
/// the CNs paused (the simulator loses none unless told to).
///
/// # Errors
/// [`VerbsError`] if receiving or sending fails.
pub async fn cn_listener<V: Verbs + Clock>(
    ctx: &V,
    store: Rc<Store>,
    shared: CnShared,
    detector: Endpoint,
    poll: Nanos,
    until: Nanos,
) -> Result<(), VerbsError> {
    {
        let mut mn = shared.mn.borrow_mut();
        mn.detector = Some(detector);
        mn.poll = poll.max(1);
    }
    while ctx.now() < until {
        while let Some(msg) = ctx.try_recv()? {
            apply_cn_message(&msg.payload, &store, &shared);
        }
        let ack = shared.mn.borrow_mut().ack_ready();
        if let Some(epoch) = ack {
            ctx.send(detector, &encode_epoch(MN_ACK, epoch)).await?;
        }
        ctx.sleep(poll).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_waits_for_old_transactions_and_notifications_are_idempotent() {
        let mut s = MnState::default();
        let a = s.begin();
        assert_eq!(a, 0);
        s.epoch = 1;
        s.ack_due = Some(1);
        let b = s.begin();
        assert_eq!(s.old_active(), 1);
        assert_eq!(s.ack_ready(), None, "the epoch-0 transaction still runs");
        s.end(b);
        assert_eq!(s.ack_ready(), None);
        s.end(a);
        assert_eq!(s.ack_ready(), Some(1));
        assert_eq!(s.ack_ready(), None, "acknowledged once");
        assert!(s.report(2) && !s.report(2));
        assert_eq!(decode_suspect(&encode_suspect(2)), Some(2));
        assert_eq!(decode_epoch(&encode_epoch(MN_ACK, 7)), Some(7));
    }
}

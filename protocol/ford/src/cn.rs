//! The state a CN's coordinators share: the failed-coordinator set (updated by the
//! stray-lock notification, Pandora §3.2.2 step 4), the address cache, and the MN-failure
//! state (§3.2.5: view epoch, pause, running transactions per epoch, the acknowledgement
//! due), read by the transactions and written by the CN's control listener
//! ([`crate::mnfail::cn_listener`]).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use dmem_layout::pill::FailedCoordinatorSet;
use dmem_verbs::{Endpoint, Nanos};

use crate::store::{AddressCache, Store};

/// Per-CN state shared by its coordinators: the failed-id set (updated by the stray-lock
/// notification, Pandora §3.2.2 step 4), the address cache and the MN-failure state
/// (§3.2.5, see [`crate::mnfail`]).
#[derive(Debug, Clone)]
pub struct CnShared {
    /// Failed coordinator ids.
    pub failed: Rc<RefCell<FailedCoordinatorSet>>,
    /// Address cache.
    pub cache: Rc<RefCell<AddressCache>>,
    /// View epoch, pause and running transactions, for MN failures.
    pub mn: Rc<RefCell<MnState>>,
}

impl CnShared {
    /// Fresh state: no failed coordinator, empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self {
            failed: Rc::new(RefCell::new(FailedCoordinatorSet::EMPTY)),
            cache: Rc::new(RefCell::new(AddressCache::new())),
            mn: Rc::new(RefCell::new(MnState::default())),
        }
    }
}

impl Default for CnShared {
    fn default() -> Self {
        Self::new()
    }
}

/// A CN's state for MN failures, shared by its coordinators and its [`cn_listener`](crate::mnfail::cn_listener).
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
    }
}

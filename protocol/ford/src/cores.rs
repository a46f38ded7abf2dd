//! A CN's control messages across the cores of one CN process (thread per core).
//!
//! A CN process may run its coordinators on several cores, one executor each; every core's
//! coordinators are made by a deployment of its own, so each core has its own [`CnShared`]
//! (failed coordinators, MN-failure state) and its own [`Store`] view (`Rc`-based: cores share
//! no memory but what is made to be shared). The detector knows one listener endpoint per CN,
//! so the CN has one listener, on its first core ([`cn_listener_with_cores`]). It applies each
//! control message to its own core's state and forwards the payload through a [`CoreRelay`],
//! the one `Send + Sync` thing the cores share; every other core runs [`core_follower`], which
//! applies the same payloads in the same order to that core's state and reports back the
//! newest MN view epoch its core can acknowledge. The listener acknowledges an epoch to the
//! detector only once its own core and every other core can.
//!
//! Why the single-core guarantees still hold (Pandora §3.2.2, §3.2.5):
//!
//! - **No older-view transaction after the acknowledgement.** The detector resumes the CNs
//!   only after every live CN acknowledged the new view, and a CN's acknowledgement says:
//!   this CN dropped the failed MNs from its view and runs no transaction that began under an
//!   older one. With cores it is sent only when every core reported that epoch ready — each
//!   core applied the view change and none of its own older-view transactions runs — so it
//!   says the same of the whole CN. Until then, a core still on the old view is to the
//!   detector what a CN whose notification is still in flight is, which the protocol
//!   tolerates already: the core's transactions stop at their next post once it applies the
//!   view, and a coordinator that meets the failed MN waits until its own core's view drops
//!   it (it never posts to the MN once that view changed).
//! - **Order.** Each core receives the payloads in the order the listener did (one queue per
//!   core), so a resume never overtakes its view change; a stray-lock notification (§3.2.2
//!   step 4) reaches a core only after the listener received it, so after the log recovery it
//!   announces. Forwarding adds latency, as a slower network would, and nothing else.
//! - **Link termination** (§3.2.2 step 2) is done at the MNs for the CN's node, which every
//!   core's contexts are: it cuts all cores of a failed CN at once.
//! - **A core whose coordinators are done** drops its [`CoreFollower`], which then counts as
//!   ready for every epoch: it runs no transaction that could be of an older view.
//!
//! [`cn_listener_with_cores`]: crate::mnfail::cn_listener_with_cores
//! [`core_follower`]: crate::mnfail::core_follower
//! [`CnShared`]: crate::CnShared
//! [`Store`]: crate::Store

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dmem_verbs::sync::lock_ignoring_poison;

/// What a retired core's [`Slot::ready`] holds: ready for every epoch.
const RETIRED: u64 = u64::MAX;

/// The control messages of one CN process, from the core that receives them to the others,
/// and how far each of those can acknowledge ([module docs](self)). `Send + Sync`: one
/// `Arc` is shared by the cores of the process.
#[derive(Debug)]
pub struct CoreRelay {
    /// One per core after the first.
    others: Vec<Slot>,
}

/// One core after the first.
#[derive(Debug, Default)]
struct Slot {
    /// Payloads forwarded and not yet applied, oldest first.
    inbox: Mutex<Vec<Vec<u8>>>,
    /// The newest MN view epoch the core applied while running no transaction of an older
    /// view; [`RETIRED`] once its follower is dropped.
    ready: AtomicU64,
    /// Its [`CoreFollower`] was handed out.
    taken: AtomicBool,
}

impl CoreRelay {
    /// A relay for a CN process of `cores` cores (1: nothing to forward, every epoch ready).
    #[must_use]
    pub fn new(cores: usize) -> Self {
        Self {
            others: (1..cores).map(|_| Slot::default()).collect(),
        }
    }

    /// The cores of the process.
    #[must_use]
    pub fn cores(&self) -> usize {
        self.others.len() + 1
    }

    /// Hands `payload` (a control message the first core received) to every other core
    /// still running.
    pub fn forward(&self, payload: &[u8]) {
        for slot in &self.others {
            if slot.ready.load(Ordering::Acquire) != RETIRED {
                lock_ignoring_poison(&slot.inbox).push(payload.to_vec());
            }
        }
    }

    /// Whether every other core can acknowledge MN view `epoch` (applied it and runs no
    /// transaction of an older view), or has retired.
    #[must_use]
    pub fn ready(&self, epoch: u64) -> bool {
        self.others
            .iter()
            .all(|slot| slot.ready.load(Ordering::Acquire) >= epoch)
    }

    /// The receiving end of core `core` (`1..cores`), once; `None` for the first core, a
    /// core out of range or one already handed out.
    #[must_use]
    pub fn follower(self: &Arc<Self>, core: usize) -> Option<CoreFollower> {
        let slot = core.checked_sub(1)?;
        let taken = self.others.get(slot)?.taken.swap(true, Ordering::AcqRel);
        (!taken).then(|| CoreFollower {
            relay: Arc::clone(self),
            slot,
        })
    }
}

/// A core's end of a [`CoreRelay`]: the payloads forwarded to it, and where it says how far
/// it can acknowledge. Dropping it retires the core (ready for every epoch).
#[derive(Debug)]
pub struct CoreFollower {
    relay: Arc<CoreRelay>,
    slot: usize,
}

impl CoreFollower {
    fn slot(&self) -> &Slot {
        &self.relay.others[self.slot]
    }

    /// The payloads forwarded since the last call, oldest first.
    #[must_use]
    pub fn take(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *lock_ignoring_poison(&self.slot().inbox))
    }

    /// This core applied MN view `epoch` and runs no transaction of an older view.
    pub fn ready(&self, epoch: u64) {
        self.slot().ready.fetch_max(epoch, Ordering::AcqRel);
    }
}

impl Drop for CoreFollower {
    fn drop(&mut self) {
        self.slot().ready.store(RETIRED, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ControlMsg;

    #[test]
    fn the_first_core_waits_for_every_other_core_until_it_retires() {
        let relay = Arc::new(CoreRelay::new(3));
        assert_eq!(relay.cores(), 3);
        assert!(relay.follower(0).is_none(), "the first core listens itself");
        let (one, two) = (relay.follower(1).unwrap(), relay.follower(2).unwrap());
        assert!(relay.follower(1).is_none() && relay.follower(3).is_none());
        assert!(relay.ready(0) && !relay.ready(1));
        let failed = ControlMsg::MnFailed { epoch: 1, mask: 2 }.emit();
        let resume = ControlMsg::MnResume { epoch: 1 }.emit();
        relay.forward(&failed);
        relay.forward(&resume);
        assert_eq!(one.take(), vec![failed.clone(), resume.clone()], "in order");
        assert!(one.take().is_empty());
        one.ready(1);
        assert!(!relay.ready(1), "core 2 has not applied epoch 1");
        two.ready(2);
        one.ready(0);
        assert!(relay.ready(1) && !relay.ready(2), "readiness only grows");
        drop(one);
        assert!(
            relay.ready(2),
            "a retired core runs no older-view transaction"
        );
        relay.forward(&failed);
        assert_eq!(two.take().len(), 3, "the live core still gets everything");
    }

    #[test]
    fn one_core_forwards_nothing_and_is_always_ready() {
        let relay = Arc::new(CoreRelay::new(1));
        relay.forward(&ControlMsg::MnResume { epoch: 1 }.emit());
        assert!(relay.ready(u64::MAX - 1));
        assert!(relay.follower(1).is_none());
    }
}

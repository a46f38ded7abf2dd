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

use std::rc::Rc;

use dmem_verbs::{Clock, Endpoint, Nanos, Verbs, VerbsError};

use crate::cn::CnShared;
use crate::cores::{CoreFollower, CoreRelay};
use crate::store::Store;
use crate::wire::ControlMsg;

/// Applies one control message for a CN (stray-lock notification, MN failure, resume);
/// returns whether it was an MN-failure notification that changed the view. A payload that
/// is not a control message is ignored.
pub fn apply_cn_message(payload: &[u8], store: &Store, shared: &CnShared) -> bool {
    match ControlMsg::parse(payload) {
        Ok(ControlMsg::MnFailed { epoch, mask }) => {
            shared.mn.borrow_mut().apply_failure(store, epoch, mask)
        }
        Ok(ControlMsg::MnResume { epoch }) => {
            shared.mn.borrow_mut().apply_resume(epoch);
            false
        }
        Ok(m) => {
            m.apply_failed_ids(&mut shared.failed.borrow_mut());
            false
        }
        Err(_) => false,
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
/// acknowledged. Control messages are not re-sent here: a lost acknowledgement or resume
/// leaves the CNs paused (the simulator loses none unless told to); see
/// [`cn_listener_resending`].
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
    cn_listener_resending(ctx, store, shared, detector, poll, None, until).await
}

/// [`cn_listener`] that, with `resend`, re-sends its acknowledgement every `resend` while
/// it stays paused (its acknowledgement or the detector's resume was lost; a detector with
/// [`resend_control`](crate::RecoveryManager::resend_control) answers a repeated
/// acknowledgement with the resume again).
///
/// # Errors
/// [`VerbsError`] if receiving or sending fails.
pub async fn cn_listener_resending<V: Verbs + Clock>(
    ctx: &V,
    store: Rc<Store>,
    shared: CnShared,
    detector: Endpoint,
    poll: Nanos,
    resend: Option<Nanos>,
    until: Nanos,
) -> Result<(), VerbsError> {
    let timing = ListenerTiming {
        poll,
        resend,
        until,
    };
    let one_core = CoreRelay::new(1);
    cn_listener_with_cores(ctx, store, shared, &one_core, detector, timing).await
}

/// How a CN listener polls: every `poll` until `until`, re-sending an acknowledgement every
/// `resend` while paused (see [`cn_listener_resending`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerTiming {
    /// Between looks at the receive queue, ns.
    pub poll: Nanos,
    /// Between re-sent acknowledgements while paused; `None`: never re-sent.
    pub resend: Option<Nanos>,
    /// When the listener stops.
    pub until: Nanos,
}

/// Turns MN-failure handling on for `shared`'s coordinators: they report an MN that stops
/// answering to `detector` and, waiting for the view change, look again every `poll`.
pub fn enable_mn_failures(shared: &CnShared, detector: Endpoint, poll: Nanos) {
    let mut mn = shared.mn.borrow_mut();
    mn.detector = Some(detector);
    mn.poll = poll.max(1);
}

/// [`cn_listener_resending`] on the first core of a CN process whose other cores have
/// coordinators of their own ([`crate::cores`]): every control message is also forwarded
/// through `relay` to the other cores, and an MN view is acknowledged to `detector` only once
/// this core and every other core can acknowledge it (each applied it and runs no
/// transaction of an older view). With a relay of one core it is
/// [`cn_listener_resending`].
///
/// # Errors
/// [`VerbsError`] if receiving or sending fails.
pub async fn cn_listener_with_cores<V: Verbs + Clock>(
    ctx: &V,
    store: Rc<Store>,
    shared: CnShared,
    relay: &CoreRelay,
    detector: Endpoint,
    timing: ListenerTiming,
) -> Result<(), VerbsError> {
    let ListenerTiming {
        poll,
        resend,
        until,
    } = timing;
    enable_mn_failures(&shared, detector, poll);
    // The epoch this core can acknowledge, waiting for the other cores.
    let mut due: Option<u64> = None;
    // The epoch last acknowledged and when.
    let mut acked: Option<(u64, Nanos)> = None;
    while ctx.now() < until {
        while let Some(msg) = ctx.try_recv()? {
            apply_cn_message(&msg.payload, &store, &shared);
            relay.forward(&msg.payload);
        }
        if let Some(epoch) = shared.mn.borrow_mut().ack_ready() {
            due = due.max(Some(epoch));
        }
        let ack = due.filter(|&epoch| relay.ready(epoch));
        if ack.is_some() {
            due = None;
        }
        let now = ctx.now();
        let again = match (resend, acked) {
            (Some(period), Some((epoch, at)))
                if shared.mn.borrow().paused() && now.saturating_sub(at) >= period =>
            {
                Some(epoch)
            }
            _ => None,
        };
        if let Some(epoch) = ack.or(again) {
            ctx.send(detector, &ControlMsg::MnAck { epoch }.emit())
                .await?;
            acked = Some((epoch, now));
        }
        ctx.sleep(poll).await;
    }
    Ok(())
}

/// A core's side of its CN's control messages on a CN process of several cores
/// ([`crate::cores`]): turns MN-failure
/// handling on for `shared`'s coordinators at once (reports go to `detector`; waiting
/// coordinators look again every `poll`), then, every `poll` until `until` on `clock`,
/// applies what `follower` received to `store`'s view and `shared`, and reports the epoch
/// its core can acknowledge.
pub fn core_follower<C: Clock>(
    clock: C,
    store: Rc<Store>,
    shared: CnShared,
    follower: CoreFollower,
    detector: Endpoint,
    poll: Nanos,
    until: Nanos,
) -> impl Future<Output = ()> {
    enable_mn_failures(&shared, detector, poll);
    async move {
        while clock.now() < until {
            for payload in follower.take() {
                apply_cn_message(&payload, &store, &shared);
            }
            if let Some(epoch) = shared.mn.borrow_mut().ack_ready() {
                follower.ready(epoch);
            }
            clock.sleep(poll.max(1)).await;
        }
    }
}

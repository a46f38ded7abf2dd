//! Crash recovery in the simulator for protocols whose papers specify no failure detector
//! (OOCC §V, Motor): a detector task on a recovery CN suspects failed CNs; for each, a task
//! of its own cuts the CN off every MN, lets the protocol recover that CN's coordinators one
//! by one from their logs, writes each decision into the history and records a
//! [`RecoveryEvent`]. Pandora's detector (Pandora §3.2.2) lives in `dmem-ford`; it runs the
//! same [`HeartbeatDetector`].
//!
//! Two detectors ([`Detection`]):
//! * [`Detection::Heartbeat`], the default: every watched CN sends a heartbeat message to the
//!   detector every [`RecoveryTiming::heartbeat`] (messages charged on the simulated NICs as
//!   any other), and the [`HeartbeatDetector`] suspects a CN silent for longer than
//!   [`RecoveryTiming::timeout`]. A reported recovery latency includes that timeout. A CN
//!   that is only slow (or whose heartbeats are delayed) is suspected too: it is cut off
//!   every MN before recovery touches its coordinators' state, so it loses availability
//!   (its later verbs fail), never safety.
//! * [`Detection::Oracle`]: the simulator's crash state, polled every
//!   [`RecoveryTiming::poll`] ([`spawn_crash_watch`]): detection within a poll, no false
//!   suspicion, no messages. Only a caller that asks for it gets it (a test measuring
//!   recovery alone); its latencies are lower bounds.

use std::cell::RefCell;
use std::rc::Rc;

use dmem_sim::{Sim, SimContext};
use dmem_txn::History;
use dmem_verbs::{Clock, Nanos, NodeId, Verbs};

use crate::oracle::{settle_history, spawn_crash_watch};
use crate::process::ALIVE;
use crate::{
    DeployError, HeartbeatDetector, RecoveredCoordinator, RecoveryEvent, RecoveryTiming,
    SimLinkTerminator,
};

/// How the simulated recovery of [`spawn_log_recovery`] learns that a CN failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Detection {
    /// Heartbeat messages and a timeout ([`spawn_heartbeat_watch`]).
    #[default]
    Heartbeat,
    /// The simulator's crash state ([`spawn_crash_watch`]): an oracle, for callers that ask.
    Oracle,
}

/// What a simulated recovery task shares with its deployment.
#[derive(Clone, Default)]
pub struct RecoveryState {
    /// The CN failures recovered so far.
    pub events: Rc<RefCell<Vec<RecoveryEvent>>>,
    /// The first recovery step that failed.
    pub error: Rc<RefCell<Option<String>>>,
    /// CNs that came back after their crash was recovered (a restart), for the heartbeat
    /// detector to watch again from its next poll ([`spawn_heartbeat_watch`]): a later
    /// crash of the new incarnation is suspected and recovered as the first was. (The
    /// oracle tells crashes apart by count and needs none.)
    pub rejoined: Rc<RefCell<Vec<NodeId>>>,
    /// Called on the recovery CN once a CN's recovery is over, with its event (after it
    /// was pushed to `events`): a deployment that restarts recovered CNs starts there.
    pub on_recovered: Rc<RefCell<Option<OnRecovered>>>,
}

/// What [`RecoveryState::on_recovered`] calls: the recovery CN's context and the event.
pub type OnRecovered = Rc<dyn Fn(&SimContext, &RecoveryEvent)>;

impl std::fmt::Debug for RecoveryState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecoveryState")
            .field("events", &self.events)
            .field("error", &self.error)
            .field("rejoined", &self.rejoined)
            .field("on_recovered", &self.on_recovered.borrow().is_some())
            .finish()
    }
}

/// Spawns a heartbeat failure detector on CN `recovery_cn` (thread 0): every `timing.poll`
/// of virtual time until `timing.until` it asks `cns()` for the CNs to watch (all but its own
/// CN; a CN seen for
/// the first time is counted as heard from then, and gets a heartbeat task on its thread 1,
/// or 0 if it has one thread, that sends a message to the detector every
/// `timing.heartbeat` until `timing.until`), receives the heartbeats, and for each CN the
/// [`HeartbeatDetector`] newly suspects spawns `on_suspect(ctx, cn)` as a task of its own
/// on the recovery CN, so that concurrent failures are recovered in parallel. Each CN is
/// reported once per crash: a CN pushed to `rejoined` (restarted after its recovery) is
/// taken out at the next poll, watched again as heard from then
/// ([`HeartbeatDetector::rejoin`]) and gets a new heartbeat task (its old one died with
/// it), so a crash of its new incarnation is suspected again.
///
/// # Errors
/// [`DeployError::Sim`] if the recovery CN has no context.
pub fn spawn_heartbeat_watch<C, F, Fut>(
    sim: &Rc<Sim>,
    recovery_cn: u16,
    timing: RecoveryTiming,
    cns: C,
    rejoined: Rc<RefCell<Vec<NodeId>>>,
    on_suspect: F,
) -> Result<(), DeployError>
where
    C: Fn() -> Vec<NodeId> + 'static,
    F: Fn(SimContext, NodeId) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let ctx = sim.context(sim.cn(recovery_cn), 0)?;
    let detector = ctx.local_endpoint();
    let sim2 = Rc::clone(sim);
    let c = ctx.clone();
    sim.spawn(&ctx, async move {
        let mut fd = HeartbeatDetector::new(timing.timeout);
        while c.now() < timing.until {
            let now = c.now();
            for cn in cns() {
                // The detector's own CN (it may run coordinators too, as the final
                // reader of a run) is not watched: it would cut itself off.
                if cn == c.node() || fd.watches(cn) {
                    continue;
                }
                fd.watch(cn, now);
                spawn_heartbeats(&sim2, cn, detector, timing);
            }
            let back: Vec<NodeId> = rejoined.borrow_mut().drain(..).collect();
            for cn in back {
                if cn != c.node() {
                    fd.rejoin(cn, now);
                    spawn_heartbeats(&sim2, cn, detector, timing);
                }
            }
            // Anything else that arrives here is not for the detector.
            while let Ok(Some(msg)) = c.try_recv() {
                fd.heartbeat(msg.from.node, c.now());
            }
            for cn in fd.suspects(c.now()) {
                sim2.spawn(&c, on_suspect(c.clone(), cn));
            }
            c.sleep(timing.poll).await;
        }
    });
    Ok(())
}

/// CN `cn`'s heartbeat task on its thread 1 (0 if it has one thread): a message to
/// `detector` every `timing.heartbeat` until `timing.until` or its crash.
fn spawn_heartbeats(sim: &Sim, cn: NodeId, detector: dmem_verbs::Endpoint, timing: RecoveryTiming) {
    let Ok(hb) = sim.context(cn, 1).or_else(|_| sim.context(cn, 0)) else {
        return;
    };
    let h = hb.clone();
    sim.spawn(&hb, async move {
        // A crashed CN's send fails: it falls silent, as it should.
        while h.now() < timing.until && h.send(detector, ALIVE).await.is_ok() {
            h.sleep(timing.heartbeat).await;
        }
    });
}

/// Recovery for protocols that recover coordinator by coordinator from logs, in the
/// simulator: a detector ([`Detection`]) over the CNs of `coordinators()` (`(coordinator
/// id, CN)` pairs) whose task per failed CN revokes the CN's access at every MN, awaits
/// `recover(ctx, ids)` once for all of its coordinators (`ids` in id order: a protocol may
/// share work between them, as OOCC's one lock scan), settles the history with each result at
/// the time `recover` gives for it ([`settle_history`]), pushes a [`RecoveryEvent`] to
/// `state.events` and calls `state.on_recovered` with it, if set. A failed `recover` is
/// stored in `state.error` (the first one) and the other CNs' recoveries go on. CNs pushed
/// to `state.rejoined` are watched again (heartbeat detection; the oracle tells a second
/// crash apart by itself).
///
/// # Errors
/// [`DeployError::Sim`] if the recovery CN has no context.
#[allow(clippy::too_many_arguments)]
pub fn spawn_log_recovery<C, R>(
    sim: &Rc<Sim>,
    recovery_cn: u16,
    timing: RecoveryTiming,
    detection: Detection,
    history: Rc<RefCell<History>>,
    state: &RecoveryState,
    coordinators: C,
    recover: R,
) -> Result<(), DeployError>
where
    C: Fn() -> Vec<(u16, NodeId)> + 'static,
    R: AsyncFn(&SimContext, &[u16]) -> Result<Vec<(RecoveredCoordinator, Nanos)>, String> + 'static,
{
    let coordinators = Rc::new(coordinators);
    let recover = Rc::new(recover);
    let (events, error) = (Rc::clone(&state.events), Rc::clone(&state.error));
    let on_recovered = Rc::clone(&state.on_recovered);
    let sim2 = Rc::clone(sim);
    let watched = Rc::clone(&coordinators);
    let cns = move || {
        let mut cns: Vec<NodeId> = watched().into_iter().map(|(_, n)| n).collect();
        cns.sort_unstable();
        cns.dedup();
        cns
    };
    let on_failure = move |c: SimContext, cn: NodeId| {
        let (sim2, coordinators, recover, history, events, error, on_recovered) = (
            Rc::clone(&sim2),
            Rc::clone(&coordinators),
            Rc::clone(&recover),
            Rc::clone(&history),
            Rc::clone(&events),
            Rc::clone(&error),
            Rc::clone(&on_recovered),
        );
        async move {
            let detected_at = c.now();
            // Cut off first: a CN suspected while alive can no longer touch MN memory
            // once recovery starts deciding its transactions.
            for mn in 0..sim2.mn_count() {
                SimLinkTerminator(Rc::clone(&sim2)).terminate(sim2.mn(mn), cn);
            }
            let terminated_at = c.now();
            let mut ids: Vec<u16> = coordinators()
                .into_iter()
                .filter(|&(_, n)| n == cn)
                .map(|(id, _)| id)
                .collect();
            ids.sort_unstable();
            let mut recovered = Vec::new();
            match recover(&c, &ids).await {
                Ok(done) => {
                    for (r, at) in done {
                        settle_history(&history, &r, at);
                        recovered.push(r);
                    }
                }
                Err(e) => {
                    error.borrow_mut().get_or_insert_with(|| {
                        format!("recovering the coordinators {ids:?} of node {}: {e}", cn.0)
                    });
                }
            }
            let now = c.now();
            let event = RecoveryEvent {
                cn,
                detected_at,
                terminated_at,
                logs_recovered_at: now,
                finished_at: now,
                coordinators: recovered,
                scanned_locks: 0,
            };
            events.borrow_mut().push(event.clone());
            let hook = on_recovered.borrow().clone();
            if let Some(hook) = hook {
                hook(&c, &event);
            }
        }
    };
    match detection {
        Detection::Heartbeat => {
            let rejoined = Rc::clone(&state.rejoined);
            spawn_heartbeat_watch(sim, recovery_cn, timing, cns, rejoined, on_failure)
        }
        Detection::Oracle => spawn_crash_watch(sim, recovery_cn, timing, cns, on_failure),
    }
}

/// Brings crashed CN `node` back up in the simulator (Pandora §6.3: the failed coordinators
/// are brought back; LOTUS §6: the system restarts a crashed CN): after `delay` of virtual
/// time on `clock` (the process restart, which the simulator does not model), restarts the
/// node as soon as the executor has dropped its old tasks (looking every `poll`). Its MN
/// links stay terminated; [`restore_links`] gives them back once the protocol lets the new
/// incarnation reach MN memory.
///
/// # Errors
/// A message saying so if `node` is not crashed (nothing to restart).
pub async fn restart_crashed_cn(
    sim: &Sim,
    clock: &SimContext,
    node: NodeId,
    delay: Nanos,
    poll: Nanos,
) -> Result<(), String> {
    if delay > 0 {
        clock.sleep(delay).await;
    }
    // The executor drops a crashed CN's tasks before it polls others: at most a poll.
    while !sim.restart(node) {
        if !sim.is_crashed(node) {
            return Err(format!(
                "node {} restarted while it was not crashed",
                node.0
            ));
        }
        clock.sleep(poll.max(1)).await;
    }
    Ok(())
}

/// Gives restarted CN `node` its access to every MN back (active-link termination revoked
/// it, Pandora §3.2.2 step 2): the new incarnation's connections.
pub fn restore_links(sim: &Sim, node: NodeId) {
    for mn in 0..sim.mn_count() {
        sim.restore(sim.mn(mn), node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_sim::ClusterConfig;
    use dmem_txn::History;
    use dmem_verbs::{Nanos, VerbsExt as _};

    const TIMING: RecoveryTiming = RecoveryTiming {
        heartbeat: 10_000,
        timeout: 50_000,
        poll: 5_000,
        until: 1_000_000,
    };
    const CRASH_AT: Nanos = 200_000;

    /// One MN, two worker CNs and the detector's CN, two threads each.
    fn two_workers_and_a_detector() -> Rc<Sim> {
        let config = ClusterConfig::new("cx6")
            .unwrap()
            .mns(1)
            .cns(3)
            .threads_per_cn(2);
        Rc::new(Sim::new(config).unwrap())
    }

    /// One MN, CNs 0 and 1 with coordinators 0 and 1, CN 2 recovering. Returns the events
    /// and, per recovered coordinator, whether its CN could still READ MN memory when
    /// `recover` ran.
    fn run(
        timing: RecoveryTiming,
        detection: Detection,
        crash: bool,
    ) -> (Rc<Sim>, Vec<RecoveryEvent>, Vec<(u16, bool)>) {
        let sim = two_workers_and_a_detector();
        let state = RecoveryState::default();
        let reached = Rc::new(RefCell::new(Vec::new()));
        let workers = [sim.cn(0), sim.cn(1)];
        let probes: Vec<SimContext> = workers
            .iter()
            .map(|&cn| sim.context(cn, 0).unwrap())
            .collect();
        let addr = sim.region(sim.mn(0)).at(0).unwrap();
        let r = Rc::clone(&reached);
        spawn_log_recovery(
            &sim,
            2,
            timing,
            detection,
            Rc::new(RefCell::new(History::default())),
            &state,
            move || vec![(0, workers[0]), (1, workers[1])],
            async move |c: &SimContext, ids: &[u16]| {
                let mut done = Vec::new();
                for &id in ids {
                    let ok = probes[usize::from(id)].read(addr, 8).await.is_ok();
                    r.borrow_mut().push((id, ok));
                    let rc = RecoveredCoordinator {
                        coordinator: id,
                        txn: None,
                        decision: None,
                        restored: 0,
                        unlocked: 0,
                    };
                    done.push((rc, c.now()));
                }
                Ok(done)
            },
        )
        .unwrap();
        if crash {
            sim.crash_at(workers[0], CRASH_AT);
        }
        sim.run_until(timing.until);
        assert_eq!(*state.error.borrow(), None);
        let events = state.events.borrow().clone();
        let reached = reached.borrow().clone();
        (sim, events, reached)
    }

    #[test]
    fn heartbeats_detect_a_crash_after_the_timeout_and_cost_messages() {
        let (sim, events, _) = run(TIMING, Detection::Heartbeat, true);
        assert_eq!(events.len(), 1, "{events:?}");
        let e = &events[0];
        assert_eq!(e.cn, sim.cn(0));
        assert_eq!(e.coordinators.len(), 1);
        let detection = e.detected_at - CRASH_AT;
        // The last heartbeat left at most a period before the crash; silence is judged at
        // the detector's polls.
        assert!(
            detection > TIMING.timeout - TIMING.heartbeat
                && detection <= TIMING.timeout + TIMING.poll + 5_000,
            "detected {detection} ns after the crash"
        );
        // The surviving CN's heartbeats went over its NIC and arrived at the detector's.
        let stats = sim.stats();
        let live = stats.node(sim.cn(1));
        assert!(live.nic.messages_sent >= TIMING.until / TIMING.heartbeat / 2);
        assert!(live.nic.bytes_out >= live.nic.messages_sent * ALIVE.len() as u64);
        assert!(stats.node(sim.cn(2)).nic.bytes_in > 0);
        // Nothing beyond heartbeats: the crashed CN sent only until its crash.
        let dead = stats.node(sim.cn(0)).nic.messages_sent;
        assert!(dead <= CRASH_AT / TIMING.heartbeat + 1, "{dead}");
    }

    #[test]
    fn the_oracle_detects_within_a_poll_without_messages() {
        let (sim, events, _) = run(TIMING, Detection::Oracle, true);
        assert_eq!(events.len(), 1);
        assert!(events[0].detected_at - CRASH_AT <= TIMING.poll);
        assert_eq!(sim.stats().node(sim.cn(1)).nic.messages_sent, 0);
    }

    #[test]
    fn no_crash_no_suspicion() {
        let (_, events, _) = run(TIMING, Detection::Heartbeat, false);
        assert_eq!(events, Vec::new());
    }

    /// A CN restarted once its recovery is over ([`RecoveryState::on_recovered`]) and
    /// pushed to [`RecoveryState::rejoined`] is watched again: its second crash is
    /// suspected and recovered too (heartbeats and oracle alike), and a restarted CN that
    /// is not announced stays unwatched (no second event).
    #[test]
    fn a_restarted_cn_that_rejoins_is_suspected_again_after_its_next_crash() {
        const AGAIN: Nanos = 600_000;
        for (detection, announce, expect) in [
            (Detection::Heartbeat, true, 2),
            (Detection::Heartbeat, false, 1),
            (Detection::Oracle, true, 2),
        ] {
            let sim = two_workers_and_a_detector();
            let state = RecoveryState::default();
            let workers = [sim.cn(0), sim.cn(1)];
            let (s, rejoined) = (Rc::clone(&sim), Rc::clone(&state.rejoined));
            *state.on_recovered.borrow_mut() =
                Some(Rc::new(move |c: &SimContext, e: &RecoveryEvent| {
                    let (sim, c2, cn, rejoined) =
                        (Rc::clone(&s), c.clone(), e.cn, Rc::clone(&rejoined));
                    s.spawn(c, async move {
                        restart_crashed_cn(&sim, &c2, cn, 20_000, TIMING.poll)
                            .await
                            .unwrap();
                        restore_links(&sim, cn);
                        if announce {
                            rejoined.borrow_mut().push(cn);
                        }
                    });
                }));
            spawn_log_recovery(
                &sim,
                2,
                TIMING,
                detection,
                Rc::new(RefCell::new(History::default())),
                &state,
                move || vec![(0, workers[0]), (1, workers[1])],
                async move |c: &SimContext, ids: &[u16]| {
                    Ok(ids
                        .iter()
                        .map(|&id| {
                            let rc = RecoveredCoordinator {
                                coordinator: id,
                                txn: None,
                                decision: None,
                                restored: 0,
                                unlocked: 0,
                            };
                            (rc, c.now())
                        })
                        .collect())
                },
            )
            .unwrap();
            sim.crash_at(workers[0], CRASH_AT);
            sim.crash_at(workers[0], AGAIN);
            sim.run_until(TIMING.until);
            assert_eq!(*state.error.borrow(), None);
            let events = state.events.borrow().clone();
            assert_eq!(events.len(), expect, "{detection:?} {announce}: {events:?}");
            assert!(events.iter().all(|e| e.cn == workers[0]));
            if expect == 2 {
                assert!(events[1].detected_at >= AGAIN, "{events:?}");
            }
        }
    }

    #[test]
    fn a_live_cn_suspected_falsely_is_cut_off_before_recovery() {
        // Heartbeats rarer than the timeout: both live CNs look silent.
        let timing = RecoveryTiming {
            heartbeat: 400_000,
            ..TIMING
        };
        let (sim, events, reached) = run(timing, Detection::Heartbeat, false);
        assert!(!sim.is_crashed(sim.cn(0)) && !sim.is_crashed(sim.cn(1)));
        let mut suspected: Vec<NodeId> = events.iter().map(|e| e.cn).collect();
        suspected.sort_unstable();
        assert_eq!(suspected, vec![sim.cn(0), sim.cn(1)]);
        // Recovery of each coordinator ran only once its CN could no longer reach the MN.
        let mut reached = reached;
        reached.sort_unstable();
        assert_eq!(reached, vec![(0, false), (1, false)]);
    }
}

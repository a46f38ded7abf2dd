//! Crash recovery driven by an oracle failure detector, for protocols whose papers do not
//! specify a detector (OOCC §V, Motor): one simulated task on a recovery CN polls the
//! simulator for crashed CNs, cuts each crashed CN off every MN, lets the protocol recover
//! that CN's coordinators one by one, writes each decision into the history and records a
//! [`RecoveryEvent`]. Pandora's heartbeat detector (Pandora §3.2.1) lives in `dmem-ford`.
//!
//! The oracle detects a crash at the first poll after it happened; a heartbeat detector
//! would add its timeout. Recovery latencies reported through it are therefore lower
//! bounds, which the crate READMEs of the protocols using it say.

use std::cell::RefCell;
use std::rc::Rc;

use dmem_sim::{Sim, SimContext};
use dmem_txn::{CoordinatorId, History, TxnId, TxnOutcome};
use dmem_verbs::{Clock, Nanos, NodeId};

use crate::{
    Decision, DeployError, RecoveredCoordinator, RecoveryEvent, RecoveryTiming, SimLinkTerminator,
};

/// Writes recovery's decision into the history: the crashed coordinator's in-flight
/// transaction (recorded `Unknown` before its first commit WRITE) committed at `now` if it
/// was rolled forward, aborted with nothing installed if it was rolled back. Without a
/// decision (`txn` or `decision` unset) no commit WRITE of the coordinator was posted, so
/// any transaction of it still `Unknown` installed nothing and is marked aborted.
pub fn settle_history(history: &RefCell<History>, r: &RecoveredCoordinator, now: Nanos) {
    let mut h = history.borrow_mut();
    let coordinator = CoordinatorId(u32::from(r.coordinator));
    let (Some(seq), Some(decision)) = (r.txn, r.decision) else {
        for t in h
            .txns
            .iter_mut()
            .filter(|t| t.id.coordinator == coordinator && t.outcome == TxnOutcome::Unknown)
        {
            t.outcome = TxnOutcome::Aborted;
            t.writes.clear();
        }
        return;
    };
    let id = TxnId { coordinator, seq };
    if let Some(t) = h
        .txns
        .iter_mut()
        .find(|t| t.id == id && t.outcome == TxnOutcome::Unknown)
    {
        match decision {
            Decision::RollForward => {
                t.outcome = TxnOutcome::Committed;
                t.end = now;
            }
            Decision::RollBack => {
                t.outcome = TxnOutcome::Aborted;
                t.writes.clear();
            }
        }
    }
}

/// What an oracle recovery task shares with its deployment.
#[derive(Debug, Clone, Default)]
pub struct OracleState {
    /// The CN failures recovered so far.
    pub events: Rc<RefCell<Vec<RecoveryEvent>>>,
    /// The first recovery step that failed.
    pub error: Rc<RefCell<Option<String>>>,
}

/// Spawns the oracle failure detector on CN `recovery_cn` (thread 0): every `timing.poll` of
/// virtual time until `timing.until` it asks `cns()` for the CNs to watch, and for each one
/// that crashed since, spawns `on_crash(ctx, cn)` as a task of its own on the recovery CN,
/// so that concurrent failures are recovered in parallel. Each crash of a CN is reported
/// once (a CN crashes again only after a restart, which only LOTUS does).
///
/// # Errors
/// [`DeployError::Sim`] if the recovery CN has no context.
pub fn spawn_crash_watch<C, F, Fut>(
    sim: &Rc<Sim>,
    recovery_cn: u16,
    timing: RecoveryTiming,
    cns: C,
    on_crash: F,
) -> Result<(), DeployError>
where
    C: Fn() -> Vec<NodeId> + 'static,
    F: Fn(SimContext, NodeId) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let ctx = sim.context(sim.cn(recovery_cn), 0)?;
    let sim2 = Rc::clone(sim);
    let c = ctx.clone();
    sim.spawn(&ctx, async move {
        // Per CN reported, the crashes reported: a CN that restarted (LOTUS §6) and crashed
        // again is reported again.
        let mut done: Vec<(NodeId, u32)> = Vec::new();
        while c.now() < timing.until {
            let mut watched = cns();
            watched.sort_unstable();
            watched.dedup();
            for cn in watched {
                let crashes = sim2.crashes(cn);
                if !sim2.is_crashed(cn) || done.contains(&(cn, crashes)) {
                    continue;
                }
                done.push((cn, crashes));
                sim2.spawn(&c, on_crash(c.clone(), cn));
            }
            c.sleep(timing.poll).await;
        }
    });
    Ok(())
}

/// Oracle recovery for protocols that recover coordinator by coordinator: a
/// [`spawn_crash_watch`] over the CNs of `coordinators()` (`(coordinator id, CN)` pairs)
/// whose task per crashed CN revokes the CN's access at every MN, awaits `recover(ctx, id)`
/// for each of its coordinators (in id order), settles the history with each result
/// ([`settle_history`]) and pushes a [`RecoveryEvent`] to `state.events`. A failed `recover`
/// is stored in `state.error` (the first one) and recovery goes on.
///
/// # Errors
/// [`DeployError::Sim`] if the recovery CN has no context.
pub fn spawn_oracle_recovery<C, R>(
    sim: &Rc<Sim>,
    recovery_cn: u16,
    timing: RecoveryTiming,
    history: Rc<RefCell<History>>,
    state: &OracleState,
    coordinators: C,
    recover: R,
) -> Result<(), DeployError>
where
    C: Fn() -> Vec<(u16, NodeId)> + 'static,
    R: AsyncFn(&SimContext, u16) -> Result<RecoveredCoordinator, String> + 'static,
{
    let coordinators = Rc::new(coordinators);
    let recover = Rc::new(recover);
    let (events, error) = (Rc::clone(&state.events), Rc::clone(&state.error));
    let sim2 = Rc::clone(sim);
    let watched = Rc::clone(&coordinators);
    spawn_crash_watch(
        sim,
        recovery_cn,
        timing,
        move || watched().into_iter().map(|(_, n)| n).collect(),
        move |c: SimContext, cn: NodeId| {
            let (sim2, coordinators, recover, history, events, error) = (
                Rc::clone(&sim2),
                Rc::clone(&coordinators),
                Rc::clone(&recover),
                Rc::clone(&history),
                Rc::clone(&events),
                Rc::clone(&error),
            );
            async move {
                let detected_at = c.now();
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
                for id in ids {
                    match recover(&c, id).await {
                        Ok(r) => {
                            settle_history(&history, &r, c.now());
                            recovered.push(r);
                        }
                        Err(e) => {
                            error
                                .borrow_mut()
                                .get_or_insert_with(|| format!("recovering coordinator {id}: {e}"));
                        }
                    }
                }
                let now = c.now();
                events.borrow_mut().push(RecoveryEvent {
                    cn,
                    detected_at,
                    terminated_at,
                    logs_recovered_at: now,
                    finished_at: now,
                    coordinators: recovered,
                    scanned_locks: 0,
                });
            }
        },
    )
}

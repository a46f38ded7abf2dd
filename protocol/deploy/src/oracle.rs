//! The oracle failure detector of the simulator ([`spawn_crash_watch`]: it polls the
//! simulator's crash state) and the history bookkeeping every recovery shares
//! ([`settle_history`]).
//!
//! The oracle detects a crash at the first poll after it happened, with no timeout and no
//! false suspicion; latencies measured behind it are lower bounds. Protocols recovering
//! from logs use a heartbeat detector by default ([`crate::spawn_log_recovery`]); the
//! oracle stays for callers that ask for it ([`crate::Detection::Oracle`]) and for LOTUS's
//! membership service (`dmem-protocols`' `lotus.rs`, which calls [`spawn_crash_watch`]
//! directly; moving it to [`crate::spawn_heartbeat_watch`] is its owners' call).

use std::cell::RefCell;
use std::rc::Rc;

use dmem_sim::{Sim, SimContext};
use dmem_txn::{CoordinatorId, History, TxnId, TxnOutcome};
use dmem_verbs::{Clock, Nanos, NodeId};

use crate::{Decision, DeployError, RecoveredCoordinator, RecoveryTiming};

/// Writes recovery's decision into the history: the crashed coordinator's in-flight
/// transaction (recorded `Unknown` before its first commit WRITE) committed at `now` if it
/// was rolled forward, aborted with nothing installed if it was rolled back. Without a
/// decision (`txn` or `decision` unset) no commit WRITE of the coordinator was posted, so
/// any transaction of it still `Unknown` installed nothing and is marked aborted.
///
/// That last rule holds only if a protocol resolves a committed transaction in the history
/// before it clears the log that recovery would decide it from (truncates a redo log,
/// marks an op log idle): a CN killed between a cleared log and a later resolution would
/// leave installed versions that the settled history calls aborted.
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

/// Spawns the oracle failure detector on CN `recovery_cn` (thread 0): every `timing.poll` of
/// virtual time until `timing.until` it asks `cns()` for the CNs to watch, and for each one
/// that crashed since, spawns `on_crash(ctx, cn)` as a task of its own on the recovery CN,
/// so that concurrent failures are recovered in parallel. Each crash of a CN is reported
/// once (a CN crashes again only after a restart: LOTUS, Pandora, FORD and Motor restart CNs).
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

//! One protocol on one cluster: the [`Deployment`] every protocol implements, and the two
//! capabilities a protocol adds when it has them — [`SimRecovery`] (CN failures detected
//! and recovered as simulated tasks) and [`ProcessDeployment`] (its part of a real
//! cluster's CN processes). A protocol implements only what it supports; a command asks
//! for a capability ([`Deployment::sim_recovery`], [`Deployment::processes`]) and refuses
//! with one line when the protocol has none.

use std::any::Any;
use std::cell::Cell;
use std::rc::Rc;

use dmem_sim::Sim;
use dmem_txn::{BoxCoordinator, Key, TableId, TxnKind};
use dmem_verbs::NodeId;

use crate::{
    AnyContext, DeployError, LateCoordinators, Placement, RecoveryEvent, RecoveryTiming, process,
};

/// One protocol deployed on one cluster (simulated, or this process's part of a real one).
///
/// Call order: [`load`](Self::load) every record, [`coordinator`](Self::coordinator) for
/// every worker, run, then [`final_coordinator`](Self::final_coordinator) /
/// [`read_final`](Self::read_final). Crash recovery on the simulator goes through
/// [`sim_recovery`](Self::sim_recovery), CN processes of a real cluster through
/// [`processes`](Self::processes).
pub trait Deployment {
    /// Where its loader placed the records loaded so far, read-only and shareable across
    /// threads, for [`Protocol::deploy_placed`](crate::Protocol::deploy_placed); `None`
    /// (the default) for a protocol that does not hand it out.
    fn placement(&self) -> Option<Placement> {
        None
    }

    /// Writes one initial record out of band (outside virtual time).
    ///
    /// # Errors
    /// [`DeployError`] (a full index bucket: [`DeployError::is_index_full`]).
    fn load(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), DeployError>;

    /// A worker coordinator with id `id` on `ctx` (a context of a worker CN, on the fabric
    /// the deployment was laid out for).
    ///
    /// # Errors
    /// [`DeployError`] if the protocol has no room for `id`.
    fn coordinator(&mut self, ctx: AnyContext, id: u16) -> Result<BoxCoordinator, DeployError>;

    /// A coordinator on `ctx` that knows every coordinator recovery declared failed (for a
    /// read-only check transaction after recovery).
    ///
    /// By default a worker coordinator (for a protocol whose coordinators learn about failed
    /// coordinators from shared state anyway).
    ///
    /// # Errors
    /// [`DeployError`] if the protocol has no room for `id`.
    fn final_coordinator(
        &mut self,
        ctx: AnyContext,
        id: u16,
    ) -> Result<BoxCoordinator, DeployError> {
        self.coordinator(ctx, id)
    }

    /// The committed value of `(table, key)` read from MN memory out of band (after the
    /// run), reading past locks left by coordinators that recovery declared failed.
    fn read_final(&self, table: TableId, key: Key) -> Option<Vec<u8>>;

    /// How many MNs hold each record (1 by default: no replication), so that a command
    /// knows whether an MN failure can be survived.
    fn replicas(&self) -> u16 {
        1
    }

    /// Protocol-specific counters summed over coordinators that finished (e.g. PILL steals).
    fn counter(&self, name: &str) -> Option<u64> {
        let _ = name;
        None
    }

    /// The counters this deployment reports at the end of a run of a real cluster (a CN
    /// process's report lists them), by name: a subset of what
    /// [`counter`](Self::counter) answers. Empty by default.
    fn counters(&self) -> Vec<(String, u64)> {
        Vec::new()
    }

    /// The deployment as [`Any`], for a command that drives one protocol's own machinery
    /// across processes (Pandora's recovery in `dmem cn`) through its typed deployment.
    fn as_any(&self) -> &dyn Any;

    /// Where transactions should run, for a protocol that places them (LOTUS §4.3 hybrid
    /// routing); `None` (the default): every coordinator runs what its own client generates.
    fn router(&self) -> Option<Rc<dyn Router>> {
        None
    }

    /// Its failure detection and recovery on the simulator; `None` (the default) for a
    /// protocol that does not recover crashed CNs there (`dmem recover` and the litmus
    /// suite's crashes refuse it).
    fn sim_recovery(&mut self) -> Option<&mut dyn SimRecovery> {
        None
    }

    /// Its part of a CN process of a real cluster; `None` (the default) for a protocol that
    /// runs on the simulator only (`dmem cn` refuses it).
    fn processes(&mut self) -> Option<&mut dyn ProcessDeployment> {
        None
    }
}

/// CN failure detection and recovery as simulated tasks.
///
/// Call [`start_recovery`](Self::start_recovery) once, after the coordinators are made and
/// before the simulation runs; afterwards the outcome is in
/// [`recovery_events`](Self::recovery_events) and [`recovery_error`](Self::recovery_error).
pub trait SimRecovery {
    /// Starts failure detection and recovery as simulated tasks: every CN that has
    /// coordinators reports to a detector on CN `recovery_cn`, which recovers a CN that stops
    /// answering while the others keep running. Tasks stop at `timing.until`.
    ///
    /// # Errors
    /// [`DeployError`] if a context cannot be made.
    fn start_recovery(
        &mut self,
        sim: &Rc<Sim>,
        recovery_cn: u16,
        timing: RecoveryTiming,
    ) -> Result<(), DeployError>;

    /// The CN failures recovered so far.
    fn recovery_events(&self) -> Vec<RecoveryEvent>;

    /// The first recovery step that failed, if one did.
    fn recovery_error(&self) -> Option<String>;

    /// Set while a stop-the-world recovery (FORD's scan) wants the survivors not to start
    /// transactions; runners poll it between transactions. Never set (the default) by
    /// protocols that recover online.
    fn paused(&self) -> Rc<Cell<bool>> {
        Rc::new(Cell::new(false))
    }

    /// One READ per index bucket and the bytes of their records: what a scan of the whole
    /// store costs (`None` for a protocol without an index to scan).
    fn scan_cost(&self) -> Option<(u64, u64)> {
        None
    }

    /// Hands the runner a way to run coordinators the protocol starts by itself during a
    /// run on the simulator (LOTUS §6: a restarted CN executes transactions again): each
    /// one goes to `run` with its context and id. Protocols that never start coordinators
    /// ignore it (the default).
    fn run_late_coordinators(&self, run: LateCoordinators) {
        let _ = run;
    }
}

/// A protocol's part of a CN process of a real cluster (`dmem cn`).
///
/// Call order in a CN process: [`join_as_cn`](Self::join_as_cn),
/// [`join_core`](Self::join_core), [`Deployment::coordinator`] for each of its workers,
/// then [`process_tasks`](Self::process_tasks) (first core) or
/// [`core_tasks`](Self::core_tasks) (the others).
pub trait ProcessDeployment {
    /// Whether [`process_recovery`](Self::process_recovery) recovers CNs of a real cluster
    /// across processes (`false` by default: a CN process killed mid-run ends the run).
    fn recovers_across_processes(&self) -> bool {
        false
    }

    /// Tells the deployment of a CN process which CN it is (`me`, a member of `plan`) and
    /// where the other CNs are, before its [`Deployment::coordinator`]s are made: a
    /// protocol whose CNs serve each other (LOTUS's lock tables, §4.1) learns its own
    /// index and the other CNs' [`process::ClusterMember::services`] here, and serves its
    /// own from [`process_tasks`](Self::process_tasks). The default does nothing (CNs that
    /// share only MN memory).
    ///
    /// # Errors
    /// [`DeployError`] if `me` is not a member of `plan` or the protocol cannot run there.
    fn join_as_cn(&mut self, me: NodeId, plan: &process::ProcessPlan) -> Result<(), DeployError> {
        let _ = (me, plan);
        Ok(())
    }

    /// The tasks a CN process of a real cluster runs beside its coordinators (on its own
    /// executor, until the process ends): by default heartbeats to `plan.detector` on
    /// `ctxs.heartbeat` ([`process::alive_task`]); a protocol with recovery across processes
    /// adds its detector's heartbeats and its CN-side listener on `ctxs.listener`. Call it
    /// after this CN's [`Deployment::coordinator`]s are made.
    ///
    /// # Errors
    /// [`DeployError`] if the protocol cannot set its CN side up.
    fn process_tasks(
        &mut self,
        me: NodeId,
        ctxs: process::CnContexts,
        plan: &process::ProcessPlan,
    ) -> Result<Vec<process::LocalTask>, DeployError> {
        let _ = me;
        Ok(vec![process::alive_task(
            ctxs.heartbeat,
            plan.detector,
            plan.heartbeat,
        )])
    }

    /// The detector's side of recovery across processes, on `ctx` (whose endpoint is
    /// `plan.detector`; heartbeats arrive there) with `terminator` reaching the MN processes.
    /// `None` (the default) for a protocol without recovery across processes. Afterwards
    /// [`Deployment::final_coordinator`] knows the coordinators it recovered.
    ///
    /// # Errors
    /// [`DeployError`] if the protocol cannot set its detector up.
    fn process_recovery(
        &mut self,
        ctx: AnyContext,
        terminator: process::MessageLinkTerminator,
        plan: &process::ProcessPlan,
    ) -> Result<Option<Box<dyn process::ProcessRecovery>>, DeployError> {
        let _ = (ctx, terminator, plan);
        Ok(None)
    }

    /// Whether a CN process may split its coordinators across cores (one executor per
    /// core, `dmem cn` with `threads > 1`), each core's coordinators made by a deployment of
    /// its own — the same spec and regions, loaded and [`join_as_cn`](Self::join_as_cn)ed as
    /// the same CN — while one of them runs the CN's [`process_tasks`](Self::process_tasks),
    /// [`process_recovery`](Self::process_recovery) and
    /// [`Deployment::final_coordinator`]. That is sound when a coordinator keeps no CN-side
    /// state that another core's coordinators or those tasks must see (caches and hints may
    /// differ per core), or when the protocol carries that state to every core itself
    /// ([`join_core`](Self::join_core), [`core_tasks`](Self::core_tasks)); `Err(why)` names
    /// the state otherwise. The default refuses, because a protocol that did not say cannot
    /// be assumed to keep none.
    ///
    /// # Errors
    /// Why this protocol's coordinators must share one deployment per CN.
    fn splits_across_cores(&self) -> Result<(), String> {
        Err(
            "its coordinators may share CN-side state (the protocol does not say they keep none)"
                .to_owned(),
        )
    }

    /// Tells the deployment of one core of a CN process which core it serves (`group`,
    /// shared by every core's deployment), before its [`Deployment::coordinator`]s are
    /// made. A CN process calls it after [`join_as_cn`](Self::join_as_cn), with a group of
    /// one core when it runs one; the default ignores it (coordinators that keep no CN-side
    /// state the cores must share).
    ///
    /// # Errors
    /// [`DeployError`] if the protocol cannot join the group.
    fn join_core(&mut self, group: process::CoreGroup) -> Result<(), DeployError> {
        let _ = group;
        Ok(())
    }

    /// The tasks a core other than the first of a CN process runs beside its coordinators,
    /// until they are done (the first core runs [`process_tasks`](Self::process_tasks)):
    /// none by default; for Pandora, the core's end of its CN listener (§3.2.2, §3.2.5, see
    /// `dmem-ford`'s `cores`); for LOTUS, the lock servers of this core's share of the
    /// service endpoints (`services`, [`process::service_core`]). Call it after this
    /// core's coordinators are made.
    ///
    /// # Errors
    /// [`DeployError`] if the protocol cannot set the core's side up.
    fn core_tasks(
        &mut self,
        me: NodeId,
        plan: &process::ProcessPlan,
        services: Vec<process::ServiceContext>,
    ) -> Result<Vec<process::LocalTask>, DeployError> {
        let _ = (me, plan, services);
        Ok(Vec::new())
    }

    /// The MNs this process's view counts as failed (Pandora §3.2.5: dropped from the view,
    /// no longer posted to); empty by default.
    fn failed_mns(&self) -> Vec<NodeId> {
        Vec::new()
    }
}

/// The routing layer in front of the CNs (LOTUS §4.3): it picks the CN that runs a
/// transaction. Runners (the bench harness) hand each generated transaction to a
/// coordinator of that CN.
pub trait Router {
    /// The CN (index `0..cns`) that should run a transaction of `kind` whose first record is
    /// `first`; `random` is a uniformly random number the caller drew (for random
    /// placement). `None`: run it where it was generated.
    fn route(&self, kind: TxnKind, first: Option<(TableId, Key)>, random: u64) -> Option<u16>;
}

/// `deployment`'s simulated recovery, or [`DeployError::NoSimRecovery`] naming `protocol`.
///
/// # Errors
/// [`DeployError::NoSimRecovery`] when the protocol has none.
pub fn require_sim_recovery<'a>(
    deployment: &'a mut dyn Deployment,
    protocol: &str,
) -> Result<&'a mut dyn SimRecovery, DeployError> {
    deployment
        .sim_recovery()
        .ok_or_else(|| DeployError::NoSimRecovery(protocol.to_owned()))
}

/// `deployment`'s CN-process side, or [`DeployError::SimOnly`] naming `protocol`.
///
/// # Errors
/// [`DeployError::SimOnly`] when the protocol runs on the simulator only.
pub fn require_processes<'a>(
    deployment: &'a mut dyn Deployment,
    protocol: &str,
) -> Result<&'a mut dyn ProcessDeployment, DeployError> {
    deployment.processes().ok_or_else(|| DeployError::SimOnly {
        protocol: protocol.to_owned(),
        reason: "it has no CN-process side".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deployment with the four required methods and nothing else.
    struct Bare;

    impl Deployment for Bare {
        fn load(&mut self, _: TableId, _: Key, _: &[u8]) -> Result<(), DeployError> {
            Ok(())
        }
        fn coordinator(&mut self, _: AnyContext, _: u16) -> Result<BoxCoordinator, DeployError> {
            Err(DeployError::Fabric("no coordinators".to_owned()))
        }
        fn read_final(&self, _: TableId, _: Key) -> Option<Vec<u8>> {
            None
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[test]
    fn a_missing_capability_is_one_line_naming_the_protocol() {
        let mut bare = Bare;
        let e = require_sim_recovery(&mut bare, "bare").err().unwrap();
        assert_eq!(
            e.to_string(),
            "protocol `bare` does not detect and recover crashed CNs on the simulator"
        );
        let e = require_processes(&mut bare, "bare").err().unwrap();
        assert_eq!(
            e.to_string(),
            "protocol `bare` runs on the simulator only: it has no CN-process side"
        );
        // The defaults a bare deployment inherits.
        assert_eq!(bare.replicas(), 1);
        assert!(bare.counters().is_empty() && bare.router().is_none());
    }
}

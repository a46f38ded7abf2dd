//! Motor (SR and SI) as a [`Protocol`], on the simulated cluster or on a real fabric.
//!
//! Versions per record follow the workload (LOTUS §8: TATP 2, SmallBank 3, TPC-C and
//! micro-benchmarks 4; [`DeploySpec::workload`]). Coordinators keep their op logs in an
//! [`OpLogs`] owned by the deployment (CN memory that survives a crash, Motor's UPS-backed
//! DRAM); [`SimRecovery::start_recovery`] starts `dmem-deploy`'s simulated recovery behind its
//! heartbeat detector (`motor:oracle`: the oracle), which finishes a crashed CN's
//! transactions with [`dmem_motor::recover_coordinator`].
//! Across processes ([`ProcessDeployment::join_as_cn`], [`ProcessDeployment::process_recovery`]) each
//! CN writes its coordinators' op logs through to [`DurableSlots`] (files that outlive the
//! process, as Motor's UPS-backed DRAM outlives a crash) and the detector CN's heartbeat
//! [`LogRecovery`] reads a failed CN's logs from there and runs the same recovery. A CN
//! process on several cores has one deployment per core, each mirroring the op logs of
//! the coordinators it made into their own slots (one slot per coordinator id, so the
//! cores' mirrors write disjoint files); recovery reads every coordinator of the plan's
//! member, whichever core ran it.
//!
//! With `motor:restart=US` a crashed CN comes back in the simulator US µs after its failure
//! was detected, once its recovery is over (`Respawn`): its coordinators start again
//! under their old ids (why: `Respawn`) and the heartbeat detector watches it again.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use dmem_deploy::process::{
    CnContexts, DurableSlots, LocalTask, LogRecovery, MessageLinkTerminator, ProcessPlan,
    ProcessRecovery, alive_task,
};
use dmem_deploy::{
    AnyContext, Decision, DeployError, DeploySpec, Deployment, Detection, LateCoordinators,
    MnMemory, Placement, ProcessDeployment, Protocol, Recorder, RecoveredCoordinator,
    RecoveryEvent, RecoveryState, RecoveryTiming, SimRecovery, restart_crashed_cn, restore_links,
};
#[cfg(doc)]
use dmem_motor::cells_for_workload;
use dmem_motor::mvcc::VersionLayout;
use dmem_motor::{
    MotorConfig, MotorCoordinator, OpLog, OpLogMirror, OpLogs, Recovered, SyncedClock,
};
use dmem_sim::{Sim, SimContext};
use dmem_store::{AddressCache, LoadIndex};
use dmem_txn::{BoxCoordinator, Key, TableId};
use dmem_verbs::{Clock as _, Nanos, NodeId};

use crate::mvcc_deploy::{MVCC_CN_BYTES_PER_HASHED_RECORD, MvccDeploy, Records, parse_versions};

/// Motor under a registered name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MotorProtocol {
    name: String,
    config: MotorConfig,
    /// How the simulator's recovery detects a failed CN.
    detection: Detection,
    /// Versions (CVT cells) per record; `None`: [`cells_for_workload`].
    versions: Option<usize>,
    /// CN restart in the simulator (`restart=US`): a crashed CN comes back this many ns
    /// after its failure was detected, once it is recovered.
    restart_after: Option<Nanos>,
}

impl MotorProtocol {
    /// `config` registered as `name`.
    #[must_use]
    pub fn new(name: &str, config: MotorConfig) -> Self {
        Self {
            name: name.to_owned(),
            config,
            detection: Detection::Heartbeat,
            versions: None,
            restart_after: None,
        }
    }

    /// `motor:FLAGS`: the switches of [`parse_flags`](Self::parse_flags) plus `oracle` (the
    /// simulator's recovery detects a crash with the oracle instead of heartbeats:
    /// recovery measured without detection, a lower bound) and `versions=N` (N versions
    /// per record instead of the workload's default: LOTUS §8 runs Motor and LOTUS with 2)
    /// and `restart=US` (a crashed CN comes back US µs after its failure was detected, once
    /// recovered, in the simulator: `Respawn`).
    ///
    /// # Errors
    /// An unknown flag, a version count outside 1 ..= 8, or a malformed `restart=`.
    pub fn from_flags(params: &str) -> Result<Self, String> {
        let flags = || params.split(['+', ',']).filter(|f| !f.is_empty());
        let others: Vec<&str> = flags()
            .filter(|&f| f != "oracle" && !f.starts_with("versions=") && !f.starts_with("restart="))
            .collect();
        let mut p = Self::new(
            &format!("motor:{params}"),
            Self::parse_flags(&others.join("+"))?,
        );
        if flags().any(|f| f == "oracle") {
            p.detection = Detection::Oracle;
        }
        for f in flags() {
            if let Some(n) = f.strip_prefix("versions=") {
                p.versions = Some(parse_versions("motor", f, n)?);
            }
            if f.starts_with("restart=") {
                p.restart_after = crate::ford::split_restart(f)?.1;
            }
        }
        Ok(p)
    }

    /// Parses the switches of `motor:FLAG[+FLAG]`: `si`, `full-records` (LOTUS's store
    /// layout instead of Motor's full value + deltas), `no-cas` (unsafe, LOTUS §2.2
    /// motivation only), `skip-newer-abort`, `recovery-releases-only` (planted bugs).
    ///
    /// # Errors
    /// The unknown flag.
    pub fn parse_flags(params: &str) -> Result<MotorConfig, String> {
        let mut cfg = MotorConfig::sr();
        for f in params.split(['+', ',']).filter(|f| !f.is_empty()) {
            match f {
                "si" => cfg.isolation = dmem_motor::Isolation::Snapshot,
                "full-records" => cfg.layout = VersionLayout::FullRecords,
                "no-cas" => cfg.unsafe_no_cas = true,
                "skip-newer-abort" => cfg.skip_newer_abort = true,
                "recovery-releases-only" => cfg.recovery_releases_only = true,
                other => {
                    return Err(format!(
                        "unknown motor switch `{other}` (known: si, full-records, no-cas, skip-newer-abort, recovery-releases-only, oracle, versions=N, restart=US)"
                    ));
                }
            }
        }
        Ok(cfg)
    }
}

impl Protocol for MotorProtocol {
    fn name(&self) -> String {
        self.name.clone()
    }

    /// `motor:restart=US`, `motor:si+restart=US`, `motor:FLAGS+restart=US` (Motor CN restart).
    fn restarting_name(&self, after_us: u64) -> Option<String> {
        match self.name.as_str() {
            "motor" => Some(format!("motor:restart={after_us}")),
            "motor-si" => Some(format!("motor:si+restart={after_us}")),
            n if n.starts_with("motor:") => Some(format!("{n}+restart={after_us}")),
            _ => None,
        }
    }

    fn isolation(&self) -> dmem_txn::Isolation {
        match self.config.isolation {
            dmem_motor::Isolation::Serializable => dmem_txn::Isolation::Serializable,
            dmem_motor::Isolation::Snapshot => dmem_txn::Isolation::Snapshot,
        }
    }

    fn mn_bytes_per_mn(&self, spec: &DeploySpec, mns: u16) -> Result<u64, DeployError> {
        MvccDeploy::mn_bytes(
            spec,
            mns,
            0,
            self.config.layout,
            Records::Pooled,
            self.versions,
        )
    }

    /// As FORD's (`dmem-protocols`' `ford.rs`): the loader's [`dmem_store::LoadIndex`] entry
    /// of a hashed key, shared by every CN's warm cache, and the cache entries of keys a run
    /// inserts (TPC-C small measured in `dmem-motor`'s README, "Hashed tables pooled").
    fn cn_bytes_per_hashed_record(&self) -> Option<u64> {
        Some(MVCC_CN_BYTES_PER_HASHED_RECORD)
    }

    fn deploy_on(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        Ok(Box::new(self.deployment(memory, spec, history, None)?))
    }

    /// As FORD's: the loader's [`LoadIndex`] of another deployment, shared read-only.
    fn deploy_placed(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
        placement: &Placement,
    ) -> Option<Result<Box<dyn Deployment>, DeployError>> {
        Some(
            crate::common::placed_index(&self.name, placement).and_then(|placed| {
                Ok(Box::new(self.deployment(memory, spec, history, Some(placed))?) as _)
            }),
        )
    }
}

impl MotorProtocol {
    /// A deployment on `memory`, its records placed by the loader of another one if
    /// `placed` (else by its own, record by record).
    fn deployment(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
        placed: Option<Arc<LoadIndex>>,
    ) -> Result<MotorDeployment, DeployError> {
        let base = MvccDeploy::new(
            memory,
            spec,
            history,
            0,
            self.config.layout,
            Records::Pooled,
            self.versions,
        )?;
        Ok(MotorDeployment {
            name: self.name.clone(),
            config: self.config,
            base: match placed {
                Some(placed) => base.with_placement(placed),
                None => base,
            },
            paused: Rc::new(Cell::new(false)),
            oplogs: Rc::new(OpLogs::new()),
            coordinators: Rc::new(RefCell::new(Vec::new())),
            detection: self.detection,
            recovery: RecoveryState::default(),
            mirror_error: Rc::new(RefCell::new(None)),
            slots: None,
            restart: Restart {
                after: self.restart_after,
                threads: Rc::default(),
                runner: Rc::default(),
                incarnations: Rc::default(),
                cns: Rc::default(),
                coordinators: Rc::default(),
                serving_at: Rc::default(),
            },
        })
    }
}

/// Motor on one cluster.
struct MotorDeployment {
    name: String,
    config: MotorConfig,
    base: MvccDeploy,
    paused: Rc<Cell<bool>>,
    /// Every coordinator's op log (survives CN crashes).
    oplogs: Rc<OpLogs>,
    /// `(coordinator id, CN)` of every worker.
    coordinators: Rc<RefCell<Vec<(u16, NodeId)>>>,
    detection: Detection,
    recovery: RecoveryState,
    /// The first op-log write to the durable slots that failed (a real cluster's CN).
    mirror_error: Rc<RefCell<Option<String>>>,
    /// A CN process's mirror: its slots and the coordinator ids of its member of the plan
    /// (their slots are created as this deployment makes them).
    slots: Option<(Rc<DurableSlots>, Vec<u16>)>,
    restart: Restart,
}

/// CN restart in the simulator (`motor:restart=US`): what the deployment knows to bring a
/// recovered CN's coordinators back (`Respawn`).
struct Restart {
    /// After how long (from detection) a crashed CN comes back; `None`: it does not.
    after: Option<Nanos>,
    /// The simulator thread each coordinator runs on: it runs there again after a restart.
    threads: Rc<RefCell<Vec<(u16, u16)>>>,
    /// Where restarted coordinators go ([`SimRecovery::run_late_coordinators`]).
    runner: Rc<RefCell<Option<LateCoordinators>>>,
    /// Per restarted CN, its incarnation (1 after its first restart).
    incarnations: Rc<RefCell<Vec<(NodeId, u32)>>>,
    /// CN restarts done, coordinators restarted, and when the last restarted CN's
    /// coordinators started.
    cns: Rc<Cell<u64>>,
    coordinators: Rc<Cell<u64>>,
    serving_at: Rc<Cell<Option<Nanos>>>,
}

/// A crashed and recovered CN brought back in the simulator (`motor:restart=US`): `after`
/// its failure was detected and once its recovery is over (whichever comes last), the
/// simulator restarts the node, its MN links are restored, it rejoins the heartbeat
/// detector (a later crash of it is detected and recovered again) and one coordinator per
/// coordinator it lost starts on the same thread, with a fresh address cache (warm as the
/// run's CNs start) and a fresh timestamp service, handed to the runner.
///
/// **A restarted coordinator keeps its id** (as LOTUS §6's, unlike Pandora's, which take
/// new ids). Motor's recovery state is per coordinator id in CN memory that survives the
/// crash (the op log, Motor's UPS-backed DRAM: `dmem-motor`'s `oplog`), not a log region
/// in MN memory, so there is no region to spare: recovery finished the old incarnation's
/// transaction from that entry and cleared it ([`dmem_motor::recover_coordinator`]), and
/// the new incarnation logs into the same entry. Its lock value (`id + 1`) is safe to
/// reuse: a lock is logged before its CAS is posted, so recovery released every lock of
/// the old incarnation before the restart, and the old incarnation's tasks died with the
/// crash (a CN suspected while alive is crashed first: the node is only restarted once
/// crashed). What must not repeat is the
/// transaction id (coordinator id, sequence number; also the packed writer of every
/// version): the new incarnation numbers from [`dmem_motor::incarnation_seq_base`] of its
/// incarnation, past every earlier one's. Keeping ids also keeps the detector's
/// `(coordinator, CN)` list right for a second crash without any change.
struct Respawn {
    sim: Rc<Sim>,
    after: Nanos,
    poll: Nanos,
    store: Rc<dmem_store::Store>,
    shapes: Rc<dmem_motor::mvcc::Shapes>,
    config: MotorConfig,
    history: Recorder,
    oplogs: Rc<OpLogs>,
    cache: Box<dyn Fn() -> Rc<RefCell<AddressCache>>>,
    coordinators: Rc<RefCell<Vec<(u16, NodeId)>>>,
    threads: Rc<RefCell<Vec<(u16, u16)>>>,
    /// CNs back for the heartbeat detector to watch again ([`RecoveryState::rejoined`]).
    rejoined: Rc<RefCell<Vec<NodeId>>>,
    runner: Rc<RefCell<Option<LateCoordinators>>>,
    incarnations: Rc<RefCell<Vec<(NodeId, u32)>>>,
    cns: Rc<Cell<u64>>,
    restarted: Rc<Cell<u64>>,
    serving_at: Rc<Cell<Option<Nanos>>>,
    error: Rc<RefCell<Option<String>>>,
}

/// The next incarnation of `cn` in `incarnations` (1 at its first restart), recorded.
fn next_incarnation(incarnations: &RefCell<Vec<(NodeId, u32)>>, cn: NodeId) -> u32 {
    let mut all = incarnations.borrow_mut();
    match all.iter_mut().find(|(n, _)| *n == cn) {
        Some((_, i)) => {
            *i += 1;
            *i
        }
        None => {
            all.push((cn, 1));
            1
        }
    }
}

impl Respawn {
    /// Restarts the CN of `event` (its recovery just finished) as a task of its own on
    /// `clock`'s node.
    fn spawn(self: Rc<Self>, clock: &SimContext, event: &RecoveryEvent) {
        let (c, cn) = (clock.clone(), event.cn);
        let delay = (event.detected_at + self.after).saturating_sub(clock.now());
        self.sim.clone().spawn(clock, async move {
            if let Err(e) = self.restart(&c, cn, delay).await {
                self.error.borrow_mut().get_or_insert(e);
            }
        });
    }

    async fn restart(&self, clock: &SimContext, node: NodeId, delay: Nanos) -> Result<(), String> {
        let sim = &self.sim;
        if !sim.is_crashed(node) {
            // Suspected while alive (slow, or its heartbeats late): its process is killed
            // before the restart, so that the old incarnation, whose coordinators have the
            // same ids and op-log entries, never runs beside the new one.
            sim.crash_at(node, clock.now());
            clock.sleep(1).await;
        }
        restart_crashed_cn(sim, clock, node, delay, self.poll).await?;
        restore_links(sim, node);
        self.rejoined.borrow_mut().push(node);
        let incarnation = next_incarnation(&self.incarnations, node);
        let cache = (self.cache)();
        let ids: Vec<u16> = self
            .coordinators
            .borrow()
            .iter()
            .filter(|&&(_, n)| n == node)
            .map(|&(id, _)| id)
            .collect();
        let mut late = Vec::new();
        for id in ids {
            let thread = self
                .threads
                .borrow()
                .iter()
                .find(|&&(c, _)| c == id)
                .map_or(0, |&(_, t)| t);
            let ctx = sim.context(node, thread).map_err(|e| e.to_string())?;
            let ts = SyncedClock::new(ctx.clone(), node, id, self.config.epsilon);
            let co = MotorCoordinator::new(
                ctx.clone(),
                Rc::clone(&self.store),
                Rc::clone(&self.shapes),
                self.config,
                id,
                Rc::clone(&cache),
                self.history.clone(),
                ts,
            )
            .with_op_log(Rc::clone(&self.oplogs))
            .in_incarnation(incarnation);
            late.push((ctx, id, co));
        }
        self.cns.set(self.cns.get() + 1);
        self.restarted.set(self.restarted.get() + late.len() as u64);
        self.serving_at.set(Some(clock.now()));
        let runner = self.runner.borrow().clone();
        if let Some(run) = runner {
            for (ctx, id, co) in late {
                run(ctx, id, Box::new(co));
            }
        }
        Ok(())
    }
}

/// A CN process's op logs written through to [`DurableSlots`] (memory that outlives the
/// process, as Motor's UPS-backed DRAM outlives a crash), for recovery by another CN.
struct SlotMirror {
    slots: Rc<DurableSlots>,
    error: Rc<RefCell<Option<String>>>,
}

impl OpLogMirror for SlotMirror {
    fn store(&self, id: u16, log: &OpLog) {
        match self.slots.write(id, &log.emit()) {
            Ok(()) => {}
            // Recovery finishing another CN's coordinator: its log is that CN's to keep.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                self.error
                    .borrow_mut()
                    .get_or_insert_with(|| format!("op log of coordinator {id}: {e}"));
            }
        }
    }
}

/// What Motor's recovery did for coordinator `id`, in the protocol-neutral form.
fn recovered(id: u16, r: &Recovered) -> RecoveredCoordinator {
    RecoveredCoordinator {
        coordinator: id,
        txn: r.rolled_forward,
        decision: r.rolled_forward.map(|_| Decision::RollForward),
        restored: r.restored,
        unlocked: r.unlocked,
    }
}

impl MotorDeployment {
    /// Mirrors this deployment's op logs to the durable slots of `plan` (CN `me`'s process):
    /// from now on each coordinator of `me` it makes gets a fresh slot first.
    fn mirror_to_slots(&mut self, me: NodeId, plan: &ProcessPlan) -> Result<(), DeployError> {
        if self.restart.after.is_some() {
            return Err(DeployError::SimOnly {
                protocol: self.name.clone(),
                reason: "a CN restart (`restart=US`) runs on the simulator: `dmem cluster` does not restart a killed CN".to_owned(),
            });
        }
        if self.slots.is_some() {
            return Ok(());
        }
        let slots = Rc::new(
            DurableSlots::new(&plan.state_dir)
                .map_err(|e| DeployError::Fabric(format!("{}: {e}", plan.state_dir.display())))?,
        );
        self.oplogs.set_mirror(Box::new(SlotMirror {
            slots: Rc::clone(&slots),
            error: Rc::clone(&self.mirror_error),
        }));
        let mine = plan.member(me).map(|m| m.coordinators.clone());
        self.slots = Some((slots, mine.unwrap_or_default()));
        Ok(())
    }

    /// Starts coordinator `id`'s slot afresh if it is one of this CN's (before it logs).
    fn create_slot(&self, id: u16) -> Result<(), DeployError> {
        match &self.slots {
            Some((slots, mine)) if mine.contains(&id) => slots
                .create(id)
                .map_err(|e| DeployError::Fabric(format!("op-log slot {id}: {e}"))),
            _ => Ok(()),
        }
    }
}

impl Deployment for MotorDeployment {
    fn placement(&self) -> Option<Placement> {
        Some(self.base.placement())
    }

    fn load(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), DeployError> {
        self.base.load_unless_placed(&self.name, table, key, value)
    }

    fn coordinator(&mut self, ctx: AnyContext, id: u16) -> Result<BoxCoordinator, DeployError> {
        self.create_slot(id)?;
        if let Some(sim) = ctx.as_sim() {
            self.restart.threads.borrow_mut().push((id, sim.thread()));
        }
        let cache = self.base.cache_of(ctx.node());
        let ts = SyncedClock::new(ctx.clone(), ctx.node(), id, self.config.epsilon);
        self.coordinators.borrow_mut().push((id, ctx.node()));
        Ok(Box::new(
            MotorCoordinator::new(
                ctx,
                Rc::clone(&self.base.store),
                Rc::clone(&self.base.shapes),
                self.config,
                id,
                cache,
                self.base.history.clone(),
                ts,
            )
            .with_op_log(Rc::clone(&self.oplogs)),
        ))
    }

    fn read_final(&self, table: TableId, key: Key) -> Option<Vec<u8>> {
        self.base.read_final(table, key)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    /// As FORD's: `cn_restarts` and `restarted_coordinators` under `restart=US`,
    /// `cn_serving_again_at_ns` once a restarted CN's coordinators started.
    fn counter(&self, name: &str) -> Option<u64> {
        match name {
            "cn_restarts" => self.restart.after.map(|_| self.restart.cns.get()),
            "restarted_coordinators" => self.restart.after.map(|_| self.restart.coordinators.get()),
            "cn_serving_again_at_ns" => self.restart.serving_at.get(),
            _ => None,
        }
    }

    fn sim_recovery(&mut self) -> Option<&mut dyn SimRecovery> {
        Some(self)
    }

    fn processes(&mut self) -> Option<&mut dyn ProcessDeployment> {
        Some(self)
    }
}

impl SimRecovery for MotorDeployment {
    fn start_recovery(
        &mut self,
        sim: &Rc<Sim>,
        recovery_cn: u16,
        timing: RecoveryTiming,
    ) -> Result<(), DeployError> {
        let (store, shapes, logs) = (
            Rc::clone(&self.base.store),
            Rc::clone(&self.base.shapes),
            Rc::clone(&self.oplogs),
        );
        if let Some(after) = self.restart.after {
            let respawn = Rc::new(Respawn {
                sim: Rc::clone(sim),
                after,
                poll: timing.poll,
                store: Rc::clone(&self.base.store),
                shapes: Rc::clone(&self.base.shapes),
                config: self.config,
                history: self.base.history.clone(),
                oplogs: Rc::clone(&self.oplogs),
                cache: Box::new(self.base.cache_maker()),
                coordinators: Rc::clone(&self.coordinators),
                threads: Rc::clone(&self.restart.threads),
                rejoined: Rc::clone(&self.recovery.rejoined),
                runner: Rc::clone(&self.restart.runner),
                incarnations: Rc::clone(&self.restart.incarnations),
                cns: Rc::clone(&self.restart.cns),
                restarted: Rc::clone(&self.restart.coordinators),
                serving_at: Rc::clone(&self.restart.serving_at),
                error: Rc::clone(&self.recovery.error),
            });
            *self.recovery.on_recovered.borrow_mut() =
                Some(Rc::new(move |c: &SimContext, event: &RecoveryEvent| {
                    Rc::clone(&respawn).spawn(c, event)
                }));
        }
        let coordinators = Rc::clone(&self.coordinators);
        let releases_only = self.config.recovery_releases_only;
        dmem_deploy::spawn_log_recovery(
            sim,
            recovery_cn,
            timing,
            self.detection,
            Rc::clone(self.base.history.history()),
            &self.recovery,
            move || coordinators.borrow().clone(),
            async move |c: &SimContext, ids: &[u16]| {
                let mut done = Vec::new();
                for &id in ids {
                    let r = dmem_motor::recover_coordinator(
                        c,
                        &store,
                        &shapes,
                        &logs,
                        id,
                        releases_only,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                    done.push((recovered(id, &r), dmem_verbs::Clock::now(c)));
                }
                Ok(done)
            },
        )
    }

    fn run_late_coordinators(&self, run: LateCoordinators) {
        *self.restart.runner.borrow_mut() = Some(run);
    }

    fn recovery_events(&self) -> Vec<RecoveryEvent> {
        self.recovery.events.borrow().clone()
    }

    fn recovery_error(&self) -> Option<String> {
        let recovery = self.recovery.error.borrow().clone();
        recovery.or_else(|| self.mirror_error.borrow().clone())
    }

    fn paused(&self) -> Rc<Cell<bool>> {
        Rc::clone(&self.paused)
    }

    fn scan_cost(&self) -> Option<(u64, u64)> {
        self.base.scan_cost()
    }
}

impl ProcessDeployment for MotorDeployment {
    fn recovers_across_processes(&self) -> bool {
        true
    }

    fn process_tasks(
        &mut self,
        me: NodeId,
        ctxs: CnContexts,
        plan: &ProcessPlan,
    ) -> Result<Vec<LocalTask>, DeployError> {
        if self.slots.is_none() {
            // Not joined (a caller that made its coordinators first): their slots now.
            self.mirror_to_slots(me, plan)?;
            let made: Vec<u16> = self.coordinators.borrow().iter().map(|c| c.0).collect();
            for id in made {
                self.create_slot(id)?;
            }
        }
        Ok(vec![alive_task(
            ctxs.heartbeat,
            plan.detector,
            plan.heartbeat,
        )])
    }

    /// The op logs go to the CN's durable slots from here, on every core's deployment.
    fn join_as_cn(&mut self, me: NodeId, plan: &ProcessPlan) -> Result<(), DeployError> {
        self.mirror_to_slots(me, plan)
    }

    /// Each core's deployment mirrors the op logs of its own coordinators into their
    /// slots ([`join_as_cn`](Self::join_as_cn)): recovery finds every one.
    fn splits_across_cores(&self) -> Result<(), String> {
        Ok(())
    }

    fn process_recovery(
        &mut self,
        ctx: AnyContext,
        terminator: MessageLinkTerminator,
        plan: &ProcessPlan,
    ) -> Result<Option<Box<dyn ProcessRecovery>>, DeployError> {
        let slots = DurableSlots::new(&plan.state_dir)
            .map_err(|e| DeployError::Fabric(format!("{}: {e}", plan.state_dir.display())))?;
        let (store, shapes, logs) = (
            Rc::clone(&self.base.store),
            Rc::clone(&self.base.shapes),
            Rc::clone(&self.oplogs),
        );
        let mns = (0..store.config().mns).map(|m| store.mn_node(m)).collect();
        let releases_only = self.config.recovery_releases_only;
        Ok(Some(Box::new(LogRecovery::new(
            self.name.clone(),
            ctx,
            terminator,
            mns,
            plan,
            Rc::clone(&self.recovery.events),
            async move |c: &AnyContext, ids: &[u16]| {
                let mut done = Vec::new();
                for &id in ids {
                    // The failed CN's op log, as its process last wrote it.
                    let log = match slots.read(id).map_err(|e| e.to_string())? {
                        Some(bytes) => OpLog::parse(&bytes).map_err(|e| e.to_string())?,
                        None => OpLog::Idle,
                    };
                    logs.restore(id, log);
                    let r = dmem_motor::recover_coordinator(
                        c,
                        &store,
                        &shapes,
                        &logs,
                        id,
                        releases_only,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                    done.push((recovered(id, &r), dmem_verbs::Clock::now(c)));
                }
                Ok(done)
            },
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc_deploy::layout;
    use dmem_store::TableDemand;

    /// A CN process on two cores: each core's deployment, joined as the same CN, mirrors
    /// the op logs of the coordinators it made into their own durable slots (and only
    /// those), so recovery reading the CN's slots finds every coordinator's log.
    #[test]
    fn each_cores_deployment_mirrors_its_own_coordinators_op_logs() {
        let demand = TableDemand {
            id: TableId(1),
            value_len: 16,
            expected_records: 64,
            grows: false,
        };
        let spec = DeploySpec::new(vec![demand], 3);
        let protocol = MotorProtocol::from_flags("").unwrap();
        let mut config = dmem_sim::ClusterConfig::new("cx6")
            .unwrap()
            .threads_per_cn(2);
        config.mn_memory_bytes = protocol.mn_bytes_per_mn(&spec, 1).unwrap().max(1 << 20);
        let sim = Rc::new(Sim::new(config).unwrap());
        let cn = sim.cn(0);
        let dir = std::env::temp_dir().join(format!("dmem-motor-cores-{}", std::process::id()));
        let plan = ProcessPlan::on_ports(
            [(cn, vec![0, 1])],
            2,
            10_000_000,
            1_000_000_000,
            1_000_000_000,
            dir.clone(),
        );
        let history = Rc::new(RefCell::new(dmem_txn::History::default()));
        let cores: Vec<Box<dyn Deployment>> = (0..2u16)
            .map(|core| {
                let mut d = protocol
                    .deploy_on(
                        MnMemory::sim(&sim),
                        &spec,
                        Recorder::new(Rc::clone(&history)),
                    )
                    .unwrap();
                d.processes().unwrap().join_as_cn(cn, &plan).unwrap();
                let ctx = sim.context(cn, core).unwrap();
                d.coordinator(AnyContext::from(ctx), core).unwrap();
                d
            })
            .collect();
        let oplogs = |core: usize| {
            let d = cores[core].as_any().downcast_ref::<MotorDeployment>();
            Rc::clone(&d.unwrap().oplogs)
        };
        oplogs(0).begin(0, 7);
        oplogs(1).begin(1, 8);
        // Core 0 never made coordinator 1: its mirror leaves core 1's slot alone.
        oplogs(0).begin(1, 99);
        let reader = DurableSlots::new(&dir).unwrap();
        let seq = |id| match OpLog::parse(&reader.read(id).unwrap().unwrap()).unwrap() {
            OpLog::Locking { seq, .. } => seq,
            other => panic!("{other:?}"),
        };
        assert_eq!((seq(0), seq(1)), (7, 8));
        for mut d in cores {
            assert_eq!(d.sim_recovery().unwrap().recovery_error(), None);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `restart=US` sets the restart delay in ns beside the other switches (its name kept),
    /// a malformed one is refused, and without it nothing restarts.
    #[test]
    fn restart_switch_sets_the_delay() {
        let p = MotorProtocol::from_flags("si+restart=1000").unwrap();
        assert_eq!(p.restart_after, Some(1_000_000));
        assert_eq!(p.config.isolation, dmem_motor::Isolation::Snapshot);
        assert_eq!(p.name, "motor:si+restart=1000");
        assert_eq!(
            MotorProtocol::from_flags("restart=0")
                .unwrap()
                .restart_after,
            Some(0)
        );
        assert_eq!(MotorProtocol::from_flags("si").unwrap().restart_after, None);
        let e = MotorProtocol::from_flags("restart=soon").unwrap_err();
        assert!(e.contains("restart=soon"), "{e}");
    }

    /// A CN suspected while alive (heartbeats rarer than the timeout) is killed before its
    /// restart, then restarted with its coordinator under the old id and handed to the
    /// runner; rejoined, it is suspected (and restarted) again, without a recovery error.
    #[test]
    fn a_falsely_suspected_cn_is_killed_then_restarted() {
        let demand = TableDemand {
            id: TableId(1),
            value_len: 16,
            expected_records: 64,
            grows: false,
        };
        let spec = DeploySpec::new(vec![demand], 1);
        let protocol = MotorProtocol::from_flags("restart=10").unwrap();
        let mut config = dmem_sim::ClusterConfig::new("cx6")
            .unwrap()
            .cns(2)
            .threads_per_cn(2);
        config.mn_memory_bytes = protocol.mn_bytes_per_mn(&spec, 1).unwrap().max(1 << 20);
        let sim = Rc::new(Sim::new(config).unwrap());
        let history = Rc::new(RefCell::new(dmem_txn::History::default()));
        let mut d = protocol
            .deploy_on(MnMemory::sim(&sim), &spec, Recorder::new(history))
            .unwrap();
        let cn = sim.cn(0);
        let ctx = sim.context(cn, 1).unwrap();
        let _first = d.coordinator(AnyContext::from(ctx), 0).unwrap();
        let late: Rc<RefCell<Vec<(u16, u16)>>> = Rc::default();
        let l = Rc::clone(&late);
        let recovery = d.sim_recovery().unwrap();
        recovery.run_late_coordinators(Rc::new(move |c: SimContext, id, _co| {
            l.borrow_mut().push((id, c.thread()));
        }));
        let timing = RecoveryTiming {
            heartbeat: 400_000,
            timeout: 50_000,
            poll: 5_000,
            until: 1_000_000,
        };
        recovery.start_recovery(&sim, 1, timing).unwrap();
        sim.run_until(timing.until);
        let recovery = d.sim_recovery().unwrap();
        assert_eq!(recovery.recovery_error(), None);
        assert!(recovery.recovery_events().len() >= 2);
        assert!(sim.crashes(cn) >= 2, "killed before each restart");
        let restarts = d.counter("cn_restarts").unwrap();
        assert!(restarts >= 2, "{restarts}");
        assert_eq!(d.counter("restarted_coordinators"), Some(restarts));
        let late = late.borrow();
        assert!(
            late.iter().all(|&c| c == (0, 1)),
            "same id, same thread: {late:?}"
        );
    }

    /// Each restart of a CN is its next incarnation, counted per CN from 1.
    #[test]
    fn incarnations_count_per_cn() {
        let all = RefCell::new(Vec::new());
        let (a, b) = (NodeId(4), NodeId(5));
        assert_eq!(next_incarnation(&all, a), 1);
        assert_eq!(next_incarnation(&all, b), 1);
        assert_eq!(next_incarnation(&all, a), 2);
        assert_eq!(*all.borrow(), vec![(a, 2), (b, 1)]);
    }

    /// `versions=N` overrides the workload's cells per record for Motor and LOTUS (LOTUS
    /// §8: 2 for both), shrinks the store, and refuses counts outside 1 ..= 8.
    #[test]
    fn versions_switch_sets_cells_per_record() {
        let demand = TableDemand {
            id: TableId(1),
            value_len: 56,
            expected_records: 20_000,
            grows: true,
        };
        let mut spec = DeploySpec::new(vec![demand], 18);
        spec.workload = Some("tpcc".into());
        let (shapes, _) = layout(&spec, 3, 0, VersionLayout::Deltas, Records::Pooled, Some(2));
        assert_eq!(shapes.get(TableId(1)).unwrap().cells, 2);
        let bytes = |p: &dyn dmem_deploy::Protocol| p.mn_bytes_per_mn(&spec, 3).unwrap();
        let motor = MotorProtocol::from_flags("").unwrap();
        let motor2 = MotorProtocol::from_flags("versions=2").unwrap();
        assert!(
            bytes(&motor2) < bytes(&motor),
            "2 versions take less than 4"
        );
        let lotus = crate::lotus::LotusProtocol::with_flags("").unwrap();
        let lotus2 = crate::lotus::LotusProtocol::with_flags("versions=2").unwrap();
        assert_eq!(lotus2.versions, Some(2));
        assert!(bytes(&lotus2) < bytes(&lotus));
        for bad in ["versions=0", "versions=9", "versions=two"] {
            let e = MotorProtocol::from_flags(bad).unwrap_err();
            assert!(e.contains("1 to 8 versions"), "{e}");
            assert!(crate::lotus::LotusProtocol::with_flags(bad).is_err());
        }
    }
}

//! OOCC, DrTM and DSLR (`dmem-occ`) as a [`Protocol`] (on the simulated cluster and in the
//! CN processes of a real one): the store of [`dmem_occ::store`], one [`DriftingCtx`] per
//! coordinator (its node's clock, [`DriftModel`]), shared per-CN version hints, and the
//! deployment's counters. The names they are registered under are [`crate::occ_family`]'s.
//!
//! The lease manager (§VII-A, [`dmem_occ::manager`]) runs on the simulator as a simulated
//! task beside the first CN's coordinators; across processes as a task of the first CN
//! process ([`ProcessDeployment::process_tasks`]), with a follower on every core of every
//! CN process that picks the lease words up from the lease lines on MN 0.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use dmem_deploy::process::{
    self, CnContexts, LocalTask, LogRecovery, MessageLinkTerminator, ProcessPlan, ProcessRecovery,
    ServiceContext,
};
use dmem_deploy::{
    AnyContext, DeployError, DeploySpec, Deployment, Detection, MnMemory, Placement,
    ProcessDeployment, Protocol, Recorder, RecoveryEvent, RecoveryState, RecoveryTiming,
    SimRecovery,
};
use dmem_layout::record::OoccLockWord;
use dmem_sim::{Sim, SimContext};
use dmem_txn::{BoxCoordinator, Key, TableId};
use dmem_verbs::NodeId;

use dmem_occ::drift::{Drift, DriftModel, DriftingCtx};
use dmem_occ::drtm::{DrtmConfig, DrtmCoordinator};
use dmem_occ::dslr2pl::{DslrConfig, DslrCoordinator};
use dmem_occ::manager::{FollowerLog, LeaseTable, ManagerLog, Policy};
use dmem_occ::oocc::{Leases, OoccConfig, OoccCoordinator, Stats};
use dmem_occ::recovery::RedoLog;
use dmem_occ::store::{Directory, Layout, Loc, Placed, emit, parse};

/// OOCC under a registered name, with its configuration and its clocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OoccProtocol {
    name: String,
    /// Protocol knobs.
    pub config: OoccConfig,
    /// How node clocks drift.
    pub drift: DriftModel,
    /// The lease manager's policy, if one runs (§VII-A).
    pub manager: Option<Policy>,
    /// DrTM instead of OOCC (same store, same recovery).
    pub drtm: Option<DrtmConfig>,
    /// DSLR two-phase locking instead of OOCC (same store; recovery by its redo log and
    /// lease reset).
    pub dslr: Option<DslrConfig>,
    /// How the simulator's recovery detects a failed CN: heartbeats by default, the oracle
    /// when asked (`oocc:oracle`, `dslr:oracle`: recovery measured without detection).
    pub detection: Detection,
}

impl OoccProtocol {
    /// `config` registered as `name`, clocks within ±100 ppm ([`DriftModel::default`]).
    #[must_use]
    pub fn new(name: &str, config: OoccConfig) -> Self {
        Self {
            name: name.to_owned(),
            config,
            drift: DriftModel::default(),
            manager: None,
            drtm: None,
            dslr: None,
            detection: Detection::Heartbeat,
        }
    }

    /// DSLR two-phase locking (OOCC §II-A) registered as `name`.
    #[must_use]
    pub fn dslr(name: &str, config: DslrConfig) -> Self {
        Self {
            dslr: Some(config),
            ..Self::new(name, OoccConfig::default())
        }
    }

    /// DrTM (lease-based shared locks, OOCC §II-A) registered as `name`.
    #[must_use]
    pub fn drtm(name: &str, config: DrtmConfig) -> Self {
        Self {
            drtm: Some(config),
            ..Self::new(name, OoccConfig::default())
        }
    }

    /// Bytes a record's value takes in memory (DrTM keeps an 8-byte version in front).
    fn prefix(&self) -> usize {
        if self.drtm.is_some() || self.dslr.is_some() {
            8
        } else {
            0
        }
    }

    fn layout(&self, spec: &DeploySpec, mns: u16) -> Result<Layout, DeployError> {
        let mut spec = spec.clone();
        for t in &mut spec.tables {
            t.value_len += self.prefix();
        }
        Layout::new(&spec, mns)
    }

    /// The same protocol with a lease manager running `policy` (its offset is the
    /// protocol's).
    #[must_use]
    pub fn with_manager(mut self, policy: Policy) -> Self {
        self.manager = Some(Policy {
            offset_ns: self.config.offset_ns,
            ..policy
        });
        self
    }

    /// The same protocol with `drift`.
    #[must_use]
    pub fn with_drift(mut self, drift: DriftModel) -> Self {
        self.drift = drift;
        self
    }

    /// The same protocol with its simulated recovery behind `detection`.
    #[must_use]
    pub fn with_detection(mut self, detection: Detection) -> Self {
        self.detection = detection;
        self
    }
}

impl Protocol for OoccProtocol {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn mn_bytes_per_mn(&self, spec: &DeploySpec, mns: u16) -> Result<u64, DeployError> {
        Ok(self.layout(spec, mns)?.bytes_per_mn)
    }

    /// The shared [`Directory`] entry (key and slot in a hash map) and the CNs' version
    /// hints: TPC-C at 8 warehouses (4.41M records) peaks at 0.98 GB of RSS, MN regions
    /// included, so under 222 bytes per record (README, TPC-C).
    fn cn_bytes_per_hashed_record(&self) -> Option<u64> {
        Some(256)
    }

    fn deploy_on(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        let layout = self.layout(spec, memory.mn_count())?;
        let dir = Directory::new(layout, memory.regions());
        Ok(Box::new(self.deployment(memory, dir, history)))
    }

    /// Takes the records as placed in `placement` (an [`OoccDeployment`]'s
    /// [`Deployment::placement`]): its directory gives the same slots, and the loader does
    /// not run again.
    fn deploy_placed(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
        placement: &Placement,
    ) -> Option<Result<Box<dyn Deployment>, DeployError>> {
        let error = |reason: String| DeployError::Protocol {
            protocol: self.name.clone(),
            reason,
        };
        Some((|| {
            let layout = self.layout(spec, memory.mn_count())?;
            let placed = Arc::clone(placement)
                .downcast::<Placed>()
                .map_err(|_| error("a placement of another protocol".to_owned()))?;
            let dir = Directory::placed(layout, memory.regions(), placed).map_err(error)?;
            Ok(Box::new(self.deployment(memory, dir, history)) as Box<dyn Deployment>)
        })())
    }
}

impl OoccProtocol {
    /// A deployment on `memory` with directory `dir`.
    fn deployment(&self, memory: MnMemory, dir: Directory, history: Recorder) -> OoccDeployment {
        OoccDeployment {
            protocol: self.clone(),
            memory,
            dir: Rc::new(dir),
            history,
            hints: HashMap::new(),
            stats: Rc::new(Stats::default()),
            leases: Rc::new(RefCell::new(Vec::new())),
            manager: Rc::new(ManagerLog {
                adjustments: RefCell::new(Vec::new()),
                lease: Cell::new(self.config.lease_ns),
            }),
            manager_started: false,
            follower: Rc::new(FollowerLog::default()),
            lease_ctx: None,
            paused: Rc::new(Cell::new(false)),
            recovery: RecoveryState::default(),
        }
    }
}

/// OOCC on one cluster.
pub struct OoccDeployment {
    protocol: OoccProtocol,
    memory: MnMemory,
    dir: Rc<Directory>,
    history: Recorder,
    hints: HashMap<NodeId, Rc<RefCell<HashMap<Loc, u64>>>>,
    stats: Rc<Stats>,
    leases: LeaseTable,
    manager: Rc<ManagerLog>,
    manager_started: bool,
    /// Across processes: what this deployment's follower applied.
    follower: Rc<FollowerLog>,
    /// Across processes, with a lease manager: the context of this deployment's first
    /// coordinator, on which its follower (and, on the first CN, the manager) posts.
    lease_ctx: Option<AnyContext>,
    paused: Rc<Cell<bool>>,
    recovery: RecoveryState,
}

impl OoccDeployment {
    /// What its redo log means (DSLR: decided and versioned; DrTM: decided; OOCC: written
    /// in the validation round).
    fn redo_log(&self) -> RedoLog {
        if self.protocol.dslr.is_some() {
            RedoLog::DecidedVersioned
        } else if self.protocol.drtm.is_some() {
            RedoLog::Decided
        } else {
            RedoLog::Validated
        }
    }

    /// The deployment's counters.
    #[must_use]
    pub fn stats(&self) -> Rc<Stats> {
        Rc::clone(&self.stats)
    }

    /// The record directory.
    #[must_use]
    pub fn directory(&self) -> Rc<Directory> {
        Rc::clone(&self.dir)
    }

    /// Every coordinator's leases, with its id and node.
    #[must_use]
    pub fn leases(&self) -> Vec<(u16, NodeId, Rc<Leases>)> {
        self.leases.borrow().clone()
    }

    /// The lease manager's record.
    #[must_use]
    pub fn manager_log(&self) -> Rc<ManagerLog> {
        Rc::clone(&self.manager)
    }

    /// `ctx` read through its node's clock: the drift model's in the simulator, the
    /// fabric's own clock elsewhere. The model drifts `true × ppm` from true time 0, the
    /// start of a simulation; a real context's true time is `CLOCK_MONOTONIC`, counted from
    /// boot and shared by every process of a host, where ±100 ppm of hours put the CNs of
    /// one cluster seconds apart: DrTM's lease ends, absolute times compared across CNs,
    /// then meant nothing (a writer on a CN ahead took a record whose 400 µs read lease
    /// was still running on a CN behind, and the checker found the cycle).
    fn node_clock(&self, ctx: AnyContext) -> DriftingCtx<AnyContext> {
        let drift = if ctx.as_sim().is_some() {
            self.protocol.drift.drift_of(ctx.node())
        } else {
            Drift::default()
        };
        DriftingCtx::new(ctx, drift)
    }

    /// A coordinator, typed (tests use it to reach its leases).
    ///
    /// # Errors
    /// Never so far; kept fallible like [`Deployment::coordinator`].
    pub fn typed_coordinator(
        &mut self,
        ctx: AnyContext,
        id: u16,
    ) -> Result<OoccCoordinator<AnyContext>, DeployError> {
        let node = ctx.node();
        let hints = Rc::clone(self.hints.entry(node).or_default());
        let cfg = self.protocol.config;
        let leases = match self.follower.applied.get() {
            // Across processes, a coordinator made after the follower applied a lease word
            // starts with it.
            w if w != 0 && self.memory.as_sim().is_none() => {
                let (rv, ww) = dmem_occ::manager::decode(w);
                Rc::new(Leases {
                    rv: Cell::new(rv),
                    ww: Cell::new(ww),
                })
            }
            _ => Leases::new(self.manager.lease.get(), cfg.offset_ns),
        };
        self.leases
            .borrow_mut()
            .push((id, node, Rc::clone(&leases)));
        match (self.protocol.manager, self.memory.as_sim()) {
            (Some(policy), Some(sim)) if !self.manager_started => {
                self.manager_started = true;
                // The manager runs on the first CN's thread 0, beside its coordinators, as a
                // simulated task.
                let mctx = sim.context(sim.cn(0), 0)?;
                let drift = self.protocol.drift.drift_of(mctx.node());
                let task = dmem_occ::manager::run(
                    DriftingCtx::new(mctx.clone(), drift),
                    Rc::clone(&self.dir),
                    Rc::clone(&self.stats),
                    Rc::clone(&self.leases),
                    policy,
                    Rc::clone(&self.manager),
                );
                sim.spawn(&mctx, task);
            }
            // Across processes the follower and the manager post on the first
            // coordinator's context ([`Self::follower_task`]).
            (Some(_), None) if self.lease_ctx.is_none() => self.lease_ctx = Some(ctx.clone()),
            _ => {}
        }
        let ctx = self.node_clock(ctx);
        Ok(OoccCoordinator::new(
            ctx,
            Rc::clone(&self.dir),
            id,
            cfg,
            leases,
            Rc::clone(&self.stats),
            hints,
            self.history.clone(),
        ))
    }
}

/// The shortest statistics period of the lease manager across processes (ns): the
/// simulator's 200 µs of real time hold too few transactions of one CN process for a
/// stable decision on a loaded host (a 2-CPU host adjusted 449 times in 2 s, the lease
/// swinging between doubling and shrinking), and the paper's manager reads its statistics
/// once per second (§VII-A). The followers poll every half period.
pub const PROCESS_PERIOD_NS: dmem_verbs::Nanos = 10_000_000;

/// The read lease of the coordinator that reads the final state after a run of CN processes
/// (ns). It reads alone — every CN's coordinators are done — so a long lease delays nobody, and DrTM's 400 µs ran out
/// between the lease's CAS and the commit on every one of 64 tries in CN processes on two
/// pinned cores each beside other tests on a 2-CPU host (`dmem cluster`: "could not read
/// the final state: read lease expired"). Below `drtm`'s one-second lease horizon. A shorter
/// lease left by a worker is replaced (CAS over it), not shared: it needs half as much left.
pub const FINAL_READ_LEASE_NS: dmem_verbs::Nanos = 100_000_000;

impl OoccDeployment {
    /// Whether this is a CN process's deployment (`join_as_cn`), not the simulator's: only
    /// a CN process's directory shares its inserts through MN memory.
    fn joined_as_cn(&self) -> bool {
        self.dir.shares_inserts()
    }

    /// The lease manager's policy across processes: the protocol's, its period at least
    /// [`PROCESS_PERIOD_NS`].
    fn process_policy(&self) -> Option<Policy> {
        let policy = self.protocol.manager?;
        Some(Policy {
            period_ns: policy.period_ns.max(PROCESS_PERIOD_NS),
            ..policy
        })
    }

    /// Across processes, with a lease manager: this deployment's follower, which picks the
    /// lease words up for its coordinators every half period (`dmem_occ::manager::follow`);
    /// `None` without a manager or before a coordinator was made.
    fn follower_task(&self) -> Option<LocalTask> {
        let policy = self.process_policy()?;
        let ctx = self.lease_ctx.clone()?;
        Some(Box::pin(dmem_occ::manager::follow(
            ctx,
            Rc::clone(&self.dir),
            Rc::clone(&self.stats),
            Rc::clone(&self.leases),
            (policy.period_ns / 2).max(1),
            Rc::clone(&self.follower),
        )))
    }

    /// A DrTM coordinator with `cfg` on `ctx`.
    fn drtm_coordinator(&mut self, ctx: AnyContext, id: u16, cfg: DrtmConfig) -> BoxCoordinator {
        let node = ctx.node();
        let hints = Rc::clone(self.hints.entry(node).or_default());
        self.leases
            .borrow_mut()
            .push((id, node, Leases::new(cfg.lease_ns, 0)));
        let ctx = self.node_clock(ctx);
        Box::new(DrtmCoordinator::new(
            ctx,
            Rc::clone(&self.dir),
            id,
            cfg,
            Rc::clone(&self.stats),
            hints,
            self.history.clone(),
        ))
    }
}

impl Deployment for OoccDeployment {
    /// The directory's slots: every loaded record's (and free space after them).
    fn placement(&self) -> Option<Placement> {
        Some(Arc::new(self.dir.placement()))
    }

    fn load(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), DeployError> {
        let vlen = self
            .dir
            .value_len(table)
            .map_err(|e| DeployError::Protocol {
                protocol: self.protocol.name.clone(),
                reason: e.to_string(),
            })?;
        let loc = self
            .dir
            .slot(table, key)
            .map_err(|e| DeployError::Protocol {
                protocol: self.protocol.name.clone(),
                reason: e.to_string(),
            })?;
        let mut stored = vec![0u8; self.protocol.prefix()];
        stored.extend_from_slice(value);
        let image = emit(
            table,
            key,
            Some(&stored),
            vlen,
            OoccLockWord::from_raw(0),
            None,
        );
        self.memory.write(self.dir.node(loc.mn), loc.offset, &image)
    }

    fn coordinator(&mut self, ctx: AnyContext, id: u16) -> Result<BoxCoordinator, DeployError> {
        if let Some(cfg) = self.protocol.dslr {
            let node = ctx.node();
            self.leases.borrow_mut().push((id, node, Leases::new(0, 0)));
            let ctx = self.node_clock(ctx);
            return Ok(Box::new(DslrCoordinator::new(
                ctx,
                Rc::clone(&self.dir),
                id,
                cfg,
                Rc::clone(&self.stats),
                self.history.clone(),
            )));
        }
        if let Some(cfg) = self.protocol.drtm {
            return Ok(self.drtm_coordinator(ctx, id, cfg));
        }
        Ok(Box::new(self.typed_coordinator(ctx, id)?))
    }

    /// The final check's coordinator: in a CN process under DrTM one whose read leases
    /// outlast a loaded host's round trips ([`FINAL_READ_LEASE_NS`]); the protocol's own
    /// coordinator otherwise (the simulator's checks, whose transactions may still be
    /// finishing when the final read starts, keep the paper's lease).
    fn final_coordinator(
        &mut self,
        ctx: AnyContext,
        id: u16,
    ) -> Result<BoxCoordinator, DeployError> {
        match self.protocol.drtm {
            Some(cfg) if self.joined_as_cn() => Ok(self.drtm_coordinator(
                ctx,
                id,
                DrtmConfig {
                    lease_ns: FINAL_READ_LEASE_NS,
                    min_left_ns: FINAL_READ_LEASE_NS / 2,
                    ..cfg
                },
            )),
            _ => self.coordinator(ctx, id),
        }
    }

    fn read_final(&self, table: TableId, key: Key) -> Option<Vec<u8>> {
        let loc = self.dir.find(table, key, |mn, offset, len| {
            self.memory.read(self.dir.node(mn), offset, len)
        })?;
        let vlen = self.dir.value_len(table).ok()?;
        let bytes = self.memory.read(
            self.dir.node(loc.mn),
            loc.offset,
            dmem_layout::record::OoccRecordHeader::record_len(vlen),
        )?;
        let image = parse(&bytes, vlen);
        image
            .present
            .then(|| image.value[self.protocol.prefix()..].to_vec())
    }

    fn counter(&self, name: &str) -> Option<u64> {
        let s = &self.stats;
        Some(match name {
            "ro_committed" => s.ro_committed.get(),
            "ro_one_round" => s.ro_one_round.get(),
            "ro_lease_expired" => s.ro_lease_expired.get(),
            "ro_intention" => s.ro_intention.get(),
            "rw_committed" => s.rw_committed.get(),
            "aborts" => s.aborts.get(),
            "lease_wait_ns" => s.lease_wait_ns.get(),
            "lease_ns" => self.manager.lease.get(),
            "dslr_reset_lease_ns" => self.protocol.dslr?.reset_lease_ns,
            "lease_adjustments" => self.manager.adjustments.borrow().len() as u64,
            "lease_adjust_ns" => self
                .manager
                .adjustments
                .borrow()
                .last()
                .map_or(0, |a| a.finished - a.started),
            _ => return None,
        })
    }

    /// DSLR's reset lease as this CN process runs it ([`join_as_cn`](Self::join_as_cn)
    /// raises it to the detector's); with a lease manager, what this CN's follower applied
    /// (`lease_updates` words, the leases `lease_rv_ns` and `lease_ww_ns` its coordinators
    /// hold at the end) and, on the first CN, the manager's `lease_adjustments` and
    /// `lease_ns`.
    fn counters(&self) -> Vec<(String, u64)> {
        let mut counters: Vec<(String, u64)> = ["dslr_reset_lease_ns"]
            .iter()
            .filter_map(|&name| Some((name.to_owned(), self.counter(name)?)))
            .collect();
        if self.protocol.manager.is_some() && self.lease_ctx.is_some() {
            let held = self
                .leases
                .borrow()
                .first()
                .map(|(_, _, l)| (l.rv.get(), l.ww.get()));
            let (rv, ww) = held.unwrap_or_default();
            counters.extend([
                ("lease_updates".to_owned(), self.follower.updates.get()),
                ("lease_rv_ns".to_owned(), rv),
                ("lease_ww_ns".to_owned(), ww),
            ]);
            if self.manager_started {
                counters.extend(
                    ["lease_adjustments", "lease_ns"]
                        .iter()
                        .filter_map(|&name| Some((name.to_owned(), self.counter(name)?))),
                );
            }
        }
        counters
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn sim_recovery(&mut self) -> Option<&mut dyn SimRecovery> {
        Some(self)
    }

    fn processes(&mut self) -> Option<&mut dyn ProcessDeployment> {
        Some(self)
    }
}

impl SimRecovery for OoccDeployment {
    fn start_recovery(
        &mut self,
        sim: &Rc<Sim>,
        recovery_cn: u16,
        timing: RecoveryTiming,
    ) -> Result<(), DeployError> {
        let (dir, leases) = (Rc::clone(&self.dir), Rc::clone(&self.leases));
        let skip_roll_forward = self.protocol.dslr.is_some_and(|d| d.bug_skip_roll_forward);
        let kind = self.redo_log();
        // Past `until` too (as long again): DrTM's transactions wait out 400 µs leases and
        // may still be running, and crash, when the other tasks stop.
        let timing = RecoveryTiming {
            until: timing.until.saturating_mul(2),
            ..timing
        };
        let detection = self.protocol.detection;
        if let (Some(cfg), Detection::Heartbeat) = (self.protocol.dslr, detection) {
            // DSLR's lease reset is timed, not fenced: recovery's roll-forward must land
            // within half the reset lease of the crash (`dmem_occ::dslr2pl`). Detection may
            // take a heartbeat period, the timeout and a poll; a quarter of the reset lease
            // is left for them, the rest for link termination and the roll-forward.
            let detection_ns = timing.heartbeat + timing.timeout + timing.poll;
            if DslrConfig::min_reset_lease(detection_ns) > cfg.reset_lease_ns {
                return Err(DeployError::Protocol {
                    protocol: self.protocol.name(),
                    reason: format!(
                        "heartbeat period + detection timeout + poll ({} µs) must stay within a quarter of DSLR's {} µs reset lease, or recovery's roll-forward may land after a live transaction took the reset lock",
                        detection_ns / 1_000,
                        cfg.reset_lease_ns / 1_000
                    ),
                });
            }
        }
        dmem_deploy::spawn_log_recovery(
            sim,
            recovery_cn,
            timing,
            detection,
            Rc::clone(self.history.history()),
            &self.recovery,
            move || leases.borrow().iter().map(|(id, n, _)| (*id, *n)).collect(),
            async move |c: &SimContext, ids: &[u16]| {
                if skip_roll_forward {
                    let mut done = Vec::new();
                    for &id in ids {
                        let r = dmem_occ::recovery::discard_versioned_log(c, &dir, id).await;
                        done.push((r.map_err(|e| e.to_string())?, dmem_verbs::Clock::now(c)));
                    }
                    return Ok(done);
                }
                // One lock scan for all of the CN's coordinators (§V step 4).
                dmem_occ::recovery::recover_coordinators(c, &dir, ids, kind)
                    .await
                    .map_err(|e| e.to_string())
            },
        )
    }

    fn recovery_events(&self) -> Vec<RecoveryEvent> {
        self.recovery.events.borrow().clone()
    }

    fn recovery_error(&self) -> Option<String> {
        self.recovery.error.borrow().clone()
    }

    fn paused(&self) -> Rc<Cell<bool>> {
        Rc::clone(&self.paused)
    }
}

impl ProcessDeployment for OoccDeployment {
    /// OOCC, DrTM and DSLR. DSLR's lease reset assumes recovery's roll-forward lands well
    /// within the reset lease of a crash (`dmem_occ::dslr2pl`), while a heartbeat detector
    /// across processes takes its timeout (hundreds of ms): with the paper's 1 ms lease a
    /// live transaction took the reset word first and recovery's late roll-forward
    /// overwrote it (the history checker found the lost write). So a CN process raises the
    /// lease to the detector's ([`join_as_cn`](Self::join_as_cn)).
    fn recovers_across_processes(&self) -> bool {
        true
    }

    /// Inserts go through the insert directory in MN memory from now on
    /// ([`Directory::share_inserts`]): this CN process's (or core's) directory is one of
    /// several, so a key one of them gives a slot must be found by the others, by the
    /// recovering CN, and never given twice.
    ///
    /// DSLR's reset lease is raised to four times the plan's detection time (heartbeat
    /// period + timeout + DSLR's poll; [`DslrConfig::for_detection`]): every CN derives the
    /// same lease from the same plan. It also keeps a live holder whose process is
    /// descheduled for a few ms from having its word reset under it, which a 1 ms lease
    /// does not between processes.
    fn join_as_cn(&mut self, _me: NodeId, plan: &ProcessPlan) -> Result<(), DeployError> {
        if let Some(cfg) = self.protocol.dslr {
            let detection = plan.heartbeat + plan.timeout + cfg.poll_ns;
            self.protocol.dslr = Some(cfg.for_detection(detection));
        }
        self.dir.share_inserts();
        Ok(())
    }

    /// The redo logs live in MN memory, so the detector CN of a real cluster recovers a
    /// failed CN's coordinators exactly as the simulator's recovery task does, behind a
    /// heartbeat detector ([`LogRecovery`]).
    fn process_recovery(
        &mut self,
        ctx: AnyContext,
        terminator: MessageLinkTerminator,
        plan: &ProcessPlan,
    ) -> Result<Option<Box<dyn ProcessRecovery>>, DeployError> {
        if !self.recovers_across_processes() {
            return Ok(None);
        }
        let (dir, kind) = (Rc::clone(&self.dir), self.redo_log());
        let mns = (0..self.memory.mn_count()).map(|m| dir.node(m)).collect();
        Ok(Some(Box::new(LogRecovery::new(
            self.protocol.name(),
            ctx,
            terminator,
            mns,
            plan,
            Rc::clone(&self.recovery.events),
            async move |c: &AnyContext, ids: &[u16]| {
                dmem_occ::recovery::recover_coordinators(c, &dir, ids, kind)
                    .await
                    .map_err(|e| e.to_string())
            },
        ))))
    }

    /// Heartbeats to the detector (the default) and, with a lease manager, this core's
    /// follower; on the first CN also the manager, over the coordinators of every CN of
    /// `plan` (`dmem_occ::manager::run_across_processes`).
    fn process_tasks(
        &mut self,
        me: NodeId,
        ctxs: CnContexts,
        plan: &ProcessPlan,
    ) -> Result<Vec<LocalTask>, DeployError> {
        let mut tasks = vec![process::alive_task(
            ctxs.heartbeat,
            plan.detector,
            plan.heartbeat,
        )];
        tasks.extend(self.follower_task());
        let first_cn = plan.members.first().map(|m| m.cn);
        if let (Some(policy), Some(ctx), true) = (
            self.process_policy(),
            self.lease_ctx.clone(),
            first_cn == Some(me),
        ) {
            self.manager_started = true;
            let ids = plan
                .members
                .iter()
                .flat_map(|m| m.coordinators.iter().copied())
                .collect();
            tasks.push(Box::pin(dmem_occ::manager::run_across_processes(
                ctx,
                Rc::clone(&self.dir),
                ids,
                policy,
                Rc::clone(&self.manager),
            )));
        }
        Ok(tasks)
    }

    /// With a lease manager, this core's follower.
    fn core_tasks(
        &mut self,
        _me: NodeId,
        _plan: &ProcessPlan,
        _services: Vec<ServiceContext>,
    ) -> Result<Vec<LocalTask>, DeployError> {
        Ok(self.follower_task().into_iter().collect())
    }

    /// Per core is sound: a coordinator's CN-side state is DrTM's version hints (a wrong
    /// hint only costs a CAS), counters and, with a lease manager, its leases, which each
    /// core's own follower keeps up to date; locks, lease words and redo logs live in MN
    /// memory, where the detector's [`LogRecovery`] finds them whichever core wrote them.
    fn splits_across_cores(&self) -> Result<(), String> {
        Ok(())
    }
}
